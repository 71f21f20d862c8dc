//! The out-of-memory path, one for both modes (preload and allocator mode).
//!
//! A *request* is one failed allocation and its retries: the same thread asking again for the
//! same size with only frees in between (PyTorch frees its cache and retries; so do XLA and
//! CuPy). Its state is captured at the first failure, on the failing thread (the most telling
//! moment). A failure on that thread of another size, or after a successful allocation, is a new
//! request with its own dump; the earlier one then stood. A request is:
//! - *recovered* when its retry succeeds (the same thread gets at least the failed size);
//! - *stood* when the framework says it raised its out-of-memory error (oomshim's Python hook
//!   forwards torch's OOM observer, with torch's cache state), when the same thread's next
//!   request fails, when `OOMSHIM_SETTLE` passes without a successful retry, or at exit.
//!
//! The dump of a request is written by a writer thread once its outcome is known (or the settle
//! window ends). Without a framework hook in the process (plain CUDA programs, which often abort
//! right after a failure) a provisional dump is written at once and replaced when the outcome is
//! known; with `OOMSHIM_SETTLE=0` the dump is written on the failing thread before the call
//! returns. Allocator mode's failures are final (oomshim's allocator already emptied its cache and
//! retried): their dump is written on the failing thread.
//!
//! Not every failure gets a dump: the same failure again (device, size and stack) within
//! `OOMSHIM_MIN_INTERVAL` of its dump is a *repeat*, and no more than `OOMSHIM_MAX_DUMPS` dumps
//! are written per minute; both are counted in the next dump and said once at exit.

pub mod assemble;
pub mod capture;
pub mod event;
pub mod framework;
pub mod gather;
pub mod job;
pub mod on_demand;
pub mod recorder;
mod requests;
mod summary;
pub mod tracker;
pub mod writer;

pub(crate) use event::Resolution;
pub use event::{FrameworkNote, OomEvent};

use crate::cuda::context::FailureContext;
use assemble::{Capture, Failing};
use dump::model::LastFailure;
use dump::time::unix_ms;
use oomshim_host::ledger::{Api, StackId};
use recorder::Recorder;
use requests::{Admit, Job, Request, Stage, State};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Instant, SystemTime};
use tracker::FRAMEWORK_WAIT;
pub(crate) use tracker::{Handled, Mode, OomTracker};
use writer::WriteNow;

impl OomTracker {
    /// An allocation failed with out-of-memory on `thread`. `framework`: the framework's word,
    /// given before the failure was recorded (allocator mode's observers), for a dump written now.
    pub(crate) fn on_failure(
        &'static self,
        s: &'static dyn Recorder,
        ev: OomEvent,
        stacks: (StackId, StackId),
        thread: u64,
        mode: Mode,
        framework: Option<FrameworkNote>,
    ) -> Handled {
        let now = Instant::now();
        let last = last_failure(s, &ev, SystemTime::now());
        let mut st = self.lock();
        // A retry of this thread's open request?
        if let Some(r) = st.open_request_of(thread) {
            if mode == Mode::Settle && r.retry(ev.device, ev.bytes, last.clone()) {
                return Handled::Retry;
            }
            // The thread moved on to another request: the open one stood.
            r.stand(Resolution::NextRequestFailed);
            self.open.fetch_sub(1, Ordering::Relaxed);
            self.changed.notify_all();
        }
        st.next_id += 1;
        let id = st.next_id;
        // After the exit flush the writer thread may never run again (the process is ending):
        // such a failure is written on this thread rather than lost.
        let flushing = st.flushing;
        let settle_now = mode == Mode::Settle && (s.config().settle.is_zero() || flushing);
        let queued = mode == Mode::Settle && !settle_now;
        let request = if queued { id } else { 0 };
        let (capture, recovered_before) =
            match self.admit_and_capture(s, st, &ev, stacks, now, request) {
                Admitted::Capture(capture, recovered_before) => (capture, recovered_before),
                Admitted::Repeat(path, mut st) => {
                    // Remembered, so the framework's word about this failure finds it (and makes
                    // no dump of its own).
                    st.requests.push(
                        Request::first_failure(id, thread, ev.device, ev.bytes, last, now)
                            .repeating(path.clone()),
                    );
                    st.trim();
                    return Handled::Repeat(path);
                }
                Admitted::NoDump => {
                    // Remembered as a repeat is: the framework's word about it then finds it, and
                    // neither gathers its account nor counts it a second time.
                    let mut st = self.lock();
                    st.requests.push(
                        Request::first_failure(id, thread, ev.device, ev.bytes, last, now)
                            .repeating(None),
                    );
                    st.trim();
                    return Handled::NoDump;
                }
            };
        let mut st = self.lock();
        match mode {
            Mode::Settle if queued => {
                let (repeats, suppressed) = st.take_without_dump();
                let hooked = self.hooked.load(Ordering::Relaxed);
                st.requests.push(Request {
                    hooked,
                    job: Some(Job {
                        capture,
                        facts: None,
                    }),
                    repeats,
                    suppressed,
                    recovered_before,
                    ..Request::first_failure(id, thread, ev.device, ev.bytes, last, now)
                });
                self.open.fetch_add(1, Ordering::Relaxed);
                st.trim();
                self.ensure_writer(s, &mut st);
                self.changed.notify_all();
                Handled::Queued
            }
            _ => {
                let resolution = match mode {
                    Mode::Now(r) => r,
                    Mode::Settle if flushing => Resolution::ProcessExit,
                    Mode::Settle => Resolution::Unknown,
                };
                let failure = WriteNow {
                    capture,
                    resolution,
                    last,
                    framework: framework.as_ref(),
                    stacks,
                    thread,
                    started: now,
                    recovered_before,
                };
                self.write_now(s, st, failure)
            }
        }
    }

    /// A successful device allocation on `thread`: the retry of its open request when at least
    /// as large, else the thread moved on.
    #[inline]
    pub(crate) fn note_success(&self, thread: u64, bytes: u64) {
        if self.open.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut st = self.lock();
        if let Some(r) = st.open_request_of(thread) {
            if r.success(bytes, Instant::now()) {
                let id = r.id;
                self.open.fetch_sub(1, Ordering::Relaxed);
                // A recovered failure is no failure to repeat (the same one again is news), and
                // takes no place under the dump cap.
                st.dumped.retain(|d| d.request != id);
                st.recent.retain(|&(_, request)| request != id);
                self.changed.notify_all();
            }
        }
    }

    /// Whether a framework's word about the failure it raises now on `thread` (`bytes` on
    /// `device`) would go into a dump or beside one: false for a repeat of a dumped failure and
    /// a failure over the dump cap, which get none. Asked before the framework gathers its
    /// account (torch's snapshot and the memory by kind take up to seconds in a large process);
    /// changes nothing.
    pub(crate) fn framework_word_wanted(
        &self,
        s: &dyn Recorder,
        thread: u64,
        device: i32,
        bytes: u64,
    ) -> bool {
        let now = Instant::now();
        let st = self.lock();
        match st
            .requests
            .iter()
            .rev()
            .find(|r| r.raised_by_framework(thread, device, now))
        {
            Some(r) => r.stage != Stage::Repeat,
            None => st.would_admit(s, device, bytes, now),
        }
    }

    /// A framework raised its out-of-memory error on `thread` (torch's OOM observer, through the
    /// Python hook): the matching request stood and gets the framework's account; without one
    /// (torch refused without asking CUDA: a memory-fraction cap) the framework's failure is a
    /// request of its own, dumped now, with what `without_cuda` tells of its device (the
    /// framework's numbers, what the process learnt before: CUDA is not asked).
    pub(crate) fn on_framework_oom(
        &self,
        s: &'static dyn Recorder,
        note: FrameworkNote,
        thread: u64,
        stacks: (StackId, StackId),
        without_cuda: impl FnOnce(i32) -> FailureContext,
    ) -> Handled {
        let now = Instant::now();
        {
            let mut st = self.lock();
            if let Some(r) = st
                .requests
                .iter_mut()
                .rev()
                .find(|r| r.raised_by_framework(thread, note.device, now))
            {
                if r.stage == Stage::Repeat {
                    return Handled::Repeat(r.path.clone());
                }
                if r.is_done() {
                    // Its dump was already final (`OOMSHIM_SETTLE=0`, or the settle window
                    // passed): it stays as written, so stderr and the dump agree.
                    return Handled::Explained {
                        path: r.path.clone(),
                        included: false,
                    };
                }
                // The framework's word is final, even over a success seen on this thread.
                if r.stand(Resolution::FrameworkRaised) {
                    self.open.fetch_sub(1, Ordering::Relaxed);
                }
                r.framework = Some(note);
                let id = r.id;
                self.changed.notify_all();
                // The framework raises as soon as this returns: wait (bounded) for the dump to be
                // on disk, so the program's error, and its exit, come after it.
                let until = Instant::now() + FRAMEWORK_WAIT;
                loop {
                    let r = st.requests.iter().find(|r| r.id == id);
                    match r {
                        Some(r) if !r.is_done() && Instant::now() < until => {}
                        Some(r) => {
                            return Handled::Explained {
                                path: r.path.clone(),
                                included: r.is_done(),
                            }
                        }
                        None => {
                            return Handled::Explained {
                                path: None,
                                included: false,
                            }
                        }
                    }
                    let left = until.saturating_duration_since(Instant::now());
                    st = self
                        .changed
                        .wait_timeout(st, left)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
        }
        let bytes = note.account.request_bytes.unwrap_or(0);
        let ev = OomEvent {
            api: Api::FrameworkAllocator,
            bytes,
            device: note.device,
            error_code: oomshim_host::sys::cuda_error::MEMORY_ALLOCATION,
            stream: 0,
            // The framework's thread may hold its allocator's lock: CUDA is not asked here.
            context: FailureContext {
                memory_cap: note.memory_cap.clone(),
                ..without_cuda(note.device)
            },
        };
        let st = self.lock();
        let (capture, recovered_before) = match self.admit_and_capture(s, st, &ev, stacks, now, 0) {
            Admitted::Capture(capture, recovered_before) => (capture, recovered_before),
            Admitted::Repeat(p, _) => return Handled::Repeat(p),
            Admitted::NoDump => return Handled::NoDump,
        };
        let last = last_failure(s, &ev, capture.time);
        let failure = WriteNow {
            capture,
            resolution: Resolution::FrameworkRaised,
            last,
            framework: Some(&note),
            stacks,
            thread,
            started: now,
            recovered_before,
        };
        self.write_now(s, self.lock(), failure)
    }
}

/// What became of a failure at [`OomTracker::admit_and_capture`]. Returned once per failure and
/// taken apart at once: the capture moves on by value, as it did before this step was shared,
/// rather than through a box allocated on the out-of-memory path.
#[allow(clippy::large_enum_variant)]
enum Admitted<'a> {
    /// A new dump: the state it describes, captured now, and the recovered requests its story
    /// tells.
    Capture(Capture, u32),
    /// A repeat of an earlier dumped failure: that dump, with the tracker's lock still held
    /// (the caller may remember the repeat under it).
    Repeat(Option<PathBuf>, MutexGuard<'a, State>),
    /// Over the dump cap, or no room for a dump.
    NoDump,
}

impl OomTracker {
    /// The steps every failure that may get a dump goes through, in this order: admitted under
    /// the tracker's lock `st` (a repeat, over the cap, or a new dump, counted against the cap;
    /// `request` is the queued request's id, 0 for a dump written now), the lock let go, room
    /// for a dump made sure of, and the failure's state captured on this thread.
    fn admit_and_capture<'a>(
        &'a self,
        s: &dyn Recorder,
        mut st: MutexGuard<'a, State>,
        ev: &OomEvent,
        stacks: (StackId, StackId),
        now: Instant,
        request: u64,
    ) -> Admitted<'a> {
        match st.admit(s, ev, stacks, now, request) {
            Admit::Repeat(path) => return Admitted::Repeat(path, st),
            Admit::Capped => return Admitted::NoDump,
            Admit::New => {}
        }
        // A new dump: recovered requests on its device that are still held are its story's
        // (only now: a failure without a dump would leave them told nowhere).
        let recovered_before = st.absorb_recovered(ev.device, now, s.config().settle);
        if !st.stale.is_empty() {
            self.changed.notify_all();
        }
        drop(st);
        if !crate::state::room_for_dump(s.live_count()) {
            return Admitted::NoDump;
        }
        Admitted::Capture(failure_capture(s, ev, stacks), recovered_before)
    }
}

/// The ledger and the device as they are at a failure, for its dump: taken on the failing
/// thread, at once (the most telling moment), with the context the event brought from there.
pub(super) fn failure_capture(
    s: &dyn Recorder,
    ev: &OomEvent,
    stacks: (StackId, StackId),
) -> Capture {
    let failing = Failing {
        api: ev.api,
        bytes: ev.bytes,
        device: ev.device,
        error_code: ev.error_code,
        stack: stacks.0,
        py_stack: stacks.1,
    };
    // The dump describes the failing device, whoever gathered the rest.
    let context = FailureContext {
        device: Some(ev.device),
        ..ev.context.clone()
    };
    capture::take(s, Some(failing), context)
}

/// The dump's `last_failure` for `ev`, seen at `time`.
pub(super) fn last_failure(s: &dyn Recorder, ev: &OomEvent, time: SystemTime) -> LastFailure {
    LastFailure {
        bytes: ev.bytes,
        api: ev.api.name().to_string(),
        time_unix_ms: unix_ms(time),
        tracked_bytes: s.device_bytes(ev.device),
        free_bytes: ev.context.mem_info.map(|m| m.0),
        total_bytes: ev.context.mem_info.map(|m| m.1),
    }
}

#[cfg(test)]
mod tests {
    use super::requests::Admit;
    use super::*;
    use crate::shim::Shim;
    use oomshim_core::config::Config;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;

    fn event(bytes: u64) -> OomEvent {
        event_on(0, bytes)
    }

    fn event_on(device: i32, bytes: u64) -> OomEvent {
        OomEvent {
            api: Api::CudaMalloc,
            bytes,
            device,
            error_code: 2,
            stream: 0,
            context: FailureContext::default(),
        }
    }

    /// Admits a failure of `bytes` at `at` as queued request `id` of `thread`, open, as
    /// `on_failure` does.
    fn fail(t: &OomTracker, s: &dyn Recorder, id: u64, thread: u64, bytes: u64, at: Instant) {
        fail_on(t, s, 0, (id, thread), bytes, at);
    }

    /// [`fail`] on `device`, with the capture the writer would wait with.
    fn fail_on(
        t: &OomTracker,
        s: &dyn Recorder,
        device: i32,
        (id, thread): (u64, u64),
        bytes: u64,
        at: Instant,
    ) {
        let mut st = t.lock();
        let stacks = (StackId(id as u32), StackId::EMPTY);
        let ev = event_on(device, bytes);
        assert!(matches!(st.admit(s, &ev, stacks, at, id), Admit::New));
        let last = last_failure(s, &ev, SystemTime::now());
        st.requests.push(Request {
            job: Some(Job {
                capture: failure_capture(s, &ev, stacks),
                facts: None,
            }),
            ..Request::first_failure(id, thread, device, bytes, last, at)
        });
        t.open.fetch_add(1, Ordering::Relaxed);
    }

    /// A request that recovers gives back its own place under `OOMSHIM_MAX_DUMPS`, not the
    /// newest one, which may be another thread's failure: the cap counts the dumps of the last
    /// minute as they were started.
    #[test]
    fn a_recovered_request_gives_back_its_own_place_under_the_dump_cap() {
        let s = Shim::empty(Config {
            max_dumps_per_minute: Some(2),
            min_interval: Duration::ZERO,
            ..Config::default()
        });
        let t = OomTracker::new();
        let t0 = Instant::now();
        // Thread 1 fails at t0, thread 2 at t0 + 30 s; thread 1's retry then succeeds.
        fail(&t, &s, 1, 1, GIB, t0);
        fail(&t, &s, 2, 2, 2 * GIB, t0 + Duration::from_secs(30));
        t.note_success(1, GIB);
        // Thread 3 fails at t0 + 31 s: one dump (thread 2's) started within the minute.
        fail(&t, &s, 3, 3, 3 * GIB, t0 + Duration::from_secs(31));
        // At t0 + 61 s thread 2's and thread 3's dumps are both less than a minute old: the cap
        // of two is reached.
        let st = t.lock();
        assert!(!st.would_admit(&s, 0, 4 * GIB, t0 + Duration::from_secs(61)));
        // Once thread 2's is a minute old, there is room again.
        assert!(st.would_admit(&s, 0, 4 * GIB, t0 + Duration::from_secs(91)));
    }

    /// A recovered request waits for a failure on its device to tell its story. A failure that
    /// gets no dump (over the cap, a repeat) tells none: the recovered request keeps its own
    /// dump rather than vanish without a word.
    #[test]
    fn a_failure_without_a_dump_leaves_a_recovered_request_its_own() {
        let s: &'static Shim = Box::leak(Box::new(Shim::empty(Config {
            max_dumps_per_minute: Some(1),
            min_interval: Duration::ZERO,
            settle: Duration::from_secs(60),
            ..Config::default()
        })));
        let t: &'static OomTracker = Box::leak(Box::new(OomTracker::new()));
        let t0 = Instant::now();
        // Thread 1's request on device 0 recovers (it gave back its place under the cap); a
        // failure on device 1 then takes the one place of the minute.
        fail_on(t, s, 0, (1, 1), GIB, t0);
        t.note_success(1, GIB);
        fail_on(t, s, 1, (2, 2), GIB, t0);
        // Thread 3 fails on device 0, over the cap: no dump.
        let stacks = (StackId(3), StackId::EMPTY);
        let handled = t.on_failure(s, event(2 * GIB), stacks, 3, Mode::Settle, None);
        assert!(matches!(handled, Handled::NoDump));
        let st = t.lock();
        let recovered = st.requests.iter().find(|r| r.id == 1).unwrap();
        assert_eq!(recovered.stage, Stage::Stood(Resolution::RetrySucceeded));
        assert!(recovered.job.is_some(), "its dump is still to be written");
    }
}
