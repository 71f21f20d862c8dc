//! The words of [`LEAK`]: the growing site or the process's growth, its rate and projection, how
//! steps were found, and what to change in the program's framework.

use super::{count_word, new_finding, segment_note, steps_word};
use crate::verdict::context::Ctx;
use crate::verdict::found::{Framework, LeakFinding, NotALeak, OverTime, Recorded};
use crate::verdict::names::LEAK;
use crate::verdict::sites::{short_label, site_name};
use dump::model::{AttributedLine, Finding, GrowthSite, Kinds};
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
    let steps = steps_word(l.growth.steps.as_deref());
    let parts = parts(l, "step");
    let kinds = c.readings.kinds;
    let keeper = kinds.and_then(super::kinds::hook_keeper);
    let headline = held_and_kept(headline(c, l, steps, &parts), kinds, keeper.as_deref());
    let mut f = new_finding(LEAK, l.grown, headline, summary(c, l, steps, &parts));
    f.evidence = evidence(c, l, steps);
    if let Some(k) = kinds {
        f.evidence.extend(super::kinds::evidence(c, k));
    }
    f.suggestions = suggestions(c, l, keeper.as_deref());
    f
}

/// The growth's largest parts, as [`share_text`] names them, per `unit`.
fn parts(l: &LeakFinding, unit: &str) -> Vec<String> {
    l.sites
        .iter()
        .take(LEAK_SITES_NAMED)
        .map(|(s, share)| share_text(s, *share, unit))
        .collect()
}

/// Torch's records of the growth, when they name the leak rather than the shim's sites.
fn named_by_records<'a>(l: &'a LeakFinding) -> Option<&'a Recorded<'a>> {
    l.records.as_ref().filter(|r| r.names_it)
}

/// The headline of a leak by step: the line torch's records name, the growing site, or the
/// process's growth and how it is spread; and when free memory runs out.
fn headline(c: &Ctx, l: &LeakFinding, steps_word: &str, parts: &[String]) -> String {
    let g = l.growth;
    let rate = human_bytes(l.fit.bytes_per_step);
    let n_steps = thousands(l.fit.samples);
    // The step in progress at the failure: when the projection is later, a request larger than
    // one step's growth came first.
    let failing_step = g.current + 1;
    let runs_out = match g.projected_oom_step {
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
    match (l.named, named_by_records(l)) {
        // No line holds the growth, by the records either: say how it is spread.
        (_, Some(r)) if r.spread => format!(
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
        (Some((site, share)), None) => format!(
            "{} grows by {} every step (over the last {n_steps} {}; {} so far, {} of the growth){runs_out}",
            site_name(site),
            human_bytes(site.bytes_per_step),
            steps_word,
            human_bytes(l.grown),
            percent(Some((share * 100.0).min(100.0))),
        ),
        (None, None) if !parts.is_empty() => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far), spread over sites: {}{runs_out}",
            steps_word,
            human_bytes(l.grown),
            parts.join(", ")
        ),
        (None, None) => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far){runs_out}",
            steps_word,
            human_bytes(l.grown)
        ),
    }
}

/// The program's container that holds the leaked tensors, and its own forward hook (`keeper`),
/// when the hook found them: what keeps the growth, next to the line that allocated it.
fn held_and_kept(headline: String, kinds: Option<&Kinds>, keeper: Option<&str>) -> String {
    let headline = match kinds.and_then(super::kinds::container_keeper) {
        Some(held) => format!("{headline}; held in {held}"),
        None => headline,
    };
    match keeper {
        Some(k) => format!("{headline}; possibly kept by {k}"),
        None => headline,
    }
}

/// The summary of a leak by step: what grows, by how much, over which steps, where from,
/// torch's records, when free memory runs out and how the steps were found.
fn summary(c: &Ctx, l: &LeakFinding, steps_word: &str, parts: &[String]) -> String {
    let g = l.growth;
    let rate = human_bytes(l.fit.bytes_per_step);
    let records = l
        .records
        .as_ref()
        .map(|r| {
            format!(
                " torch's records of the {} of tensors allocated since the growth began put {}.",
                human_bytes(r.attribution.recorded_bytes),
                recorded_parts(r.attribution)
            )
        })
        .unwrap_or_default();
    let named = if parts.is_empty() {
        " No single site carries the growth (it is spread over more sites than are kept)."
            .to_string()
    } else {
        format!(" The growth per step comes from: {}.", parts.join("; "))
    };
    let projection = match g.projected_oom_step {
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
    format!(
        "A leak: {} grows by {rate} every step ({} {} observed, from {} at step {} to \
         {} at step {}, R² {:.2}), and it was still that high when {} more was requested on device {}.{named}{records}{projection}{}{}",
        if l.fit.of.as_deref() == Some("framework_live") {
            "the memory of torch's live tensors (its `memory_allocated()` at every step)"
        } else {
            "this process's tracked memory"
        },
        thousands(l.fit.samples),
        steps_word,
        human_bytes(l.fit.first.bytes),
        l.fit.first.step,
        human_bytes(l.fit.last.bytes),
        l.fit.last.step,
        l.fit.r_squared,
        c.req,
        c.dev,
        how_steps_were_found(l),
        segment_note(c),
    )
}

/// How the steps were found, in a sentence: detected, or marked by the Python hook.
fn how_steps_were_found(l: &LeakFinding) -> String {
    match (&l.detected, l.growth.steps.as_deref()) {
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
    }
}

/// The evidence of a leak by step: the process's fit, its growing sites and how the steps were
/// found.
fn evidence(c: &Ctx, l: &LeakFinding, steps_word: &str) -> Vec<String> {
    let mut evidence = vec![format!(
        "growth of the process: {} per step (R² {:.2} over {} {}), {} from step {} to {}; {} tracked at the failure",
        human_bytes(l.fit.bytes_per_step),
        l.fit.r_squared,
        thousands(l.fit.samples),
        steps_word,
        human_bytes(l.fit.grew_bytes()),
        l.fit.first.step,
        l.fit.last.step,
        human_bytes(c.readings.tracked_all)
    )];
    for (site, share) in l.sites.iter().take(LEAK_SITES_NAMED) {
        evidence.push(format!(
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
    evidence.push(match &l.detected {
        Some(d) => format!(
            "steps: detected, not marked (a cycle of {}; {}; {} since the last)",
            count_word(d.period, "allocation", "allocations"),
            count_word(d.steps, "step", "steps"),
            count_word(d.allocations_since_last_step, "allocation", "allocations")
        ),
        None => format!(
            "steps: {}",
            match l.growth.steps.as_deref() {
                Some("optimizer") =>
                    "optimizer steps (torch.optim), marked by oomshim's Python hook",
                Some("forward") =>
                    "forward passes of the outermost module, marked by oomshim's Python hook",
                _ => "marked by the program (oomshim_step)",
            }
        ),
    });
    evidence
}

/// What to change for a leak by step: the program's own forward hook when it keeps the growth,
/// then what to look for at the line or site that holds it (each of those the headline lists
/// when it is spread, never the first of them as if it were the leak).
fn suggestions(c: &Ctx, l: &LeakFinding, keeper: Option<&str>) -> Vec<String> {
    let fw = c.readings.framework;
    let label = match (named_by_records(l), l.named) {
        (Some(r), _) if r.spread => "each of the lines named above".to_string(),
        (Some(r), _) => recorded_label(&r.attribution.lines[0]),
        (None, Some((s, _))) => site_name(s),
        (None, None) if !l.sites.is_empty() => "each of the sites named above".to_string(),
        (None, None) => "each step".to_string(),
    };
    let mut suggestions = Vec::new();
    if let Some(k) = keeper {
        suggestions.push(format!(
            "{k} runs on every forward pass: if it stores the outputs (in a list or dict), they stay on the device with their autograd graph; store `output.detach().cpu()` or a number (`.item()`), or remove the hook."
        ));
    }
    suggestions.extend(leak_advice(fw, &label));
    if l.detected.is_some() {
        suggestions.push(match fw {
            Framework::Native => {
                "Mark steps with `oomshim_step()` (from `liboomshim.so`) to confirm the growth per step.".to_string()
            }
            _ => "Mark steps with `oomshim.step()` to confirm the growth per step.".to_string(),
        });
    }
    suggestions
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

/// `2.7 s`, and `14 ms` under a second (a growth that filled a device in a fraction of one
/// reads `over its last 14 ms`, never `0.0 s`).
pub(in crate::verdict) fn seconds(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// How long a growth lasted, for the middle of a sentence: ` over 2.7 s`, ` over 30 ms`, and
/// nothing where no span was measured (a load whose allocations all fall into one bin of the
/// timeline has no fitted growth, and its span reads 0: unknown, not instant).
fn over_span(ms: u64) -> String {
    match ms {
        0 => String::new(),
        _ => format!(" over {}", seconds(ms)),
    }
}

/// How the growth over time was measured, in a sentence (the summary's parenthesis).
fn over_time_how(l: &LeakFinding, r2: f64) -> String {
    match l.timeline {
        Some(t) => format!(
            "fitted from the live allocations' own timestamps: {} made over the last {} and still held, from {} at second {} to {} at second {} of the program, R² {r2:.2}{}",
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
pub(in crate::verdict) fn not_a_leak(o: &OverTime) -> String {
    let label = o
        .top
        .map(|s| short_label(&s.stack))
        .unwrap_or_else(|| "the process".to_string());
    let rate = human_bytes(o.top.map_or(o.fit.bytes_per_step, |s| s.bytes_per_step));
    let grown = human_bytes(o.fit.grew_bytes());
    let t = o.timeline;
    match &o.why {
        NotALeak::Young {
            too_recent,
            min_span_ms,
            min_allocations,
        } => format!(
            "growing: {label} +{rate} per second over its {}, {} kept (too little to call it a leak: {}; a leak is judged once the program has allocated for {}, over {} allocations)",
            seconds(t.span_ms),
            count_word(t.allocations, "allocation", "allocations"),
            if *too_recent {
                format!("it began allocating {} ago", seconds(t.age_ms))
            } else {
                format!("{} only", count_word(t.allocations, "allocation", "allocations"))
            },
            seconds(*min_span_ms),
            min_allocations
        ),
        NotALeak::Loading { function } => format!(
            "loading: {label} grew by {grown}{} inside {}: a model being loaded, not a leak",
            over_span(t.span_ms),
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
    let fw = c.readings.framework;
    let rate = human_bytes(l.fit.bytes_per_step);
    let r2 = l.fit.r_squared;
    let parts = parts(l, "second");
    let named = if parts.is_empty() {
        " No single site carries the growth (it is spread over more sites than are kept)."
            .to_string()
    } else {
        format!(" The growth per second comes from: {}.", parts.join("; "))
    };
    let kinds = c.readings.kinds;
    let mut f = new_finding(
        LEAK,
        l.grown,
        held_and_kept(headline_over_time(l, &parts), kinds, None),
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
    f.evidence = evidence_over_time(c, l);
    let label = l
        .named
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

/// The headline of a leak over time: the growing site, or the process's growth and how it is
/// spread.
fn headline_over_time(l: &LeakFinding, parts: &[String]) -> String {
    let rate = human_bytes(l.fit.bytes_per_step);
    let span = over_time_span(l);
    let r2 = l.fit.r_squared;
    match l.named {
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
    }
}

/// The evidence of a leak over time: the process's fit, its growing sites, and how the growth
/// was measured.
fn evidence_over_time(c: &Ctx, l: &LeakFinding) -> Vec<String> {
    let r2 = l.fit.r_squared;
    let mut evidence = vec![format!(
        "growth of the process: {} per second (R² {r2:.2} {}), {} from second {} to {}; {} tracked at the failure",
        human_bytes(l.fit.bytes_per_step),
        over_time_span(l),
        human_bytes(l.fit.grew_bytes()),
        l.fit.first.step,
        l.fit.last.step,
        human_bytes(c.readings.tracked_all)
    )];
    for (site, share) in l.sites.iter().take(LEAK_SITES_NAMED) {
        evidence.push(format!(
            "growth: {} (R² {:.2}, {} at second {} to {} at second {})",
            share_text(site, *share, "second"),
            site.r_squared,
            human_bytes(site.first.bytes),
            site.first.step,
            human_bytes(site.last.bytes),
            site.last.step
        ));
    }
    evidence.push(
        if l.timeline.is_some() {
            "steps: none marked and none detected; growth fitted from when each live allocation was made"
        } else {
            "steps: none marked and none detected; growth sampled once a second"
        }
        .to_string(),
    );
    evidence
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
