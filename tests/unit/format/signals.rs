//! Unit tests of `dump::signals` (src/format/signals.rs).

use dump::signals::*;

#[test]
fn a_signal_raised_inside_is_consumed_and_the_mask_restored() {
    // SAFETY: reads this thread's mask into a local set (all zeroes valid).
    let mask = || unsafe {
        let mut m: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m);
        libc::sigismember(&m, libc::SIGPIPE) == 1
    };
    let before = mask();
    // A write to a pipe without a reader raises SIGPIPE on this thread: held, then consumed.
    let mut fds = [0; 2];
    // SAFETY: `pipe` writes two descriptors into the two-slot array.
    let piped = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(piped, 0);
    // SAFETY: the test's own read end, closed once.
    unsafe { libc::close(fds[0]) };
    // SAFETY: writes one byte of a static string to the test's own write end.
    let rc = with_signal_held(libc::SIGPIPE, || unsafe {
        libc::write(fds[1], b"x".as_ptr().cast(), 1)
    });
    let err = std::io::Error::last_os_error();
    // SAFETY: the test's own write end, closed once.
    unsafe { libc::close(fds[1]) };
    assert_eq!(rc, -1);
    assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
    assert_eq!(mask(), before, "mask restored");
    // SAFETY: reads this thread's pending set into a local set (all zeroes valid).
    let pending = unsafe {
        let mut p: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut p);
        libc::sigismember(&p, libc::SIGPIPE) == 1
    };
    assert!(!pending, "consumed");
}
