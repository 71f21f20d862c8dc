//! What the hook tables share: their exported names as C strings, and the two steps every
//! allocating and freeing hook takes inside its guard. The guard itself (the boundary that keeps
//! the shim's own panics and re-entry from the host program) and the real `dlsym` are
//! `oomshim_host::sys`'s.

use crate::cuda::queries::Layer;
use oomshim_host::sys::cuda_error;
use oomshim_host::sys::Guard;
use std::ffi::CStr;

/// `s` (which ends in NUL) as a C string, at compile time: the exported names of the hook
/// tables are generated as `concat!(name, "\0")`.
pub(crate) const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("not NUL-terminated"),
    }
}

/// Bookkeeping after an allocation call of either layer returned `rc`, inside the hook's guard.
pub(crate) fn after_alloc(
    layer: &'static Layer,
    guard: &Guard,
    api: oomshim_host::ledger::Api,
    rc: std::ffi::c_int,
    addr: usize,
    bytes: u64,
    stream: usize,
) {
    guard.run(|| crate::shim::on_alloc(layer, api, rc, addr, bytes, stream));
}

/// Removes `ptr` from the ledger before the real free runs (the runtime may hand the address
/// to another thread the moment it is freed; see `Ledger::take`); puts it back if the free fails.
pub(crate) fn free_with(
    guard: Option<&Guard>,
    ptr: usize,
    real_free: impl FnOnce() -> std::ffi::c_int,
) -> std::ffi::c_int {
    let taken = match guard {
        Some(g) if ptr != 0 => g.run(|| crate::shim::take(ptr)).flatten(),
        _ => None,
    };
    let rc = real_free();
    if rc != cuda_error::SUCCESS {
        if let (Some(g), Some(a)) = (guard, taken) {
            g.run(|| crate::shim::reinstate(ptr, a));
        }
    }
    rc
}
