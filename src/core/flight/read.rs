//! Reading live regions from another process: list a user's regions, and return a validated
//! snapshot of one or a clear error. The reader never writes a region and never waits for its
//! writer; a region that is torn, truncated, foreign or hostile gives an error, never a crash.

use super::layout::{self, Header, SlotDesc, HEADER_BYTES, REGION_BYTES, SLOT_BYTES};
use super::{LiveSummary, LIVE_SCHEMA, REGION_SUFFIX};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A region file found in a live directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionEntry {
    pub path: PathBuf,
    pub pid: u32,
    pub start_ticks: u64,
    /// The process named by pid and start time still runs (a reused pid has another start
    /// time).
    pub alive: bool,
}

/// The regions in `dir`, by pid; a missing directory has none. Only names this layout writes
/// are listed.
pub fn list_regions(dir: &Path) -> Vec<RegionEntry> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<RegionEntry> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (pid, ticks) = name.strip_suffix(REGION_SUFFIX)?.split_once('-')?;
            let (pid, start_ticks): (u32, u64) = (pid.parse().ok()?, ticks.parse().ok()?);
            Some(RegionEntry {
                path: e.path(),
                pid,
                start_ticks,
                alive: super::start_ticks_of(pid) == Some(start_ticks),
            })
        })
        .collect();
    out.sort_by_key(|r| (r.pid, r.start_ticks));
    out
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
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "cannot read the region: {e}"),
            ReadError::Invalid(e) => write!(f, "not a valid oomshim live region: {e}"),
            ReadError::Empty => write!(f, "nothing published yet"),
            ReadError::Torn(e) => write!(f, "the region is torn and was rejected: {e}"),
        }
    }
}

/// How often a read that raced the writer is tried again before it counts as torn.
const RETRIES: usize = 8;

/// Reads the newest intact summary of the region at `path`.
pub fn read_region(path: &Path) -> Result<Snapshot, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ReadError::Io(e.to_string()))?;
    let meta = file.metadata().map_err(|e| ReadError::Io(e.to_string()))?;
    if !meta.is_file() {
        return Err(ReadError::Invalid("not a regular file".into()));
    }
    if meta.len() > REGION_BYTES {
        return Err(ReadError::Invalid(format!(
            "{} bytes, more than a region's {REGION_BYTES}",
            meta.len()
        )));
    }
    let mut last_err = ReadError::Empty;
    for _ in 0..RETRIES {
        let header = read_header(&file)?;
        if header.latest == 0 {
            return Err(ReadError::Empty);
        }
        match read_generation(&file, &header, header.latest) {
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
                    .map(|g| read_generation(&file, &header, g))
                {
                    Some(Ok(Some(summary))) => return finish(summary, header, true),
                    Some(Ok(None)) => {}
                    Some(Err(_)) | None => last_err = ReadError::Torn(newest),
                }
                if matches!(last_err, ReadError::Torn(_)) {
                    // Torn for good unless the writer moves on: look once more.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
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
    if summary.pid != header.pid || summary.start_ticks != header.start_ticks {
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
    let mut buf = vec![0u8; HEADER_BYTES as usize];
    let n = read_at_most(file, &mut buf, 0)?;
    layout::parse_header(&buf[..n]).map_err(ReadError::Invalid)
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
    list_regions(dir)
        .into_iter()
        .filter(|r| r.pid == pid)
        .last()
}

/// Whether the file at `path` is owned by this user (regions are private to their user).
pub fn owned_by_me(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == unsafe { libc::geteuid() })
}
