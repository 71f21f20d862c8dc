//! `oomshim export DUMP --memory-viz OUT.pickle`: a dump as a PyTorch memory snapshot, the
//! pickle that `torch.cuda.memory._snapshot()` produces and PyTorch's memory viewer
//! (pytorch.org/memory_viz, `torch.cuda._memory_viz`) reads.
//!
//! Under LD_PRELOAD every holder is a block of device memory the program got from CUDA (for
//! PyTorch, one of its cache segments), so each becomes a segment holding one active block of its
//! whole size, with the holder's stack as the block's frames. Only the holders the dump lists
//! (`OOMSHIM_TOP`) are exported; the dump has no history, so `device_traces` are empty.

use crate::dump::model::{Dump, Frame, Holder};
use serde::Serialize;

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<()>>,
}

#[derive(Serialize)]
struct Segment {
    device: i64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u64,
    segment_type: &'static str,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    frames: Vec<VizFrame>,
    blocks: Vec<Block>,
}

#[derive(Serialize)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<VizFrame>,
}

#[derive(Serialize)]
struct VizFrame {
    filename: String,
    line: u64,
    name: String,
}

fn viz_frame(f: &Frame) -> VizFrame {
    VizFrame {
        filename: f
            .file
            .clone()
            .or_else(|| f.module.clone())
            .unwrap_or_else(|| "??".to_string()),
        line: f.line.unwrap_or(0) as u64,
        name: f.function.clone().unwrap_or_else(|| f.address.clone()),
    }
}

fn parse_hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0)
}

/// PyTorch calls segments below 1 MiB "small" (its small pool); the viewer only labels them.
fn segment(h: &Holder) -> Segment {
    let frames: Vec<VizFrame> = h.stack.iter().map(viz_frame).collect();
    let address = parse_hex(&h.address);
    Segment {
        device: h.device as i64,
        address,
        total_size: h.bytes,
        allocated_size: h.bytes,
        active_size: h.bytes,
        requested_size: h.bytes,
        stream: h.stream.as_deref().map(parse_hex).unwrap_or(0),
        segment_type: if h.bytes < (1 << 20) {
            "small"
        } else {
            "large"
        },
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames: Vec::new(),
        blocks: vec![Block {
            address,
            size: h.bytes,
            requested_size: h.bytes,
            state: "active_allocated",
            frames,
        }],
    }
}

/// Device ordinals the snapshot has trace lists for: torch's snapshot holds one (empty here)
/// list per device, indexed by ordinal, so the count follows the highest ordinal, not the
/// number of devices. A dump's ordinal is only a number in a file: a hostile 2147483647 must
/// not make a list of 2^31 lists (48 GiB). No machine has more GPUs than this.
pub const MAX_DEVICES: usize = 1024;

/// The snapshot pickle (protocol 3) for `dump`. Holders on devices at or beyond
/// [`MAX_DEVICES`] (only in a corrupt or hostile dump) are left out.
pub fn memory_viz(dump: &Dump) -> Result<Vec<u8>, String> {
    let on_a_device = |d: i32| d >= 0 && (d as usize) < MAX_DEVICES;
    let devices = dump
        .devices
        .iter()
        .map(|d| d.index)
        .chain(dump.largest_holders.iter().map(|h| h.device))
        .filter(|&d| on_a_device(d))
        .map(|d| d as usize + 1)
        .max()
        .unwrap_or(1);
    let snapshot = Snapshot {
        segments: dump
            .largest_holders
            .iter()
            .filter(|h| on_a_device(h.device))
            .map(segment)
            .collect(),
        device_traces: vec![Vec::new(); devices],
    };
    serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::read::parse_dump;
    use serde_pickle::{DeOptions, HashableValue, Value};
    use std::path::Path;

    fn key<'a>(v: &'a Value, k: &str) -> &'a Value {
        match v {
            Value::Dict(d) => d
                .get(&HashableValue::String(k.to_string()))
                .unwrap_or_else(|| panic!("no key {k}")),
            _ => panic!("not a dict: {v:?}"),
        }
    }

    #[test]
    fn holders_become_segments_with_one_active_block() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom_own_allocations.json");
        let dump = parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap();
        let bytes = memory_viz(&dump).unwrap();
        let v: Value = serde_pickle::value_from_slice(&bytes, DeOptions::new()).unwrap();
        let Value::List(segments) = key(&v, "segments") else {
            panic!()
        };
        assert_eq!(segments.len(), dump.largest_holders.len());
        let top = &dump.largest_holders[0];
        assert_eq!(
            key(&segments[0], "total_size"),
            &Value::I64(top.bytes as i64)
        );
        let Value::List(blocks) = key(&segments[0], "blocks") else {
            panic!()
        };
        assert_eq!(
            key(&blocks[0], "state"),
            &Value::String("active_allocated".into())
        );
        let Value::List(frames) = key(&blocks[0], "frames") else {
            panic!()
        };
        assert_eq!(frames.len(), top.stack.len());
        let named = top.stack.iter().position(|f| f.function.is_some()).unwrap();
        assert_eq!(
            key(&frames[named], "name"),
            &Value::String(top.stack[named].function.clone().unwrap())
        );
        assert!(matches!(key(&segments[0], "segment_pool_id"), Value::Tuple(t) if t.len() == 2));
        let Value::List(traces) = key(&v, "device_traces") else {
            panic!()
        };
        assert!(!traces.is_empty());
    }
}
