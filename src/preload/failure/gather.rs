//! Reading what a dump needs from outside the ledger and CUDA: the machine ([`Facts`]), the
//! process ([`ProcessSnapshot`]), the shim's own state ([`RecorderState`]) and the live stack
//! tables ([`LiveLookups`]). Everything impure about assembling a dump is here, so that
//! `assemble` itself is a function of its inputs; [`assemble_now`] reads them and assembles.

use super::assemble::{
    self, BurstInfo, Capture, Facts, Lookups, Observed, ProcessSnapshot, RecorderState,
};
use super::recorder::Recorder;
use dump::model::{Dump, Frame, ProcessInfo};
use oomshim_host::ledger::StackId;
use oomshim_host::pystack::PyFrame;

/// Reads the process, the shim's state and the stack tables now, and assembles the dump of `cap`
/// from them and `facts` (read at the failure by whoever caught it).
pub(crate) fn assemble_now(
    s: &dyn Recorder,
    reason: &str,
    cap: &Capture,
    burst: Option<BurstInfo>,
    framework: Option<&super::event::FrameworkNote>,
    facts: Facts,
) -> Dump {
    let lookups = LiveLookups(s);
    let observed = Observed {
        facts,
        process: ProcessSnapshot::read(),
        recorder: RecorderState::read(s, cap, &lookups),
    };
    assemble::assemble(
        s.config(),
        reason,
        cap,
        burst,
        framework,
        observed,
        &lookups,
    )
}

impl Facts {
    pub fn read(device: Option<i32>) -> Facts {
        Facts {
            // Asked only for a device the process uses: NVML is loaded on the calling thread.
            gpu_processes: device.map(oomshim_core::facts::gpu_processes::for_dump),
            host: oomshim_core::facts::host::read(),
            device_uuids: crate::cuda::context::known_device_uuids(),
        }
    }

    /// The same facts with the UUIDs learnt by now: the writer reads the other facts at the
    /// failure but assembles its dump later, when more devices may have been named.
    pub fn with_current_uuids(self) -> Facts {
        Facts {
            device_uuids: crate::cuda::context::known_device_uuids(),
            ..self
        }
    }
}

impl ProcessSnapshot {
    /// This process now: /proc/self/cmdline and maps, the host name, the launcher's variables,
    /// the allowlisted environment, torch's `version.py` when torch is mapped.
    pub fn read() -> ProcessSnapshot {
        use oomshim_core::facts::env;
        let maps = oomshim_core::facts::libraries::read_self_maps();
        ProcessSnapshot {
            process: process_info(),
            torch_version: env::torch_version_in(&maps),
            maps,
            env: env::snapshot(
                |k| std::env::var(k).ok(),
                std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
                (None, None),
            )
            .env,
            python: oomshim_host::pystack::interpreter(),
        }
    }
}

impl RecorderState {
    /// The shim's counters and the growth tracker's analysis now, for the dump of `cap`
    /// (projections use the free bytes its context asked).
    pub fn read(s: &dyn Recorder, cap: &Capture, lookups: &dyn Lookups) -> RecorderState {
        let native_captured = s.config().stacks.native();
        RecorderState {
            stacks: crate::record::recording::current()
                .stacks()
                .unwrap_or(oomshim_core::config::StackMode::Off),
            oom_failures: s.oom_failures(),
            growth: {
                let mut name = |pairs: &[_]| {
                    let named = assemble::symbolize_stacks(lookups, native_captured, pairs);
                    pairs
                        .iter()
                        .map(|k| named.get(k).map(|v| v.0.clone()).unwrap_or_default())
                        .collect()
                };
                let free = cap.context.mem_info.map(|m| m.0);
                match &cap.growth {
                    // The history as it was at the failure.
                    Some(frozen) => Some(frozen.clone().growth(free, &mut name)),
                    None => s.growth_now(free, &mut name),
                }
            },
            request_sizes: s.request_sizes(),
        }
    }
}

/// The live shim's stack tables, the symboliser and /proc's thread names.
pub(crate) struct LiveLookups<'a>(pub &'a dyn Recorder);

impl Lookups for LiveLookups<'_> {
    fn native_stack(&self, id: StackId) -> Vec<usize> {
        self.0.native_frames(id)
    }

    fn symbolize(&self, addrs: &[usize]) -> Vec<Vec<Frame>> {
        oomshim_host::stacks::symbolize(addrs)
    }

    fn python_stack(&self, id: StackId) -> Vec<PyFrame> {
        oomshim_host::pystack::resolve(&self.0.python_frames(id))
    }

    fn thread_name(&self, tid: u64) -> Option<String> {
        crate::state::thread_name(tid)
    }
}

fn process_info() -> ProcessInfo {
    let command_line = std::fs::read("/proc/self/cmdline")
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let ranks = oomshim_core::facts::ranks::current();
    ProcessInfo {
        pid: std::process::id(),
        host: dump::write::hostname().unwrap_or_else(|| "unknown".to_string()),
        command_line,
        rank: ranks.rank,
        local_rank: ranks.local_rank,
        world_size: ranks.world_size,
        launcher: ranks.launcher.map(str::to_string),
        job_id: ranks.job_id,
        kubernetes: oomshim_core::facts::kubernetes::current(),
    }
}
