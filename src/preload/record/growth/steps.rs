//! Where samples are taken: at the steps the program or the Python hook marks, at the steps
//! the detector (`detect.rs`) finds in the allocation pattern, and at time buckets while there
//! are neither. The hot path (`mod.rs`) only decides that one of these is due.

use super::detect::{Event, NO_ANCHOR};
use super::history::{push_ring, sample, sample_spacing, AutoMode, Histories, History};
use super::model::{FrameworkLive, SiteKeyer, StackPair, StepSource, BUCKET_NS};
use super::tracker::Tracker;
use oomshim_host::ledger::Ledger;
use std::sync::atomic::Ordering;

impl Tracker {
    /// Cold: the anchor recurred, or its deadline passed (then `key` may become the anchor).
    pub(super) fn detect(
        &self,
        ledger: &Ledger,
        keyer: &dyn SiteKeyer,
        key: u64,
        stack: StackPair,
        seq: u64,
    ) {
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

    /// A time-bucket sample (only while nothing is marked or detected).
    pub fn sample_bucket(&self, ledger: &Ledger, keyer: &dyn SiteKeyer, now_ns: u64) {
        let Some(mut h) = self.lock() else { return };
        if h.auto_mode != AutoMode::Time || self.marked_any() {
            return;
        }
        h.first_ns.get_or_insert(now_ns);
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
}
