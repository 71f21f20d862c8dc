//! Post-mortem dumps: what `oomshim run` writes when its program died without a dump of its last
//! state. Plain functions from a region's snapshot, the way the program died and the host's
//! memory then, to a dump of the usual schema (`reason: "post_mortem"`, marked reconstructed).

use super::read::Snapshot;
use dump::model::{Dump, HostKill, PostMortem};
use std::path::{Path, PathBuf};

/// How the program ended, as `waitpid` (or /proc, for a descendant another process reaps)
/// told. Neither a signal nor an exit code: it ended without exiting on purpose (its region
/// was left behind: `exit`, `_exit` and `_Exit` remove it) and its parent reaped it before its
/// status could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Death {
    pub signal: Option<i32>,
    pub core_dumped: bool,
    pub exit_code: Option<i32>,
    pub unix_ms: u64,
    /// Its parent, when that was not `oomshim run`.
    pub reaped_by: Option<u32>,
}

impl Death {
    /// From a wait status.
    pub fn from_status(status: i32, unix_ms: u64, reaped_by: Option<u32>) -> Death {
        Death {
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            core_dumped: libc::WIFSIGNALED(status) && libc::WCOREDUMP(status),
            exit_code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            unix_ms,
            reaped_by,
        }
    }
}

/// Whether the program's end calls for a post-mortem, given what it last published: killed by
/// a signal (nothing of its own ran), or exited non-zero after a failed device allocation whose
/// dump was never written. A program that exited normally removed its region: no snapshot then.
pub fn needed(death: &Death, snapshot: &Snapshot) -> bool {
    if death.signal.is_some() || death.exit_code.is_none() {
        return true;
    }
    death.exit_code.is_some_and(|c| c != 0)
        && snapshot
            .summary
            .last_failure
            .as_ref()
            .is_some_and(|f| f.dump.is_none())
}

/// The name of a signal (`SIGKILL`), from the C library's table.
pub fn signal_name(signo: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match NAMES.get(signo as usize) {
        Some(n) if signo > 0 => n.to_string(),
        _ => format!("signal {signo}"),
    }
}

/// `oom_kill` of a cgroup v2 `memory.events` (v1: `oom_kill` of `memory.oom_control`).
pub fn parse_oom_kills(memory_events: &str) -> Option<u64> {
    memory_events.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == "oom_kill").then(|| it.next()?.parse().ok())?
    })
}

/// A process's memory cgroup directory under `root` (the cgroup filesystem's mount point), and
/// whether it is v2.
pub fn cgroup_of(pid: u32, root: &Path) -> Option<(PathBuf, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    crate::facts::host::cgroup_dir(&text, root)
}

/// The cgroup filesystem: `OOMSHIM_CGROUP_ROOT`, else `/sys/fs/cgroup`.
pub fn cgroup_root() -> PathBuf {
    std::env::var_os("OOMSHIM_CGROUP_ROOT")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"))
}

/// The OOM kills counted so far in the cgroup `(dir, v2)`.
pub fn oom_kills(cgroup: &(PathBuf, bool)) -> Option<u64> {
    let file = if cgroup.1 {
        "memory.events"
    } else {
        "memory.oom_control"
    };
    parse_oom_kills(&std::fs::read_to_string(cgroup.0.join(file)).ok()?)
}

/// The host's memory and the cgroup's numbers now; `oom_kill_before` as counted at the start.
pub fn host_now(cgroup: Option<&(PathBuf, bool)>, oom_kill_before: Option<u64>) -> HostKill {
    let (mem_total, mem_available) = std::fs::read_to_string("/proc/meminfo")
        .map(|t| crate::facts::host::parse_meminfo(&t))
        .unwrap_or((None, None));
    let value = |name: &str| {
        let (dir, _) = cgroup?;
        crate::facts::host::parse_cgroup_value(&std::fs::read_to_string(dir.join(name)).ok()?)
    };
    let v2 = cgroup.is_some_and(|c| c.1);
    HostKill {
        cgroup: cgroup.map(|c| c.0.display().to_string()),
        oom_kill_before,
        oom_kill_after: cgroup.and_then(oom_kills),
        memory_max: value(if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }),
        memory_current: value(if v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        }),
        memory_peak: value(if v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        }),
        mem_total,
        mem_available,
    }
}

/// The post-mortem dump: the summary's dump as last published, with how the program died and
/// a verdict on that death (`crate::verdict::judge_post_mortem`).
pub fn build(snapshot: &Snapshot, death: &Death, host: HostKill) -> Dump {
    let s = &snapshot.summary;
    let mut dump = s.dump.clone();
    dump.reason = "post_mortem".to_string();
    // Torch's memory by kind and its records of the live tensors, as the hook last counted them.
    if let (None, Some(lk)) = (&dump.framework, &s.kinds) {
        dump.framework = Some(dump::model::FrameworkOom {
            name: "torch".to_string(),
            raised: false,
            kinds: Some(lk.kinds.clone()),
            attribution: lk.attribution.clone(),
            ..Default::default()
        });
    }
    dump.time_unix_ms = death.unix_ms;
    dump.time = dump::time::rfc3339(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(death.unix_ms),
    );
    dump.post_mortem = Some(PostMortem {
        reconstructed: true,
        signal: death.signal,
        signal_name: death.signal.map(signal_name),
        core_dumped: death.core_dumped,
        exit_code: death.exit_code,
        died_unix_ms: death.unix_ms,
        published_unix_ms: s.published_unix_ms,
        generation: s.generation,
        from_previous: snapshot.from_previous,
        rss: s.rss.clone(),
        last_failure: s.last_failure.clone(),
        host,
        reaped_by: death.reaped_by,
        started_unix_ms: None,
    });
    dump.verdict = crate::verdict::judge_post_mortem(&dump);
    dump
}

/// The post-mortem of a program that died before it published anything (killed in its first
/// second, before its first live summary): how it died, when it started, the host's memory, and
/// no device state (`generation` 0, no devices). `process`: what `oomshim run` knows of it.
pub fn unpublished(
    process: dump::model::ProcessInfo,
    started_unix_ms: u64,
    death: &Death,
    host: HostKill,
) -> Dump {
    let mut dump = Dump {
        schema: dump::model::SCHEMA.to_string(),
        reason: "post_mortem".to_string(),
        time: dump::time::rfc3339(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(death.unix_ms),
        ),
        time_unix_ms: death.unix_ms,
        process,
        failed_request: None,
        devices: Vec::new(),
        pinned_host: Default::default(),
        largest_holders: Vec::new(),
        sites: Vec::new(),
        free_blocks: dump::model::FreeBlocks {
            source: "unavailable".to_string(),
            ..Default::default()
        },
        verdict: Default::default(),
        recording: dump::model::Recording {
            version: env!("CARGO_PKG_VERSION").to_string(),
            stacks: "off".to_string(),
            ..Default::default()
        },
        pools: Vec::new(),
        vmm: None,
        host: None,
        gpu_processes: None,
        growth: None,
        config: None,
        request_sizes: None,
        framework: None,
        library_memory: None,
        post_mortem: Some(PostMortem {
            reconstructed: true,
            signal: death.signal,
            signal_name: death.signal.map(signal_name),
            core_dumped: death.core_dumped,
            exit_code: death.exit_code,
            died_unix_ms: death.unix_ms,
            published_unix_ms: 0,
            generation: 0,
            from_previous: false,
            rss: Vec::new(),
            last_failure: None,
            host,
            reaped_by: death.reaped_by,
            started_unix_ms: Some(started_unix_ms),
        }),
    };
    dump.verdict = crate::verdict::judge_post_mortem(&dump);
    dump
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_killed_before_it_published_gets_a_dump_of_what_is_known() {
        let process = dump::model::ProcessInfo {
            pid: 77,
            host: "h".into(),
            command_line: vec!["prog".into()],
            rank: None,
            local_rank: None,
            world_size: None,
            launcher: None,
            job_id: None,
            kubernetes: None,
        };
        let death = Death {
            signal: Some(libc::SIGKILL),
            core_dumped: false,
            exit_code: None,
            unix_ms: 1_000_400,
            reaped_by: None,
        };
        let d = unpublished(process, 1_000_000, &death, HostKill::default());
        assert_eq!(d.reason, "post_mortem");
        assert!(d.devices.is_empty() && d.growth.is_none());
        assert_eq!(d.free_blocks.source, "unavailable");
        let pm = d.post_mortem.as_ref().unwrap();
        assert_eq!((pm.generation, pm.started_unix_ms), (0, Some(1_000_000)));
        assert_eq!(d.verdict.kind, crate::verdict::KILLED_BY_SIGNAL);
        let top = &d.verdict.findings[0].headline;
        assert!(
            top.ends_with("its device memory is not known: it died 0.4 s after it started, before its first live summary"),
            "{top}"
        );
        // Round trip: readers take it as any dump.
        let bytes = serde_json::to_vec(&d).unwrap();
        let back = dump::read::parse_dump(&bytes, Path::new("x.json")).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let events = "low 0\nhigh 12\nmax 40\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(events), Some(2));
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"),
            Some(5)
        );
        assert_eq!(parse_oom_kills("garbage"), None);
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(11), "SIGSEGV");
    }
}
