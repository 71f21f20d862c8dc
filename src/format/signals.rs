//! Holding off a signal that one of the shim's own writes could raise in the host program
//! (`SIGXFSZ` from a dump under `RLIMIT_FSIZE`, `SIGPIPE` from a message to a stderr pipe whose
//! reader is gone): the write then fails with `EFBIG`/`EPIPE` instead of killing the program.

/// Runs `f` with `signo` blocked on the calling thread. If `f` raised it (it was not pending
/// before and is pending after), that one occurrence is consumed with a zero-timeout
/// `sigtimedwait`, so it never reaches the program; one that was already pending is left alone.
/// The thread's signal mask is restored either way. Both signals are raised synchronously on
/// the writing thread, so blocking this thread alone is enough.
pub fn with_signal_held<R>(signo: libc::c_int, f: impl FnOnce() -> R) -> R {
    // SAFETY: the signal sets are plain data (all zeroes valid, then initialised by
    // sigemptyset) on this frame; the calls change only this thread's mask and pending set,
    // and the mask is put back before returning (`f` runs safe code).
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, signo);
        let blocked = libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old) == 0;
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut before);
        let was_pending = libc::sigismember(&before, signo) == 1;
        let r = f();
        if blocked {
            let mut after: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut after);
            if !was_pending && libc::sigismember(&after, signo) == 1 {
                let zero = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                libc::sigtimedwait(&block, std::ptr::null_mut(), &zero);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        r
    }
}
