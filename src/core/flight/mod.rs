//! The flight recorder: a bounded, versioned summary of the ledger that each shimmed process
//! keeps in a shared-memory region of its own ([`layout`]), refreshed by a background thread
//! (the preload crate's `publish`) and readable by other processes without touching the writer
//! ([`read`]), so
//! that a process killed outright (SIGKILL, the kernel's OOM killer, a crash) still leaves its
//! last state behind for `oomshim run` to turn into a post-mortem dump ([`postmortem`]), and
//! `oomshim top` can show every live process.

pub mod expire;
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
/// Region files are `PIDNS-PID-STARTTICKS` + this suffix ([`RegionId`]).
pub const REGION_SUFFIX: &str = ".live";
/// A region of a process that is gone, or of another pid namespace, that nobody has written for
/// this long is removed by the next shimmed process that creates its own region in the same
/// directory (a live writer publishes at least every `OOMSHIM_LIVE_INTERVAL`, 60 s at most; a
/// post-mortem is written the moment `oomshim run` reaps its program).
pub const EXPIRE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);
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
    /// The writer's pid in its own pid namespace (see [`RegionId`]).
    pub pid: u32,
    /// The writer's pid namespace (see [`RegionId`]); absent from older writers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
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
    /// Where the writer's answer goes when it dies (its torchelastic error file, its termination
    /// log), as its own settings say: the supervisor that writes its post-mortem may first see it
    /// dead, when its environment can no longer be read. Absent in regions of older writers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_file: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_log: Option<std::path::PathBuf>,
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

/// Which process a region is of, on the whole host: its pid namespace (the inode of
/// `/proc/self/ns/pid`), its pid there and its start time (`/proc/self/stat` field 22). Pids
/// alone are not: containers that share `/dev/shm` (`docker --ipc=host`, pods with hostIPC)
/// each have their own pid 1, and two of them started in the same clock tick would share a name.
/// `pid_ns` 0: a region an older version named `PID-STARTTICKS.live`, taken to be of the
/// reader's own namespace, as that version did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId {
    pub pid_ns: u64,
    pub pid: u32,
    pub start_ticks: u64,
}

impl RegionId {
    /// The region's file name: `PIDNS-PID-STARTTICKS.live` (an older one without its namespace).
    pub fn file_name(&self) -> String {
        if self.pid_ns == 0 {
            format!("{}-{}{REGION_SUFFIX}", self.pid, self.start_ticks)
        } else {
            format!(
                "{}-{}-{}{REGION_SUFFIX}",
                self.pid_ns, self.pid, self.start_ticks
            )
        }
    }

    /// The id a region's file name gives; `None` for any other name.
    pub fn parse(name: &str) -> Option<RegionId> {
        let stem = name.strip_suffix(REGION_SUFFIX)?;
        let parts: Vec<&str> = stem.split('-').collect();
        let num = |s: &str| -> Option<u64> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        match parts.as_slice() {
            [pid, ticks] => Some(RegionId {
                pid_ns: 0,
                pid: u32::try_from(num(pid)?).ok()?,
                start_ticks: num(ticks)?,
            }),
            [ns, pid, ticks] => Some(RegionId {
                pid_ns: num(ns).filter(|n| *n != 0)?,
                pid: u32::try_from(num(pid)?).ok()?,
                start_ticks: num(ticks)?,
            }),
            _ => None,
        }
    }

    /// This process's id, as its region is named; `None` when /proc cannot say.
    pub fn of_this_process() -> Option<RegionId> {
        Some(RegionId {
            pid_ns: own_pid_ns()?,
            // SAFETY: getpid cannot fail.
            pid: unsafe { libc::getpid() } as u32,
            start_ticks: parse_start_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?,
        })
    }
}

/// The inode of this process's pid namespace (`/proc/self/ns/pid`).
pub fn own_pid_ns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// The region file name of a process of this process's pid namespace.
pub fn region_name(pid: u32, start_ticks: u64) -> String {
    RegionId {
        pid_ns: own_pid_ns().unwrap_or(0),
        pid,
        start_ticks,
    }
    .file_name()
}

/// Whether this process can tell by `/proc/PID` whether the processes of pid namespace `ns`
/// run: it is this process's own namespace (0: a name without one, taken as its own), and
/// `/proc` shows that namespace (one mounted for another, as under `unshare --pid --fork`
/// without `--mount-proc`, gives other processes these numbers).
pub fn judges_namespace(ns: u64) -> bool {
    static VIEW: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let own = *VIEW.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let shown: u32 = stat.split_whitespace().next()?.parse().ok()?;
        // SAFETY: getpid cannot fail.
        (shown == unsafe { libc::getpid() } as u32)
            .then(own_pid_ns)
            .flatten()
    });
    own.is_some_and(|own| ns == 0 || ns == own)
}

/// What can be said of a region's writer from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Runs (or is stopped, or is a zombie not yet reaped).
    Running,
    /// Ended: no process of its namespace has its pid and start time any more.
    Gone,
    /// Of another pid namespace (another container, or a `/proc` that shows another one):
    /// whether it runs cannot be told from here, and its region is never judged gone.
    OtherNamespace,
}

/// [`Liveness`] of the writer of a region named `id`.
pub fn liveness(id: &RegionId) -> Liveness {
    if !judges_namespace(id.pid_ns) {
        return Liveness::OtherNamespace;
    }
    if start_ticks_of(id.pid) == Some(id.start_ticks) {
        Liveness::Running
    } else {
        Liveness::Gone
    }
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

/// The pid and start time a region's file name gives (see [`RegionId::parse`]).
pub fn parse_region_name(name: &str) -> Option<(u32, u64)> {
    RegionId::parse(name).map(|id| (id.pid, id.start_ticks))
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
        assert_eq!(parse_region_name("+1-500.live"), None);
        let id = RegionId {
            pid_ns: 4026531836,
            pid: 1,
            start_ticks: 77,
        };
        assert_eq!(id.file_name(), "4026531836-1-77.live");
        assert_eq!(RegionId::parse(&id.file_name()), Some(id));
        assert_eq!(RegionId::parse("0-1-77.live"), None);
        assert_eq!(RegionId::parse("1-2-3-4.live"), None);
        let me = RegionId::of_this_process().unwrap();
        assert_eq!(liveness(&me), Liveness::Running);
        assert_eq!(
            liveness(&RegionId {
                pid_ns: me.pid_ns + 1,
                ..me
            }),
            Liveness::OtherNamespace
        );
        assert_eq!(
            liveness(&RegionId {
                start_ticks: me.start_ticks + 1,
                ..me
            }),
            Liveness::Gone
        );
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
