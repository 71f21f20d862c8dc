//! The tracker's state and the hot path ([`Tracker::on_alloc`]); `steps.rs` and `analyse.rs`
//! add its sampling and its analysis.

use super::detect::{Detector, NO_ANCHOR};
use super::history::Histories;
use super::model::{SiteKeyer, StackPair, BUCKET_NS};
use super::sizes::{self, summarize_sizes};
use dump::model::RequestSizes;
use oomshim_host::ledger::{Allocation, Ledger, StackId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub(crate) struct Tracker {
    /// Only ever taken with [`Tracker::lock`] (never blocking) on the shim's paths; the forking
    /// thread holds it across `fork` ([`Tracker::hold_for_fork`]), so a child never starts with
    /// it held by a thread it does not have.
    pub(super) histories: Mutex<Histories>,
    /// Set once a wait for the histories gave up (said once).
    pub(super) lock_gave_up: AtomicBool,
    /// Shim clock of the next time-bucket boundary; `u64::MAX` once steps are marked.
    pub(super) next_bucket_ns: AtomicU64,
    /// Marks per [`StepSource`].
    pub(super) marks: [AtomicU64; 3],
    /// Forward passes marked since the last optimizer step: an evaluation phase when several.
    pub(super) forwards_since_optimizer: AtomicU64,
    /// The detector's anchor site ([`NO_ANCHOR`] once steps are marked), and the sequence number
    /// from which it counts as not seen in time: both read on every allocation.
    pub(super) anchor: AtomicU64,
    pub(super) anchor_deadline: AtomicU64,
    pub(super) detector: Mutex<Detector<StackPair>>,
    /// No detected-step sample before this sequence number (the cost rule).
    pub(super) next_sample_seq: AtomicU64,
    /// The last [`sizes::SIZE_RING`] device request sizes, indexed by sequence number (0: empty).
    pub(super) sizes: Box<[AtomicU64]>,
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

    /// `fork` prepare handler (`crate::fork`, first of all its locks): takes the detector's lock,
    /// then the histories' (the order the step path takes them in), and keeps them until
    /// [`Self::release_after_fork`]. Holders only ever `try_lock` them, so nobody waits on these
    /// while holding a lock the forking thread takes later.
    /// A child forked while a sampling thread held the histories once spun 100,000 yields in its
    /// first failure (30 s and more on a loaded machine) before giving growth up.
    pub(crate) fn hold_for_fork(&'static self) {
        DETECTOR_HELD.hold(self.detector.lock().unwrap_or_else(|e| e.into_inner()));
        HISTORIES_HELD.hold(self.histories.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// `fork` parent and child handler: lets go of both, in the reverse order.
    pub(crate) fn release_after_fork(&self) {
        HISTORIES_HELD.release();
        DETECTOR_HELD.release();
    }

    pub(super) fn marked_any(&self) -> bool {
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
    pub(super) fn lock(&self) -> Option<std::sync::MutexGuard<'_, Histories>> {
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
