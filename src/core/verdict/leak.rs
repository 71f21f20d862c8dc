//! [`LEAK`](super::LEAK): when the process's growth step after step is a leak, and when it is
//! no leak because nothing accumulated (inputs of growing shape). Its sentences are in
//! `words/leak.rs`.

use super::context::tracked_all;
use super::found::{GrowingShapes, LeakFinding, NotALeak, OverTime, Recorded};
use dump::model::{Dump, Growth, GrowthFit, GrowthSite};

/// Smallest growth per step of the process for [`LEAK`](super::LEAK): below it, growth is noise (counters,
/// small caches), not what fills a device.
pub const LEAK_MIN_BYTES_PER_STEP: u64 = 1 << 20;
/// A site carrying at least this share of the growth is named as *the* leak in the headline;
/// below it the headline names the process's growth and its largest parts.
pub const LEAK_NAMED_SHARE: f64 = 0.5;
/// Smallest share of sampled intervals that freed memory for detected steps to support a
/// [`LEAK`](super::LEAK): a training step frees its working memory; a loop that only allocates (loading
/// weights layer by layer) also repeats, and its growth is no leak.
pub const DETECTED_MIN_FREEING_SHARE: f64 = 0.5;

/// Growth over time from the allocation timeline (`growth.steps` `"timeline"`) is judged a leak
/// only in a program that began allocating at least this long ago: a start-up spike (a first
/// batch, a model being loaded) grows steadily for a moment too.
pub const TIMELINE_MIN_SPAN_MS: u64 = 2000;
/// ... and kept at least this many allocations: a handful of large ones (a model's few layers)
/// fit a line by chance.
pub const TIMELINE_MIN_ALLOCATIONS: u64 = 16;
/// Growth is "still going on" unless its sites have been quiet for longer than this, or than
/// [`TIMELINE_QUIET_GAPS`] of their usual gaps between allocations, whichever is longer.
pub const TIMELINE_MAX_QUIET_MS: u64 = 1000;
pub const TIMELINE_QUIET_GAPS: u64 = 4;
/// When the once-a-second samples (frees counted) cover the growth, the tracked bytes must have
/// grown by at least this share of what the live allocations made then add up to: a cache that
/// evicts as it adds keeps recent allocations only, which look like growth without being one.
pub const TIMELINE_MIN_KEPT_SHARE: f64 = 0.5;

/// Functions that load or move a model's weights onto the device (`file suffix`, `function`):
/// growth inside them is a model being loaded, not a leak.
const LOADING_FUNCTIONS: &[(&str, &str)] = &[
    ("torch/nn/modules/module.py", "_apply"),
    ("torch/nn/modules/module.py", "to"),
    ("torch/nn/modules/module.py", "cuda"),
    ("torch/nn/modules/module.py", "to_empty"),
    ("torch/nn/modules/module.py", "load_state_dict"),
    ("torch/nn/modules/module.py", "_load_from_state_dict"),
    ("torch/serialization.py", "load"),
    ("safetensors/torch.py", "load_file"),
    ("safetensors/torch.py", "load"),
    ("transformers/modeling_utils.py", "from_pretrained"),
    ("transformers/modeling_utils.py", "_load_pretrained_model"),
    (
        "transformers/modeling_utils.py",
        "_load_state_dict_into_meta_model",
    ),
    (
        "accelerate/utils/modeling.py",
        "set_module_tensor_to_device",
    ),
    ("accelerate/utils/modeling.py", "load_checkpoint_in_model"),
    ("accelerate/big_modeling.py", "dispatch_model"),
    ("accelerate/big_modeling.py", "load_checkpoint_and_dispatch"),
];

/// The timeline's verdict on growth over time: `Ok(())` when the leak rules may go on (it
/// lasted long enough, kept enough allocations, still grows, was kept, and loads no model),
/// else why it is no leak. `None` for dumps without a timeline or without steady growth.
pub fn timeline_judgement(dump: &Dump) -> Option<Result<(), OverTime<'_>>> {
    let g = dump.growth.as_ref()?;
    if g.steps.as_deref() != Some("timeline") {
        return None;
    }
    let t = g.timeline.as_ref()?;
    let fit = growth_fit(g)?;
    if fit.bytes_per_step < LEAK_MIN_BYTES_PER_STEP {
        return None;
    }
    let top = top_growing_site(g);
    let not = |why| {
        Some(Err(OverTime {
            growth: g,
            fit: fit.clone(),
            timeline: t,
            top,
            why,
        }))
    };
    if let Some(k) = &t.kept_check {
        if (k.actual_bytes as f64) < TIMELINE_MIN_KEPT_SHARE * k.kept_bytes as f64 {
            return not(NotALeak::NotKept);
        }
    }
    // A load says more than that the growth stopped: a model loaded, then idle, is a load.
    if let Some(function) = top.and_then(|s| loading_function(&s.stack)) {
        return not(NotALeak::Loading { function });
    }
    if loading_parameters(dump, g) {
        return not(NotALeak::Loading {
            function: "the model's parameters (the framework's count)".to_string(),
        });
    }
    let gap = t.span_ms / t.allocations.max(1);
    if t.quiet_ms > TIMELINE_MAX_QUIET_MS.max(TIMELINE_QUIET_GAPS.saturating_mul(gap)) {
        return not(NotALeak::Stopped {
            quiet_ms: t.quiet_ms,
        });
    }
    // A short growth means something only where nothing was freed (then what is kept is the
    // whole history): recent allocations of an older program that frees memory may be its
    // working set, which the next frees give back.
    let short = t.span_ms < TIMELINE_MIN_SPAN_MS && t.freed_all > 0;
    if short && t.span_ms.saturating_mul(2) < t.age_ms {
        return None;
    }
    let young = short || t.age_ms < TIMELINE_MIN_SPAN_MS;
    if young && t.allocations >= TIMELINE_MIN_ALLOCATIONS && kept_by_a_container(dump, &fit) {
        return Some(Ok(()));
    }
    if young || t.allocations < TIMELINE_MIN_ALLOCATIONS {
        return not(NotALeak::Young {
            too_recent: t.age_ms < TIMELINE_MIN_SPAN_MS,
            min_span_ms: TIMELINE_MIN_SPAN_MS,
            min_allocations: TIMELINE_MIN_ALLOCATIONS,
        });
    }
    Some(Ok(()))
}

/// The growing site named for the growth: the one with the largest share of the fitted growth
/// when it carries [`LEAK_NAMED_SHARE`]. Where the process's growth had no steady fit (it grew,
/// then stopped), the sites carry no share: then the one that grew most, when it grew at least
/// that share of what all sites grew.
fn top_growing_site(g: &Growth) -> Option<&GrowthSite> {
    if g.sites.iter().any(|s| s.share.is_some()) {
        return g
            .sites
            .iter()
            .max_by(|a, b| a.share.unwrap_or(0.0).total_cmp(&b.share.unwrap_or(0.0)))
            .filter(|s| s.share.unwrap_or(0.0) >= LEAK_NAMED_SHARE);
    }
    let grown = |s: &GrowthSite| s.last.bytes.saturating_sub(s.first.bytes);
    let all: u64 = g.sites.iter().map(grown).sum();
    g.sites
        .iter()
        .max_by_key(|s| grown(s))
        .filter(|s| all > 0 && grown(s) as f64 >= LEAK_NAMED_SHARE * all as f64)
}

/// The loading function a stack is inside, as `function (file)`, when it is one of
/// [`LOADING_FUNCTIONS`].
fn loading_function(stack: &[dump::model::Frame]) -> Option<String> {
    stack.iter().find_map(|f| {
        let (file, function) = (f.file.as_deref()?, f.function.as_deref()?);
        LOADING_FUNCTIONS
            .iter()
            .find(|(suffix, name)| {
                // CPython 3.11 and later name methods by their qualified name (`Module.to`).
                let method = function
                    .strip_suffix(name)
                    .is_some_and(|head| head.is_empty() || head.ends_with('.'));
                file.ends_with(suffix) && method
            })
            .map(|(suffix, name)| format!("{name} ({suffix})"))
    })
}

/// The process's fitted growth: the dump's own, or (dumps of older versions) fitted from its
/// tracked samples.
///
/// A dump that carries the framework's count of its live tensors at the steps was written by a
/// version that fits that count and writes no `fit` when it does not grow steadily: then nothing
/// grew step after step. Its tracked bytes are the framework's segments under preload, which
/// its cache adds for each larger batch without any tensor being kept; fitting them instead
/// would call that cache a leak.
pub(super) fn growth_fit(g: &Growth) -> Option<GrowthFit> {
    if let Some(f) = &g.fit {
        return Some(f.clone());
    }
    if !g.framework_live.is_empty() {
        return None;
    }
    tracked_fit(g)
}

/// The steady growth of the tracked samples, however the dump's writer fitted them.
fn tracked_fit(g: &Growth) -> Option<GrowthFit> {
    let points: Vec<(u64, u64)> = g.tracked.iter().map(|p| (p.step, p.bytes)).collect();
    let (f, start) = dump::fit::growing_suffix(&points)?;
    Some(GrowthFit {
        bytes_per_step: f.slope.round() as u64,
        r_squared: f.r2,
        samples: f.n as u64,
        first: g.tracked[start].clone(),
        last: g.tracked.last()?.clone(),
        of: Some("tracked".to_string()),
        live_allocations: None,
    })
}

/// True unless the fit's live allocations are known not to have accumulated: a leak keeps
/// allocations (at least one every other step); memory that grows while as many allocations
/// are live as before grew because the allocations got larger (inputs of growing shape).
fn accumulated(fit: &GrowthFit) -> bool {
    match fit.live_allocations {
        Some(c) => {
            c.last
                >= c.first
                    .saturating_add((fit.samples.saturating_sub(1) / 2).max(1))
        }
        None => true,
    }
}

/// The process's steady growth when it is no leak because nothing accumulated: the same
/// number of allocations, larger each step; or the framework's segments growing while its live
/// tensors at the steps do not ([`cache_for_larger_steps`]). With how its steps were found
/// (`growth.steps`).
pub(super) fn growing_shapes(dump: &Dump) -> Option<GrowingShapes<'_>> {
    let g = dump.growth.as_ref().filter(|g| g.unit == "step")?;
    let steps = g.steps.as_deref();
    if let Some(cache) = cache_for_larger_steps(g) {
        return Some(cache);
    }
    let fit = growth_fit(g)?;
    (fit.bytes_per_step >= LEAK_MIN_BYTES_PER_STEP
        && fit.samples >= dump::fit::MIN_SAMPLES as u64
        && fit.live_allocations.is_some()
        && !accumulated(&fit))
    .then_some(GrowingShapes {
        fit,
        steps,
        live: None,
    })
}

/// The tracked bytes grow steadily step after step, but the framework's own count of its live
/// tensors at the same steps does not grow by [`LEAK_MIN_BYTES_PER_STEP`] (no fit of it, or a
/// slower one) and adds less than half of what the tracked bytes added over their stretch: what
/// grew is the framework's cache (under preload its segments are what is tracked), reserved for
/// the larger working memory of later steps (a batch or a sequence that grows). Nothing was
/// kept from step to step. The growth of the tracked bytes, with the live tensors at the first
/// and last sample of its stretch.
fn cache_for_larger_steps(g: &Growth) -> Option<GrowingShapes<'_>> {
    if g.framework_live.is_empty()
        || g.fit.as_ref().is_some_and(|f| {
            f.of.as_deref() != Some("framework_live") || f.bytes_per_step >= LEAK_MIN_BYTES_PER_STEP
        })
    {
        return None;
    }
    let fit = tracked_fit(g)?;
    if fit.bytes_per_step < LEAK_MIN_BYTES_PER_STEP || fit.samples < dump::fit::MIN_SAMPLES as u64 {
        return None;
    }
    let at = |step: u64| g.framework_live.iter().find(|p| p.step == step);
    let (first, last) = (at(fit.first.step)?, at(fit.last.step)?);
    let live_grew = last.bytes.saturating_sub(first.bytes);
    (live_grew.saturating_mul(2) < fit.grew_bytes()).then(|| GrowingShapes {
        steps: g.steps.as_deref(),
        live: Some((first.clone(), last.clone())),
        fit,
    })
}

/// The process's growth when it is a leak (see [`LEAK`](super::LEAK)).
///
/// Growth over time (one sample a second, when nothing marks or repeats steps) is a leak on the
/// same terms, per second instead of per step, unless the framework's own count says the
/// growth is the model's parameters (a model being loaded grows steadily too).
pub(super) fn leak_finding(dump: &Dump) -> Option<LeakFinding<'_>> {
    let g = dump
        .growth
        .as_ref()
        .filter(|g| g.unit == "step" || g.unit == "second")?;
    let over_time = g.unit == "second";
    if over_time && loading_parameters(dump, g) {
        return None;
    }
    if g.steps.as_deref() == Some("timeline") && !matches!(timeline_judgement(dump), Some(Ok(()))) {
        return None;
    }
    let steps = g.steps.as_deref();
    let detected = match steps {
        _ if over_time => None,
        Some("detected") => {
            let d = g.detected.as_ref()?;
            if d.intervals == 0
                || (d.freeing_intervals as f64) < DETECTED_MIN_FREEING_SHARE * d.intervals as f64
            {
                return None;
            }
            Some(d.clone())
        }
        _ => None,
    };
    let fit = growth_fit(g)?;
    if fit.bytes_per_step < LEAK_MIN_BYTES_PER_STEP
        || fit.samples < dump::fit::MIN_SAMPLES as u64
        || !accumulated(&fit)
    {
        return None;
    }
    // Still held at the failure: what is live then has not fallen back below the last sample by
    // more than half of what the fit grew (a phase that freed its memory is no leak now). A
    // couple of steps' worth is always allowed: the failure comes mid-step, after some of the
    // step's memory was freed, and a framework's word arrives after its own cleanup. The
    // framework's live tensors are compared with its own count at the failure.
    let now = match fit.of.as_deref() {
        Some("framework_live") => dump.free_blocks.allocated_bytes.unwrap_or(fit.last.bytes),
        _ => tracked_all(dump),
    };
    let fit_grew = fit.grew_bytes();
    let may_fall = (fit_grew / 2).max(fit.bytes_per_step.saturating_mul(2));
    if now.saturating_add(may_fall) < fit.last.bytes {
        return None;
    }
    let mut sites: Vec<(&GrowthSite, f64)> = g
        .sites
        .iter()
        .map(|s| {
            let share = s
                .share
                .unwrap_or(s.bytes_per_step as f64 / fit.bytes_per_step.max(1) as f64);
            (s, share.clamp(0.0, 1.0))
        })
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.0.bytes_per_step));
    // Grown over the fitted samples, plus what the step in progress added (at most a step's
    // worth: more than that was not this growth).
    let grown = fit
        .grew_bytes()
        .saturating_add(now.saturating_sub(fit.last.bytes).min(fit.bytes_per_step));
    let named = sites
        .first()
        .copied()
        .filter(|(_, share)| *share >= LEAK_NAMED_SHARE);
    let mut leak = LeakFinding {
        growth: g,
        fit,
        sites,
        named,
        detected,
        grown,
        over_time,
        timeline: g.timeline.as_ref().filter(|_| over_time),
        records: None,
    };
    leak.records = recorded(&leak, dump);
    Some(leak)
}

/// True when the framework's count found a container of the program's own (a list or dict bound
/// to a name) holding at least half of what the growth added, in at least
/// [`TIMELINE_MIN_ALLOCATIONS`] tensors beyond the parameters, gradients and optimizer state:
/// then the growth is kept by the program however fast it came (a fast card fills in a fraction
/// of a second), where the time rule waits [`TIMELINE_MIN_SPAN_MS`] because a first batch or a
/// model being loaded also grows steadily for a moment; their tensors are held by autograd or by
/// modules, never by such a container.
fn kept_by_a_container(dump: &Dump, fit: &GrowthFit) -> bool {
    let Some(keeper) = super::kinds::kinds_of(dump).and_then(|k| k.keepers.first()) else {
        return false;
    };
    let grew = fit.grew_bytes();
    grew > 0 && keeper.tensors >= TIMELINE_MIN_ALLOCATIONS && keeper.bytes.saturating_mul(2) >= grew
}

/// True when the framework counted its live memory at the failure and the model's parameters
/// hold at least half of what the growth over time added: weights being loaded, not a leak.
fn loading_parameters(dump: &Dump, g: &Growth) -> bool {
    let Some(k) = super::kinds::kinds_of(dump) else {
        return false;
    };
    let Some(fit) = growth_fit(g) else {
        return false;
    };
    let grew = fit.grew_bytes();
    k.parameters_bytes > 0 && k.parameters_bytes.saturating_mul(2) >= grew
}

/// Torch's records of where the tensors allocated since the growth began were allocated (the
/// Python hook turns torch's history on once growth is seen): what names a leak by step when
/// the shim's own sites cannot. `None` without records.
///
/// Under preload the shim sees torch's segments, which the caching allocator may cut during the
/// optimizer step or the backward pass: the shim's top site then names `opt.step()` or no line of
/// the program at all, while the records name the line whose tensors are kept. The records name
/// the leak when their top line is another line than the shim's top site and either the shim
/// names no line of the program (`no_python`, or no site over [`LEAK_NAMED_SHARE`]) or that line
/// holds at least [`LEAK_NAMED_SHARE`] of what was recorded. One rule for the out-of-memory
/// verdict and the post-mortem's.
fn recorded<'a>(l: &LeakFinding, dump: &'a Dump) -> Option<Recorded<'a>> {
    if l.over_time {
        return None;
    }
    let a = dump
        .framework
        .as_ref()?
        .attribution
        .as_ref()
        .filter(|a| a.recorded_bytes > 0 && !a.lines.is_empty())?;
    let line = &a.lines[0];
    let share = line.bytes as f64 / a.recorded_bytes as f64;
    let top = l.sites.first();
    let named_by_shim = top.is_some_and(|(s, share)| {
        *share >= LEAK_NAMED_SHARE && s.grouped_by.as_deref() != Some("no_python")
    });
    let same_as_shim = top.is_some_and(|(s, _)| {
        super::sites::Line::of_stack(&s.stack).is_some_and(|l| l.is_recorded(line))
    });
    Some(Recorded {
        attribution: a,
        share,
        names_it: !same_as_shim && (!named_by_shim || share >= LEAK_NAMED_SHARE),
        // No line of the records holds [`LEAK_NAMED_SHARE`] of what they recorded: the growth
        // is spread over lines, and none of them is to be named as holding it.
        spread: share < LEAK_NAMED_SHARE,
    })
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{
        check_common, growing, growing_in, growth, kinds, oom_dump, GIB, MIB,
    };
    use crate::verdict::{
        judge, LEAK, LEAK_MIN_BYTES_PER_STEP, OWN_ALLOCATIONS, REQUEST_EXCEEDS_DEVICE,
        UNTRACKED_MEMORY,
    };
    use dump::model::*;

    fn growth_site(name: &str, per_step: u64, steps: u64) -> GrowthSite {
        growing_in("train.py", name, per_step, steps)
    }

    fn with_growth(unit: &str, sites: Vec<GrowthSite>) -> Dump {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        let rate: u64 = sites.iter().map(|s| s.bytes_per_step).sum();
        d.growth = Some(Growth {
            unit: unit.into(),
            steps: Some(if unit == "step" { "marked" } else { "time" }.into()),
            detected: None,
            samples: 10,
            current: 10,
            free_bytes: Some(GIB),
            projected_oom_step: Some(12),
            tracked: (1..=10)
                .map(|i| GrowthPoint {
                    step: i,
                    bytes: i * rate,
                })
                .collect(),
            sites,
            fit: None,
            framework_live: vec![],
            timeline: None,
        });
        d
    }

    #[test]
    fn leak_thresholds_table() {
        // (name, dump, kind)
        let cases: Vec<(&str, Dump, &str)> = vec![
            (
                "one site grows 96 MiB a step",
                with_growth("step", vec![growth_site("keep_activations", 96 * MIB, 10)]),
                LEAK,
            ),
            (
                "exactly the threshold",
                with_growth(
                    "step",
                    vec![growth_site("keep", LEAK_MIN_BYTES_PER_STEP, 10)],
                ),
                LEAK,
            ),
            (
                "below the threshold",
                with_growth(
                    "step",
                    vec![growth_site("keep", LEAK_MIN_BYTES_PER_STEP - 1, 10)],
                ),
                OWN_ALLOCATIONS,
            ),
            (
                "steady growth per second (no steps marked or detected) is a leak over time",
                with_growth("second", vec![growth_site("keep", 96 * MIB, 10)]),
                LEAK,
            ),
            (
                "growth per second below the threshold",
                with_growth(
                    "second",
                    vec![growth_site("keep", LEAK_MIN_BYTES_PER_STEP - 1, 10)],
                ),
                OWN_ALLOCATIONS,
            ),
            (
                "growth per second that rises and falls is no steady growth",
                with_growth("second", vec![]).tap(|d| {
                    let g = d.growth.as_mut().unwrap();
                    g.tracked = [1u64, 9, 2, 8, 1, 9, 3, 7, 2, 9]
                        .iter()
                        .enumerate()
                        .map(|(i, &b)| GrowthPoint {
                            step: i as u64 + 1,
                            bytes: b * 100 * MIB,
                        })
                        .collect();
                }),
                OWN_ALLOCATIONS,
            ),
            (
                "growth per second that the framework counts as the model's parameters: a model \
                 being loaded",
                with_growth("second", vec![growth_site("load", 96 * MIB, 10)]).tap(|d| {
                    d.framework = Some(FrameworkOom {
                        kinds: Some(Kinds {
                            parameters_bytes: 900 * MIB,
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                }),
                OWN_ALLOCATIONS,
            ),
            (
                "the largest of two equal sites carries only half: still a leak at 50%",
                with_growth(
                    "step",
                    vec![
                        growth_site("a", 10 * MIB, 10),
                        growth_site("b", 10 * MIB, 10),
                    ],
                ),
                LEAK,
            ),
            (
                "three equal growing sites: the process grows, spread over them",
                with_growth(
                    "step",
                    vec![
                        growth_site("a", 10 * MIB, 10),
                        growth_site("b", 10 * MIB, 10),
                        growth_site("c", 10 * MIB, 10),
                    ],
                ),
                LEAK,
            ),
            (
                "the process grows but no site is kept (spread over too many stacks)",
                with_growth("step", vec![]).tap(|d| {
                    let g = d.growth.as_mut().unwrap();
                    g.tracked = (1..=10)
                        .map(|i| GrowthPoint {
                            step: i,
                            bytes: i * 50 * MIB,
                        })
                        .collect();
                }),
                LEAK,
            ),
            (
                "growth that stopped before the failure (the memory was freed since): what fills \
                 the device now is not this process's tracked memory",
                with_growth("step", vec![growth_site("keep", 96 * MIB, 10)]).tap(|d| {
                    d.devices[0].tracked_bytes = 100 * MIB;
                }),
                UNTRACKED_MEMORY,
            ),
            (
                "detected steps that never free: a loading loop, not a leak",
                with_growth("step", vec![growth_site("load_layer", 96 * MIB, 10)]).tap(|d| {
                    let g = d.growth.as_mut().unwrap();
                    g.steps = Some("detected".into());
                    g.detected = Some(DetectedSteps {
                        period: 2,
                        steps: 10,
                        allocations_since_last_step: 0,
                        intervals: 9,
                        freeing_intervals: 0,
                        anchor: vec![],
                    });
                }),
                OWN_ALLOCATIONS,
            ),
            (
                "no growth key",
                oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB),
                OWN_ALLOCATIONS,
            ),
            (
                "fell back a step and a half by the failure (it comes mid-step): still a leak",
                on_top_of(70 * GIB, None, 70 * GIB + 960 * MIB - 144 * MIB),
                LEAK,
            ),
            (
                "fell back by more than half of what it grew: a phase that freed its memory",
                on_top_of(70 * GIB, None, 70 * GIB + 4 * 96 * MIB),
                OWN_ALLOCATIONS,
            ),
            (
                "as many allocations live at the end as at the start: they grew larger",
                on_top_of(70 * GIB, Some((40, 40)), 70 * GIB + 960 * MIB),
                OWN_ALLOCATIONS,
            ),
            (
                "fewer allocations than one every other step: nothing accumulates",
                on_top_of(70 * GIB, Some((40, 43)), 70 * GIB + 960 * MIB),
                OWN_ALLOCATIONS,
            ),
            (
                "one allocation every other step or more: a leak",
                on_top_of(70 * GIB, Some((40, 44)), 70 * GIB + 960 * MIB),
                LEAK,
            ),
        ];
        for (name, dump, kind) in cases {
            let v = judge(&dump);
            assert_eq!(v.kind, kind, "{name}: {}", v.summary);
        }
        // A request larger than the device still wins over a leak.
        let mut d = with_growth("step", vec![growth_site("keep", 96 * MIB, 10)]);
        d.failed_request.as_mut().unwrap().bytes = 100 * GIB;
        assert_eq!(judge(&d).kind, REQUEST_EXCEEDS_DEVICE);
    }

    /// 96 MiB a step over 10 marked steps on top of `base`, fitted, with the live allocations
    /// of the fit's first and last sample; `now` tracked at the failure.
    fn on_top_of(base: u64, counts: Option<(u64, u64)>, now: u64) -> Dump {
        let mut d = with_growth("step", vec![growth_site("keep", 96 * MIB, 10)]);
        let g = d.growth.as_mut().unwrap();
        for p in g.tracked.iter_mut() {
            p.bytes += base;
        }
        g.fit = Some(GrowthFit {
            bytes_per_step: 96 * MIB,
            r_squared: 1.0,
            samples: 10,
            first: g.tracked[0].clone(),
            last: g.tracked[9].clone(),
            of: Some("tracked".into()),
            live_allocations: counts.map(|(first, last)| AllocationSpan { first, last }),
        });
        d.devices[0].tracked_bytes = now;
        d
    }

    trait Tap: Sized {
        fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
            f(&mut self);
            self
        }
    }

    impl Tap for Dump {}

    #[test]
    fn leak_verdict_names_site_rate_and_projection() {
        let v = judge(&with_growth(
            "step",
            vec![
                growth_site("keep_activations", 96 * MIB, 10),
                growth_site("small", 2 * MIB, 10),
            ],
        ));
        assert_eq!(v.kind, LEAK);
        let top = &v.findings[0];
        assert!(
            top.headline.starts_with(
                "keep_activations (train.py:12) grows by 96.00 MiB every step (over the last 10 marked steps;"
            ) && top.headline.contains("98.0% of the growth")
                && top.headline.ends_with(
                    "free memory would run out at step 12, but the 2.00 GiB request failed earlier, in step 11"
                ),
            "{}",
            top.headline
        );
        for needle in [
            "grows by 98.00 MiB every step",
            "10 marked steps observed",
            "98.0% (96.00 MiB per step) at keep_activations (train.py:12)",
            "2.0% (2.00 MiB per step) at small (train.py:12)",
            "would run out at step 12; the failure came earlier, at step 11, because the failed request of \
             2.00 GiB is larger than what was still free",
        ] {
            assert!(v.summary.contains(needle), "{needle}: {}", v.summary);
        }
        assert!(
            v.evidence
                .iter()
                .any(|e| e
                    .starts_with("growth: keep_activations (train.py:12) adds 96.00 MiB per step")),
            "{:#?}",
            v.evidence
        );
        let s = v.suggestions.join("\n");
        for needle in ["loss.item()", "detach().cpu()", "append"] {
            assert!(s.contains(needle), "{needle}: {s}");
        }
        // Spread: no site carries half; the headline names the process and its parts.
        let spread = judge(&with_growth(
            "step",
            vec![
                growth_site("a", 10 * MIB, 10),
                growth_site("b", 10 * MIB, 10),
                growth_site("c", 10 * MIB, 10),
            ],
        ));
        assert!(
            spread.findings[0].headline.starts_with(
                "the process grows by 30.00 MiB every step (over the last 10 marked steps; "
            ),
            "{}",
            spread.findings[0].headline
        );
        assert!(
            spread.findings[0]
                .headline
                .contains("spread over sites: 33.3% (10.00 MiB per step) at a"),
            "{}",
            spread.findings[0].headline
        );
        // The advice does not single out the first of them.
        assert!(
            spread
                .suggestions
                .iter()
                .any(|s| s.starts_with("Find what each of the sites named above keeps")),
            "{:?}",
            spread.suggestions
        );
    }

    #[test]
    fn a_leak_over_time_is_said_per_second_with_its_fit() {
        let v = judge(&with_growth(
            "second",
            vec![growth_site("alloc_forever", 32 * MIB, 10)],
        ));
        assert_eq!(v.kind, LEAK, "{}", v.summary);
        let f = &v.findings[0];
        assert!(
            f.headline.starts_with(
                "alloc_forever (train.py:12) grows by 32.00 MiB every second (steadily over the last 10 seconds, R² 1.00;"
            ),
            "{}",
            f.headline
        );
        assert!(!f.headline.contains("step"), "{}", f.headline);
        assert!(
            f.summary
                .contains("The program marks no steps and no repeating step was found"),
            "{}",
            f.summary
        );
        assert!(f.evidence.iter().any(|e| e.starts_with(
            "growth of the process: 32.00 MiB per second (R² 1.00 over the last 10 seconds)"
        )));
        assert!(f.suggestions.iter().any(|s| s.contains("Mark steps")));
    }

    #[test]
    fn detected_steps_support_a_leak_only_when_steps_free_memory() {
        let detected = |intervals, freeing| DetectedSteps {
            period: 2,
            steps: 20,
            allocations_since_last_step: 1,
            intervals,
            freeing_intervals: freeing,
            anchor: growing("keep_activations", 1, 2).stack,
        };
        // (intervals, freeing, leak?)
        for (intervals, freeing, leak) in
            [(10, 5, true), (10, 4, false), (10, 10, true), (0, 0, false)]
        {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
            d.growth = Some(growth(
                "detected",
                growing("keep_activations", 96 * MIB, 20),
                Some(detected(intervals, freeing)),
            ));
            let v = judge(&d);
            check_common(&v);
            if leak {
                assert_eq!(kinds(&v), [LEAK], "{intervals}/{freeing}");
                let f = &v.findings[0];
                // 19 steps of growth over the samples, and at most one more up to the failure.
                assert_eq!(f.bytes, 20 * 96 * MIB);
                assert!(
                    f.headline.contains("the last 20 detected steps"),
                    "{}",
                    f.headline
                );
                assert!(
                    f.summary.contains("Steps were detected automatically"),
                    "{}",
                    f.summary
                );
                assert!(f.evidence.iter().any(
                    |e| e.starts_with("steps: detected, not marked (a cycle of 2 allocations")
                ));
                assert!(f.suggestions.iter().any(|s| s.contains("oomshim.step()")));
                assert!(v
                    .evidence
                    .iter()
                    .any(|e| e.starts_with("steps detected automatically")));
            } else {
                assert_eq!(kinds(&v), [OWN_ALLOCATIONS], "{intervals}/{freeing}");
            }
        }
        // Marked steps need no such check.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        d.growth = Some(growth("marked", growing("keep", 96 * MIB, 20), None));
        let v = judge(&d);
        assert_eq!(kinds(&v), [LEAK]);
        assert!(v.findings[0]
            .evidence
            .iter()
            .any(|e| e.contains("marked by the program")));
        assert!(!v.suggestions.iter().any(|s| s.contains("oomshim.step()")));
    }

    /// The leak finding of `d` judged as a post-mortem (the program died instead of failing).
    fn post_mortem_leak(d: &Dump) -> crate::verdict::Finding {
        let mut pm = d.clone();
        pm.post_mortem = Some(PostMortem::default());
        crate::verdict::judge_post_mortem(&pm)
            .findings
            .into_iter()
            .find(|f| f.kind == LEAK)
            .expect("a leak finding")
    }

    /// A leak by step under preload whose shim site names `opt.step()` (torch cut the new
    /// segments there), with torch's records of the tensors allocated since the growth began.
    fn leak_with_records(record_line: u32, recorded_share: u64) -> Dump {
        let mut site = growth_site("train", 96 * MIB, 10);
        site.stack[0].line = Some(30);
        let mut d = with_growth("step", vec![site]);
        d.framework = Some(FrameworkOom {
            name: "torch".into(),
            attribution: Some(Attribution {
                recorded_bytes: 100 * MIB,
                lines: vec![AttributedLine {
                    file: "/home/u/train.py".into(),
                    line: record_line,
                    function: "train".into(),
                    bytes: recorded_share * MIB,
                    blocks: 10,
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        d
    }

    #[test]
    fn torch_records_name_the_leak_at_the_failure_as_after_death() {
        // The records' line (train.py:25, 90% of what was recorded) is not the shim's site
        // (train.py:30): the records name the leak, in the out-of-memory verdict and the
        // post-mortem alike.
        let d = leak_with_records(25, 90);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(v.kind, LEAK);
        assert!(
            v.headline()
                .starts_with("train (train.py:25) holds the growth (90.0% of the tensors"),
            "{}",
            v.headline()
        );
        let leak = post_mortem_leak(&d);
        assert!(
            leak.headline
                .contains("train (train.py:25) holds the growth"),
            "{}",
            leak.headline
        );

        // The same line as the shim's site: the shim's words, not the records'.
        let v = judge(&leak_with_records(30, 90));
        assert!(
            v.headline().starts_with("train (train.py:30) grows by"),
            "{}",
            v.headline()
        );
        // Records whose top line holds under half of what they recorded do not override a
        // line the shim names.
        let v = judge(&leak_with_records(25, 40));
        assert!(
            v.headline().starts_with("train (train.py:30) grows by"),
            "{}",
            v.headline()
        );
    }

    #[test]
    fn records_spread_over_many_lines_name_no_single_line() {
        // A leak spread over twelve lines (8.3% each by torch's records) while the shim's site
        // names no line of the program (torch's segments): the headline says how the growth is
        // spread, never that the first of the twelve holds it; the post-mortem says the same.
        let mut site = growth_site("train", 96 * MIB, 10);
        site.grouped_by = Some("no_python".into());
        let mut d = with_growth("step", vec![site]);
        d.framework = Some(FrameworkOom {
            name: "torch".into(),
            attribution: Some(Attribution {
                recorded_bytes: 96 * MIB,
                lines: (0..12)
                    .map(|i| AttributedLine {
                        file: "/home/u/train.py".into(),
                        line: 18 + i,
                        function: "keep_metrics".into(),
                        bytes: 8 * MIB,
                        blocks: 10,
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let spread =
            "spread over lines (torch's records of the tensors allocated since it began): \
                      8.3% at keep_metrics (train.py:18), 8.3% at keep_metrics (train.py:19), \
                      8.3% at keep_metrics (train.py:20)";
        let v = judge(&d);
        check_common(&v);
        assert_eq!(v.kind, LEAK);
        assert!(
            v.headline()
                .starts_with("the process grows by 96.00 MiB every step")
                && v.headline().contains(spread),
            "{}",
            v.headline()
        );
        assert!(
            v.suggestions
                .iter()
                .any(|s| s.starts_with("Find what each of the lines named above keeps")),
            "{:?}",
            v.suggestions
        );
        let leak = post_mortem_leak(&d);
        assert!(
            leak.headline
                .starts_with("leak: the process grows by 96.00 MiB every step")
                && leak.headline.contains(spread),
            "{}",
            leak.headline
        );
    }
    /// Growth over time from the allocation timeline: one site keeping `per_s` a second over
    /// `span_ms`, in `allocations`, quiet for `quiet_ms` at the end.
    fn on_timeline(name: &str, per_s: u64, span_ms: u64, allocations: u64, quiet_ms: u64) -> Dump {
        let mut d = with_growth("second", vec![growth_site(name, per_s, 10)]);
        let g = d.growth.as_mut().unwrap();
        g.steps = Some("timeline".into());
        g.sites[0].share = Some(1.0);
        g.timeline = Some(Timeline {
            age_ms: span_ms,
            span_ms,
            allocations,
            freed: 0,
            freed_all: 0,
            quiet_ms,
            kept_check: None,
        });
        d
    }

    /// Why the timeline judges the growth no leak, as the variant's name (with its fields but
    /// for `Young`'s, which carry the thresholds).
    fn why(d: &Dump) -> Option<Result<(), String>> {
        crate::verdict::timeline_judgement(d).map(|r| {
            r.map_err(|o| match o.why {
                crate::verdict::NotALeak::Young { .. } => "Young".to_string(),
                why => format!("{why:?}"),
            })
        })
    }

    #[test]
    fn growth_over_time_is_a_leak_only_when_long_enough_kept_and_still_going() {
        use crate::verdict::{TIMELINE_MIN_ALLOCATIONS, TIMELINE_MIN_SPAN_MS};
        // 8 MiB every 30 ms for 2.7 s: a leak.
        let leak = on_timeline("session_cache", 266 * MIB, 2_700, 90, 20);
        assert_eq!(why(&leak), Some(Ok(())));
        let v = judge(&leak);
        assert_eq!(v.kind, LEAK, "{}", v.summary);
        let h = &v.findings[0].headline;
        assert!(
            h.contains("session_cache (train.py:12) grows by 266.00 MiB every second")
                && h.contains("steadily over its last 2.7 s, 90 allocations kept"),
            "{h}"
        );
        assert!(v.findings[0]
            .summary
            .contains("fitted from the live allocations' own timestamps"));
        // (span ms, allocations, quiet ms, why)
        let cases: Vec<(u64, u64, u64, &str)> = vec![
            (TIMELINE_MIN_SPAN_MS - 1, 90, 20, "Young"),
            // A growth fitted over less than the program's age is judged by the age.
            (1_500, 90, 20, "age 3000"),
            (2_700, TIMELINE_MIN_ALLOCATIONS - 1, 20, "Young"),
            (2_700, 90, 1_500, "Stopped { quiet_ms: 1500 }"),
            // A slow leak's usual gap is long: four gaps of quiet are still growing.
            (60_000, 30, 3_000, ""),
        ];
        for (span, allocations, quiet, expect) in cases {
            let mut d = on_timeline("keep", 8 * MIB, span, allocations, quiet);
            let expect = match expect.strip_prefix("age ") {
                Some(age) => {
                    let t = d.growth.as_mut().unwrap().timeline.as_mut().unwrap();
                    t.age_ms = age.parse().unwrap();
                    ""
                }
                None => expect,
            };
            match why(&d) {
                Some(Ok(())) => assert_eq!(expect, "", "{span} {allocations} {quiet}"),
                Some(Err(w)) => assert_eq!(w, expect, "{span} {allocations} {quiet}"),
                None => panic!("judged: {span} {allocations} {quiet}"),
            }
            if !expect.is_empty() {
                assert_ne!(judge(&d).kind, LEAK, "{expect}");
            }
        }
        // Young growth in a program that frees and is much older: recent allocations, said
        // nothing of.
        let mut recent = on_timeline("keep", 8 * MIB, 500, 16, 20);
        let t = recent.growth.as_mut().unwrap().timeline.as_mut().unwrap();
        t.age_ms = 10_000;
        t.freed_all = 300;
        assert!(why(&recent).is_none());
        // The samples with frees saw the tracked bytes stay flat: an evicting cache.
        let mut evicting = on_timeline("bounded_cache", 266 * MIB, 5_000, 160, 20);
        evicting
            .growth
            .as_mut()
            .unwrap()
            .timeline
            .as_mut()
            .unwrap()
            .kept_check = Some(KeptCheck {
            over_ms: 4_000,
            actual_bytes: 8 * MIB as i64,
            kept_bytes: 1_000 * MIB,
        });
        assert_eq!(why(&evicting), Some(Err("NotKept".into())));
        assert_ne!(judge(&evicting).kind, LEAK);
    }

    /// A loop keeping each output in a global list fills an H200 in 0.2 s: too young for the
    /// time rule, but the framework's count found the list holding the growth, so it is a leak
    /// (named with the list); the same young growth with no container, or a container holding
    /// little of it, stays too young to judge.
    #[test]
    fn young_growth_held_by_a_container_of_the_program_is_a_leak() {
        use dump::model::{Keeper, Kinds};
        let young = || {
            let mut d = on_timeline("keep", 8 * GIB, 200, 76, 5);
            d.growth.as_mut().unwrap().timeline.as_mut().unwrap().age_ms = 300;
            d
        };
        let d = young();
        assert_eq!(why(&d), Some(Err("Young".into())));
        let grew = super::growth_fit(d.growth.as_ref().unwrap())
            .unwrap()
            .grew_bytes();
        let with_keeper = |bytes: u64, tensors: u64| {
            let mut d = young();
            let mut fw = d.framework.clone().unwrap_or_default();
            fw.kinds = Some(Kinds {
                activations_bytes: Some(grew),
                keepers: vec![Keeper {
                    container: "list".into(),
                    name: "history".into(),
                    scope: "a global of __main__".into(),
                    bytes,
                    tensors,
                    file: Some("train.py".into()),
                    line: Some(20),
                }],
                ..Default::default()
            });
            d.framework = Some(fw);
            d
        };
        let kept = with_keeper(grew, 76);
        assert_eq!(why(&kept), Some(Ok(())));
        let v = judge(&kept);
        assert_eq!(v.kind, LEAK, "{}", v.summary);
        assert!(
            v.findings[0].headline.contains("list `history`"),
            "{}",
            v.findings[0].headline
        );
        // A container holding a third of the growth, or a handful of tensors, is not the reason.
        assert_eq!(why(&with_keeper(grew / 3, 76)), Some(Err("Young".into())));
        assert_eq!(why(&with_keeper(grew, 4)), Some(Err("Young".into())));
    }

    /// The curriculum of an H100 run under preload: the batch doubles every two optimizer steps
    /// and nothing is kept across steps. torch's segments (`tracked`) grow with each larger
    /// batch; torch's own count of its live tensors at the step ends (`framework_live`) grows
    /// only by the step's input, still live when the optimizer steps; the dump's writer fitted
    /// that count and found no steady growth (no `fit`). `live` and `tracked` in MiB per step.
    fn batch_doubling(live: &[u64], tracked: &[u64]) -> Dump {
        let mut d = oom_dump(9 * GIB, Some(79 * GIB), Some(8 * GIB), 70 * GIB);
        let series = |v: &[u64]| -> Vec<GrowthPoint> {
            v.iter()
                .enumerate()
                .map(|(i, &b)| GrowthPoint {
                    step: i as u64 + 1,
                    bytes: b * MIB,
                })
                .collect()
        };
        d.growth = Some(Growth {
            unit: "step".into(),
            steps: Some("optimizer".into()),
            samples: tracked.len() as u64,
            current: tracked.len() as u64,
            free_bytes: Some(8 * GIB),
            tracked: series(tracked),
            framework_live: series(live),
            ..Default::default()
        });
        d.framework = Some(FrameworkOom {
            kinds: Some(Kinds {
                parameters_bytes: 512 * MIB,
                optimizer_state_bytes: 512 * MIB,
                activations_bytes: Some(68 * GIB),
                phase: Some("forward".into()),
                batch: Some(296_448),
                complete: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        d
    }

    /// The H100 run's series (rounded to MiB).
    const CURRICULUM_TRACKED: [u64; 16] = [
        2010, 2146, 2504, 2504, 3818, 3818, 6428, 6428, 11648, 11648, 22070, 22070, 42914, 42914,
        46152, 47310,
    ];
    const CURRICULUM_LIVE: [u64; 16] = [
        1606, 1606, 1610, 1610, 1619, 1619, 1637, 1637, 1674, 1674, 1746, 1746, 1891, 1891, 2181,
        2181,
    ];

    #[test]
    fn a_batch_that_doubles_grows_torchs_cache_not_a_leak() {
        let d = batch_doubling(&CURRICULUM_LIVE, &CURRICULUM_TRACKED);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(v.kind, OWN_ALLOCATIONS, "{}", v.summary);
        let top = &v.findings[0];
        assert!(
            top.headline
                .starts_with("activations and other live tensors fill device 0"),
            "{}",
            top.headline
        );
        // Says why the growth is none: torch's segments grew, its live tensors did not.
        let line = top
            .evidence
            .iter()
            .find(|e| e.starts_with("torch's segments grew"))
            .unwrap_or_else(|| panic!("{:#?}", top.evidence));
        assert!(
            line.contains("over the last 9 optimizer steps")
                && line.contains(
                    "while its live tensors at the step ends went from 1.60 GiB to 2.13 GiB"
                )
                && line.contains("no leak"),
            "{line}"
        );
        assert!(
            top.summary.contains("what grew is torch's cache"),
            "{}",
            top.summary
        );
        assert!(
            top.suggestions
                .iter()
                .any(|s| s.contains("grows with its inputs")),
            "{:#?}",
            top.suggestions
        );
        assert!(!v
            .evidence
            .iter()
            .any(|e| e.starts_with("growth of the process")));
    }

    /// Shapes beside the curriculum: each `(name, live, tracked, kind)`, MiB per step.
    #[test]
    fn batch_growth_is_no_leak_and_what_is_kept_beside_it_is() {
        let doubling_each_step: Vec<u64> = (0..8).map(|i| 500 << i).collect();
        let live_flat = vec![1600; 8];
        let once_then_flat: Vec<u64> = (0..12).map(|i| if i < 3 { 2000 } else { 9000 }).collect();
        // A leak that keeps 300 MiB a step while the batch doubles: the framework's count grows
        // (the writer fitted it), with a tensor more at each step end.
        let leak_live: Vec<u64> = (0..8).map(|i| 1600 + 300 * i).collect();
        let cases: Vec<(&str, Dump, &str)> = vec![
            (
                "the batch doubles every step, the live tensors stay",
                batch_doubling(&live_flat, &doubling_each_step),
                OWN_ALLOCATIONS,
            ),
            (
                "the batch grows once and then stays",
                batch_doubling(&live_flat, &once_then_flat),
                OWN_ALLOCATIONS,
            ),
            (
                "a leak beside a growing batch",
                batch_doubling(&leak_live, &doubling_each_step).tap(|d| {
                    let g = d.growth.as_mut().unwrap();
                    g.fit = Some(GrowthFit {
                        bytes_per_step: 300 * MIB,
                        r_squared: 1.0,
                        samples: 8,
                        first: g.framework_live[0].clone(),
                        last: g.framework_live[7].clone(),
                        of: Some("framework_live".into()),
                        live_allocations: Some(AllocationSpan {
                            first: 60,
                            last: 67,
                        }),
                    });
                    d.free_blocks.allocated_bytes = Some(g.framework_live[7].bytes);
                }),
                LEAK,
            ),
            (
                "no framework count (an older dump, or no hook): the tracked bytes are fitted",
                batch_doubling(&[], &leak_live),
                LEAK,
            ),
        ];
        for (name, dump, kind) in cases {
            let v = judge(&dump);
            check_common(&v);
            assert_eq!(v.kind, kind, "{name}: {}", v.summary);
        }
    }

    /// Growth over time at a site inside torch's `Module._apply` (a model moved to the device).
    fn loading_for(span_ms: u64) -> Dump {
        let mut d = on_timeline("main", 2 * GIB, span_ms, 300, 20);
        let site = &mut d.growth.as_mut().unwrap().sites[0];
        site.stack.push(Frame {
            address: "0x2".into(),
            function: Some("_apply".into()),
            file: Some("/usr/lib/python3/site-packages/torch/nn/modules/module.py".into()),
            line: Some(900),
            ..Frame::default()
        });
        d
    }

    #[test]
    fn growth_inside_a_function_that_loads_a_model_is_loading() {
        let d = loading_for(5_000);
        match crate::verdict::timeline_judgement(&d) {
            Some(Err(o)) => {
                assert!(matches!(o.why, crate::verdict::NotALeak::Loading { .. }));
                let line = crate::verdict::words::leak::not_a_leak(&o);
                assert!(
                    line.starts_with("loading: main (train.py:12) grew by")
                        && line.contains("inside _apply (torch/nn/modules/module.py): a model being loaded, not a leak"),
                    "{line}"
                );
            }
            _ => panic!("not judged loading"),
        }
        let v = judge(&d);
        assert_ne!(v.kind, LEAK);
        assert!(
            v.evidence.iter().any(|e| e.starts_with("loading: ")),
            "{:?}",
            v.evidence
        );
    }

    /// A load quicker than the timeline's bins has no measured span (0) or one that rounds to
    /// nothing: the words say how long it took only where that is true, never `over 0.0 s`.
    #[test]
    fn a_load_too_quick_to_measure_says_no_span_of_nothing() {
        for (span_ms, said) in [
            (0, " GiB inside _apply"),
            (30, " GiB over 30 ms inside _apply"),
            (300, " GiB over 300 ms inside _apply"),
            (2_700, " GiB over 2.7 s inside _apply"),
        ] {
            let d = loading_for(span_ms);
            let Some(Err(o)) = crate::verdict::timeline_judgement(&d) else {
                panic!("{span_ms} ms: not judged loading");
            };
            let line = crate::verdict::words::leak::not_a_leak(&o);
            assert!(line.contains(said), "{span_ms} ms: {line}");
            assert!(!line.contains("0.0 s"), "{span_ms} ms: {line}");
        }
    }
}
