//! Turning a captured ledger state into a [`Dump`]: largest holders, sites, devices, process
//! identity, symbolised stacks and the verdict.
//!
//! [`assemble`] is a pure function of what it is handed: the capture (ledger snapshot and
//! [`FailureContext`]), the [`Observed`] facts its caller read about the machine, the process
//! and the shim, the configuration, and [`Lookups`], the four questions about stacks and
//! threads that only the live process can answer. It reads no file, no environment variable
//! and no global, and asks neither CUDA nor the hooks: the same inputs give the same dump, and
//! two failures assembled in either order, on any thread, each describe their own moment. The
//! reading happens in `gather.rs`.

use crate::cuda::context::FailureContext;
use dump::model::*;
use dump::time::unix_ms;
use oomshim_core::config::{Config, StackMode};
use oomshim_host::ledger::{Allocation, Api, Snapshot, StackId};
use oomshim_host::pystack::PyFrame;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// The state at the moment a dump describes.
pub(crate) struct Capture {
    pub snapshot: Snapshot,
    pub time: SystemTime,
    /// Shim clock at capture, for allocation ages.
    pub now_ns: u64,
    pub failing: Option<Failing>,
    /// What the device and CUDA said at that moment, gathered where it happened.
    pub context: FailureContext,
    /// The growth history as it was at that moment (a failure's: taken on the failing thread);
    /// `None`: the history as it is when the dump is assembled.
    pub growth: Option<crate::record::growth::Frozen>,
}

pub(crate) struct Failing {
    pub api: Api,
    pub bytes: u64,
    pub device: i32,
    pub error_code: i32,
    pub stack: StackId,
    pub py_stack: StackId,
}

pub(crate) struct BurstInfo {
    pub failures: u32,
    pub resolution: super::event::Resolution,
    pub last: LastFailure,
    /// Failures before this one that got no dump (repeats, over the cap).
    pub repeats: u64,
    pub suppressed: u64,
    /// Requests that recovered just before this one failed, told in its dump.
    pub recovered_before: u32,
}

/// What is read outside CUDA about a failure, as soon after it as possible (the writer reads it
/// when the failure reaches it, not when the dump is finally written): NVML's processes on the
/// device, and host memory; and the GPU UUIDs the process has learnt, read when the dump is
/// assembled. Read by `Facts::read` (gather.rs).
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    pub gpu_processes: Option<GpuProcesses>,
    pub host: dump::model::HostMemory,
    /// (device, UUID) of every device whose UUID the process asked so far: the identities of
    /// devices other than the context's own.
    pub device_uuids: Vec<(i32, String)>,
}

/// The process as a dump describes it, read when the dump is assembled
/// (`ProcessSnapshot::read`, gather.rs).
#[derive(Debug, Clone)]
pub(crate) struct ProcessSnapshot {
    /// Pid, host name, command line, rank and job.
    pub process: ProcessInfo,
    /// The text of `/proc/self/maps`: the libraries the device memory is attributed to, and the
    /// frameworks loaded.
    pub maps: String,
    /// The version of the torch package a mapped torch library belongs to (its `version.py`).
    pub torch_version: Option<String>,
    /// The allowlisted environment variables that are set (src/core/facts/env.rs), values cut.
    pub env: BTreeMap<String, String>,
    /// `CPython 3.11` when Python stacks can be read.
    pub python: Option<String>,
}

/// The shim's own state that a dump reports, read when the dump is assembled
/// (`RecorderState::read`, gather.rs).
#[derive(Debug, Clone)]
pub(crate) struct RecorderState {
    /// The stack mode now, not at start: a benchmark may have switched it.
    pub stacks: StackMode,
    /// Failed device allocations so far.
    pub oom_failures: u64,
    /// The growth tracker's analysis, its stacks named through the same [`Lookups`].
    pub growth: Option<Growth>,
    pub request_sizes: Option<RequestSizes>,
}

/// Everything a dump's caller read outside the ledger and CUDA, handed to [`assemble`] whole.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub facts: Facts,
    pub process: ProcessSnapshot,
    pub recorder: RecorderState,
}

/// What only the live process can say about the stacks and threads a dump names. Asked only
/// for what the dump shows (its holders, sites and failing request, each distinct one once),
/// so the caller need not name every stack the ledger holds; a test answers from a table.
pub(crate) trait Lookups {
    /// The return addresses of an interned native stack, innermost first.
    fn native_stack(&self, id: StackId) -> Vec<usize>;
    /// The frames of each address, in order (inlined frames first), in one batch.
    fn symbolize(&self, addrs: &[usize]) -> Vec<Vec<Frame>>;
    /// The resolved frames of an interned Python stack, innermost first.
    fn python_stack(&self, id: StackId) -> Vec<PyFrame>;
    /// A thread's name, by kernel thread id.
    fn thread_name(&self, tid: u64) -> Option<String>;
}

pub(crate) fn assemble(
    config: &Config,
    reason: &str,
    cap: &Capture,
    burst: Option<BurstInfo>,
    framework: Option<&super::event::FrameworkNote>,
    observed: Observed,
    lookups: &dyn Lookups,
) -> Dump {
    let Observed {
        facts,
        process,
        recorder,
    } = observed;
    let top = config.top;
    let ctx = &cap.context;
    let uuid_of = |device: i32| {
        facts
            .device_uuids
            .iter()
            .find(|(d, _)| *d == device)
            .map(|(_, u)| u.clone())
    };
    // The ledger's pass kept the largest device holders and summed every site (a site is
    // one (native stack, Python stack) pair).
    let mut holders: Vec<&(usize, Allocation)> = cap.snapshot.holders.iter().collect();
    holders.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.1.seq.cmp(&b.1.seq)));
    holders.truncate(top);

    let mut sites: Vec<(StackKey, u64, u64)> = cap.snapshot.sites.clone();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    sites.truncate(top);

    let mut keys: Vec<StackKey> = holders.iter().map(|(_, a)| (a.stack, a.py_stack)).collect();
    keys.extend(sites.iter().map(|s| s.0));
    keys.extend(cap.failing.as_ref().map(|f| (f.stack, f.py_stack)));
    keys.sort();
    keys.dedup();
    let stacks = symbolize_stacks(lookups, config.stacks.native(), &keys);
    let stack_of = |k: StackKey| -> (Vec<Frame>, Option<StackMerge>) {
        stacks.get(&k).cloned().unwrap_or_default()
    };
    let mut merge_counts = MergeCounts::default();
    for (_, m) in stacks.values() {
        match m {
            Some(StackMerge::EvalFrames) => merge_counts.eval_frames += 1,
            Some(StackMerge::Outer) => merge_counts.outer += 1,
            Some(StackMerge::PythonOnly) => merge_counts.python_only += 1,
            None => {}
        }
    }

    // Thread names, asked once per distinct thread.
    let mut thread_names: FxHashMap<u64, Option<String>> = FxHashMap::default();
    for (_, a) in &holders {
        thread_names
            .entry(a.thread)
            .or_insert_with(|| lookups.thread_name(a.thread));
    }
    let largest_holders = holders
        .iter()
        .map(|(addr, a)| {
            let (stack, stack_merge) = stack_of((a.stack, a.py_stack));
            Holder {
                bytes: a.bytes,
                address: format!("{addr:#x}"),
                api: a.api.name().to_string(),
                device: a.device,
                stream: has_stream(a.api).then(|| format!("{:#x}", a.stream)),
                thread: a.thread,
                thread_name: thread_names.get(&a.thread).cloned().flatten(),
                age_s: cap.now_ns.saturating_sub(a.time_ns) as f64 / 1e9,
                seq: a.seq,
                stack,
                stack_merge,
            }
        })
        .collect();
    let sites = sites
        .iter()
        .map(|&(key, bytes, count)| Site {
            bytes,
            count,
            stack: stack_of(key).0,
        })
        .collect();

    let mut devices: Vec<DeviceInfo> = cap
        .snapshot
        .devices
        .iter()
        .map(|&(index, t)| DeviceInfo {
            index,
            name: None,
            total_bytes: None,
            free_bytes: None,
            tracked_bytes: t.bytes,
            tracked_count: t.count,
            peak_tracked_bytes: t.peak_bytes,
            uuid: uuid_of(index),
            memory_cap: None,
        })
        .collect();
    if let Some(d) = ctx.device {
        let info = match devices.iter_mut().find(|x| x.index == d) {
            Some(x) => x,
            None => {
                devices.push(DeviceInfo {
                    index: d,
                    name: None,
                    total_bytes: None,
                    free_bytes: None,
                    tracked_bytes: 0,
                    tracked_count: 0,
                    peak_tracked_bytes: 0,
                    uuid: None,
                    memory_cap: None,
                });
                devices.last_mut().expect("just pushed")
            }
        };
        info.name = ctx.device_name.clone();
        info.free_bytes = ctx.mem_info.map(|m| m.0);
        info.total_bytes = ctx.mem_info.map(|m| m.1);
        info.memory_cap = ctx.memory_cap.clone();
        info.uuid = ctx.device_uuid.clone().or_else(|| uuid_of(d));
    }
    devices.sort_by_key(|d| d.index);

    let burst = burst.as_ref();
    let failed_request = cap.failing.as_ref().map(|f| {
        let (stack, stack_merge) = stack_of((f.stack, f.py_stack));
        FailedRequest {
            bytes: f.bytes,
            api: f.api.name().to_string(),
            device: f.device,
            error_code: f.error_code,
            stack,
            stack_merge,
            failures_in_burst: burst.map_or(1, |b| b.failures),
            recovered: burst.and_then(|b| b.resolution.recovered()),
            resolution: burst.map(|b| b.resolution.word().to_string()),
            last_failure: burst.map(|b| b.last.clone()),
            recovered_before: burst.map_or(0, |b| b.recovered_before),
        }
    });
    let free_blocks = framework
        .and_then(|f| f.free_blocks.clone())
        .or_else(|| ctx.free_blocks.clone())
        .unwrap_or_else(|| FreeBlocks {
            source: "unavailable".to_string(),
            reason: Some(
                "under LD_PRELOAD the shim sees the framework's segments, not the free blocks inside them; \
                 PyTorch's own view comes through oomshim's Python hook when torch raises OutOfMemoryError"
                    .to_string(),
            ),
            total_free_bytes: None,
            largest_free_bytes: None,
            fragmentation: None,
            histogram: Vec::new(),
            ..Default::default()
        });
    let maps = process.maps;
    let mut dump = Dump {
        schema: SCHEMA.to_string(),
        reason: reason.to_string(),
        time: dump::time::rfc3339(cap.time),
        time_unix_ms: unix_ms(cap.time),
        process: process.process,
        failed_request,
        devices,
        pinned_host: PinnedHost {
            bytes: cap.snapshot.pinned_host.bytes,
            count: cap.snapshot.pinned_host.count,
            peak_bytes: cap.snapshot.pinned_host.peak_bytes,
        },
        largest_holders,
        sites,
        free_blocks,
        verdict: Verdict::default(),
        recording: Recording {
            version: env!("CARGO_PKG_VERSION").to_string(),
            stacks: recorder.stacks.as_str().to_string(),
            python: process.python,
            python_merge: (merge_counts != MergeCounts::default()).then_some(merge_counts),
            depth: config.depth as u32,
            unknown_frees: cap.snapshot.unknown_frees,
            live_allocations: cap.snapshot.live_allocations,
            total_allocations: cap.snapshot.total_allocations,
            oom_failures: recorder.oom_failures,
            repeated_failures: burst.map_or(0, |b| b.repeats),
            suppressed_dumps: burst.map_or(0, |b| b.suppressed),
        },
        // Pools and VMM state taken on the failing (or calling) thread.
        pools: ctx.pools.clone(),
        vmm: ctx.vmm.clone(),
        host: Some(facts.host),
        gpu_processes: facts.gpu_processes,
        growth: recorder.growth,
        config: Some(ConfigSnapshot {
            env: process.env,
            cuda_driver_version: ctx.driver_version,
            cuda_runtime_version: ctx.runtime_version,
            torch_version: process.torch_version.or_else(|| {
                framework.and_then(|f| {
                    (f.account.name == "torch")
                        .then(|| f.account.version.clone())
                        .flatten()
                })
            }),
            frameworks: oomshim_core::facts::env::frameworks_in(&maps),
        }),
        request_sizes: recorder.request_sizes,
        framework: framework.map(|f| f.account.clone()),
        library_memory: None,
        post_mortem: None,
    };
    dump.library_memory = library_memory(
        lookups,
        config.stacks.native(),
        &cap.snapshot.by_stack,
        &maps,
        ctx.device,
        &dump,
    );
    dump.verdict = oomshim_core::verdict::judge(&dump);
    dump
}

/// A native stack id and a Python stack id: what one allocation's stack is.
pub(crate) type StackKey = (StackId, StackId);

/// The frames of each of `keys`: its native stack symbolised (all of them in one batch), its
/// Python stack resolved, and the two merged. `native_captured`: whether the recording mode
/// captures native stacks at all (an empty one then means no Python-only merge).
pub(crate) fn symbolize_stacks(
    lookups: &dyn Lookups,
    native_captured: bool,
    keys: &[StackKey],
) -> FxHashMap<StackKey, (Vec<Frame>, Option<StackMerge>)> {
    let mut native_ids: Vec<StackId> = keys.iter().map(|k| k.0).collect();
    native_ids.sort();
    native_ids.dedup();
    let raw: FxHashMap<StackId, Vec<usize>> = native_ids
        .iter()
        .map(|&id| (id, lookups.native_stack(id)))
        .collect();
    let mut addrs: Vec<usize> = raw.values().flatten().copied().collect();
    addrs.sort_unstable();
    addrs.dedup();
    let symbols: FxHashMap<usize, Vec<Frame>> = if addrs.is_empty() {
        FxHashMap::default()
    } else {
        addrs
            .iter()
            .copied()
            .zip(lookups.symbolize(&addrs))
            .collect()
    };
    let frames_of = |id: StackId| -> Vec<Frame> {
        raw.get(&id)
            .map(|pcs| {
                pcs.iter()
                    .flat_map(|pc| {
                        symbols.get(pc).cloned().unwrap_or_else(|| {
                            vec![Frame {
                                address: format!("{pc:#x}"),
                                ..Frame::default()
                            }]
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    keys.iter()
        .map(|&(native, python)| {
            let py = lookups.python_stack(python);
            (
                (native, python),
                merge_stacks(frames_of(native), &py, native_captured),
            )
        })
        .collect()
}

/// The native frame that runs a group of Python frames.
const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// Merges a Python stack into a native one (both innermost first): each group of Python frames
/// that one native eval-loop call ran replaces that call's `_PyEval_EvalFrameDefault` frame,
/// innermost group at the innermost eval frame; groups left over when the native stack shows
/// fewer eval frames (cut by the depth limit) all go at the outermost one. Without any eval frame
/// the Python frames follow the native ones (they are the callers of everything captured).
pub(crate) fn merge_stacks(
    native: Vec<Frame>,
    python: &[oomshim_host::pystack::PyFrame],
    native_captured: bool,
) -> (Vec<Frame>, Option<StackMerge>) {
    if python.is_empty() {
        return (native, None);
    }
    let py_frame = |p: &oomshim_host::pystack::PyFrame| Frame {
        address: format!("{:#x}", p.code),
        function: Some(p.function.clone()),
        file: Some(p.file.clone()),
        line: p.line,
        module: None,
        inlined: false,
        kind: FrameKind::Python,
    };
    // Groups of Python frames, innermost first; each ends at its eval call's outermost frame.
    let mut groups: Vec<Vec<Frame>> = vec![Vec::new()];
    for p in python {
        groups.last_mut().expect("one group").push(py_frame(p));
        if p.group_end {
            groups.push(Vec::new());
        }
    }
    groups.retain(|g| !g.is_empty());
    if !native_captured && native.is_empty() {
        return (groups.concat(), Some(StackMerge::PythonOnly));
    }
    let is_eval = |f: &Frame| f.function.as_deref() == Some(EVAL_FRAME);
    let evals = native.iter().filter(|f| is_eval(f)).count();
    if evals == 0 {
        let mut out = native;
        out.extend(groups.concat());
        return (out, Some(StackMerge::Outer));
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut groups = groups.into_iter();
    let mut seen = 0;
    for f in native {
        if !is_eval(&f) {
            out.push(f);
            continue;
        }
        seen += 1;
        let before = out.len();
        if seen < evals {
            if let Some(g) = groups.next() {
                out.extend(g);
            }
        } else {
            out.extend(groups.by_ref().flatten());
        }
        if out.len() == before {
            out.push(f); // no Python frames left for this eval frame: keep it
        }
    }
    (out, Some(StackMerge::EvalFrames))
}

fn has_stream(api: Api) -> bool {
    api.has_stream() // runtime and driver stream-ordered APIs (src/host/ledger.rs)
}

/// Live device memory by library (from every live allocation's interned stack, looked at once
/// per distinct stack) and the split of what the tracked allocations do not explain.
fn library_memory(
    lookups: &dyn Lookups,
    native: bool,
    by_stack: &[((i32, Api, StackId), u64, u64)],
    maps: &str,
    device: Option<i32>,
    dump: &Dump,
) -> Option<LibraryMemory> {
    use oomshim_core::facts::libraries;
    let mut libs = if native {
        let allocs: Vec<libraries::LiveAlloc<StackId>> = by_stack
            .iter()
            .map(
                |&((device, api, stack), bytes, count)| libraries::LiveAlloc {
                    device,
                    bytes,
                    count,
                    api: api.name(),
                    stack,
                },
            )
            .collect();
        libraries::attribute(&libraries::LibraryMap::parse(maps), &allocs, |id| {
            lookups.native_stack(id)
        })
    } else {
        Vec::new()
    };
    libraries::add_graph_pools(
        &mut libs,
        device.unwrap_or(0),
        &dump.free_blocks.segment_map,
    );
    let untracked = libraries::untracked_split(&dump.devices, dump.gpu_processes.as_ref());
    (!libs.is_empty() || !untracked.is_empty()).then(|| LibraryMemory {
        source: if native {
            "stack_modules"
        } else {
            "no_native_stacks"
        }
        .to_string(),
        libraries: libs,
        untracked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str) -> Frame {
        Frame {
            address: "0x1".into(),
            function: Some(name.into()),
            ..Frame::default()
        }
    }

    fn py(name: &str, group_end: bool) -> oomshim_host::pystack::PyFrame {
        oomshim_host::pystack::PyFrame {
            function: name.into(),
            file: "train.py".into(),
            line: Some(7),
            code: 0x10,
            group_end,
        }
    }

    fn names(frames: &[Frame]) -> Vec<String> {
        frames
            .iter()
            .map(|f| {
                let n = f.function.clone().unwrap_or_default();
                if f.kind == FrameKind::Python {
                    format!("py:{n}")
                } else {
                    n
                }
            })
            .collect()
    }

    #[test]
    fn python_groups_replace_their_eval_frames() {
        let stack = vec![
            native("simcall_alloc"),
            native("_PyEval_EvalFrameDefault"),
            native("PyObject_Call"),
            native("_PyEval_EvalFrameDefault"),
            native("main"),
        ];
        let python = [py("forward", false), py("step", true), py("<module>", true)];
        let (merged, how) = merge_stacks(stack.clone(), &python, true);
        assert_eq!(how, Some(StackMerge::EvalFrames));
        assert_eq!(
            names(&merged),
            [
                "simcall_alloc",
                "py:forward",
                "py:step",
                "PyObject_Call",
                "py:<module>",
                "main"
            ]
        );
        // More groups than eval frames (a truncated native stack): the rest at the outermost.
        let (merged, _) = merge_stacks(stack[..2].to_vec(), &python, true);
        assert_eq!(
            names(&merged),
            ["simcall_alloc", "py:forward", "py:step", "py:<module>"]
        );
        // No eval frame: Python frames are the callers of everything native.
        let (merged, how) = merge_stacks(vec![native("simcall_alloc")], &python, true);
        assert_eq!(how, Some(StackMerge::Outer));
        assert_eq!(
            names(&merged),
            ["simcall_alloc", "py:forward", "py:step", "py:<module>"]
        );
        // Python only; and no Python frames leaves the native stack untouched.
        let (merged, how) = merge_stacks(vec![], &python, false);
        assert_eq!(how, Some(StackMerge::PythonOnly));
        assert_eq!(merged.len(), 3);
        assert_eq!(merge_stacks(stack.clone(), &[], true), (stack, None));
    }
}

/// Assembly is a function of what it is handed: every input below is built by hand, without a
/// `Shim`, /proc or any global, and the dump says exactly what they say.
#[cfg(test)]
mod pure_tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// Native stack 1 runs through NCCL and an eval frame (Python stack 7 fills it in); native
    /// stack 2 is the program's own; the failing request came from stack 2.
    const NCCL_PC: usize = 0x7f00_0000_1000;
    const EVAL_PC: usize = 0x5500_0000_2000;
    const MAIN_PC: usize = 0x5500_0000_3000;
    const MAPS: &str = "7f0000000000-7f0000100000 r-xp 00000000 08:01 11 /opt/nvidia/nccl/lib/libnccl.so.2.21.5\n\
                        550000000000-550000100000 r-xp 00000000 08:01 12 /usr/bin/python3.12\n\
                        7f1000000000-7f1000100000 r-xp 00000000 08:01 13 /venv/site-packages/torch/lib/libc10_cuda.so\n";

    /// Answers from fixed tables, as the live stack tables would.
    struct Table;

    impl Lookups for Table {
        fn native_stack(&self, id: StackId) -> Vec<usize> {
            match id.0 {
                1 => vec![NCCL_PC, EVAL_PC],
                2 => vec![MAIN_PC],
                _ => Vec::new(),
            }
        }

        fn symbolize(&self, addrs: &[usize]) -> Vec<Vec<Frame>> {
            addrs
                .iter()
                .map(|&pc| {
                    let name = match pc {
                        NCCL_PC => "ncclMemAlloc",
                        EVAL_PC => EVAL_FRAME,
                        _ => "main",
                    };
                    vec![Frame {
                        address: format!("{pc:#x}"),
                        function: Some(name.into()),
                        ..Frame::default()
                    }]
                })
                .collect()
        }

        fn python_stack(&self, id: StackId) -> Vec<PyFrame> {
            if id.0 != 7 {
                return Vec::new();
            }
            vec![PyFrame {
                function: "all_reduce".into(),
                file: "train.py".into(),
                line: Some(42),
                code: 0x10,
                group_end: true,
            }]
        }

        fn thread_name(&self, tid: u64) -> Option<String> {
            (tid == 11).then(|| "pt_main_thread".into())
        }
    }

    fn alloc(bytes: u64, device: i32, thread: u64, seq: u64, stack: u32, py: u32) -> Allocation {
        Allocation {
            bytes,
            api: Api::CudaMalloc,
            device,
            stream: 0,
            thread,
            time_ns: 1_000_000_000,
            seq,
            stack: StackId(stack),
            py_stack: StackId(py),
        }
    }

    fn totals(bytes: u64, count: u64) -> oomshim_host::ledger::Totals {
        oomshim_host::ledger::Totals {
            bytes,
            count,
            peak_bytes: bytes,
        }
    }

    /// A ledger state with 3 GiB on device 0 (two holders through NCCL from Python, one of the
    /// program's own) and 5 GiB on device 1.
    fn snapshot() -> Snapshot {
        Snapshot {
            devices: vec![(0, totals(3 * GIB, 3)), (1, totals(5 * GIB, 1))],
            pinned_host: totals(0, 0),
            unknown_frees: 0,
            total_allocations: 4,
            ..Snapshot::of_allocations(
                [
                    (0x7e00_0000_0000, alloc(2 * GIB, 0, 11, 1, 1, 7)),
                    (0x7e00_8000_0000, alloc(GIB / 2, 0, 11, 2, 1, 7)),
                    (0x7e00_c000_0000, alloc(GIB / 2, 0, 12, 3, 2, 0)),
                    (0x7f00_0000_0000, alloc(5 * GIB, 1, 12, 4, 2, 0)),
                ],
                usize::MAX,
            )
        }
    }

    /// What a failure on `device` learnt there: every answer tells the device apart.
    fn context_of(device: i32) -> FailureContext {
        let n = device as u64 + 1;
        FailureContext {
            device: Some(device),
            mem_info: Some((n * 100 * MIB, 80 * GIB)),
            device_name: Some(format!("gpu {device}")),
            device_uuid: Some(format!("GPU-{device:08x}")),
            driver_version: Some(13000 + device),
            runtime_version: Some(12000 + device),
            pools: vec![PoolInfo {
                device,
                pool: format!("{:#x}", 0x4d00 + device),
                reserved_bytes: n * GIB,
                used_bytes: 0,
                cached_bytes: n * GIB,
            }],
            vmm: Some(VmmInfo {
                reserved_ranges: n,
                reserved_bytes: n * GIB,
                ..VmmInfo::default()
            }),
            free_blocks: Some(FreeBlocks {
                source: "oomshim-allocator".into(),
                total_free_bytes: Some(n * 10 * MIB),
                largest_free_bytes: Some(n * MIB),
                ..FreeBlocks::default()
            }),
            memory_cap: None,
        }
    }

    fn failure_on(device: i32) -> Capture {
        Capture {
            snapshot: snapshot(),
            time: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            now_ns: 3_500_000_000,
            failing: Some(Failing {
                api: Api::CudaMalloc,
                bytes: GIB,
                device,
                error_code: 2,
                stack: StackId(2),
                py_stack: StackId::EMPTY,
            }),
            context: context_of(device),
            growth: None,
        }
    }

    fn observed() -> Observed {
        Observed {
            facts: Facts {
                gpu_processes: None,
                host: Default::default(),
                device_uuids: vec![(0, "GPU-known-0".into()), (1, "GPU-known-1".into())],
            },
            process: ProcessSnapshot {
                process: ProcessInfo {
                    pid: 4242,
                    host: "node-7".into(),
                    command_line: vec!["python".into(), "train.py".into()],
                    rank: Some(3),
                    local_rank: Some(1),
                    world_size: Some(8),
                    launcher: Some("torchrun".into()),
                    job_id: None,
                    kubernetes: None,
                },
                maps: MAPS.into(),
                torch_version: Some("2.11.0+cu130".into()),
                env: [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                python: Some("CPython 3.12".into()),
            },
            recorder: RecorderState {
                stacks: StackMode::All,
                oom_failures: 2,
                growth: None,
                request_sizes: None,
            },
        }
    }

    fn dump_of(cap: &Capture) -> Dump {
        let config = Config::default();
        assemble(&config, "oom", cap, None, None, observed(), &Table)
    }

    #[test]
    fn a_dump_is_assembled_from_hand_built_inputs_alone() {
        let d = dump_of(&failure_on(0));
        assert_eq!((d.schema.as_str(), d.reason.as_str()), (SCHEMA, "oom"));
        assert_eq!(d.time, "2027-01-15T08:00:00.000Z");
        assert_eq!(d.time_unix_ms, 1_800_000_000_000);
        assert_eq!(d.process, observed().process.process);

        // Holders largest first, their stacks symbolised and merged with Python, their thread
        // names asked of the lookups.
        let holders: Vec<(u64, &str, Option<&str>)> = d
            .largest_holders
            .iter()
            .map(|h| (h.bytes, h.address.as_str(), h.thread_name.as_deref()))
            .collect();
        assert_eq!(
            holders,
            [
                (5 * GIB, "0x7f0000000000", None),
                (2 * GIB, "0x7e0000000000", Some("pt_main_thread")),
                (GIB / 2, "0x7e0080000000", Some("pt_main_thread")),
                (GIB / 2, "0x7e00c0000000", None),
            ]
        );
        assert_eq!(d.largest_holders[1].age_s, 2.5);
        let names = |stack: &[Frame]| -> Vec<String> {
            stack
                .iter()
                .map(|f| f.function.clone().unwrap_or_default())
                .collect()
        };
        assert_eq!(
            names(&d.largest_holders[1].stack),
            ["ncclMemAlloc", "all_reduce"]
        );
        assert_eq!(
            d.largest_holders[1].stack_merge,
            Some(StackMerge::EvalFrames)
        );
        assert_eq!(d.largest_holders[1].stack[1].kind, FrameKind::Python);
        let sites: Vec<(u64, u64)> = d.sites.iter().map(|s| (s.bytes, s.count)).collect();
        assert_eq!(sites, [(5 * GIB + GIB / 2, 2), (2 * GIB + GIB / 2, 2)]);
        let failed = d.failed_request.as_ref().unwrap();
        assert_eq!((failed.bytes, failed.failures_in_burst), (GIB, 1));
        assert_eq!(names(&failed.stack), ["main"]);

        // The recording, the configuration and the library split: the observed values.
        let r = &d.recording;
        assert_eq!(r.stacks, "all");
        assert_eq!(r.python.as_deref(), Some("CPython 3.12"));
        assert_eq!(r.oom_failures, 2);
        assert_eq!((r.live_allocations, r.total_allocations), (4, 4));
        assert_eq!(
            r.python_merge,
            Some(MergeCounts {
                eval_frames: 1,
                ..MergeCounts::default()
            })
        );
        let config = d.config.as_ref().unwrap();
        assert_eq!(
            config.env["PYTORCH_CUDA_ALLOC_CONF"],
            "expandable_segments:True"
        );
        assert_eq!(config.torch_version.as_deref(), Some("2.11.0+cu130"));
        assert_eq!(config.frameworks, ["torch"]);
        let libs = &d.library_memory.as_ref().unwrap().libraries;
        assert_eq!(
            (libs[0].library.as_str(), libs[0].device, libs[0].bytes),
            ("nccl", 0, 2 * GIB + GIB / 2)
        );
        // The verdict is judged from the assembled numbers: of what is in use on the failing
        // device, all but its 3 GiB tracked is someone else's or untracked.
        let dev = &d.devices[0];
        assert_eq!(
            (dev.tracked_bytes, dev.free_bytes),
            (3 * GIB, Some(100 << 20))
        );
        assert_eq!(d.verdict.kind, "untracked_memory", "{:#?}", d.verdict);
        assert_eq!(
            d.verdict.findings[0].bytes,
            dev.total_bytes.unwrap() - dev.free_bytes.unwrap() - dev.tracked_bytes
        );
    }

    #[test]
    fn the_same_inputs_give_byte_identical_json() {
        let cap = failure_on(0);
        let first = serde_json::to_vec_pretty(&dump_of(&cap)).unwrap();
        // Another failure assembled in between changes nothing of it.
        let _ = dump_of(&failure_on(1));
        let again = serde_json::to_vec_pretty(&dump_of(&failure_on(0))).unwrap();
        assert_eq!(first, again);
    }

    #[test]
    fn each_failure_is_assembled_from_its_own_context() {
        let (cap0, cap1) = (failure_on(0), failure_on(1));
        // Device 1's failure assembled first: nothing of it may reach device 0's dump.
        let d1 = dump_of(&cap1);
        let d0 = dump_of(&cap0);
        for (device, d) in [(0, &d0), (1, &d1)] {
            let ctx = context_of(device);
            let other = 1 - device;
            assert_eq!(d.failed_request.as_ref().unwrap().device, device);
            assert_eq!(d.pools, ctx.pools, "device {device}");
            assert_eq!(d.vmm, ctx.vmm, "device {device}");
            assert_eq!(
                d.free_blocks.total_free_bytes,
                ctx.free_blocks.as_ref().unwrap().total_free_bytes
            );
            assert_eq!(d.free_blocks.source, "oomshim-allocator");
            let config = d.config.as_ref().unwrap();
            assert_eq!(
                (config.cuda_driver_version, config.cuda_runtime_version),
                (ctx.driver_version, ctx.runtime_version)
            );
            let own = d.devices.iter().find(|x| x.index == device).unwrap();
            assert_eq!(own.name, ctx.device_name);
            assert_eq!(own.uuid, ctx.device_uuid);
            assert_eq!(
                (own.free_bytes, own.total_bytes),
                (Some(ctx.mem_info.unwrap().0), Some(ctx.mem_info.unwrap().1))
            );
            // The other device: the ledger's figures and its known identity, no answers of the
            // other failure.
            let theirs = d.devices.iter().find(|x| x.index == other).unwrap();
            assert_eq!((theirs.name.as_ref(), theirs.free_bytes), (None, None));
            assert_eq!(
                theirs.uuid.as_deref(),
                Some(["GPU-known-0", "GPU-known-1"][other as usize])
            );
            assert_eq!(theirs.tracked_bytes, [3 * GIB, 5 * GIB][other as usize]);
        }
        // The same inputs give the same dump, whatever was assembled in between.
        let again = dump_of(&cap0);
        assert_eq!(
            serde_json::to_string(&again).unwrap(),
            serde_json::to_string(&d0).unwrap()
        );
    }

    #[test]
    fn a_dump_without_a_device_says_nothing_of_one() {
        let cap = Capture {
            failing: None,
            context: FailureContext::default(),
            ..failure_on(0)
        };
        let d = assemble(
            &Config::default(),
            "interval",
            &cap,
            None,
            None,
            observed(),
            &Table,
        );
        assert!(d.pools.is_empty() && d.vmm.is_none());
        assert_eq!(d.free_blocks.source, "unavailable");
        assert!(d
            .devices
            .iter()
            .all(|x| x.name.is_none() && x.free_bytes.is_none()));
        let config = d.config.as_ref().unwrap();
        assert_eq!(
            (config.cuda_driver_version, config.cuda_runtime_version),
            (None, None)
        );
    }
}
