//! Unit tests of `oomshim_cli::report::export` (src/cli/report/export.rs).

use dump::model::{Dump, Frame, Holder};
use dump::model::{SegmentBlock, SegmentEntry};
use dump::read::parse_dump;
use dump::units::human_bytes;
use oomshim_cli::report::export::*;
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

fn int(v: &Value) -> i64 {
    match v {
        Value::I64(i) => *i,
        _ => panic!("not an int: {v:?}"),
    }
}

fn list(v: &Value) -> &Vec<Value> {
    match v {
        Value::List(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn string(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        _ => panic!("not a string: {v:?}"),
    }
}

fn fixture(name: &str) -> Dump {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
}

fn unpickle(dump: &Dump) -> (Value, MemoryViz) {
    let viz = memory_viz(dump).unwrap();
    let v = serde_pickle::value_from_slice(&viz.bytes, DeOptions::new()).unwrap();
    (v, viz)
}

/// What torch's viewer relies on: blocks tile their segment (their sizes add up to it), and
/// every address is a safe JavaScript integer.
fn assert_viewer_invariants(v: &Value) {
    for seg in list(key(v, "segments")) {
        let total = int(key(seg, "total_size"));
        let sizes: i64 = list(key(seg, "blocks"))
            .iter()
            .map(|b| int(key(b, "size")))
            .sum();
        assert_eq!(sizes, total, "blocks must tile their segment");
        let addr = int(key(seg, "address"));
        assert!(addr > 0 && (addr as u64) <= MAX_SAFE_INTEGER, "{addr:#x}");
    }
}

#[test]
fn holders_become_segments_and_the_rest_one_remainder_segment() {
    let dump = fixture("oom_own_allocations.json");
    let (v, viz) = unpickle(&dump);
    assert_viewer_invariants(&v);
    let segments = list(key(&v, "segments"));
    let tracked: u64 = dump.devices.iter().map(|d| d.tracked_bytes).sum();
    let exported: i64 = segments.iter().map(|s| int(key(s, "total_size"))).sum();
    assert_eq!(exported as u64, tracked, "every tracked byte is exported");
    let listed: u64 = dump.largest_holders.iter().map(|h| h.bytes).sum();
    if listed < tracked {
        assert_eq!(segments.len(), dump.largest_holders.len() + 1);
        let w = viz.warning.expect("a warning says how much was left out");
        assert!(w.contains(&human_bytes(tracked - listed)), "{w}");
    }
    // The largest holder keeps its stack.
    let top = &dump.largest_holders[0];
    let seg = segments
        .iter()
        .find(|s| string(key(s, "oomshim_address")) == format!("{:#x}", parse_hex(&top.address)))
        .expect("the top holder's segment");
    let block = &list(key(seg, "blocks"))[0];
    assert_eq!(string(key(block, "state")), "active_allocated");
    let frames = list(key(block, "frames"));
    assert_eq!(frames.len(), top.stack.len());
}

#[test]
fn vmm_addresses_become_safe_and_keep_their_rank_order() {
    let mut dump = fixture("oom_own_allocations.json");
    // cuMemCreate handles are written with bit 63 set.
    for (i, h) in dump.largest_holders.iter_mut().enumerate() {
        h.address = format!("{:#x}", (1u64 << 63) | ((100 - i as u64) << 21));
    }
    let (v, _) = unpickle(&dump);
    assert_viewer_invariants(&v);
    let segments = list(key(&v, "segments"));
    let mut pairs: Vec<(u64, i64)> = segments
        .iter()
        .filter(|s| key_opt(s, "oomshim_address").is_some())
        .map(|s| {
            (
                parse_hex(string(key(s, "oomshim_address"))),
                int(key(s, "address")),
            )
        })
        .collect();
    pairs.sort();
    assert!(pairs.windows(2).all(|w| w[0].1 < w[1].1), "rank order kept");
    assert_eq!(
        memory_viz(&dump).unwrap().bytes,
        memory_viz(&dump).unwrap().bytes,
        "stable"
    );
}

fn key_opt<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    match v {
        Value::Dict(d) => d.get(&HashableValue::String(k.to_string())),
        _ => None,
    }
}

#[test]
fn the_trace_replays_allocations_in_seq_order_then_the_oom() {
    let dump = fixture("oom_own_allocations.json");
    let (v, _) = unpickle(&dump);
    let req = dump.failed_request.as_ref().unwrap();
    let trace = list(&list(key(&v, "device_traces"))[req.device as usize]);
    let allocs: Vec<&Value> = trace
        .iter()
        .filter(|e| string(key(e, "action")) == "alloc")
        .collect();
    assert_eq!(allocs.len(), dump.largest_holders.len());
    let mut by_seq: Vec<&Holder> = dump.largest_holders.iter().collect();
    by_seq.sort_by_key(|h| h.seq);
    let sizes: Vec<i64> = allocs.iter().map(|e| int(key(e, "size"))).collect();
    assert_eq!(
        sizes,
        by_seq.iter().map(|h| h.bytes as i64).collect::<Vec<_>>()
    );
    // Each allocation's segment is created just before it.
    for pair in trace.windows(2) {
        if string(key(&pair[1], "action")) == "alloc" {
            assert_eq!(string(key(&pair[0], "action")), "segment_alloc");
            assert_eq!(int(key(&pair[0], "addr")), int(key(&pair[1], "addr")));
        }
    }
    let last = trace.last().unwrap();
    assert_eq!(string(key(last, "action")), "oom");
    assert_eq!(int(key(last, "size")) as u64, req.bytes);
    let free = dump
        .devices
        .iter()
        .find(|d| d.index == req.device)
        .unwrap()
        .free_bytes;
    assert_eq!(int(key(last, "device_free")) as u64, free.unwrap_or(0));
}

#[test]
fn allocator_mode_exports_the_real_segments_with_their_free_blocks() {
    let mut dump = fixture("oom_own_allocations.json");
    let device = dump.failed_request.as_ref().unwrap().device;
    let h0 = dump.largest_holders[0].clone();
    let seg_addr = 0x7f1000000000u64;
    dump.largest_holders.truncate(1);
    dump.largest_holders[0].address = format!("{:#x}", seg_addr + (4 << 20));
    dump.largest_holders[0].device = device;
    let bytes = h0.bytes.div_ceil(512) * 512;
    dump.free_blocks.source = "oomshim-allocator".into();
    dump.free_blocks.segment_map = vec![SegmentEntry {
        address: format!("{seg_addr:#x}"),
        bytes: (4 << 20) + bytes + (6 << 20) + (2 << 20),
        stream: "0x0".into(),
        pool: "large".into(),
        capture: None,
        blocks: vec![
            SegmentBlock {
                address: format!("{seg_addr:#x}"),
                bytes: 4 << 20,
                requested_bytes: 0,
                state: "inactive".into(),
            },
            SegmentBlock {
                address: format!("{:#x}", seg_addr + (4 << 20)),
                bytes,
                requested_bytes: h0.bytes,
                state: "active_allocated".into(),
            },
            SegmentBlock {
                address: format!("{:#x}", seg_addr + (4 << 20) + bytes),
                bytes: 6 << 20,
                requested_bytes: 6 << 20,
                state: "active_allocated".into(),
            },
            SegmentBlock {
                address: format!("{:#x}", seg_addr + (10 << 20) + bytes),
                bytes: 2 << 20,
                requested_bytes: 0,
                state: "inactive".into(),
            },
        ],
    }];
    let (v, viz) = unpickle(&dump);
    assert_viewer_invariants(&v);
    let segments = list(key(&v, "segments"));
    assert_eq!(segments.len(), 1, "one real segment, no segment per tensor");
    let blocks = list(key(&segments[0], "blocks"));
    let states: Vec<&str> = blocks.iter().map(|b| string(key(b, "state"))).collect();
    assert_eq!(
        states,
        [
            "inactive",
            "active_allocated",
            "active_allocated",
            "inactive"
        ]
    );
    // The listed holder gives its block its stack; the unlisted one says why it has none.
    assert_eq!(list(key(&blocks[1], "frames")).len(), h0.stack.len());
    assert_eq!(
        string(key(&list(key(&blocks[2], "frames"))[0], "name")),
        NOT_IN_DUMP
    );
    let warning = viz.warning.unwrap();
    assert!(
        warning.contains("1 allocated block (") && warning.contains("has no stack"),
        "{warning}"
    );
    // Offsets inside the segment are kept.
    let base = int(key(&segments[0], "address"));
    assert_eq!(int(key(&blocks[1], "address")) - base, 4 << 20);
    // The segment holds a block the trace cannot allocate: it exists from the start.
    let trace = list(&list(key(&v, "device_traces"))[device as usize]);
    let actions: Vec<&str> = trace.iter().map(|e| string(key(e, "action"))).collect();
    assert_eq!(actions, ["alloc", "oom"]);
}

#[test]
fn folded_lines_are_outermost_first_and_cover_every_tracked_byte() {
    let dump = fixture("oom_own_allocations.json");
    let f = folded(&dump);
    let tracked: u64 = dump.devices.iter().map(|d| d.tracked_bytes).sum();
    let mut total = 0u64;
    for line in f.text.lines() {
        let (stack, bytes) = line.rsplit_once(' ').unwrap();
        total += bytes.parse::<u64>().unwrap();
        assert!(!stack.is_empty());
    }
    assert_eq!(total, tracked, "{}", f.text);
    assert_eq!(f.lines, f.text.lines().count());
    // The top site: its allocating frame (innermost outside the shim) is last, its
    // outermost caller first.
    let site = &dump.sites[0];
    let own: Vec<&Frame> = site
        .stack
        .iter()
        .filter(|f| {
            !f.module
                .as_deref()
                .is_some_and(|m| m.contains("liboomshim"))
        })
        .collect();
    let first = f.text.lines().next().unwrap();
    let frames: Vec<&str> = first.rsplit_once(' ').unwrap().0.split(';').collect();
    assert_eq!(frames.len(), own.len());
    assert_eq!(frames.last().unwrap(), &folded_frame(own[0]));
    assert_eq!(frames.first().unwrap(), &folded_frame(own.last().unwrap()));
    assert!(
        first.contains("forward (/home/ada/proj/model.py:42)"),
        "{first}"
    );
}

#[test]
fn hostile_sizes_and_addresses_fail_cleanly_or_export() {
    let mut dump = fixture("oom_own_allocations.json");
    dump.largest_holders[0].bytes = u64::MAX;
    dump.largest_holders[1].address = "not hex".into();
    dump.devices[0].tracked_bytes = u64::MAX;
    let err = memory_viz(&dump).err().expect("too large for 53 bits");
    assert!(err.contains("53-bit"), "{err}");
    let mut dump = fixture("oom_own_allocations.json");
    dump.free_blocks.source = "oomshim-allocator".into();
    dump.free_blocks.segment_map = vec![SegmentEntry {
        address: "0x1000".into(),
        bytes: 4096,
        stream: "zz".into(),
        pool: "large".into(),
        capture: None,
        blocks: vec![SegmentBlock {
            address: "0xffffffffffffffff".into(),
            bytes: u64::MAX,
            requested_bytes: u64::MAX,
            state: "weird".into(),
        }],
    }];
    let _ = memory_viz(&dump);
    let _ = folded(&dump);
}

#[test]
fn folded_says_what_the_sites_leave_out() {
    let mut dump = fixture("oom_own_allocations.json");
    let dropped = dump.sites.pop().unwrap().bytes;
    let f = folded(&dump);
    let last = f.text.lines().last().unwrap();
    assert_eq!(last, format!("{FOLDED_REST} {dropped}"));
    assert!(f.warning.unwrap().contains(&human_bytes(dropped)));
}

#[test]
fn folded_frames_never_break_the_format() {
    let mut dump = fixture("oom_own_allocations.json");
    dump.sites[0].stack[0].function = Some("evil;name\nwith 1234".into());
    let f = folded(&dump);
    let first = f.text.lines().next().unwrap();
    assert_eq!(f.text.lines().count(), f.lines);
    let (stack, bytes) = first.rsplit_once(' ').unwrap();
    assert_eq!(bytes.parse::<u64>().unwrap(), dump.sites[0].bytes);
    assert!(stack.ends_with("evil:name\\nwith 1234"), "{stack}");
    let shim_frames = dump.sites[0]
        .stack
        .iter()
        .filter(|f| {
            f.module
                .as_deref()
                .is_some_and(|m| m.contains("liboomshim"))
        })
        .count();
    assert_eq!(
        stack.split(';').count(),
        dump.sites[0].stack.len() - shim_frames
    );
}
