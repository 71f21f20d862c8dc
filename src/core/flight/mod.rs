//! The flight recorder: a bounded, versioned summary of the ledger that each shimmed process
//! keeps in a shared-memory region of its own ([`layout`]), refreshed by a background thread
//! (the preload crate's `publish`) and readable by other processes without touching the writer
//! ([`read`]), so
//! that a process killed outright (SIGKILL, the kernel's OOM killer, a crash) still leaves its
//! last state behind for `oomshim run` to turn into a post-mortem dump ([`postmortem`]), and
//! `oomshim top` can show every live process.

pub mod layout;
pub mod postmortem;
pub mod read;

use dump::model::Dump;
pub use dump::model::{LiveFailure, RssSample};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Value of the payload's `schema` key; readers reject anything else.
pub const LIVE_SCHEMA: &str = "oomshim.live/1";
/// Host RSS samples kept in a summary (one per publish).
pub const RSS_SAMPLES: usize = 64;
/// Region files are `PID-STARTTICKS` + this suffix.
pub const REGION_SUFFIX: &str = ".live";
/// Set by `oomshim run` for the program it starts (`PID-STARTTICKS` of the `oomshim run`
/// process) and inherited by the program's descendants; each writes it into its summary, so
/// that `oomshim run` finds the regions of its whole tree, even of a process that lived for a
/// moment or whose parent (a wrapper, torchrun) reaps it.
pub const SUPERVISOR_ENV: &str = "OOMSHIM_SUPERVISOR";

/// One published summary (a region slot's payload).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveSummary {
    /// Always [`LIVE_SCHEMA`].
    pub schema: String,
    pub pid: u32,
    /// `/proc/PID/stat` field 22 of the writer: with the pid, it names one process for good.
    pub start_ticks: u64,
    /// Publish number (the region's generation) and when it was taken.
    pub generation: u64,
    pub published_unix_ms: u64,
    /// How often the writer publishes, in milliseconds.
    pub interval_ms: u64,
    /// The process's resident host memory at each of the last [`RSS_SAMPLES`] publishes.
    pub rss: Vec<RssSample>,
    /// The last failed device allocation, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<LiveFailure>,
    /// [`SUPERVISOR_ENV`] as the process started with it: the `oomshim run` whose tree it is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<String>,
    /// The ledger as last published, in the dump schema (`reason: "live"`): devices with their
    /// tracked and peak bytes, the largest holders and sites with symbolised stacks, growth
    /// samples and steps, host memory. Holders and sites are cut to `oomshim::publish::TOP`.
    pub dump: Dump,
    /// Torch's memory by kind as oomshim's Python hook last counted it (at an optimizer step, at
    /// most every [`LIVE_KINDS_EVERY_S`] seconds); absent without the hook, before the first
    /// count, and in regions of older versions (their readers ignore it: the layout is the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<LiveKinds>,
}

/// How often, at most, the Python hook counts torch's memory by kind for the live region.
pub const LIVE_KINDS_EVERY_S: u64 = 10;

/// Torch's memory by kind on one device at a moment (see [`LiveSummary::kinds`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveKinds {
    pub unix_ms: u64,
    pub device: i32,
    pub kinds: dump::model::Kinds,
    /// Torch's records of where the live tensors were allocated (under preload, once the process
    /// grew step after step and the hook turned torch's history on): a post-mortem names the line
    /// that keeps the growth from them, where the shim sees only torch's segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<dump::model::Attribution>,
}

/// `OOMSHIM_LIVE_DIR`, else `/dev/shm/oomshim-UID` (tmpfs: memory, never disk), else
/// `$TMPDIR/oomshim-UID/live` where there is no `/dev/shm`.
pub fn live_dir_from(value: Option<std::ffi::OsString>) -> PathBuf {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join(format!("oomshim-{uid}"))
    } else {
        dump::write::fallback_dir().join("live")
    }
}

/// The live directory this process uses (readers and writer alike).
pub fn live_dir() -> PathBuf {
    live_dir_from(std::env::var_os("OOMSHIM_LIVE_DIR"))
}

/// The region file name of one process.
pub fn region_name(pid: u32, start_ticks: u64) -> String {
    format!("{pid}-{start_ticks}{REGION_SUFFIX}")
}

/// `/proc/PID/stat` field 22 (start time in clock ticks since boot) from the file's text: the
/// fields after the command name, which is in parentheses and may hold anything.
pub fn parse_start_ticks(stat: &str) -> Option<u64> {
    // The start time is field 22.
    crate::facts::gpu_processes::stat_field(stat, 22)?
        .parse()
        .ok()
}

/// A process's start time, `None` when it is gone or unreadable.
pub fn start_ticks_of(pid: u32) -> Option<u64> {
    parse_start_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A process as /proc shows it now, for one that was `pid` started at `start_ticks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessNow {
    /// No such process any more (or the pid names another one now): it ended and was reaped.
    Gone,
    /// Running (or stopped), with its parent.
    Running { parent: u32 },
    /// Ended and not yet reaped by its parent: its wait status as `waitpid` will report it.
    Ended { status: i32, parent: u32 },
}

/// What `/proc/PID/stat` text says of the process that started at `start_ticks`.
pub fn parse_process_now(stat: &str, start_ticks: u64) -> ProcessNow {
    use crate::facts::gpu_processes::stat_field;
    if parse_start_ticks(stat) != Some(start_ticks) {
        return ProcessNow::Gone;
    }
    let parent = stat_field(stat, 4)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    match stat_field(stat, 3) {
        // A zombie (or one being torn down): field 52 holds its wait status (Linux 3.5+).
        Some("Z") | Some("X") | Some("x") => {
            match stat_field(stat, 52).and_then(|c| c.parse().ok()) {
                Some(status) => ProcessNow::Ended { status, parent },
                None => ProcessNow::Gone,
            }
        }
        _ => ProcessNow::Running { parent },
    }
}

/// [`parse_process_now`] of the live process `pid`.
pub fn process_now(pid: u32, start_ticks: u64) -> ProcessNow {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => parse_process_now(&stat, start_ticks),
        Err(_) => ProcessNow::Gone,
    }
}

/// The pid and start time a region's file name gives (`PID-STARTTICKS.live`).
pub fn parse_region_name(name: &str) -> Option<(u32, u64)> {
    let (pid, ticks) = name.strip_suffix(REGION_SUFFIX)?.split_once('-')?;
    Some((pid.parse().ok()?, ticks.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_past_any_command_name() {
        let stat = "4242 (evil) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_ticks(stat), Some(987654));
        assert_eq!(parse_start_ticks("garbage"), None);
        let me = std::process::id();
        assert!(start_ticks_of(me).is_some());
    }

    #[test]
    fn a_zombies_wait_status_is_read_and_a_reused_pid_is_gone() {
        let fields = |state: &str, start: u64, code: i32| {
            let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
            f[0] = state.into();
            f[1] = "77".into(); // parent, field 4
            f[19] = start.to_string(); // field 22
            f[49] = code.to_string(); // field 52
            format!("4242 (a (b) c) {}", f.join(" "))
        };
        assert_eq!(
            parse_process_now(&fields("Z", 500, 9), 500),
            ProcessNow::Ended {
                status: 9,
                parent: 77
            }
        );
        assert_eq!(
            parse_process_now(&fields("S", 500, 0), 500),
            ProcessNow::Running { parent: 77 }
        );
        assert_eq!(
            parse_process_now(&fields("Z", 501, 9), 500),
            ProcessNow::Gone
        );
        assert_eq!(parse_process_now("garbage", 500), ProcessNow::Gone);
        assert_eq!(parse_region_name("4242-500.live"), Some((4242, 500)));
        assert_eq!(parse_region_name("4242-500.live.tmp"), None);
        assert_eq!(parse_region_name("x-500.live"), None);
        let me = std::process::id();
        assert!(matches!(
            process_now(me, start_ticks_of(me).unwrap()),
            ProcessNow::Running { .. }
        ));
    }

    #[test]
    fn the_live_dir_is_per_user_unless_set() {
        // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let d = live_dir_from(None);
        assert!(
            d.to_string_lossy().contains(&format!("oomshim-{uid}")),
            "{d:?}"
        );
        assert_eq!(live_dir_from(Some("/x/y".into())), PathBuf::from("/x/y"));
    }
}
