//! The CUDA runtime API: exported wrappers of the runtime's allocation functions and of its
//! driver-entry-point resolvers, and the runtime layer's device queries.
//!
//! [`runtime_functions!`] is the single list, as [`super::driver`]'s is for the driver: one row
//! per exported function (its exact name, its signature, the [`Api`] it records, and what it
//! does around the real call) generates the exported wrapper, the lazily resolved real function
//! and [`exported_names`]. Adding a hooked runtime function is one row.
//!
//! Each hook calls the real function exactly once with exactly the caller's arguments, returns
//! exactly its result, and only reads out-parameters after a success (never dereferencing
//! NULL). Recording happens after the call, inside the guard. A hook whose real function
//! cannot be found returns `cudaErrorInitializationError`, the runtime's own answer when it
//! cannot start.

#![allow(non_snake_case, reason = "CUDA's exported names")]

use super::boundary::cstr;
use super::driver::substitute_entry_point;
use crate::cuda::queries::RUNTIME;
use crate::cuda::real::real_fn;
use oomshim_host::ledger::Api;
use oomshim_host::sys::cuda_error::{INITIALIZATION_ERROR, SUCCESS};
use oomshim_host::sys::Guard;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type Stream = *mut c_void;
type MemPool = *mut c_void;

/// `struct cudaExtent`, passed by value to cudaMalloc3D.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `struct cudaPitchedPtr`, written by cudaMalloc3D.
#[repr(C)]
pub struct CudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// Generates, from one list: the exported wrappers, [`NAMES`] (exact exported names, in table
/// order) and `apis()` (the [`Api`] each records, `None` for frees and resolvers). Each entry:
/// `name [+ twin](args) [as Api] |real[, guard]| body` (`twin`: a second exported name with the
/// same signature and body, such as the `_ptsz` per-thread-default-stream variant) where `real` is the real function (already found;
/// a missing one returns `cudaErrorInitializationError`), `guard` the `Option<Guard>` of this
/// call (a row without it never enters the shim: the resolvers only swap a pointer), and `API`
/// the row's [`Api`] inside its body.
macro_rules! runtime_functions {
    ($(
        $name:ident $(+ $twin:ident)? ( $($arg:ident : $ty:ty),* ) $(as $api:ident)?
        |$real:ident $(, $guard:ident)?| $body:block
    )*) => {
        /// Exact exported names, in table order (a row's twin right after it).
        pub(crate) const NAMES: &[&CStr] = &[$(
            cstr(concat!(stringify!($name), "\0")),
            $( cstr(concat!(stringify!($twin), "\0")), )?
        )*];

        /// The [`Api`] each exported name records, in the order of [`NAMES`].
        #[cfg(test)]
        pub(crate) fn apis() -> Vec<Option<Api>> {
            [$( &runtime_functions!(@apis [$name $($twin)?] [$($api)?])[..], )*].concat()
        }

        $(
            runtime_functions!(
                @fns [$name $($twin)?] ($($arg: $ty),*) [$($api)?] [$real $(, $guard)?] $body
            );
        )*
    };
    // One function per name of a row: the row's own and its twin's, the same body.
    (@fns [$($name:ident)+] $args:tt $api:tt $params:tt $body:block) => {
        $( runtime_functions!(@fn $name $args $api $params $body); )+
    };
    (@fn $name:ident ($($arg:ident : $ty:ty),*) [$($api:ident)?]
        [$real:ident $(, $guard:ident)?] $body:block
    ) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            $( const API: Api = Api::$api; )?
            let Some($real) = real_fn!(
                cstr(concat!(stringify!($name), "\0")),
                unsafe extern "C" fn($($ty),*) -> c_int
            ) else {
                return INITIALIZATION_ERROR;
            };
            $( let $guard = Guard::enter(); )?
            // SAFETY: the caller's arguments, as valid as the runtime API requires of them;
            // the row's body passes them to the real function unchanged and reads an
            // out-parameter only after a success, never through NULL.
            unsafe { $body }
        }
    };
    (@apis [$($name:ident)+] $api:tt) => {
        [$( runtime_functions!(@api $name $api) ),+]
    };
    (@api $name:ident []) => { None };
    (@api $name:ident [$api:ident]) => { Some(Api::$api) };
}

runtime_functions! {
    // ---- device memory ----
    cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) as CudaMalloc |real, guard| {
        let rc = real(dev_ptr, size);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_ptr(dev_ptr), size as u64, 0);
        }
        rc
    }
    cudaFree(dev_ptr: *mut c_void) |real, guard| {
        free_with(guard.as_ref(), dev_ptr, || real(dev_ptr))
    }
    cudaMallocManaged(dev_ptr: *mut *mut c_void, size: usize, flags: c_uint)
        as CudaMallocManaged |real, guard|
    {
        let rc = real(dev_ptr, size, flags);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_ptr(dev_ptr), size as u64, 0);
        }
        rc
    }
    cudaMallocPitch(dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
        as CudaMallocPitch |real, guard|
    {
        let rc = real(dev_ptr, pitch, width, height);
        if let Some(g) = &guard {
            // The allocation holds pitch × height bytes; before success only width × height
            // is known.
            let row = if rc == SUCCESS && !pitch.is_null() { *pitch } else { width };
            let bytes = (row as u64).saturating_mul(height as u64);
            after_alloc(g, API, rc, read_ptr(dev_ptr), bytes, 0);
        }
        rc
    }
    cudaMalloc3D(pitched: *mut CudaPitchedPtr, extent: CudaExtent) as CudaMalloc3D |real, guard| {
        let rc = real(pitched, extent);
        if let Some(g) = &guard {
            let (addr, row) = if rc == SUCCESS && !pitched.is_null() {
                ((*pitched).ptr as usize, (*pitched).pitch)
            } else {
                (0, extent.width)
            };
            let bytes = (row as u64)
                .saturating_mul(extent.height as u64)
                .saturating_mul(extent.depth as u64);
            after_alloc(g, API, rc, addr, bytes, 0);
        }
        rc
    }
    // ---- stream-ordered (`NAME + NAME_ptsz`: the per-thread-default-stream twin, exported with
    // the same signature and body, its own real function) ----
    cudaMallocAsync + cudaMallocAsync_ptsz(dev_ptr: *mut *mut c_void, size: usize, stream: Stream)
        as CudaMallocAsync |real, guard|
    {
        let rc = real(dev_ptr, size, stream);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_ptr(dev_ptr), size as u64, stream as usize);
        }
        rc
    }
    cudaMallocFromPoolAsync + cudaMallocFromPoolAsync_ptsz(
        dev_ptr: *mut *mut c_void,
        size: usize,
        pool: MemPool,
        stream: Stream
    ) as CudaMallocFromPoolAsync |real, guard| {
        let rc = real(dev_ptr, size, pool, stream);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_ptr(dev_ptr), size as u64, stream as usize);
        }
        rc
    }
    cudaFreeAsync + cudaFreeAsync_ptsz(dev_ptr: *mut c_void, stream: Stream) |real, guard| {
        free_with(guard.as_ref(), dev_ptr, || real(dev_ptr, stream))
    }
    // ---- page-locked host memory ----
    cudaMallocHost(ptr: *mut *mut c_void, size: usize) as CudaMallocHost |real, guard| {
        let rc = real(ptr, size);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_ptr(ptr), size as u64, 0);
        }
        rc
    }
    cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint)
        as CudaHostAlloc |real, guard|
    {
        let rc = real(ptr, size, flags);
        if let Some(g) = &guard {
            after_alloc(g, API, rc, read_ptr(ptr), size as u64, 0);
        }
        rc
    }
    cudaFreeHost(ptr: *mut c_void) |real, guard| {
        free_with(guard.as_ref(), ptr, || real(ptr))
    }
    // ---- driver-entry-point resolvers ----
    // PyTorch's expandable segments get `cuMemCreate`/`cuMemMap`/… through these. Each calls
    // the real resolver and, on success, swaps the returned pointer for the shim's wrapper when
    // it is the real address of a tracked driver function (pointer identity, `super::driver`).
    // No guard: nothing is recorded, and a guard held across the real call would hide what the
    // runtime allocates inside it.
    cudaGetDriverEntryPoint + cudaGetDriverEntryPoint_ptsz(
        symbol: *const c_char,
        func_ptr: *mut *mut c_void,
        flags: u64,
        status: *mut c_int
    ) |real| {
        let rc = real(symbol, func_ptr, flags, status);
        if rc == SUCCESS {
            substitute_entry_point(func_ptr);
        }
        rc
    }
    cudaGetDriverEntryPointByVersion + cudaGetDriverEntryPointByVersion_ptsz(
        symbol: *const c_char,
        func_ptr: *mut *mut c_void,
        cuda_version: c_uint,
        flags: u64,
        status: *mut c_int
    ) |real| {
        let rc = real(symbol, func_ptr, cuda_version, flags, status);
        if rc == SUCCESS {
            substitute_entry_point(func_ptr);
        }
        rc
    }
}

/// The exact names of the runtime functions the shim exports (from the single table).
pub fn exported_names() -> Vec<&'static str> {
    NAMES.iter().map(|n| n.to_str().unwrap_or("?")).collect()
}

/// An out-parameter's value, 0 for NULL.
///
/// # Safety
/// `out` is NULL or points to a readable pointer.
unsafe fn read_ptr(out: *mut *mut c_void) -> usize {
    if out.is_null() {
        0
    } else {
        // SAFETY: non-NULL and readable (this function's contract).
        (unsafe { *out }) as usize
    }
}

fn after_alloc(guard: &Guard, api: Api, rc: c_int, addr: usize, bytes: u64, stream: usize) {
    super::boundary::after_alloc(&RUNTIME, guard, api, rc, addr, bytes, stream);
}

fn free_with(guard: Option<&Guard>, ptr: *mut c_void, real_free: impl FnOnce() -> c_int) -> c_int {
    super::boundary::free_with(guard, ptr as usize, real_free)
}
