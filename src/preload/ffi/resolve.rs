//! The CUDA runtime's driver-entry-point resolvers (`cudaGetDriverEntryPoint*`): PyTorch's
//! expandable segments get `cuMemCreate`/`cuMemMap`/… through them. Each calls the real runtime
//! function and, on success, swaps the returned pointer for the shim's wrapper when it is the
//! real address of a tracked driver function (pointer identity, [`super::driver`]).

#![allow(non_snake_case, reason = "CUDA's exported names")]

use super::cuda_error::{INITIALIZATION_ERROR, SUCCESS};
use super::driver::substitute_entry_point;
use super::RealFn;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// The runtime resolvers the shim exports.
pub const RUNTIME_RESOLVERS: &[&str] = &[
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPoint_ptsz",
    "cudaGetDriverEntryPointByVersion",
    "cudaGetDriverEntryPointByVersion_ptsz",
];

macro_rules! entry_point {
    ($name:ident, $real:literal) => {
        /// `cudaError_t (const char* symbol, void** funcPtr, unsigned long long flags,
        /// cudaDriverEntryPointQueryResult* driverStatus)`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            symbol: *const c_char,
            func_ptr: *mut *mut c_void,
            flags: u64,
            status: *mut c_int,
        ) -> c_int {
            static REAL: RealFn = RealFn::new($real);
            let Some(p) = REAL.get() else {
                return INITIALIZATION_ERROR;
            };
            let real: unsafe extern "C" fn(
                *const c_char,
                *mut *mut c_void,
                u64,
                *mut c_int,
            ) -> c_int = std::mem::transmute(p);
            let rc = real(symbol, func_ptr, flags, status);
            if rc == SUCCESS {
                substitute_entry_point(func_ptr);
            }
            rc
        }
    };
}

macro_rules! entry_point_by_version {
    ($name:ident, $real:literal) => {
        /// `cudaError_t (const char* symbol, void** funcPtr, unsigned int cudaVersion,
        /// unsigned long long flags, cudaDriverEntryPointQueryResult* driverStatus)`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            symbol: *const c_char,
            func_ptr: *mut *mut c_void,
            cuda_version: c_uint,
            flags: u64,
            status: *mut c_int,
        ) -> c_int {
            static REAL: RealFn = RealFn::new($real);
            let Some(p) = REAL.get() else {
                return INITIALIZATION_ERROR;
            };
            let real: unsafe extern "C" fn(
                *const c_char,
                *mut *mut c_void,
                c_uint,
                u64,
                *mut c_int,
            ) -> c_int = std::mem::transmute(p);
            let rc = real(symbol, func_ptr, cuda_version, flags, status);
            if rc == SUCCESS {
                substitute_entry_point(func_ptr);
            }
            rc
        }
    };
}

entry_point!(cudaGetDriverEntryPoint, c"cudaGetDriverEntryPoint");
entry_point!(
    cudaGetDriverEntryPoint_ptsz,
    c"cudaGetDriverEntryPoint_ptsz"
);
entry_point_by_version!(
    cudaGetDriverEntryPointByVersion,
    c"cudaGetDriverEntryPointByVersion"
);
entry_point_by_version!(
    cudaGetDriverEntryPointByVersion_ptsz,
    c"cudaGetDriverEntryPointByVersion_ptsz"
);
