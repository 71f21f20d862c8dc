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
//!
//! One job a file: here the tracker's state and the hot path; `steps.rs` takes samples when a
//! step is marked or detected or a time bucket ends; `history.rs` holds the samples and takes
//! one; `detect.rs` is the step detector (a pure state machine); `analyse.rs` turns a history
//! into the dump's `growth`, with the fit from `dump::fit`; `sizes.rs` summarises request sizes.

mod analyse;
pub(crate) mod detect;
mod grouping;
mod history;
mod sizes;
mod steps;
mod timeline;

pub(crate) use analyse::Frozen;
pub(crate) use sizes::summarize_sizes;

use detect::{Detector, NO_ANCHOR};
use dump::model::RequestSizes;
use history::Histories;
use oomshim_host::ledger::{Allocation, Ledger, StackId};
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

pub(crate) struct Tracker {
    /// Only ever taken with [`Tracker::lock`] (never blocking) on the shim's paths; the forking
    /// thread holds it across `fork` ([`Tracker::hold_for_fork`]), so a child never starts with
    /// it held by a thread it does not have.
    histories: Mutex<Histories>,
    /// Set once a wait for the histories gave up (said once).
    lock_gave_up: AtomicBool,
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

oomshim_host::fork_held! {
    static DETECTOR_HELD: std::sync::MutexGuard<'static, Detector<StackPair>>;
}
oomshim_host::fork_held! {
    static HISTORIES_HELD: std::sync::MutexGuard<'static, Histories>;
}

/// How long a caller waits for the histories before skipping what it came for.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

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
            lock_gave_up: AtomicBool::new(false),
            // Due at the first allocation: its sample notes when the process began to allocate
            // (the timeline's start, `timeline.rs`).
            next_bucket_ns: AtomicU64::new(0),
            marks: Default::default(),
            forwards_since_optimizer: AtomicU64::new(0),
            anchor: AtomicU64::new(NO_ANCHOR),
            anchor_deadline: AtomicU64::new(0),
            detector: Mutex::new(Detector::new((StackId::EMPTY, StackId::EMPTY))),
            next_sample_seq: AtomicU64::new(0),
            sizes: (0..sizes::SIZE_RING).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// `fork` prepare handler (`super::fork`, first of all its locks): takes the detector's lock,
    /// then the histories' (the order the step path takes them in), and keeps them until
    /// [`Self::release_after_fork`]. Holders only ever `try_lock` them, so nobody waits on these
    /// while holding a lock the forking thread takes later.
    /// A child forked while a sampling thread held the histories once spun 100,000 yields in its
    /// first failure (30 s and more on a loaded machine) before giving growth up.
    pub(super) fn hold_for_fork(&'static self) {
        DETECTOR_HELD.hold(self.detector.lock().unwrap_or_else(|e| e.into_inner()));
        HISTORIES_HELD.hold(self.histories.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// `fork` parent and child handler: lets go of both, in the reverse order.
    pub(super) fn release_after_fork(&self) {
        HISTORIES_HELD.release();
        DETECTOR_HELD.release();
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
    /// or a copy, and the forking thread across a `fork` (its handlers wait for the shim's other
    /// locks meanwhile). A wait past [`LOCK_PATIENCE`] gives this one call up, said once: a
    /// hook never waits without bound, and one late sample does not turn growth off.
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Histories>> {
        let mut started: Option<std::time::Instant> = None;
        for tries in 0u32.. {
            match self.histories.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if tries % 1024 == 0 {
                let since = *started.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > LOCK_PATIENCE {
                    break;
                }
            }
            std::thread::yield_now();
        }
        if !self.lock_gave_up.swap(true, Ordering::Relaxed) {
            oomshim_host::say!(
                "oomshim: the growth tracker's lock stayed busy for {} s: that sample was skipped \
                 (said once; growth over steps may miss it)",
                LOCK_PATIENCE.as_secs()
            );
        }
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
}

#[cfg(test)]
mod tests;
