//! The shim's process plumbing, below everything that runs inside the host program: the guard
//! at the boundary and the fault the reliability tests inject into it, the real `dlsym`,
//! addresses made typed functions (`fn_ptr`), `atexit`/`atfork`/signal registration, and the
//! CUDA error codes the shim answers with.
//! Imports nothing above it, so the hooks and the live state can both use it without importing
//! each other.

pub mod dl;
pub mod doorbell;
pub mod fault;
pub mod fn_ptr;
pub mod fork;
pub mod guard;
pub mod process;
pub mod say;

pub use dl::{clear_dl_error, object_base, quiet_dlsym, real_dlsym, real_dlsym_not_ours};
pub use fault::fault;
pub use fork::{register_fork_handlers, ForkHeld};
pub use guard::{contain, guarded, Guard};
pub use guard::{disable, disabled};
pub use process::{
    dump_signal_init, flush_dumps_at_exit, install_dump_signal, register_exit_dump,
    register_exit_with_status, register_live_cleanup, wait_for_dump_signal,
};

/// `cudaError_t` values the shim needs to know about.
pub mod cuda_error {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const MEMORY_ALLOCATION: i32 = 2;
    /// Returned when the real runtime function cannot be found: the runtime's own answer when
    /// it cannot initialise.
    pub const INITIALIZATION_ERROR: i32 = 3;
}
