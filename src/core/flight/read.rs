//! Reading live regions from another process: list a user's regions, and return a validated
//! snapshot of one or a clear error. The reader never writes a region and never waits for its
//! writer; a region that is torn, truncated, foreign or hostile gives an error, never a crash.
//!
//! Only this user's regions are trusted: the live directory must be a directory of this user
//! (a link to one only when the link is this user's or root's) that neither group nor others
//! can write, and each region a regular file of this user, writable by no one else, whose
//! header names this user ([`check_live_dir`], [`read_region`]). Anything else is ignored and
//! said, never read: another user can create `/dev/shm/oomshim-UID` before its owner does.
//!
//! The cost of a scrape or a `top` frame is bounded: a region whose newest publish stays torn
//! is not re-read while its header stays the same, and one that failed is remembered by its
//! file and header, so it is not read again until its writer publishes.

use super::layout::{
    self, Header, SlotDesc, HEADER_BYTES, MAGIC, MIN_HEADER, REGION_BYTES, SLOT_BYTES,
};
use super::{LiveSummary, LIVE_SCHEMA};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A region file found in a live directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionEntry {
    pub path: PathBuf,
    /// Whose it is, as its name says (the header must say the same to be read).
    pub id: super::RegionId,
    pub pid: u32,
    pub start_ticks: u64,
    /// Whether its writer runs, as far as can be told from here.
    pub liveness: super::Liveness,
    /// Not known to be gone: the process named by namespace, pid and start time still runs (a
    /// reused pid has another start time), or it is of another pid namespace.
    pub alive: bool,
}

/// What a look at a live directory found: the regions to read, and what was ignored (in words
/// for the user, to be said once).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub regions: Vec<RegionEntry>,
    pub ignored: Vec<String>,
}

fn me() -> u32 {
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why `meta` (of `what`) is not this user's private file or directory, or `None` when it is.
fn not_private(what: &str, meta: &std::fs::Metadata) -> Option<String> {
    if meta.uid() != me() {
        return Some(format!(
            "{what} belongs to uid {}, not to you (uid {})",
            meta.uid(),
            me()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "{what} is writable by others (mode {:04o})",
            meta.mode() & 0o7777
        ));
    }
    None
}

/// Whether `dir` may be trusted as a live directory: `Ok(false)` when it does not exist,
/// `Ok(true)` when it is a directory of this user writable by no one else (reached through a
/// link only when the link is this user's or root's), else why not.
pub fn check_live_dir(dir: &Path) -> Result<bool, String> {
    let shown = dump::units::clean(&dir.display().to_string());
    let link = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("the live directory {shown}: {e}")),
    };
    let meta = if link.file_type().is_symlink() {
        if link.uid() != me() && link.uid() != 0 {
            return Err(format!(
                "the live directory {shown} is a link of uid {}, not yours",
                link.uid()
            ));
        }
        match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("the live directory {shown}: {e}")),
        }
    } else {
        link
    };
    if !meta.is_dir() {
        return Err(format!("the live directory {shown} is not a directory"));
    }
    match not_private(&format!("the live directory {shown}"), &meta) {
        Some(why) => Err(why),
        None => Ok(true),
    }
}

/// The regions in `dir`, by pid, and what was ignored; a missing directory has none. Only names
/// this layout writes are listed, only in a trusted directory ([`check_live_dir`]) and only
/// regular files of this user that no one else can write.
pub fn scan(dir: &Path) -> Listing {
    let mut listing = Listing::default();
    match check_live_dir(dir) {
        Ok(true) => {}
        Ok(false) => return listing,
        Err(why) => {
            listing
                .ignored
                .push(format!("{why}: none of its regions is read"));
            return listing;
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return listing;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Some(id) = super::RegionId::parse(&name) else {
            continue;
        };
        let path = e.path();
        let shown = dump::units::clean(&name);
        match std::fs::symlink_metadata(&path) {
            Err(_) => continue, // gone since the listing: its process exited
            Ok(m) if !m.is_file() => {
                listing
                    .ignored
                    .push(format!("{shown} is not a regular file: ignored"));
                continue;
            }
            Ok(m) => {
                if let Some(why) = not_private(&shown, &m) {
                    listing.ignored.push(format!("{why}: ignored"));
                    continue;
                }
            }
        }
        let liveness = super::liveness(&id);
        listing.regions.push(RegionEntry {
            path,
            id,
            pid: id.pid,
            start_ticks: id.start_ticks,
            liveness,
            alive: liveness != super::Liveness::Gone,
        });
    }
    listing
        .regions
        .sort_by_key(|r| (r.id.pid_ns, r.pid, r.start_ticks));
    listing.ignored.sort();
    listing
}

/// The regions in `dir` that [`scan`] trusts, by pid.
pub fn list_regions(dir: &Path) -> Vec<RegionEntry> {
    scan(dir).regions
}

/// A validated summary, and how it was had.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub summary: LiveSummary,
    pub header: Header,
    /// The newest publish was torn (its writer stopped mid-update, or it was damaged), so the
    /// one before it was read.
    pub from_previous: bool,
}

/// Why a region could not be read, in words for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Opening or reading failed.
    Io(String),
    /// Not a region of this layout, or one whose fields contradict themselves.
    Invalid(String),
    /// The writer has not published yet.
    Empty,
    /// No complete, intact payload: torn mid-update or damaged.
    Torn(String),
    /// Not this user's: the region or its directory belongs to, or can be written by, someone
    /// else, or its header names another user. Never read further.
    Foreign(String),
    /// Removed between being listed and being read: its process exited normally.
    Gone,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "cannot read the region: {e}"),
            ReadError::Invalid(e) => write!(f, "not a valid oomshim live region: {e}"),
            ReadError::Empty => write!(f, "nothing published yet"),
            ReadError::Torn(e) => write!(f, "the region is torn and was rejected: {e}"),
            ReadError::Foreign(e) => write!(f, "not read, it is not yours: {e}"),
            ReadError::Gone => write!(f, "is not there (removed, or never created)"),
        }
    }
}

/// How often a read that raced the writer (its header changed meanwhile) is tried again.
const RETRIES: usize = 8;
/// Time a region may take to be read, retries included, beyond its first attempt.
const RETRY_BUDGET: std::time::Duration = std::time::Duration::from_millis(50);
/// Failed regions remembered at most (a cache, not a record: it is emptied when full).
const BAD_CACHE_ENTRIES: usize = 4096;

/// Regions whose payload failed, by (device, inode), with the file size and the header bytes
/// they had then: while both stay the same, the failure is the same one (a writer that
/// publishes changes the header), so the payload is not read again.
type BadRegions = std::collections::HashMap<(u64, u64), (u64, Vec<u8>, ReadError)>;
static BAD: std::sync::Mutex<Option<BadRegions>> = std::sync::Mutex::new(None);

fn remembered(key: (u64, u64), len: u64, head: &[u8]) -> Option<ReadError> {
    let bad = BAD.lock().unwrap_or_else(|p| p.into_inner());
    let (l, h, e) = bad.as_ref()?.get(&key)?;
    (*l == len && h == head).then(|| e.clone())
}

fn remember(key: (u64, u64), len: u64, head: Vec<u8>, err: Option<&ReadError>) {
    let mut bad = BAD.lock().unwrap_or_else(|p| p.into_inner());
    let map = bad.get_or_insert_with(Default::default);
    match err {
        None => {
            map.remove(&key);
        }
        Some(e) => {
            if map.len() >= BAD_CACHE_ENTRIES {
                map.clear();
            }
            map.insert(key, (len, head, e.clone()));
        }
    }
}

/// Reads the newest intact summary of the region at `path`, if the region and its directory
/// are this user's (see the module's comment).
pub fn read_region(path: &Path) -> Result<Snapshot, ReadError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        match check_live_dir(dir) {
            Ok(true) => {}
            Ok(false) => return Err(ReadError::Gone),
            Err(why) => return Err(ReadError::Foreign(why)),
        }
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::Gone),
        Err(e) => return Err(ReadError::Io(e.to_string())),
    };
    let meta = file.metadata().map_err(|e| ReadError::Io(e.to_string()))?;
    if !meta.is_file() {
        return Err(ReadError::Invalid("not a regular file".into()));
    }
    if let Some(why) = not_private("the region", &meta) {
        return Err(ReadError::Foreign(why));
    }
    if meta.len() > REGION_BYTES {
        return Err(ReadError::Invalid(format!(
            "{} bytes, more than a region's {REGION_BYTES}",
            meta.len()
        )));
    }
    let key = (meta.dev(), meta.ino());
    let first = read_header_bytes(&file)?;
    if let Some(e) = remembered(key, meta.len(), &first) {
        return Err(e);
    }
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(super::RegionId::parse);
    let result = read_validated(&file, first.clone()).and_then(|snap| match named {
        // Read through its name: the header must be of the process the name says, or another
        // process's region sits under this name (or this one's under another).
        Some(id) if !snap.header.is_of(&id) => Err(ReadError::Invalid(
            "its header names another process than its file name".into(),
        )),
        _ => Ok(snap),
    });
    match &result {
        Err(e @ (ReadError::Torn(_) | ReadError::Invalid(_))) => {
            remember(key, meta.len(), first, Some(e))
        }
        _ => remember(key, meta.len(), first, None),
    }
    result
}

/// The header's bytes as they are now (up to [`HEADER_BYTES`]).
fn read_header_bytes(file: &File) -> Result<Vec<u8>, ReadError> {
    let mut buf = vec![0u8; HEADER_BYTES as usize];
    let n = read_at_most(file, &mut buf, 0)?;
    buf.truncate(n);
    Ok(buf)
}

/// A header its writer has not finished writing yet: nothing there, or only the start of what
/// it writes (a region is created empty, then its header is written).
fn not_initialised(head: &[u8]) -> bool {
    let m = head.len().min(MAGIC.len());
    head.is_empty()
        || head[..m].iter().all(|&b| b == 0)
        || (head.len() < MIN_HEADER && head[..m] == MAGIC[..m])
}

fn read_validated(file: &File, mut head: Vec<u8>) -> Result<Snapshot, ReadError> {
    if not_initialised(&head) {
        return Err(ReadError::Empty);
    }
    let deadline = std::time::Instant::now() + RETRY_BUDGET;
    let mut last_err = ReadError::Empty;
    for attempt in 0..RETRIES {
        if attempt > 0 {
            head = read_header_bytes(file)?;
        }
        let header = layout::parse_header(&head).map_err(ReadError::Invalid)?;
        if header.uid != me() {
            return Err(ReadError::Foreign(format!(
                "its header names uid {}, not you (uid {})",
                header.uid,
                me()
            )));
        }
        if header.latest == 0 {
            return Err(ReadError::Empty);
        }
        match read_generation(file, &header, header.latest) {
            Ok(Some(summary)) => {
                return finish(summary, header, false);
            }
            Ok(None) => {} // raced the writer: again
            Err(newest) => {
                // The newest is damaged: the one before it, in the other slot, may be whole.
                match header
                    .latest
                    .checked_sub(1)
                    .filter(|g| *g > 0)
                    .map(|g| read_generation(file, &header, g))
                {
                    Some(Ok(Some(summary))) => return finish(summary, header, true),
                    Some(Ok(None)) => {}
                    Some(Err(_)) | None => last_err = ReadError::Torn(newest),
                }
                if matches!(last_err, ReadError::Torn(_)) {
                    // Torn for good unless the writer moves on: look again only if its header
                    // changed since (a writer at work), never re-reading a region that sits still.
                    if read_header_bytes(file)? == head {
                        return Err(last_err);
                    }
                }
            }
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
    }
    Err(match last_err {
        ReadError::Empty => ReadError::Torn("it kept changing while being read".into()),
        e => e,
    })
}

fn finish(
    summary: LiveSummary,
    header: Header,
    from_previous: bool,
) -> Result<Snapshot, ReadError> {
    if summary.pid != header.pid
        || summary.start_ticks != header.start_ticks
        || summary.pid_ns.unwrap_or(0) != header.pid_ns
    {
        return Err(ReadError::Invalid(
            "the payload names another process than the header".into(),
        ));
    }
    Ok(Snapshot {
        summary,
        header,
        from_previous,
    })
}

fn read_header(file: &File) -> Result<Header, ReadError> {
    layout::parse_header(&read_header_bytes(file)?).map_err(ReadError::Invalid)
}

fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> Result<usize, ReadError> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e.to_string())),
        }
    }
    Ok(done)
}

/// Generation `gen` from its slot: `Ok(None)` when the writer was seen at work on it (read
/// again), `Err` when it is not there intact.
fn read_generation(file: &File, header: &Header, gen: u64) -> Result<Option<LiveSummary>, String> {
    let slot = gen % 2;
    let desc: SlotDesc = header.slots[slot as usize];
    if desc.seq % 2 == 1 {
        return Err(format!(
            "publish {gen} was left half-written (slot {slot} marked as being updated)"
        ));
    }
    if desc.generation != gen {
        return Err(format!(
            "slot {slot} holds publish {} where {gen} was expected",
            desc.generation
        ));
    }
    if desc.len == 0 || desc.len > SLOT_BYTES {
        return Err(format!("slot {slot} claims {} bytes", desc.len));
    }
    let mut payload = vec![0u8; desc.len as usize];
    let n = read_at_most(file, &mut payload, layout::slot_payload_offset(slot))
        .map_err(|e| e.to_string())?;
    if n < payload.len() {
        return Err(format!(
            "slot {slot} is cut short ({n} of {} bytes)",
            desc.len
        ));
    }
    // The seqlock's second look: the slot must not have been touched while it was copied.
    let again = read_header(file).map_err(|e| e.to_string())?;
    if again.slots[slot as usize] != desc {
        return Ok(None);
    }
    if layout::checksum(&payload) != desc.checksum {
        return Err(format!("publish {gen} fails its checksum"));
    }
    let summary: LiveSummary = serde_json::from_slice(&payload)
        .map_err(|e| format!("publish {gen} is not a summary: {e}"))?;
    if summary.schema != LIVE_SCHEMA {
        return Err(format!(
            "publish {gen} has schema {:?}, not {LIVE_SCHEMA}",
            dump::units::clean(&summary.schema)
        ));
    }
    Ok(Some(summary))
}

/// The region of `pid` in `dir` (the newest by start time when several are there).
pub fn region_of(dir: &Path, pid: u32) -> Option<RegionEntry> {
    list_regions(dir).into_iter().rfind(|r| r.pid == pid)
}

/// Whether the file at `path` is owned by this user and writable by no one else (regions are
/// private to their user).
pub fn owned_by_me(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| not_private("", &m).is_none())
}
