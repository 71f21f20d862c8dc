//! `oomshim merge DIR...`: the dumps of all ranks of one job in one table, the first rank to
//! run out of memory, and the imbalance between ranks (the classic "one card runs out while the
//! others idle"). Reads directories that many hosts may share, or one directory per host; files
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
}

/// One process's memory by kind, as `merge` lists it per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankKinds {
    pub parameters_bytes: u64,
    pub gradients_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub activations_bytes: Option<u64>,
}

impl RankKinds {
    fn of(k: &dump::model::Kinds) -> RankKinds {
        RankKinds {
            parameters_bytes: k.parameters_bytes,
            gradients_bytes: k.gradients_bytes,
            optimizer_state_bytes: k.optimizer_state_bytes,
            activations_bytes: k.activations_bytes,
        }
    }

    /// The kind holding the most (`parameters`, `gradients`, `optimizer_state`, `activations`),
    /// ties to the first; `None` when nothing was counted.
    pub fn dominant(&self) -> Option<&'static str> {
        [
            ("parameters", self.parameters_bytes),
            ("gradients", self.gradients_bytes),
            ("optimizer_state", self.optimizer_state_bytes),
            ("activations", self.activations_bytes.unwrap_or(0)),
        ]
        .into_iter()
        .fold(None, |best: Option<(&str, u64)>, (k, b)| {
            if b > best.map_or(0, |x| x.1) {
                Some((k, b))
            } else {
                best
            }
        })
        .map(|b| b.0)
    }
}

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

fn row(path: PathBuf, d: &Dump) -> Row {
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
        problems,
        options,
    };
    m.findings = findings(&m, &procs);
    m
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
    let mut peaks: Vec<u64> = procs.iter().map(|p| p.peak).collect();
    peaks.sort_unstable();
    // The middle value, or the mean of the two middle ones: with two ranks the upper one would be
    // the outlier itself and nothing could be far above it.
    let mid = peaks.len() / 2;
    let median = if peaks.len().is_multiple_of(2) {
        peaks[mid - 1] / 2 + peaks[mid] / 2 + (peaks[mid - 1] % 2 + peaks[mid] % 2) / 2
    } else {
        peaks[mid]
    };
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
    let rows = &m.rows;
    let mut out = Vec::new();
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
    if procs.len() < 2 {
        return out;
    }
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
    out
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
    out
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
            "nccl_bytes": r.nccl_bytes, "verdict": r.verdict,
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
        "problems": m.problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dump::read::parse_dump;

    fn fixture(name: &str) -> Dump {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
    }

    fn write(dir: &Path, name: &str, d: &Dump) {
        std::fs::write(dir.join(name), serde_json::to_vec(d).unwrap()).unwrap();
    }

    /// Issue 27: the REASON column is as wide as the longest reason (it was cut to 12
    /// characters: `manua...1000`, `snaps...exit`), and the columns after it stay aligned.
    #[test]
    fn reasons_are_shown_whole_and_the_table_stays_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let base = fixture("oom_own_allocations.json");
        for (i, reason) in ["oom", "manual: checkpoint at step 1000", "snapshot-at-exit"]
            .into_iter()
            .enumerate()
        {
            let mut d = base.clone();
            d.process.rank = Some(i as u32);
            d.process.pid = 100 + i as u32;
            d.reason = reason.into();
            write(dir.path(), &format!("oomshim-h-{i}-1.json"), &d);
        }
        let text =
            render_merge(&merge_dirs(&[dir.path().into()], MergeOptions::default()).unwrap());
        let lines: Vec<&str> = text.lines().take(5).collect();
        assert_eq!(lines[0], "3 dumps", "{text}");
        for reason in ["manual: checkpoint at step 1000", "snapshot-at-exit"] {
            assert!(text.contains(reason), "{reason} cut: {text}");
        }
        // TRACKED ends in the same column on the header and every row.
        let end = |l: &str| l.find(" TRACKED").map(|i| i + " TRACKED".len());
        let at = end(lines[1]).expect("header");
        for row in &lines[2..5] {
            assert_eq!(dump::units::width(&row[..row.len().min(at)]), at, "{text}");
            assert!(
                row[..at].ends_with(" GiB") || row[..at].ends_with(" MiB"),
                "{text}"
            );
        }
        // A hostile reason is cut in the middle, not allowed to widen the table without end.
        let mut d = base.clone();
        d.reason = "x".repeat(5000);
        write(dir.path(), "oomshim-h-9-1.json", &d);
        let text =
            render_merge(&merge_dirs(&[dir.path().into()], MergeOptions::default()).unwrap());
        assert!(text.lines().all(|l| l.len() < 400), "{text}");
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
    /// A synthetic rank's dump: `peak` GiB peak on device 0 of 80 GiB, `free` GiB free when known,
    /// an OOM at `oom_at` (ms) or a snapshot at exit.
    fn rank_dump(
        base: &Dump,
        rank: u32,
        host: &str,
        peak_gib: u64,
        free_gib: Option<u64>,
        oom_at: Option<u64>,
    ) -> Dump {
        let mut d = base.clone();
        d.process.rank = Some(rank);
        d.process.world_size = Some(1024);
        d.process.pid = 1000 + rank;
        d.process.host = host.into();
        d.devices.truncate(1);
        d.devices[0].index = 0;
        d.devices[0].peak_tracked_bytes = peak_gib << 30;
        d.devices[0].tracked_bytes = peak_gib << 30;
        d.devices[0].total_bytes = Some(80 << 30);
        d.devices[0].free_bytes = free_gib.map(|f| f << 30);
        match oom_at {
            Some(t) => {
                d.reason = "oom".into();
                d.time_unix_ms = t;
                let r = d.failed_request.as_mut().expect("fixture is an OOM");
                r.device = 0;
                r.bytes = 4 << 30;
            }
            None => {
                d.reason = "exit".into();
                d.failed_request = None;
                d.time_unix_ms = 2_000_000_000_000;
            }
        }
        d
    }

    fn rows_of(dumps: &[Dump]) -> Vec<Row> {
        dumps
            .iter()
            .enumerate()
            .map(|(i, d)| row(PathBuf::from(format!("{i}.json")), d))
            .collect()
    }

    fn opts(ms: u64) -> MergeOptions {
        MergeOptions { clock_skew_ms: ms }
    }

    #[test]
    fn the_first_rank_to_fail_is_named_by_failure_time_with_the_skew_between_hosts() {
        let base = fixture("oom_own_allocations.json");
        let t = 1_800_000_000_000;
        // Rank 5 leaks and fails first on node-b; rank 1 fails 4 s later on node-a (its
        // collective timed out, say); the rest exit normally.
        let mut dumps: Vec<Dump> = (0..8)
            .map(|r| {
                let host = if r < 4 { "node-a" } else { "node-b" };
                rank_dump(&base, r, host, 20, Some(50), None)
            })
            .collect();
        dumps[5] = rank_dump(&base, 5, "node-b", 76, Some(1), Some(t));
        dumps[1] = rank_dump(&base, 1, "node-a", 21, Some(2), Some(t + 4000));
        let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
        let f = m.first_failure.as_ref().unwrap();
        assert_eq!(m.rows[f.row].rank, Some(5));
        assert!(f.uncertain_with.is_empty());
        let (next, gap) = f.next.unwrap();
        assert_eq!((m.rows[next].rank, gap), (Some(1), 4000));
        assert_eq!(f.failed_processes, 2);
        let text = render_merge(&m);
        assert!(
            text.contains("first to run out of memory: rank 5 (node-b pid 1005)")
                && text.contains(
                    "4000 ms before the next (rank 1 (node-a pid 1001)); 2 of 8 processes ran out"
                ),
            "{text}"
        );

        // The later rank's failure only 200 ms after, on another host: within a 1 s skew the
        // order is not known, and merge says so; with a 50 ms skew it is.
        dumps[1] = rank_dump(&base, 1, "node-a", 21, Some(2), Some(t + 200));
        let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
        let f = m.first_failure.as_ref().unwrap();
        assert_eq!(m.rows[f.row].rank, Some(5));
        assert_eq!(
            f.uncertain_with
                .iter()
                .map(|&i| m.rows[i].rank)
                .collect::<Vec<_>>(),
            [Some(1)]
        );
        assert!(render_merge(&m).contains("their order is not known"));
        let m = merge_rows(rows_of(&dumps), vec![], opts(50));
        assert!(m.first_failure.as_ref().unwrap().uncertain_with.is_empty());

        // On one host there is one clock: 1 ms apart is an order, whatever the skew.
        dumps[1] = rank_dump(&base, 1, "node-b", 21, Some(2), Some(t + 1));
        let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
        let f = m.first_failure.as_ref().unwrap();
        assert!(f.uncertain_with.is_empty(), "{f:?}");
        assert_eq!(f.next.map(|n| n.1), Some(1));

        // An earlier failure wins whatever the rank numbers: rank 1 first now.
        dumps[1] = rank_dump(&base, 1, "node-a", 21, Some(2), Some(t - 3000));
        let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
        assert_eq!(m.rows[m.first_failure.unwrap().row].rank, Some(1));
    }

    #[test]
    fn with_two_ranks_the_one_far_above_the_other_is_imbalanced() {
        let base = fixture("oom_own_allocations.json");
        let dumps = vec![
            rank_dump(&base, 0, "node-0", 8, Some(50), None),
            rank_dump(&base, 1, "node-0", 130, Some(1), Some(1_800_000_000_000)),
        ];
        let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
        assert_eq!(m.median_peak_bytes, 69 << 30);
        assert_eq!(
            m.imbalanced.len(),
            1,
            "rank 1 at 130 GiB is far above the median of 69 GiB"
        );
        let text = render_merge(&m);
        assert!(text.contains("imbalance: rank 1"), "{text}");
    }

    #[test]
    fn imbalance_names_every_rank_far_above_the_median_and_room_on_the_others() {
        let base = fixture("oom_own_allocations.json");
        let t = 1_800_000_000_000;
        let mut dumps: Vec<Dump> = (0..16)
            .map(|r| rank_dump(&base, r, &format!("node-{}", r / 8), 20, Some(50), None))
            .collect();
        dumps[3] = rank_dump(&base, 3, "node-0", 78, Some(1), Some(t));
        dumps[9] = rank_dump(&base, 9, "node-1", 30, Some(40), None);
        dumps[12] = rank_dump(&base, 12, "node-1", 26, None, None); // no free bytes: estimated
        let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
        assert_eq!(m.median_peak_bytes, 20 << 30);
        assert_eq!(
            m.imbalanced
                .iter()
                .map(|&i| m.rows[i].rank)
                .collect::<Vec<_>>(),
            [Some(3), Some(9), Some(12)],
            "every process above 1.25× the median, highest first"
        );
        let text = render_merge(&m);
        assert!(
            text.contains("imbalance: rank 3 (node-0 pid 1003) peaked at 78.00 GiB, 3.9×"),
            "{text}"
        );
        assert!(text.contains("also far above the median (1.25× or more): rank 9 (node-1 pid 1009) 1.5×, rank 12 (node-1 pid 1012) 1.3×"), "{text}");
        assert!(
            text.contains("room on the others: 15 of the 15 processes that did not run out had the 4.00 GiB rank 3 (node-0 pid 1003) asked for (14 by their free bytes, 1 by rank 3 (node-0 pid 1003)'s device size less their peak)"),
            "{text}"
        );
        // By host: the ranks of each, as ranges.
        assert_eq!(m.hosts.len(), 2);
        assert_eq!(
            (m.hosts[0].host.as_str(), m.hosts[0].out_of_memory),
            ("node-0", 1)
        );
        assert_eq!(rank_ranges(&m.hosts[1].ranks), "8-15");
        assert!(text.contains("By host"), "{text}");

        // Every rank short of room: the job needs less per rank, not a better spread.
        let tight: Vec<Dump> = (0..4)
            .map(|r| {
                if r == 0 {
                    rank_dump(&base, r, "n", 79, Some(0), Some(t))
                } else {
                    rank_dump(&base, r, "n", 78, Some(2), None)
                }
            })
            .collect();
        let text = render_merge(&merge_rows(rows_of(&tight), vec![], opts(1000)));
        assert!(
            text.contains("0 of the 3 processes") && text.contains("every rank is near its limit"),
            "{text}"
        );
    }

    #[test]
    fn kinds_are_listed_per_rank_when_the_hook_counted_them() {
        let base = fixture("oom_own_allocations.json");
        let mut with_kinds = rank_dump(&base, 0, "node-a", 70, Some(1), Some(1_000));
        with_kinds.framework = Some(dump::model::FrameworkOom {
            kinds: Some(dump::model::Kinds {
                parameters_bytes: 2 << 30,
                gradients_bytes: 2 << 30,
                optimizer_state_bytes: 4 << 30,
                activations_bytes: Some(60 << 30),
                ..Default::default()
            }),
            ..Default::default()
        });
        let without = rank_dump(&base, 1, "node-a", 10, Some(70), None);
        let m = merge_rows(rows_of(&[with_kinds, without]), vec![], opts(0));
        let text = render_merge(&m);
        let section = text
            .split("\nBy kind\n")
            .nth(1)
            .unwrap_or_else(|| panic!("no By kind section:\n{text}"));
        let lines: Vec<&str> = section.lines().take_while(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 2, "a header and rank 0 only:\n{text}");
        assert!(lines[0].contains("PARAMETERS") && lines[0].contains("ACTIVATIONS"));
        let rank0: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(rank0[0], "0");
        assert_eq!(rank0.last(), Some(&"activations"), "{}", lines[1]);
        assert!(lines[1].contains("60.00 GiB") && lines[1].contains("4.00 GiB"));
        let j = merge_json(&m);
        assert_eq!(j["rows"][0]["kinds"]["dominant"], "activations");
        assert_eq!(j["rows"][0]["kinds"]["optimizer_state_bytes"], 4u64 << 30);
        assert!(j["rows"][1]["kinds"].is_null());
        // No process with kinds: no section.
        let plain = rank_dump(&base, 1, "node-a", 10, Some(70), None);
        let m = merge_rows(rows_of(&[plain]), vec![], opts(0));
        assert!(!render_merge(&m).contains("By kind"));
    }

    #[test]
    fn rank_ranges_compress_sorted_ranks() {
        assert_eq!(rank_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(rank_ranges(&[4]), "4");
        assert_eq!(rank_ranges(&[1, 1, 2]), "1-2");
        assert_eq!(rank_ranges(&[]), "");
    }

    #[test]
    fn per_host_directories_are_merged_and_a_file_may_be_named() {
        let base = fixture("oom_own_allocations.json");
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write(
            a.path(),
            "r0.json",
            &rank_dump(&base, 0, "node-a", 10, Some(60), None),
        );
        write(
            b.path(),
            "r1.json",
            &rank_dump(&base, 1, "node-b", 70, Some(2), Some(1)),
        );
        let m = merge_dirs(&[a.path().into(), b.path().into()], opts(1000)).unwrap();
        assert_eq!(m.rows.len(), 2);
        assert_eq!(m.rows[m.first_failure.as_ref().unwrap().row].rank, Some(1));
        // The same dump through its directory and by name counts once.
        let m = merge_dirs(&[a.path().into(), a.path().join("r0.json")], opts(1000)).unwrap();
        assert_eq!(m.rows.len(), 1);
        let j = merge_json(&m);
        assert_eq!(j["rows"][0]["rank"], 0);
        assert!(j["first_failure"].is_null());
    }

    /// Not a timed test: prints how long merging 1,024 and 8,192 synthetic rank dumps takes
    /// (`cargo test --release --lib report::merge -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn measure_merge_of_1024_and_8192_ranks() {
        let small = fixture("oom_own_allocations.json");
        // As large as a dump gets by default: 50 holders and 50 sites, 64 frames each.
        let mut heavy = small.clone();
        let mut stack = heavy.largest_holders[0].stack.clone();
        while stack.len() < 64 {
            stack.extend_from_within(..stack.len().min(64 - stack.len()));
        }
        let mut holder = heavy.largest_holders[0].clone();
        holder.stack = stack.clone();
        heavy.largest_holders = vec![holder; 50];
        let mut site = heavy.sites[0].clone();
        site.stack = stack;
        heavy.sites = vec![site; 50];
        for (n, base) in [(1024u32, &small), (8192, &small), (1024, &heavy)] {
            let dir = tempfile::tempdir().unwrap();
            let bytes_each = serde_json::to_vec_pretty(base).unwrap().len();
            for r in 0..n {
                let host = format!("node-{:04}", r / 8);
                let sub = dir.path().join(&host);
                if r % 8 == 0 {
                    std::fs::create_dir(&sub).unwrap();
                }
                let d = if r == n / 3 {
                    rank_dump(base, r, &host, 79, Some(0), Some(1_800_000_000_000))
                } else {
                    rank_dump(base, r, &host, 20 + (r % 5) as u64, Some(50), None)
                };
                // Pretty, as the shim writes them.
                std::fs::write(
                    sub.join(format!("oomshim-{host}-{}-r{r}-1.json", 1000 + r)),
                    serde_json::to_vec_pretty(&d).unwrap(),
                )
                .unwrap();
            }
            let mut times = Vec::new();
            for _ in 0..3 {
                let start = std::time::Instant::now();
                let m = merge_dir(dir.path()).unwrap();
                let text = render_merge(&m);
                times.push(start.elapsed().as_secs_f64());
                assert_eq!(m.rows.len(), n as usize);
                assert!(text.contains(&format!("first to run out of memory: rank {}", n / 3)));
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "merge of {n} ranks ({} KiB each): median {:.3} s of 3 (min {:.3}, max {:.3})",
                bytes_each / 1024,
                times[1],
                times[0],
                times[2]
            );
        }
    }
}
