//! Host memory at dump time: what the machine has left, the cgroup limit the process runs under
//! (containers, Slurm), and the process's own resident size. A CPU-side out-of-memory (the Linux
//! OOM killer) starts here, and pinned host memory counts against it.

use std::path::{Path, PathBuf};

use dump::model::HostMemory;

/// A `Key:   123 kB` line's value in bytes.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | Some("KB") => n.checked_mul(1024),
            None => Some(n),
            _ => None,
        }
    })
}

/// (MemTotal, MemAvailable) from /proc/meminfo text.
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    (kb_field(text, "MemTotal"), kb_field(text, "MemAvailable"))
}

/// VmRSS from /proc/self/status text.
pub fn parse_rss(text: &str) -> Option<u64> {
    kb_field(text, "VmRSS")
}

/// A cgroup memory value: a number of bytes, or none for `max` (v2) and the v1 "unlimited"
/// sentinel (a page-rounded i64::MAX).
pub fn parse_cgroup_value(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    (v < (1u64 << 62)).then_some(v)
}

/// The directory of the process's memory cgroup, from /proc/self/cgroup text: the v2 entry
/// (`0::/path`) under `root`, else the v1 `memory` controller's.
pub fn cgroup_dir(proc_self_cgroup: &str, root: &Path) -> Option<(PathBuf, bool)> {
    for line in proc_self_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (id, controllers, path) = (it.next()?, it.next()?, it.next()?);
        let rel = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            return Some((root.join(rel), true));
        }
        if controllers.split(',').any(|c| c == "memory") {
            return Some((root.join("memory").join(rel), false));
        }
    }
    None
}

pub fn read() -> HostMemory {
    let (total_bytes, available_bytes) = std::fs::read_to_string("/proc/meminfo")
        .map(|t| parse_meminfo(&t))
        .unwrap_or((None, None));
    let rss_bytes = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| parse_rss(&t));
    let (mut cgroup_limit_bytes, mut cgroup_usage_bytes) = (None, None);
    if let Some((dir, v2)) = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_dir(&t, Path::new("/sys/fs/cgroup")))
    {
        let (limit, usage) = if v2 {
            ("memory.max", "memory.current")
        } else {
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
        };
        let value = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| parse_cgroup_value(&t))
        };
        cgroup_limit_bytes = value(limit);
        cgroup_usage_bytes = value(usage);
    }
    HostMemory {
        total_bytes,
        available_bytes,
        cgroup_limit_bytes,
        cgroup_usage_bytes,
        rss_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_status_values_are_bytes() {
        let meminfo =
            "MemTotal:       24552912 kB\nMemFree:         1000 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(
            parse_meminfo(meminfo),
            (Some(24552912 * 1024), Some(23000000 * 1024))
        );
        assert_eq!(parse_meminfo("garbage"), (None, None));
        assert_eq!(
            parse_rss("Name:\tpython\nVmRSS:\t  2048 kB\n"),
            Some(2048 * 1024)
        );
        assert_eq!(parse_rss("VmRSSX: 5 kB"), None);
    }

    #[test]
    fn cgroup_values_and_unlimited() {
        assert_eq!(parse_cgroup_value("max\n"), None);
        assert_eq!(
            parse_cgroup_value("9223372036854771712\n"),
            None,
            "v1 unlimited"
        );
        assert_eq!(parse_cgroup_value("8589934592\n"), Some(8 << 30));
        assert_eq!(parse_cgroup_value("nonsense"), None);
    }

    #[test]
    fn cgroup_dir_prefers_v2_and_finds_v1_memory() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(
            cgroup_dir("0::/user.slice/job-7\n", root),
            Some((PathBuf::from("/sys/fs/cgroup/user.slice/job-7"), true))
        );
        let v1 = "12:cpu,cpuacct:/slurm/job1\n4:memory:/slurm/uid_0/job_42\n";
        assert_eq!(
            cgroup_dir(v1, root),
            Some((
                PathBuf::from("/sys/fs/cgroup/memory/slurm/uid_0/job_42"),
                false
            ))
        );
        assert_eq!(cgroup_dir("", root), None);
    }

    #[test]
    fn reading_this_machine_gives_plausible_numbers() {
        let h = read();
        let total = h.total_bytes.expect("/proc/meminfo is readable here");
        assert!(h.available_bytes.unwrap() <= total);
        assert!(h.rss_bytes.unwrap() > 0);
    }
}
