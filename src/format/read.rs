//! Reading dump files back: size limit, schema check before typed parsing, and one clear error
//! per way a file can be wrong. Never panics on any input.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::error::Category;

use super::model::{Dump, SCHEMA};
use crate::units::{clean_path, human_bytes};

/// Largest dump file [`read_dump`] accepts. Real dumps are kilobytes to a few megabytes.
pub const MAX_DUMP_BYTES: u64 = 1 << 30;

/// Why a dump could not be read. Each variant names the file.
#[derive(Debug)]
pub enum DumpError {
    /// The file could not be opened or read.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not a regular file (a FIFO, a device, a socket, a directory, a link not followed): it
    /// was not read. `kind` says what it is, in words.
    NotRegular { path: PathBuf, kind: &'static str },
    /// The file is larger than `limit`; it was not read.
    TooLarge {
        path: PathBuf,
        bytes: u64,
        limit: u64,
    },
    /// The file is empty or ends in the middle of the JSON (a dump cut short).
    Truncated { path: PathBuf },
    /// The file is not JSON; `line`/`column` are 1-based.
    NotJson {
        path: PathBuf,
        line: usize,
        column: usize,
        msg: String,
    },
    /// Valid JSON without `"schema": "oomshim.dump/1"` at the top level; `found` is the schema
    /// that was there (a string as is, another JSON value as JSON text), `None` if none was.
    WrongSchema {
        path: PathBuf,
        found: Option<String>,
    },
    /// The right schema but keys missing or of the wrong type; `msg` is serde's message.
    Invalid { path: PathBuf, msg: String },
}

impl DumpError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            DumpError::Io { path, .. }
            | DumpError::NotRegular { path, .. }
            | DumpError::TooLarge { path, .. }
            | DumpError::Truncated { path }
            | DumpError::NotJson { path, .. }
            | DumpError::WrongSchema { path, .. }
            | DumpError::Invalid { path, .. } => path,
        }
    }
}

impl fmt::Display for DumpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DumpError::Io { path, source } => {
                write!(f, "{}: cannot read the file: {source}", clean_path(path))
            }
            DumpError::NotRegular { path, kind } => write!(
                f,
                "{}: is {kind}, not a regular file; dumps are read from regular files only",
                clean_path(path)
            ),
            DumpError::TooLarge { path, bytes, limit } => write!(
                f,
                "{}: file is {} ({bytes} bytes), over the {} limit for dump files; not read",
                clean_path(path),
                human_bytes(*bytes),
                human_bytes(*limit)
            ),
            DumpError::Truncated { path } => write!(
                f,
                "{}: dump is empty or cut short (the JSON ends early; was it still being written?)",
                clean_path(path)
            ),
            DumpError::NotJson { path, line, column, msg } => write!(
                f,
                "{}: not JSON (line {line}, column {column}: {msg})",
                clean_path(path)
            ),
            DumpError::WrongSchema { path, found: None } => write!(
                f,
                "{}: not an oomshim dump (no \"schema\" key at the top level; expected \"{SCHEMA}\")",
                clean_path(path)
            ),
            DumpError::WrongSchema { path, found: Some(found) } if found.starts_with("oomshim.dump/") => write!(
                f,
                "{}: unsupported oomshim dump schema \"{}\" (this oomshim reads \"{SCHEMA}\")",
                clean_path(path),
                crate::units::clean(found)
            ),
            DumpError::WrongSchema { path, found: Some(found) } => write!(
                f,
                "{}: not an oomshim dump (schema \"{}\", expected \"{SCHEMA}\")",
                clean_path(path),
                crate::units::clean(found)
            ),
            DumpError::Invalid { path, msg } => write!(
                f,
                "{}: invalid oomshim dump: {}",
                clean_path(path),
                crate::units::clean(msg)
            ),
        }
    }
}

impl std::error::Error for DumpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DumpError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Reads and parses the dump at `path`. Only regular files are read (a FIFO, a device or a
/// directory is refused at once); files over [`MAX_DUMP_BYTES`] are refused before reading.
pub fn read_dump(path: &Path) -> Result<Dump, DumpError> {
    read_dump_limited(path, MAX_DUMP_BYTES)
}

/// [`read_dump`] with a size limit of the caller's instead of [`MAX_DUMP_BYTES`].
pub fn read_dump_limited(path: &Path, limit: u64) -> Result<Dump, DumpError> {
    let bytes = read_bounded(path, limit, Links::Follow).map_err(|e| match e {
        BoundedReadError::Io(source) => DumpError::Io {
            path: path.to_path_buf(),
            source,
        },
        BoundedReadError::NotRegular(kind) => DumpError::NotRegular {
            path: path.to_path_buf(),
            kind,
        },
        BoundedReadError::TooLarge(bytes) => DumpError::TooLarge {
            path: path.to_path_buf(),
            bytes,
            limit,
        },
    })?;
    parse_dump(&bytes, path)
}

/// Whether [`read_bounded`] follows a symbolic link at the path's last component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow it: a path the user named (`report latest.json`, a directory they merge).
    Follow,
    /// Refuse it: a file found by name in a directory others may write to (torch's side file
    /// next to a dump), which the tool that writes it never makes a link.
    Refuse,
}

/// Why [`read_bounded`] read nothing.
#[derive(Debug)]
pub enum BoundedReadError {
    Io(std::io::Error),
    /// Not a regular file; what it is, in words ("a FIFO", "a character device", …).
    NotRegular(&'static str),
    /// Larger than the limit (its size, or the limit + 1 when it grew while being read).
    TooLarge(u64),
}

impl fmt::Display for BoundedReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundedReadError::Io(e) => write!(f, "{e}"),
            BoundedReadError::NotRegular(kind) => write!(f, "is {kind}, not a regular file"),
            BoundedReadError::TooLarge(bytes) => write!(f, "too large ({})", human_bytes(*bytes)),
        }
    }
}

/// The one way oomshim reads a file it did not write in this process (dumps, torch's side
/// files, the files `merge` scans, the Python hook it compares): opened `O_NONBLOCK` (a FIFO
/// must not block the open) and, with [`Links::Refuse`], `O_NOFOLLOW`; checked with `fstat` on
/// the opened descriptor (no window between a check and the open) to be a regular file; read up
/// to `limit` bytes (one more to tell a file that grows past it). Never hangs, never reads a
/// device, never allocates more than the limit.
pub fn read_bounded(path: &Path, limit: u64, links: Links) -> Result<Vec<u8>, BoundedReadError> {
    let nofollow = if links == Links::Refuse {
        libc::O_NOFOLLOW
    } else {
        0
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | nofollow)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // O_NOFOLLOW on a symlink: ELOOP.
            Some(libc::ELOOP) if nofollow != 0 => {
                BoundedReadError::NotRegular("a symbolic link (not followed here)")
            }
            _ => BoundedReadError::Io(e),
        })?;
    let meta = file.metadata().map_err(BoundedReadError::Io)?;
    let t = meta.file_type();
    if !t.is_file() {
        return Err(BoundedReadError::NotRegular(if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_socket() {
            "a socket"
        } else {
            "an unusual kind of file"
        }));
    }
    if meta.len() > limit {
        return Err(BoundedReadError::TooLarge(meta.len()));
    }
    // A regular file may still grow while it is read: read at most one byte past the limit.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(BoundedReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(BoundedReadError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Parses dump bytes; `path_for_messages` only names the source in errors.
pub fn parse_dump(bytes: &[u8], path_for_messages: &Path) -> Result<Dump, DumpError> {
    let path = || path_for_messages.to_path_buf();
    // A UTF-8 byte-order mark (added by some editors) is not JSON but harmless.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(DumpError::Truncated { path: path() });
    }

    // First pass: is this JSON at all, and does it claim our schema? Only the `schema` value is
    // kept; everything else is skipped without building values (and without recursion).
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| syntax_error(e, path_for_messages))?;
    match probe {
        Probe::Object(Some(serde_json::Value::String(s))) if s == SCHEMA => {}
        Probe::Object(Some(serde_json::Value::String(s))) => {
            return Err(DumpError::WrongSchema {
                path: path(),
                found: Some(s),
            })
        }
        Probe::Object(Some(other)) => {
            return Err(DumpError::WrongSchema {
                path: path(),
                found: Some(other.to_string()),
            })
        }
        Probe::Object(None) | Probe::NotObject => {
            return Err(DumpError::WrongSchema {
                path: path(),
                found: None,
            })
        }
    }

    serde_json::from_slice::<Dump>(bytes).map_err(|e| match e.classify() {
        Category::Data => DumpError::Invalid {
            path: path(),
            msg: e.to_string(),
        },
        _ => syntax_error(e, path_for_messages),
    })
}

/// Maps a serde_json error from the first pass (where every data shape is accepted).
fn syntax_error(e: serde_json::Error, path: &Path) -> DumpError {
    let path = path.to_path_buf();
    match e.classify() {
        Category::Eof => DumpError::Truncated { path },
        Category::Data => DumpError::Invalid {
            path,
            msg: e.to_string(),
        },
        Category::Io | Category::Syntax => {
            let (line, column) = (e.line(), e.column());
            let full = e.to_string();
            let suffix = format!(" at line {line} column {column}");
            let msg = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
            DumpError::NotJson {
                path,
                line,
                column,
                msg,
            }
        }
    }
}

/// The top level of a JSON document as far as the schema check needs it: an object and its
/// `schema` value, or anything else.
enum Probe {
    Object(Option<serde_json::Value>),
    NotObject,
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ProbeVisitor)
    }
}

struct ProbeVisitor;

impl<'de> Visitor<'de> for ProbeVisitor {
    type Value = Probe;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probe, A::Error> {
        let mut schema = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "schema" && schema.is_none() {
                schema = Some(map.next_value::<serde_json::Value>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Probe::Object(schema))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Probe, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Probe::NotObject)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Probe, E> {
        Ok(Probe::NotObject)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Probe, E> {
        Ok(Probe::NotObject)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Probe, E> {
        Ok(Probe::NotObject)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Probe, E> {
        Ok(Probe::NotObject)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Probe, E> {
        Ok(Probe::NotObject)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Probe, E> {
        Ok(Probe::NotObject)
    }
}
