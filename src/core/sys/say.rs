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
//! - **Terminal controls.** Messages carry strings from outside (a dump reason the program
//!   passed, paths from the environment): control characters other than the newline are
//!   shown escaped, and a message is cut at [`MAX_MESSAGE_BYTES`].

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Longest message written, in bytes (the OOM summary is two lines of a few hundred).
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Prints `text` on stderr as described in the module documentation, adding the final newline.
pub fn say(text: &str) {
    let Some(fd) = stderr_if_unchanged() else {
        return;
    };
    let line = prepare(text);
    dump::signals::with_signal_held(libc::SIGPIPE, || write_all(fd, line.as_bytes()));
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
