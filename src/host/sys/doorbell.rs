//! The live summary's doorbell: a thread of the host program (the allocation path, the
//! out-of-memory path) says "something changed" and the publisher thread wakes. Ringing takes no
//! lock (a forked child, or a thread interrupted by a signal, can never wait on one) and makes a
//! system call only when the bell was not already ringing; waiting is a futex wait with a
//! timeout. One bell per process: there is one publisher.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static RUNG: AtomicU32 = AtomicU32::new(0);

/// Rings the bell: the waiting publisher wakes. Cheap once rung (one atomic swap) until the
/// publisher takes the ring ([`wait`]). Async-signal-safe.
#[cold]
#[inline(never)]
pub fn ring() {
    if RUNG.swap(1, Ordering::Release) == 0 {
        // SAFETY: a futex wake on a static word; wakes at most one waiter, touches nothing else.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                RUNG.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
    }
}

/// Waits up to `timeout` (`None`: without end) for a ring; true when one came (taken now: the
/// next wait waits for a new one). A ring before the wait is not lost.
pub fn wait(timeout: Option<Duration>) -> bool {
    if RUNG.swap(0, Ordering::Acquire) == 1 {
        return true;
    }
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a futex wait on a static word while it is 0, with a relative timeout on the stack
    // (or none); it returns on a wake, a timeout, a signal or a changed word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            RUNG.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0,
            ts_ptr,
        )
    };
    RUNG.swap(0, Ordering::Acquire) == 1
}

/// Whether a ring waits to be taken (the next [`wait`] returns at once).
pub fn pending() -> bool {
    RUNG.load(Ordering::Relaxed) == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_wakes_a_waiter_and_none_is_lost() {
        // Taken before anything else in this process's tests uses the bell.
        let _ = wait(Some(Duration::ZERO));
        ring();
        assert!(pending());
        assert!(wait(Some(Duration::from_secs(5))), "a ring before the wait");
        assert!(
            !wait(Some(Duration::from_millis(20))),
            "taken: no second wake"
        );
        let waiter = std::thread::spawn(|| {
            let t = std::time::Instant::now();
            (wait(Some(Duration::from_secs(30))), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        ring();
        let (woke, after) = waiter.join().unwrap();
        assert!(woke && after < Duration::from_secs(20), "{after:?}");
    }
}
