//! Growth over time from the allocation timeline, for programs that mark no steps and repeat
//! none: the device bytes the process still holds, summed by when each live allocation was made
//! (its own timestamp in the ledger), per site and in all. Such a series never falls: it shows
//! what was *kept* of what was allocated when, and a leak is what keeps being kept. It needs no
//! sample of its own (a program killed in its first second has one), and it does not depend on
//! how many summaries were published.
//!
//! What it cannot see is memory allocated then and freed since: the frees are read from the
//! tracker's once-a-second samples of the tracked bytes (with frees counted) where two or more
//! fall into the growth (`Timeline::kept_check`), and from the allocation sequence numbers (the
//! allocations made during the growth that are not live any more, `Timeline::freed`).
//!
//! Cold path only: [`capture`] walks the live allocations once (as a snapshot does) and bins
//! them into [`BINS`] stretches of time from the oldest to now; [`Timeline::growth`] fits the
//! bins, with the site names taken then.

use super::model::{SiteKey, SiteKeyer, StackPair, MAX_REPORTED, MAX_SITES};
use dump::fit;
use dump::model::{Frame, Growth, GrowthFit, GrowthPoint, GrowthSite, KeptCheck};
use oomshim_host::ledger::Ledger;
use rustc_hash::FxHashMap;

/// Stretches of time the span is cut into: the fit's points.
pub const BINS: usize = 128;
/// Points kept in the dump's `tracked` series (whole seconds).
const SHOWN_POINTS: usize = 64;

/// One site's live bytes and allocations by the bin they were made in.
#[derive(Clone)]
struct SiteBins {
    key: SiteKey,
    /// The stack pair with the most live bytes: what names the site.
    stack: StackPair,
    stack_bytes: u64,
    bytes: Vec<u64>,
    /// Time of its newest live allocation, milliseconds since the shim started.
    newest_ms: u64,
}

/// The live allocations binned by time, captured at one moment ([`capture`]).
#[derive(Clone)]
pub(crate) struct Timeline {
    /// Shim clock, milliseconds: the capture, and the oldest live device allocation.
    now_ms: u64,
    t0_ms: u64,
    /// Width of a bin, milliseconds (at least 1).
    width_ms: u64,
    bytes: Vec<u64>,
    counts: Vec<u64>,
    /// Smallest allocation sequence number made in each bin (`u64::MAX`: none live).
    min_seq: Vec<u64>,
    seq_now: u64,
    /// Allocations freed since the first (all allocations made, less those live).
    freed_all: u64,
    sites: Vec<SiteBins>,
    /// The tracker's once-a-second samples: (second since the shim started, tracked bytes).
    actual: Vec<(u64, u64)>,
}

/// Walks the live device allocations once; `None` when there are none. `keys`: the site of each
/// stack pair, filled as needed; `first_ns`: when the first device allocation was made;
/// `actual`: the tracker's samples of the tracked bytes, once a second.
pub(crate) fn capture(
    ledger: &Ledger,
    keyer: &dyn SiteKeyer,
    keys: &mut FxHashMap<StackPair, SiteKey>,
    now_ns: u64,
    first_ns: Option<u64>,
    actual: Vec<(u64, u64)>,
) -> Option<Timeline> {
    // (time in ms, bytes, seq, stack pair) of every live device allocation.
    let mut live: Vec<(u64, u64, u64, StackPair)> = Vec::new();
    let mut live_all = 0u64;
    ledger.for_each_live(|a| {
        live_all += 1;
        if !a.api.is_pinned_host() {
            live.push((a.time_ns / 1_000_000, a.bytes, a.seq, (a.stack, a.py_stack)));
        }
    });
    let oldest = live.iter().map(|e| e.0).min()?;
    // From the first allocation: what was allocated and freed since is part of the history too.
    let t0_ms = first_ns.map_or(oldest, |f| (f / 1_000_000).min(oldest));
    let now_ms = (now_ns / 1_000_000).max(t0_ms + 1);
    let width_ms = (now_ms - t0_ms).div_ceil(BINS as u64).max(1);
    let bin = |t: u64| (((t - t0_ms) / width_ms) as usize).min(BINS - 1);
    let mut t = Timeline {
        now_ms,
        t0_ms,
        width_ms,
        bytes: vec![0; BINS],
        counts: vec![0; BINS],
        min_seq: vec![u64::MAX; BINS],
        seq_now: ledger.total_allocations(),
        freed_all: ledger.total_allocations().saturating_sub(live_all),
        sites: Vec::new(),
        actual,
    };
    // Sites by key, then only the largest kept (the rest count in the totals).
    let mut by_key: FxHashMap<SiteKey, SiteBins> = FxHashMap::default();
    let mut pair_bytes: FxHashMap<StackPair, u64> = FxHashMap::default();
    for &(ms, bytes, seq, pair) in &live {
        let i = bin(ms);
        t.bytes[i] += bytes;
        t.counts[i] += 1;
        t.min_seq[i] = t.min_seq[i].min(seq);
        *pair_bytes.entry(pair).or_insert(0) += bytes;
        let key = *keys
            .entry(pair)
            .or_insert_with(|| keyer.key(pair.0, pair.1));
        let site = by_key.entry(key).or_insert_with(|| SiteBins {
            key,
            stack: pair,
            stack_bytes: 0,
            bytes: vec![0; BINS],
            newest_ms: 0,
        });
        site.bytes[i] += bytes;
        site.newest_ms = site.newest_ms.max(ms);
    }
    for site in by_key.values_mut() {
        // The representative stack: the pair of this site holding the most.
        for (pair, bytes) in &pair_bytes {
            if *bytes > site.stack_bytes && keys.get(pair) == Some(&site.key) {
                site.stack = *pair;
                site.stack_bytes = *bytes;
            }
        }
    }
    let mut sites: Vec<SiteBins> = by_key.into_values().collect();
    sites.sort_by(|a, b| {
        let total = |s: &SiteBins| s.bytes.iter().sum::<u64>();
        total(b).cmp(&total(a)).then(a.key.cmp(&b.key))
    });
    sites.truncate(MAX_SITES);
    t.sites = sites;
    Some(t)
}

/// Running sums: the bytes made up to the end of each bin.
fn cumulative(v: &[u64]) -> Vec<u64> {
    v.iter()
        .scan(0u64, |acc, b| {
            *acc += b;
            Some(*acc)
        })
        .collect()
}

impl Timeline {
    /// The end of bin `i`, milliseconds since the shim started (the last ends now).
    fn end_ms(&self, i: usize) -> u64 {
        (self.t0_ms + (i as u64 + 1) * self.width_ms).min(self.now_ms)
    }

    /// The fit's points of a cumulative series: (end of bin in ms, bytes kept by then).
    fn points(&self, cum: &[u64]) -> Vec<(u64, u64)> {
        cum.iter()
            .enumerate()
            .map(|(i, &b)| (self.end_ms(i), b))
            .collect()
    }

    /// The bytes of a cumulative series made up to `ms`: the bins that ended by then.
    fn kept_by(&self, cum: &[u64], ms: u64) -> u64 {
        if ms < self.t0_ms + self.width_ms {
            return 0;
        }
        let i = (((ms - self.t0_ms) / self.width_ms) as usize).min(BINS);
        if i == 0 {
            0
        } else {
            cum[i - 1]
        }
    }

    /// The dump's growth: the process's fitted growth over time and its attribution to sites
    /// (bytes per second), with what the timeline knows of its span, its allocations and the
    /// frees seen (`growth.timeline`). `free_bytes`: for the projection; `name`: frames of stack
    /// pairs.
    pub fn growth(
        self,
        free_bytes: Option<u64>,
        mut name: impl FnMut(&[StackPair]) -> Vec<Vec<Frame>>,
    ) -> Growth {
        let total = cumulative(&self.bytes);
        // Fitted up to the newest allocation: a growth that stopped a moment before the dump is
        // measured as it was (and said to have stopped, by `quiet_ms`), not flattened by the quiet
        // stretch since.
        let last_bin = self.bytes.iter().rposition(|b| *b > 0).unwrap_or(0);
        let points = self.points(&total[..=last_bin]);
        let total_fit = fit::growing_suffix(&points);
        let start = total_fit.map(|(_, s)| s);
        let from_ms = start.map(|s| points[s].0);

        let pairs: Vec<StackPair> = self.sites.iter().map(|s| s.stack).collect();
        let mut frames = name(&pairs);
        frames.resize(pairs.len(), Vec::new());
        let series: Vec<super::grouping::SiteSeries> = self
            .sites
            .iter()
            .map(|s| {
                let cum = cumulative(&s.bytes);
                (s.key, s.stack, self.points(&cum[..=last_bin]))
            })
            .collect();
        let newest: FxHashMap<SiteKey, u64> =
            self.sites.iter().map(|s| (s.key, s.newest_ms)).collect();
        let newest_all = self.sites.iter().map(|s| s.newest_ms).max();
        let groups = super::grouping::group(series, frames);
        let secs = |ms: u64| ms / 1000;
        let mut quiet_from = None::<u64>;
        let mut sites: Vec<(f64, GrowthSite)> = Vec::new();
        for g in groups {
            let pts: Vec<(u64, u64)> = match start {
                Some(s) => g.series.iter().copied().skip(s).collect(),
                None => g.series.clone(),
            };
            let f = match start {
                // Attribution of the fitted growth: any rising slope over the stretch.
                Some(_) => fit::line(&pts),
                // No steady growth of the process: only sites that grow steadily themselves.
                None => fit::growing(&pts),
            };
            let Some(f) = f else { continue };
            let per_s = f.slope * 1000.0;
            if per_s < 1.0 {
                continue;
            }
            let (Some(&first), Some(&last)) = (pts.first(), pts.last()) else {
                continue;
            };
            let newest_ms = g.members.iter().filter_map(|k| newest.get(k)).max();
            if let Some(&n) = newest_ms {
                quiet_from = Some(quiet_from.map_or(n, |q| q.max(n)));
            }
            let share = total_fit.map(|(tf, _)| (f.slope / tf.slope).clamp(0.0, 1.0));
            sites.push((
                per_s,
                GrowthSite {
                    bytes_per_step: per_s.round() as u64,
                    r_squared: round3(f.r2),
                    samples: f.n as u64,
                    first: point(secs(first.0), first.1),
                    last: point(secs(last.0), last.1),
                    projected_oom_step: projected(free_bytes, secs(self.now_ms), per_s),
                    stack: g.stack,
                    share: share.map(round3),
                    grouped_by: Some(g.key.word().to_string()),
                },
            ));
        }
        sites.sort_by(|a, b| b.0.total_cmp(&a.0));
        sites.truncate(MAX_REPORTED);
        let rate = match total_fit {
            Some((f, _)) => f.slope * 1000.0,
            None => sites.iter().map(|s| s.0).sum(),
        };
        let now = *total.last().unwrap_or(&0);
        let fit_out = total_fit.map(|(f, s)| GrowthFit {
            bytes_per_step: (f.slope * 1000.0).round() as u64,
            r_squared: round3(f.r2),
            samples: f.n as u64,
            first: point(secs(points[s].0), points[s].1),
            last: point(secs(self.now_ms), now),
            of: Some("tracked".to_string()),
            // Kept allocations accumulate by construction: no count to compare.
            live_allocations: None,
        });
        let timeline = self.info(&total, start, from_ms, quiet_from.or(newest_all));
        Growth {
            unit: "second".to_string(),
            steps: Some("timeline".to_string()),
            detected: None,
            samples: BINS as u64,
            current: secs(self.now_ms),
            free_bytes,
            projected_oom_step: projected(free_bytes, secs(self.now_ms), rate),
            sites: sites.into_iter().map(|s| s.1).collect(),
            tracked: self.shown(&total),
            framework_live: Vec::new(),
            fit: fit_out,
            timeline: Some(timeline),
        }
    }

    /// `growth.timeline`: the age, the fitted growth's span, allocations and frees, how long the
    /// growing sites have been quiet, and the once-a-second samples' word on what was kept.
    fn info(
        &self,
        total: &[u64],
        start: Option<usize>,
        from_ms: Option<u64>,
        quiet_from: Option<u64>,
    ) -> dump::model::Timeline {
        let first_bin = start.unwrap_or(0);
        let allocations: u64 = self.counts[first_bin..].iter().sum();
        let min_seq = self.min_seq[first_bin..]
            .iter()
            .copied()
            .min()
            .unwrap_or(u64::MAX);
        // Made since the growth's oldest live allocation: every sequence number from it on.
        let made = self.seq_now.saturating_add(1).saturating_sub(min_seq);
        let span_start = from_ms.map(|ms| ms.saturating_sub(self.width_ms));
        let kept_check = span_start.and_then(|from| {
            let inside: Vec<&(u64, u64)> = self
                .actual
                .iter()
                .filter(|(sec, _)| sec * 1000 >= from && sec * 1000 <= self.now_ms)
                .collect();
            let (a, b) = (inside.first()?, inside.last()?);
            (b.0 > a.0).then(|| KeptCheck {
                over_ms: (b.0 - a.0) * 1000,
                actual_bytes: b.1 as i64 - a.1 as i64,
                kept_bytes: self
                    .kept_by(total, b.0 * 1000)
                    .saturating_sub(self.kept_by(total, a.0 * 1000)),
            })
        });
        dump::model::Timeline {
            age_ms: self.now_ms - self.t0_ms,
            span_ms: span_start.map_or(0, |from| self.now_ms.saturating_sub(from)),
            allocations,
            freed: if start.is_some() {
                made.saturating_sub(allocations)
            } else {
                0
            },
            freed_all: self.freed_all,
            quiet_ms: quiet_from.map_or(0, |n| self.now_ms.saturating_sub(n)),
            kept_check,
        }
    }

    /// The `tracked` series as shown: the bytes kept by the end of each whole second (at most
    /// [`SHOWN_POINTS`], evenly spread), and now.
    fn shown(&self, total: &[u64]) -> Vec<GrowthPoint> {
        let (first, last) = (self.t0_ms / 1000, self.now_ms / 1000);
        let step = ((last - first) / SHOWN_POINTS as u64 + 1).max(1);
        let mut out: Vec<GrowthPoint> = (first..last)
            .step_by(step as usize)
            .map(|sec| point(sec, self.kept_by(total, (sec + 1) * 1000)))
            .collect();
        out.push(point(last, *total.last().unwrap_or(&0)));
        out
    }
}

/// The second in which `free` bytes run out at `per_s`, counted from `now_s`.
fn projected(free: Option<u64>, now_s: u64, per_s: f64) -> Option<u64> {
    let free = free?;
    (per_s >= 1.0).then(|| now_s + 1 + (free as f64 / per_s).floor() as u64)
}

fn point(step: u64, bytes: u64) -> GrowthPoint {
    GrowthPoint { step, bytes }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
