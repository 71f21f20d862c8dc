//! Reading the histories: for a dump, the chosen history copied out under the lock and turned
//! into the dump's [`Growth`] (the process's fitted growth, and its attribution to sites, with
//! native stacks grouped by the frame that names them); for the Python hook, whether a marked
//! history grows.

use super::history::{AutoMode, Histories, History};
use super::model::{SiteKey, SiteKeyer, StackPair, StepSource, MAX_REPORTED, SUSPECT_MIN_SAMPLES};
use super::timeline::Timeline;
use super::tracker::Tracker;
use dump::fit;
use dump::model::{
    AllocationSpan, DetectedSteps, Frame, Growth, GrowthFit, GrowthPoint, GrowthSite,
};
use oomshim_host::ledger::Ledger;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

impl Tracker {
    /// True when `source`'s history grows steadily up to now (at least [`SUSPECT_MIN_SAMPLES`]
    /// samples, `min_bytes_per_step` a step): the Python hook then asks torch to record where
    /// each new tensor comes from. A few microseconds (a fit over at most [`RING`] samples).
    pub fn growing(&self, source: StepSource, min_bytes_per_step: u64) -> bool {
        let Some(h) = self.lock() else { return false };
        let marked = &h.marked[source as usize];
        let series = if marked.framework_live.is_empty() {
            &marked.totals
        } else {
            &marked.framework_live
        };
        let totals: Vec<(u64, u64)> = series.iter().copied().collect();
        drop(h);
        totals.len() >= SUSPECT_MIN_SAMPLES
            && fit::growing_suffix(&totals)
                .is_some_and(|(f, _)| f.slope >= min_bytes_per_step as f64)
    }

    /// The growth for a dump; `None` before two samples of steps, or without steps before any
    /// live device allocation. `free_bytes`: the failing (or current) device's free bytes, for
    /// projections; `now_ns`: the shim's clock now; `name`: frames of representative stack
    /// pairs (symbolised in one batch).
    pub fn analyse(
        &self,
        free_bytes: Option<u64>,
        ledger: &Ledger,
        keyer: &dyn SiteKeyer,
        now_ns: u64,
        name: impl FnMut(&[StackPair]) -> Vec<Vec<Frame>>,
    ) -> Option<Growth> {
        Some(self.freeze(ledger, keyer, now_ns)?.growth(free_bytes, name))
    }

    /// The history a dump will describe, copied now (a failure's, taken on the failing thread:
    /// a program that keeps stepping after its failure must not push the growth that led to it
    /// out of the rings before the dump is written). With steps, `None` before two samples;
    /// copies at most [`MAX_SITES`](super::model::MAX_SITES) × [`RING`](super::model::RING) samples. Without
    /// steps, the live allocations binned by time ([`super::timeline`]). Names nothing.
    pub fn freeze(&self, ledger: &Ledger, keyer: &dyn SiteKeyer, now_ns: u64) -> Option<Frozen> {
        let seq_now = ledger.total_allocations();
        let copy = {
            let h = self.lock()?;
            let source = self.chosen_source(&h);
            let (history, steps) = match source {
                Some(s) => (&h.marked[s as usize], s.word()),
                // Marks stopped detection and time buckets: what those sampled is stale.
                None if self.marked_any() => return None,
                None if h.auto_mode == AutoMode::Time => {
                    // Growth over time: the allocations' own timestamps, with the once-a-second
                    // samples (frees counted) as the check of what was kept.
                    let actual: Vec<(u64, u64)> = h.auto.totals.iter().copied().collect();
                    let first_ns = h.first_ns;
                    // The walk of every live allocation happens without the histories' lock: a
                    // time-bucket sample on an allocating thread waits for that lock.
                    drop(h);
                    let mut keys = rustc_hash::FxHashMap::default();
                    return super::timeline::capture(
                        ledger, keyer, &mut keys, now_ns, first_ns, actual,
                    )
                    .map(|t| Frozen(FrozenKind::Timeline(t)));
                }
                None => (&h.auto, "detected"),
            };
            if history.samples < 2 {
                return None;
            }
            Copy::of(history_view(history), steps)
        };
        let detected = (copy.steps == "detected")
            .then(|| {
                // Never blocking (a fork may have copied it held); a busy detector is asked
                // again.
                (0..1000).find_map(|_| match self.detector.try_lock() {
                    Ok(d) => Some((
                        d.period,
                        d.steps,
                        seq_now.saturating_sub(d.last_seq),
                        d.anchor_stack,
                    )),
                    Err(std::sync::TryLockError::Poisoned(e)) => {
                        let d = e.into_inner();
                        Some((
                            d.period,
                            d.steps,
                            seq_now.saturating_sub(d.last_seq),
                            d.anchor_stack,
                        ))
                    }
                    Err(std::sync::TryLockError::WouldBlock) => {
                        std::thread::yield_now();
                        None
                    }
                })
            })
            .flatten()
            .map(|(period, steps, since, anchor)| Detected {
                period,
                steps,
                since,
                anchor,
            });
        Some(Frozen(FrozenKind::History { copy, detected }))
    }

    /// The marked source whose history describes the phase at hand: the program's own marks
    /// when it marks any; else forward passes during an evaluation phase (several since the last
    /// optimizer step), else optimizer steps, else forward passes.
    fn chosen_source(&self, h: &Histories) -> Option<StepSource> {
        let has = |s: StepSource| h.marked[s as usize].samples >= 2;
        if has(StepSource::Program) {
            return Some(StepSource::Program);
        }
        let evaluating = self.forwards_since_optimizer.load(Ordering::Relaxed) >= 2;
        if has(StepSource::Forward) && (evaluating || !has(StepSource::Optimizer)) {
            return Some(StepSource::Forward);
        }
        has(StepSource::Optimizer).then_some(StepSource::Optimizer)
    }
}

fn history_view(h: &History) -> View<'_> {
    View {
        samples: h.samples,
        totals: &h.totals,
        framework_live: &h.framework_live,
        counts: &h.counts,
        framework_counts: &h.framework_counts,
        sites: h
            .sites
            .iter()
            .map(|(k, s)| (*k, s.stack, &s.samples))
            .collect(),
        intervals: h.intervals,
        freeing_intervals: h.freeing_intervals,
    }
}

/// A history copied out at one moment ([`Tracker::freeze`]), turned into the dump's growth
/// later, on whichever thread writes the dump.
#[derive(Clone)]
pub(crate) struct Frozen(FrozenKind);

#[derive(Clone)]
enum FrozenKind {
    /// Samples at steps (marked or detected).
    History {
        copy: Copy,
        detected: Option<Detected>,
    },
    /// No steps: the allocation timeline.
    Timeline(Timeline),
}

impl Frozen {
    /// The dump's growth: see [`Tracker::analyse`].
    pub fn growth(
        self,
        free_bytes: Option<u64>,
        name: impl FnMut(&[StackPair]) -> Vec<Vec<Frame>>,
    ) -> Growth {
        match self.0 {
            FrozenKind::History { copy, detected } => copy.growth(free_bytes, detected, name),
            FrozenKind::Timeline(t) => t.growth(free_bytes, name),
        }
    }
}

/// A site's samples: (step or second, live bytes).
type Series = Vec<(u64, u64)>;

/// A history as seen under its lock.
pub(super) struct View<'a> {
    pub samples: u64,
    pub totals: &'a VecDeque<(u64, u64)>,
    pub framework_live: &'a VecDeque<(u64, u64)>,
    pub counts: &'a VecDeque<(u64, u64)>,
    pub framework_counts: &'a VecDeque<(u64, u64)>,
    pub sites: Vec<SiteView<'a>>,
    pub intervals: u64,
    pub freeing_intervals: u64,
}

/// One site of a [`View`]: its key, a representative stack pair, its samples.
pub(super) type SiteView<'a> = (SiteKey, StackPair, &'a VecDeque<(u64, u64)>);

/// The same, copied out so the lock is released before stacks are symbolised.
#[derive(Clone)]
pub(super) struct Copy {
    pub steps: &'static str,
    samples: u64,
    totals: Series,
    framework_live: Series,
    counts: Series,
    framework_counts: Series,
    sites: Vec<(SiteKey, StackPair, Series)>,
    intervals: u64,
    freeing_intervals: u64,
}

/// The detector's state, for `growth.detected`.
#[derive(Clone)]
pub(super) struct Detected {
    pub period: u64,
    pub steps: u64,
    pub since: u64,
    pub anchor: StackPair,
}

impl Copy {
    pub fn of(v: View<'_>, steps: &'static str) -> Copy {
        Copy {
            steps,
            samples: v.samples,
            totals: v.totals.iter().copied().collect(),
            framework_live: v.framework_live.iter().copied().collect(),
            counts: v.counts.iter().copied().collect(),
            framework_counts: v.framework_counts.iter().copied().collect(),
            sites: v
                .sites
                .into_iter()
                .map(|(k, s, pts)| (k, s, pts.iter().copied().collect()))
                .collect(),
            intervals: v.intervals,
            freeing_intervals: v.freeing_intervals,
        }
    }

    pub fn growth(
        self,
        free_bytes: Option<u64>,
        detected: Option<Detected>,
        mut name: impl FnMut(&[StackPair]) -> Vec<Vec<Frame>>,
    ) -> Growth {
        let current = self.totals.last().map_or(0, |t| t.0);
        // The framework's own count of its live tensors, when every sample has one: under
        // preload the tracked bytes are its segments, which a cache of varying shapes grows
        // without any tensor being kept.
        let live =
            self.framework_live.len() == self.totals.len() && !self.framework_live.is_empty();
        let fitted: &Series = if live {
            &self.framework_live
        } else {
            &self.totals
        };
        let total_fit = fit::growing_suffix(fitted);
        // Samples from here on are the stretch the growth is measured over.
        let from_x = total_fit.map(|(_, start)| fitted[start].0);

        let mut pairs: Vec<StackPair> = self.sites.iter().map(|s| s.1).collect();
        if let Some(d) = &detected {
            pairs.push(d.anchor);
        }
        let mut frames = name(&pairs);
        frames.resize(pairs.len(), Vec::new());
        let anchor = detected
            .as_ref()
            .and_then(|_| frames.pop())
            .unwrap_or_default();

        let groups = super::grouping::group(self.sites, frames);
        // The step in which the free bytes run out at this rate: the step in progress is
        // `current + 1`, and each whole step's worth of free bytes lets one more complete.
        let projected = |rate: f64| -> Option<u64> {
            let free = free_bytes?;
            (rate >= 1.0).then(|| current + 1 + (free as f64 / rate).floor() as u64)
        };
        let mut sites: Vec<(f64, GrowthSite)> = groups
            .into_iter()
            .filter_map(|g| {
                let pts: Vec<(u64, u64)> = match from_x {
                    Some(x) => g.series.iter().copied().filter(|p| p.0 >= x).collect(),
                    None => g.series.clone(),
                };
                let (slope, r2, n) = match (&total_fit, from_x) {
                    // Attribution of the fitted growth: any rising slope over the stretch.
                    (Some(_), Some(_)) => {
                        let f = fit::line(&pts)?;
                        (f.slope, f.r2, f.n)
                    }
                    // No steady growth of the process: only sites that grow steadily themselves.
                    _ => {
                        let f = fit::growing(&pts)?;
                        (f.slope, f.r2, f.n)
                    }
                };
                if slope < 1.0 {
                    return None;
                }
                let first = *pts.first()?;
                let last = *pts.last()?;
                let share = total_fit.map(|(f, _)| (slope / f.slope).clamp(0.0, 1.0));
                Some((
                    slope,
                    GrowthSite {
                        bytes_per_step: slope.round() as u64,
                        r_squared: round3(r2),
                        samples: n as u64,
                        first: point(first),
                        last: point(last),
                        projected_oom_step: projected(slope),
                        stack: g.stack,
                        share: share.map(round3),
                        grouped_by: Some(g.key.word().to_string()),
                    },
                ))
            })
            .collect();
        sites.sort_by(|a, b| b.0.total_cmp(&a.0));
        sites.truncate(MAX_REPORTED);
        let rate = match total_fit {
            Some((f, _)) => f.slope,
            None => sites.iter().map(|s| s.0).sum(),
        };
        // Live allocations at the first and last fitted sample, from the series that pairs the
        // fitted one sample for sample (none when it does not).
        let counts = if live {
            &self.framework_counts
        } else {
            &self.counts
        };
        let paired = counts.len() == fitted.len()
            && counts.iter().zip(fitted.iter()).all(|(c, b)| c.0 == b.0);
        let fit_out = total_fit.map(|(f, start)| GrowthFit {
            live_allocations: paired.then(|| AllocationSpan {
                first: counts[start].1,
                last: counts[counts.len() - 1].1,
            }),
            bytes_per_step: f.slope.round() as u64,
            r_squared: round3(f.r2),
            samples: f.n as u64,
            first: point(fitted[start]),
            last: point(*fitted.last().expect("a fit has points")),
            of: Some(if live { "framework_live" } else { "tracked" }.to_string()),
        });
        Growth {
            unit: if self.steps == "time" {
                "second"
            } else {
                "step"
            }
            .to_string(),
            steps: Some(self.steps.to_string()),
            detected: detected.map(|d| DetectedSteps {
                period: d.period,
                steps: d.steps,
                allocations_since_last_step: d.since,
                intervals: self.intervals,
                freeing_intervals: self.freeing_intervals,
                anchor,
            }),
            samples: self.samples,
            current,
            free_bytes,
            projected_oom_step: projected(rate),
            sites: sites.into_iter().map(|s| s.1).collect(),
            tracked: self.totals.iter().map(|&p| point(p)).collect(),
            framework_live: self.framework_live.iter().map(|&p| point(p)).collect(),
            fit: fit_out,
            timeline: None,
        }
    }
}

fn point((step, bytes): (u64, u64)) -> GrowthPoint {
    GrowthPoint { step, bytes }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
