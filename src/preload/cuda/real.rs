//! Finding the real definitions behind the hooks, and the driver functions the shim calls
//! itself, as typed functions: one [`RealFn`] per function, declared with its C signature.
//!
//! A runtime function is the next definition after liboomshim.so in the lookup order
//! (`RTLD_NEXT`), else the one in a CUDA runtime already loaded under one of its usual sonames (a
//! runtime opened `RTLD_LOCAL` is invisible to `RTLD_NEXT`); a driver function comes from the
//! driver library already loaded ([`driver_handle`]). Resolved once, lazily, on first use; racing
//! threads resolve the same pointer, so no lock is needed.

use oomshim_host::sys::fn_ptr::FnPtr;
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

/// Sonames of the CUDA runtime tried when `RTLD_NEXT` finds nothing, newest first.
const RUNTIME_SONAMES: [&CStr; 4] = [
    c"libcudart.so.13",
    c"libcudart.so.12",
    c"libcudart.so.11.0",
    c"libcudart.so",
];

/// The real runtime function `$name` of C signature `$ty`, through a [`RealFn`] of its own, or
/// `None` when the process has no definition: how the hooks of the runtime table and allocator
/// mode reach the real function.
///
/// The caller states that `$ty` is `$name`'s C signature (what [`RealFn::new`] requires).
macro_rules! real_fn {
    ($name:expr, $ty:ty) => {{
        use $crate::cuda::real::RealFn;
        // SAFETY: `$ty` is the C signature of `$name` (this macro's contract).
        static REAL: RealFn<$ty> = unsafe { RealFn::new($name) };
        REAL.get()
    }};
}
pub(crate) use real_fn;

/// How a [`RealFn`] is found, and what its absence means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A runtime function the hooks need: its absence is reported once.
    Required,
    /// A runtime function some versions lack (the shim copes): its absence is not reported.
    Optional,
    /// A driver function the shim calls itself: asked again while absent (the program may load
    /// the driver later), never reported.
    Driver,
}

/// The real function `name`, of C signature `F`, resolved lazily.
pub struct RealFn<F> {
    name: &'static CStr,
    ptr: AtomicUsize,
    kind: Kind,
    signature: PhantomData<F>,
}

impl<F: FnPtr> RealFn<F> {
    /// A runtime function the hooks need.
    ///
    /// # Safety
    /// `F` is the C signature of the function `name`.
    pub const unsafe fn new(name: &'static CStr) -> Self {
        Self::of(name, Kind::Required)
    }

    /// A runtime function some versions lack.
    ///
    /// # Safety
    /// `F` is the C signature of the function `name`.
    pub const unsafe fn optional(name: &'static CStr) -> Self {
        Self::of(name, Kind::Optional)
    }

    /// A driver function, from the driver library the program loaded.
    ///
    /// # Safety
    /// `F` is the C signature of the function `name`.
    pub const unsafe fn driver(name: &'static CStr) -> Self {
        Self::of(name, Kind::Driver)
    }

    const fn of(name: &'static CStr, kind: Kind) -> Self {
        RealFn {
            name,
            ptr: AtomicUsize::new(UNRESOLVED),
            kind,
            signature: PhantomData,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// The real function, or `None` when no definition exists in the process.
    /// Inlined: once resolved, one load and two compares in the hook.
    #[inline(always)]
    pub fn get(&self) -> Option<F> {
        let p = match self.ptr.load(Ordering::Acquire) {
            MISSING => return None,
            UNRESOLVED => self.resolve_now()?,
            p => p,
        };
        // SAFETY: the loader's address of `name`, whose C signature is `F` (the constructors'
        // contract); resolved objects stay loaded (`resolve`, `driver_handle`).
        unsafe { F::from_addr(p) }
    }

    #[cold]
    #[inline(never)]
    fn resolve_now(&self) -> Option<usize> {
        if self.kind == Kind::Driver {
            // SAFETY: `driver_handle` returns an open handle or RTLD_NEXT.
            let p = unsafe { oomshim_host::sys::real_dlsym_not_ours(driver_handle(), self.name) };
            if p != 0 {
                self.ptr.store(p, Ordering::Release);
            }
            return (p != 0).then_some(p);
        }
        let found = resolve(self.name);
        self.ptr.store(found.unwrap_or(MISSING), Ordering::Release);
        if found.is_none() && self.kind == Kind::Required {
            report_missing(self.name());
        }
        found
    }
}

/// Says once that a real CUDA runtime function could not be found.
pub fn report_missing(name: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_missing_once(&SAID, name, "runtime", "cudaErrorInitializationError");
}

/// Says once that a real CUDA driver function could not be found.
pub fn report_missing_driver(name: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_missing_once(&SAID, name, "driver", "CUDA_ERROR_NOT_INITIALIZED");
}

/// One message per layer for the whole process: the first missing function names the problem.
fn say_missing_once(said: &AtomicBool, name: &str, layer: &str, returns: &str) {
    if !said.swap(true, Ordering::Relaxed) {
        oomshim_host::say!(
            "oomshim: the real {name} was not found in this process (is the CUDA {layer} loaded?); \
             calls to it return {returns}"
        );
    }
}

fn resolve(name: &CStr) -> Option<usize> {
    // Never resolve to a hook of this library (e.g. a second copy's lookup landing here).
    let not_ours = |handle: *mut c_void| -> Option<usize> {
        // SAFETY: RTLD_NEXT or a handle dlopen returned below and still open.
        let p = unsafe { oomshim_host::sys::real_dlsym_not_ours(handle, name) };
        (p != 0).then_some(p)
    };
    if let Some(p) = not_ours(libc::RTLD_NEXT) {
        pin_object_of(p);
        return Some(p);
    }
    for soname in RUNTIME_SONAMES {
        // RTLD_NOLOAD: only a runtime the program already loaded; the handle is kept open on
        // purpose so the pointer stays valid even if the program dlcloses its own handle.
        // SAFETY: a NUL-terminated soname.
        let handle = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            oomshim_host::sys::clear_dl_error(); // the program's dlerror() never sees it
            continue;
        }
        if let Some(p) = not_ours(handle) {
            return Some(p);
        }
        // SAFETY: the handle dlopen just returned, nothing from it kept.
        unsafe { libc::dlclose(handle) };
    }
    None
}

/// Keeps the object holding `addr` loaded for the life of the process, so a cached pointer
/// into it can never dangle after the program's own `dlclose`.
fn pin_object_of(addr: usize) {
    // SAFETY: dladdr only writes `info`; a zeroed Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads no memory at `addr`; the name it returns is NUL-terminated.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } != 0 && !info.dli_fname.is_null() {
        // SAFETY: the object's own NUL-terminated path, from dladdr.
        unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    }
}

/// The driver library already loaded by the program (never loads it): by its soname, else
/// `RTLD_NEXT` relative to the shim (a driver linked by the program).
pub fn driver_handle() -> *mut c_void {
    static HANDLE: AtomicUsize = AtomicUsize::new(0);
    let h = HANDLE.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    // RTLD_NOLOAD: only a driver already in the process. The reference is kept on purpose, so
    // the addresses stay valid even if the program dlcloses its own handle.
    // SAFETY: a NUL-terminated soname.
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if !h.is_null() {
        HANDLE.store(h as usize, Ordering::Release);
        return h;
    }
    oomshim_host::sys::clear_dl_error(); // the program's dlerror() never sees it
    libc::RTLD_NEXT
}
