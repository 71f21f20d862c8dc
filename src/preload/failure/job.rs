//! What an out-of-memory failure leaves for the job when it ends the process: oomshim's answer in
//! torchelastic's error file and in Kubernetes' termination message (src/core/jobfiles.rs says
//! what they hold and how they are written).
//!
//! The answer is prepared when the failure's dump is written ([`arm`], beside the stderr
//! summary) and committed only when the process then ends with a non-zero status having made no
//! successful device allocation since the failure: the failure ended it, rather than being caught
//! and survived (a batch-size finder, a retry with less). A normal exit writes nothing.
//!
//! - `exit` ([`at_exit`], glibc's `on_exit`): the pending dumps are flushed first, then the
//!   error file is written or, when the program's `@record` wrote one for this out-of-memory
//!   error, its message gets the answer added; a file written for any other failure is never
//!   touched, and its failure then gets no termination message from oomshim either.
//! - `_exit`/`_Exit` ([`at_raw_exit`]: a signal handler, a vfork child, Python's `os._exit`):
//!   async-signal-safe system calls only, on bytes prepared at [`arm`]: the error file only
//!   when none exists (`O_EXCL`), the termination message appended within its 4096 bytes.
//!
//! A forked child never commits its parent's answer: the prepared bytes carry the pid.

use super::recorder::Recorder;
use dump::model::Dump;
use dump::write::{WriteError, Written};
use oomshim_core::jobfiles::{self, Answer, Targets, TERMINATION_MAX, TERMINATION_MIN_ROOM};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Room for the prepared error file (its JSON) and each path.
const ERROR_JSON_MAX: usize = 16 << 10;
const PATH_MAX: usize = 4096;

const EMPTY: u8 = 0;
const WRITING: u8 = 1;
const READY: u8 = 2;
const COMMITTED: u8 = 3;

/// The bytes [`at_raw_exit`] writes, prepared by [`arm`]. `state` orders the two: `arm` (one at
/// a time, under [`ARMED`]) writes only while it holds the state at [`WRITING`]; a commit reads
/// only after moving it from [`READY`] to [`COMMITTED`], after which nothing writes again.
struct Prepared {
    state: AtomicU8,
    pid: AtomicU32,
    /// The ledger's allocation count at the failure: a larger one at exit means the program
    /// allocated successfully since (it survived the failure).
    allocations: AtomicU64,
    buf: UnsafeCell<Buffers>,
}

struct Buffers {
    error_path: [u8; PATH_MAX],
    error_path_len: usize,
    error_json: [u8; ERROR_JSON_MAX],
    error_json_len: usize,
    termination_path: [u8; PATH_MAX],
    termination_path_len: usize,
    termination_create: bool,
    termination: [u8; TERMINATION_MAX],
    termination_len: usize,
}

// SAFETY: `buf` is written only by `arm` while `state` is WRITING (one armer at a time, under
// ARMED) and read only by the one commit that moved `state` from READY to COMMITTED.
unsafe impl Sync for Prepared {}

static PREPARED: Prepared = Prepared {
    state: AtomicU8::new(EMPTY),
    pid: AtomicU32::new(0),
    allocations: AtomicU64::new(0),
    buf: UnsafeCell::new(Buffers {
        error_path: [0; PATH_MAX],
        error_path_len: 0,
        error_json: [0; ERROR_JSON_MAX],
        error_json_len: 0,
        termination_path: [0; PATH_MAX],
        termination_path_len: 0,
        termination_create: false,
        termination: [0; TERMINATION_MAX],
        termination_len: 0,
    }),
};

/// The answer as [`at_exit`] needs it (it may read and merge the program's file).
struct Armed {
    pid: u32,
    answer: Answer,
    targets: Targets,
}

static ARMED: Mutex<Option<Armed>> = Mutex::new(None);

/// Prepares the answer of a failure whose dump was just written (or failed to be): committed
/// if the process ends because of it. A recovered failure, or a process with nowhere to write,
/// prepares nothing; a later failure replaces an earlier one's answer.
pub(super) fn arm(s: &dyn Recorder, dump: &Dump, written: &Result<Written, WriteError>) {
    let Some(req) = dump.failed_request.as_ref() else {
        return;
    };
    if req.recovered == Some(true) {
        return;
    }
    let targets = Targets::of(s.config(), |k| std::env::var(k).ok());
    if targets.is_empty() {
        return;
    }
    let answer = Answer::of(dump, written.as_ref().ok().map(|w| w.path.as_path()));
    s.watch_exit();
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    prepare(&answer, &targets, dump.recording.total_allocations);
    *armed = Some(Armed {
        pid: std::process::id(),
        answer,
        targets,
    });
}

/// Fills [`PREPARED`]; the caller holds [`ARMED`].
fn prepare(answer: &Answer, targets: &Targets, allocations: u64) {
    let p = &PREPARED;
    loop {
        let now = p.state.load(Ordering::Acquire);
        if now == COMMITTED {
            return; // the process is ending
        }
        if p.state
            .compare_exchange(now, WRITING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            break;
        }
    }
    // SAFETY: the state is WRITING, held by this thread alone (under ARMED); no commit reads
    // the buffers until it is READY again.
    let b = unsafe { &mut *p.buf.get() };
    let json = jobfiles::error_file_json(answer);
    b.error_path_len = targets
        .error_file
        .as_deref()
        .filter(|_| json.len() <= ERROR_JSON_MAX)
        .map_or(0, |path| {
            copy(&mut b.error_path, path.as_os_str().as_encoded_bytes())
        });
    b.error_json_len = copy(&mut b.error_json, &json);
    let message = answer.text(TERMINATION_MAX);
    b.termination_path_len = targets.termination_log.as_deref().map_or(0, |path| {
        copy(&mut b.termination_path, path.as_os_str().as_encoded_bytes())
    });
    b.termination_create = created_if_missing(targets);
    b.termination_len = copy(&mut b.termination, message.as_bytes());
    p.pid.store(std::process::id(), Ordering::Relaxed);
    p.allocations.store(allocations, Ordering::Relaxed);
    p.state.store(READY, Ordering::Release);
}

/// A termination log named by `OOMSHIM_TERMINATION_LOG` is created when missing; the default
/// one only ever exists in a pod.
fn created_if_missing(targets: &Targets) -> bool {
    targets.termination_log.as_deref()
        != Some(std::path::Path::new(
            oomshim_core::config::DEFAULT_TERMINATION_LOG,
        ))
}

/// `bytes` into `dst` with room for a NUL after them; 0 (nothing) when they do not fit.
fn copy(dst: &mut [u8], bytes: &[u8]) -> usize {
    if bytes.len() >= dst.len() || bytes.contains(&0) {
        return 0;
    }
    dst[..bytes.len()].copy_from_slice(bytes);
    dst[bytes.len()] = 0;
    bytes.len()
}

/// Whether the process ends because of the prepared failure: a non-zero status, in the process
/// that failed, with no successful device allocation since. Takes the prepared bytes for good
/// when it does.
fn take(status: i32, allocations_now: u64) -> bool {
    let p = &PREPARED;
    if status == 0 || p.pid.load(Ordering::Relaxed) != std::process::id() {
        return false;
    }
    if allocations_now != p.allocations.load(Ordering::Relaxed) {
        return false;
    }
    p.state
        .compare_exchange(READY, COMMITTED, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

/// The process exits (`exit`, its status): the answer is committed when the failure ended it.
/// `allocations_now`: the allocations recorded by then (0 without a shim); the caller flushed
/// the dumps still settling first, so the answer is the newest failure's.
pub fn at_exit(status: i32, allocations_now: u64) {
    if !take(status, allocations_now) {
        return;
    }
    let armed = ARMED.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(a) = armed.filter(|a| a.pid == std::process::id()) else {
        return;
    };
    let mut other_failure = false;
    if let Some(path) = &a.targets.error_file {
        match jobfiles::write_error_file(path, &a.answer) {
            Ok(jobfiles::ErrorFileOutcome::OtherFailure) => other_failure = true,
            Ok(_) => {}
            Err(e) => super::summary::say(&format!(
                "cannot write torchelastic's error file {}: {e}",
                path.display()
            )),
        }
    }
    if let (Some(path), false) = (&a.targets.termination_log, other_failure) {
        let create = created_if_missing(&a.targets);
        if let Err(e) = jobfiles::append_termination(path, &a.answer.text(TERMINATION_MAX), create)
        {
            super::summary::say(&format!(
                "cannot write the termination message {}: {e}",
                path.display()
            ));
        }
    }
}

/// The process ends by `_exit`/`_Exit` (maybe in a signal handler or a vfork child):
/// async-signal-safe system calls only, on the bytes [`arm`] prepared.
pub fn at_raw_exit(status: i32, allocations_now: u64) {
    if !take(status, allocations_now) {
        return;
    }
    // SAFETY: `take` moved the state to COMMITTED: nothing writes the buffers any more.
    let b = unsafe { &*PREPARED.buf.get() };
    if b.error_path_len > 0 && b.error_json_len > 0 {
        // SAFETY: a NUL-terminated path in a static buffer; `open` with O_EXCL never replaces a
        // file the program wrote.
        let fd = unsafe {
            libc::open(
                b.error_path.as_ptr().cast(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o666 as libc::c_uint,
            )
        };
        if fd >= 0 {
            write_all(fd, &b.error_json[..b.error_json_len]);
            // SAFETY: the descriptor opened above.
            unsafe { libc::close(fd) };
        }
    }
    if b.termination_path_len > 0 && b.termination_len > 0 {
        let flags = libc::O_WRONLY
            | libc::O_APPEND
            | libc::O_CLOEXEC
            | if b.termination_create {
                libc::O_CREAT
            } else {
                0
            };
        // SAFETY: a NUL-terminated path in a static buffer.
        let fd = unsafe {
            libc::open(
                b.termination_path.as_ptr().cast(),
                flags,
                0o644 as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: `fstat` into a zeroed stat of this stack frame.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: the descriptor opened above and a valid out-parameter.
            let had = if unsafe { libc::fstat(fd, &mut st) } == 0 {
                st.st_size.max(0) as usize
            } else {
                TERMINATION_MAX
            };
            let sep = usize::from(had > 0);
            let room = TERMINATION_MAX.saturating_sub(had + sep);
            let text = &b.termination[..b.termination_len];
            let fit = fit_lines(text, room.saturating_sub(1));
            if room >= TERMINATION_MIN_ROOM && !fit.is_empty() {
                if sep > 0 {
                    write_all(fd, b"\n");
                }
                write_all(fd, fit);
                write_all(fd, b"\n");
            }
            // SAFETY: the descriptor opened above.
            unsafe { libc::close(fd) };
        }
    }
}

/// [`jobfiles::fit_lines`] on bytes, without allocating.
fn fit_lines(text: &[u8], max: usize) -> &[u8] {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    // A UTF-8 continuation byte is never cut from its character.
    while end > 0 && text[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    let head = &text[..end];
    match head.iter().rposition(|&c| c == b'\n') {
        Some(i) => &head[..i],
        None => head,
    }
}

fn write_all(fd: libc::c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice of its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

#[cfg(test)]
mod tests {
    use super::fit_lines;

    #[test]
    fn raw_exits_cut_the_message_at_a_line_within_the_room_left() {
        assert_eq!(fit_lines(b"a\nbb\nccc", 100), b"a\nbb\nccc");
        assert_eq!(fit_lines(b"a\nbb\nccc", 5), b"a\nbb");
        assert_eq!(fit_lines(b"abcdef", 3), b"abc");
        assert_eq!(fit_lines("é".as_bytes(), 1), b"");
        assert_eq!(fit_lines(b"abc", 0), b"");
    }
}
