//! The words of [`SNAPSHOT`]: what each device held, the largest site, the pinned host memory.

use super::count_word;
use super::evidence::growth_evidence;
use crate::verdict::found::{Held, Readings};
use crate::verdict::names::SNAPSHOT;
use dump::model::{Dump, Finding, Verdict};
use dump::units::{clean, human_bytes, percent, share};
use dump::view::used_bytes;

/// The verdict of a dump without a failed request.
pub(in crate::verdict) fn verdict(dump: &Dump, held: Held, readings: &Readings) -> Verdict {
    let evidence = evidence(dump, &held, readings);
    let Held {
        tracked,
        count,
        holding,
        top,
    } = held;

    let reason = clean(&dump.reason);
    let opening = if dump.reason == "oom" {
        "The dump says out-of-memory but records no failed request; here is what was held."
            .to_string()
    } else {
        format!("On-demand dump ({reason}).")
    };
    let held = format!(
        " This process holds {} of tracked device memory in {} on {}.",
        human_bytes(tracked),
        count_word(count, "allocation", "allocations"),
        count_word(holding as u64, "device", "devices")
    );
    let site = match &top {
        Some(top) => format!(
            " The largest allocation site, {}, holds {} in {} ({} of tracked).",
            top.label,
            human_bytes(top.site.bytes),
            count_word(top.site.count, "allocation", "allocations"),
            percent(share(top.site.bytes, tracked))
        ),
        None => " No allocation sites were recorded.".to_string(),
    };
    let suggestions = vec![
        "To find a leak, take dumps at two points of the run and compare the sites: one whose bytes grow with the step count keeps memory alive across steps."
            .to_string(),
    ];
    let summary = format!("{opening}{held}{site}");
    let headline = format!(
        "{}: {} tracked in {} on {}",
        if dump.reason == "oom" {
            "out-of-memory dump without a failed request"
        } else {
            "on-demand dump"
        },
        human_bytes(tracked),
        count_word(count, "allocation", "allocations"),
        count_word(holding as u64, "device", "devices")
    );
    let findings = vec![Finding {
        kind: SNAPSHOT.to_string(),
        bytes: tracked,
        headline,
        summary: summary.clone(),
        evidence: Vec::new(),
        suggestions: suggestions.clone(),
    }];
    Verdict {
        kind: SNAPSHOT.to_string(),
        summary,
        evidence,
        suggestions,
        findings,
        retry: None,
    }
}

/// What each device held, the largest site, the growth and the pinned host memory.
fn evidence(dump: &Dump, held: &Held, readings: &Readings) -> Vec<String> {
    let mut evidence = Vec::new();
    for d in &dump.devices {
        let mut line = format!("device {}: ", d.index);
        match (d.total_bytes, used_bytes(d.total_bytes, d.free_bytes)) {
            (Some(total), Some(used)) => {
                line += &format!(
                    "{} of {} in use; {} tracked ({} of used)",
                    human_bytes(used),
                    human_bytes(total),
                    human_bytes(d.tracked_bytes),
                    percent(share(d.tracked_bytes, used))
                )
            }
            _ => {
                line += &format!(
                    "memory numbers unavailable; {} tracked",
                    human_bytes(d.tracked_bytes)
                )
            }
        }
        line += &format!(
            " in {}, peak {}",
            count_word(d.tracked_count, "allocation", "allocations"),
            human_bytes(d.peak_tracked_bytes)
        );
        evidence.push(line);
    }
    if let Some(top) = &held.top {
        evidence.push(format!(
            "top site: {} holds {} in {} ({} of tracked)",
            top.label,
            human_bytes(top.site.bytes),
            count_word(top.site.count, "allocation", "allocations"),
            percent(share(top.site.bytes, held.tracked)),
        ));
    }
    growth_evidence(dump, readings.growth_fit.as_ref(), &mut evidence);
    if dump.pinned_host.bytes > 0 {
        evidence.push(format!(
            "pinned host memory: {} in {} (not device memory)",
            human_bytes(dump.pinned_host.bytes),
            count_word(dump.pinned_host.count, "allocation", "allocations")
        ));
    }
    evidence
}
