//! `oomshim export`: a dump for other tools.
//!
//! - `--memory-viz OUT.pickle`: the pickle `torch.cuda.memory._snapshot()` produces, which
//!   PyTorch's memory viewer (pytorch.org/memory_viz, `torch.cuda._memory_viz`) reads.
//! - `--folded OUT`: folded stacks (`outer;…;inner bytes`) for flamegraph.pl, inferno and
//!   speedscope.
//!
//! The memory_viz layout follows what torch's viewer reads (torch/cuda/_memory_viz.py and
//! torch/utils/viz/MemoryViz.js):
//!
//! - `segments[]`: `device`, `address`, `total_size`, `stream`, and `blocks[]` in address order
//!   that tile the segment exactly (the viewer computes each block's address by adding the sizes
//!   before it; `segsum` asserts the sizes add up), each with `size`, `requested_size`, `state`
//!   and `frames` (innermost first: `filename`, `line`, `name`).
//! - `device_traces[device][]`: events the Active Memory Timeline replays: `segment_alloc` and
//!   `alloc` (`addr`, `size`, `stream`, `frames`, `time_us`) in allocation order (the holders'
//!   `seq`), then the failure as `oom` (`size`, `device_free`).
//!
//! Addresses: the viewer's unpickler turns integers wider than 53 bits into BigInt and then
//! fails in its address arithmetic, and VMM handles (`cuMemCreate`) are written with bit 63 set.
//! So every segment is laid out again in a compact synthetic address space, in the rank order
//! of the real addresses (stable for a dump), 2 MiB aligned from [`SYNTHETIC_BASE`]; blocks keep
//! their offsets inside their segment. The real address stays in `oomshim_address` (hex), a key
//! the viewer ignores. Streams become their rank (0 stays 0).
//!
//! Under `LD_PRELOAD` each holder is memory the program got from CUDA (for PyTorch, one of its
//! cache segments): one segment with one active block. The dump lists only the largest holders
//! (`OOMSHIM_TOP`); the rest of each device's tracked bytes becomes one remainder segment, and
//! the export says so. In allocator mode the dump has the allocator's real segments with every
//! block (`free_blocks.segment_map`): those are exported as they are, free blocks included, and
//! the holders give the allocated blocks their stacks.

use std::collections::{BTreeMap, HashMap};

use dump::model::{Dump, Frame, Holder};
use dump::units::{human_bytes, plural};
use serde::Serialize;

/// Where the synthetic address space starts: looks like a device address, far below 2^53.
pub const SYNTHETIC_BASE: u64 = 0x7f00_0000_0000;
/// Alignment of synthetic segment starts.
const SEGMENT_ALIGN: u64 = 2 << 20;
/// The largest integer the viewer's JavaScript holds exactly.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
/// Frame name of the remainder segment and of blocks whose holder the dump does not list.
pub const NOT_IN_DUMP: &str = "[not in the dump's largest holders: raise OOMSHIM_TOP]";

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<TraceEvent>>,
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
    /// The real address (hex); absent for the remainder segment.
    #[serde(skip_serializing_if = "Option::is_none")]
    oomshim_address: Option<String>,
}

#[derive(Serialize)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<VizFrame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    oomshim_address: Option<String>,
}

#[derive(Serialize)]
struct TraceEvent {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    frames: Vec<VizFrame>,
    time_us: u64,
    /// `oom` only: free device bytes when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<u64>,
}

#[derive(Serialize, Clone)]
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

fn viz_frames(stack: &[Frame]) -> Vec<VizFrame> {
    stack.iter().map(viz_frame).collect()
}

fn not_in_dump_frames() -> Vec<VizFrame> {
    vec![VizFrame {
        filename: "oomshim".to_string(),
        line: 0,
        name: NOT_IN_DUMP.to_string(),
    }]
}

fn parse_hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap_or(0)
}

/// A block before layout: real address (None for the remainder), what it holds, and when.
struct RawBlock<'a> {
    real: Option<u64>,
    size: u64,
    requested: u64,
    state: &'static str,
    holder: Option<&'a Holder>,
}

/// A segment before layout.
struct RawSegment<'a> {
    device: i32,
    real: Option<u64>,
    size: u64,
    stream: u64,
    capture: Option<u64>,
    blocks: Vec<RawBlock<'a>>,
    /// Its stack, when one holder is the whole segment (LD_PRELOAD).
    frames: Vec<VizFrame>,
}

/// The export, with what to tell the user.
pub struct MemoryViz {
    pub bytes: Vec<u8>,
    pub segments: usize,
    /// What the export could not include, one sentence (for stderr).
    pub warning: Option<String>,
}

/// Device ordinals the snapshot has trace lists for: torch's snapshot holds one list per device,
/// indexed by ordinal, so the count follows the highest ordinal, not the number of devices. A
/// dump's ordinal is only a number in a file: a hostile 2147483647 must not make a list of 2^31
/// lists (48 GiB). No machine has more GPUs than this.
pub const MAX_DEVICES: usize = 1024;

/// The snapshot pickle (protocol 3) for `dump`. Holders on devices at or beyond
/// [`MAX_DEVICES`] (only in a corrupt or hostile dump) are left out.
pub fn memory_viz(dump: &Dump) -> Result<MemoryViz, String> {
    let on_a_device = |d: i32| d >= 0 && (d as usize) < MAX_DEVICES;
    let mut warnings = Vec::new();
    let mut raw = segments_of(dump, &mut warnings);
    raw.retain(|s| on_a_device(s.device));
    // Rank order of the real addresses, per device; the remainder last.
    raw.sort_by_key(|s| (s.device, s.real.is_none(), s.real));

    let mut streams: Vec<u64> = raw.iter().map(|s| s.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    let stream_rank = |s: u64| -> u64 {
        if s == 0 {
            0
        } else {
            streams.iter().filter(|&&x| x != 0 && x < s).count() as u64 + 1
        }
    };

    let devices = dump
        .devices
        .iter()
        .map(|d| d.index)
        .chain(raw.iter().map(|s| s.device))
        .filter(|&d| on_a_device(d))
        .max()
        .map_or(1, |d| d as usize + 1);
    let mut traced: Vec<Vec<(u64, u64, TraceEvent)>> = (0..devices).map(|_| Vec::new()).collect();

    let now_us = dump.time_unix_ms.saturating_mul(1000);
    let time_of = |h: &Holder| -> u64 {
        let age = if h.age_s.is_finite() && h.age_s > 0.0 {
            (h.age_s * 1e6) as u64
        } else {
            0
        };
        now_us.saturating_sub(age)
    };

    let mut cursor = SYNTHETIC_BASE;
    let mut segments = Vec::with_capacity(raw.len());
    for seg in &raw {
        let base = cursor;
        cursor = seg
            .size
            .div_ceil(SEGMENT_ALIGN)
            .max(1)
            .checked_mul(SEGMENT_ALIGN)
            .and_then(|span| cursor.checked_add(span))
            .filter(|&c| c <= MAX_SAFE_INTEGER)
            .ok_or("the dump's segments do not fit the viewer's 53-bit address space")?;
        let stream = stream_rank(seg.stream);
        let mut blocks = Vec::with_capacity(seg.blocks.len());
        let mut offset = 0u64;
        // Every active block's holder, with its seq, decides whether the segment's creation can
        // be replayed: a segment holding a block the trace does not allocate (a holder the dump
        // does not list, a pending free) must exist from the start.
        let all_traced = seg.blocks.iter().all(|b| {
            b.state == "inactive" || (b.state == "active_allocated" && b.holder.is_some())
        });
        let mut first_seq: Option<(u64, u64)> = None;
        for b in &seg.blocks {
            // Inside the segment at the block's real offset; a block outside its segment (a
            // hostile or inconsistent dump) goes where the previous one ended.
            let addr = match (b.real, seg.real) {
                (Some(r), Some(s)) if r >= s && r - s < seg.size => base + (r - s),
                _ => base.saturating_add(offset),
            };
            offset = (addr - base).saturating_add(b.size);
            let frames = match (b.holder, b.state) {
                (Some(h), _) => viz_frames(&h.stack),
                (None, "inactive") => Vec::new(),
                (None, _) => not_in_dump_frames(),
            };
            if let (Some(h), "active_allocated") = (b.holder, b.state) {
                let at = time_of(h);
                first_seq = Some(first_seq.map_or((h.seq, at), |f| f.min((h.seq, at))));
                traced[seg.device as usize].push((
                    h.seq,
                    1,
                    TraceEvent {
                        action: "alloc",
                        addr,
                        size: b.requested,
                        stream,
                        frames: frames.clone(),
                        time_us: at,
                        device_free: None,
                    },
                ));
            }
            blocks.push(Block {
                address: addr,
                size: b.size,
                requested_size: b.requested,
                state: b.state,
                frames,
                oomshim_address: b.real.map(|r| format!("{r:#x}")),
            });
        }
        if let (true, Some((seq, at))) = (all_traced, first_seq) {
            traced[seg.device as usize].push((
                seq,
                0,
                TraceEvent {
                    action: "segment_alloc",
                    addr: base,
                    size: seg.size,
                    stream,
                    frames: seg.frames.clone(),
                    time_us: at,
                    device_free: None,
                },
            ));
        }
        let active = |b: &&Block| b.state != "inactive";
        segments.push(Segment {
            device: seg.device as i64,
            address: base,
            total_size: seg.size,
            allocated_size: blocks
                .iter()
                .filter(|b| b.state == "active_allocated")
                .map(|b| b.size)
                .fold(0, u64::saturating_add),
            active_size: blocks
                .iter()
                .filter(active)
                .map(|b| b.size)
                .fold(0, u64::saturating_add),
            requested_size: blocks
                .iter()
                .filter(active)
                .map(|b| b.requested_size)
                .fold(0, u64::saturating_add),
            stream,
            segment_type: if seg.size <= (2 << 20) {
                "small"
            } else {
                "large"
            },
            segment_pool_id: (0, seg.capture.unwrap_or(0)),
            is_expandable: false,
            frames: seg.frames.clone(),
            blocks,
            oomshim_address: seg.real.map(|r| format!("{r:#x}")),
        });
    }

    let mut device_traces: Vec<Vec<TraceEvent>> = traced
        .into_iter()
        .map(|mut events| {
            events.sort_by_key(|(seq, order, _)| (*seq, *order));
            events.into_iter().map(|(_, _, e)| e).collect()
        })
        .collect();
    if let Some(req) = &dump.failed_request {
        if req.device >= 0 && (req.device as usize) < device_traces.len() {
            let free = dump
                .devices
                .iter()
                .find(|d| d.index == req.device)
                .and_then(|d| d.free_bytes)
                .unwrap_or(0);
            device_traces[req.device as usize].push(TraceEvent {
                action: "oom",
                addr: 0,
                size: req.bytes,
                stream: 0,
                frames: viz_frames(&req.stack),
                time_us: now_us,
                device_free: Some(free),
            });
        }
    }

    let snapshot = Snapshot {
        segments,
        device_traces,
    };
    let bytes = serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new())
        .map_err(|e| e.to_string())?;
    Ok(MemoryViz {
        bytes,
        segments: snapshot.segments.len(),
        warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
    })
}

/// The segments to export: the allocator's real ones where the dump has them, a segment per
/// holder otherwise, and per device a remainder for tracked bytes no listed holder covers.
fn segments_of<'a>(dump: &'a Dump, warnings: &mut Vec<String>) -> Vec<RawSegment<'a>> {
    let fb = &dump.free_blocks;
    let mut out = Vec::new();
    let holders: Vec<&Holder> = dump
        .largest_holders
        .iter()
        .filter(|h| h.device >= 0)
        .collect();
    let map_device = (fb.source == "oomshim-allocator" && !fb.segment_map.is_empty()).then(|| {
        dump.failed_request
            .as_ref()
            .map(|r| r.device)
            .or_else(|| holders.first().map(|h| h.device))
            .unwrap_or(0)
    });
    let mut placed: Vec<bool> = vec![false; holders.len()];
    if let Some(device) = map_device {
        let by_address: HashMap<u64, usize> = holders
            .iter()
            .enumerate()
            .filter(|(_, h)| h.device == device)
            .map(|(i, h)| (parse_hex(&h.address), i))
            .collect();
        let mut unlisted = (0u64, 0u64);
        for seg in &fb.segment_map {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| {
                    let real = parse_hex(&b.address);
                    let state = match b.state.as_str() {
                        "active_allocated" => "active_allocated",
                        "active_pending_free" => "active_pending_free",
                        _ => "inactive",
                    };
                    let holder = (state != "inactive")
                        .then(|| by_address.get(&real).copied())
                        .flatten();
                    if let Some(i) = holder {
                        placed[i] = true;
                    } else if state == "active_allocated" {
                        unlisted.0 += 1;
                        unlisted.1 = unlisted.1.saturating_add(b.requested_bytes);
                    }
                    RawBlock {
                        real: Some(real),
                        size: b.bytes,
                        requested: if state == "inactive" {
                            0
                        } else {
                            b.requested_bytes
                        },
                        state,
                        holder: holder.map(|i| holders[i]),
                    }
                })
                .collect();
            out.push(RawSegment {
                device,
                real: Some(parse_hex(&seg.address)),
                size: seg.bytes,
                stream: parse_hex(&seg.stream),
                capture: seg.capture,
                blocks,
                frames: Vec::new(),
            });
        }
        if unlisted.0 > 0 {
            warnings.push(format!(
                "{} ({}) {} no stack: the dump lists only its largest holders \
                 (raise OOMSHIM_TOP); their frames say so",
                plural(unlisted.0, "allocated block", "allocated blocks"),
                human_bytes(unlisted.1),
                if unlisted.0 == 1 { "has" } else { "have" }
            ));
        }
        if fb.segment_map_omitted > 0 {
            warnings.push(format!(
                "the dump left {} out of its segment map; {} not exported",
                plural(fb.segment_map_omitted, "segment", "segments"),
                if fb.segment_map_omitted == 1 {
                    "it is"
                } else {
                    "they are"
                }
            ));
        }
    }
    // Holders not in a segment map: each is a segment of its own.
    for (i, h) in holders.iter().enumerate() {
        if placed[i] {
            continue;
        }
        let frames = viz_frames(&h.stack);
        out.push(RawSegment {
            device: h.device,
            real: Some(parse_hex(&h.address)),
            size: h.bytes,
            stream: h.stream.as_deref().map(parse_hex).unwrap_or(0),
            capture: None,
            blocks: vec![RawBlock {
                real: Some(parse_hex(&h.address)),
                size: h.bytes,
                requested: h.bytes,
                state: "active_allocated",
                holder: Some(h),
            }],
            frames,
        });
    }
    // What the listed holders leave of each device's tracked bytes (a segment map already covers
    // its device).
    for d in &dump.devices {
        if d.index < 0 || Some(d.index) == map_device {
            continue;
        }
        let listed: Vec<&&Holder> = holders.iter().filter(|h| h.device == d.index).collect();
        let bytes: u64 = listed.iter().map(|h| h.bytes).fold(0, u64::saturating_add);
        let rest = d.tracked_bytes.saturating_sub(bytes);
        if rest == 0 {
            continue;
        }
        let count = d.tracked_count.saturating_sub(listed.len() as u64);
        warnings.push(format!(
            "device {}: the dump lists {} of {} ({} of {}); the other {} are one \
             segment named \"{NOT_IN_DUMP}\"",
            d.index,
            listed.len(),
            plural(d.tracked_count, "allocation", "allocations"),
            human_bytes(bytes),
            human_bytes(d.tracked_bytes),
            human_bytes(rest)
        ));
        out.push(RawSegment {
            device: d.index,
            real: None,
            size: rest,
            stream: 0,
            capture: None,
            blocks: vec![RawBlock {
                real: None,
                size: rest,
                requested: rest,
                state: "active_allocated",
                holder: None,
            }],
            frames: vec![VizFrame {
                filename: "oomshim".to_string(),
                line: 0,
                name: format!(
                    "{NOT_IN_DUMP} ({})",
                    plural(count, "allocation", "allocations")
                ),
            }],
        });
    }
    out
}

/// Folded stacks, with what to tell the user.
pub struct Folded {
    pub text: String,
    pub lines: usize,
    pub warning: Option<String>,
}

/// Name of the line that carries the tracked bytes the dump's sites do not cover.
pub const FOLDED_REST: &str = "[allocations not in the dump's sites: raise OOMSHIM_TOP]";

/// The dump's sites as folded stacks: one line per distinct stack, `outer;…;inner bytes`, the
/// outermost caller first and the allocating frame last; the shim's own frames are left out.
/// Frames are `function (file:line)`; an unnamed frame is its address. Bytes the sites do not
/// cover (the dump keeps the largest sites only) are one line of their own, and a warning.
pub fn folded(dump: &Dump) -> Folded {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut covered = 0u64;
    for site in &dump.sites {
        covered = covered.saturating_add(site.bytes);
        let frames: Vec<String> = site
            .stack
            .iter()
            .rev()
            .filter(|f| {
                let module = f.module.as_deref().unwrap_or("");
                !module
                    .rsplit('/')
                    .next()
                    .unwrap_or("")
                    .starts_with("liboomshim")
            })
            .map(folded_frame)
            .collect();
        let key = if frames.is_empty() {
            "[no stack]".to_string()
        } else {
            frames.join(";")
        };
        match lines.get_mut(&key) {
            Some(b) => *b = b.saturating_add(site.bytes),
            None => {
                lines.insert(key.clone(), site.bytes);
                order.push(key);
            }
        }
    }
    let tracked: u64 = dump
        .devices
        .iter()
        .map(|d| d.tracked_bytes)
        .fold(0, u64::saturating_add);
    let rest = tracked.saturating_sub(covered);
    let mut warning = None;
    if rest > 0 {
        warning =
            Some(format!(
            "the dump's {} {} {} of {} tracked; the other {} are one stack named \"{FOLDED_REST}\"",
            plural(dump.sites.len() as u64, "site", "sites"),
            if dump.sites.len() == 1 { "covers" } else { "cover" },
            human_bytes(covered),
            human_bytes(tracked),
            human_bytes(rest)
        ));
        lines.insert(FOLDED_REST.to_string(), rest);
        order.push(FOLDED_REST.to_string());
    }
    let mut text = String::new();
    for key in &order {
        text.push_str(&format!("{key} {}\n", lines[key]));
    }
    Folded {
        text,
        lines: order.len(),
        warning,
    }
}

/// One frame of a folded line: `;` separates frames and the last space the count, so neither a
/// `;` nor a line break may appear inside (control characters are escaped by `clean`).
fn folded_frame(f: &Frame) -> String {
    let label = if f.function.as_deref().is_some_and(|n| !n.trim().is_empty()) {
        dump::view::frame_label(f, usize::MAX)
    } else {
        match f.module.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!(
                "{} [{}]",
                dump::units::clean(&f.address),
                dump::units::clean(m.rsplit('/').next().unwrap_or(m))
            ),
            None => dump::units::clean(&f.address),
        }
    };
    label.replace(';', ":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dump::model::{SegmentBlock, SegmentEntry};
    use dump::read::parse_dump;
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
            .find(|s| {
                string(key(s, "oomshim_address")) == format!("{:#x}", parse_hex(&top.address))
            })
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
}
