//! The real `dlsym`, for the shim's own lookups. The exported interposer (`ffi::dl`) tail-jumps
//! to it; everything else in the shim calls [`real_dlsym`], never the exported `dlsym`.
//!
//! It comes from `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (glibc >= 2.34), else
//! `"GLIBC_2.2.5"` (older glibc, where it lives in libdl).
//!
//! Every lookup of a real function behind a hook ends in [`real_dlsym_not_ours`]: the runtime
//! hooks' (`ffi::real`) and the driver table's (`ffi::driver`) alike.

use super::fn_ptr::FnPtr;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real `dlsym`; 0 until looked up.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// What `dlsym` resolves to when glibc offers none under either version: NULL, never a crash.
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Looks up the real `dlsym` once; returns its address (never 0).
pub extern "C" fn ensure_real_dlsym() -> usize {
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
///
/// # Safety
/// As `dlsym`: `handle` is `RTLD_DEFAULT`, `RTLD_NEXT` or an open `dlopen` handle, and `name`
/// a NUL-terminated string.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the address of glibc's `dlsym` (or of `no_dlsym`), whose signature this is.
    match unsafe { DlsymFn::from_addr(ensure_real_dlsym()) } {
        // SAFETY: the arguments satisfy `dlsym`'s contract (this function's).
        Some(f) => unsafe { f(handle, name) },
        None => std::ptr::null_mut(),
    }
}

/// The shim's own lookup of `name` (0 when absent) that leaves `dlerror()` as it found no
/// error: a failed lookup's message is consumed here, so a program that checks `dlerror()`
/// after its own successful `dlsym`/`dlopen` (the man page's idiom, GLib's `g_module_symbol`)
/// never sees the shim's probe. (glibc clears the pending error at the start of every `dl*`
/// call, so nothing the program could still read is lost.)
///
/// # Safety
/// `handle` is `RTLD_DEFAULT`, `RTLD_NEXT` or a handle `dlopen` returned and not yet closed.
pub unsafe fn quiet_dlsym(handle: *mut c_void, name: &CStr) -> usize {
    // SAFETY: a NUL-terminated name; the handle is valid by this function's contract.
    let p = unsafe { real_dlsym(handle, name.as_ptr()) } as usize;
    if p == 0 {
        clear_dl_error();
    }
    p
}

/// The function `name` in `handle` ([`quiet_dlsym`]) as a function of type `F`; `None` when
/// absent.
///
/// # Safety
/// As [`quiet_dlsym`]; and `F` is the C signature of `name`.
pub unsafe fn quiet_fn<F: FnPtr>(handle: *mut c_void, name: &CStr) -> Option<F> {
    // SAFETY: this function's contract.
    unsafe { F::from_addr(quiet_dlsym(handle, name)) }
}

/// Consumes a pending `dlerror()` message left by one of the shim's own `dl*` calls.
pub fn clear_dl_error() {
    // SAFETY: dlerror takes no arguments; the returned string is not used.
    unsafe { libc::dlerror() };
}

/// Base address of the loaded object that contains `addr` (`dladdr`), `None` if none does.
pub fn object_base(addr: usize) -> Option<usize> {
    // SAFETY: dladdr only writes `info`; a zeroed Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads no memory at `addr` and only writes `info`.
    let ok = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
    (ok != 0).then_some(info.dli_fbase as usize)
}

/// True when `addr` lies in the object holding the shim's own code: a hook of this library (or
/// of a second copy's lookup landing here), never a real function. Asked once, then cached.
fn is_own_code(addr: usize) -> bool {
    /// The shim's own object base; 0 until asked, `usize::MAX` when `dladdr` cannot tell (then
    /// nothing counts as ours).
    static OWN_BASE: AtomicUsize = AtomicUsize::new(0);
    let mut own = OWN_BASE.load(Ordering::Relaxed);
    if own == 0 {
        own = object_base(is_own_code as fn(usize) -> bool as usize).unwrap_or(usize::MAX);
        OWN_BASE.store(own, Ordering::Relaxed);
    }
    own != usize::MAX && object_base(addr) == Some(own)
}

/// `name` in `handle` through the real `dlsym`, never answering with one of the shim's own
/// functions: its address, or 0 when there is none (or only ours).
///
/// # Safety
/// `handle` must be a handle from `dlopen` or one of the `RTLD_*` pseudo-handles.
pub unsafe fn real_dlsym_not_ours(handle: *mut c_void, name: &CStr) -> usize {
    // SAFETY: the same contract as this function's.
    let p = unsafe { quiet_dlsym(handle, name) };
    if p == 0 || is_own_code(p) {
        0
    } else {
        p
    }
}
