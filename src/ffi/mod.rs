//! The C ABI of liboomshim.so and nothing else: the hooked CUDA runtime functions, the exported
//! `oomshim_*` API, finding the real functions, and the boundary that keeps the shim's own
//! failures (panics, re-entry) from ever reaching the host program. Bookkeeping lives in
//! [`crate::runtime`]; this module only translates between C and it.

mod cxx_throw;
mod dl;
mod driver;
mod hooks;
mod pools;
mod real;
mod resolve;
mod torch_alloc;

pub(crate) use dl::real_dlsym;
pub(crate) use driver::device_uuid;
pub use driver::exported_names as driver_exported_names;
pub use hooks::PROGRAM_API as PROGRAM_API_EXPORTS;
pub use resolve::RUNTIME_RESOLVERS;
pub use torch_alloc::EXPORTED_NAMES as TORCH_ALLOCATOR_EXPORTS;

pub use real::RealFn;

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `cudaError_t` values the shim needs to know about.
pub mod cuda_error {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const MEMORY_ALLOCATION: i32 = 2;
    /// Returned when the real runtime function cannot be found: the runtime's own answer when
    /// it cannot initialise.
    pub const INITIALIZATION_ERROR: i32 = 3;
}

thread_local! {
    /// True while this thread is inside a hook: a hooked call made from inside another (a
    /// runtime function calling a hooked driver function, the symboliser, a dump) passes
    /// straight through, so one allocation is recorded once.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread entered the shim and is the outermost hook. Dropping it leaves.
pub(crate) struct Guard(());

impl Guard {
    /// `None` when the shim is off or this thread is already inside it.
    pub(crate) fn enter() -> Option<Guard> {
        if crate::runtime::disabled() {
            return None;
        }
        // try_with: during thread teardown the slot may be gone; then stay out of the way.
        let entered = IN_HOOK
            .try_with(|c| {
                if c.get() {
                    false
                } else {
                    c.set(true);
                    true
                }
            })
            .unwrap_or(false);
        // Not `then_some(Guard(()))`: that builds a Guard even when not entered, and its drop
        // would clear the outer hook's flag.
        if entered {
            Some(Guard(()))
        } else {
            None
        }
    }

    /// Runs shim code; a panic in it turns the shim into pass-through for the rest of the
    /// process (with one message) instead of unwinding into C.
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => Some(r),
            Err(payload) => {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                crate::runtime::disable(&format!("internal error ({what})"));
                None
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|c| c.set(false));
    }
}

/// Runs at process exit (registered with `atexit` when the first dump is queued): a dump still
/// waiting to learn whether its failure was recovered is written now rather than lost.
extern "C" fn flush_at_exit() {
    let _ = catch_unwind(crate::runtime::flush_at_exit);
}

pub(crate) fn flush_dumps_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| unsafe {
        libc::atexit(flush_at_exit);
    });
}

/// Runs shim work from a thread of the shim's own (a trigger thread, an exit handler) inside the
/// guard, so anything it calls that is hooked passes straight through. `None` when refused.
pub(crate) fn guarded<R>(f: impl FnOnce() -> R) -> Option<R> {
    let guard = Guard::enter()?;
    guard.run(f)
}

/// The semaphore the dump signal's handler posts and the shim's signal thread waits on.
///
/// Not a pipe: a descriptor of the shim's would live among the program's, and a program that
/// closes every descriptor it did not open (`closefrom(3)`, as daemons and job runners do) and
/// opens files that get the same numbers would have the handler's byte written into one of its
/// own files. A semaphore is no descriptor, and `sem_post` is async-signal-safe (POSIX).
struct DumpSignalSem(std::cell::UnsafeCell<libc::sem_t>);
// Safety: a sem_t is made to be shared between threads; it is initialised once (`sem_init`,
// guarded by DUMP_SIGNAL_READY) before the handler or the waiting thread touches it.
unsafe impl Sync for DumpSignalSem {}
static DUMP_SIGNAL_SEM: DumpSignalSem =
    DumpSignalSem(std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }));
static DUMP_SIGNAL_READY: std::sync::Once = std::sync::Once::new();
static DUMP_SIGNAL_OK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Initialises the dump signal's semaphore (once); false when that failed.
pub(crate) fn dump_signal_init() -> bool {
    DUMP_SIGNAL_READY.call_once(|| {
        let ok = unsafe { libc::sem_init(DUMP_SIGNAL_SEM.0.get(), 0, 0) } == 0;
        DUMP_SIGNAL_OK.store(ok, std::sync::atomic::Ordering::Release);
    });
    DUMP_SIGNAL_OK.load(std::sync::atomic::Ordering::Acquire)
}

/// Blocks until the dump signal arrived at least once since the last return; the signals that
/// arrived meanwhile are one dump. Call only after [`dump_signal_init`] returned true.
pub(crate) fn wait_for_dump_signal() {
    let sem = DUMP_SIGNAL_SEM.0.get();
    while unsafe { libc::sem_wait(sem) } != 0 {
        // EINTR: another signal handler ran on this thread; wait on.
    }
    while unsafe { libc::sem_trywait(sem) } == 0 {}
}

struct OldAction(libc::sigaction);
// Safety: a plain C struct, written once before the handler is installed and only read after.
unsafe impl Sync for OldAction {}
unsafe impl Send for OldAction {}
static OLD_DUMP_ACTION: std::sync::OnceLock<OldAction> = std::sync::OnceLock::new();

/// `OOMSHIM_SIGNAL`'s handler: async-signal-safe, it only posts a semaphore (a thread of the
/// shim's does the dump) and then runs whatever handler the program had installed before.
extern "C" fn on_dump_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    unsafe {
        let errno = *libc::__errno_location();
        if DUMP_SIGNAL_OK.load(std::sync::atomic::Ordering::Acquire) {
            libc::sem_post(DUMP_SIGNAL_SEM.0.get());
        }
        *libc::__errno_location() = errno;
        if let Some(OldAction(old)) = OLD_DUMP_ACTION.get() {
            let h = old.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                if old.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(h);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                    f(sig);
                }
            }
        }
    }
}

/// Installs the dump signal's handler, which posts the semaphore [`wait_for_dump_signal`]
/// waits on. Once per process; [`dump_signal_init`] must have succeeded.
pub(crate) fn install_dump_signal(signo: i32) -> std::io::Result<()> {
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

/// What the shim notes the moment it is loaded, before the program's `main` can change it:
/// the identity of fd 2 (so the shim never writes into a file that later took that number,
/// `runtime::say`) and the working directory (a relative `OOMSHIM_DIR` is relative to where
/// the program started, not to where it has moved by its first CUDA call). One `fstat` and one
/// `getcwd` into a static buffer: nothing is allocated, nothing can fail loudly.
extern "C" fn note_load_time_facts() {
    let _ = catch_unwind(|| {
        crate::runtime::say::note_stderr_at_load();
        crate::runtime::note_start_dir();
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_LOAD_TIME_FACTS: extern "C" fn() = note_load_time_facts;

/// `OOMSHIM_AT_EXIT`: a dump of what is still live when the program exits.
extern "C" fn dump_at_exit() {
    let _ = catch_unwind(crate::runtime::at_exit_dump);
}

pub(crate) fn register_exit_dump() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| unsafe {
        libc::atexit(dump_at_exit);
    });
}

/// At a normal exit the live region (src/flight) is removed: one left behind means the
/// process died without exiting.
extern "C" fn remove_live_region() {
    let _ = catch_unwind(crate::flight::publish::remove_at_exit);
}

pub(crate) fn register_live_cleanup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| unsafe {
        libc::atexit(remove_live_region);
    });
}

/// The shim's `fork` handlers, set once by [`register_fork_handlers`].
struct ForkHandlers {
    prepare: fn(),
    parent: fn(),
    child: fn(),
}
static FORK_HANDLERS: std::sync::OnceLock<ForkHandlers> = std::sync::OnceLock::new();

extern "C" {
    // In glibc this lives in libc_nonshared.a (it passes the caller's __dso_handle), so the
    // libc crate does not declare it; the linker script libc.so pulls it in.
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

// The registered handlers (the OOM tracker's, which take its locks and the ledger's and stack
// tables' shards) are wrapped by the runtime's, which take the remaining locks: the VMM state,
// the name caches, the Python code table and the module snapshot (`runtime::fork_prepare`).
// Released in the reverse order.
unsafe extern "C" fn fork_prepare() {
    if let Some(h) = FORK_HANDLERS.get() {
        let _ = catch_unwind(crate::runtime::fork_prepare);
        let _ = catch_unwind(h.prepare);
    }
}

unsafe extern "C" fn fork_parent() {
    if let Some(h) = FORK_HANDLERS.get() {
        let _ = catch_unwind(h.parent);
        let _ = catch_unwind(crate::runtime::fork_parent);
    }
}

unsafe extern "C" fn fork_child() {
    if let Some(h) = FORK_HANDLERS.get() {
        let _ = catch_unwind(h.child);
        let _ = catch_unwind(crate::runtime::fork_child);
    }
}

/// Registers `pthread_atfork` handlers (once per process, at shim start): `prepare` runs in the
/// forking thread before `fork`, `parent` and `child` after it in each process. They keep the
/// shim's locks from being copied into a child while a thread that does not exist there holds
/// them.
pub(crate) fn register_fork_handlers(prepare: fn(), parent: fn(), child: fn()) {
    if FORK_HANDLERS
        .set(ForkHandlers {
            prepare,
            parent,
            child,
        })
        .is_err()
    {
        return;
    }
    let rc = unsafe { pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if rc != 0 {
        tracing::debug!(rc, "pthread_atfork failed");
    }
}

/// What the bookkeeping shared by the runtime hooks and the driver hooks asks of its layer.
/// Both layers report success as 0 and out-of-memory as 2 (`cudaErrorMemoryAllocation`,
/// `CUDA_ERROR_OUT_OF_MEMORY`), so only these queries differ.
pub(crate) struct Layer {
    /// The calling thread's current device (no context is created by asking).
    pub current_device: fn() -> i32,
    /// (free, total) of the calling thread's current device.
    pub mem_info: fn() -> Option<(u64, u64)>,
    pub device_name: fn(i32) -> Option<String>,
    /// The runtime's version, where this layer can tell it.
    pub runtime_version: fn() -> Option<i32>,
}

// The shared code compares with the runtime's codes; the driver's are the same numbers.
const _: () = assert!(
    driver::CUDA_SUCCESS == cuda_error::SUCCESS
        && driver::CUDA_ERROR_OUT_OF_MEMORY == cuda_error::MEMORY_ALLOCATION
);

/// A device allocation failed for lack of memory: asks the layer about the device on the
/// failing thread (the one place that may ask CUDA safely) and hands the failure on.
pub(crate) fn record_oom(
    layer: &Layer,
    api: crate::ledger::Api,
    bytes: u64,
    device: i32,
    rc: i32,
    stream: usize,
) {
    let extras = pools::at_failure(device);
    crate::runtime::note_cuda_versions(driver::driver_version, layer.runtime_version);
    crate::runtime::record_oom(crate::runtime::OomEvent {
        api,
        bytes,
        device,
        error_code: rc,
        mem_info: (layer.mem_info)(),
        device_name: crate::runtime::cached_device_name(device, layer.device_name),
        stream,
        extras,
    });
}

/// `OOMSHIM_FAULT=panic-in-alloc[:N]` (a test hook, see RELIABILITY.md section 7): a panic in
/// the hook path of the Nth successful allocation, caught by [`Guard::run`] like any other.
fn inject_alloc_fault() {
    if let crate::config::Fault::PanicInAlloc(n) = crate::config::fault() {
        static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n {
            panic!("injected fault, OOMSHIM_FAULT=panic-in-alloc:{n}");
        }
    }
}

/// Bookkeeping after an allocation call of either layer returned `rc`.
pub(crate) fn after_alloc(
    layer: &Layer,
    guard: &Guard,
    api: crate::ledger::Api,
    rc: std::ffi::c_int,
    addr: usize,
    bytes: u64,
    stream: usize,
) {
    guard.run(|| {
        if rc == cuda_error::SUCCESS {
            if addr != 0 {
                inject_alloc_fault();
                if crate::runtime::recording::current() == crate::runtime::Recording::PassThrough {
                    // Nothing is recorded: not even the device is asked.
                    crate::runtime::record_alloc(api, addr, bytes, -1, stream);
                    return;
                }
                let device = if api.is_pinned_host() {
                    -1
                } else {
                    (layer.current_device)()
                };
                if api.has_stream() {
                    pools::note(device, None);
                }
                crate::runtime::record_alloc(api, addr, bytes, device, stream);
            }
        } else if rc == cuda_error::MEMORY_ALLOCATION {
            if api.is_pinned_host() {
                crate::runtime::record_pinned_failure(api, bytes);
            } else {
                record_oom(layer, api, bytes, (layer.current_device)(), rc, stream);
            }
        }
    });
}

/// Removes `ptr` from the ledger before the real free runs (the runtime may hand the address
/// to another thread the moment it is freed; see `Ledger::take`); puts it back if the free fails.
pub(crate) fn free_with(
    guard: Option<&Guard>,
    ptr: usize,
    real_free: impl FnOnce() -> std::ffi::c_int,
) -> std::ffi::c_int {
    let taken = match guard {
        Some(g) if ptr != 0 => g.run(|| crate::runtime::take(ptr)).flatten(),
        _ => None,
    };
    let rc = real_free();
    if rc != cuda_error::SUCCESS {
        if let (Some(g), Some(a)) = (guard, taken) {
            g.run(|| crate::runtime::reinstate(ptr, a));
        }
    }
    rc
}
