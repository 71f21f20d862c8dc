//! The shim's own messages on the host program's stderr. Every message the shim prints goes
//! through here, never through `eprintln!`:
//!
//! - `say!("oomshim: … {x}")` takes `eprintln!`'s arguments (format string and values) and
//!   ends the line; `say(text)` prints text that is already formatted (lines separated by
//!   `\n`; one final newline is added). To switch a file over, replace `eprintln!` by
//!   `crate::say!`.
//!
//! What a message is spared from, and why:
//!
//! - **Someone else's file at fd 2.** A program may close its stderr and open a file, which
//!   then gets descriptor 2: a message written to "stderr" would land in the program's own
//!   file. The identity of fd 2 (`st_dev`, `st_ino`) is recorded when the shim is loaded (an
//!   `fstat` in its constructor, before the program's `main`) and checked with `fstat` before
//!   every write; when it differs, or fd 2 was closed at load time, nothing is written. (A
//!   program that deliberately points fd 2 at a log file after start-up therefore does not
//!   get the shim's messages there either; the dumps are written all the same.)
//! - **SIGPIPE.** When fd 2 is a pipe whose reader has gone (a dead log collector), a write
//!   raises SIGPIPE, whose default action kills the host program. SIGPIPE is blocked on the
//!   writing thread around the write, and the one the write raised is consumed
//!   (`dump::signals::with_signal_held`): the write fails with `EPIPE` and the program goes on.
//! - **A descriptor table of its own.** A shim thread that works in a private copy of the
//!   descriptor table (the live summary's publisher) holds no copy of fd 2: a copy would keep
//!   the program's stderr open after the program closed it, and its reader would never see the
//!   end. Such a thread calls [`on_a_table_of_its_own`]; its messages then borrow the program's
//!   fd 2 for the one write (`pidfd_getfd`, else reopening `/proc/self/fd/2`), checked against
//!   the identity noted at load like any other, and close it again. Where neither works (an old
//!   kernel, a socket under a seccomp filter) the message is not written.
//! - **Terminal controls.** Messages carry strings from outside (a dump reason the program
//!   passed, paths from the environment): control characters other than the newline are
//!   shown escaped, and a message is cut at [`MAX_MESSAGE_BYTES`].

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Longest message written, in bytes (the OOM summary is two lines of a few hundred).
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Prints `text` on stderr as described in the module documentation, adding the final newline.
pub fn say(text: &str) {
    if OWN_TABLE.with(Cell::get) {
        let Some(fd) = borrowed_stderr_if_unchanged() else {
            return;
        };
        let line = prepare(text);
        dump::signals::with_signal_held(libc::SIGPIPE, || write_all(fd, line.as_bytes()));
        // SAFETY: `fd` was opened above, in this thread's own table, and is closed once.
        unsafe { libc::close(fd) };
        return;
    }
    let Some(fd) = stderr_if_unchanged() else {
        return;
    };
    let line = prepare(text);
    dump::signals::with_signal_held(libc::SIGPIPE, || write_all(fd, line.as_bytes()));
}

thread_local! {
    /// This thread works in a descriptor table of its own, without the program's fd 2.
    static OWN_TABLE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one that has a descriptor table of its own (after
/// `unshare(CLONE_FILES)`) and has closed its copy of fd 2: its messages borrow the program's.
pub fn on_a_table_of_its_own() {
    OWN_TABLE.with(|own| own.set(true));
}

/// A descriptor of this thread's own for the program's fd 2, when that is still the file it
/// was at load time; the caller closes it.
fn borrowed_stderr_if_unchanged() -> Option<libc::c_int> {
    if STATE.load(Ordering::Acquire) != OPEN {
        return None;
    }
    let fd = program_stderr_copy()?;
    // SAFETY: `stat` is plain integers, for which all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fstat` writes only the `stat` it is given.
    let same = unsafe { libc::fstat(fd, &mut st) } == 0
        && (st.st_dev, st.st_ino) == (DEV.load(Ordering::Relaxed), INO.load(Ordering::Relaxed));
    if same {
        Some(fd)
    } else {
        // SAFETY: `fd` is ours, opened by `program_stderr_copy`.
        unsafe { libc::close(fd) };
        None
    }
}

/// A copy of the process's fd 2 (in the table the program uses) opened in this thread's table:
/// `pidfd_getfd` duplicates it whatever it is; where that is refused, `/proc/self/fd/2` (the
/// thread group leader's table) is reopened for writing, which serves files, pipes and
/// terminals but not sockets.
fn program_stderr_copy() -> Option<libc::c_int> {
    // SAFETY: pidfd_open and pidfd_getfd take integers and return a new descriptor or -1.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0u32);
        if pidfd >= 0 {
            let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd as libc::c_int, 2i32, 0u32);
            libc::close(pidfd as libc::c_int);
            if fd >= 0 {
                let fd = fd as libc::c_int;
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                return Some(fd);
            }
        }
        let fd = libc::open(
            c"/proc/self/fd/2".as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOCTTY,
        );
        (fd >= 0).then_some(fd)
    }
}

/// `eprintln!` for the shim: `say!("oomshim: {what}")` formats and prints one message through
/// [`say`].
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::sys::say::say(&::std::format!($($arg)*))
    };
}

/// Where fd 2 stood when the shim was loaded.
const NOT_NOTED: u8 = 0;
const OPEN: u8 = 1;
const CLOSED: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(NOT_NOTED);
static DEV: AtomicU64 = AtomicU64::new(0);
static INO: AtomicU64 = AtomicU64::new(0);

/// `(st_dev, st_ino)` of fd 2 now, `None` when it is closed.
fn fd2_identity() -> Option<(u64, u64)> {
    // SAFETY: `stat` is plain integers, for which all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fstat` writes only the `stat` it is given; a closed fd 2 is an error return.
    (unsafe { libc::fstat(2, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Notes fd 2's identity. Called once from the shim's load-time constructor (one `fstat`, no
/// allocation), before the program can have touched its descriptors.
pub fn note_stderr_at_load() {
    match fd2_identity() {
        Some((dev, ino)) => {
            DEV.store(dev, Ordering::Relaxed);
            INO.store(ino, Ordering::Relaxed);
            STATE.store(OPEN, Ordering::Release);
        }
        None => STATE.store(CLOSED, Ordering::Release),
    }
}

/// fd 2, when it is still the file it was at load time.
fn stderr_if_unchanged() -> Option<libc::c_int> {
    if STATE.load(Ordering::Acquire) == NOT_NOTED {
        // Only where the constructor did not run (the rlib inside a test binary): now is
        // the best there is.
        note_stderr_at_load();
    }
    if STATE.load(Ordering::Acquire) != OPEN {
        return None;
    }
    let now = fd2_identity()?;
    (now == (DEV.load(Ordering::Relaxed), INO.load(Ordering::Relaxed))).then_some(2)
}

/// The message as written: control characters other than `\n` escaped, at most
/// [`MAX_MESSAGE_BYTES`] (cut at a character boundary, saying so), one final newline.
fn prepare(text: &str) -> String {
    let text = text.strip_suffix('\n').unwrap_or(text);
    // Only the head can be shown: clean no more than that (a reason may be megabytes).
    let mut end = text.len().min(MAX_MESSAGE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = text[..end]
        .split('\n')
        .map(dump::units::clean)
        .collect::<Vec<_>>()
        .join("\n");
    let note = format!("… (cut: {} bytes in all)", text.len());
    if end < text.len() || out.len() > MAX_MESSAGE_BYTES {
        let mut cut = MAX_MESSAGE_BYTES
            .saturating_sub(note.len() + 1)
            .min(out.len());
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str(&note);
    }
    out.push('\n');
    out
}

/// `write(2)` until all is written or it fails (EINTR retried); errors are dropped: there is
/// nowhere left to report them.
fn write_all(fd: libc::c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `write` reads `bytes.len()` bytes of a live slice; a bad `fd` is an error.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_clean_bounded_text_with_one_newline() {
        assert_eq!(prepare("oomshim: a"), "oomshim: a\n");
        assert_eq!(prepare("oomshim: a\n"), "oomshim: a\n");
        assert_eq!(
            prepare("oomshim: a\noomshim: b"),
            "oomshim: a\noomshim: b\n",
            "the lines of a summary stay lines"
        );
        assert_eq!(prepare("x\x1b[2J\ry"), "x\\u{1b}[2J\\ry\n");
        let huge = format!("oomshim: {}", "é".repeat(5_000_000));
        let out = prepare(&huge);
        assert!(out.len() <= MAX_MESSAGE_BYTES, "{}", out.len());
        assert!(
            out.ends_with("bytes in all)\n"),
            "{}",
            &out[out.len() - 60..]
        );
        let many_lines = "\x07\n".repeat(1_000_000);
        assert!(prepare(&many_lines).len() <= MAX_MESSAGE_BYTES);
    }
}
