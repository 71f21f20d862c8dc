//! The words of the post-mortem kinds ([`HOST_OOM_KILL`], [`KILLED_BY_SIGNAL`],
//! [`EXITED_AFTER_FAILURE`]) and of a device leak in a post-mortem dump.

use super::leak::LEAK_SITES_NAMED;
use super::steps_word;
use crate::verdict::found::{Death, Ended, LeakFinding, Readings};
use crate::verdict::names::{EXITED_AFTER_FAILURE, HOST_OOM_KILL, KILLED_BY_SIGNAL, LEAK};
use crate::verdict::sites::short_label;
use dump::model::{Dump, Finding, PostMortem};
use dump::units::{clean, human_bytes, percent};

/// The death's headline and summary, with the device leak's after them.
pub(in crate::verdict) fn add_leak(death: &mut Finding, l: &Finding) {
    death.headline = format!(
        "{}; device memory was growing: {}",
        death.headline, l.headline
    );
    death.summary = format!("{} {}", death.summary, l.summary);
}

/// The evidence line that says where the dump's state came from.
pub(in crate::verdict) fn reconstructed(pm: &PostMortem) -> String {
    if pm.generation == 0 {
        return format!(
            "the program published no live summary before it died{}: the dump holds how it died and the host's memory, \
             nothing of its device memory",
            ran_for(pm)
        );
    }
    let published_ago = pm.died_unix_ms.saturating_sub(pm.published_unix_ms);
    format!(
        "reconstructed from the state the program last published, {:.1} s before it died (publish {}{})",
        published_ago as f64 / 1000.0,
        pm.generation,
        if pm.from_previous {
            "; the newest publish was torn"
        } else {
            ""
        }
    )
}

/// ` 0.3 s after it started`, when the start is known.
fn ran_for(pm: &PostMortem) -> String {
    pm.started_unix_ms
        .map(|start| {
            format!(
                " {:.1} s after it started",
                pm.died_unix_ms.saturating_sub(start) as f64 / 1000.0
            )
        })
        .unwrap_or_default()
}

/// The finding of how the program died. `leak`: a device leak will be added to it (`add_leak`),
/// which names the growing site itself.
pub(in crate::verdict) fn death_finding(
    dump: &Dump,
    pm: &PostMortem,
    ended: &Ended,
    readings: &Readings,
    leak: bool,
) -> Finding {
    let device_words = device_words(dump, pm, readings, leak);
    let host_words = host_words(pm, ended);
    let sig_name = clean(pm.signal_name.as_deref().unwrap_or_default());
    let holds = if pm.generation == 0 {
        "The dump holds what oomshim run saw of its death."
    } else {
        "The dump holds the device memory as the program last published it."
    };
    let (kind, headline, summary, suggestions) = match ended.death {
        Death::OomKilled => (
            HOST_OOM_KILL,
            format!("killed by the kernel's OOM killer (SIGKILL): {host_words}"),
            format!(
                "The kernel's OOM killer ended the program: its cgroup counted a new oom_kill when it died by SIGKILL. Host memory ran out, not device memory; {device_words}."
            ),
            vec![
                "Find what grows in host memory: DataLoader workers (lower num_workers or prefetch_factor), tensors kept on the CPU, lists of batches or losses kept across steps.".to_string(),
                "Raise the job's host memory limit (memory.max of its cgroup, the scheduler's --mem) if the working set is simply larger.".to_string(),
            ],
        ),
        Death::Signalled(sig) => signalled(
            sig,
            &sig_name,
            ended.oom_kill_counted,
            &device_words,
            &host_words,
            holds,
        ),
        Death::Unseen => {
            let cause = "ended by a signal (which one is not known: its parent reaped it first)";
            (
                KILLED_BY_SIGNAL,
                format!("{cause}; {device_words}"),
                format!(
                    "The program {cause}; {device_words}; {host_words}. The dump holds the device memory as the program last published it."
                ),
                vec!["A scheduler kills a job that exceeds its memory or time limit with SIGKILL: check the job's log for its limit.".to_string()],
            )
        }
        Death::Exited => (
            EXITED_AFTER_FAILURE,
            format!(
                "exited with status {} right after a failed device allocation; {device_words}",
                pm.exit_code.unwrap_or_default()
            ),
            format!(
                "The program exited with status {} without a dump of its last failed device allocation; the dump holds the device memory as last published.",
                pm.exit_code.unwrap_or_default()
            ),
            vec!["Set OOMSHIM_SETTLE=0 so the dump is written before the failing call returns.".to_string()],
        ),
    };
    Finding {
        kind: kind.to_string(),
        bytes: readings.tracked_all,
        headline,
        summary,
        evidence: death_evidence(pm),
        suggestions,
    }
}

/// A death by a signal other than the OOM killer's: a crash, a SIGKILL from outside, or another
/// signal; as (kind, headline, summary, suggestions).
fn signalled(
    sig: i32,
    sig_name: &str,
    counted: Option<bool>,
    device_words: &str,
    host_words: &str,
    holds: &str,
) -> (&'static str, String, String, Vec<String>) {
    let cause = match sig {
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGABRT => {
            format!("crashed with {sig_name}")
        }
        libc::SIGKILL => format!(
            "killed by SIGKILL from outside ({})",
            match counted {
                Some(false) => "not the kernel's OOM killer: its cgroup counted no OOM kill",
                _ => "the cgroup's OOM kills could not be read",
            }
        ),
        _ => format!("ended by {sig_name} from outside"),
    };
    (
        KILLED_BY_SIGNAL,
        format!("{cause}; {device_words}"),
        format!("The program was {cause}; {device_words}; {host_words}. {holds}"),
        if sig == libc::SIGKILL {
            vec!["A scheduler kills a job that exceeds its memory or time limit with SIGKILL: check the job's log for its limit.".to_string()]
        } else {
            Vec::new()
        },
    )
}

/// The evidence of how the program ended: the signal or status, who reaped it, the cgroup's
/// OOM kills and limit, the host's memory and the program's resident size.
fn death_evidence(pm: &PostMortem) -> Vec<String> {
    let h = &pm.host;
    let mut evidence = Vec::new();
    match (&pm.signal, &pm.signal_name) {
        (Some(sig), Some(name)) => evidence.push(format!(
            "ended by {} (signal {sig}){}",
            clean(name),
            if pm.core_dumped { ", core dumped" } else { "" }
        )),
        _ => match pm.exit_code {
            Some(code) => evidence.push(format!("exited with status {code}")),
            None => evidence.push(format!(
                "how it ended is not known: its parent{} reaped it before oomshim could read its status; it ran no exit handler (its live region was left behind), so a signal ended it",
                pm.reaped_by.map(|p| format!(" (PID {p})")).unwrap_or_default()
            )),
        },
    }
    if let (Some(parent), Some(_)) = (pm.reaped_by, pm.signal.or(pm.exit_code)) {
        evidence.push(format!(
            "its parent (PID {parent}) reaped it; oomshim read its status first"
        ));
    }
    if let (Some(b), Some(a)) = (h.oom_kill_before, h.oom_kill_after) {
        evidence.push(format!(
            "cgroup {}: memory.events oom_kill {b} at the start, {a} after the death",
            clean(h.cgroup.as_deref().unwrap_or("?"))
        ));
    }
    if let Some(max) = h.memory_max {
        evidence.push(format!(
            "cgroup memory.max {}; memory.peak {}",
            human_bytes(max),
            h.memory_peak
                .map(human_bytes)
                .unwrap_or_else(|| "unknown".into())
        ));
    }
    if let (Some(total), Some(avail)) = (h.mem_total, h.mem_available) {
        evidence.push(format!(
            "host: {} available of {} after the death",
            human_bytes(avail),
            human_bytes(total)
        ));
    }
    if let (Some(first), Some(last)) = (pm.rss.first(), pm.rss.last()) {
        evidence.push(format!(
            "the program's resident host memory: {} → {} over its last {} publishes",
            human_bytes(first.bytes),
            human_bytes(last.bytes),
            pm.rss.len()
        ));
    }
    evidence
}

/// What the device memory was: the failed allocation, not full, or not known; growth over time
/// that is no leak, else the largest site (a leak is added after, and names its own site).
fn device_words(dump: &Dump, pm: &PostMortem, readings: &Readings, leak: bool) -> String {
    let tracked = readings.tracked_all;
    let peak: u64 = dump.devices.iter().map(|d| d.peak_tracked_bytes).sum();
    let device_words = match &pm.last_failure {
        None if pm.generation == 0 => format!(
            "its device memory is not known: it died{}, before its first live summary",
            ran_for(pm)
        ),
        Some(f) => format!(
            "its last device allocation ({} of {} on device {}) had failed{}",
            human_bytes(f.bytes),
            clean(&f.api),
            f.device,
            match &f.dump {
                Some(d) => format!(" (dump {})", clean(d)),
                None => ", and no dump of it was written".into(),
            }
        ),
        None => format!(
            "device memory was not full: no device allocation had failed ({} tracked, peak {})",
            human_bytes(tracked),
            human_bytes(peak),
        ),
    };
    // What the device memory is: growth over time that is no leak, said with its numbers (a
    // program killed during its start-up spike shows what it was doing), else the site that
    // holds the most (a leak is added after, by `add_leak`, and names its own site).
    let growth = match &readings.not_a_leak {
        Some(o) if !leak => Some(super::leak::not_a_leak(o)),
        _ => None,
    };
    match (&pm.last_failure, growth) {
        (_, Some(g)) => format!("{device_words}; {g}"),
        (None, None) if pm.generation > 0 && !leak => {
            format!("{device_words}{}", largest_site(dump))
        }
        _ => device_words,
    }
}

/// What the host memory did: grew per step or second, or what the program held.
fn host_words(pm: &PostMortem, ended: &Ended) -> String {
    match ended.host_growth {
        Some((rate, unit)) => format!(
            "host memory grew {} per {unit} (the program's resident size)",
            human_bytes(rate)
        ),
        None => match pm.rss.last() {
            Some(l) => format!("the program held {} of host memory", human_bytes(l.bytes)),
            None => "host memory was not sampled".into(),
        },
    }
}

/// `; the largest site, grow_cache (prog.c:12), holds 640.00 MiB in 20 allocations`: the site
/// holding the most tracked memory, when the dump names one.
fn largest_site(dump: &Dump) -> String {
    dump.sites
        .iter()
        .max_by_key(|s| s.bytes)
        .filter(|s| s.bytes > 0)
        .map(|s| {
            format!(
                "; the largest site, {}, holds {} in {}",
                short_label(&s.stack),
                human_bytes(s.bytes),
                super::count_word(s.count, "allocation", "allocations")
            )
        })
        .unwrap_or_default()
}

/// The device leak of a post-mortem dump, in the leak finding's terms.
pub(in crate::verdict) fn leak(l: &LeakFinding) -> Finding {
    if l.over_time {
        return leak_over_time(l);
    }
    let steps_word = steps_word(l.growth.steps.as_deref());
    let named = l
        .named
        .map(|(s, share)| (short_label(&s.stack), s.bytes_per_step, share));
    let headline = match &named {
        Some((label, rate, share)) => format!(
            "leak: {label} grows by {} every step (over the last {} {}; {} of the growth)",
            human_bytes(*rate),
            l.fit.samples,
            steps_word,
            percent(Some(*share * 100.0))
        ),
        None => format!(
            "leak: the process grows by {} every step (over the last {} {})",
            human_bytes(l.fit.bytes_per_step),
            l.fit.samples,
            steps_word
        ),
    };
    Finding {
        kind: LEAK.to_string(),
        bytes: l.grown,
        summary: format!(
            "{headline}. Device memory was growing step after step when the program died; it would have run out of device memory next."
        ),
        headline,
        evidence: site_evidence(l, "step"),
        suggestions: vec![
            "Free what each step keeps: tensors appended to lists, losses kept without .item(), outputs held across steps.".to_string(),
        ],
    }
}

/// A leak by step that torch's own records name (`verdict::leak::recorded`, the rule the
/// out-of-memory verdict uses too): under preload the shim sees torch's segments, which the
/// allocator may cut during the optimizer step, so its site can name `opt.step()` where the
/// records name the line that keeps tensors.
pub(in crate::verdict) fn leak_by_records(l: &LeakFinding) -> Option<Finding> {
    let r = l.records.as_ref().filter(|r| r.names_it)?;
    let (a, share) = (r.attribution, r.share);
    let line = &a.lines[0];
    let label = super::leak::recorded_label(line);
    let mut f = leak(l);
    let headline = if r.spread {
        // No line holds the growth, by the records either: say how it is spread.
        format!(
            "leak: the process grows by {} every step (over the last {} {}), spread over lines (torch's records of the tensors allocated since it began): {}",
            human_bytes(l.fit.bytes_per_step),
            l.fit.samples,
            steps_word(l.growth.steps.as_deref()),
            super::leak::recorded_parts(a),
        )
    } else {
        format!(
            "leak: {label} holds the growth ({} of the tensors allocated since it began, by torch's records): the process grows by {} every step (over the last {} {})",
            percent(Some(share * 100.0)),
            human_bytes(l.fit.bytes_per_step),
            l.fit.samples,
            steps_word(l.growth.steps.as_deref()),
        )
    };
    f.summary = format!(
        "{headline}. Device memory was growing step after step when the program died; it would have run out of device memory next."
    );
    f.evidence.insert(
        0,
        format!(
            "torch's records (its allocation history, on since the growth was seen): {} at {label} of {} recorded",
            human_bytes(line.bytes),
            human_bytes(a.recorded_bytes)
        ),
    );
    f.headline = headline;
    Some(f)
}

/// One line per growing site: `label: +rate per UNIT, share of the growth`.
fn site_evidence(l: &LeakFinding, unit: &str) -> Vec<String> {
    l.sites
        .iter()
        .take(LEAK_SITES_NAMED)
        .map(|(s, share)| {
            format!(
                "{}: +{} per {unit}, {} of the growth",
                short_label(&s.stack),
                human_bytes(s.bytes_per_step),
                percent(Some(*share * 100.0))
            )
        })
        .collect()
}

/// The same, for growth judged over time (the program marked no steps and repeated none).
fn leak_over_time(l: &LeakFinding) -> Finding {
    let named = l
        .named
        .map(|(s, share)| (short_label(&s.stack), s.bytes_per_step, share));
    let over = format!(
        "steadily {}, R² {:.2}",
        super::leak::over_time_span(l),
        l.fit.r_squared
    );
    let headline = match &named {
        Some((label, rate, share)) => format!(
            "leak: {label} grows by {} every second ({over}; {} of the growth)",
            human_bytes(*rate),
            percent(Some(*share * 100.0))
        ),
        None => format!(
            "leak: the process grows by {} every second ({over})",
            human_bytes(l.fit.bytes_per_step)
        ),
    };
    let runs_out = l
        .growth
        .free_bytes
        .and_then(|free| super::leak::seconds_left(free, l.fit.bytes_per_step))
        .map(|t| format!(" At that rate the device's free memory would have run out in {t}."))
        .unwrap_or_default();
    Finding {
        kind: LEAK.to_string(),
        bytes: l.grown,
        summary: format!(
            "{headline}. Device memory was growing steadily over time when the program died (it marks no steps, so \
             growth is measured per second{}).{runs_out}",
            if l.timeline.is_some() {
                ", from when each allocation it still held was made"
            } else {
                ""
            }
        ),
        headline,
        evidence: site_evidence(l, "second"),
        suggestions: vec![
            "Free what the program keeps allocating (a `cudaFree` for each `cudaMalloc`), or mark steps with `oomshim_step()` / `oomshim.step()` so growth is judged per step.".to_string(),
        ],
    }
}
