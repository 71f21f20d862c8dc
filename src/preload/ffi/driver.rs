//! The CUDA driver API: exported wrappers of the driver's allocation functions and resolvers,
//! and the pointer-identity map that lets every resolver (`dlsym`, `cuGetProcAddress*`,
//! `cudaGetDriverEntryPoint*`) hand out those wrappers.
//!
//! [`driver_functions!`] is the single list: it generates the exported wrappers, the table of
//! exact exported names (whose real addresses are looked up once through the driver library's
//! handle), the wrapper of each, and [`exported_names`] (which the tests use). A resolver's
//! result is swapped for a wrapper only when it is *identical* to the real address of that
//! exact name; nothing is ever guessed from a name or its `_v2`/`_ptsz` suffix.
//!
//! A wrapper whose real function cannot be found returns `CUDA_ERROR_NOT_INITIALIZED` (3): the
//! driver's own answer to any call before `cuInit` succeeded, which callers already handle.

#![allow(non_snake_case, reason = "CUDA's exported names")]

use super::boundary::cstr;
use crate::cuda::queries::driver::current_device;
use crate::cuda::queries::DRIVER;
use crate::cuda::real::driver_handle;
use crate::shim;
use oomshim_host::ledger::Api;
use oomshim_host::sys::cuda_error;
use oomshim_host::sys::fn_ptr::FnPtr;
use oomshim_host::sys::Guard;
use oomshim_host::sys::{object_base, real_dlsym_not_ours};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub type CUresult = c_int;
pub type CUdeviceptr = u64;
pub type CUmemGenericAllocationHandle = u64;
type CUstream = *mut c_void;
type CUmemoryPool = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;

/// `CUmemLocation`.
#[repr(C)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

/// The leading fields of `CUmemAllocationProp` (only these are read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requested_handle_types: c_uint,
    pub location: CUmemLocation,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`; HOST (2), HOST_NUMA (3), HOST_NUMA_CURRENT (4) are host memory.
const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// Generates, from one list: the exported wrappers, [`NAMES`] (exact exported names), `apis()`
/// (the [`Api`] each records, `None` for frees, VMM mapping calls and resolvers), the index
/// enum and [`wrappers`]. Each entry: `name [+ twin](args) [as Api] |real, guard| body`
/// (`twin`: a second exported name with the same signature and body, such as the `_ptsz`
/// per-thread-default-stream variant) where `real` is
/// the real function (already found; a missing one returns CUDA_ERROR_NOT_INITIALIZED),
/// `guard` the `Option<Guard>` of this call and `API` the row's [`Api`] inside its body.
macro_rules! driver_functions {
    ($(
        $name:ident $(+ $twin:ident)? ( $($arg:ident : $ty:ty),* ) $(as $api:ident)?
        |$real:ident, $guard:ident| $body:block
    )*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        #[repr(usize)]
        enum Idx { $($name, $($twin,)?)* }

        /// Exact exported names, in table order (a row's twin right after it).
        pub(crate) const NAMES: &[&CStr] = &[$(
            cstr(concat!(stringify!($name), "\0")),
            $( cstr(concat!(stringify!($twin), "\0")), )?
        )*];
        const COUNT: usize = NAMES.len();

        /// The [`Api`] each exported name records, in the order of [`NAMES`].
        #[cfg(test)]
        pub(crate) fn apis() -> Vec<Option<Api>> {
            [$( &driver_functions!(@apis [$name $($twin)?] [$($api)?])[..], )*].concat()
        }

        /// The shim's wrapper of each exported name, in the order of [`NAMES`].
        fn wrappers() -> [usize; COUNT] {
            [$($name as *const () as usize, $($twin as *const () as usize,)?)*]
        }

        $(
            driver_functions!(
                @fns [$name $($twin)?] ($($arg: $ty),*) [$($api)?] [$real, $guard] $body
            );
        )*
    };
    // One function per name of a row: the row's own and its twin's, the same body.
    (@fns [$($name:ident)+] $args:tt $api:tt $params:tt $body:block) => {
        $( driver_functions!(@fn $name $args $api $params $body); )+
    };
    (@fn $name:ident ($($arg:ident : $ty:ty),*) [$($api:ident)?]
        [$real:ident, $guard:ident] $body:block
    ) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            $( const API: Api = Api::$api; )?
            // SAFETY: the row's own signature.
            let Some($real) = (unsafe {
                real_of::<unsafe extern "C" fn($($ty),*) -> CUresult>(Idx::$name)
            }) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            let $guard = Guard::enter();
            // SAFETY: the caller's arguments, as valid as the driver API requires of them;
            // the row's body passes them to the real function unchanged and reads an
            // out-parameter only after a success, never through NULL.
            unsafe { $body }
        }
    };
    (@apis [$($name:ident)+] $api:tt) => {
        [$( driver_functions!(@api $name $api) ),+]
    };
    (@api $name:ident []) => { None };
    (@api $name:ident [$api:ident]) => { Some(Api::$api) };
}

driver_functions! {
    // ---- classic device memory ----
    cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) as CuMemAlloc |real, guard| {
        let rc = real(dptr, bytesize);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read(dptr), bytesize as u64, 0);
        }
        rc
    }
    cuMemFree_v2(dptr: CUdeviceptr) |real, guard| {
        free_with(guard.as_ref(), dptr, || real(dptr))
    }
    cuMemAllocPitch_v2(
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element_size: c_uint
    ) as CuMemAllocPitch |real, guard| {
        let rc = real(dptr, pitch, width, height, element_size);
        if let Some(g) = &guard {
            let row = if rc == CUDA_SUCCESS && !pitch.is_null() { *pitch } else { width };
            let bytes = (row as u64).saturating_mul(height as u64);
            after_alloc(g, API, rc, read(dptr), bytes, 0);
        }
        rc
    }
    cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint)
        as CuMemAllocManaged |real, guard|
    {
        let rc = real(dptr, bytesize, flags);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read(dptr), bytesize as u64, 0);
        }
        rc
    }
    // ---- stream-ordered ----
    cuMemAllocAsync + cuMemAllocAsync_ptsz(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        stream: CUstream
    ) as CuMemAllocAsync |real, guard| {
        let rc = real(dptr, bytesize, stream);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read(dptr), bytesize as u64, stream as usize);
        }
        rc
    }
    cuMemAllocFromPoolAsync + cuMemAllocFromPoolAsync_ptsz(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        pool: CUmemoryPool,
        stream: CUstream
    ) as CuMemAllocFromPoolAsync |real, guard| {
        let rc = real(dptr, bytesize, pool, stream);
        if let Some(g) = &guard {
            if rc == CUDA_SUCCESS {
                g.run(|| crate::cuda::pools::note(current_device(), Some(pool as usize)));
            }
            after_alloc(g, API, rc, read(dptr), bytesize as u64, stream as usize);
        }
        rc
    }
    cuMemFreeAsync + cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) |real, guard| {
        free_with(guard.as_ref(), dptr, || real(dptr, stream))
    }
    // ---- page-locked host memory ----
    cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) as CuMemAllocHost |real, guard| {
        let rc = real(pp, bytesize);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_host(pp), bytesize as u64, 0);
        }
        rc
    }
    cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint)
        as CuMemHostAlloc |real, guard|
    {
        let rc = real(pp, bytesize, flags);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_host(pp), bytesize as u64, 0);
        }
        rc
    }
    cuMemFreeHost(p: *mut c_void) |real, guard| {
        free_with(guard.as_ref(), p as u64, || real(p))
    }
    // ---- virtual memory management ----
    cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64
    ) as CuMemCreate |real, guard| {
        let rc = real(handle, size, prop, flags);
        if let Some(g) = &guard {
            g.run(|| {
                let (host, device) = location_of(prop);
                if rc == CUDA_SUCCESS && !handle.is_null() {
                    shim::vmm_created(*handle, size as u64, device, host);
                } else if rc == CUDA_ERROR_OUT_OF_MEMORY {
                    if host {
                        shim::record_pinned_failure(Api::CuMemCreateHost, size as u64);
                    } else {
                        oom(API, size as u64, device, rc, 0);
                    }
                }
            });
        }
        rc
    }
    cuMemRelease(handle: CUmemGenericAllocationHandle) |real, guard| {
        let undo = guard.as_ref().and_then(|g| g.run(|| shim::vmm_release_begin(handle)).flatten());
        let rc = real(handle);
        if let (Some(g), Some(undo)) = (&guard, undo) {
            if rc != CUDA_SUCCESS {
                g.run(|| shim::vmm_undo(undo));
            }
        }
        rc
    }
    cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64
    ) |real, guard| {
        let rc = real(ptr, size, offset, handle, flags);
        if let Some(g) = &guard {
            if rc == CUDA_SUCCESS {
                g.run(|| shim::vmm_mapped(ptr, size as u64, handle));
            }
        }
        rc
    }
    cuMemUnmap(ptr: CUdeviceptr, size: usize) |real, guard| {
        let undo = guard.as_ref().and_then(|g| g.run(|| shim::vmm_unmap_begin(ptr, size as u64)).flatten());
        let rc = real(ptr, size);
        if let (Some(g), Some(undo)) = (&guard, undo) {
            if rc != CUDA_SUCCESS {
                g.run(|| shim::vmm_undo(undo));
            }
        }
        rc
    }
    cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64
    ) |real, guard| {
        let rc = real(ptr, size, alignment, addr, flags);
        if let Some(g) = &guard {
            if rc == CUDA_SUCCESS && !ptr.is_null() {
                g.run(|| shim::vmm_reserved(*ptr, size as u64));
            }
        }
        rc
    }
    cuMemAddressFree(ptr: CUdeviceptr, size: usize) |real, guard| {
        let undo = guard.as_ref().and_then(|g| g.run(|| shim::vmm_address_free_begin(ptr)).flatten());
        let rc = real(ptr, size);
        if let (Some(g), Some(undo)) = (&guard, undo) {
            if rc != CUDA_SUCCESS {
                g.run(|| shim::vmm_undo(undo));
            }
        }
        rc
    }
    // ---- resolvers: the real one first, then the wrapper of exactly what it returned ----
    cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64
    ) |real, _guard| {
        let rc = real(symbol, pfn, cuda_version, flags);
        if rc == CUDA_SUCCESS {
            substitute_out(pfn);
        }
        rc
    }
    cuGetProcAddress_v2 + cuGetProcAddress_v2_ptsz(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
        status: *mut c_int
    ) |real, _guard| {
        let rc = real(symbol, pfn, cuda_version, flags, status);
        if rc == CUDA_SUCCESS {
            substitute_out(pfn);
        }
        rc
    }
}

/// The exact names of the driver functions the shim exports (from the single table).
pub fn exported_names() -> Vec<&'static str> {
    NAMES.iter().map(|n| n.to_str().unwrap_or("?")).collect()
}

// ---------- the real functions and the identity map ----------

/// Real address of each table entry; 0 = not found (yet).
static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// True once the table was filled from a process where the driver is loaded.
static BUILT: AtomicBool = AtomicBool::new(false);

/// Fills [`REAL`] from `handle` by exact names. Racing callers compute the same values, so no
/// lock is taken (a lock here could be held by a thread blocked on the loader's lock).
///
/// # Safety
/// `handle` is `RTLD_NEXT` or a handle `dlopen` returned and not yet closed.
unsafe fn build_from(handle: *mut c_void) {
    let mut any = false;
    for (slot, name) in REAL.iter().zip(NAMES) {
        // SAFETY: this function's contract.
        let p = unsafe { real_dlsym_not_ours(handle, name) };
        if p != 0 {
            slot.store(p, Ordering::Release);
            any = true;
        }
    }
    if any {
        BUILT.store(true, Ordering::Release);
    }
}

fn ensure_built() {
    if !BUILT.load(Ordering::Acquire) {
        // SAFETY: `driver_handle` returns an open handle, kept open, or RTLD_NEXT.
        unsafe { build_from(driver_handle()) };
    }
}

/// The real function of table entry `i`, as `F`.
///
/// # Safety
/// `F` is the C signature of `NAMES[i]`.
unsafe fn real_of<F: FnPtr>(i: Idx) -> Option<F> {
    // SAFETY: the real address of `NAMES[i]`, whose signature is `F` (this function's contract);
    // the driver library stays loaded (`driver_handle`, `build_from`'s handle).
    real_addr(i as usize).and_then(|p| unsafe { F::from_addr(p) })
}

/// The real address of table entry `i`.
fn real_addr(i: usize) -> Option<usize> {
    let p = REAL[i].load(Ordering::Acquire);
    if p != 0 {
        return Some(p);
    }
    ensure_built();
    let p = REAL[i].load(Ordering::Acquire);
    if p == 0 {
        crate::cuda::real::report_missing_driver(NAMES[i].to_str().unwrap_or("?"));
        return None;
    }
    Some(p)
}

/// `p` itself, or the shim's wrapper when `p` is the real address of a table entry.
fn substitute(p: usize) -> usize {
    if p == 0 {
        return 0;
    }
    ensure_built();
    match REAL.iter().position(|r| r.load(Ordering::Acquire) == p) {
        Some(i) => wrappers()[i],
        None => p,
    }
}

/// Swaps a resolver's out-parameter for a wrapper (pointer identity).
///
/// # Safety
/// `pfn` is NULL or the out-parameter a resolver just wrote.
unsafe fn substitute_out(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: a non-NULL out-parameter the resolver wrote (this function's contract).
    let found = unsafe { *pfn } as usize;
    if let Ok(p) = std::panic::catch_unwind(|| substitute(found)) {
        // SAFETY: as above.
        unsafe { *pfn = p as *mut c_void };
    }
}

/// For `dlsym(handle, …)` (not RTLD_DEFAULT/NEXT) whose real answer is `found`: the wrapper
/// when `found` is a tracked driver function. Before the table exists, it is filled from this
/// handle only if the handle reaches a driver and `found` lies in that driver's object. No
/// CUDA call, no `dlopen`, no lock.
///
/// # Safety
/// `handle` is a handle `dlopen` returned and not yet closed (the real `dlsym` just used it).
pub(crate) unsafe fn substitute_from_handle(handle: *mut c_void, found: usize) -> usize {
    if !BUILT.load(Ordering::Acquire) {
        // SAFETY: this function's contract.
        let anchor = unsafe { real_dlsym_not_ours(handle, NAMES[Idx::cuGetProcAddress as usize]) };
        if anchor == 0 {
            return found;
        }
        let base = object_base(anchor);
        if base.is_none() || object_base(found) != base {
            return found;
        }
        // SAFETY: this function's contract.
        unsafe { build_from(handle) };
    }
    match REAL.iter().position(|r| r.load(Ordering::Acquire) == found) {
        Some(i) => wrappers()[i],
        None => found,
    }
}

/// The shim's wrapper for a resolver's answer (for the runtime's `cudaGetDriverEntryPoint*`).
///
/// # Safety
/// `pfn` is NULL or the out-parameter the resolver just wrote.
pub(crate) unsafe fn substitute_entry_point(pfn: *mut *mut c_void) {
    // SAFETY: this function's contract.
    unsafe { substitute_out(pfn) }
}

/// (host?, device) of a `CUmemAllocationProp`; NULL → the current device.
///
/// # Safety
/// `prop` is NULL or points to a `CUmemAllocationProp`.
unsafe fn location_of(prop: *const CUmemAllocationProp) -> (bool, i32) {
    if prop.is_null() {
        return (false, current_device());
    }
    // SAFETY: a non-NULL `CUmemAllocationProp` (this function's contract).
    let loc = unsafe { &(*prop).location };
    if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        (false, loc.id)
    } else {
        (true, -1)
    }
}

/// An out-parameter's value, 0 for NULL.
///
/// # Safety
/// `out` is NULL or points to a readable `CUdeviceptr`.
unsafe fn read(out: *mut CUdeviceptr) -> u64 {
    if out.is_null() {
        0
    } else {
        // SAFETY: non-NULL and readable (this function's contract).
        unsafe { *out }
    }
}

/// An out-parameter's value, 0 for NULL.
///
/// # Safety
/// `out` is NULL or points to a readable pointer.
unsafe fn read_host(out: *mut *mut c_void) -> u64 {
    if out.is_null() {
        0
    } else {
        // SAFETY: non-NULL and readable (this function's contract).
        (unsafe { *out }) as u64
    }
}

fn oom(api: Api, bytes: u64, device: i32, rc: CUresult, stream: usize) {
    shim::on_oom(&DRIVER, api, bytes, device, rc, stream);
}

fn after_alloc(guard: &Guard, api: Api, rc: CUresult, addr: u64, bytes: u64, stream: usize) {
    super::boundary::after_alloc(&DRIVER, guard, api, rc, addr as usize, bytes, stream);
}

fn free_with(guard: Option<&Guard>, ptr: u64, real_free: impl FnOnce() -> CUresult) -> CUresult {
    super::boundary::free_with(guard, ptr as usize, real_free)
}

// The shared bookkeeping (`crate::shim::on_alloc`) compares with the runtime's codes; the
// driver's are the same numbers.
const _: () = assert!(
    CUDA_SUCCESS == cuda_error::SUCCESS
        && CUDA_ERROR_OUT_OF_MEMORY == cuda_error::MEMORY_ALLOCATION
);
