//! The out-of-memory path. The first failure on a device captures the ledger at once (the most
//! telling moment) and hands it to a writer thread; failures that follow within
//! `OOMSHIM_MIN_INTERVAL` join that burst. The writer waits up to `OOMSHIM_SETTLE` to learn
//! whether the framework's retry succeeded (PyTorch frees its cache and retries), then writes
//! the dump and the stderr summary: loud when the failure stood, one quiet line when it was
//! recovered. At exit, a waiting dump is written at once.

use super::assemble::{self, Capture, Failing};
use super::{unix_ms, Shim};
use crate::dump::model::{Dump, LastFailure};
use crate::dump::write::{write_dump, DumpName, WriteError, Written};
use crate::ledger::{Api, StackId, MAX_DEVICES};
use crate::report::units::{human_bytes, thousands};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// What the hook saw when an allocation failed.
pub struct OomEvent {
    pub api: Api,
    pub bytes: u64,
    pub device: i32,
    pub error_code: i32,
    /// (free, total) from the runtime, asked on the failing thread right after the failure.
    pub mem_info: Option<(u64, u64)>,
    pub device_name: Option<String>,
    pub stream: usize,
}

struct Burst {
    started: Instant,
    request_bytes: u64,
    failures: u32,
    recovered: bool,
    last: LastFailure,
    written: bool,
}

#[derive(Default)]
struct State {
    bursts: Vec<Option<Burst>>,
    flushing: bool,
    jobs_in_flight: u32,
}

struct Job {
    slot: usize,
    capture: Capture,
    started: Instant,
}

pub(crate) struct OomTracker {
    /// Per device: a written-or-not burst still wants to hear of a successful retry. Read on
    /// every allocation, so it is an atomic and the lock is taken only when it is set.
    pending: Box<[AtomicBool]>,
    state: Mutex<State>,
    changed: Condvar,
    /// The writer thread's queue and the pid that started it (a forked child starts its own).
    writer: Mutex<Option<(u32, Sender<Job>)>>,
}

fn slot(device: i32) -> usize {
    (device.max(0) as usize).min(MAX_DEVICES - 1)
}

impl OomTracker {
    pub(crate) fn new() -> Self {
        // At shim start, once: from here on a `fork` cannot copy a lock of the shim's own into
        // the child while another thread holds it (see `before_fork`).
        crate::ffi::register_fork_handlers(before_fork, after_fork_in_parent, after_fork_in_child);
        OomTracker {
            pending: (0..MAX_DEVICES).map(|_| AtomicBool::new(false)).collect(),
            state: Mutex::new(State {
                bursts: (0..MAX_DEVICES).map(|_| None).collect(),
                ..State::default()
            }),
            changed: Condvar::new(),
            writer: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn on_failure(&self, s: &'static Shim, ev: OomEvent, stacks: (StackId, StackId)) {
        let now = Instant::now();
        let slot = slot(ev.device);
        let last = last_failure(s, &ev, SystemTime::now());
        {
            let mut st = self.lock();
            if let Some(b) = st.bursts[slot].as_mut() {
                if now.duration_since(b.started) < s.config.min_interval {
                    b.failures += 1;
                    b.last = last;
                    tracing::debug!(
                        device = ev.device,
                        failures = b.failures,
                        "failure joins burst"
                    );
                    return;
                }
            }
            st.bursts[slot] = Some(Burst {
                started: now,
                request_bytes: ev.bytes,
                failures: 1,
                recovered: false,
                last,
                written: false,
            });
            st.jobs_in_flight += 1;
        }
        if !super::room_for_dump(s) {
            let mut st = self.lock();
            st.jobs_in_flight = st.jobs_in_flight.saturating_sub(1);
            self.changed.notify_all();
            return;
        }
        self.pending[slot].store(true, Ordering::Release);
        let capture = failure_capture(s, &ev, stacks);
        self.submit(
            s,
            Job {
                slot,
                capture,
                started: now,
            },
        );
    }

    /// A successful device allocation: recovers a waiting burst when it is at least as large as
    /// the request that failed (the framework's retry).
    pub(crate) fn note_success(&self, device: i32, bytes: u64) {
        let slot = slot(device);
        if !self.pending[slot].load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.lock();
        if let Some(b) = st.bursts[slot].as_mut() {
            if !b.written && bytes >= b.request_bytes {
                b.recovered = true;
                self.pending[slot].store(false, Ordering::Relaxed);
                self.changed.notify_all();
            }
        }
    }

    fn submit(&self, s: &'static Shim, job: Job) {
        // After the exit flush the writer thread may never run again (the process is ending):
        // write on this thread rather than lose the dump.
        if self.lock().flushing {
            self.finish(s, job);
            return;
        }
        let pid = std::process::id();
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if writer.as_ref().map(|(p, _)| *p) != Some(pid) {
            let (tx, rx) = channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("oomshim-writer".into())
                .spawn(move || {
                    for job in rx {
                        s.oom.finish(s, job);
                    }
                });
            *writer = match spawned {
                Ok(_) => {
                    crate::ffi::flush_dumps_at_exit();
                    Some((pid, tx))
                }
                Err(_) => None,
            };
        }
        let job = match writer.as_ref() {
            Some((_, tx)) => match tx.send(job) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => job,
        };
        drop(writer);
        // No writer thread could be had: write on this thread rather than lose the dump.
        self.finish(s, job);
    }

    /// Waits for the burst to settle, then writes the dump and the summary.
    fn finish(&self, s: &Shim, job: Job) {
        let deadline = job.started + s.config.settle;
        let mut st = self.lock();
        loop {
            let b = st.bursts[job.slot].as_ref();
            let now = Instant::now();
            if st.flushing || now >= deadline || b.is_none_or(|b| b.recovered) {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        // With no settle window the outcome is unknown when the dump is written, not "stood".
        let settled = st.flushing || (!s.config.settle.is_zero() && Instant::now() >= deadline);
        let burst = st.bursts[job.slot].as_mut().map(|b| {
            b.written = true;
            let recovered = if b.recovered {
                Some(true)
            } else if settled {
                Some(false)
            } else {
                None
            };
            assemble::BurstInfo {
                failures: b.failures,
                recovered,
                last: b.last.clone(),
            }
        });
        self.pending[job.slot].store(false, Ordering::Relaxed);
        drop(st);

        let dump = assemble::assemble(s, "oom", &job.capture, burst);
        let written = write(s, &dump);
        print_summary(&dump, &written);

        let mut st = self.lock();
        st.jobs_in_flight = st.jobs_in_flight.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Ends every settle wait now and waits (at most `limit`) for pending dumps to be written.
    pub(crate) fn flush(&self, limit: Duration) {
        let until = Instant::now() + limit;
        let mut st = self.lock();
        st.flushing = true;
        self.changed.notify_all();
        while st.jobs_in_flight > 0 {
            let now = Instant::now();
            if now >= until {
                eprintln!("oomshim: gave up waiting for a dump to be written at exit");
                return;
            }
            st = self
                .changed
                .wait_timeout(st, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// The ledger and the device as they are at a failure, for its dump: taken on the failing
/// thread, at once (the most telling moment).
pub(super) fn failure_capture(s: &Shim, ev: &OomEvent, stacks: (StackId, StackId)) -> Capture {
    Capture {
        snapshot: s.ledger.snapshot(),
        time: SystemTime::now(),
        now_ns: s.now_ns(),
        device: Some(ev.device),
        mem_info: ev.mem_info,
        device_name: ev.device_name.clone(),
        failing: Some(Failing {
            api: ev.api,
            bytes: ev.bytes,
            device: ev.device,
            error_code: ev.error_code,
            stack: stacks.0,
            py_stack: stacks.1,
        }),
    }
}

/// The dump's `last_failure` for `ev`, seen at `time`.
pub(super) fn last_failure(s: &Shim, ev: &OomEvent, time: SystemTime) -> LastFailure {
    LastFailure {
        bytes: ev.bytes,
        api: ev.api.name().to_string(),
        time_unix_ms: unix_ms(time),
        tracked_bytes: s.ledger.device_bytes(ev.device),
        free_bytes: ev.mem_info.map(|m| m.0),
        total_bytes: ev.mem_info.map(|m| m.1),
    }
}

type WriterSlot = Option<(u32, Sender<Job>)>;

thread_local! {
    /// The OOM tracker's locks, held by the forking thread from `before_fork` to the matching
    /// after-fork handler (the child's only thread is that same thread, with the same slot).
    static FORK_HELD: std::cell::RefCell<Option<(MutexGuard<'static, WriterSlot>, MutexGuard<'static, State>)>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare, in the forking thread: takes every lock a hook or the writer takes
/// (the OOM tracker's, the ledger's and both stack tables' shards), so the child never starts
/// with a lock that a thread absent from it holds. No path holds one of these while waiting for
/// another, so taking them all cannot deadlock.
fn before_fork() {
    let Some(s) = super::SHIM.get() else {
        return;
    };
    let writer = s.oom.writer.lock().unwrap_or_else(|e| e.into_inner());
    let state = s.oom.lock();
    s.stacks.before_fork();
    s.py_stacks.before_fork();
    s.ledger.before_fork();
    let _ = FORK_HELD.try_with(|h| *h.borrow_mut() = Some((writer, state)));
}

fn after_fork(child: bool) {
    let Some(s) = super::SHIM.get() else {
        return;
    };
    s.ledger.after_fork();
    s.py_stacks.after_fork();
    s.stacks.after_fork();
    let held = FORK_HELD.try_with(|h| h.borrow_mut().take()).ok().flatten();
    let Some((mut writer, mut state)) = held else {
        return;
    };
    if child {
        // The child has no writer thread and none of the parent's jobs: start afresh. The
        // parent's queue is leaked, not dropped (its receiver lives in a thread that is gone).
        if let Some(old) = writer.take() {
            std::mem::forget(old);
        }
        let fresh = State {
            bursts: (0..MAX_DEVICES).map(|_| None).collect(),
            ..State::default()
        };
        std::mem::forget(std::mem::replace(&mut *state, fresh));
        for p in s.oom.pending.iter() {
            p.store(false, Ordering::Relaxed);
        }
    }
    drop(state);
    drop(writer);
}

fn after_fork_in_parent() {
    after_fork(false);
}

fn after_fork_in_child() {
    after_fork(true);
}

/// Serialises and writes a dump; a fallback directory is announced once.
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
    if let Some(why) = &written.fell_back {
        if !FALLBACK_SAID.swap(true, Ordering::Relaxed) {
            eprintln!(
                "oomshim: {why}; writing dumps to {} instead",
                written.path.parent().unwrap_or(&written.path).display()
            );
        }
    }
    Ok(written)
}

pub(super) fn print_summary(dump: &Dump, written: &Result<Written, WriteError>) {
    if let Some(text) = summary_lines(dump, written) {
        eprintln!("{text}");
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
            "oomshim: {} of {} on device {} failed, then a retry succeeded (recovered); {where_}",
            req.api,
            human_bytes(req.bytes),
            req.device
        ));
    }
    let burst = if req.failures_in_burst > 1 {
        format!(
            "; {} failures in this burst",
            thousands(req.failures_in_burst.into())
        )
    } else {
        String::new()
    };
    let finding = match dump.verdict.findings.first() {
        Some(f) => format!("{}: {}", f.kind, f.headline),
        None => dump.verdict.kind.clone(),
    };
    let mut out = format!(
        "oomshim: CUDA out of memory on device {} ({} of {} failed{burst}): {finding}\n",
        req.device,
        req.api,
        human_bytes(req.bytes)
    );
    out.push_str(&format!("oomshim:   {where_}"));
    if let Ok(w) = written {
        out.push_str(&format!("  (details: oomshim report {})", w.path.display()));
    }
    Some(out)
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use crate::verdict::tests::oom_dump;

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
        d.verdict = crate::verdict::judge(&d);
        let text = summary_lines(&d, &written()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            "oomshim: CUDA out of memory on device 0 (cudaMalloc of 2.00 GiB failed; 3 failures in this burst): \
             own_allocations: this process's own allocations fill device 0: 78.00 GiB of the 79.00 GiB in use; \
             largest: 39.00 GiB (×5) at forward (model.py:42)"
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
    }

    #[test]
    fn a_recovered_failure_is_one_quiet_line() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().recovered = Some(true);
        d.verdict = crate::verdict::judge(&d);
        let text = summary_lines(&d, &written()).unwrap();
        assert_eq!(
            text,
            "oomshim: cudaMalloc of 2.00 GiB on device 0 failed, then a retry succeeded (recovered); \
             dump: /tmp/d/oomshim-h-1-1.json"
        );
        d.failed_request = None;
        assert!(summary_lines(&d, &written()).is_none());
    }
}
