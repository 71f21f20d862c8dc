//! A descriptor the shim keeps open inside the host program for a long time. The program owns
//! the descriptor table: it may close every descriptor it did not open (`closefrom(3)`, as
//! daemons and job runners do) and then open files that get the same numbers. A descriptor of
//! the shim's is therefore moved out of the low range the program's own files use
//! (`F_DUPFD_CLOEXEC` at or above [`FLOOR`]), and its identity (`st_dev`, `st_ino`) is checked
//! with `fstat` before each use: a number that now names another file is never read from or
//! written to, and never closed. (The dump signal needs no descriptor at all: see
//! `ffi::wait_for_dump_signal`.)

use std::os::fd::{IntoRawFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Lowest number a kept descriptor is moved to, where `RLIMIT_NOFILE` allows (then lower
/// floors are tried, down to keeping the number it had).
pub const FLOOR: RawFd = 512;

/// Moves `fd` to a number at or above [`FLOOR`] (close-on-exec) and closes the old one; keeps
/// the number when there is no room up there.
pub fn move_high(fd: RawFd) -> RawFd {
    let moved = [FLOOR, 256, 64]
        .into_iter()
        // SAFETY: `F_DUPFD_CLOEXEC` takes an int and only creates a descriptor; a bad `fd` is an
        // error return.
        .map(|floor| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) })
        .find(|&n| n >= 0);
    match moved {
        Some(high) => {
            // SAFETY: `fd` is the caller's to give up (it hands it over), and its duplicate
            // `high` now stands for it.
            unsafe { libc::close(fd) };
            high
        }
        None => fd,
    }
}

/// A file whose descriptor is moved out of the program's low range at once (see [`move_high`]).
pub fn high_file(file: std::fs::File) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor is ours (just taken from `file`), and owned by the new File alone.
    unsafe { std::fs::File::from_raw_fd(move_high(file.into_raw_fd())) }
}

pub struct OwnFd {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl OwnFd {
    pub const fn new() -> OwnFd {
        OwnFd {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    /// Takes `file` over: its descriptor is moved to a high number (close-on-exec) and its
    /// identity noted. Call once, before any [`OwnFd::get`].
    pub fn adopt(&self, file: std::fs::File) {
        let fd = move_high(file.into_raw_fd());
        // SAFETY: `stat` is plain integers, for which all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fstat` writes only the `stat` it is given, a valid local.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            // SAFETY: `fd` is ours (taken from `file`), and nothing else holds it.
            unsafe { libc::close(fd) };
            return;
        }
        self.dev.store(st.st_dev, Ordering::Relaxed);
        self.ino.store(st.st_ino, Ordering::Relaxed);
        self.fd.store(fd, Ordering::Release);
    }

    /// The descriptor, if it still names the file adopted (one `fstat`; async-signal-safe).
    pub fn get(&self) -> Option<RawFd> {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            return None;
        }
        // SAFETY: `stat` is plain integers, for which all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fstat` writes only the `stat` it is given; a number that was closed or
        // reused is an error or another identity, never a fault.
        let same = unsafe { libc::fstat(fd, &mut st) } == 0
            && st.st_dev == self.dev.load(Ordering::Relaxed)
            && st.st_ino == self.ino.load(Ordering::Relaxed);
        same.then_some(fd)
    }
}

impl Default for OwnFd {
    fn default() -> Self {
        OwnFd::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_high_and_never_used_once_the_number_names_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ours");
        std::fs::write(&ours, b"x").unwrap();
        let own = OwnFd::new();
        own.adopt(std::fs::File::open(&ours).unwrap());
        let fd = own.get().expect("adopted");
        assert!(fd >= 64, "moved above the low range: {fd}");
        // SAFETY: `F_GETFD` only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        // The program closes it and a file of its own gets the number.
        // SAFETY: the test closes the number behind `own`'s back, as a program may.
        unsafe { libc::close(fd) };
        assert_eq!(own.get(), None, "closed");
        let theirs = std::fs::File::create(dir.path().join("theirs")).unwrap();
        let n = theirs.into_raw_fd();
        // SAFETY: `n` is the test's own open descriptor; `fd` is free (closed above).
        let dup = unsafe { libc::dup2(n, fd) };
        assert_eq!(dup, fd);
        assert_eq!(own.get(), None, "the number now names the program's file");
        // SAFETY: both are the test's own descriptors, closed once.
        unsafe {
            libc::close(n);
            libc::close(fd);
        }
    }
}
