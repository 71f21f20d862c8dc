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

use super::assemble::{self, Capture, Failing};
use super::{unix_ms, Shim};
use dump::model::{Dump, FrameworkOom, FreeBlocks, LastFailure};
use dump::units::{human_bytes, thousands};
use dump::write::{write_dump, DumpName, WriteError, Written};
use oomshim_core::ledger::{Api, StackId};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// What the hook saw when an allocation failed, and what only the failing thread could ask.
pub struct OomEvent {
    pub api: Api,
    pub bytes: u64,
    pub device: i32,
    pub error_code: i32,
    pub stream: usize,
    /// The device's answers (free/total, name, pools, …), gathered on the failing thread right
    /// after the failure; they travel with the request to its dump.
    pub context: super::FailureContext,
}

/// How a request's outcome became known (the dump's `failed_request.resolution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    RetrySucceeded,
    FrameworkRaised,
    NextRequestFailed,
    SettleExpired,
    ProcessExit,
    Allocator,
    /// Written before anything was known (`OOMSHIM_SETTLE=0`, or a provisional dump).
    Unknown,
}

impl Resolution {
    pub fn word(self) -> &'static str {
        match self {
            Resolution::RetrySucceeded => "retry_succeeded",
            Resolution::FrameworkRaised => "framework_raised",
            Resolution::NextRequestFailed => "next_request_failed",
            Resolution::SettleExpired => "settle_expired",
            Resolution::ProcessExit => "process_exit",
            Resolution::Allocator => "allocator",
            Resolution::Unknown => "unknown",
        }
    }

    /// The dump's `recovered`.
    pub fn recovered(self) -> Option<bool> {
        match self {
            Resolution::RetrySucceeded => Some(true),
            Resolution::Unknown => None,
            _ => Some(false),
        }
    }
}

/// What a framework told the shim about an out-of-memory failure it raised (through the Python
/// hook): its account for the dump and its cache's free blocks.
#[derive(Debug, Clone, Default)]
pub struct FrameworkNote {
    pub device: i32,
    pub account: FrameworkOom,
    pub free_blocks: Option<FreeBlocks>,
    /// The per-process cap torch enforced (`set_per_process_memory_fraction`), if any.
    pub memory_cap: Option<dump::model::MemoryCap>,
}

/// One failed request (see the module comment): what it is, and where it is in its life
/// ([`Stage`]).
struct Request {
    /// Stable identity (requests are looked up by it after the lock was released).
    id: u64,
    thread: u64,
    device: i32,
    bytes: u64,
    failures: u32,
    last: LastFailure,
    started: Instant,
    stage: Stage,
    framework: Option<FrameworkNote>,
    /// A framework hook was attached when it failed: its word is waited for (no provisional
    /// dump).
    hooked: bool,
    /// Its capture, waiting for the writer thread (taken while a thread writes it).
    job: Option<Job>,
    /// Where its dump is (provisional or final; for a repeat, the dump it repeats).
    path: Option<PathBuf>,
    /// Repeats and suppressed failures to report in its dump.
    repeats: u64,
    suppressed: u64,
    /// A framework's own refusal (no CUDA call failed): a later word of the framework is a new
    /// failure, never about this one.
    framework_only: bool,
}

/// Where a request is. Every change of stage is one of `Request`'s methods below:
///
/// ```text
/// Open ──retry──▶ Open                    (same thread, same size, no success in between)
/// Open ──success──▶ Open{moved_on}         (a smaller success: the next failure is new)
/// Open ──provisional dump──▶ Open{provisional}
/// Open ──stand(outcome)──▶ Stood           (retry succeeded, next request failed, framework
///                                           raised, settle expired, process exit)
/// Stood ──framework raised──▶ Stood        (the framework's word is final)
/// Open, Stood ──final dump written──▶ Done
/// (written on the failing thread) ──▶ Done(Unknown);  (a repeat) ──▶ Repeat
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
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
    fn first_failure(
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
        }
    }

    /// Written on the failing thread: kept only so that a framework's word about it later finds
    /// its dump at `path` and makes no second one.
    fn written_at_once(self, path: Option<PathBuf>) -> Request {
        Request {
            stage: Stage::Done(Resolution::Unknown),
            path,
            ..self
        }
    }

    /// A repeat of the dump at `path`: kept only so that a framework's word about it later finds
    /// that dump and makes no second one.
    fn repeating(self, path: Option<PathBuf>) -> Request {
        Request {
            stage: Stage::Repeat,
            path,
            ..self
        }
    }

    fn is_open(&self) -> bool {
        matches!(self.stage, Stage::Open { .. })
    }

    /// Nothing changes it any more.
    fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done(_) | Stage::Repeat)
    }

    /// Its outcome, once known (a request written at once or a repeat: `Unknown`).
    fn outcome(&self) -> Option<Resolution> {
        match self.stage {
            Stage::Open { .. } => None,
            Stage::Stood(r) | Stage::Done(r) => Some(r),
            Stage::Repeat => Some(Resolution::Unknown),
        }
    }

    /// A failure of `device` and `bytes` on its thread, if it is this open request's retry:
    /// counted, and true.
    fn retry(&mut self, device: i32, bytes: u64, last: LastFailure) -> bool {
        let is_retry = matches!(self.stage, Stage::Open { moved_on: false, .. })
            && self.device == device
            && self.bytes == bytes;
        if is_retry {
            self.failures += 1;
            self.last = last;
        }
        is_retry
    }

    /// A successful allocation of `bytes` on its thread while open: true when it is the retry
    /// that recovered (then it stood), else the thread moved on.
    fn success(&mut self, bytes: u64) -> bool {
        let Stage::Open { moved_on, .. } = &mut self.stage else {
            return false;
        };
        if !*moved_on && bytes >= self.bytes {
            self.stage = Stage::Stood(Resolution::RetrySucceeded);
            true
        } else {
            *moved_on = true;
            false
        }
    }

    /// Its outcome is known: `outcome` (a framework's word replaces an earlier outcome). True
    /// when it was open until now.
    fn stand(&mut self, outcome: Resolution) -> bool {
        let was_open = self.is_open();
        if !self.is_done() {
            self.stage = Stage::Stood(outcome);
        }
        was_open
    }

    /// Its provisional dump was written (or tried).
    fn provisional_written(&mut self) {
        if let Stage::Open { provisional, .. } = &mut self.stage {
            *provisional = true;
        }
    }

    /// Its final dump is written, or deliberately none.
    fn finish(&mut self) {
        if !self.is_done() {
            self.stage = Stage::Done(self.outcome().unwrap_or(Resolution::Unknown));
        }
    }
}

/// A failure whose dump is written on the failing thread, now (allocator mode,
/// `OOMSHIM_SETTLE=0`, after the exit flush, a framework's own refusal).
struct WriteNow<'a> {
    capture: Capture,
    resolution: Resolution,
    last: LastFailure,
    framework: Option<&'a FrameworkNote>,
    stacks: (StackId, StackId),
    thread: u64,
    started: Instant,
}

/// A queued request's capture, for the writer thread; the facts are read by the writer as soon
/// as it sees the request.
struct Job {
    capture: Capture,
    facts: Option<assemble::Facts>,
}

/// A dumped failure, for recognising repeats.
struct Dumped {
    /// The request it was (0 for failures written at once).
    request: u64,
    device: i32,
    bytes: u64,
    /// Where it failed: [`site_of`] its stacks.
    site: u64,
    at: Instant,
    path: Option<PathBuf>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    requests: Vec<Request>,
    dumped: Vec<Dumped>,
    /// When the last dumps were started (for `OOMSHIM_MAX_DUMPS` per minute).
    recent: std::collections::VecDeque<Instant>,
    /// Failures without a dump since the last dump: repeats, and over the cap.
    repeats: u64,
    suppressed: u64,
    /// Said at exit (once) when failures after the last dump got none.
    said_at_exit: bool,
    /// Recovered failures written (the first gets a dump), and those only counted since.
    recovered_dumps: u64,
    recovered_quiet: u64,
    flushing: bool,
    /// The pid whose writer thread runs (a forked child starts its own).
    writer_pid: u32,
    /// Requests being written by a thread now (the exit flush waits for them).
    writing: u32,
}

impl State {
    /// This thread's open request (at most one).
    fn open_request_of(&mut self, thread: u64) -> Option<&mut Request> {
        self.requests
            .iter_mut()
            .find(|r| r.thread == thread && r.is_open())
    }

    /// The failures without a dump since the last dump (repeats, over the cap), for the next
    /// dump to report.
    fn take_without_dump(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.repeats),
            std::mem::take(&mut self.suppressed),
        )
    }
}

/// Requests kept once done (for matching a late framework word and for tests); older ones go.
const KEEP_DONE: usize = 16;
/// How long after its failure a framework's word is matched to a request.
const FRAMEWORK_MATCH: Duration = Duration::from_secs(60);
/// The least a failure waits for the word of an attached framework hook.
const HOOKED_SETTLE: Duration = Duration::from_secs(30);
/// How long the framework's thread waits for the dump its word completes.
const FRAMEWORK_WAIT: Duration = Duration::from_secs(30);

pub(crate) struct OomTracker {
    /// Requests not yet resolved: read on every allocation, so the lock is taken only when set.
    open: AtomicU32,
    /// A framework hook (torch's OOM observer) is attached in this process.
    hooked: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

/// The outcome of an allocation failure for its caller.
pub(crate) enum Handled {
    /// Dump queued for the writer thread.
    Queued,
    /// A retry of an open request.
    Retry,
    /// Written on this thread (allocator mode, `OOMSHIM_SETTLE=0`, a framework's own failure).
    Written {
        path: Option<PathBuf>,
        verdict: (String, String),
    },
    /// A repeat of an earlier dumped failure: its dump.
    Repeat(Option<PathBuf>),
    /// A framework's word about a failure already dumped (or being dumped): the dump, and
    /// whether the word made it into the dump.
    Explained {
        path: Option<PathBuf>,
        included: bool,
    },
    /// Over `OOMSHIM_MAX_DUMPS` (or no room for a dump): no dump.
    NoDump,
}

/// How the failing path wants the dump written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Preload: by the writer thread once the outcome is known.
    Settle,
    /// Now, on this thread, with this resolution.
    Now(Resolution),
}

impl OomTracker {
    pub(crate) fn new() -> Self {
        OomTracker {
            open: AtomicU32::new(0),
            hooked: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A framework hook (torch's OOM observer) is attached: failures wait for its word.
    pub(crate) fn set_hooked(&self) {
        self.hooked.store(true, Ordering::Relaxed);
    }

    /// An allocation failed with out-of-memory on `thread`. `framework`: the framework's word,
    /// given before the failure was recorded (allocator mode's observers), for a dump written now.
    pub(crate) fn on_failure(
        &self,
        s: &'static Shim,
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
        let settle_now = mode == Mode::Settle && (s.config.settle.is_zero() || flushing);
        let queued = mode == Mode::Settle && !settle_now;
        match self.admit(&mut st, s, &ev, stacks, now, if queued { id } else { 0 }) {
            Admit::Repeat(path) => {
                // Remembered, so the framework's word about this failure finds it (and makes
                // no dump of its own).
                st.requests.push(
                    Request::first_failure(id, thread, ev.device, ev.bytes, last, now)
                        .repeating(path.clone()),
                );
                self.trim(&mut st);
                return Handled::Repeat(path);
            }
            Admit::Capped => return Handled::NoDump,
            Admit::New => {}
        }
        drop(st);
        if !super::room_for_dump(s) {
            return Handled::NoDump;
        }
        let capture = failure_capture(s, &ev, stacks);
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
                    ..Request::first_failure(id, thread, ev.device, ev.bytes, last, now)
                });
                self.open.fetch_add(1, Ordering::Relaxed);
                self.trim(&mut st);
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
                };
                self.write_now(s, st, failure)
            }
        }
    }

    /// Assembles and writes the dump of a failure on the failing thread, now, with the failures
    /// that got no dump since the last one, and says its summary; remembers it as a done request
    /// (a framework's word about it finds its dump) and its path for repeats.
    fn write_now(&self, s: &Shim, mut st: MutexGuard<'_, State>, failure: WriteNow<'_>) -> Handled {
        let WriteNow {
            capture,
            resolution,
            last,
            framework,
            stacks,
            thread,
            started,
        } = failure;
        let (repeats, suppressed) = st.take_without_dump();
        let writing = self.start_writing(&mut st);
        drop(st);
        let facts = assemble::Facts::read(capture.context.device);
        let burst = assemble::BurstInfo {
            failures: 1,
            resolution,
            last,
            repeats,
            suppressed,
        };
        let (dump, written) = assemble_and_write(s, &capture, burst, framework, facts, None);
        print_summary(&dump, &written);
        let path = written.ok().map(|w| w.path);
        let mut st = self.lock();
        writing.done(&mut st);
        if let Some(req) = &dump.failed_request {
            // Kept as a done request: a framework's word about it later (torch's observer after
            // a dump written at once) finds the dump, and makes no second one.
            st.next_id += 1;
            let id = st.next_id;
            let last = req.last_failure.clone().unwrap_or(LastFailure {
                bytes: req.bytes,
                api: req.api.clone(),
                time_unix_ms: dump.time_unix_ms,
                tracked_bytes: 0,
                free_bytes: None,
                total_bytes: None,
            });
            st.requests.push(Request {
                framework_only: req.api == Api::FrameworkAllocator.name(),
                ..Request::first_failure(id, thread, req.device, req.bytes, last, started)
                    .written_at_once(path.clone())
            });
            self.trim(&mut st);
            let site = site_of(stacks);
            if let Some(d) = st.dumped.iter_mut().rev().find(|d| {
                d.request == 0
                    && d.device == req.device
                    && d.bytes == req.bytes
                    && d.site == site
                    && d.path.is_none()
            }) {
                d.path = path.clone();
            }
        }
        self.changed.notify_all();
        Handled::Written {
            path,
            verdict: (dump.verdict.kind.clone(), dump.verdict.summary.clone()),
        }
    }

    /// Repeat, over the cap, or a new dump (then counted against the cap and remembered).
    fn admit(
        &self,
        st: &mut State,
        s: &Shim,
        ev: &OomEvent,
        stacks: (StackId, StackId),
        now: Instant,
        request: u64,
    ) -> Admit {
        // Whatever becomes of this failure, the exit says what got no dump.
        oomshim_core::sys::flush_dumps_at_exit(super::flush_at_exit);
        let interval = s.config.min_interval;
        st.dumped
            .retain(|d| now.duration_since(d.at) < interval.max(FRAMEWORK_MATCH));
        let site = site_of(stacks);
        if let Some(d) = st.dumped.iter().find(|d| {
            d.device == ev.device
                && d.bytes == ev.bytes
                && d.site == site
                && now.duration_since(d.at) < interval
        }) {
            let path = d.path.clone();
            st.repeats += 1;
            return Admit::Repeat(path);
        }
        while st
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            st.recent.pop_front();
        }
        if let Some(max) = s.config.max_dumps_per_minute {
            if st.recent.len() as u64 >= max {
                st.suppressed += 1;
                return Admit::Capped;
            }
        }
        st.recent.push_back(now);
        st.dumped.push(Dumped {
            request,
            device: ev.device,
            bytes: ev.bytes,
            site,
            at: now,
            path: None,
        });
        Admit::New
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
            if r.success(bytes) {
                let id = r.id;
                self.open.fetch_sub(1, Ordering::Relaxed);
                // A recovered failure is no failure to repeat (the same one again is news), and
                // takes no place under the dump cap.
                st.dumped.retain(|d| d.request != id);
                st.recent.pop_back();
                self.changed.notify_all();
            }
        }
    }

    /// A framework raised its out-of-memory error on `thread` (torch's OOM observer, through the
    /// Python hook): the matching request stood and gets the framework's account; without one
    /// (torch refused without asking CUDA: a memory-fraction cap) the framework's failure is a
    /// request of its own, dumped now.
    pub(crate) fn on_framework_oom(
        &self,
        s: &'static Shim,
        note: FrameworkNote,
        thread: u64,
        stacks: (StackId, StackId),
        mem_info: Option<(u64, u64)>,
    ) -> Handled {
        let now = Instant::now();
        {
            let mut st = self.lock();
            if let Some(r) = st.requests.iter_mut().rev().find(|r| {
                r.thread == thread
                    && r.device == note.device
                    && !r.framework_only
                    // A failure that recovered is not the one the framework raises now.
                    && r.outcome() != Some(Resolution::RetrySucceeded)
                    && now.duration_since(r.started) < FRAMEWORK_MATCH
            }) {
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
            error_code: oomshim_core::sys::cuda_error::MEMORY_ALLOCATION,
            stream: 0,
            // The framework's thread may hold its allocator's lock: CUDA is not asked here.
            context: super::FailureContext {
                memory_cap: note.memory_cap.clone(),
                ..super::FailureContext::without_cuda(Some(note.device), mem_info)
            },
        };
        let mut st = self.lock();
        match self.admit(&mut st, s, &ev, stacks, now, 0) {
            Admit::Repeat(p) => return Handled::Repeat(p),
            Admit::Capped => return Handled::NoDump,
            Admit::New => {}
        }
        drop(st);
        if !super::room_for_dump(s) {
            return Handled::NoDump;
        }
        let capture = failure_capture(s, &ev, stacks);
        let last = last_failure(s, &ev, capture.time);
        let failure = WriteNow {
            capture,
            resolution: Resolution::FrameworkRaised,
            last,
            framework: Some(&note),
            stacks,
            thread,
            started: now,
        };
        self.write_now(s, self.lock(), failure)
    }

    /// Forgets the oldest done requests beyond [`KEEP_DONE`].
    fn trim(&self, st: &mut State) {
        let done = st.requests.iter().filter(|r| r.is_done()).count();
        if done > KEEP_DONE {
            let mut drop_n = done - KEEP_DONE;
            st.requests.retain(|r| {
                if r.is_done() && drop_n > 0 {
                    drop_n -= 1;
                    false
                } else {
                    true
                }
            });
        }
    }

    fn ensure_writer(&self, s: &'static Shim, st: &mut State) {
        let pid = std::process::id();
        if st.writer_pid == pid {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("oomshim-writer".into())
            .spawn(move || {
                let _ = oomshim_core::sys::guarded(|| s.oom.writer_loop(s));
                // The loop ends only by a panic (the shim is pass-through now): the exit flush
                // writes what is still queued itself rather than wait for this thread.
                s.oom.writer_gone();
            });
        if spawned.is_ok() {
            st.writer_pid = pid;
            oomshim_core::sys::flush_dumps_at_exit(super::flush_at_exit);
        } else {
            // No writer thread: write on the failing threads' exits instead (the exit flush).
            oomshim_core::sys::flush_dumps_at_exit(super::flush_at_exit);
        }
    }

    /// The writer thread: reads the facts of new requests at once (NVML's view at the failure,
    /// not seconds later), writes provisional dumps where no framework will speak, and final
    /// dumps as outcomes become known.
    fn writer_loop(&self, s: &Shim) {
        loop {
            match self.next_work(s) {
                Work::Facts(id, device) => {
                    let facts = assemble::Facts::read(Some(device));
                    let mut st = self.lock();
                    if let Some(job) = st
                        .requests
                        .iter_mut()
                        .find(|r| r.id == id)
                        .and_then(|r| r.job.as_mut())
                    {
                        job.facts = Some(facts);
                    }
                }
                Work::Write { id, provisional } => self.write_request(s, id, provisional),
            }
        }
    }

    /// Blocks until there is something to do for the writer.
    fn next_work(&self, s: &Shim) -> Work {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            let flushing = st.flushing;
            // Facts first, for every new request.
            if let Some(r) = st
                .requests
                .iter()
                .find(|r| r.job.as_ref().is_some_and(|j| j.facts.is_none()))
            {
                return Work::Facts(r.id, r.device);
            }
            let mut wait = Duration::from_secs(3600);
            for r in &st.requests {
                if r.job.is_none() {
                    continue;
                }
                // With a framework hook attached its word is worth waiting for: torch empties its
                // cache and retries before it raises, which can take seconds on a full device.
                let settle = if r.hooked {
                    s.config.settle.max(HOOKED_SETTLE)
                } else {
                    s.config.settle
                };
                let deadline = r.started + settle;
                if !r.is_open() || flushing || now >= deadline {
                    return Work::Write {
                        id: r.id,
                        provisional: false,
                    };
                }
                if !r.hooked && matches!(r.stage, Stage::Open { provisional: false, .. }) {
                    return Work::Write {
                        id: r.id,
                        provisional: true,
                    };
                }
                wait = wait.min(deadline - now);
            }
            st = self
                .changed
                .wait_timeout(st, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Writes request `id`'s dump: provisional (outcome unknown, no stderr) or final.
    fn write_request(&self, s: &Shim, id: u64, provisional: bool) {
        let mut st = self.lock();
        let flushing = st.flushing;
        let Some(r) = st.requests.iter_mut().find(|r| r.id == id) else {
            return;
        };
        let resolution = if provisional {
            Resolution::Unknown
        } else {
            match r.outcome() {
                Some(o) => o,
                None => {
                    // Nothing more will be learnt.
                    let o = if flushing {
                        Resolution::ProcessExit
                    } else {
                        Resolution::SettleExpired
                    };
                    r.stand(o);
                    self.open.fetch_sub(1, Ordering::Relaxed);
                    o
                }
            }
        };
        let Some(job) = r.job.take() else { return };
        if resolution == Resolution::RetrySucceeded {
            // The first recovered failure gets its dump and one quiet line; later ones (a cache
            // that keeps running full and recovering) are counted and said once at exit.
            let quiet = st.recovered_dumps > 0;
            let r = st
                .requests
                .iter_mut()
                .find(|r| r.id == id)
                .expect("found above");
            if quiet {
                r.finish();
                if let Some(p) = r.path.take() {
                    let _ = std::fs::remove_file(p); // its provisional dump
                }
                st.recovered_quiet += 1;
                self.changed.notify_all();
                return;
            }
            st.recovered_dumps += 1;
        }
        let Some(r) = st.requests.iter_mut().find(|r| r.id == id) else {
            return;
        };
        let burst = assemble::BurstInfo {
            failures: r.failures,
            resolution,
            last: r.last.clone(),
            repeats: r.repeats,
            suppressed: r.suppressed,
        };
        let framework = r.framework.clone();
        let existing = r.path.clone();
        let writing = self.start_writing(&mut st);
        drop(st);

        // The facts were read when the failure reached the writer; without them (the exit
        // flush on a thread of its own) they are read now, as for any dump.
        let facts = match job.facts.clone() {
            Some(f) => f.with_current_uuids(),
            None => assemble::Facts::read(job.capture.context.device),
        };
        let (dump, written) = assemble_and_write(
            s,
            &job.capture,
            burst,
            framework.as_ref(),
            facts,
            existing.as_deref(),
        );
        if !provisional {
            print_summary(&dump, &written);
        }
        let mut st = self.lock();
        writing.done(&mut st);
        let mut path = None;
        if let Some(r) = st.requests.iter_mut().find(|r| r.id == id) {
            if let Ok(w) = &written {
                r.path = Some(w.path.clone());
            }
            path = r.path.clone();
            if provisional {
                r.provisional_written();
                r.job = Some(job);
            } else {
                r.finish();
            }
        }
        if let Some(d) = st.dumped.iter_mut().find(|d| d.request == id) {
            d.path = path;
        }
        self.changed.notify_all();
    }

    /// Ends every settle wait now and waits (at most `limit`) for pending dumps to be written;
    /// says once when failures after the last dump got none.
    pub(crate) fn flush(&self, limit: Duration) {
        let until = Instant::now() + limit;
        let mut st = self.lock();
        st.flushing = true;
        self.changed.notify_all();
        loop {
            let queued = st.requests.iter().any(|r| r.job.is_some());
            if queued && st.writer_pid != std::process::id() {
                // No writer thread in this process (a forked child, none could start, or it
                // died of a panic): nothing will write the queued requests but this thread.
                drop(st);
                let wrote = self.write_all_here();
                st = self.lock();
                if wrote {
                    continue;
                }
            }
            if st.writing == 0 && !st.requests.iter().any(|r| r.job.is_some()) {
                break;
            }
            let now = Instant::now();
            if now >= until {
                say("gave up waiting for a dump to be written at exit");
                return;
            }
            st = self
                .changed
                .wait_timeout(st, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        let (repeats, suppressed, recovered) = (st.repeats, st.suppressed, st.recovered_quiet);
        if (repeats > 0 || suppressed > 0 || recovered > 0) && !st.said_at_exit {
            st.said_at_exit = true;
            drop(st);
            if repeats > 0 || suppressed > 0 {
                say(&without_dump_line(repeats, suppressed));
            }
            if recovered > 0 {
                say(&format!(
                    "{} more out-of-memory failures were recovered by their retry (counted, no dump each: only the first gets one)",
                    thousands(recovered)
                ));
            }
        }
    }

    /// Counts a dump being written by this thread (see [`Writing`]).
    fn start_writing(&self, st: &mut State) -> Writing<'_> {
        st.writing += 1;
        Writing {
            tracker: self,
            counted: true,
        }
    }

    /// The writer thread ended (a panic): none runs in this process any more.
    fn writer_gone(&self) {
        let mut st = self.lock();
        if st.writer_pid == std::process::id() {
            st.writer_pid = 0;
        }
        self.changed.notify_all();
    }

    /// The exit flush's own writing when no writer thread exists; false when there is no shim
    /// to write with.
    fn write_all_here(&self) -> bool {
        let Some(s) = super::SHIM.get() else {
            return false;
        };
        loop {
            let next = {
                let st = self.lock();
                st.requests.iter().find(|r| r.job.is_some()).map(|r| r.id)
            };
            match next {
                Some(id) => self.write_request(s, id, false),
                None => return true,
            }
        }
    }
}

/// A dump being written by a thread, counted in `State::writing` (the exit flush waits for
/// those) until [`Writing::done`], or until it is dropped: a panic while writing cannot leave
/// the flush waiting its whole limit for a dump that will never come. Dropped counted, it takes
/// the tracker's lock: the thread must not hold it then.
struct Writing<'a> {
    tracker: &'a OomTracker,
    counted: bool,
}

impl Writing<'_> {
    /// The dump is written: no longer counted, under the lock the caller holds.
    fn done(mut self, st: &mut State) {
        st.writing -= 1;
        self.counted = false;
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.tracker.lock().writing -= 1;
            self.tracker.changed.notify_all();
        }
    }
}

/// Where a failure happened, for recognising a repeat: its Python stack when it has one (threads
/// running the same code reach CUDA through different native paths), else its native stack.
fn site_of((native, python): (StackId, StackId)) -> u64 {
    if python != StackId::EMPTY {
        (1u64 << 63) | python.0 as u64
    } else {
        native.0 as u64
    }
}

enum Admit {
    New,
    Repeat(Option<PathBuf>),
    Capped,
}

enum Work {
    Facts(u64, i32),
    Write { id: u64, provisional: bool },
}

fn without_dump_line(repeats: u64, suppressed: u64) -> String {
    let mut parts = Vec::new();
    if repeats > 0 {
        parts.push(format!(
            "{} repeated an earlier dumped failure within OOMSHIM_MIN_INTERVAL",
            thousands(repeats)
        ));
    }
    if suppressed > 0 {
        parts.push(format!(
            "{} came over the OOMSHIM_MAX_DUMPS cap",
            thousands(suppressed)
        ));
    }
    format!(
        "{} out-of-memory failures after the last dump got no dump of their own: {}",
        thousands(repeats + suppressed),
        parts.join("; ")
    )
}

fn say(text: &str) {
    super::say::say(&format!("oomshim: {text}"));
}

/// The ledger and the device as they are at a failure, for its dump: taken on the failing
/// thread, at once (the most telling moment), with the context the event brought from there.
pub(super) fn failure_capture(s: &Shim, ev: &OomEvent, stacks: (StackId, StackId)) -> Capture {
    Capture {
        snapshot: s.ledger.snapshot(s.config.top),
        time: SystemTime::now(),
        now_ns: s.now_ns(),
        failing: Some(Failing {
            api: ev.api,
            bytes: ev.bytes,
            device: ev.device,
            error_code: ev.error_code,
            stack: stacks.0,
            py_stack: stacks.1,
        }),
        context: super::FailureContext {
            // The dump describes the failing device, whoever gathered the rest.
            device: Some(ev.device),
            ..ev.context.clone()
        },
        // The growth up to this failure: a program that keeps stepping after its error would
        // fill the rings with flat samples before a settled dump is written (issue 27).
        growth: s.growth.freeze(s.ledger.total_allocations()),
    }
}

/// The dump's `last_failure` for `ev`, seen at `time`.
pub(super) fn last_failure(s: &Shim, ev: &OomEvent, time: SystemTime) -> LastFailure {
    LastFailure {
        bytes: ev.bytes,
        api: ev.api.name().to_string(),
        time_unix_ms: unix_ms(time),
        tracked_bytes: s.ledger.device_bytes(ev.device),
        free_bytes: ev.context.mem_info.map(|m| m.0),
        total_bytes: ev.context.mem_info.map(|m| m.1),
    }
}

oomshim_core::fork_held! {
    /// The OOM tracker's lock, held by the forking thread across `fork` (see `super::fork`).
    static FORK_HELD: MutexGuard<'static, State>;
}

impl OomTracker {
    /// `fork` prepare handler: takes the tracker's lock (the ledger's and the stack tables' are
    /// taken after it, see `super::fork`).
    pub(super) fn hold_for_fork(&'static self) {
        FORK_HELD.hold(self.lock());
    }

    /// `fork` parent and child handler: lets go of it; in the child, with the parent's requests
    /// forgotten.
    pub(super) fn release_after_fork(&self, child: bool) {
        let Some(mut state) = FORK_HELD.take() else {
            return;
        };
        if child {
            // The child has no writer thread and none of the parent's requests: start afresh. The
            // parent's are leaked, not dropped (they may hold what a vanished thread was using).
            std::mem::forget(std::mem::take(&mut *state));
            self.open.store(0, Ordering::Relaxed);
        }
        drop(state);
    }
}

/// Assembles the dump of a failed request from its capture and `facts` (read at the failure)
/// and writes it: over `existing` (this process's provisional dump of it) when given, else as
/// a new dump.
fn assemble_and_write(
    s: &Shim,
    capture: &Capture,
    burst: assemble::BurstInfo,
    framework: Option<&FrameworkNote>,
    facts: assemble::Facts,
    existing: Option<&std::path::Path>,
) -> (Dump, Result<Written, WriteError>) {
    let dump = super::gather::assemble_now(s, "oom", capture, Some(burst), framework, facts);
    let written = match existing {
        Some(path) => rewrite(path, &dump),
        None => write(s, &dump),
    };
    (dump, written)
}

/// Serialises and writes a new dump; a fallback directory is announced once.
pub(super) fn write(s: &Shim, dump: &Dump) -> Result<Written, WriteError> {
    static FALLBACK_SAID: AtomicBool = AtomicBool::new(false);
    let bytes = serde_json::to_vec_pretty(dump).map_err(|e| WriteError {
        message: e.to_string(),
    })?;
    let name = DumpName {
        host: dump.process.host.clone(),
        pid: dump.process.pid,
        rank: dump.process.rank,
    };
    let written = write_dump(&s.config.dir, &name, &bytes)?;
    crate::publish::note_dump(dump, &written.path);
    if let Some(why) = &written.fell_back {
        if !FALLBACK_SAID.swap(true, Ordering::Relaxed) {
            oomshim_core::say!(
                "oomshim: {why}; writing dumps to {} instead",
                written.path.parent().unwrap_or(&written.path).display()
            );
        }
    }
    Ok(written)
}

/// Replaces this process's provisional dump at `path` with `dump`.
fn rewrite(path: &std::path::Path, dump: &Dump) -> Result<Written, WriteError> {
    let bytes = serde_json::to_vec_pretty(dump).map_err(|e| WriteError {
        message: e.to_string(),
    })?;
    dump::write::rewrite_dump(path, &bytes)?;
    Ok(Written {
        path: path.to_path_buf(),
        fell_back: None,
    })
}

pub(super) fn print_summary(dump: &Dump, written: &Result<Written, WriteError>) {
    if let Some(text) = summary_lines(dump, written) {
        super::say::say(&text);
    }
}

/// The stderr summary of an out-of-memory dump: one quiet line when a retry recovered it, else
/// two: the failure and the top finding in plain words with its key numbers, then where the
/// dump is and how to read it. `None` for a dump without a failed request.
pub(crate) fn summary_lines(dump: &Dump, written: &Result<Written, WriteError>) -> Option<String> {
    let req = dump.failed_request.as_ref()?;
    let where_ = match written {
        Ok(w) => format!("dump: {}", w.path.display()),
        Err(e) => format!("no dump written: {e}"),
    };
    if req.recovered == Some(true) {
        return Some(format!(
            "oomshim: {} of {} on device {} failed, then its retry succeeded (recovered); {where_}",
            req.api,
            human_bytes(req.bytes),
            req.device
        ));
    }
    let mut notes = Vec::new();
    if req.failures_in_burst > 1 {
        notes.push(format!(
            "{} failures with its retries",
            thousands(req.failures_in_burst.into())
        ));
    }
    if dump
        .framework
        .as_ref()
        .is_some_and(|f| f.raised && f.name == "torch")
    {
        notes.push("torch raised OutOfMemoryError".to_string());
    }
    let r = &dump.recording;
    if r.repeated_failures + r.suppressed_dumps > 0 {
        notes.push(format!(
            "{} earlier failures without a dump",
            thousands(r.repeated_failures + r.suppressed_dumps)
        ));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!("; {}", notes.join("; "))
    };
    let finding = match dump.verdict.findings.first() {
        Some(f) => format!("{}: {}", f.kind, f.headline),
        None => dump.verdict.kind.clone(),
    };
    let what = if req.api == Api::FrameworkAllocator.name() {
        let of = if req.bytes > 0 {
            format!(" of {}", human_bytes(req.bytes))
        } else {
            // The framework's message did not say how much.
            String::new()
        };
        format!(
            "{}{of} refused{notes}",
            dump.framework
                .as_ref()
                .map_or("the framework's allocator", |f| match f.name.as_str() {
                    "torch" => "torch's caching allocator",
                    "xla" => "XLA's allocator",
                    _ => "the framework's allocator",
                }),
        )
    } else {
        format!("{} of {} failed{notes}", req.api, human_bytes(req.bytes))
    };
    let mut out = format!(
        "oomshim: CUDA out of memory on device {} ({what}): {finding}\n",
        req.device,
    );
    out.push_str(&format!("oomshim:   {where_}"));
    if let Ok(w) = written {
        out.push_str(&format!("  (details: oomshim report {})", w.path.display()));
    }
    Some(out)
}

#[cfg(test)]
mod writing_tests {
    use super::*;

    /// A panic in the middle of writing a dump (on the writer thread, or a failing thread)
    /// releases its count: the exit flush does not wait its limit for it.
    #[test]
    fn a_panic_while_writing_does_not_hold_up_the_exit_flush() {
        let t = OomTracker::new();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut st = t.lock();
            let _writing = t.start_writing(&mut st);
            drop(st);
            panic!("in the middle of a dump");
        }));
        assert!(panicked.is_err());
        assert_eq!(t.lock().writing, 0);
        let started = Instant::now();
        t.flush(Duration::from_secs(20));
        assert!(started.elapsed() < Duration::from_secs(5));

        // A dump still being written is waited for, up to the limit, and released by `done`.
        let mut st = t.lock();
        let writing = t.start_writing(&mut st);
        drop(st);
        let started = Instant::now();
        t.flush(Duration::from_millis(200));
        assert!(started.elapsed() >= Duration::from_millis(200));
        let mut st = t.lock();
        writing.done(&mut st);
        assert_eq!(st.writing, 0);
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use dump::fixtures::oom_dump;

    const GIB: u64 = 1 << 30;

    fn written() -> Result<Written, WriteError> {
        Ok(Written {
            path: "/tmp/d/oomshim-h-1-1.json".into(),
            fell_back: None,
        })
    }

    #[test]
    fn two_lines_name_the_top_finding_and_the_dump() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().failures_in_burst = 3;
        d.verdict = oomshim_core::verdict::judge(&d);
        let text = summary_lines(&d, &written()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        // The top finding as the verdict words it (its wording is tested with the verdict).
        let top = &d.verdict.findings[0];
        assert_eq!(top.kind, "own_allocations");
        assert_eq!(
            lines[0],
            format!(
                "oomshim: CUDA out of memory on device 0 (cudaMalloc of 2.00 GiB failed; 3 failures with its retries): \
                 own_allocations: {}",
                top.headline
            )
        );
        assert_eq!(
            lines[1],
            "oomshim:   dump: /tmp/d/oomshim-h-1-1.json  (details: oomshim report /tmp/d/oomshim-h-1-1.json)"
        );
        // No dump written: still two lines, saying why.
        let err = Err(WriteError {
            message: "disk full".into(),
        });
        let text = summary_lines(&d, &err).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(
            text.ends_with("oomshim:   no dump written: disk full"),
            "{text}"
        );
        // torch's word and failures without a dump are said.
        d.framework = Some(FrameworkOom {
            name: "torch".into(),
            raised: true,
            ..Default::default()
        });
        d.recording.repeated_failures = 2;
        let text = summary_lines(&d, &written()).unwrap();
        assert!(
            text.starts_with(
                "oomshim: CUDA out of memory on device 0 (cudaMalloc of 2.00 GiB failed; 3 failures with its retries; \
                 torch raised OutOfMemoryError; 2 earlier failures without a dump): own_allocations"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_recovered_failure_is_one_quiet_line() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().recovered = Some(true);
        d.verdict = oomshim_core::verdict::judge(&d);
        let text = summary_lines(&d, &written()).unwrap();
        assert_eq!(
            text,
            "oomshim: cudaMalloc of 2.00 GiB on device 0 failed, then its retry succeeded (recovered); \
             dump: /tmp/d/oomshim-h-1-1.json"
        );
        d.failed_request = None;
        assert!(summary_lines(&d, &written()).is_none());
    }

    #[test]
    fn failures_without_a_dump_are_said_in_one_line() {
        assert_eq!(
            without_dump_line(3, 0),
            "3 out-of-memory failures after the last dump got no dump of their own: 3 repeated an earlier \
             dumped failure within OOMSHIM_MIN_INTERVAL"
        );
        assert!(without_dump_line(1, 5).contains("5 came over the OOMSHIM_MAX_DUMPS cap"));
    }
}
