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
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
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

pub fn parse_hex(s: &str) -> u64 {
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
pub fn folded_frame(f: &Frame) -> String {
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
