//! `oomshim merge DIR...`: the dumps of all ranks of one job in one table, the first rank to
//! run out of memory, the imbalance between ranks (the classic "one card runs out while the
//! others idle"), and why that rank: the structural causes named from the ranks' memory by kind
//! and their failure times (src/cli/report/why_rank.rs). Reads directories that many hosts may share, or one directory per host; files
//! that are not dumps are skipped, broken dumps are reported.

use dump::model::Dump;
use dump::read::{read_dump, DumpError};
use dump::units::{human_bytes, plural};
use rustc_hash::FxHashMap;
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
    pub job_id: Option<String>,
    pub reason: String,
    /// The dump's `time` (RFC 3339, the writing host's clock) and the same in milliseconds.
    pub time: String,
    pub time_unix_ms: u64,
    /// The device the row is about: the failing one for an OOM, else the one holding most.
    pub device: Option<i32>,
    pub uuid: Option<String>,
    pub tracked_bytes: u64,
    pub peak_tracked_bytes: u64,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub failed_bytes: Option<u64>,
    /// Live bytes NCCL allocated on the row's device (from the dump's `library_memory`).
    pub nccl_bytes: Option<u64>,
    pub verdict: String,
    /// Torch's live memory by kind at the failure (the dump's `framework.kinds`), when the
    /// Python hook counted it.
    pub kinds: Option<RankKinds>,
    /// When the process failed: an out-of-memory dump's time, a post-mortem's death.
    pub failed_unix_ms: Option<u64>,
    /// The verdict's retry hint, when the dump records a failure.
    pub retry: Option<String>,
}

pub use super::why_rank::RankKinds;

/// How `merge` compares clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeOptions {
    /// The most two hosts' clocks may disagree, in milliseconds: failures on different hosts
    /// closer than this cannot be ordered. Processes on one host share a clock.
    pub clock_skew_ms: u64,
}

/// Default [`MergeOptions::clock_skew_ms`]: NTP keeps a cluster's clocks within milliseconds;
/// a second allows for a host whose clock is off without making a step's failures unordered.
pub const DEFAULT_CLOCK_SKEW_MS: u64 = 1000;

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            clock_skew_ms: DEFAULT_CLOCK_SKEW_MS,
        }
    }
}

/// The first process to run out of memory.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstFailure {
    /// Index into [`Merged::rows`] of its earliest OOM dump.
    pub row: usize,
    /// Processes on other hosts whose first failure is within the clock skew of this one (and
    /// on the same host within the same millisecond): any of them may have failed first.
    pub uncertain_with: Vec<usize>,
    /// The next failure after this one (and the uncertain ones), with the gap in milliseconds.
    pub next: Option<(usize, u64)>,
    /// Processes that ran out of memory at all.
    pub failed_processes: usize,
}

/// The ranks of one host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGroup {
    pub host: String,
    pub processes: usize,
    pub ranks: Vec<u32>,
    pub out_of_memory: usize,
    pub max_peak_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub rows: Vec<Row>,
    pub first_failure: Option<FirstFailure>,
    /// Rows (one per process: its highest peak) above [`IMBALANCE_FACTOR`] × the median peak,
    /// highest first.
    pub imbalanced: Vec<usize>,
    pub median_peak_bytes: u64,
    pub hosts: Vec<HostGroup>,
    /// Plain-words findings about the balance between processes.
    pub findings: Vec<String>,
    /// Why the rank that differs does: every rule of src/cli/report/why_rank.rs, applying or
    /// saying why not. Empty with one process.
    pub why: Vec<super::why_rank::Why>,
    /// `path: why` for every JSON file that could not be read as a dump.
    pub problems: Vec<String>,
    pub options: MergeOptions,
}

/// A process peaking above this multiple of the median peak is "far above" it.
pub const IMBALANCE_FACTOR: f64 = 1.25;

/// Processes named one by one in a finding; the rest are counted.
const NAMED: usize = 8;

/// Longest reason shown whole in the table (the shim keeps reasons to 128 characters; what is
/// longer is cut in the middle).
const MAX_REASON: usize = 48;

pub fn row(path: PathBuf, d: &Dump) -> Row {
    let failing = d.failed_request.as_ref().map(|r| r.device);
    let dev = match failing {
        Some(i) => d.devices.iter().find(|x| x.index == i),
        None => d.devices.iter().max_by_key(|x| x.tracked_bytes),
    };
    let device = dev.map(|x| x.index).or(failing);
    let nccl_bytes = d.library_memory.as_ref().and_then(|l| {
        let mut on_device = l
            .libraries
            .iter()
            .filter(|b| b.library == "nccl" && Some(b.device) == device)
            .peekable();
        on_device.peek()?;
        Some(on_device.map(|b| b.bytes).sum())
    });
    Row {
        path,
        host: d.process.host.clone(),
        pid: d.process.pid,
        rank: d.process.rank,
        local_rank: d.process.local_rank,
        world_size: d.process.world_size,
        job_id: d.process.job_id.clone(),
        reason: d.reason.clone(),
        time: d.time.clone(),
        time_unix_ms: d.time_unix_ms,
        device,
        uuid: dev.and_then(|x| x.uuid.clone()),
        tracked_bytes: dev.map_or(0, |x| x.tracked_bytes),
        peak_tracked_bytes: dev.map_or(0, |x| x.peak_tracked_bytes),
        total_bytes: dev.and_then(|x| x.total_bytes),
        free_bytes: dev.and_then(|x| x.free_bytes),
        failed_bytes: d.failed_request.as_ref().map(|r| r.bytes),
        nccl_bytes,
        verdict: d.verdict.kind.clone(),
        kinds: d
            .framework
            .as_ref()
            .and_then(|f| f.kinds.as_ref())
            .map(RankKinds::of),
        failed_unix_ms: match (&d.post_mortem, &d.failed_request) {
            (Some(pm), _) => Some(pm.died_unix_ms),
            (None, Some(_)) if d.reason == "oom" => Some(d.time_unix_ms),
            _ => None,
        },
        retry: d.verdict.retry.as_ref().map(|r| r.hint.clone()),
    }
}

/// Every `*.json` under `dir` (one level of subdirectories too, e.g. per-host folders). A file
/// given instead of a directory is read as itself.
fn json_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if !dir.is_dir() && dir.exists() {
        out.push(dir.to_path_buf());
        return Ok(());
    }
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
    Ok(())
}

/// Named `*.json`. Whether it is a regular file is decided by the reader, on the descriptor it
/// opened (a FIFO or device planted under such a name is refused there, without blocking).
fn is_json(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "json")
}

/// Reads every dump under `dir`, with the default options.
pub fn merge_dir(dir: &Path) -> Result<Merged, String> {
    merge_dirs(&[dir.to_path_buf()], MergeOptions::default())
}

/// Reads every dump under each of `dirs` (a shared directory, or one per host). Foreign JSON
/// files are skipped quietly; broken dumps are listed in `problems`. An unreadable directory is
/// an error.
pub fn merge_dirs(dirs: &[PathBuf], options: MergeOptions) -> Result<Merged, String> {
    let mut files = Vec::new();
    for dir in dirs {
        json_files(dir, &mut files)
            .map_err(|e| format!("{}: {e}", dump::units::clean_path(dir)))?;
    }
    files.sort();
    files.dedup();
    let (rows, problems) = read_rows(&files);
    Ok(merge_rows(rows, problems, options))
}

/// The rows of the dumps among `files`, and why the broken ones could not be read.
fn read_rows(files: &[PathBuf]) -> (Vec<Row>, Vec<String>) {
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for f in files {
        match read_dump(f) {
            Ok(d) => rows.push(row(f.clone(), &d)),
            // Not dumps: foreign JSON, and FIFOs, devices or directories named like one.
            Err(DumpError::WrongSchema { .. } | DumpError::NotRegular { .. }) => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    (rows, problems)
}

/// The comparison of already-read rows (what [`merge_dirs`] does after reading).
pub fn merge_rows(mut rows: Vec<Row>, problems: Vec<String>, options: MergeOptions) -> Merged {
    rows.sort_by(|a, b| {
        (a.rank.unwrap_or(u32::MAX), &a.host, a.pid, a.time_unix_ms).cmp(&(
            b.rank.unwrap_or(u32::MAX),
            &b.host,
            b.pid,
            b.time_unix_ms,
        ))
    });
    let procs = processes(&rows);
    let first_failure = first_failure(&rows, &procs, options);
    let (imbalanced, median_peak_bytes) = imbalanced(&procs);
    let hosts = hosts(&rows, &procs);
    let mut m = Merged {
        rows,
        first_failure,
        imbalanced,
        median_peak_bytes,
        hosts,
        findings: Vec::new(),
        why: Vec::new(),
        problems,
        options,
    };
    m.findings = findings(&m, &procs);
    if procs.len() > 1 {
        m.why = super::why_rank::why(&rank_facts(&m.rows, &procs), options.clock_skew_ms);
    }
    m
}

/// One entry per process for the "why this rank" rules: its kinds from its first
/// out-of-memory dump, else from its latest dump that has them; its first failure.
fn rank_facts<'a>(rows: &'a [Row], procs: &[Proc]) -> Vec<super::why_rank::RankFacts<'a>> {
    procs
        .iter()
        .map(|p| {
            let mine = |r: &Row| {
                let at = &rows[p.peak_row];
                r.host == at.host && r.pid == at.pid
            };
            let kinds = p.first_oom.and_then(|i| rows[i].kinds).or_else(|| {
                rows.iter()
                    .filter(|r| mine(r) && r.kinds.is_some())
                    .max_by_key(|r| r.time_unix_ms)
                    .and_then(|r| r.kinds)
            });
            let failed_ms = rows
                .iter()
                .filter(|r| mine(r))
                .filter_map(|r| r.failed_unix_ms)
                .min();
            let r = &rows[p.peak_row];
            super::why_rank::RankFacts {
                rank: r.rank,
                host: &r.host,
                pid: r.pid,
                kinds,
                failed_ms,
            }
        })
        .collect()
}

/// One process (host, pid) across its dumps.
#[derive(Debug, Clone)]
struct Proc {
    /// The row with its highest peak.
    peak_row: usize,
    peak: u64,
    /// Its earliest OOM dump.
    first_oom: Option<usize>,
    /// Its latest dump (what it had free last).
    last_row: usize,
}

fn processes(rows: &[Row]) -> Vec<Proc> {
    let mut index: FxHashMap<(&str, u32), usize> = FxHashMap::default();
    let mut procs: Vec<Proc> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let oom = r.reason == "oom";
        match index.get(&(r.host.as_str(), r.pid)) {
            Some(&p) => {
                let e = &mut procs[p];
                if r.peak_tracked_bytes > e.peak {
                    e.peak = r.peak_tracked_bytes;
                    e.peak_row = i;
                }
                if oom
                    && e.first_oom
                        .is_none_or(|f| rows[f].time_unix_ms > r.time_unix_ms)
                {
                    e.first_oom = Some(i);
                }
                if rows[e.last_row].time_unix_ms <= r.time_unix_ms {
                    e.last_row = i;
                }
            }
            None => {
                index.insert((r.host.as_str(), r.pid), procs.len());
                procs.push(Proc {
                    peak_row: i,
                    peak: r.peak_tracked_bytes,
                    first_oom: oom.then_some(i),
                    last_row: i,
                });
            }
        }
    }
    procs
}

/// The earliest failure, and the failures that may have been earlier given the clock skew
/// between hosts.
fn first_failure(rows: &[Row], procs: &[Proc], options: MergeOptions) -> Option<FirstFailure> {
    let mut failures: Vec<usize> = procs.iter().filter_map(|p| p.first_oom).collect();
    failures.sort_by_key(|&i| (rows[i].time_unix_ms, rows[i].rank.unwrap_or(u32::MAX)));
    let &first = failures.first()?;
    let t0 = rows[first].time_unix_ms;
    let close = |i: usize| {
        let gap = rows[i].time_unix_ms - t0;
        if rows[i].host == rows[first].host {
            gap == 0 // one clock: only a tie is unordered
        } else {
            gap < options.clock_skew_ms
        }
    };
    let uncertain_with: Vec<usize> = failures[1..]
        .iter()
        .copied()
        .take_while(|&i| rows[i].time_unix_ms - t0 < options.clock_skew_ms.max(1))
        .filter(|&i| close(i))
        .collect();
    let next = failures[1..]
        .iter()
        .copied()
        .find(|i| !uncertain_with.contains(i))
        .map(|i| (i, rows[i].time_unix_ms - t0));
    Some(FirstFailure {
        row: first,
        uncertain_with,
        next,
        failed_processes: failures.len(),
    })
}

/// Processes whose peak is far above the median (highest first), and the median.
fn imbalanced(procs: &[Proc]) -> (Vec<usize>, u64) {
    if procs.len() < 2 {
        return (Vec::new(), procs.first().map_or(0, |p| p.peak));
    }
    // The middle value, or the mean of the two middle ones: with two ranks the upper one would be
    // the outlier itself and nothing could be far above it.
    let median = super::why_rank::median(procs.iter().map(|p| p.peak).collect());
    let mut far: Vec<&Proc> = procs
        .iter()
        .filter(|p| median > 0 && p.peak as f64 > IMBALANCE_FACTOR * median as f64)
        .collect();
    far.sort_by(|a, b| b.peak.cmp(&a.peak).then(a.peak_row.cmp(&b.peak_row)));
    (far.iter().map(|p| p.peak_row).collect(), median)
}

fn hosts(rows: &[Row], procs: &[Proc]) -> Vec<HostGroup> {
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    let mut out: Vec<HostGroup> = Vec::new();
    for p in procs {
        let r = &rows[p.peak_row];
        let i = *index.entry(r.host.as_str()).or_insert_with(|| {
            out.push(HostGroup {
                host: r.host.clone(),
                processes: 0,
                ranks: Vec::new(),
                out_of_memory: 0,
                max_peak_bytes: 0,
            });
            out.len() - 1
        });
        let h = &mut out[i];
        h.processes += 1;
        h.ranks.extend(r.rank);
        h.out_of_memory += usize::from(p.first_oom.is_some());
        h.max_peak_bytes = h.max_peak_bytes.max(p.peak);
    }
    for h in &mut out {
        h.ranks.sort_unstable();
    }
    out.sort_by(|a, b| {
        (a.ranks.first().unwrap_or(&u32::MAX), &a.host)
            .cmp(&(b.ranks.first().unwrap_or(&u32::MAX), &b.host))
    });
    out
}

/// A process in words, for the balance lines (the host name comes from a dump: cleaned).
fn who(r: &Row) -> String {
    let host = dump::units::truncate_middle(&dump::units::clean(&r.host), 64);
    match r.rank {
        Some(rank) => format!("rank {rank} ({host} pid {})", r.pid),
        None => format!("{host} pid {}", r.pid),
    }
}

/// `0-3,8,10-11`: sorted ranks as ranges.
pub fn rank_ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] <= end.saturating_add(1) {
            i += 1;
            end = end.max(ranks[i]);
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// `a, b, c and 5 more`.
fn list(names: Vec<String>, total: usize) -> String {
    let mut s = names.join(", ");
    if total > names.len() {
        s.push_str(&format!(" and {} more", total - names.len()));
    }
    s
}

fn findings(m: &Merged, procs: &[Proc]) -> Vec<String> {
    let mut out = Vec::new();
    first_failure_line(m, procs, &mut out);
    if procs.len() < 2 {
        return out;
    }
    let rows = &m.rows;
    let max = procs
        .iter()
        .max_by_key(|p| (p.peak, std::cmp::Reverse(p.peak_row)))
        .expect("two or more");
    let min = procs.iter().min_by_key(|p| p.peak).expect("two or more");
    out.push(format!(
        "peak tracked memory per process: min {}, median {}, max {} ({})",
        human_bytes(min.peak),
        human_bytes(m.median_peak_bytes),
        human_bytes(max.peak),
        who(&rows[max.peak_row])
    ));
    imbalance(m, &mut out);
    who_ran_out(m, procs, &mut out);
    nccl_held(m, &mut out);
    out
}

/// Which process ran out first, and how sure the order is.
fn first_failure_line(m: &Merged, procs: &[Proc], out: &mut Vec<String>) {
    let rows = &m.rows;
    // With one process there is nothing to compare: its own report says it all.
    if let Some(f) = m.first_failure.as_ref().filter(|_| procs.len() > 1) {
        let r = &rows[f.row];
        let at = dump::units::truncate_middle(&dump::units::clean(&r.time), 40);
        if f.uncertain_with.is_empty() {
            let mut line = format!("first to run out of memory: {} at {at}", who(r));
            match f.next {
                Some((n, gap)) => line.push_str(&format!(
                    ", {gap} ms before the next ({}); {} of {} processes ran out",
                    who(&rows[n]),
                    f.failed_processes,
                    procs.len()
                )),
                // Only here with two processes or more.
                None => line.push_str(&format!(
                    ", the only one of {} processes that ran out",
                    procs.len()
                )),
            }
            out.push(line);
        } else {
            let names: Vec<String> = f
                .uncertain_with
                .iter()
                .take(NAMED)
                .map(|&i| who(&rows[i]))
                .collect();
            out.push(format!(
                "first to run out of memory: {} at {at}, or {}: they failed within {} ms of it on \
                 other hosts (or the same millisecond on its host), closer than the {} ms clock \
                 skew allowed between hosts (--clock-skew-ms), so their order is not known",
                who(r),
                list(names, f.uncertain_with.len()),
                f.uncertain_with
                    .iter()
                    .map(|&i| rows[i].time_unix_ms - r.time_unix_ms)
                    .max()
                    .unwrap_or(0),
                m.options.clock_skew_ms
            ));
        }
    }
}

/// The processes whose peak is far above the median.
fn imbalance(m: &Merged, out: &mut Vec<String>) {
    let rows = &m.rows;
    if let Some((&top, rest)) = m.imbalanced.split_first() {
        let r = &rows[top];
        out.push(format!(
            "imbalance: {} peaked at {}, {:.1}× the median of all processes; look at what that rank \
             does differently (data sharding, a rank-0-only step such as logging or checkpointing)",
            who(r),
            human_bytes(r.peak_tracked_bytes),
            r.peak_tracked_bytes as f64 / m.median_peak_bytes as f64
        ));
        if !rest.is_empty() {
            let names: Vec<String> = rest
                .iter()
                .take(NAMED)
                .map(|&i| {
                    format!(
                        "{} {:.1}×",
                        who(&rows[i]),
                        rows[i].peak_tracked_bytes as f64 / m.median_peak_bytes as f64
                    )
                })
                .collect();
            out.push(format!(
                "also far above the median ({}× or more): {}",
                IMBALANCE_FACTOR,
                list(names, rest.len())
            ));
        }
    }
}

/// The processes that ran out against those that did not, and whether the others had room.
fn who_ran_out(m: &Merged, procs: &[Proc], out: &mut Vec<String>) {
    let rows = &m.rows;
    let oom: Vec<&Proc> = procs.iter().filter(|p| p.first_oom.is_some()).collect();
    if !oom.is_empty() && oom.len() < procs.len() {
        let others: Vec<&Proc> = procs.iter().filter(|p| p.first_oom.is_none()).collect();
        let others_max = others.iter().map(|p| p.peak).max().unwrap_or(0);
        for p in oom.iter().take(NAMED) {
            out.push(format!(
                "{} ran out of memory at {} tracked while the {} peaked at {} at most",
                who(&rows[p.first_oom.expect("filtered")]),
                human_bytes(p.peak),
                plural((procs.len() - 1) as u64, "other process", "other processes"),
                human_bytes(others_max)
            ));
        }
        if oom.len() > NAMED {
            out.push(format!(
                "... and {} more processes ran out",
                oom.len() - NAMED
            ));
        }
        if let Some(line) = room(m, &others) {
            out.push(line);
        }
    }
}

/// What NCCL holds per process.
fn nccl_held(m: &Merged, out: &mut Vec<String>) {
    let nccl: Vec<u64> = m.rows.iter().filter_map(|r| r.nccl_bytes).collect();
    if let (Some(lo), Some(hi)) = (nccl.iter().min(), nccl.iter().max()) {
        out.push(format!(
            "NCCL holds {} per process in {}{}",
            if lo == hi {
                human_bytes(*lo)
            } else {
                format!("{} to {}", human_bytes(*lo), human_bytes(*hi))
            },
            plural(nccl.len() as u64, "dump", "dumps"),
            if nccl.len() < m.rows.len() {
                format!(
                    " (the other {} name no NCCL memory)",
                    m.rows.len() - nccl.len()
                )
            } else {
                String::new()
            }
        ));
    }
}

/// Whether the processes that did not run out had room for the first failure's request: by
/// their own free bytes where their dump has them, else by the failing process's device size
/// less their peak (ranks of one job usually get the same kind of GPU).
fn room(m: &Merged, others: &[&Proc]) -> Option<String> {
    let f = m.first_failure.as_ref()?;
    let failed = &m.rows[f.row];
    let need = failed.failed_bytes?;
    let (mut measured, mut estimated, mut with_room) = (0usize, 0usize, 0usize);
    for p in others {
        let last = &m.rows[p.last_row];
        let free = match last.free_bytes {
            Some(free) => {
                measured += 1;
                Some(free)
            }
            None => failed.total_bytes.map(|t| {
                estimated += 1;
                t.saturating_sub(p.peak)
            }),
        };
        with_room += usize::from(free.is_some_and(|x| x >= need));
    }
    if measured + estimated == 0 {
        return None;
    }
    let basis = match (measured, estimated) {
        (_, 0) => "by their free bytes when they dumped".to_string(),
        (0, _) => format!("by {}'s device size less their peak", who(failed)),
        _ => format!(
            "{measured} by their free bytes, {estimated} by {}'s device size less their peak",
            who(failed)
        ),
    };
    Some(format!(
        "room on the others: {with_room} of the {} that did not run out had the {} \
         {} asked for ({basis}){}",
        plural((measured + estimated) as u64, "process", "processes"),
        human_bytes(need),
        who(failed),
        if with_room > 0 {
            "; the work is not spread evenly"
        } else {
            "; every rank is near its limit: the job as a whole needs less memory per rank"
        }
    ))
}

pub fn render_merge(m: &Merged) -> String {
    let mut out = format!("{}\n", plural(m.rows.len() as u64, "dump", "dumps"));
    rank_table(&mut out, m);
    kinds_table(&mut out, m);
    notes(&mut out, m);
    out
}

/// One row per dump: rank, host, pid, device, reason, tracked and peak bytes, the device's free
/// and total bytes, the verdict.
fn rank_table(out: &mut String, m: &Merged) {
    // The reason column is as wide as its longest reason (`manual:step-1000` whole, not cut to
    // fit a fixed width), within reason: a hostile dump's reason is cut in the middle.
    let reasons: Vec<String> = m
        .rows
        .iter()
        .map(|r| dump::units::truncate_middle(&dump::units::clean(&r.reason), MAX_REASON))
        .collect();
    let rw = reasons
        .iter()
        .map(|r| dump::units::width(r))
        .max()
        .unwrap_or(0)
        .max("REASON".len());
    let pad = |text: &str, w: usize| {
        format!(
            "{text}{}",
            " ".repeat(w.saturating_sub(dump::units::width(text)))
        )
    };
    out.push_str(&format!(
        "  {:<5} {:<20} {:>8} {:>4} {} {:>11} {:>11} {:>11} {:>11}  {}\n",
        "RANK",
        "HOST",
        "PID",
        "DEV",
        pad("REASON", rw),
        "TRACKED",
        "PEAK",
        "FREE",
        "TOTAL",
        "VERDICT"
    ));
    let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "-".into());
    for (r, reason) in m.rows.iter().zip(&reasons) {
        out.push_str(&format!(
            "  {:<5} {:<20} {:>8} {:>4} {} {:>11} {:>11} {:>11} {:>11}  {}\n",
            r.rank.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            dump::units::truncate_middle(&dump::units::clean(&r.host), 20),
            r.pid,
            r.device
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into()),
            pad(reason, rw),
            human_bytes(r.tracked_bytes),
            human_bytes(r.peak_tracked_bytes),
            opt(r.free_bytes),
            opt(r.total_bytes),
            dump::units::clean(&r.verdict)
        ));
    }
}

/// Torch's live memory by kind at each failure (PyTorch processes whose hook counted it), and
/// the median of each kind when more than one rank counted them.
fn kinds_table(out: &mut String, m: &Merged) {
    let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "-".into());
    if m.rows.iter().any(|r| r.kinds.is_some()) {
        // Torch's live memory by kind at each failure (PyTorch processes whose hook counted it).
        out.push_str("\nBy kind\n");
        out.push_str(&format!(
            "  {:<5} {:<20} {:>8} {:>11} {:>11} {:>11} {:>11}  {}\n",
            "RANK", "HOST", "PID", "PARAMETERS", "GRADIENTS", "OPTIMIZER", "ACTIVATIONS", "MOST"
        ));
        for r in m.rows.iter() {
            let Some(k) = &r.kinds else { continue };
            out.push_str(&format!(
                "  {:<5} {:<20} {:>8} {:>11} {:>11} {:>11} {:>11}  {}\n",
                r.rank.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
                dump::units::truncate_middle(&dump::units::clean(&r.host), 20),
                r.pid,
                human_bytes(k.parameters_bytes),
                human_bytes(k.gradients_bytes),
                human_bytes(k.optimizer_state_bytes),
                opt(k.activations_bytes),
                k.dominant().unwrap_or("-")
            ));
        }
        let counted: Vec<RankKinds> = m.rows.iter().filter_map(|r| r.kinds).collect();
        if counted.len() > 1 {
            let med =
                |f: fn(&RankKinds) -> u64| super::why_rank::median(counted.iter().map(f).collect());
            out.push_str(&format!(
                "  {:<5} {:<20} {:>8} {:>11} {:>11} {:>11} {:>11}\n",
                "",
                "median",
                "",
                human_bytes(med(|k| k.parameters_bytes)),
                human_bytes(med(|k| k.gradients_bytes)),
                human_bytes(med(|k| k.optimizer_state_bytes)),
                human_bytes(med(|k| k.activations_bytes.unwrap_or(0))),
            ));
        }
    }
}

/// Why this rank, the ranks by host, the balance findings and the dumps not read.
fn notes(out: &mut String, m: &Merged) {
    if !m.why.is_empty() {
        out.push_str("\nWhy this rank\n");
        let applying: Vec<&super::why_rank::Why> = m.why.iter().filter(|w| w.applies).collect();
        for w in &applying {
            out.push_str(&format!("  - {}\n", dump::units::clean(&w.text)));
        }
        if applying.is_empty() {
            let not: Vec<String> = m
                .why
                .iter()
                .map(|w| format!("{}: {}", w.rule, dump::units::clean(&w.text)))
                .collect();
            out.push_str(&format!(
                "  - no known structural cause applies ({})\n",
                not.join("; ")
            ));
        }
    }
    if m.hosts.len() > 1 {
        out.push_str("\nBy host\n");
        for h in &m.hosts {
            out.push_str(&format!(
                "  {:<20} {:>15}  ranks {:<16} {:>4} ran out  max peak {}\n",
                dump::units::truncate_middle(&dump::units::clean(&h.host), 20),
                plural(h.processes as u64, "process", "processes"),
                if h.ranks.is_empty() {
                    "-".to_string()
                } else {
                    dump::units::truncate_middle(&rank_ranges(&h.ranks), 16)
                },
                h.out_of_memory,
                human_bytes(h.max_peak_bytes)
            ));
        }
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
            out.push_str(&format!("  - {}\n", dump::units::clean(p)));
        }
    }
}

pub fn merge_json(m: &Merged) -> Value {
    let rank_of = |i: usize| {
        let r = &m.rows[i];
        json!({"rank": r.rank, "host": r.host, "pid": r.pid, "time_unix_ms": r.time_unix_ms, "path": r.path})
    };
    json!({
        "report": "oomshim.merge/1",
        "rows": m.rows.iter().map(|r| json!({
            "path": r.path, "host": r.host, "pid": r.pid, "rank": r.rank, "local_rank": r.local_rank,
            "world_size": r.world_size, "job_id": r.job_id, "reason": r.reason,
            "time_unix_ms": r.time_unix_ms, "device": r.device, "uuid": r.uuid,
            "tracked_bytes": r.tracked_bytes, "peak_tracked_bytes": r.peak_tracked_bytes,
            "free_bytes": r.free_bytes, "total_bytes": r.total_bytes, "failed_bytes": r.failed_bytes,
            "nccl_bytes": r.nccl_bytes, "verdict": r.verdict, "retry": r.retry,
            "failed_unix_ms": r.failed_unix_ms,
            "kinds": r.kinds.map(|k| json!({
                "parameters_bytes": k.parameters_bytes, "gradients_bytes": k.gradients_bytes,
                "optimizer_state_bytes": k.optimizer_state_bytes,
                "activations_bytes": k.activations_bytes, "dominant": k.dominant(),
            })),
        })).collect::<Vec<_>>(),
        "first_failure": m.first_failure.as_ref().map(|f| json!({
            "process": rank_of(f.row),
            "uncertain_with": f.uncertain_with.iter().map(|&i| rank_of(i)).collect::<Vec<_>>(),
            "next": f.next.map(|(i, gap)| json!({"process": rank_of(i), "after_ms": gap})),
            "failed_processes": f.failed_processes,
            "clock_skew_ms": m.options.clock_skew_ms,
        })),
        "median_peak_bytes": m.median_peak_bytes,
        "imbalanced": m.imbalanced.iter().map(|&i| {
            let mut v = rank_of(i);
            v["peak_tracked_bytes"] = json!(m.rows[i].peak_tracked_bytes);
            v
        }).collect::<Vec<_>>(),
        "hosts": m.hosts.iter().map(|h| json!({
            "host": h.host, "processes": h.processes, "ranks": h.ranks,
            "out_of_memory": h.out_of_memory, "max_peak_bytes": h.max_peak_bytes,
        })).collect::<Vec<_>>(),
        "findings": m.findings,
        "why": m.why.iter().map(|w| json!({
            "rule": w.rule, "applies": w.applies, "ranks": w.ranks, "text": w.text,
        })).collect::<Vec<_>>(),
        "problems": m.problems,
    })
}
