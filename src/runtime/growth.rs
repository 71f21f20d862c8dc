//! Growth history: live device bytes per allocation site, sampled at step marks
//! (`oomshim_step()`, `oomshim.step()`) or, until the program marks a step, once per time bucket.
//!
//! The hot path pays nothing here except, without step marks, one relaxed atomic load in
//! `record_alloc` to see whether a bucket boundary passed. Samples are taken on a cold path: the
//! ledger's shards are walked (each under its own lock, as a snapshot does) and summed by site.
//!
//! A *site* is the Python stack id when the allocation has one, else the native stack id. A
//! Python stack names the program's line and its callers, while the native stack under one Python
//! line varies with the framework's internal path (a cache miss in torch's allocator reaches
//! `cudaMalloc` through different native frames), which would split one leak over several sites.
//!
//! Memory is bounded: at most [`MAX_SITES`] sites (those with the most live bytes), each with a
//! ring of the last [`RING`] samples.

use crate::dump::model::{Frame, Growth, GrowthPoint, GrowthSite};
use crate::ledger::{Ledger, StackId};
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

#[derive(Default)]
struct History {
    /// True once the program marked a step: samples are per step from then on.
    steps: bool,
    samples: u64,
    sites: FxHashMap<u64, SiteHistory>,
    /// (x, tracked device bytes of all sites) per sample.
    totals: VecDeque<(u64, u64)>,
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
        }
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
        if h.steps {
            return;
        }
        sample(&mut h, ledger, now_ns / BUCKET_NS);
    }

    /// The program marked a step: from now on samples are per step (time samples are dropped).
    pub fn step(&self, ledger: &Ledger) -> u64 {
        self.next_bucket_ns.store(u64::MAX, Ordering::Relaxed);
        let n = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        let Some(mut h) = self.lock() else { return n };
        if !h.steps {
            *h = History {
                steps: true,
                ..History::default()
            };
        }
        sample(&mut h, ledger, n);
        n
    }

    /// The fitted growth, for a dump; `None` before two samples.
    pub fn analyse(
        &self,
        free_bytes: Option<u64>,
        mut name: impl FnMut(&[(StackId, StackId)]) -> Vec<Vec<Frame>>,
    ) -> Option<Growth> {
        let (unit, samples, current, total_ring, mut fitted) = {
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
                if h.steps { "step" } else { "second" },
                h.samples,
                current,
                h.totals.iter().copied().collect::<Vec<_>>(),
                fitted,
            )
        };
        fitted.sort_by(|a, b| b.0.slope.total_cmp(&a.0.slope));
        fitted.truncate(MAX_REPORTED);
        let rate: f64 = fitted.iter().map(|f| f.0.slope).sum();
        // The step at which the free bytes run out at this rate, counted from the last sample.
        let projected = |rate: f64| -> Option<u64> {
            let free = free_bytes?;
            (rate >= 1.0).then(|| current + (free as f64 / rate).floor() as u64)
        };
        let stacks: Vec<(StackId, StackId)> = fitted.iter().map(|f| f.1).collect();
        let frames = name(&stacks);
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
            unit: unit.to_string(),
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

fn sample(h: &mut History, ledger: &Ledger, x: u64) {
    let mut by_site: FxHashMap<u64, (u64, (StackId, StackId))> = FxHashMap::default();
    let mut total = 0u64;
    ledger.for_each_live(|a| {
        if a.api.is_pinned_host() {
            return;
        }
        total += a.bytes;
        let e = by_site
            .entry(site_key(a.stack, a.py_stack))
            .or_insert((0, (a.stack, a.py_stack)));
        e.0 += a.bytes;
    });
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
        let g = t.analyse(None, |s| vec![vec![]; s.len()]).unwrap();
        assert_eq!((g.unit.as_str(), g.current, g.samples), ("second", 5, 5));
        assert_eq!(g.sites[0].bytes_per_step, 1 << 20);
        assert_eq!(g.projected_oom_step, None, "no free bytes known");
        // A step mark drops the time samples and stops the buckets.
        assert_eq!(t.step(&ledger), 1);
        assert!(!t.bucket_due(u64::MAX - 1));
        assert!(t.analyse(None, |s| vec![vec![]; s.len()]).is_none());
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
        let g = t.analyse(Some(1 << 30), |s| vec![vec![]; s.len()]).unwrap();
        assert_eq!(g.unit, "step");
        assert_eq!(g.current, RING as u64 + 10);
        assert_eq!(g.sites.len(), MAX_REPORTED);
        // The largest site grows by its size every step.
        assert_eq!(g.sites[0].bytes_per_step, MAX_SITES as u64 + 20);
    }
}
