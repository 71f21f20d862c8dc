//! `_exit` and `_Exit`: a process that ends on purpose without running its exit handlers
//! (Python's `os._exit`, a forked worker's end, a program skipping a slow teardown) removes its
//! live region first, as `exit` does through its handler. A region left behind then means the
//! process did not end on purpose (a signal killed it), which is how `oomshim run` tells a
//! killed descendant that another process reaped from one that simply ended
//! (src/cli/supervise.rs).
//!
//! Both may run in a signal handler or in a vfork child: nothing here allocates, locks or
//! looks a symbol up (the job files are written from bytes prepared at the failure). The real function was looked up when the region was created
//! (`publish::real_exit`); before that there is no region, and the process ends by
//! `exit_group`, which is all the C library's `_exit` does.

use std::ffi::c_int;

/// The names this file exports.
pub const EXPORTED_NAMES: &[&str] = &["_Exit", "_exit"];

fn end(status: c_int) -> ! {
    // An out-of-memory failure that ends the process leaves its answer for the job (torchrun's
    // error file, Kubernetes' termination message): prepared bytes, system calls only.
    crate::shim::job_files_at_raw_exit(status);
    crate::publish::remove_at_exit();
    if let Some(real) = crate::publish::real_exit() {
        // SAFETY: the C library's `_exit`, with the caller's status.
        unsafe { real(status) }
    }
    loop {
        // SAFETY: `exit_group` takes an integer and does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// # Safety
/// As the C library's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    end(status)
}

/// # Safety
/// As the C library's `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    end(status)
}
