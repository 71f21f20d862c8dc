//! Writing the dumps: on the failing thread at once ([`OomTracker::write_now`]), or by the
//! writer thread from its queue once the outcome is known (a provisional dump first where no
//! framework will speak), and the exit flush that waits for them.

use super::event::{FrameworkNote, Resolution};
use super::job;
use super::recorder::Recorder;
use super::requests::State;
use super::requests::{site_of, Request, Stage};
use super::summary::{print_summary, say, say_without_dumps};
use super::tracker::{Handled, OomTracker, HOOKED_SETTLE};
use crate::failure::assemble::{BurstInfo, Capture, Facts};
use dump::model::{Dump, LastFailure};
use dump::write::{write_dump, DumpName, WriteError, Written};
use oomshim_host::ledger::{Api, StackId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// A failure whose dump is written on the failing thread, now (allocator mode,
/// `OOMSHIM_SETTLE=0`, after the exit flush, a framework's own refusal).
pub(super) struct WriteNow<'a> {
    pub(super) capture: Capture,
    pub(super) resolution: Resolution,
    pub(super) last: LastFailure,
    pub(super) framework: Option<&'a FrameworkNote>,
    pub(super) stacks: (StackId, StackId),
    pub(super) thread: u64,
    pub(super) started: Instant,
    /// Recovered requests its story tells.
    pub(super) recovered_before: u32,
}

impl OomTracker {
    /// Assembles and writes the dump of a failure on the failing thread, now, with the failures
    /// that got no dump since the last one, and says its summary; remembers it as a done request
    /// (a framework's word about it finds its dump) and its path for repeats.
    pub(super) fn write_now(
        &self,
        s: &dyn Recorder,
        mut st: MutexGuard<'_, State>,
        failure: WriteNow<'_>,
    ) -> Handled {
        let WriteNow {
            capture,
            resolution,
            last,
            framework,
            stacks,
            thread,
            started,
            recovered_before,
        } = failure;
        let (repeats, suppressed) = st.take_without_dump();
        let writing = self.start_writing(&mut st);
        drop(st);
        let facts = Facts::read(capture.context.device);
        let burst = BurstInfo {
            failures: 1,
            resolution,
            last,
            repeats,
            suppressed,
            recovered_before,
        };
        let (dump, written) = assemble_and_write(s, &capture, burst, framework, facts, None);
        print_summary(&dump, &written);
        job::arm(s, &dump, &written);
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
            st.trim();
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

    /// Starts this process's writer thread unless it runs.
    pub(super) fn ensure_writer(&'static self, s: &'static dyn Recorder, st: &mut State) {
        let pid = std::process::id();
        if st.writer_pid == pid {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("oomshim-writer".into())
            .spawn(move || {
                let _ = oomshim_host::sys::guarded(|| self.writer_loop(s));
                // The loop ends only by a panic (the shim is pass-through now): the exit flush
                // writes what is still queued itself rather than wait for this thread.
                self.writer_gone();
            });
        if spawned.is_ok() {
            st.writer_pid = pid;
        }
        // With a writer thread or without: the exit flush waits for the first's queue, and
        // writes the queue itself when no writer thread runs in this process (`flush`).
        s.watch_exit();
    }

    /// The writer thread: reads the facts of new requests at once (NVML's view at the failure,
    /// not seconds later), writes provisional dumps where no framework will speak, and final
    /// dumps as outcomes become known.
    fn writer_loop(&self, s: &dyn Recorder) {
        loop {
            match self.next_work(s) {
                Work::Facts(id, device) => {
                    let facts = Facts::read(Some(device));
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
                Work::Remove(paths) => remove_all(&paths),
            }
        }
    }

    /// Blocks until there is something to do for the writer.
    fn next_work(&self, s: &dyn Recorder) -> Work {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            let flushing = st.flushing;
            if !st.stale.is_empty() {
                return Work::Remove(std::mem::take(&mut st.stale));
            }
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
                    s.config().settle.max(HOOKED_SETTLE)
                } else {
                    s.config().settle
                };
                if let Some(until) = r.hold_until(s.config().settle) {
                    // Recovered: a failure on its device within the hold tells its story.
                    if !flushing && now < until {
                        wait = wait.min(until - now);
                        continue;
                    }
                    return Work::Write {
                        id: r.id,
                        provisional: false,
                    };
                }
                let deadline = r.started + settle;
                if !r.is_open() || flushing || now >= deadline {
                    return Work::Write {
                        id: r.id,
                        provisional: false,
                    };
                }
                // A provisional dump at once, framework hook or not: a process killed before
                // the outcome is known (SIGKILL while torch empties its cache) keeps it.
                if matches!(
                    r.stage,
                    Stage::Open {
                        provisional: false,
                        ..
                    }
                ) {
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
    fn write_request(&self, s: &dyn Recorder, id: u64, provisional: bool) {
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
        r.provisional_writing = provisional;
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
        let burst = BurstInfo {
            failures: r.failures,
            resolution,
            last: r.last.clone(),
            repeats: r.repeats,
            suppressed: r.suppressed,
            recovered_before: r.recovered_before,
        };
        let framework = r.framework.clone();
        let existing = r.path.clone();
        let writing = self.start_writing(&mut st);
        drop(st);

        // The facts were read when the failure reached the writer; without them (the exit
        // flush on a thread of its own) they are read now, as for any dump.
        let facts = match job.facts.clone() {
            Some(f) => f.with_current_uuids(),
            None => Facts::read(job.capture.context.device),
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
        // A provisional dump's answer too: a process that ends by `_exit` before the outcome is
        // known has only that one (the exit flush of a normal exit replaces it with the final).
        job::arm(s, &dump, &written);
        let mut st = self.lock();
        writing.done(&mut st);
        let mut path = None;
        if let Some(r) = st.requests.iter_mut().find(|r| r.id == id) {
            r.provisional_writing = false;
            if provisional && r.is_done() {
                // A later failure's story took it in while this was written: no dump of its own.
                if let Ok(w) = &written {
                    let _ = std::fs::remove_file(&w.path);
                }
            } else {
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
        }
        if let Some(d) = st.dumped.iter_mut().find(|d| d.request == id) {
            d.path = path;
        }
        self.changed.notify_all();
    }

    /// Ends every settle wait now and waits (at most `limit`) for pending dumps to be written;
    /// says once when failures after the last dump got none.
    pub(crate) fn flush(&self, s: Option<&dyn Recorder>, limit: Duration) {
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
                let wrote = s.is_some_and(|s| self.write_all_here(s));
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
        remove_all(&std::mem::take(&mut st.stale));
        let (repeats, suppressed, recovered) = (st.repeats, st.suppressed, st.recovered_quiet);
        if (repeats > 0 || suppressed > 0 || recovered > 0) && !st.said_at_exit {
            st.said_at_exit = true;
            drop(st);
            say_without_dumps(repeats, suppressed, recovered);
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

    /// The exit flush's own writing when no writer thread exists.
    fn write_all_here(&self, s: &dyn Recorder) -> bool {
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

enum Work {
    Facts(u64, i32),
    Write {
        id: u64,
        provisional: bool,
    },
    /// Provisional dumps of requests that ended without one of their own.
    Remove(Vec<std::path::PathBuf>),
}

fn remove_all(paths: &[std::path::PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// Assembles the dump of a failed request from its capture and `facts` (read at the failure)
/// and writes it: over `existing` (this process's provisional dump of it) when given, else as
/// a new dump.
fn assemble_and_write(
    s: &dyn Recorder,
    capture: &Capture,
    burst: BurstInfo,
    framework: Option<&FrameworkNote>,
    facts: Facts,
    existing: Option<&std::path::Path>,
) -> (Dump, Result<Written, WriteError>) {
    let dump =
        crate::failure::gather::assemble_now(s, "oom", capture, Some(burst), framework, facts);
    let written = match existing {
        Some(path) => rewrite(path, &dump),
        None => write(s, &dump),
    };
    (dump, written)
}

/// Serialises and writes a new dump; a fallback directory is announced once.
pub(crate) fn write(s: &dyn Recorder, dump: &Dump) -> Result<Written, WriteError> {
    static FALLBACK_SAID: AtomicBool = AtomicBool::new(false);
    let bytes = serde_json::to_vec_pretty(dump).map_err(|e| WriteError {
        message: e.to_string(),
    })?;
    let name = DumpName {
        host: dump.process.host.clone(),
        pid: dump.process.pid,
        rank: dump.process.rank,
    };
    let written = write_dump(&s.config().dir, &name, &bytes)?;
    crate::publish::note_dump(dump, &written.path);
    if let Some(why) = &written.fell_back {
        if !FALLBACK_SAID.swap(true, Ordering::Relaxed) {
            oomshim_host::say!(
                "oomshim: {why}; writing dumps to {} instead",
                dump::units::clean_path(written.path.parent().unwrap_or(&written.path))
            );
        }
    }
    Ok(written)
}

/// Replaces this process's provisional dump at `path` with `dump`, and the headline the live
/// summary shows with its own.
fn rewrite(path: &std::path::Path, dump: &Dump) -> Result<Written, WriteError> {
    let bytes = serde_json::to_vec_pretty(dump).map_err(|e| WriteError {
        message: e.to_string(),
    })?;
    dump::write::rewrite_dump(path, &bytes)?;
    crate::publish::note_dump(dump, path);
    Ok(Written {
        path: path.to_path_buf(),
        fell_back: None,
    })
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
        t.flush(None, Duration::from_secs(20));
        assert!(started.elapsed() < Duration::from_secs(5));

        // A dump still being written is waited for, up to the limit, and released by `done`.
        let mut st = t.lock();
        let writing = t.start_writing(&mut st);
        drop(st);
        let started = Instant::now();
        t.flush(None, Duration::from_millis(200));
        assert!(started.elapsed() >= Duration::from_millis(200));
        let mut st = t.lock();
        writing.done(&mut st);
        assert_eq!(st.writing, 0);
    }
}
