//! Process plumbing the live state registers through: `atexit` hooks and the dump signal's
//! handler and semaphore (the `pthread_atfork` handlers are in [`super::fork`]). Callers pass
//! the work as plain functions, so this module depends on nothing above it.

use super::fn_ptr::FnPtr;
use std::panic::catch_unwind;
use std::sync::OnceLock;

/// What [`flush_dumps_at_exit`] runs at exit.
static FLUSH_AT_EXIT: OnceLock<fn()> = OnceLock::new();

/// Runs at process exit (registered with `atexit` when the first dump is queued): a dump still
/// waiting to learn whether its failure was recovered is written now rather than lost.
extern "C" fn flush_at_exit() {
    if let Some(f) = FLUSH_AT_EXIT.get() {
        let _ = catch_unwind(*f);
    }
}

/// Registers `flush` to run at process exit (once per process; later calls do nothing).
pub fn flush_dumps_at_exit(flush: fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: `atexit` with a function that never unwinds (it catches panics).
    ONCE.call_once(|| unsafe {
        let _ = FLUSH_AT_EXIT.set(flush);
        libc::atexit(flush_at_exit);
    });
}

/// The semaphore the dump signal's handler posts and the shim's signal thread waits on.
///
/// Not a pipe: a descriptor of the shim's would live among the program's, and a program that
/// closes every descriptor it did not open (`closefrom(3)`, as daemons and job runners do) and
/// opens files that get the same numbers would have the handler's byte written into one of its
/// own files. A semaphore is no descriptor, and `sem_post` is async-signal-safe (POSIX).
struct DumpSignalSem(std::cell::UnsafeCell<libc::sem_t>);
// SAFETY: a sem_t is made to be shared between threads; it is initialised once (`sem_init`,
// guarded by DUMP_SIGNAL_READY) before the handler or the waiting thread touches it.
unsafe impl Sync for DumpSignalSem {}
static DUMP_SIGNAL_SEM: DumpSignalSem =
    // SAFETY: all zeroes is a valid `sem_t` to hand to `sem_init`.
    DumpSignalSem(std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }));
static DUMP_SIGNAL_READY: std::sync::Once = std::sync::Once::new();
static DUMP_SIGNAL_OK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Initialises the dump signal's semaphore (once); false when that failed.
pub fn dump_signal_init() -> bool {
    DUMP_SIGNAL_READY.call_once(|| {
        // SAFETY: the semaphore's storage, initialised here once.
        let ok = unsafe { libc::sem_init(DUMP_SIGNAL_SEM.0.get(), 0, 0) } == 0;
        DUMP_SIGNAL_OK.store(ok, std::sync::atomic::Ordering::Release);
    });
    DUMP_SIGNAL_OK.load(std::sync::atomic::Ordering::Acquire)
}

/// Blocks until the dump signal arrived at least once since the last return; the signals that
/// arrived meanwhile are one dump. Call only after [`dump_signal_init`] returned true.
pub fn wait_for_dump_signal() {
    let sem = DUMP_SIGNAL_SEM.0.get();
    // SAFETY: initialised by `dump_signal_init` (this function's precondition).
    while unsafe { libc::sem_wait(sem) } != 0 {
        // EINTR: another signal handler ran on this thread; wait on.
    }
    // SAFETY: as above.
    while unsafe { libc::sem_trywait(sem) } == 0 {}
}

struct OldAction(libc::sigaction);
// SAFETY: a plain C struct, written once before the handler is installed and only read after.
unsafe impl Sync for OldAction {}
// SAFETY: as for `Sync`.
unsafe impl Send for OldAction {}
static OLD_DUMP_ACTION: std::sync::OnceLock<OldAction> = std::sync::OnceLock::new();

/// `OOMSHIM_SIGNAL`'s handler: async-signal-safe, it only posts a semaphore (a thread of the
/// shim's does the dump) and then runs whatever handler the program had installed before.
extern "C" fn on_dump_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is this thread's; the semaphore was initialised before the handler was
    // installed (DUMP_SIGNAL_OK); the handler before ours gets the arguments the kernel gave.
    unsafe {
        let errno = *libc::__errno_location();
        if DUMP_SIGNAL_OK.load(std::sync::atomic::Ordering::Acquire) {
            libc::sem_post(DUMP_SIGNAL_SEM.0.get());
        }
        *libc::__errno_location() = errno;
        if let Some(OldAction(old)) = OLD_DUMP_ACTION.get() {
            let h = old.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                // SAFETY: the program's handler, of the signature its flags declare.
                if old.sa_flags & libc::SA_SIGINFO != 0 {
                    type Action =
                        extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
                    if let Some(f) = Action::from_addr(h) {
                        f(sig, info, ctx);
                    }
                } else if let Some(f) = <extern "C" fn(libc::c_int)>::from_addr(h) {
                    f(sig);
                }
            }
        }
    }
}

/// Installs the dump signal's handler, which posts the semaphore [`wait_for_dump_signal`]
/// waits on. Once per process; [`dump_signal_init`] must have succeeded.
pub fn install_dump_signal(signo: i32) -> std::io::Result<()> {
    // SAFETY: zeroed `sigaction`s are valid out- and in-parameters; the handler installed is
    // async-signal-safe.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signo, std::ptr::null(), &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if OLD_DUMP_ACTION.set(OldAction(old)).is_err() {
            return Ok(()); // already installed
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_dump_signal
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(signo, &act, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What [`register_exit_dump`] runs at exit.
static DUMP_AT_EXIT: OnceLock<fn()> = OnceLock::new();

/// `OOMSHIM_AT_EXIT`: a dump of what is still live when the program exits.
extern "C" fn dump_at_exit() {
    if let Some(f) = DUMP_AT_EXIT.get() {
        let _ = catch_unwind(*f);
    }
}

/// Registers `dump` to run at process exit (once per process; later calls do nothing).
pub fn register_exit_dump(dump: fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: `atexit` with a function that never unwinds (it catches panics).
    ONCE.call_once(|| unsafe {
        let _ = DUMP_AT_EXIT.set(dump);
        libc::atexit(dump_at_exit);
    });
}

/// What [`register_live_cleanup`] runs at exit.
static LIVE_CLEANUP: OnceLock<fn()> = OnceLock::new();

/// At a normal exit the live region (src/core/flight) is removed: one left behind means the
/// process died without exiting.
extern "C" fn remove_live_region() {
    if let Some(f) = LIVE_CLEANUP.get() {
        let _ = catch_unwind(*f);
    }
}

/// Registers `cleanup` to run at process exit (once per process; later calls do nothing).
pub fn register_live_cleanup(cleanup: fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: `atexit` with a function that never unwinds (it catches panics).
    ONCE.call_once(|| unsafe {
        let _ = LIVE_CLEANUP.set(cleanup);
        libc::atexit(remove_live_region);
    });
}

extern "C" {
    // glibc's: like `atexit`, with the status passed to `exit` (the libc crate does not declare it).
    fn on_exit(
        function: extern "C" fn(libc::c_int, *mut libc::c_void),
        arg: *mut libc::c_void,
    ) -> libc::c_int;
}

/// What [`register_exit_with_status`] runs at exit.
static AT_EXIT_WITH_STATUS: OnceLock<fn(i32)> = OnceLock::new();

extern "C" fn exit_with_status(status: libc::c_int, _arg: *mut libc::c_void) {
    if let Some(f) = AT_EXIT_WITH_STATUS.get() {
        let _ = catch_unwind(|| f(status));
    }
}

/// Registers `f` to run at process exit with the status given to `exit` (once per process; later
/// calls do nothing): what a failure leaves for the job depends on how the process ends.
pub fn register_exit_with_status(f: fn(i32)) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: `on_exit` with a function that never unwinds (it catches panics) and no argument.
    ONCE.call_once(|| unsafe {
        let _ = AT_EXIT_WITH_STATUS.set(f);
        on_exit(exit_with_status, std::ptr::null_mut());
    });
}
