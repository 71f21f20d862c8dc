//! The words of [`LEAK`]: the growing site or the process's growth, its rate and projection, how
//! steps were found, and what to change in the program's framework.

use super::{count_word, new_finding, segment_note, steps_word};
use crate::verdict::context::{tracked_all, Ctx};
use crate::verdict::framework::{framework, Framework};
use crate::verdict::leak::LeakFinding;
use crate::verdict::names::LEAK;
use crate::verdict::sites::{short_label, site_name};
use crate::verdict::LEAK_NAMED_SHARE;
use dump::model::{AttributedLine, Finding, GrowthSite};
use dump::units::{clean, human_bytes, percent, share, thousands, truncate_function};

/// Sites named with their share in a leak's summary.
pub(in crate::verdict) const LEAK_SITES_NAMED: usize = 3;

/// `42% (12.00 MiB per step) at forward (model.py:9)`; `unit` is `step` or, for growth judged
/// over time, `second`.
pub(in crate::verdict) fn share_text(site: &GrowthSite, share: f64, unit: &str) -> String {
    format!(
        "{} ({} per {unit}) at {}",
        percent(Some((share * 100.0).min(100.0))),
        human_bytes(site.bytes_per_step),
        site_name(site)
    )
}

pub(in crate::verdict) fn finding(c: &Ctx, l: &LeakFinding) -> Finding {
    if l.over_time {
        return finding_over_time(c, l);
    }
    let g = l.growth;
    let steps_word = steps_word(g.steps.as_deref());
    let fw = framework(c.dump);
    let rate = human_bytes(l.fit.bytes_per_step);
    let n_steps = thousands(l.fit.samples);
    let projected = g.projected_oom_step;
    let top = l
        .sites
        .first()
        .filter(|(_, share)| *share >= LEAK_NAMED_SHARE);
    let parts: Vec<String> = l
        .sites
        .iter()
        .take(LEAK_SITES_NAMED)
        .map(|(s, share)| share_text(s, *share, "step"))
        .collect();
    // The step in progress at the failure: when the projection is later, a request larger than
    // one step's growth came first.
    let failing_step = g.current + 1;
    let runs_out = match projected {
        Some(p) if p > failing_step => format!(
            "; free memory would run out at step {p}, but the {} request failed earlier, in step {failing_step}",
            c.req
        ),
        Some(p) => format!("; free memory runs out at step {p}"),
        None => String::new(),
    };
    // Under preload oomshim sees torch's segments: when its sites name no line of the program
    // (new segments come from the backward pass), torch's own records of where the live tensors
    // were allocated, kept since the growth began, name the line.
    let by_records = crate::verdict::leak::recorded(l, c.dump);
    let recorded = by_records.as_ref().map(|r| r.attribution);
    let named_by_records = by_records.as_ref().filter(|r| r.names_it);
    let headline = match (top, named_by_records) {
        // No line holds the growth, by the records either: say how it is spread.
        (_, Some(r)) if r.spread() => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far), spread over lines \
             (torch's records of the tensors allocated since it began): {}{runs_out}",
            steps_word,
            human_bytes(l.grown),
            recorded_parts(r.attribution),
        ),
        (_, Some(r)) => {
            let a = r.attribution;
            let line = &a.lines[0];
            format!(
                "{} holds the growth ({} of the tensors allocated since it began, by torch's records): the process grows by \
                 {rate} every step (over the last {n_steps} {}; {} so far){runs_out}",
                recorded_label(line),
                percent(share(line.bytes, a.recorded_bytes)),
                steps_word,
                human_bytes(l.grown),
            )
        }
        _ => match top {
        Some((site, share)) => format!(
            "{} grows by {} every step (over the last {n_steps} {}; {} so far, {} of the growth){runs_out}",
            site_name(site),
            human_bytes(site.bytes_per_step),
            steps_word,
            human_bytes(l.grown),
            percent(Some((share * 100.0).min(100.0))),
        ),
        None if !parts.is_empty() => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far), spread over sites: {}{runs_out}",
            steps_word,
            human_bytes(l.grown),
            parts.join(", ")
        ),
        None => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far){runs_out}",
            steps_word,
            human_bytes(l.grown)
        ),
        },
    };
    // The program's container that holds the leaked tensors, and its own forward hook, when the
    // hook found them: what keeps the growth, next to the line that allocated it.
    let kinds = crate::verdict::kinds::kinds_of(c.dump);
    let headline = match kinds.and_then(super::kinds::container_keeper) {
        Some(held) => format!("{headline}; held in {held}"),
        None => headline,
    };
    let keeper = kinds.and_then(super::kinds::hook_keeper);
    let headline = match &keeper {
        Some(k) => format!("{headline}; possibly kept by {k}"),
        None => headline,
    };
    let records = recorded
        .map(|a| {
            format!(
                " torch's records of the {} of tensors allocated since the growth began put {}.",
                human_bytes(a.recorded_bytes),
                recorded_parts(a)
            )
        })
        .unwrap_or_default();
    let how = match (&l.detected, g.steps.as_deref()) {
        (Some(d), _) => format!(
            " Steps were detected automatically (the program marks none): a cycle of {} repeats, \
             anchored at {}; {} of {} sampled intervals freed working memory.",
            count_word(d.period, "allocation", "allocations"),
            short_label(&d.anchor),
            thousands(d.freeing_intervals),
            thousands(d.intervals)
        ),
        (None, Some("optimizer")) => {
            " Steps are the program's optimizer steps (marked by oomshim's Python hook)."
                .to_string()
        }
        (None, Some("forward")) => {
            " Steps are forward passes of the program's outermost module (marked by \
             oomshim's Python hook): an evaluation or inference loop."
                .to_string()
        }
        _ => String::new(),
    };
    let named = if parts.is_empty() {
        " No single site carries the growth (it is spread over more sites than are kept)."
            .to_string()
    } else {
        format!(" The growth per step comes from: {}.", parts.join("; "))
    };
    let projection = match projected {
        Some(p) => {
            let next = g.current + 1;
            if p > next {
                format!(
                    " At that rate the device's free memory would run out at step {p}; the failure came earlier, at step \
                     {next}, because the failed request of {} is larger than what was still free.",
                    c.req
                )
            } else {
                format!(" At that rate the device's free memory runs out at step {p}.")
            }
        }
        None => String::new(),
    };
    let mut f = new_finding(
        LEAK,
        l.grown,
        headline,
        format!(
            "A leak: {} grows by {rate} every step ({n_steps} {} observed, from {} at step {} to \
             {} at step {}, R² {:.2}), and it was still that high when {} more was requested on device {}.{named}{records}{projection}{how}{}",
            if l.fit.of.as_deref() == Some("framework_live") {
                "the memory of torch's live tensors (its `memory_allocated()` at every step)"
            } else {
                "this process's tracked memory"
            },
            steps_word,
            human_bytes(l.fit.first.bytes),
            l.fit.first.step,
            human_bytes(l.fit.last.bytes),
            l.fit.last.step,
            l.fit.r_squared,
            c.req,
            c.dev,
            segment_note(c.dump),
        ),
    );
    f.evidence.push(format!(
        "growth of the process: {rate} per step (R² {:.2} over {} {}), {} from step {} to {}; {} tracked at the failure",
        l.fit.r_squared,
        n_steps,
        steps_word,
        human_bytes(l.fit.last.bytes.saturating_sub(l.fit.first.bytes)),
        l.fit.first.step,
        l.fit.last.step,
        human_bytes(tracked_all(c.dump))
    ));
    for (site, share) in l.sites.iter().take(LEAK_SITES_NAMED) {
        f.evidence.push(format!(
            "growth: {} ({} of it, R² {:.2}, {} at step {} to {} at step {})",
            share_text(site, *share, "step"),
            percent(Some((share * 100.0).min(100.0))),
            site.r_squared,
            human_bytes(site.first.bytes),
            site.first.step,
            human_bytes(site.last.bytes),
            site.last.step
        ));
    }
    if let Some(d) = &l.detected {
        f.evidence.push(format!(
            "steps: detected, not marked (a cycle of {}; {}; {} since the last)",
            count_word(d.period, "allocation", "allocations"),
            count_word(d.steps, "step", "steps"),
            count_word(d.allocations_since_last_step, "allocation", "allocations")
        ));
    } else {
        f.evidence.push(format!(
            "steps: {}",
            match g.steps.as_deref() {
                Some("optimizer") =>
                    "optimizer steps (torch.optim), marked by oomshim's Python hook",
                Some("forward") =>
                    "forward passes of the outermost module, marked by oomshim's Python hook",
                _ => "marked by the program (oomshim_step)",
            }
        ));
    }
    // What the advice asks to look at: the line or site that holds the growth, or, when it is
    // spread, each of those the headline lists (never the first of them as if it were the leak).
    let label = match (named_by_records, top) {
        (Some(r), _) if r.spread() => "each of the lines named above".to_string(),
        (Some(r), _) => recorded_label(&r.attribution.lines[0]),
        (None, Some((s, _))) => site_name(s),
        (None, None) if !l.sites.is_empty() => "each of the sites named above".to_string(),
        (None, None) => "each step".to_string(),
    };
    if let Some(k) = &keeper {
        f.suggestions.push(format!(
            "{k} runs on every forward pass: if it stores the outputs (in a list or dict), they stay on the device with              their autograd graph; store `output.detach().cpu()` or a number (`.item()`), or remove the hook."
        ));
    }
    if let Some(k) = kinds {
        f.evidence.extend(super::kinds::evidence(c, k));
    }
    f.suggestions.extend(leak_advice(fw, &label));
    if l.detected.is_some() {
        f.suggestions.push(match fw {
            Framework::Native => {
                "Mark steps with `oomshim_step()` (from `liboomshim.so`) to confirm the growth per step.".to_string()
            }
            _ => "Mark steps with `oomshim.step()` to confirm the growth per step.".to_string(),
        });
    }
    f
}

/// Seconds until `free` bytes are used up at `rate` bytes a second, in words (`about 12 s`).
pub(in crate::verdict) fn seconds_left(free: u64, rate: u64) -> Option<String> {
    (rate > 0).then(|| {
        let s = free as f64 / rate as f64;
        if s < 1.0 {
            "less than a second".to_string()
        } else {
            format!("about {} s", thousands(s.round() as u64))
        }
    })
}

/// How long growth over time was measured, for a headline: `over its last 2.7 s, 67
/// allocations kept` (from the allocation timeline) or `over the last 12 seconds` (one-second
/// samples, dumps of older versions).
pub(in crate::verdict) fn over_time_span(l: &LeakFinding) -> String {
    match l.timeline {
        Some(t) => format!(
            "over its last {}, {} kept",
            seconds(t.span_ms),
            count_word(t.allocations, "allocation", "allocations")
        ),
        None => format!("over the last {} seconds", thousands(l.fit.samples)),
    }
}

/// `2.7 s`.
pub(in crate::verdict) fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// How the growth over time was measured, in a sentence (the summary's parenthesis).
fn over_time_how(l: &LeakFinding, r2: f64) -> String {
    match l.timeline {
        Some(t) => format!(
            "fitted from the live allocations' own timestamps: {} made over the last {} and still held, from {} at              second {} to {} at second {} of the program, R² {r2:.2}{}",
            count_word(t.allocations, "allocation", "allocations"),
            seconds(t.span_ms),
            human_bytes(l.fit.first.bytes),
            l.fit.first.step,
            human_bytes(l.fit.last.bytes),
            l.fit.last.step,
            match &t.kept_check {
                Some(k) => format!(
                    "; sampled with its frees, the tracked bytes grew {} over {} of it",
                    human_bytes(k.actual_bytes.max(0) as u64),
                    seconds(k.over_ms)
                ),
                None => String::new(),
            }
        ),
        None => format!(
            "{} one-second samples, from {} at second {} to {} at second {} of the program, R² {r2:.2}",
            thousands(l.fit.samples),
            human_bytes(l.fit.first.bytes),
            l.fit.first.step,
            human_bytes(l.fit.last.bytes),
            l.fit.last.step
        ),
    }
}

/// Growth over time that is no leak, in one line with its numbers (the post-mortem's device
/// words, the out-of-memory verdict's evidence, `oomshim top`).
pub(in crate::verdict) fn not_a_leak(o: &crate::verdict::OverTime) -> String {
    use crate::verdict::NotALeak;
    let label = o
        .top
        .map(|s| short_label(&s.stack))
        .unwrap_or_else(|| "the process".to_string());
    let rate = human_bytes(o.top.map_or(o.fit.bytes_per_step, |s| s.bytes_per_step));
    let grown = human_bytes(o.fit.last.bytes.saturating_sub(o.fit.first.bytes));
    let t = o.timeline;
    match &o.why {
        NotALeak::Young => format!(
            "growing: {label} +{rate} per second over its {}, {} kept (too little to call it a leak: {}; a leak is judged once the program has allocated for {}, over {} allocations)",
            seconds(t.span_ms),
            count_word(t.allocations, "allocation", "allocations"),
            if t.age_ms < crate::verdict::TIMELINE_MIN_SPAN_MS {
                format!("it began allocating {} ago", seconds(t.age_ms))
            } else {
                format!("{} only", count_word(t.allocations, "allocation", "allocations"))
            },
            seconds(crate::verdict::TIMELINE_MIN_SPAN_MS),
            crate::verdict::TIMELINE_MIN_ALLOCATIONS
        ),
        NotALeak::Loading { function } => format!(
            "loading: {label} grew by {grown} over {} inside {}: a model being loaded, not a leak",
            seconds(t.span_ms),
            clean(function)
        ),
        NotALeak::Stopped { quiet_ms } => format!(
            "{label} grew by {grown} at {rate} per second, then stopped {} before: not growing now",
            seconds(*quiet_ms)
        ),
        NotALeak::NotKept => match &t.kept_check {
            Some(k) => format!(
                "no growth kept: the live allocations made over the last {} add up to {}, but the tracked bytes grew {} then (what was allocated was freed as fast)",
                seconds(k.over_ms),
                human_bytes(k.kept_bytes),
                human_bytes(k.actual_bytes.max(0) as u64)
            ),
            None => "no growth kept".to_string(),
        },
    }
}

/// A leak judged over time: the program marks no steps and repeats no step pattern (a C
/// program, a service, a loop that only allocates), so its growth is measured over time.
fn finding_over_time(c: &Ctx, l: &LeakFinding) -> Finding {
    let fw = framework(c.dump);
    let rate = human_bytes(l.fit.bytes_per_step);
    let span = over_time_span(l);
    let r2 = l.fit.r_squared;
    let top = l
        .sites
        .first()
        .filter(|(_, share)| *share >= LEAK_NAMED_SHARE);
    let parts: Vec<String> = l
        .sites
        .iter()
        .take(LEAK_SITES_NAMED)
        .map(|(s, share)| share_text(s, *share, "second"))
        .collect();
    let headline = match top {
        Some((site, share)) => format!(
            "{} grows by {} every second (steadily {span}, R² {r2:.2}; {} so far, {} of the growth)",
            site_name(site),
            human_bytes(site.bytes_per_step),
            human_bytes(l.grown),
            percent(Some((share * 100.0).min(100.0))),
        ),
        None if !parts.is_empty() => format!(
            "the process grows by {rate} every second (steadily {span}, R² {r2:.2}; {} so far), spread over sites: {}",
            human_bytes(l.grown),
            parts.join(", ")
        ),
        None => format!(
            "the process grows by {rate} every second (steadily {span}, R² {r2:.2}; {} so far)",
            human_bytes(l.grown)
        ),
    };
    let named = if parts.is_empty() {
        " No single site carries the growth (it is spread over more sites than are kept)."
            .to_string()
    } else {
        format!(" The growth per second comes from: {}.", parts.join("; "))
    };
    let mut f = new_finding(
        LEAK,
        l.grown,
        headline,
        format!(
            "A leak over time: this process's tracked memory grows by {rate} every second ({}), and it was still that \
             high when {} more was requested on device {}.{named} The program marks no steps and no repeating step \
             was found, so its growth is measured per second: memory that is never given back, or a working set still \
             being built (a cache filling) that was going to be larger than the device.",
            over_time_how(l, r2),
            c.req,
            c.dev,
        ),
    );
    f.evidence.push(format!(
        "growth of the process: {rate} per second (R² {r2:.2} {span}), {} from second {} to {}; {} tracked at the failure",
        human_bytes(l.fit.last.bytes.saturating_sub(l.fit.first.bytes)),
        l.fit.first.step,
        l.fit.last.step,
        human_bytes(tracked_all(c.dump))
    ));
    for (site, share) in l.sites.iter().take(LEAK_SITES_NAMED) {
        f.evidence.push(format!(
            "growth: {} (R² {:.2}, {} at second {} to {} at second {})",
            share_text(site, *share, "second"),
            site.r_squared,
            human_bytes(site.first.bytes),
            site.first.step,
            human_bytes(site.last.bytes),
            site.last.step
        ));
    }
    f.evidence.push(
        if l.timeline.is_some() {
            "steps: none marked and none detected; growth fitted from when each live allocation was made"
        } else {
            "steps: none marked and none detected; growth sampled once a second"
        }
        .to_string(),
    );
    let label = top
        .map(|(s, _)| site_name(s))
        .or_else(|| l.sites.first().map(|(s, _)| site_name(s)))
        .unwrap_or_else(|| "the program".to_string());
    f.suggestions.extend(leak_advice(fw, &label));
    f.suggestions.push(match fw {
        Framework::Native => "Mark steps with `oomshim_step()` (from `liboomshim.so`) so growth is judged per step, not per second.".to_string(),
        _ => "Mark steps with `oomshim.step()` so growth is judged per step, not per second.".to_string(),
    });
    f
}

/// `function (file:line)` of a line from the framework's records, with the file's base name.
/// `8.3% at keep (train.py:18), 8.3% at ...`: the records' first lines and their shares.
pub(in crate::verdict) fn recorded_parts(a: &dump::model::Attribution) -> String {
    a.lines
        .iter()
        .take(LEAK_SITES_NAMED)
        .map(|line| {
            format!(
                "{} at {}",
                percent(share(line.bytes, a.recorded_bytes)),
                recorded_label(line)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(in crate::verdict) fn recorded_label(line: &AttributedLine) -> String {
    let file = line.file.rsplit('/').next().unwrap_or(&line.file);
    format!(
        "{} ({}:{})",
        clean(&truncate_function(&line.function, 60)),
        clean(file),
        line.line
    )
}

/// What to change for a leak, in the terms of the framework the program uses.
fn leak_advice(fw: Framework, label: &str) -> Vec<String> {
    match fw {
        Framework::Torch => vec![
            format!(
                "Find what {label} keeps from each step. The classic causes: accumulating a tensor that is still on the GPU \
                 and attached to the graph (`total_loss += loss` or `losses.append(loss)`: keep `loss.item()`), keeping \
                 outputs or activations for logging (keep `t.detach().cpu()`), `backward(retain_graph=True)` in a loop, \
                 and appending model outputs to a list across steps."
            ),
            "Run evaluation under `torch.inference_mode()` (or `torch.no_grad()`) so it keeps no graph.".to_string(),
        ],
        Framework::Jax => vec![format!(
            "Find what {label} keeps from each step: JAX arrays appended to a list or stored on an object across steps \
             stay on the device; keep `float(x)` or `jax.device_get(x)` instead, and don't close over per-step arrays."
        )],
        Framework::Cupy => vec![format!(
            "Find what {label} keeps from each step: CuPy arrays kept across iterations hold their blocks in CuPy's pool; \
             keep `x.get()` copies on the host, or `del` them (then `cupy.get_default_memory_pool().free_all_blocks()` \
             returns the cached blocks)."
        )],
        Framework::Python | Framework::Native => vec![format!(
            "Free what {label} allocates every step (a `cudaFree` for each `cudaMalloc`), or allocate its buffer once and \
             reuse it across steps."
        )],
    }
}
