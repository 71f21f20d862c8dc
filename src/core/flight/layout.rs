//! The live region's bytes: a fixed header and two payload slots, written by one process (the
//! shim's publisher thread) and read by others (`oomshim run` after a death, `oomshim top`,
//! exporters). Plain `pread`/`pwrite` on a tmpfs file, never `mmap`: a full `/dev/shm` makes a
//! write fail with `ENOSPC` instead of killing the program with SIGBUS, and a truncated or
//! hostile file can only make a read come up short.
//!
//! Layout, version [`VERSION`] (all integers little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `OOMSHLIV` |
//! | 8 | 4 | layout version |
//! | 12 | 4 | header bytes ([`HEADER_BYTES`]) |
//! | 16 | 8 | region bytes ([`REGION_BYTES`]) |
//! | 24 | 4 | pid of the writer |
//! | 28 | 4 | uid of the writer |
//! | 32 | 8 | the writer's start time (`/proc/PID/stat` field 22, clock ticks since boot) |
//! | 40 | 8 | generation of the newest complete payload (0: none yet) |
//! | 48 + 32·i | 32 | slot i: `seq` (odd while being written), `len`, `checksum` (FNV-1a 64 of the payload), `generation` |
//! | 112 | 8 | the writer's pid namespace (inode of `/proc/self/ns/pid`; 0 from older writers) |
//!
//! Payload slot i starts at `HEADER_BYTES + i · SLOT_BYTES`: JSON of
//! [`crate::flight::LiveSummary`]. Generation g goes to slot `g % 2`, so the slot being
//! rewritten is never the newest complete one: a writer killed mid-update leaves the previous
//! payload readable (a seqlock with two buffers; the writer never waits for a reader).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub const MAGIC: [u8; 8] = *b"OOMSHLIV";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 4096;
/// The whole region: 16 MiB at most, as documented (README: Live summary). The file is sparse:
/// only the pages written (the header and the payloads, typically tens of KiB) use memory.
pub const REGION_BYTES: u64 = 16 << 20;
pub const SLOT_BYTES: u64 = (REGION_BYTES - HEADER_BYTES) / 2;

const OFF_VERSION: u64 = 8;
const OFF_HEADER_BYTES: u64 = 12;
const OFF_REGION_BYTES: u64 = 16;
const OFF_PID: u64 = 24;
const OFF_UID: u64 = 28;
const OFF_START: u64 = 32;
const OFF_LATEST: u64 = 40;
const OFF_SLOTS: u64 = 48;
const SLOT_DESC_BYTES: u64 = 32;
/// Bytes a header needs to be parsed (the fixed fields and both slot descriptors).
pub const MIN_HEADER: usize = (OFF_SLOTS + 2 * SLOT_DESC_BYTES) as usize;
/// After the slot descriptors; read as 0 where an older writer left nothing.
const OFF_PID_NS: u64 = MIN_HEADER as u64;
/// The header a writer writes.
const WRITTEN_HEADER: usize = MIN_HEADER + 8;

// Shared with the symbol cache (src/host/stacks); lives with the dump format, re-exported here.
pub use dump::checksum::checksum;

pub const fn slot_desc_offset(slot: u64) -> u64 {
    OFF_SLOTS + slot * SLOT_DESC_BYTES
}

pub const fn slot_payload_offset(slot: u64) -> u64 {
    HEADER_BYTES + slot * SLOT_BYTES
}

// The layout's arithmetic, checked when it compiles: both slot descriptors fit the header, and
// the second payload slot ends exactly at the region's end.
const _: () = assert!(slot_desc_offset(2) <= HEADER_BYTES);
const _: () = assert!(slot_payload_offset(1) + SLOT_BYTES == REGION_BYTES);

/// The fixed part of a header, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub pid: u32,
    pub uid: u32,
    pub start_ticks: u64,
    /// 0 in regions of older writers.
    pub pid_ns: u64,
    pub latest: u64,
    pub slots: [SlotDesc; 2],
}

impl Header {
    /// Whether this header is that of the region named `id` (a region of an older writer
    /// names no namespace in its header: its name's then decides).
    pub fn is_of(&self, id: &super::RegionId) -> bool {
        self.pid == id.pid
            && self.start_ticks == id.start_ticks
            && (self.pid_ns == id.pid_ns || self.pid_ns == 0)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotDesc {
    pub seq: u64,
    pub len: u64,
    pub checksum: u64,
    pub generation: u64,
}

fn u32_at(b: &[u8], off: u64) -> u32 {
    let o = off as usize;
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: u64) -> u64 {
    let o = off as usize;
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Parses and checks a header; the error says in words what is wrong with it.
pub fn parse_header(b: &[u8]) -> Result<Header, String> {
    if b.len() < OFF_SLOTS as usize + 2 * SLOT_DESC_BYTES as usize {
        return Err(format!("too short for a header ({} bytes)", b.len()));
    }
    if b[..8] != MAGIC {
        return Err("not an oomshim live region (wrong magic)".into());
    }
    let version = u32_at(b, OFF_VERSION);
    if version != VERSION {
        return Err(format!(
            "layout version {version}, this oomshim reads version {VERSION}"
        ));
    }
    if u32_at(b, OFF_HEADER_BYTES) as u64 != HEADER_BYTES
        || u64_at(b, OFF_REGION_BYTES) != REGION_BYTES
    {
        return Err("header and region sizes are not those of this layout version".into());
    }
    let slot = |i: u64| SlotDesc {
        seq: u64_at(b, slot_desc_offset(i)),
        len: u64_at(b, slot_desc_offset(i) + 8),
        checksum: u64_at(b, slot_desc_offset(i) + 16),
        generation: u64_at(b, slot_desc_offset(i) + 24),
    };
    Ok(Header {
        version,
        pid: u32_at(b, OFF_PID),
        uid: u32_at(b, OFF_UID),
        start_ticks: u64_at(b, OFF_START),
        pid_ns: if b.len() >= WRITTEN_HEADER {
            u64_at(b, OFF_PID_NS)
        } else {
            0
        },
        latest: u64_at(b, OFF_LATEST),
        slots: [slot(0), slot(1)],
    })
}

/// The writing side of a region file: one writer per region (the publisher thread).
pub struct RegionWriter {
    /// Only while a publish runs (see [`RegionWriter::use_file`]).
    file: Option<File>,
    generation: u64,
    seqs: [u64; 2],
}

impl RegionWriter {
    /// Initialises `file` (already created 0600 by the caller) as an empty region of `id`.
    pub fn init(file: File, id: &super::RegionId, uid: u32) -> io::Result<RegionWriter> {
        let (pid, start_ticks) = (id.pid, id.start_ticks);
        file.set_len(0)?; // sparse: it grows as slots are written, up to REGION_BYTES
        let mut h = vec![0u8; WRITTEN_HEADER];
        h[..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        h[16..24].copy_from_slice(&REGION_BYTES.to_le_bytes());
        h[24..28].copy_from_slice(&pid.to_le_bytes());
        h[28..32].copy_from_slice(&uid.to_le_bytes());
        h[32..40].copy_from_slice(&start_ticks.to_le_bytes());
        h[OFF_PID_NS as usize..WRITTEN_HEADER].copy_from_slice(&id.pid_ns.to_le_bytes());
        file.write_all_at(&h, 0)?;
        Ok(RegionWriter {
            file: Some(file),
            generation: 0,
            seqs: [0, 0],
        })
    }

    /// The newest generation published (0: none yet).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Writes through `file` until [`RegionWriter::release_file`]: the same region reopened by
    /// its path for one publish.
    pub fn use_file(&mut self, file: File) {
        self.file = Some(file);
    }

    /// Closes the descriptor now, while it is surely still the writer's. A publisher keeps no
    /// descriptor between publishes: the program owns its descriptor table and may close every
    /// number it did not open (`closefrom(3)`) and reuse it; a descriptor kept across that and
    /// closed later would close one of the program's own files.
    pub fn release_file(&mut self) {
        self.file = None;
    }

    fn file(&self) -> io::Result<&File> {
        self.file.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the region is not open for this publish",
            )
        })
    }

    /// Publishes `payload` as the next generation; returns it. Fails (and publishes nothing
    /// new: the previous payload stays the newest) when the payload does not fit a slot or the
    /// write fails.
    pub fn publish(&mut self, payload: &[u8]) -> io::Result<u64> {
        if payload.len() as u64 > SLOT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "summary of {} bytes exceeds a slot of {SLOT_BYTES}",
                    payload.len()
                ),
            ));
        }
        let gen = self.generation + 1;
        let slot = gen % 2;
        let d = slot_desc_offset(slot);
        self.begin(slot)?;
        self.file()?
            .write_all_at(payload, slot_payload_offset(slot))?;
        let mut desc = [0u8; 24];
        desc[..8].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        desc[8..16].copy_from_slice(&checksum(payload).to_le_bytes());
        desc[16..24].copy_from_slice(&gen.to_le_bytes());
        self.file()?.write_all_at(&desc, d + 8)?;
        self.seqs[slot as usize] += 1; // even: complete
        self.file()?
            .write_all_at(&self.seqs[slot as usize].to_le_bytes(), d)?;
        self.file()?.write_all_at(&gen.to_le_bytes(), OFF_LATEST)?;
        self.generation = gen;
        Ok(gen)
    }

    /// Marks the next slot as being written (its `seq` odd).
    fn begin(&mut self, slot: u64) -> io::Result<()> {
        self.seqs[slot as usize] += 1;
        if self.seqs[slot as usize].is_multiple_of(2) {
            self.seqs[slot as usize] += 1;
        }
        self.file()?.write_all_at(
            &self.seqs[slot as usize].to_le_bytes(),
            slot_desc_offset(slot),
        )
    }

    /// What a writer killed in the middle of a publish leaves: the next slot marked as being
    /// written and half of `payload` in it. For tests of readers.
    #[doc(hidden)]
    pub fn publish_torn(&mut self, payload: &[u8]) -> io::Result<()> {
        let slot = (self.generation + 1) % 2;
        self.begin(slot)?;
        let half = &payload[..payload.len().min(SLOT_BYTES as usize) / 2];
        self.file()?.write_all_at(half, slot_payload_offset(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_never_grows_past_its_documented_16_mib() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let id = super::super::RegionId {
            pid_ns: 9,
            pid: 1,
            start_ticks: 3,
        };
        let mut w = RegionWriter::init(File::create(&path).unwrap(), &id, 2).unwrap();
        // The largest payload a slot takes, in both slots: the file is then exactly the region.
        let full = vec![b'x'; SLOT_BYTES as usize];
        assert_eq!(w.publish(&full).unwrap(), 1);
        assert_eq!(w.publish(&full).unwrap(), 2);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, REGION_BYTES);
        assert!(
            len <= 16 << 20,
            "README: Live summary promises 16 MiB at most"
        );
        // One byte more is refused and publishes nothing: the file and the newest stay.
        let err = w.publish(&vec![b'y'; SLOT_BYTES as usize + 1]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(w.generation(), 2);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, REGION_BYTES);
        let h = parse_header(&bytes[..HEADER_BYTES as usize]).unwrap();
        assert_eq!(h.latest, 2);
        assert_eq!((h.slots[0].len, h.slots[1].len), (SLOT_BYTES, SLOT_BYTES));
        // The header's fields never reach into the first payload.
        assert!(bytes[WRITTEN_HEADER..HEADER_BYTES as usize]
            .iter()
            .all(|&b| b == 0));
    }

    #[test]
    fn headers_from_other_versions_or_files_are_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let f = File::create(&path).unwrap();
        let id = super::super::RegionId {
            pid_ns: 4026531836,
            pid: 42,
            start_ticks: 777,
        };
        let mut w = RegionWriter::init(f, &id, 1000).unwrap();
        w.publish(b"{}").unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let h = parse_header(&bytes[..HEADER_BYTES as usize]).unwrap();
        assert_eq!((h.pid, h.uid, h.start_ticks, h.latest), (42, 1000, 777, 1));
        assert_eq!(h.pid_ns, 4026531836);
        assert!(h.is_of(&id));
        assert!(!h.is_of(&super::super::RegionId { pid_ns: 1, ..id }));
        assert_eq!(h.slots[1].len, 2);
        assert_eq!(h.slots[1].seq % 2, 0);
        bytes[8] = 9;
        assert!(parse_header(&bytes).unwrap_err().contains("version 9"));
        bytes[0] = b'X';
        assert!(parse_header(&bytes).unwrap_err().contains("magic"));
        assert!(parse_header(&bytes[..10])
            .unwrap_err()
            .contains("too short"));
    }
}
