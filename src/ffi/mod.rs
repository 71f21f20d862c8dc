//! The C ABI of liboomshim.so and nothing else: the hooked CUDA runtime functions, the exported
//! `oomshim_*` API, finding the real functions, and the boundary that keeps the shim's own
//! failures (panics, re-entry) from ever reaching the host program. Bookkeeping lives in
//! [`crate::runtime`]; this module only translates between C and it.

mod dl;
mod driver;
mod hooks;
mod pools;
mod real;
mod resolve;

pub(crate) use dl::real_dlsym;
pub use driver::exported_names as driver_exported_names;
pub use resolve::RUNTIME_RESOLVERS;

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
