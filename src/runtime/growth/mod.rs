//! Growth history: live device bytes of the whole process and per allocation site, sampled at
//! step boundaries, so a dump can tell a leak (the process grows with the steps) from a working
//! set that is merely large.
//!
//! Where step boundaries come from, strongest first:
//! - [`StepSource::Program`]: the program marks them (`oomshim_step()`, `oomshim.step()`);
//! - [`StepSource::Optimizer`], [`StepSource::Forward`]: oomshim's Python hook marks every
//!   `torch.optim` step and every forward pass of the program's outermost module (training and
//!   evaluation loops need no change);
//! - detected steps ([`detect`]): a repeating allocation pattern, for programs without either;
//! - otherwise one sample per second (time buckets), evidence only: growth per second is not
//!   growth per step.
//!
//! Each marked source keeps its own history, so an evaluation phase (forward passes, no optimizer
//! steps) is measured even inside a training run; [`analyse`] picks the one that describes the
//! phase the failure happened in.
//!
//! A *site* is what the growth is attributed to ([`SiteKey`]): the program's own Python line
//! (innermost frame outside installed packages and the standard library) when the allocation has
//! a Python stack, every Python-less allocation of a Python process together (autograd's backward
//! threads), or the native stack; native stacks are grouped by name when a dump is written.
//!
//! The hot path ([`Tracker::on_alloc`]) pays one relaxed store (the request size into its ring
//! slot) and two relaxed loads with compares (the detector's anchor, its deadline), plus, while
//! no step is marked or detected, one relaxed load to see whether a time bucket passed.
//! Everything else runs on cold paths: samples walk the ledger's shards (each under its own lock,
//! as a snapshot does), then name the stacks they found with no ledger lock held.
//!
//! Memory is bounded: at most [`MAX_SITES`] sites per history (those with the most live bytes),
//! each with a ring of the last [`RING`] samples; [`sizes::SIZE_RING`] request sizes.

mod analyse;
pub(crate) mod detect;
mod sizes;

pub(crate) use sizes::summarize_sizes;

use crate::dump::model::{Frame, Growth, RequestSizes};
use crate::ledger::{Allocation, Ledger, StackId};
use detect::{Detector, Event, NO_ANCHOR};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Sites whose history is kept per source (the most live bytes at each sample, plus those
/// already kept while they still hold more than the smallest newcomer); the rest count in the
/// process's total only.
pub const MAX_SITES: usize = 128;
/// Samples kept per site (and of the process's total).
pub const RING: usize = 64;
/// Width of a time bucket when no step is marked or detected.
pub const BUCKET_NS: u64 = 1_000_000_000;
/// Samples a marked history needs before its growth counts as steady for [`Tracker::growing`]:
/// more than a fit needs, so warm-up steps (optimizer state, caches filling) do not count.
pub const SUSPECT_MIN_SAMPLES: usize = 6;
/// Growing sites reported in a dump, largest growth first.
pub const MAX_REPORTED: usize = 10;
/// A sample walks every live allocation. At a detected step one is taken only when at least
/// (live allocations at the last sample − [`SAMPLE_FREE_LIVE`]) / this allocations happened
/// since, so samples cost at most this many ledger-entry visits per allocation on average
/// (beyond a walk of [`SAMPLE_FREE_LIVE`] entries per step), however short the steps.
pub const SAMPLE_MAX_VISITS_PER_ALLOC: u64 = 4;
/// Live allocations walked at every detected step regardless of the step's length: a walk of a
/// thousand entries takes microseconds, no more than one `cudaMalloc`.
pub const SAMPLE_FREE_LIVE: u64 = 1024;
/// Site names remembered per stack (a cache in front of Python-stack resolution); cleared when
/// full.
const MAX_KEY_CACHE: usize = 1 << 16;

/// Allocations to wait after a detected-step sample that found `live` allocations.
fn sample_spacing(live: u64) -> u64 {
    (live.saturating_sub(SAMPLE_FREE_LIVE) / SAMPLE_MAX_VISITS_PER_ALLOC).max(1)
}

/// The framework's own count of its live tensors at a mark (torch's `memory_stats()`, from the
/// Python hook): their bytes, and how many there are when it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameworkLive {
    pub bytes: u64,
    pub allocations: Option<u64>,
}

impl FrameworkLive {
    /// `allocations`: `u64::MAX` when the framework did not say. Zero allocations holding bytes
    /// is not a count either: torch's cudaMallocAsync backend reports bytes only, its counts
    /// stay 0.
    pub fn new(bytes: u64, allocations: u64) -> FrameworkLive {
        let known = allocations != u64::MAX && (allocations > 0 || bytes == 0);
        FrameworkLive {
            bytes,
            allocations: known.then_some(allocations),
        }
    }
}

/// Who marked a step boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSource {
    /// The program itself (`oomshim_step()`).
    Program = 0,
    /// A `torch.optim` optimizer step (oomshim's Python hook).
    Optimizer = 1,
    /// A forward pass of the program's outermost module (oomshim's Python hook).
    Forward = 2,
}

impl StepSource {
    pub fn from_code(code: i32) -> Option<StepSource> {
        match code {
            0 => Some(StepSource::Program),
            1 => Some(StepSource::Optimizer),
            2 => Some(StepSource::Forward),
            _ => None,
        }
    }

    /// The dump's `growth.steps` word.
    pub fn word(self) -> &'static str {
        match self {
            StepSource::Program => "marked",
            StepSource::Optimizer => "optimizer",
            StepSource::Forward => "forward",
        }
    }
}

/// What growth is attributed to (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteKey {
    /// The program's own Python line: (code id, line).
    PyLine(u32, u32),
    /// A Python stack without a frame of the program's own code.
    PyStack(StackId),
    /// Allocations without Python frames in a process that runs Python.
    NoPython,
    /// A native stack (a process without Python, or Python stacks off).
    Native(StackId),
}

impl SiteKey {
    /// The dump's `grouped_by` word.
    pub fn word(self) -> &'static str {
        match self {
            SiteKey::PyLine(..) => "python_line",
            SiteKey::PyStack(_) => "python_stack",
            SiteKey::NoPython => "no_python",
            SiteKey::Native(_) => "native",
        }
    }
}

/// Turns an allocation's (native, Python) stack pair into the site its growth counts for.
/// Called on cold paths only, with no ledger lock held.
pub trait SiteKeyer {
    fn key(&self, native: StackId, python: StackId) -> SiteKey;
}

/// Any `Fn(native, python) -> SiteKey` is a keyer (tests use closures).
impl<F: Fn(StackId, StackId) -> SiteKey> SiteKeyer for F {
    fn key(&self, native: StackId, python: StackId) -> SiteKey {
        self(native, python)
    }
}

/// A stack pair: what names a site in a dump.
pub type StackPair = (StackId, StackId);

struct SiteHistory {
    /// A representative stack pair, for naming the site in a dump.
    stack: StackPair,
    samples: VecDeque<(u64, u64)>,
}

/// Samples of one source.
#[derive(Default)]
struct History {
    samples: u64,
    sites: FxHashMap<SiteKey, SiteHistory>,
    /// (x, tracked device bytes of the process) per sample.
    totals: VecDeque<(u64, u64)>,
    /// (x, live bytes as the framework counts them) per marked sample, when the mark carried
    /// them (torch's `memory_allocated()`, from the Python hook): under preload the tracked bytes
    /// are torch's segments, cache included; these are its tensors.
    framework_live: VecDeque<(u64, u64)>,
    /// (x, live device allocations) per sample, beside `totals`, and the framework's count of
    /// its live tensors beside `framework_live` when the mark carried it: a leak accumulates
    /// allocations; inputs of growing shape grow the bytes of as many allocations as before.
    counts: VecDeque<(u64, u64)>,
    framework_counts: VecDeque<(u64, u64)>,
    /// Live allocations (all kinds) at the last sample, and the allocation sequence number then.
    live: u64,
    sample_seq: u64,
    /// Intervals between samples, and those in which something was freed.
    intervals: u64,
    freeing_intervals: u64,
}

/// What the unmarked history holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum AutoMode {
    #[default]
    Time,
    Detected,
}

#[derive(Default)]
struct Histories {
    /// Per [`StepSource`].
    marked: [History; 3],
    /// Time buckets or detected steps, while nothing is marked.
    auto: History,
    auto_mode: AutoMode,
    /// Site of each stack pair seen (by Python stack when there is one).
    keys: FxHashMap<StackPair, SiteKey>,
}

pub(crate) struct Tracker {
    /// Only ever taken with [`Tracker::lock`] (never blocking): a child forked while another
    /// thread held it must not deadlock (the fork handlers do not know this lock).
    histories: Mutex<Histories>,
    /// Set when the lock could not be had for long (a fork copied it held): growth is off.
    stuck: AtomicBool,
    /// Shim clock of the next time-bucket boundary; `u64::MAX` once steps are marked.
    next_bucket_ns: AtomicU64,
    /// Marks per [`StepSource`].
    marks: [AtomicU64; 3],
    /// Forward passes marked since the last optimizer step: an evaluation phase when several.
    forwards_since_optimizer: AtomicU64,
    /// The detector's anchor site ([`NO_ANCHOR`] once steps are marked), and the sequence number
    /// from which it counts as not seen in time: both read on every allocation.
    anchor: AtomicU64,
    anchor_deadline: AtomicU64,
    detector: Mutex<Detector<StackPair>>,
    /// No detected-step sample before this sequence number (the cost rule).
    next_sample_seq: AtomicU64,
    /// The last [`sizes::SIZE_RING`] device request sizes, indexed by sequence number (0: empty).
    sizes: Box<[AtomicU64]>,
}

fn push_ring(ring: &mut VecDeque<(u64, u64)>, point: (u64, u64)) {
    if ring.len() == RING {
        ring.pop_front();
    }
    ring.push_back(point);
}

/// The detector's key of a stack pair (cheap, on the hot path): the Python stack id with the top
/// bit set, else the native stack id.
fn anchor_key(native: StackId, python: StackId) -> u64 {
    if python != StackId::EMPTY {
        (1u64 << 63) | python.0 as u64
    } else {
        native.0 as u64
    }
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker {
            histories: Mutex::new(Histories::default()),
            stuck: AtomicBool::new(false),
            next_bucket_ns: AtomicU64::new(BUCKET_NS),
            marks: Default::default(),
            forwards_since_optimizer: AtomicU64::new(0),
            anchor: AtomicU64::new(NO_ANCHOR),
            anchor_deadline: AtomicU64::new(0),
            detector: Mutex::new(Detector::new((StackId::EMPTY, StackId::EMPTY))),
            next_sample_seq: AtomicU64::new(0),
            sizes: (0..sizes::SIZE_RING).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn marked_any(&self) -> bool {
        self.marks.iter().any(|m| m.load(Ordering::Relaxed) > 0)
    }

    /// Hot path, for every successful allocation (after the ledger recorded it): the request
    /// size into its ring slot, the anchor check, the time-bucket check.
    #[inline]
    pub fn on_alloc(&self, ledger: &Ledger, keyer: &dyn SiteKeyer, a: &Allocation) {
        if a.api.is_pinned_host() {
            return;
        }
        self.sizes[(a.seq as usize) & (sizes::SIZE_RING - 1)].store(a.bytes, Ordering::Relaxed);
        let key = anchor_key(a.stack, a.py_stack);
        if self.anchor.load(Ordering::Relaxed) == key
            || a.seq >= self.anchor_deadline.load(Ordering::Relaxed)
        {
            self.detect(ledger, keyer, key, (a.stack, a.py_stack), a.seq);
        }
        if self.bucket_due(a.time_ns) {
            self.sample_bucket(ledger, keyer, a.time_ns);
        }
    }

    /// Cold: the anchor recurred, or its deadline passed (then `key` may become the anchor).
    fn detect(&self, ledger: &Ledger, keyer: &dyn SiteKeyer, key: u64, stack: StackPair, seq: u64) {
        if self.marked_any() {
            return; // steps are marked: nothing to detect
        }
        let mut d = match self.detector.try_lock() {
            Ok(d) => d,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let w = d.observe(key, stack, seq);
        self.anchor.store(w.anchor, Ordering::Relaxed);
        self.anchor_deadline.store(w.deadline, Ordering::Relaxed);
        match w.event {
            Event::None => {}
            Event::Detected => {
                // Samples before describe something else (time buckets, or a cycle that was
                // part of this one): start afresh at step 1.
                self.next_bucket_ns.store(u64::MAX, Ordering::Relaxed);
                if let Some(mut h) = self.lock() {
                    if !self.marked_any() {
                        h.auto = History::default();
                        h.auto_mode = AutoMode::Detected;
                        let Histories { auto, keys, .. } = &mut *h;
                        sample(auto, keys, ledger, keyer, 1, seq);
                        self.next_sample_seq
                            .store(seq + sample_spacing(auto.live), Ordering::Relaxed);
                    }
                }
            }
            Event::Step => {
                if seq >= self.next_sample_seq.load(Ordering::Relaxed) {
                    let step = d.steps;
                    if let Some(mut h) = self.lock() {
                        if h.auto_mode == AutoMode::Detected {
                            let Histories { auto, keys, .. } = &mut *h;
                            sample(auto, keys, ledger, keyer, step, seq);
                            self.next_sample_seq
                                .store(seq + sample_spacing(auto.live), Ordering::Relaxed);
                        }
                    }
                }
            }
            Event::Lost => {
                // The run moved on: back to time buckets, history from scratch.
                if let Some(mut h) = self.lock() {
                    if h.auto_mode == AutoMode::Detected {
                        h.auto = History::default();
                        h.auto_mode = AutoMode::Time;
                    }
                }
                if !self.marked_any() {
                    self.next_bucket_ns.store(BUCKET_NS, Ordering::Relaxed);
                }
            }
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

    /// The histories, by `try_lock` with yields: holders keep it for one sample (a ledger walk)
    /// or a copy, so a wait of about 100k yields means it will never be released.
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Histories>> {
        if self.stuck.load(Ordering::Relaxed) {
            return None;
        }
        for _ in 0..100_000 {
            match self.histories.try_lock() {
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

    /// A time-bucket sample (only while nothing is marked or detected).
    pub fn sample_bucket(&self, ledger: &Ledger, keyer: &dyn SiteKeyer, now_ns: u64) {
        let Some(mut h) = self.lock() else { return };
        if h.auto_mode != AutoMode::Time || self.marked_any() {
            return;
        }
        let Histories { auto, keys, .. } = &mut *h;
        sample(
            auto,
            keys,
            ledger,
            keyer,
            now_ns / BUCKET_NS,
            ledger.total_allocations(),
        );
    }

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
            && crate::dump::fit::growing_suffix(&totals)
                .is_some_and(|(f, _)| f.slope >= min_bytes_per_step as f64)
    }

    /// A step boundary marked by `source`: from now on no steps are detected and no time
    /// buckets taken. Returns the number of marks of that source so far (1 for the first).
    pub fn step(
        &self,
        ledger: &Ledger,
        keyer: &dyn SiteKeyer,
        source: StepSource,
        framework_live: Option<FrameworkLive>,
    ) -> u64 {
        self.next_bucket_ns.store(u64::MAX, Ordering::Relaxed);
        let n = self.marks[source as usize].fetch_add(1, Ordering::Relaxed) + 1;
        match source {
            StepSource::Optimizer => self.forwards_since_optimizer.store(0, Ordering::Relaxed),
            StepSource::Forward => {
                self.forwards_since_optimizer
                    .fetch_add(1, Ordering::Relaxed);
            }
            StepSource::Program => {}
        }
        // Marked steps win over detection, for good.
        self.anchor.store(NO_ANCHOR, Ordering::Relaxed);
        self.anchor_deadline.store(u64::MAX, Ordering::Relaxed);
        let Some(mut h) = self.lock() else { return n };
        let Histories { marked, keys, .. } = &mut *h;
        let history = &mut marked[source as usize];
        sample(history, keys, ledger, keyer, n, ledger.total_allocations());
        if let Some(live) = framework_live {
            push_ring(&mut history.framework_live, (n, live.bytes));
            match live.allocations {
                Some(count) => push_ring(&mut history.framework_counts, (n, count)),
                // A count missing once makes the series useless: it must pair every sample.
                None => history.framework_counts.clear(),
            }
        }
        n
    }

    /// The growth for a dump; `None` before two samples. `free_bytes`: the failing (or current)
    /// device's free bytes, for projections; `seq_now`: the allocation count now; `name`: frames
    /// of representative stack pairs (symbolised in one batch).
    pub fn analyse(
        &self,
        free_bytes: Option<u64>,
        seq_now: u64,
        name: impl FnMut(&[StackPair]) -> Vec<Vec<Frame>>,
    ) -> Option<Growth> {
        let copy = {
            let h = self.lock()?;
            let source = self.chosen_source(&h);
            let (history, steps) = match source {
                Some(s) => (&h.marked[s as usize], s.word()),
                // Marks stopped detection and time buckets: what those sampled is stale.
                None if self.marked_any() => return None,
                None => (
                    &h.auto,
                    match h.auto_mode {
                        AutoMode::Time => "time",
                        AutoMode::Detected => "detected",
                    },
                ),
            };
            if history.samples < 2 {
                return None;
            }
            analyse::Copy::of(history_view(history), steps)
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
            .map(|(period, steps, since, anchor)| analyse::Detected {
                period,
                steps,
                since,
                anchor,
            });
        Some(copy.growth(free_bytes, detected, name))
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

fn history_view(h: &History) -> analyse::View<'_> {
    analyse::View {
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

/// Takes a sample at `x` (a step or a second); `seq` is the allocation sequence number now.
fn sample(
    h: &mut History,
    keys: &mut FxHashMap<StackPair, SiteKey>,
    ledger: &Ledger,
    keyer: &dyn SiteKeyer,
    x: u64,
    seq: u64,
) {
    // First the walk, under the ledger's shard locks, into plain sums by stack pair; naming the
    // pairs takes other locks (stack tables, the Python code table), so it comes after.
    let mut by_pair: FxHashMap<StackPair, u64> = FxHashMap::default();
    let mut total = 0u64;
    let mut live = 0u64;
    let mut device_live = 0u64;
    ledger.for_each_live(|a| {
        live += 1;
        if a.api.is_pinned_host() {
            return;
        }
        device_live += 1;
        total += a.bytes;
        *by_pair.entry((a.stack, a.py_stack)).or_insert(0) += a.bytes;
    });
    if keys.len() > MAX_KEY_CACHE {
        keys.clear();
    }
    let mut by_site: FxHashMap<SiteKey, (u64, StackPair)> = FxHashMap::default();
    for (pair, bytes) in by_pair {
        let key = *keys
            .entry(pair)
            .or_insert_with(|| keyer.key(pair.0, pair.1));
        let e = by_site.entry(key).or_insert((0, pair));
        e.0 += bytes;
    }
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
    push_ring(&mut h.counts, (x, device_live));
    // Sites already kept get a sample (0 when they hold nothing now).
    for (key, site) in h.sites.iter_mut() {
        let bytes = by_site.get(key).map_or(0, |e| e.0);
        push_ring(&mut site.samples, (x, bytes));
    }
    // Newcomers, largest first, while there is room or they outweigh the smallest kept site.
    let mut new: Vec<(SiteKey, u64, StackPair)> = by_site
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

#[cfg(test)]
mod tests;
