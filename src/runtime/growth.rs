//! Growth history: live device bytes per allocation site, sampled at step marks
//! (`oomshim_step()`, `oomshim.step()`), at steps detected from a repeating allocation pattern,
//! or, without either, once per time bucket. Also the ring of recent request sizes (dynamic
//! shapes).
//!
//! The hot path ([`Tracker::on_alloc`]) pays one relaxed store (the request size into its ring
//! slot) and two relaxed loads with compares (the anchor site, the anchor's deadline), plus,
//! while no step is marked or detected, one relaxed load to see whether a time bucket passed.
//! Everything else runs on cold paths: when the anchor site recurs (once per step), and samples,
//! which walk the ledger's shards (each under its own lock, as a snapshot does) and sum by site.
//!
//! A *site* is the Python stack id when the allocation has one, else the native stack id. A
//! Python stack names the program's line and its callers, while the native stack under one Python
//! line varies with the framework's internal path (a cache miss in torch's allocator reaches
//! `cudaMalloc` through different native frames), which would split one leak over several sites.
//!
//! **Step detection** (programs that never call `oomshim_step()`): one *anchor* site is watched.
//! Its distance to its previous occurrence, in allocations, is the gap. When the gap is the same
//! (and at least [`DETECT_MIN_PERIOD`]) [`DETECT_CONFIRM`] more times in a row, the program runs
//! a loop of that many allocations: steps are *detected*, and every later occurrence of the
//! anchor ends a step. An anchor that misses [`DETECT_MAX_MISSES`] times, or is not seen again
//! in time ([`DETECT_FIRST_WINDOW`], doubling to [`DETECT_MAX_PERIOD`]), is replaced by the site
//! of a later allocation. Detected
//! steps are dropped (and time buckets resume) when the anchor is not seen for
//! [`DETECT_LOST_PERIODS`] periods: the run moved to another phase.
//!
//! Memory is bounded: at most [`MAX_SITES`] sites (those with the most live bytes), each with a
//! ring of the last [`RING`] samples; [`SIZE_RING`] request sizes.

use crate::dump::model::{
    DetectedSteps, Frame, Growth, GrowthPoint, GrowthSite, RequestSizes, SizeBin, SizeCount,
};
use crate::ledger::{Allocation, Ledger, StackId};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Sites whose history is kept (the most live bytes at each sample, plus those already kept
/// while they still hold more than the smallest newcomer).
pub const MAX_SITES: usize = 64;
/// Samples kept per site (and of the device total).
pub const RING: usize = 64;
/// Width of a time bucket when the program marks no steps.
pub const BUCKET_NS: u64 = 1_000_000_000;
/// Fewest samples a site needs before its growth is fitted.
pub const MIN_SAMPLES: usize = 4;
/// Smallest coefficient of determination of the linear fit for a site to count as growing
/// ("monotone-ish": a leak grows every step; a working set that rises and falls does not).
pub const MIN_R_SQUARED: f64 = 0.9;
/// Growing sites reported in a dump, largest growth first.
pub const MAX_REPORTED: usize = 10;

/// Fewest allocations in a detected step: a site that allocates back to back (gap 1) is a loop
/// that only allocates (loading weights, growing a cache), not a step with working memory.
pub const DETECT_MIN_PERIOD: u64 = 2;
/// How long a new anchor is waited for, in allocations, at first: an anchor not seen again in
/// time is a one-off site (weights loaded once), and the site of the allocation at hand is
/// watched instead. Each such move doubles the wait, up to [`DETECT_MAX_PERIOD`], so a long step
/// is found too, after a few moves.
pub const DETECT_FIRST_WINDOW: u64 = 16;
/// Most allocations in a detected step (the longest wait for the anchor).
pub const DETECT_MAX_PERIOD: u64 = 1 << 16;
/// Repeats of the first gap that confirm a pattern (the anchor recurred this many times plus
/// two at the same distance): two equal gaps happen by chance; a loop repeats.
pub const DETECT_CONFIRM: u32 = 3;
/// Gaps that differ from the previous one before the anchor is given up for another site (a
/// step of A, A, B never gives A a steady gap; B has one).
pub const DETECT_MAX_MISSES: u32 = 4;
/// Detected steps end when the anchor is not seen for this many periods.
pub const DETECT_LOST_PERIODS: u64 = 8;
/// A sample walks every live allocation. At a detected step one is taken only when at least
/// (live allocations at the last sample − [`SAMPLE_FREE_LIVE`]) / this allocations happened
/// since, so samples cost at most this many ledger-entry visits per allocation on average
/// (beyond a walk of [`SAMPLE_FREE_LIVE`] entries per step), however short the steps.
pub const SAMPLE_MAX_VISITS_PER_ALLOC: u64 = 4;
/// Live allocations walked at every detected step regardless of the step's length: a walk of a
/// thousand entries takes microseconds, no more than one `cudaMalloc`.
pub const SAMPLE_FREE_LIVE: u64 = 1024;

/// Allocations to wait after a detected-step sample that found `live` allocations.
fn sample_spacing(live: u64) -> u64 {
    (live.saturating_sub(SAMPLE_FREE_LIVE) / SAMPLE_MAX_VISITS_PER_ALLOC).max(1)
}
/// Request sizes kept (the most recent ones), for the dynamic-shape evidence.
pub const SIZE_RING: usize = 4096;
/// A request of at least this many bytes is *large*: dynamic shapes that fragment a cache show
/// as many distinct large sizes (small ones are rounded into a few size classes anyway).
pub const LARGE_REQUEST_BYTES: u64 = 1 << 20;
/// Most frequent sizes listed in a dump.
pub const TOP_SIZES: usize = 10;

/// No anchor: the next allocation's site becomes it.
const NO_ANCHOR: u64 = u64::MAX;

/// Site key: the Python stack id with the top bit set, else the native stack id.
fn site_key(native: StackId, python: StackId) -> u64 {
    if python != StackId::EMPTY {
        (1u64 << 63) | python.0 as u64
    } else {
        native.0 as u64
    }
}

struct SiteHistory {
    /// A representative (native, Python) stack pair, for naming the site in a dump.
    stack: (StackId, StackId),
    samples: VecDeque<(u64, u64)>,
}

/// Where samples come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Mode {
    #[default]
    Time,
    Marked,
    Detected,
}

#[derive(Default)]
struct History {
    mode: Mode,
    samples: u64,
    sites: FxHashMap<u64, SiteHistory>,
    /// (x, tracked device bytes of all sites) per sample.
    totals: VecDeque<(u64, u64)>,
    /// Live allocations (all kinds) at the last sample, and the allocation sequence number then.
    live: u64,
    sample_seq: u64,
    /// Intervals between samples, and those in which something was freed.
    intervals: u64,
    freeing_intervals: u64,
}

/// The step detector's state (cold: touched when the anchor recurs or its deadline passes).
struct Detector {
    anchor: u64,
    anchor_stack: (StackId, StackId),
    /// Sequence number of the anchor's last occurrence.
    last_seq: u64,
    /// The last gap, and how many times in a row it repeated.
    gap: u64,
    matches: u32,
    misses: u32,
    /// The anchor last given up: not taken again at once.
    rejected: u64,
    /// How long the anchor is waited for (doubles at each move, see [`DETECT_FIRST_WINDOW`]).
    window: u64,
    detected: bool,
    period: u64,
    steps: u64,
    /// No detected-step sample before this sequence number (the cost rule).
    next_sample_seq: u64,
}

impl Default for Detector {
    fn default() -> Self {
        Detector {
            anchor: NO_ANCHOR,
            anchor_stack: (StackId::EMPTY, StackId::EMPTY),
            last_seq: 0,
            gap: 0,
            matches: 0,
            misses: 0,
            rejected: NO_ANCHOR,
            window: DETECT_FIRST_WINDOW,
            detected: false,
            period: 0,
            steps: 0,
            next_sample_seq: 0,
        }
    }
}

pub(crate) struct Tracker {
    /// Only ever taken with [`Tracker::lock`] (never blocking): a child forked while another
    /// thread held it must not deadlock (the fork handlers in oom.rs do not know this lock).
    history: Mutex<History>,
    /// Set when the lock could not be had for long (a fork copied it held): growth is off.
    stuck: std::sync::atomic::AtomicBool,
    /// Shim clock of the next time-bucket boundary; `u64::MAX` once steps are marked.
    next_bucket_ns: AtomicU64,
    steps: AtomicU64,
    /// The watched site ([`NO_ANCHOR`] once steps are marked), and the sequence number after
    /// which it is given up: both read on every allocation.
    anchor: AtomicU64,
    anchor_deadline: AtomicU64,
    detector: Mutex<Detector>,
    /// The last [`SIZE_RING`] device request sizes, indexed by sequence number (0: empty).
    sizes: Box<[AtomicU64]>,
}

fn push_ring(ring: &mut VecDeque<(u64, u64)>, point: (u64, u64)) {
    if ring.len() == RING {
        ring.pop_front();
    }
    ring.push_back(point);
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker {
            history: Mutex::new(History::default()),
            stuck: std::sync::atomic::AtomicBool::new(false),
            next_bucket_ns: AtomicU64::new(BUCKET_NS),
            steps: AtomicU64::new(0),
            anchor: AtomicU64::new(NO_ANCHOR),
            anchor_deadline: AtomicU64::new(0),
            detector: Mutex::new(Detector::default()),
            sizes: (0..SIZE_RING).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Hot path, for every successful allocation (after the ledger recorded it): the request
    /// size into its ring slot, the anchor check, the time-bucket check.
    #[inline]
    pub fn on_alloc(&self, ledger: &Ledger, a: &Allocation) {
        if a.api.is_pinned_host() {
            return;
        }
        self.sizes[(a.seq as usize) & (SIZE_RING - 1)].store(a.bytes, Ordering::Relaxed);
        let key = site_key(a.stack, a.py_stack);
        if self.anchor.load(Ordering::Relaxed) == key
            || a.seq >= self.anchor_deadline.load(Ordering::Relaxed)
        {
            self.detect(ledger, key, (a.stack, a.py_stack), a.seq, a.time_ns);
        }
        if self.bucket_due(a.time_ns) {
            self.sample_bucket(ledger, a.time_ns);
        }
    }

    /// Cold: the anchor recurred, or its deadline passed (then `key` may become the anchor).
    fn detect(&self, ledger: &Ledger, key: u64, stack: (StackId, StackId), seq: u64, now_ns: u64) {
        if self.steps.load(Ordering::Relaxed) > 0 {
            return; // steps are marked: nothing to detect
        }
        let mut d = match self.detector.try_lock() {
            Ok(d) => d,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if d.anchor != key || self.anchor.load(Ordering::Relaxed) != key {
            // The anchor was not seen in time (or none is set): watch this site instead.
            if d.detected {
                // Steps lost: the run moved on. Back to time buckets, history from scratch.
                d.detected = false;
                if let Some(mut h) = self.lock() {
                    if h.mode == Mode::Detected {
                        *h = History::default();
                    }
                }
                self.next_bucket_ns
                    .store((now_ns / BUCKET_NS + 1) * BUCKET_NS, Ordering::Relaxed);
            }
            if key == d.rejected && self.anchor.load(Ordering::Relaxed) == NO_ANCHOR {
                // Just given up: look again a few allocations later.
                self.anchor_deadline.store(seq + 16, Ordering::Relaxed);
                return;
            }
            let window = d.window;
            *d = Detector {
                anchor: key,
                anchor_stack: stack,
                last_seq: seq,
                rejected: d.rejected,
                window: (window * 2).min(DETECT_MAX_PERIOD),
                ..Detector::default()
            };
            self.anchor.store(key, Ordering::Relaxed);
            self.anchor_deadline
                .store(seq.saturating_add(window), Ordering::Relaxed);
            return;
        }
        let gap = seq.saturating_sub(d.last_seq);
        d.last_seq = seq;
        if d.detected {
            d.steps += 1;
            self.anchor_deadline.store(
                seq.saturating_add(DETECT_LOST_PERIODS.saturating_mul(d.period)),
                Ordering::Relaxed,
            );
            if seq >= d.next_sample_seq {
                let step = d.steps;
                if let Some(mut h) = self.lock() {
                    if h.mode == Mode::Detected {
                        sample(&mut h, ledger, step, seq);
                        d.next_sample_seq = seq + sample_spacing(h.live);
                    }
                }
            }
            return;
        }
        if gap >= DETECT_MIN_PERIOD && gap == d.gap {
            d.matches += 1;
        } else {
            if d.gap != 0 || gap < DETECT_MIN_PERIOD {
                d.misses += 1;
            }
            d.gap = gap;
            d.matches = 0;
        }
        if d.matches >= DETECT_CONFIRM {
            // A loop of `gap` allocations: steps from here on.
            d.detected = true;
            d.period = gap;
            d.steps = 1;
            // The next search, should this pattern end, starts with short waits again.
            d.window = DETECT_FIRST_WINDOW;
            self.next_bucket_ns.store(u64::MAX, Ordering::Relaxed);
            self.anchor_deadline.store(
                seq.saturating_add(DETECT_LOST_PERIODS.saturating_mul(gap)),
                Ordering::Relaxed,
            );
            if let Some(mut h) = self.lock() {
                if h.mode != Mode::Marked {
                    *h = History {
                        mode: Mode::Detected,
                        ..History::default()
                    };
                    sample(&mut h, ledger, 1, seq);
                    d.next_sample_seq = seq + sample_spacing(h.live);
                }
            }
        } else if d.misses >= DETECT_MAX_MISSES {
            // No steady gap at this site: give it up for the next other site.
            d.rejected = key;
            self.anchor.store(NO_ANCHOR, Ordering::Relaxed);
            self.anchor_deadline.store(seq + 1, Ordering::Relaxed);
        } else {
            // Wait at least two of the last gap for the next occurrence.
            let wait = d.window.max(gap.saturating_mul(2)).min(DETECT_MAX_PERIOD);
            self.anchor_deadline
                .store(seq.saturating_add(wait), Ordering::Relaxed);
        }
    }

    /// The recent request sizes, for a dump; `None` before any device allocation.
    pub fn request_sizes(&self) -> Option<RequestSizes> {
        let sizes: Vec<u64> = self
            .sizes
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&b| b > 0)
            .collect();
        summarize_sizes(&sizes)
    }

    /// The history, by `try_lock` with yields: holders keep it for one sample (a ledger walk) or
    /// a copy, so a wait of about 100k yields means it will never be released.
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, History>> {
        if self.stuck.load(Ordering::Relaxed) {
            return None;
        }
        for _ in 0..100_000 {
            match self.history.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
        self.stuck.store(true, Ordering::Relaxed);
        None
    }

    /// Hot path: one relaxed load. True when a time bucket ended and this caller won the right
    /// to sample it.
    #[inline]
    pub fn bucket_due(&self, now_ns: u64) -> bool {
        let next = self.next_bucket_ns.load(Ordering::Relaxed);
        now_ns >= next
            && self
                .next_bucket_ns
                .compare_exchange(
                    next,
                    (now_ns / BUCKET_NS + 1) * BUCKET_NS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// A time-bucket sample (only while no step was marked).
    pub fn sample_bucket(&self, ledger: &Ledger, now_ns: u64) {
        let Some(mut h) = self.lock() else { return };
        if h.mode != Mode::Time {
            return;
        }
        sample(
            &mut h,
            ledger,
            now_ns / BUCKET_NS,
            ledger.total_allocations(),
        );
    }

    /// The program marked a step: from now on samples are per step (time samples are dropped).
    pub fn step(&self, ledger: &Ledger) -> u64 {
        self.next_bucket_ns.store(u64::MAX, Ordering::Relaxed);
        let n = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        // Marked steps win over detection, for good.
        self.anchor.store(NO_ANCHOR, Ordering::Relaxed);
        self.anchor_deadline.store(u64::MAX, Ordering::Relaxed);
        let Some(mut h) = self.lock() else { return n };
        if h.mode != Mode::Marked {
            *h = History {
                mode: Mode::Marked,
                ..History::default()
            };
        }
        sample(&mut h, ledger, n, ledger.total_allocations());
        n
    }

    /// The fitted growth, for a dump; `None` before two samples.
    pub fn analyse(
        &self,
        free_bytes: Option<u64>,
        seq_now: u64,
        mut name: impl FnMut(&[(StackId, StackId)]) -> Vec<Vec<Frame>>,
    ) -> Option<Growth> {
        let (mode, samples, current, total_ring, mut fitted, intervals) = {
            let h = self.lock()?;
            if h.samples < 2 {
                return None;
            }
            let fitted: Vec<Fitted> = h
                .sites
                .values()
                .filter_map(|s| {
                    let pts: Vec<(u64, u64)> = s.samples.iter().copied().collect();
                    let fit = fit(&pts)?;
                    Some((fit, s.stack, pts[0], *pts.last()?))
                })
                .collect();
            let current = h.totals.back().map_or(0, |t| t.0);
            (
                h.mode,
                h.samples,
                current,
                h.totals.iter().copied().collect::<Vec<_>>(),
                fitted,
                (h.intervals, h.freeing_intervals),
            )
        };
        let detector = match mode {
            Mode::Detected => {
                // Never blocking (a fork may have copied it held); a busy detector is asked again.
                let mut d = None;
                for _ in 0..1000 {
                    match self.detector.try_lock() {
                        Ok(g) => {
                            d = Some(g);
                            break;
                        }
                        Err(std::sync::TryLockError::Poisoned(e)) => {
                            d = Some(e.into_inner());
                            break;
                        }
                        Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
                    }
                }
                d.map(|d| {
                    (
                        d.period,
                        d.steps,
                        seq_now.saturating_sub(d.last_seq),
                        d.anchor_stack,
                    )
                })
            }
            _ => None,
        };
        fitted.sort_by(|a, b| b.0.slope.total_cmp(&a.0.slope));
        fitted.truncate(MAX_REPORTED);
        let rate: f64 = fitted.iter().map(|f| f.0.slope).sum();
        // The step at which the free bytes run out at this rate, counted from the last sample.
        let projected = |rate: f64| -> Option<u64> {
            let free = free_bytes?;
            (rate >= 1.0).then(|| current + (free as f64 / rate).floor() as u64)
        };
        let mut stacks: Vec<(StackId, StackId)> = fitted.iter().map(|f| f.1).collect();
        if let Some(d) = &detector {
            stacks.push(d.3);
        }
        let mut frames = name(&stacks);
        let anchor = match &detector {
            Some(_) if frames.len() == stacks.len() => frames.pop().unwrap_or_default(),
            _ => Vec::new(),
        };
        let detected = detector.map(|(period, steps, since, _)| DetectedSteps {
            period,
            steps,
            allocations_since_last_step: since,
            intervals: intervals.0,
            freeing_intervals: intervals.1,
            anchor,
        });
        let sites = fitted
            .iter()
            .zip(frames)
            .map(|(f, stack)| GrowthSite {
                bytes_per_step: f.0.slope.round() as u64,
                r_squared: (f.0.r2 * 1000.0).round() / 1000.0,
                samples: f.0.n as u64,
                first: GrowthPoint {
                    step: f.2 .0,
                    bytes: f.2 .1,
                },
                last: GrowthPoint {
                    step: f.3 .0,
                    bytes: f.3 .1,
                },
                projected_oom_step: projected(f.0.slope),
                stack,
            })
            .collect();
        Some(Growth {
            unit: if mode == Mode::Time { "second" } else { "step" }.to_string(),
            steps: Some(
                match mode {
                    Mode::Time => "time",
                    Mode::Marked => "marked",
                    Mode::Detected => "detected",
                }
                .to_string(),
            ),
            detected,
            samples,
            current,
            free_bytes,
            projected_oom_step: projected(rate),
            sites,
            tracked: total_ring
                .iter()
                .map(|&(step, bytes)| GrowthPoint { step, bytes })
                .collect(),
        })
    }
}

/// Takes a sample at `x` (a step or a second); `seq` is the allocation sequence number now.
fn sample(h: &mut History, ledger: &Ledger, x: u64, seq: u64) {
    let mut by_site: FxHashMap<u64, (u64, (StackId, StackId))> = FxHashMap::default();
    let mut total = 0u64;
    let mut live = 0u64;
    ledger.for_each_live(|a| {
        live += 1;
        if a.api.is_pinned_host() {
            return;
        }
        total += a.bytes;
        let e = by_site
            .entry(site_key(a.stack, a.py_stack))
            .or_insert((0, (a.stack, a.py_stack)));
        e.0 += a.bytes;
    });
    if h.samples > 0 {
        // Something was freed since the last sample when fewer are live than were live then
        // plus those allocated since.
        h.intervals += 1;
        let allocated = seq.saturating_sub(h.sample_seq);
        if live < h.live.saturating_add(allocated) {
            h.freeing_intervals += 1;
        }
    }
    h.live = live;
    h.sample_seq = seq;
    h.samples += 1;
    push_ring(&mut h.totals, (x, total));
    // Sites already kept get a sample (0 when they hold nothing now).
    for (key, site) in h.sites.iter_mut() {
        let bytes = by_site.get(key).map_or(0, |e| e.0);
        push_ring(&mut site.samples, (x, bytes));
    }
    // Newcomers, largest first, while there is room or they outweigh the smallest kept site.
    let mut new: Vec<(u64, u64, (StackId, StackId))> = by_site
        .into_iter()
        .filter(|(k, _)| !h.sites.contains_key(k))
        .map(|(k, (b, s))| (k, b, s))
        .collect();
    new.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (key, bytes, stack) in new {
        if h.sites.len() >= MAX_SITES {
            let smallest = h
                .sites
                .iter()
                .map(|(k, s)| (s.samples.back().map_or(0, |p| p.1), *k))
                .min();
            match smallest {
                Some((b, k)) if b < bytes => {
                    h.sites.remove(&k);
                }
                _ => break,
            }
        }
        let mut samples = VecDeque::with_capacity(RING);
        samples.push_back((x, bytes));
        h.sites.insert(key, SiteHistory { stack, samples });
    }
}

/// The distribution of `sizes` (request sizes, 0 excluded by the caller).
pub(crate) fn summarize_sizes(sizes: &[u64]) -> Option<RequestSizes> {
    if sizes.is_empty() {
        return None;
    }
    let mut counts: FxHashMap<u64, u64> = FxHashMap::default();
    for &b in sizes {
        *counts.entry(b).or_insert(0) += 1;
    }
    let mut top: Vec<SizeCount> = counts
        .iter()
        .map(|(&bytes, &count)| SizeCount { bytes, count })
        .collect();
    top.sort_by(|a, b| b.count.cmp(&a.count).then(b.bytes.cmp(&a.bytes)));
    top.truncate(TOP_SIZES);
    let mut bins: std::collections::BTreeMap<u32, SizeBin> = Default::default();
    for (&bytes, &count) in &counts {
        let p = 63 - bytes.leading_zeros();
        let bin = bins.entry(p).or_insert_with(|| SizeBin {
            lo: 1u64 << p,
            hi: if p == 63 { u64::MAX } else { 1u64 << (p + 1) },
            count: 0,
            distinct: 0,
        });
        bin.count += count;
        bin.distinct += 1;
    }
    let large: Vec<(&u64, &u64)> = counts
        .iter()
        .filter(|(&b, _)| b >= LARGE_REQUEST_BYTES)
        .collect();
    Some(RequestSizes {
        window: sizes.len() as u64,
        distinct: counts.len() as u64,
        large: large.iter().map(|(_, &c)| c).sum(),
        distinct_large: large.len() as u64,
        large_bytes: LARGE_REQUEST_BYTES,
        top,
        bins: bins.into_values().collect(),
    })
}

/// A growing site: its fit, representative stacks, first and last sample.
type Fitted = (Fit, (StackId, StackId), (u64, u64), (u64, u64));

/// A least-squares line through a site's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fit {
    pub slope: f64,
    pub r2: f64,
    pub n: usize,
}

/// Fits `bytes = a + slope · x`; `Some` only for a growing site: at least [`MIN_SAMPLES`]
/// samples, a positive slope and R² ≥ [`MIN_R_SQUARED`].
pub(crate) fn fit(points: &[(u64, u64)]) -> Option<Fit> {
    let n = points.len();
    if n < MIN_SAMPLES {
        return None;
    }
    let x0 = points[0].0 as f64;
    let mx = points.iter().map(|p| p.0 as f64 - x0).sum::<f64>() / n as f64;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n as f64;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for p in points {
        let dx = p.0 as f64 - x0 - mx;
        let dy = p.1 as f64 - my;
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = (sxy * sxy) / (sxx * syy);
    (slope > 0.0 && r2 >= MIN_R_SQUARED).then_some(Fit { slope, r2, n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(ys: &[u64]) -> Vec<(u64, u64)> {
        ys.iter()
            .enumerate()
            .map(|(i, &y)| (i as u64 + 1, y))
            .collect()
    }

    #[test]
    fn fit_table() {
        let mib = 1u64 << 20;
        // (samples, growing?, slope when growing)
        let cases: &[(&[u64], bool, f64)] = &[
            (
                &[0, 96 * mib, 192 * mib, 288 * mib],
                true,
                96.0 * mib as f64,
            ), // exact linear
            (&[0, 96 * mib, 192 * mib], false, 0.0), // too few samples
            (&[5, 5, 5, 5, 5], false, 0.0),          // flat
            (&[400, 300, 200, 100], false, 0.0),     // shrinking
            (&[0, 100, 0, 100, 0, 100], false, 0.0), // oscillating
            (&[0, 110, 190, 310, 400, 490], true, 98.0), // noisy but steady
            (&[0, 0, 0, 0, 0, 1000], false, 0.0),    // one jump: R² 0.71
        ];
        for (ys, growing, slope) in cases {
            let f = fit(&pts(ys));
            assert_eq!(f.is_some(), *growing, "{ys:?}: {f:?}");
            if let Some(f) = f {
                assert!((f.slope - slope).abs() < 1.0, "{ys:?}: {f:?}");
                assert!(f.r2 >= MIN_R_SQUARED);
            }
        }
    }

    #[test]
    fn time_buckets_until_the_first_step_mark() {
        let ledger = Ledger::new();
        let t = Tracker::new();
        assert!(!t.bucket_due(BUCKET_NS - 1));
        for sec in 1..=5u64 {
            ledger.record_alloc(
                sec as usize * 4096,
                crate::ledger::Allocation {
                    bytes: 1 << 20,
                    api: crate::ledger::Api::CudaMalloc,
                    device: 0,
                    stream: 0,
                    thread: 1,
                    time_ns: 0,
                    seq: sec,
                    stack: StackId(7),
                    py_stack: StackId::EMPTY,
                },
            );
            let now = sec * BUCKET_NS + 5;
            assert!(t.bucket_due(now), "bucket {sec}");
            assert!(!t.bucket_due(now + 1), "one sample per bucket");
            t.sample_bucket(&ledger, now);
        }
        let g = t.analyse(None, 0, |s| vec![vec![]; s.len()]).unwrap();
        assert_eq!((g.unit.as_str(), g.current, g.samples), ("second", 5, 5));
        assert_eq!(g.sites[0].bytes_per_step, 1 << 20);
        assert_eq!(g.projected_oom_step, None, "no free bytes known");
        // A step mark drops the time samples and stops the buckets.
        assert_eq!(t.step(&ledger), 1);
        assert!(!t.bucket_due(u64::MAX - 1));
        assert!(t.analyse(None, 0, |s| vec![vec![]; s.len()]).is_none());
        // Python stacks key the site, whatever the native stack.
        assert_ne!(
            site_key(StackId(1), StackId(2)),
            site_key(StackId(1), StackId::EMPTY)
        );
        assert_eq!(
            site_key(StackId(1), StackId(2)),
            site_key(StackId(9), StackId(2))
        );
    }

    #[test]
    fn ring_and_site_bounds() {
        let ledger = Ledger::new();
        let t = Tracker::new();
        for i in 0..(RING as u64 + 10) {
            for s in 0..(MAX_SITES as u32 + 20) {
                ledger.record_alloc(
                    ((i as usize) << 32) + ((s as usize + 1) << 12),
                    crate::ledger::Allocation {
                        bytes: 1 + s as u64,
                        api: crate::ledger::Api::CudaMalloc,
                        device: 0,
                        stream: 0,
                        thread: 1,
                        time_ns: 0,
                        seq: 1,
                        stack: StackId(s + 1),
                        py_stack: StackId::EMPTY,
                    },
                );
            }
            t.step(&ledger);
        }
        let h = t.lock().unwrap();
        assert_eq!(h.sites.len(), MAX_SITES);
        assert!(h.sites.values().all(|s| s.samples.len() <= RING));
        assert_eq!(h.totals.len(), RING);
        // The smallest sites are the ones left out.
        assert!(!h.sites.contains_key(&1));
        drop(h);
        let g = t
            .analyse(Some(1 << 30), 0, |s| vec![vec![]; s.len()])
            .unwrap();
        assert_eq!(g.unit, "step");
        assert_eq!(g.current, RING as u64 + 10);
        assert_eq!(g.sites.len(), MAX_REPORTED);
        // The largest site grows by its size every step.
        assert_eq!(g.sites[0].bytes_per_step, MAX_SITES as u64 + 20);
    }
}

#[cfg(test)]
mod detect_tests {
    use super::*;
    use crate::ledger::{Allocation, Api};

    const MIB: u64 = 1 << 20;

    /// A ledger and a tracker fed allocations as `record_alloc` feeds them.
    struct Run {
        ledger: Ledger,
        t: Tracker,
        next_addr: usize,
    }

    impl Run {
        fn new() -> Run {
            Run {
                ledger: Ledger::new(),
                t: Tracker::new(),
                next_addr: 1 << 20,
            }
        }
        fn alloc(&mut self, site: u32, bytes: u64) -> usize {
            self.next_addr += 4096;
            let a = Allocation {
                bytes,
                api: Api::CudaMalloc,
                device: 0,
                stream: 0,
                thread: 1,
                time_ns: 0, // no time bucket ever closes
                seq: self.ledger.next_seq(),
                stack: StackId(site),
                py_stack: StackId::EMPTY,
            };
            self.ledger.record_alloc(self.next_addr, a);
            self.t.on_alloc(&self.ledger, &a);
            self.next_addr
        }
        fn free(&mut self, addr: usize) {
            self.ledger.take(addr);
        }
        fn growth(&self) -> Option<Growth> {
            self.t
                .analyse(Some(1 << 30), self.ledger.total_allocations(), |s| {
                    vec![vec![]; s.len()]
                })
        }
        /// One training step: the leak (site 1) and working memory (site 2) freed at once.
        fn step(&mut self) {
            self.alloc(1, 96 * MIB);
            let w = self.alloc(2, 32 * MIB);
            self.free(w);
        }
    }

    #[test]
    fn a_repeating_step_is_detected_and_sampled() {
        let mut r = Run::new();
        // The anchor (site 1) recurs every 2 allocations: gaps 2, 2, 2, 2 confirm at step 5.
        for _ in 0..4 {
            r.step();
        }
        assert!(r.growth().is_none(), "not confirmed yet");
        for _ in 4..20 {
            r.step();
        }
        let g = r.growth().expect("growth");
        assert_eq!(g.unit, "step");
        assert_eq!(g.steps.as_deref(), Some("detected"));
        let d = g.detected.as_ref().unwrap();
        assert_eq!(d.period, 2);
        assert_eq!(d.steps, 16, "steps 5..=20 counted from the confirmation");
        assert_eq!(d.freeing_intervals, d.intervals);
        assert_eq!(d.intervals, g.samples - 1);
        assert_eq!(d.allocations_since_last_step, 1, "the transient allocation");
        assert_eq!(g.sites.len(), 1, "the working memory does not grow");
        assert_eq!(g.sites[0].bytes_per_step, 96 * MIB);
        // A marked step wins for good: history restarts per marked step.
        r.t.step(&r.ledger);
        r.step();
        r.t.step(&r.ledger);
        let g = r.growth().unwrap();
        assert_eq!(g.steps.as_deref(), Some("marked"));
        assert!(g.detected.is_none());
        for _ in 0..10 {
            r.step();
        }
        assert_eq!(
            r.growth().unwrap().samples,
            2,
            "no detected samples after a mark"
        );
    }

    #[test]
    fn a_loop_that_only_allocates_one_site_is_not_a_step() {
        // Loading weights, growing a cache: the same site back to back (gap 1).
        let mut r = Run::new();
        for _ in 0..500 {
            r.alloc(5, 64 * MIB);
        }
        assert!(r.growth().is_none());
    }

    #[test]
    fn the_anchor_moves_to_a_site_with_a_steady_gap() {
        // A step of A, A, B: site A's gaps alternate 1, 2; site B's are always 3.
        let mut r = Run::new();
        for _ in 0..40 {
            r.alloc(1, MIB);
            let a = r.alloc(1, MIB);
            r.free(a);
            r.alloc(2, 8 * MIB);
        }
        let g = r.growth().expect("detected");
        assert_eq!(g.steps.as_deref(), Some("detected"));
        assert_eq!(g.detected.as_ref().unwrap().period, 3);
        assert_eq!(g.sites[0].bytes_per_step, 8 * MIB);
    }

    #[test]
    fn a_loop_without_frees_is_detected_but_frees_nothing() {
        // Loading two tensors per layer: a pattern, but no working memory is ever freed.
        let mut r = Run::new();
        for _ in 0..30 {
            r.alloc(1, 64 * MIB);
            r.alloc(2, MIB);
        }
        let g = r.growth().unwrap();
        let d = g.detected.unwrap();
        assert!(d.intervals > 0);
        assert_eq!(d.freeing_intervals, 0);
    }

    #[test]
    fn steps_are_lost_when_the_anchor_stops() {
        let mut r = Run::new();
        for _ in 0..10 {
            r.step();
        }
        assert_eq!(r.growth().unwrap().steps.as_deref(), Some("detected"));
        // Another phase: 8 periods (16 allocations) without the anchor drop the steps.
        for _ in 0..(DETECT_LOST_PERIODS * 2 + 1) {
            let a = r.alloc(9, MIB);
            r.free(a);
        }
        assert!(r.growth().is_none(), "history restarts with time buckets");
        // ... and a new pattern is learnt.
        for _ in 0..30 {
            r.alloc(3, MIB);
            let w = r.alloc(4, MIB);
            r.free(w);
        }
        let g = r.growth().unwrap();
        assert_eq!(g.steps.as_deref(), Some("detected"));
        assert_eq!(g.detected.unwrap().period, 2);
    }

    #[test]
    fn a_pause_shorter_than_the_lost_periods_keeps_the_steps() {
        let mut r = Run::new();
        for _ in 0..10 {
            r.step();
        }
        let before = r.growth().unwrap().detected.unwrap().steps;
        // The deadline is 8 periods (16 allocations) after the last anchor, which the transient
        // allocation followed: 14 more allocations without it keep the pattern (a 15th other
        // allocation would reach the deadline and drop it, as in the test above).
        for _ in 0..(DETECT_LOST_PERIODS * 2 - 2) {
            let a = r.alloc(9, MIB);
            r.free(a);
        }
        r.step();
        let g = r.growth().unwrap();
        assert_eq!(g.steps.as_deref(), Some("detected"));
        assert_eq!(g.detected.unwrap().steps, before + 1);
    }

    #[test]
    fn a_one_off_first_site_is_left_after_the_first_window() {
        let mut r = Run::new();
        // The first allocation (weights, once) becomes the anchor; it never recurs.
        r.alloc(50, 512 * MIB);
        // 7 steps (14 allocations) stay within the first window of 16 allocations: no moves yet.
        for _ in 0..7 {
            r.step();
        }
        assert!(r.growth().is_none());
        // Step 8's first allocation (seq 16) is still inside the window; its second one (seq 17)
        // reaches the deadline: the anchor moves to the working-memory site (2), whose gap of 2
        // repeats at seqs 19, 21, 23 and confirms at 25 (step 12); step 13 is the next step.
        for _ in 7..13 {
            r.step();
        }
        let g = r.growth().expect("detected after the move");
        assert_eq!(g.steps.as_deref(), Some("detected"));
        let d = g.detected.unwrap();
        assert_eq!(d.period, 2);
        assert_eq!(d.steps, 2);
    }

    #[test]
    fn detected_samples_cost_at_most_a_few_visits_per_allocation() {
        let mut r = Run::new();
        // 4000 live allocations first (a model), then short steps.
        for i in 0..4000 {
            r.alloc(100 + (i % 7), 4096);
        }
        for _ in 0..1000 {
            r.step();
        }
        let h = r.t.lock().unwrap();
        // ~2000 allocations in detected steps; a sample needs (live - 1024) / 4 ≥ 744
        // allocations since the last: a handful of samples, not one per step.
        assert!(h.samples >= 2 && h.samples <= 4, "{}", h.samples);
        drop(h);
        assert_eq!(sample_spacing(SAMPLE_FREE_LIVE), 1);
        assert_eq!(sample_spacing(SAMPLE_FREE_LIVE + 4 * 100), 100);
    }

    #[test]
    fn request_sizes_ring_and_summary() {
        let mut r = Run::new();
        assert!(r.t.request_sizes().is_none());
        for i in 0..(SIZE_RING as u64 + 100) {
            // 3 of every 4 requests are 2 MiB; every 4th has a size of its own (dynamic).
            let bytes = if i % 4 == 3 {
                3 * MIB + i * 512
            } else {
                2 * MIB
            };
            let a = r.alloc(1, bytes);
            r.free(a);
        }
        let s = r.t.request_sizes().unwrap();
        assert_eq!(s.window, SIZE_RING as u64, "bounded to the most recent");
        assert_eq!(
            s.top[0],
            SizeCount {
                bytes: 2 * MIB,
                count: 3072
            }
        );
        assert_eq!(s.distinct, 1 + 1024);
        assert_eq!((s.large, s.distinct_large), (4096, 1025));
        assert_eq!(s.large_bytes, LARGE_REQUEST_BYTES);
        assert_eq!(s.top.len(), TOP_SIZES);
        let bins: u64 = s.bins.iter().map(|b| b.count).sum();
        assert_eq!(bins, 4096);
        assert_eq!(
            s.bins[0],
            SizeBin {
                lo: 2 * MIB,
                hi: 4 * MIB,
                count: 3072 + 1024 - s.bins.get(1).map_or(0, |b| b.count),
                distinct: 1 + 1024 - s.bins.get(1).map_or(0, |b| b.distinct)
            }
        );
        // Small and exact cases.
        let s = summarize_sizes(&[512, 512, 1000, MIB, MIB, 3 * MIB]).unwrap();
        assert_eq!(
            (s.window, s.distinct, s.large, s.distinct_large),
            (6, 4, 3, 2)
        );
        assert_eq!(
            s.bins,
            [
                SizeBin {
                    lo: 512,
                    hi: 1024,
                    count: 3,
                    distinct: 2
                },
                SizeBin {
                    lo: MIB,
                    hi: 2 * MIB,
                    count: 2,
                    distinct: 1
                },
                SizeBin {
                    lo: 2 * MIB,
                    hi: 4 * MIB,
                    count: 1,
                    distinct: 1
                },
            ]
        );
        assert_eq!(
            s.top[0],
            SizeCount {
                bytes: MIB,
                count: 2
            }
        );
        assert_eq!(
            s.top[1],
            SizeCount {
                bytes: 512,
                count: 2
            }
        );
        assert!(summarize_sizes(&[]).is_none());
        assert_eq!(summarize_sizes(&[u64::MAX]).unwrap().bins[0].hi, u64::MAX);
    }
}
