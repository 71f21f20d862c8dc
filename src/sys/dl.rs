//! The real `dlsym`, for the shim's own lookups. The exported interposer (`ffi::dl`) tail-jumps
//! to it; everything else in the shim calls [`real_dlsym`], never the exported `dlsym`.
//!
//! It comes from `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (glibc >= 2.34), else
//! `"GLIBC_2.2.5"` (older glibc, where it lives in libdl).

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real `dlsym`; 0 until looked up.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// What `dlsym` resolves to when glibc offers none under either version: NULL, never a crash.
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Looks up the real `dlsym` once; returns its address (never 0).
pub(crate) extern "C" fn ensure_real_dlsym() -> usize {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    let mut f = 0usize;
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: NUL-terminated strings; dlvsym is not interposed by the shim.
        f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
        if f != 0 {
            break;
        }
    }
    if f == 0 {
        f = no_dlsym as DlsymFn as usize;
    }
    REAL_DLSYM.store(f, Ordering::Release);
    f
}

/// The real `dlsym(handle, name)`, called from the shim: `RTLD_NEXT` here is relative to the shim.
pub(crate) unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f: DlsymFn = std::mem::transmute(ensure_real_dlsym());
    f(handle, name)
}
