//! Finding the real definitions behind the hooks: the next definition after liboomshim.so in
//! the lookup order (`RTLD_NEXT`), else the CUDA runtime already loaded under one of its usual
//! sonames (a runtime opened `RTLD_LOCAL` is invisible to `RTLD_NEXT`). Resolved once, lazily,
//! on first use; racing threads resolve the same pointer, so no lock is needed.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

/// Sonames of the CUDA runtime tried when `RTLD_NEXT` finds nothing, newest first.
const RUNTIME_SONAMES: [&CStr; 4] = [
    c"libcudart.so.13",
    c"libcudart.so.12",
    c"libcudart.so.11.0",
    c"libcudart.so",
];

/// The real `$name` as a function pointer of type `$ty` (resolved once, through a [`RealFn`] of
/// its own), or `None` when the process has no definition: how every hook and every query of the
/// runtime layer reaches the real function.
macro_rules! real_fn {
    ($name:expr, $ty:ty) => {{
        static REAL: $crate::ffi::RealFn = $crate::ffi::RealFn::new($name);
        REAL.get()
            .map(|p| unsafe { std::mem::transmute::<usize, $ty>(p) })
    }};
}
pub(crate) use real_fn;

/// A lazily resolved pointer to the real `name`.
pub struct RealFn {
    name: &'static CStr,
    ptr: AtomicUsize,
    /// A function some runtime versions lack (the shim copes): its absence is not reported.
    optional: bool,
}

impl RealFn {
    pub const fn new(name: &'static CStr) -> Self {
        RealFn {
            name,
            ptr: AtomicUsize::new(UNRESOLVED),
            optional: false,
        }
    }

    pub const fn optional(name: &'static CStr) -> Self {
        RealFn {
            name,
            ptr: AtomicUsize::new(UNRESOLVED),
            optional: true,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// The real function's address, or `None` when no definition exists in the process.
    /// Inlined: once resolved, one load and two compares in the hook.
    #[inline(always)]
    pub fn get(&self) -> Option<usize> {
        match self.ptr.load(Ordering::Acquire) {
            MISSING => None,
            UNRESOLVED => self.resolve_now(),
            p => Some(p),
        }
    }

    #[cold]
    #[inline(never)]
    fn resolve_now(&self) -> Option<usize> {
        let found = resolve(self.name);
        self.ptr.store(found.unwrap_or(MISSING), Ordering::Release);
        if found.is_none() && !self.optional {
            crate::live::report_missing(self.name());
        }
        found
    }
}

fn resolve(name: &CStr) -> Option<usize> {
    // Never resolve to a hook of this library (e.g. a second copy's lookup landing here).
    let not_ours = |handle: *mut c_void| -> Option<usize> {
        let p = unsafe { oomshim_core::sys::real_dlsym_not_ours(handle, name) };
        (p != 0).then_some(p)
    };
    if let Some(p) = not_ours(libc::RTLD_NEXT) {
        pin_object_of(p);
        return Some(p);
    }
    for soname in RUNTIME_SONAMES {
        // RTLD_NOLOAD: only a runtime the program already loaded; the handle is kept open on
        // purpose so the pointer stays valid even if the program dlcloses its own handle.
        let handle = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            oomshim_core::sys::clear_dl_error(); // the program's dlerror() never sees it
            continue;
        }
        if let Some(p) = not_ours(handle) {
            return Some(p);
        }
        unsafe { libc::dlclose(handle) };
    }
    None
}

/// Keeps the object holding `addr` loaded for the life of the process, so a cached pointer
/// into it can never dangle after the program's own `dlclose`.
fn pin_object_of(addr: usize) {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } != 0 && !info.dli_fname.is_null() {
        unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    }
}
