//! `oomshim merge DIR`: the dumps of all ranks of one job in one table, and the imbalance
//! between them (the classic "one card runs out while the others idle"). Reads a directory that
//! many hosts may share; files that are not dumps are skipped, broken dumps are reported.

use super::units::human_bytes;
use crate::dump::model::Dump;
use crate::dump::read::{read_dump, DumpError};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// One dump, reduced to what the table shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub path: PathBuf,
    pub host: String,
    pub pid: u32,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub reason: String,
    pub time_unix_ms: u64,
    /// The device the row is about: the failing one for an OOM, else the one holding most.
    pub device: Option<i32>,
    pub tracked_bytes: u64,
    pub peak_tracked_bytes: u64,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub failed_bytes: Option<u64>,
    pub verdict: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub rows: Vec<Row>,
    /// Plain-words findings about the balance between processes.
    pub findings: Vec<String>,
    /// `path: why` for every JSON file that could not be read as a dump.
    pub problems: Vec<String>,
}

fn row(path: PathBuf, d: &Dump) -> Row {
    let failing = d.failed_request.as_ref().map(|r| r.device);
    let dev = match failing {
        Some(i) => d.devices.iter().find(|x| x.index == i),
        None => d.devices.iter().max_by_key(|x| x.tracked_bytes),
    };
    Row {
        path,
        host: d.process.host.clone(),
        pid: d.process.pid,
        rank: d.process.rank,
        local_rank: d.process.local_rank,
        world_size: d.process.world_size,
        reason: d.reason.clone(),
        time_unix_ms: d.time_unix_ms,
        device: dev.map(|x| x.index).or(failing),
        tracked_bytes: dev.map_or(0, |x| x.tracked_bytes),
        peak_tracked_bytes: dev.map_or(0, |x| x.peak_tracked_bytes),
        total_bytes: dev.and_then(|x| x.total_bytes),
        free_bytes: dev.and_then(|x| x.free_bytes),
        failed_bytes: d.failed_request.as_ref().map(|r| r.bytes),
        verdict: d.verdict.kind.clone(),
    }
}

/// Every `*.json` under `dir` (one level of subdirectories too, e.g. per-host folders).
fn json_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            if let Ok(sub) = std::fs::read_dir(&p) {
                out.extend(
                    sub.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| is_json(p)),
                );
            }
        } else if is_json(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Named `*.json`. Whether it is a regular file is decided by the reader, on the descriptor it
/// opened (a FIFO or device planted under such a name is refused there, without blocking).
fn is_json(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "json")
}

/// Reads every dump under `dir`. Foreign JSON files are skipped quietly; broken dumps are listed
/// in `problems`. An unreadable directory is an error.
pub fn merge_dir(dir: &Path) -> Result<Merged, String> {
    let files = json_files(dir).map_err(|e| format!("{}: {e}", super::units::clean_path(dir)))?;
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for f in files {
        match read_dump(&f) {
            Ok(d) => rows.push(row(f, &d)),
            // Not dumps: foreign JSON, and FIFOs, devices or directories named like one.
            Err(DumpError::WrongSchema { .. } | DumpError::NotRegular { .. }) => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    rows.sort_by(|a, b| {
        (a.rank.unwrap_or(u32::MAX), &a.host, a.pid, a.time_unix_ms).cmp(&(
            b.rank.unwrap_or(u32::MAX),
            &b.host,
            b.pid,
            b.time_unix_ms,
        ))
    });
    let findings = imbalance(&rows);
    Ok(Merged {
        rows,
        findings,
        problems,
    })
}

/// A process in words, for the balance lines (the host name comes from a dump: cleaned).
fn who(r: &Row) -> String {
    let host = super::units::truncate_middle(&super::units::clean(&r.host), 64);
    match r.rank {
        Some(rank) => format!("rank {rank} ({host} pid {})", r.pid),
        None => format!("{host} pid {}", r.pid),
    }
}

/// Compares each process's peak with the others': one process far above the rest, or running out
/// while the others had room, is the imbalance users look for.
fn imbalance(rows: &[Row]) -> Vec<String> {
    // One entry per process: its highest peak across its dumps, and whether it ran out.
    let mut procs: Vec<(&Row, u64, bool)> = Vec::new();
    for r in rows {
        match procs
            .iter_mut()
            .find(|(p, _, _)| p.host == r.host && p.pid == r.pid)
        {
            Some(e) => {
                e.1 = e.1.max(r.peak_tracked_bytes);
                e.2 |= r.reason == "oom";
            }
            None => procs.push((r, r.peak_tracked_bytes, r.reason == "oom")),
        }
    }
    let mut out = Vec::new();
    if procs.len() < 2 {
        return out;
    }
    let mut peaks: Vec<u64> = procs.iter().map(|p| p.1).collect();
    peaks.sort_unstable();
    let median = peaks[peaks.len() / 2];
    let (max_row, max_peak, _) = procs
        .iter()
        .max_by_key(|p| p.1)
        .copied()
        .expect("two or more");
    let (_, min_peak, _) = procs
        .iter()
        .min_by_key(|p| p.1)
        .copied()
        .expect("two or more");
    out.push(format!(
        "peak tracked memory per process: min {}, median {}, max {} ({})",
        human_bytes(min_peak),
        human_bytes(median),
        human_bytes(max_peak),
        who(max_row)
    ));
    if median > 0 && max_peak as f64 > 1.25 * median as f64 {
        out.push(format!(
            "imbalance: {} peaked at {}, {:.1}× the median of all processes; look at what that rank \
             does differently (data sharding, a rank-0-only step such as logging or checkpointing)",
            who(max_row),
            human_bytes(max_peak),
            max_peak as f64 / median as f64
        ));
    }
    let oom: Vec<&(&Row, u64, bool)> = procs.iter().filter(|p| p.2).collect();
    if !oom.is_empty() && oom.len() < procs.len() {
        let others_max = procs
            .iter()
            .filter(|p| !p.2)
            .map(|p| p.1)
            .max()
            .unwrap_or(0);
        for (r, peak, _) in oom {
            out.push(format!(
                "{} ran out of memory at {} tracked while the {} other process(es) peaked at {} at most",
                who(r),
                human_bytes(*peak),
                procs.len() - 1,
                human_bytes(others_max)
            ));
        }
    }
    out
}

pub fn render_merge(m: &Merged) -> String {
    let mut out = format!("{} dump(s)\n", m.rows.len());
    out.push_str(&format!(
        "  {:<5} {:<20} {:>8} {:>4} {:<12} {:>11} {:>11} {:>11} {:>11}  {}\n",
        "RANK", "HOST", "PID", "DEV", "REASON", "TRACKED", "PEAK", "FREE", "TOTAL", "VERDICT"
    ));
    let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "-".into());
    for r in &m.rows {
        out.push_str(&format!(
            "  {:<5} {:<20} {:>8} {:>4} {:<12} {:>11} {:>11} {:>11} {:>11}  {}\n",
            r.rank.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            super::units::truncate_middle(&super::units::clean(&r.host), 20),
            r.pid,
            r.device
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into()),
            super::units::truncate_middle(&super::units::clean(&r.reason), 12),
            human_bytes(r.tracked_bytes),
            human_bytes(r.peak_tracked_bytes),
            opt(r.free_bytes),
            opt(r.total_bytes),
            super::units::clean(&r.verdict)
        ));
    }
    if !m.findings.is_empty() {
        out.push_str("\nBalance\n");
        for f in &m.findings {
            out.push_str(&format!("  - {f}\n"));
        }
    }
    if !m.problems.is_empty() {
        out.push_str("\nNot read\n");
        for p in &m.problems {
            out.push_str(&format!("  - {}\n", super::units::clean(p)));
        }
    }
    out
}

pub fn merge_json(m: &Merged) -> Value {
    json!({
        "report": "oomshim.merge/1",
        "rows": m.rows.iter().map(|r| json!({
            "path": r.path, "host": r.host, "pid": r.pid, "rank": r.rank, "local_rank": r.local_rank,
            "world_size": r.world_size, "reason": r.reason, "time_unix_ms": r.time_unix_ms,
            "device": r.device, "tracked_bytes": r.tracked_bytes, "peak_tracked_bytes": r.peak_tracked_bytes,
            "free_bytes": r.free_bytes, "total_bytes": r.total_bytes, "failed_bytes": r.failed_bytes,
            "verdict": r.verdict,
        })).collect::<Vec<_>>(),
        "findings": m.findings,
        "problems": m.problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::read::parse_dump;

    fn fixture(name: &str) -> Dump {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
    }

    fn write(dir: &Path, name: &str, d: &Dump) {
        std::fs::write(dir.join(name), serde_json::to_vec(d).unwrap()).unwrap();
    }

    #[test]
    fn four_ranks_one_runs_out_while_the_others_idle() {
        let dir = tempfile::tempdir().unwrap();
        let base = fixture("oom_own_allocations.json");
        for rank in 0..4u32 {
            let mut d = base.clone();
            d.process.rank = Some(rank);
            d.process.pid = 100 + rank;
            d.process.host = if rank < 2 {
                "node-a".into()
            } else {
                "node-b".into()
            };
            if rank != 3 {
                d.reason = "snapshot-at-exit".into();
                d.failed_request = None;
                for dev in &mut d.devices {
                    dev.peak_tracked_bytes = 30 << 30;
                    dev.tracked_bytes = 20 << 30;
                }
            } else {
                for dev in &mut d.devices {
                    dev.peak_tracked_bytes = 79 << 30;
                    dev.tracked_bytes = 79 << 30;
                }
            }
            let sub = dir.path().join(&d.process.host);
            std::fs::create_dir_all(&sub).unwrap();
            write(
                &sub,
                &format!(
                    "oomshim-{}-{}-r{rank}-1.json",
                    d.process.host, d.process.pid
                ),
                &d,
            );
        }
        std::fs::write(dir.path().join("notes.json"), b"{\"not\": \"a dump\"}").unwrap();
        std::fs::write(
            dir.path().join("broken.json"),
            b"{\"schema\": \"oomshim.dump/1\", \"reason\"",
        )
        .unwrap();
        let m = merge_dir(dir.path()).unwrap();
        assert_eq!(m.rows.len(), 4);
        assert_eq!(
            m.rows.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [Some(0), Some(1), Some(2), Some(3)]
        );
        assert_eq!(
            m.problems.len(),
            1,
            "only the broken dump is a problem: {:?}",
            m.problems
        );
        let text = render_merge(&m);
        assert!(
            text.contains("imbalance: rank 3 (node-b pid 103) peaked at 79.00 GiB"),
            "{text}"
        );
        assert!(
            text.contains(
                "rank 3 (node-b pid 103) ran out of memory at 79.00 GiB tracked while the 3 other"
            ),
            "{text}"
        );
        assert!(text.contains("broken.json"), "{text}");
        let j = merge_json(&m);
        assert_eq!(j["rows"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn a_single_process_has_no_balance_section_and_a_missing_dir_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.json", &fixture("oom_own_allocations.json"));
        let m = merge_dir(dir.path()).unwrap();
        assert_eq!(m.rows.len(), 1);
        assert!(m.findings.is_empty());
        assert!(merge_dir(&dir.path().join("missing"))
            .unwrap_err()
            .contains("missing"));
    }
}
