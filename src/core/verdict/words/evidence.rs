//! The verdict's own evidence: the dump's numbers every finding rests on, and the growth in a
//! few lines.

use super::count_word;
use super::fragmentation::dynamic_shapes_evidence;
use super::host_memory::pressure;
use super::other_processes::process_line;
use crate::verdict::context::Ctx;
use crate::verdict::sites::{short_label, site_name, MAX_FUNCTION};
use dump::model::{Dump, GrowthFit};
use dump::units::{bytes_with_exact, clean, human_bytes, percent, share, thousands};
use dump::view::{frame_label, free_blocks_available, named_frames};

/// The dump's numbers that every finding rests on.
pub(in crate::verdict) fn general_evidence(c: &Ctx) -> Vec<String> {
    let mut evidence = Vec::new();
    request(c, &mut evidence);
    device(c, &mut evidence);
    growth_evidence(c.dump, c.readings.growth_fit.as_ref(), &mut evidence);
    settings_and_burst(c, &mut evidence);
    cache_and_processes(c, &mut evidence);
    evidence
}

/// The failed request, its call, and the cap it was judged against.
fn request(c: &Ctx, evidence: &mut Vec<String>) {
    let (request, dev) = (c.request, c.dev);
    evidence.push(format!(
        "failed request: {} via {} on device {dev} (error {})",
        bytes_with_exact(request.bytes),
        clean(&request.api),
        request.error_code
    ));
    if let Some(frame) = named_frames(&request.stack).next() {
        evidence.push(format!(
            "failing call: {}",
            frame_label(frame, MAX_FUNCTION)
        ));
    }
    if c.cap.is_some() {
        evidence.push(format!(
            "{}: the device's numbers below are the cap's",
            c.place()
        ));
    }
}

/// The device's numbers: in use, tracked, free, untracked, and the largest site.
fn device(c: &Ctx, evidence: &mut Vec<String>) {
    let (request, n, dev, used, tracked) = (c.request, &c.n, c.dev, c.used, c.tracked);
    let req = &c.req;
    let when = if n.from_last_failure {
        " at the last failure of the burst"
    } else {
        ""
    };
    match (n.total, used) {
        (Some(total), Some(used)) => evidence.push(format!(
            "device {dev}{when}: {} of {} in use; {} tracked ({} of used)",
            human_bytes(used),
            human_bytes(total),
            human_bytes(tracked),
            percent(share(tracked, used))
        )),
        _ => {
            let total = n
                .total
                .map(|t| format!(" (total {})", human_bytes(t)))
                .unwrap_or_default();
            let tracked_text = match (n.tracked, n.count) {
                (Some(t), Some(c)) => format!(
                    "{} tracked in {}",
                    human_bytes(t),
                    count_word(c, "allocation", "allocations")
                ),
                (Some(t), None) => format!("{} tracked", human_bytes(t)),
                (None, _) => "no tracked numbers for this device".to_string(),
            };
            evidence.push(format!(
                "device {dev}: memory numbers unavailable{total}; {tracked_text}"
            ));
        }
    }
    if let Some(free) = n.free {
        let relation = if free >= request.bytes {
            "not less than"
        } else {
            "less than"
        };
        evidence.push(format!(
            "device {dev}{when}: {} free, {relation} the {req} request",
            human_bytes(free)
        ));
    }
    let untracked = used.map(|u| u.saturating_sub(tracked));
    if let (Some(untracked), Some(used)) = (untracked, used) {
        if untracked > 0 {
            evidence.push(format!(
                "untracked: {} of the {} in use ({})",
                human_bytes(untracked),
                human_bytes(used),
                percent(share(untracked, used))
            ));
        }
    }
    if let Some(top) = &c.top {
        let of_used = match used {
            Some(u) if u > 0 => format!(" ({} of used)", percent(share(top.site.bytes, u))),
            _ => String::new(),
        };
        evidence.push(format!(
            "top site: {} holds {} in {}{of_used}",
            top.label,
            human_bytes(top.site.bytes),
            count_word(top.site.count, "allocation", "allocations"),
        ));
    }
}

/// Low host memory, the allocator's setting, the devices holding memory, and the burst.
fn settings_and_burst(c: &Ctx, evidence: &mut Vec<String>) {
    let (dump, request) = (c.dump, c.request);
    if let Some(low) = &c.readings.host_low {
        evidence.push(pressure(low));
    }
    if let Some(conf) = c.readings.alloc_conf {
        evidence.push(format!("PYTORCH_CUDA_ALLOC_CONF={}", clean(conf)));
    }
    let devices_holding = dump.devices.iter().filter(|d| d.tracked_bytes > 0).count();
    if devices_holding > 1 && c.top.is_some() {
        evidence.push(format!(
            "{devices_holding} devices hold tracked memory; sites are not split by device"
        ));
    }
    if request.failures_in_burst > 1 {
        evidence.push(format!(
            "failures in this burst: {}",
            thousands(request.failures_in_burst.into())
        ));
    }
    if let Some(last) = &request.last_failure {
        let mut text = format!(
            "last failure of the burst: {} via {}",
            human_bytes(last.bytes),
            clean(&last.api)
        );
        match (last.free_bytes, last.total_bytes) {
            (Some(free), Some(total)) => {
                text += &format!("; {} free of {}", human_bytes(free), human_bytes(total))
            }
            (Some(free), None) => text += &format!("; {} free", human_bytes(free)),
            _ => {}
        }
        text += &format!("; {} tracked", human_bytes(last.tracked_bytes));
        evidence.push(text);
    }
}

/// The framework's free blocks and cache, dynamic shapes, whether a retry recovered, and the
/// other processes on the device.
fn cache_and_processes(c: &Ctx, evidence: &mut Vec<String>) {
    let (dump, request, dev) = (c.dump, c.request, c.dev);
    let fb = &dump.free_blocks;
    if free_blocks_available(dump) {
        if let (Some(total), Some(largest)) = (fb.total_free_bytes, fb.largest_free_bytes) {
            let frag = fb
                .fragmentation
                .filter(|f| f.is_finite())
                .map(|f| format!(" ({} fragmentation)", percent(Some(f * 100.0))))
                .unwrap_or_default();
            evidence.push(format!(
                "free blocks ({}): {} free, largest block {}{frag}",
                clean(&fb.source),
                human_bytes(total),
                human_bytes(largest)
            ));
        }
        if let (Some(reserved), Some(allocated)) = (fb.reserved_bytes, fb.allocated_bytes) {
            evidence.push(format!(
                "framework cache: {} reserved, {} allocated, {} reserved but unallocated{}",
                human_bytes(reserved),
                human_bytes(allocated),
                human_bytes(reserved.saturating_sub(allocated)),
                fb.inactive_split_bytes
                    .map(|b| format!(" ({} inactive split)", human_bytes(b)))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(d) = &c.readings.dynamic_shapes {
        evidence.push(dynamic_shapes_evidence(d));
    }
    evidence.push(
        match request.recovered {
            Some(true) => {
                "recovered: yes, a later request of at least this size succeeded (the retry worked)"
            }
            Some(false) => {
                "recovered: no, no later request of this size succeeded (the program saw the error)"
            }
            None => "recovered: unknown (the dump was written before a retry could be seen)",
        }
        .to_string(),
    );
    match dump.gpu_processes.as_ref().filter(|g| g.device == dev) {
        Some(g) if g.error.is_some() => evidence.push(format!(
            "other processes on device {dev}: unknown ({})",
            clean(g.error.as_deref().unwrap_or(""))
        )),
        Some(g) => {
            for p in g.processes.iter().take(5) {
                evidence.push(process_line(p, dev));
            }
        }
        None => {}
    }
}

/// The growth in a few lines: how steps were found, the process's fit (`fit`, as the rules
/// fitted it), the growing sites (at most 3), from the dump's `growth`.
pub(in crate::verdict) fn growth_evidence(
    dump: &Dump,
    fit: Option<&GrowthFit>,
    evidence: &mut Vec<String>,
) {
    let Some(g) = &dump.growth else { return };
    if let (Some("detected"), Some(d)) = (g.steps.as_deref(), &g.detected) {
        evidence.push(format!(
            "steps detected automatically (no step marks): a cycle of {}, anchored at {}; {}",
            count_word(d.period, "allocation", "allocations"),
            short_label(&d.anchor),
            count_word(d.steps, "step", "steps")
        ));
    }
    let unit = clean(&g.unit);
    if let Some(f) = fit {
        evidence.push(format!(
            "growth of the process: {} per {unit} (R² {:.2} over {} samples, {} at {unit} {} to {} at {unit} {})",
            human_bytes(f.bytes_per_step),
            f.r_squared,
            f.samples,
            human_bytes(f.first.bytes),
            f.first.step,
            human_bytes(f.last.bytes),
            f.last.step,
        ));
    }
    for site in g.sites.iter().take(3) {
        let projected = site
            .projected_oom_step
            .map(|p| format!("; free memory runs out at {unit} {p} at this rate"))
            .unwrap_or_default();
        let share = site
            .share
            .map(|s| format!(", {} of the growth", percent(Some(s * 100.0))))
            .unwrap_or_default();
        evidence.push(format!(
            "growth: {} adds {} per {unit} (R² {:.2} over {} samples{share}, {} at {unit} {} to {} at {unit} {}){projected}",
            site_name(site),
            human_bytes(site.bytes_per_step),
            site.r_squared,
            site.samples,
            human_bytes(site.first.bytes),
            site.first.step,
            human_bytes(site.last.bytes),
            site.last.step,
        ));
    }
}
