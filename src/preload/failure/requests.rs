//! A failed request's life, as a state machine ([`Stage`], changed only by [`Request`]'s
//! methods), and which failures get a dump at all ([`State::admit`]: repeats and the cap).

use super::event::{FrameworkNote, OomEvent, Resolution};
use super::recorder::Recorder;
use crate::failure::assemble::{Capture, Facts};
use dump::model::LastFailure;
use oomshim_host::ledger::StackId;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The tracker's state, under its lock.
#[derive(Default)]
pub(super) struct State {
    pub(super) next_id: u64,
    pub(super) requests: Vec<Request>,
    pub(super) dumped: Vec<Dumped>,
    /// When the last dumps were started, each with its request's id (0: written at once), for
    /// `OOMSHIM_MAX_DUMPS` per minute: a request that recovers gives back its own place.
    pub(super) recent: std::collections::VecDeque<(Instant, u64)>,
    /// Failures without a dump since the last dump: repeats, and over the cap.
    pub(super) repeats: u64,
    pub(super) suppressed: u64,
    /// Said at exit (once) when failures after the last dump got none.
    pub(super) said_at_exit: bool,
    /// Recovered failures written (the first gets a dump), and those only counted since.
    pub(super) recovered_dumps: u64,
    pub(super) recovered_quiet: u64,
    pub(super) flushing: bool,
    /// The pid whose writer thread runs (a forked child starts its own).
    pub(super) writer_pid: u32,
    /// Requests being written by a thread now (the exit flush waits for them).
    pub(super) writing: u32,
    /// Provisional dumps of requests that ended without a dump of their own (absorbed into a
    /// later failure's story), for the writer to remove.
    pub(super) stale: Vec<PathBuf>,
}

/// Requests kept once done (for matching a late framework word and for tests); older ones go.
pub(super) const KEEP_DONE: usize = 16;
/// How long after its failure a framework's word is matched to a request.
pub(super) const FRAMEWORK_MATCH: Duration = Duration::from_secs(60);

/// One failed request (see the module comment): what it is, and where it is in its life
/// ([`Stage`]).
pub(super) struct Request {
    /// Stable identity (requests are looked up by it after the lock was released).
    pub(super) id: u64,
    pub(super) thread: u64,
    pub(super) device: i32,
    pub(super) bytes: u64,
    pub(super) failures: u32,
    pub(super) last: LastFailure,
    pub(super) started: Instant,
    pub(super) stage: Stage,
    pub(super) framework: Option<FrameworkNote>,
    /// A framework hook was attached when it failed: its word is waited for (no provisional
    /// dump).
    pub(super) hooked: bool,
    /// Its capture, waiting for the writer thread (taken while a thread writes it).
    pub(super) job: Option<Job>,
    /// Where its dump is (provisional or final; for a repeat, the dump it repeats).
    pub(super) path: Option<PathBuf>,
    /// Repeats and suppressed failures to report in its dump.
    pub(super) repeats: u64,
    pub(super) suppressed: u64,
    /// A framework's own refusal (no CUDA call failed): a later word of the framework is a new
    /// failure, never about this one.
    pub(super) framework_only: bool,
    /// When its retry succeeded. A recovered request waits `OOMSHIM_SETTLE` after it before its
    /// dump and line: a failure on its device by then is the same running out of memory, and
    /// tells its story ([`State::absorb_recovered`]).
    pub(super) recovered_at: Option<Instant>,
    /// Recovered requests its story tells (they got no dump of their own).
    pub(super) recovered_before: u32,
    /// The writer is writing its provisional dump now (the job is out).
    pub(super) provisional_writing: bool,
}

/// Where a request is. Every change of stage is one of `Request`'s methods below:
/// - Open, `retry`: stays Open (same thread, device and size, no success in between);
/// - Open, `success` smaller than the request: Open with `moved_on` (the next failure is new);
/// - Open, `success` at least the request's size: Stood(RetrySucceeded), held for
///   `OOMSHIM_SETTLE` (a new failure on its device by then absorbs it: Done, no dump);
/// - Open, `provisional_written`: Open with `provisional`;
/// - Open, `stand(outcome)`: Stood(outcome) (next request failed, framework raised, settle
///   expired, process exit);
/// - Stood, `stand(FrameworkRaised)`: Stood(FrameworkRaised) (the framework's word is final);
/// - Open or Stood, `finish` (final dump written, or deliberately none): Done;
/// - written on the failing thread: Done(Unknown) from the start (`written_at_once`); a repeat:
///   Repeat from the start (`repeating`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Its outcome is not known yet: the same thread asking the same size again is its retry.
    Open {
        /// The thread had a successful allocation since this request's last failure: a
        /// failure of the same size now is a new request, not a retry.
        moved_on: bool,
        /// Its provisional dump was written (or tried): no second one.
        provisional: bool,
    },
    /// Its outcome is known; its final dump is still to be written.
    Stood(Resolution),
    /// Its final dump is written (or, for a recovered failure after the first, deliberately
    /// none): nothing changes it any more.
    Done(Resolution),
    /// A repeat of an earlier dumped failure: no dump of its own (`path` is that dump's); kept
    /// so the framework's word about it is recognised.
    Repeat,
}

impl Request {
    /// A request at its first failure, still open.
    pub(super) fn first_failure(
        id: u64,
        thread: u64,
        device: i32,
        bytes: u64,
        last: LastFailure,
        started: Instant,
    ) -> Request {
        Request {
            id,
            thread,
            device,
            bytes,
            failures: 1,
            last,
            started,
            stage: Stage::Open {
                moved_on: false,
                provisional: false,
            },
            framework: None,
            hooked: false,
            job: None,
            path: None,
            repeats: 0,
            suppressed: 0,
            framework_only: false,
            recovered_at: None,
            recovered_before: 0,
            provisional_writing: false,
        }
    }

    /// Written on the failing thread: kept only so that a framework's word about it later finds
    /// its dump at `path` and makes no second one.
    pub(super) fn written_at_once(self, path: Option<PathBuf>) -> Request {
        Request {
            stage: Stage::Done(Resolution::Unknown),
            path,
            ..self
        }
    }

    /// A repeat of the dump at `path`: kept only so that a framework's word about it later finds
    /// that dump and makes no second one.
    pub(super) fn repeating(self, path: Option<PathBuf>) -> Request {
        Request {
            stage: Stage::Repeat,
            path,
            ..self
        }
    }

    /// The request a framework's out-of-memory error raised now on `thread` for `device` is
    /// about: this thread's, on that device, failed in CUDA (not the framework's own refusal),
    /// not recovered, and recent.
    pub(super) fn raised_by_framework(&self, thread: u64, device: i32, now: Instant) -> bool {
        self.thread == thread
            && self.device == device
            && !self.framework_only
            // A failure that recovered is not the one the framework raises now.
            && self.outcome() != Some(Resolution::RetrySucceeded)
            && now.duration_since(self.started) < FRAMEWORK_MATCH
    }

    pub(super) fn is_open(&self) -> bool {
        matches!(self.stage, Stage::Open { .. })
    }

    /// Nothing changes it any more.
    pub(super) fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done(_) | Stage::Repeat)
    }

    /// Its outcome, once known (a request written at once or a repeat: `Unknown`).
    pub(super) fn outcome(&self) -> Option<Resolution> {
        match self.stage {
            Stage::Open { .. } => None,
            Stage::Stood(r) | Stage::Done(r) => Some(r),
            Stage::Repeat => Some(Resolution::Unknown),
        }
    }

    /// A failure of `device` and `bytes` on its thread, if it is this open request's retry:
    /// counted, and true.
    pub(super) fn retry(&mut self, device: i32, bytes: u64, last: LastFailure) -> bool {
        let is_retry = matches!(
            self.stage,
            Stage::Open {
                moved_on: false,
                ..
            }
        ) && self.device == device
            && self.bytes == bytes;
        if is_retry {
            self.failures += 1;
            self.last = last;
        }
        is_retry
    }

    /// A successful allocation of `bytes` on its thread at `now` while open: true when it is the
    /// retry that recovered (then it stood), else the thread moved on.
    pub(super) fn success(&mut self, bytes: u64, now: Instant) -> bool {
        let Stage::Open { moved_on, .. } = &mut self.stage else {
            return false;
        };
        if !*moved_on && bytes >= self.bytes {
            self.stage = Stage::Stood(Resolution::RetrySucceeded);
            self.recovered_at = Some(now);
            true
        } else {
            *moved_on = true;
            false
        }
    }

    /// Its outcome is known: `outcome` (a framework's word replaces an earlier outcome). True
    /// when it was open until now.
    pub(super) fn stand(&mut self, outcome: Resolution) -> bool {
        let was_open = self.is_open();
        if !self.is_done() {
            self.stage = Stage::Stood(outcome);
        }
        was_open
    }

    /// Recovered, its dump not written yet, and within `hold` of its recovery at `now`: a
    /// failure on its device now tells its story.
    pub(super) fn held_recovered(&self, now: Instant, hold: Duration) -> bool {
        self.stage == Stage::Stood(Resolution::RetrySucceeded)
            && (self.job.is_some() || self.provisional_writing)
            && self
                .recovered_at
                .is_some_and(|at| now.saturating_duration_since(at) <= hold)
    }

    /// Until when a recovered request whose dump is not written yet waits (`hold` after its
    /// recovery); None for any other.
    pub(super) fn hold_until(&self, hold: Duration) -> Option<Instant> {
        match self.stage {
            Stage::Stood(Resolution::RetrySucceeded) => self.recovered_at.map(|at| at + hold),
            _ => None,
        }
    }

    /// Its provisional dump was written (or tried).
    pub(super) fn provisional_written(&mut self) {
        if let Stage::Open { provisional, .. } = &mut self.stage {
            *provisional = true;
        }
    }

    /// Its final dump is written, or deliberately none.
    pub(super) fn finish(&mut self) {
        if !self.is_done() {
            self.stage = Stage::Done(self.outcome().unwrap_or(Resolution::Unknown));
        }
    }
}

/// A queued request's capture, for the writer thread; the facts are read by the writer as soon
/// as it sees the request.
pub(super) struct Job {
    pub(super) capture: Capture,
    pub(super) facts: Option<Facts>,
}

/// A dumped failure, for recognising repeats.
pub(super) struct Dumped {
    /// The request it was (0 for failures written at once).
    pub(super) request: u64,
    pub(super) device: i32,
    pub(super) bytes: u64,
    /// Where it failed: [`site_of`] its stacks.
    pub(super) site: u64,
    pub(super) at: Instant,
    pub(super) path: Option<PathBuf>,
}

impl State {
    /// This thread's open request (at most one).
    pub(super) fn open_request_of(&mut self, thread: u64) -> Option<&mut Request> {
        self.requests
            .iter_mut()
            .find(|r| r.thread == thread && r.is_open())
    }

    /// The failures without a dump since the last dump (repeats, over the cap), for the next
    /// dump to report.
    pub(super) fn take_without_dump(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.repeats),
            std::mem::take(&mut self.suppressed),
        )
    }

    /// A new failure on `device` at `now`: the recovered requests there still within `hold` of
    /// their recovery end without a dump of their own (Done): the program is running out of
    /// memory again, and the new failure's story tells them. Returns how many (with those they
    /// had absorbed); their provisional dumps are left in `stale` for the writer to remove.
    pub(super) fn absorb_recovered(&mut self, device: i32, now: Instant, hold: Duration) -> u32 {
        let mut count = 0;
        for r in self.requests.iter_mut() {
            if r.device == device && r.held_recovered(now, hold) {
                count += 1 + r.recovered_before;
                r.job = None;
                r.finish();
                self.stale.extend(r.path.take());
            }
        }
        count
    }

    /// Forgets the oldest done requests beyond [`KEEP_DONE`].
    pub(super) fn trim(&mut self) {
        let done = self.requests.iter().filter(|r| r.is_done()).count();
        if done > KEEP_DONE {
            let mut drop_n = done - KEEP_DONE;
            self.requests.retain(|r| {
                if r.is_done() && drop_n > 0 {
                    drop_n -= 1;
                    false
                } else {
                    true
                }
            });
        }
    }

    /// Whether [`State::admit`] would give a failure of `bytes` on `device` a dump now. Without
    /// the failure's stack (it is asked before the failure is recorded), a dumped failure of that
    /// size on that device within the interval counts as the same one. Changes nothing.
    pub(super) fn would_admit(
        &self,
        s: &dyn Recorder,
        device: i32,
        bytes: u64,
        now: Instant,
    ) -> bool {
        let interval = s.config().min_interval;
        if self
            .dumped
            .iter()
            .any(|d| d.device == device && d.bytes == bytes && now.duration_since(d.at) < interval)
        {
            return false;
        }
        let minute = Duration::from_secs(60);
        s.config().max_dumps_per_minute.is_none_or(|max| {
            (self
                .recent
                .iter()
                .filter(|(t, _)| now.duration_since(*t) < minute)
                .count() as u64)
                < max
        })
    }

    /// Repeat, over the cap, or a new dump (then counted against the cap and remembered).
    pub(super) fn admit(
        &mut self,
        s: &dyn Recorder,
        ev: &OomEvent,
        stacks: (StackId, StackId),
        now: Instant,
        request: u64,
    ) -> Admit {
        // Whatever becomes of this failure, the exit says what got no dump.
        // And, should it end the process, what it leaves for the job (after that flush).
        s.watch_exit();
        let interval = s.config().min_interval;
        self.dumped
            .retain(|d| now.duration_since(d.at) < interval.max(FRAMEWORK_MATCH));
        let site = site_of(stacks);
        if let Some(d) = self.dumped.iter().find(|d| {
            d.device == ev.device
                && d.bytes == ev.bytes
                && d.site == site
                && now.duration_since(d.at) < interval
        }) {
            let path = d.path.clone();
            self.repeats += 1;
            return Admit::Repeat(path);
        }
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= Duration::from_secs(60))
        {
            self.recent.pop_front();
        }
        if let Some(max) = s.config().max_dumps_per_minute {
            if self.recent.len() as u64 >= max {
                self.suppressed += 1;
                return Admit::Capped;
            }
        }
        self.recent.push_back((now, request));
        self.dumped.push(Dumped {
            request,
            device: ev.device,
            bytes: ev.bytes,
            site,
            at: now,
            path: None,
        });
        Admit::New
    }
}

/// Where a failure happened, for recognising a repeat: its Python stack when it has one (threads
/// running the same code reach CUDA through different native paths), else its native stack.
pub(super) fn site_of((native, python): (StackId, StackId)) -> u64 {
    if python != StackId::EMPTY {
        (1u64 << 63) | python.0 as u64
    } else {
        native.0 as u64
    }
}

pub(super) enum Admit {
    New,
    Repeat(Option<PathBuf>),
    Capped,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn last(bytes: u64) -> LastFailure {
        LastFailure {
            bytes,
            api: "cudaMalloc".into(),
            time_unix_ms: 0,
            tracked_bytes: 0,
            free_bytes: None,
            total_bytes: None,
        }
    }

    fn open(id: u64) -> Request {
        Request::first_failure(id, 7, 0, GIB, last(GIB), Instant::now())
    }

    #[test]
    fn a_request_takes_its_retries_until_it_stands_then_nothing_changes_it() {
        let mut r = open(1);
        assert!(r.retry(0, GIB, last(GIB)));
        assert_eq!(r.failures, 2);
        assert!(
            !r.retry(0, GIB / 2, last(GIB / 2)),
            "another size is another request"
        );
        assert!(
            !r.retry(1, GIB, last(GIB)),
            "another device is another request"
        );
        // A smaller success: the thread moved on, and the same size again is a new request.
        assert!(!r.success(GIB / 2, Instant::now()));
        assert!(!r.retry(0, GIB, last(GIB)));
        assert!(
            !r.success(2 * GIB, Instant::now()),
            "after moving on no success is its retry"
        );
        assert_eq!(r.failures, 2);
        r.provisional_written();
        assert_eq!(
            r.stage,
            Stage::Open {
                moved_on: true,
                provisional: true
            }
        );
        assert_eq!(r.outcome(), None);
        assert!(r.stand(Resolution::SettleExpired), "it was open");
        assert_eq!(r.outcome(), Some(Resolution::SettleExpired));
        // The framework's word replaces an outcome not yet written.
        assert!(!r.stand(Resolution::FrameworkRaised));
        assert_eq!(r.stage, Stage::Stood(Resolution::FrameworkRaised));
        r.provisional_written();
        assert_eq!(r.stage, Stage::Stood(Resolution::FrameworkRaised));
        r.finish();
        assert!(r.is_done());
        assert!(!r.stand(Resolution::NextRequestFailed));
        assert_eq!(r.stage, Stage::Done(Resolution::FrameworkRaised));
    }

    #[test]
    fn a_retry_that_gets_at_least_its_size_recovers_it() {
        let mut r = open(1);
        assert!(r.success(GIB, Instant::now()));
        assert_eq!(r.stage, Stage::Stood(Resolution::RetrySucceeded));
        assert!(!r.success(GIB, Instant::now()), "it stood already");
        assert!(!r.retry(0, GIB, last(GIB)));
    }

    #[test]
    fn a_new_failure_within_the_hold_takes_in_the_recovered_requests_of_its_device() {
        let hold = Duration::from_secs(2);
        let t0 = Instant::now();
        // Recovered at t0, its provisional dump on disk and being rewritten (no job to hand).
        let recovered = |id: u64, device: i32, before: u32| {
            let mut r = Request::first_failure(id, 7, device, GIB, last(GIB), t0);
            assert!(r.success(GIB, t0));
            r.path = Some(format!("/tmp/d-{id}.json").into());
            r.provisional_writing = true;
            r.recovered_before = before;
            r
        };
        let mut st = State::default();
        st.requests.push(recovered(1, 0, 2));
        st.requests.push(recovered(2, 1, 0));
        st.requests.push(open(3));
        assert_eq!(st.requests[0].hold_until(hold), Some(t0 + hold));
        assert_eq!(st.requests[2].hold_until(hold), None, "not recovered");
        // After the hold, nothing is taken in.
        assert_eq!(st.absorb_recovered(0, t0 + 2 * hold, hold), 0);
        assert!(st.stale.is_empty());
        // Within it: the one of device 0, with the two it had taken in; device 1's stays, and
        // so does the open request.
        assert_eq!(st.absorb_recovered(0, t0 + hold / 2, hold), 3);
        assert_eq!(
            st.requests[0].stage,
            Stage::Done(Resolution::RetrySucceeded)
        );
        assert!(st.requests[0].hold_until(hold).is_none() && st.requests[0].path.is_none());
        assert_eq!(st.stale, [std::path::PathBuf::from("/tmp/d-1.json")]);
        assert!(st.requests[1].held_recovered(t0, hold));
        assert!(st.requests[2].is_open());
        // Taken in once only.
        assert_eq!(st.absorb_recovered(0, t0 + hold / 2, hold), 0);
        // A recovered request whose dump is being written for good (no job, not provisional)
        // tells its own story.
        st.requests[1].provisional_writing = false;
        assert_eq!(st.absorb_recovered(1, t0, hold), 0);
    }

    #[test]
    fn failures_written_at_once_and_repeats_are_done_from_the_start() {
        let r = open(1).written_at_once(Some("/tmp/d.json".into()));
        assert_eq!(r.stage, Stage::Done(Resolution::Unknown));
        assert_eq!(r.path.as_deref(), Some(std::path::Path::new("/tmp/d.json")));
        let r = open(2).repeating(None);
        assert_eq!(r.stage, Stage::Repeat);
        assert!(r.is_done() && !r.is_open());
        assert_eq!(r.outcome(), Some(Resolution::Unknown));
    }

    #[test]
    fn only_the_newest_done_requests_are_kept() {
        let mut st = State::default();
        st.requests.push(open(100));
        for id in 0..KEEP_DONE as u64 + 4 {
            st.requests.push(open(id).written_at_once(None));
        }
        st.trim();
        assert_eq!(st.requests.len(), KEEP_DONE + 1);
        assert!(st.requests[0].is_open(), "open requests stay");
        assert_eq!(st.requests[1].id, 4, "the oldest done ones went");
        assert!(st.open_request_of(7).is_some_and(|r| r.id == 100));
        assert!(st.open_request_of(8).is_none());
    }
}
