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
    /// The ledger as last published, in the dump schema (`reason: "live"`): devices with their
    /// tracked and peak bytes, the largest holders and sites with symbolised stacks, growth
    /// samples and steps, host memory. Holders and sites are cut to `oomshim::publish::TOP`.
    pub dump: Dump,
}

/// `OOMSHIM_LIVE_DIR`, else `/dev/shm/oomshim-UID` (tmpfs: memory, never disk), else
/// `$TMPDIR/oomshim-UID/live` where there is no `/dev/shm`.
pub fn live_dir_from(value: Option<std::ffi::OsString>) -> PathBuf {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
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
    fn the_live_dir_is_per_user_unless_set() {
        let uid = unsafe { libc::geteuid() };
        let d = live_dir_from(None);
        assert!(
            d.to_string_lossy().contains(&format!("oomshim-{uid}")),
            "{d:?}"
        );
        assert_eq!(live_dir_from(Some("/x/y".into())), PathBuf::from("/x/y"));
    }
}
