//! The device queries the shim asks of each CUDA layer (never exports: the hooks and the
//! failure context call them), and each layer's set of them as a [`Layer`]. Both layers report
//! success as 0 and out-of-memory as 2 (`cudaErrorMemoryAllocation`, `CUDA_ERROR_OUT_OF_MEMORY`),
//! so only these queries differ.

use crate::cuda::real::RealFn;
use std::ffi::c_int;

/// What the bookkeeping shared by the runtime hooks and the driver hooks asks of its layer.
pub struct Layer {
    /// The calling thread's current device (no context is created by asking).
    pub current_device: fn() -> i32,
    /// (free, total) of the calling thread's current device.
    pub mem_info: fn() -> Option<(u64, u64)>,
    pub device_name: fn(i32) -> Option<String>,
    /// The runtime's version, where this layer can tell it.
    pub runtime_version: fn() -> Option<i32>,
}

/// The driver layer's answers.
pub static DRIVER: Layer = Layer {
    current_device: driver::current_device,
    mem_info: driver::mem_info,
    device_name: driver::device_name,
    runtime_version: || None,
};

/// The runtime layer's answers.
pub static RUNTIME: Layer = Layer {
    current_device: runtime::current_device,
    mem_info: runtime::mem_info,
    device_name: runtime::device_name,
    runtime_version: runtime::runtime_version,
};

/// The layer an on-demand dump asks through: the runtime when the process has one, else the
/// driver (a static runtime or a driver-only program): never a "not found" message for the
/// absent one.
pub fn present_layer() -> &'static Layer {
    // SAFETY: `cudaError_t cudaGetDevice(int *device)`.
    static GET_DEVICE: RealFn<unsafe extern "C" fn(*mut c_int) -> c_int> =
        unsafe { RealFn::optional(c"cudaGetDevice") };
    if GET_DEVICE.get().is_some() {
        &RUNTIME
    } else {
        &DRIVER
    }
}

/// A positive version number from a `(int *version)` query (`cuDriverGetVersion`,
/// `cudaRuntimeGetVersion`), when the function exists and succeeds.
fn version_of(get: &RealFn<unsafe extern "C" fn(*mut c_int) -> c_int>) -> Option<i32> {
    let f = get.get()?;
    let mut v: c_int = 0;
    // SAFETY: a valid out-parameter.
    (unsafe { f(&mut v) } == oomshim_host::sys::cuda_error::SUCCESS && v > 0).then_some(v)
}

/// Driver functions the shim calls itself, through their own [`RealFn`]s.
pub mod driver {
    use crate::cuda::real::RealFn;
    use oomshim_host::sys::cuda_error::SUCCESS;
    use std::ffi::{c_char, c_int, CStr};

    /// The calling thread's current device (its context's), or 0.
    pub fn current_device() -> i32 {
        // SAFETY: `CUresult cuCtxGetDevice(CUdevice *device)`.
        static GET: RealFn<unsafe extern "C" fn(*mut c_int) -> c_int> =
            unsafe { RealFn::driver(c"cuCtxGetDevice") };
        let Some(f) = GET.get() else { return 0 };
        let mut d: c_int = 0;
        // SAFETY: a valid out-parameter.
        if unsafe { f(&mut d) } == SUCCESS {
            d
        } else {
            0
        }
    }

    /// (free, total) of the calling thread's current device, from `cuMemGetInfo_v2`.
    pub fn mem_info() -> Option<(u64, u64)> {
        // SAFETY: `CUresult cuMemGetInfo_v2(size_t *free, size_t *total)`.
        static GET: RealFn<unsafe extern "C" fn(*mut usize, *mut usize) -> c_int> =
            unsafe { RealFn::driver(c"cuMemGetInfo_v2") };
        let f = GET.get()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-parameters.
        (unsafe { f(&mut free, &mut total) } == SUCCESS).then_some((free as u64, total as u64))
    }

    pub fn device_name(device: i32) -> Option<String> {
        // SAFETY: `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
        static GET: RealFn<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int> =
            unsafe { RealFn::driver(c"cuDeviceGetName") };
        let f = GET.get()?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes.
        if unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, device) } != SUCCESS {
            return None;
        }
        buf[255] = 0;
        // SAFETY: NUL-terminated by the line above at the latest.
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Some(name.to_string_lossy().into_owned())
    }

    /// The GPU UUID of CUDA ordinal `device` (`GPU-…`, nvidia-smi's form), from
    /// `cuDeviceGetUuid_v2` (or `cuDeviceGetUuid` on drivers before 11.4): a context-free query.
    pub fn device_uuid(device: i32) -> Option<String> {
        type GetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
        // SAFETY: `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
        static GET_DEVICE: RealFn<unsafe extern "C" fn(*mut c_int, c_int) -> c_int> =
            unsafe { RealFn::driver(c"cuDeviceGet") };
        // SAFETY: `CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)`; `CUuuid` is 16 bytes.
        static V2: RealFn<GetUuid> = unsafe { RealFn::driver(c"cuDeviceGetUuid_v2") };
        // SAFETY: `cuDeviceGetUuid` has the same signature.
        static V1: RealFn<GetUuid> = unsafe { RealFn::driver(c"cuDeviceGetUuid") };
        let get_device = GET_DEVICE.get()?;
        let get_uuid = V2.get().or_else(|| V1.get())?;
        let mut dev: c_int = 0;
        // SAFETY: a valid out-parameter.
        if unsafe { get_device(&mut dev, device) } != SUCCESS {
            return None;
        }
        let mut bytes = [0u8; 16];
        // SAFETY: a valid 16-byte out-parameter.
        (unsafe { get_uuid(&mut bytes, dev) } == SUCCESS)
            .then(|| oomshim_core::facts::gpu_processes::uuid_string(&bytes))
    }

    /// `cuDriverGetVersion`: context-free.
    pub fn driver_version() -> Option<i32> {
        // SAFETY: `CUresult cuDriverGetVersion(int *version)`.
        static GET: RealFn<unsafe extern "C" fn(*mut c_int) -> c_int> =
            unsafe { RealFn::driver(c"cuDriverGetVersion") };
        super::version_of(&GET)
    }
}

/// The runtime layer's device queries, shared by the hooks, `oomshim_dump` and allocator mode:
/// one lookup of each real function.
pub mod runtime {
    use crate::cuda::real::{real_fn, RealFn};
    use oomshim_host::sys::cuda_error::SUCCESS;
    use std::ffi::{c_int, CStr};

    /// The calling thread's current device, from the real runtime (no context is created by it);
    /// `None` when the runtime is missing or the call fails.
    pub fn runtime_device() -> Option<i32> {
        let f = real_fn!(c"cudaGetDevice", unsafe extern "C" fn(*mut c_int) -> c_int)?;
        let mut d: c_int = 0;
        // SAFETY: a valid out-parameter.
        (unsafe { f(&mut d) } == SUCCESS).then_some(d)
    }

    /// The calling thread's current device, 0 when the runtime cannot tell.
    pub fn current_device() -> i32 {
        runtime_device().unwrap_or(0)
    }

    /// (free, total) bytes of the calling thread's current device.
    pub fn mem_info() -> Option<(u64, u64)> {
        let f = real_fn!(
            c"cudaMemGetInfo",
            unsafe extern "C" fn(*mut usize, *mut usize) -> c_int
        )?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-parameters.
        (unsafe { f(&mut free, &mut total) } == SUCCESS).then_some((free as u64, total as u64))
    }

    /// The device's name: the leading `char name[256]` of `cudaDeviceProp`, whatever its version.
    pub fn device_name(device: i32) -> Option<String> {
        type GetProperties = unsafe extern "C" fn(*mut u8, c_int) -> c_int;
        // SAFETY: `cudaError_t cudaGetDeviceProperties_v2(cudaDeviceProp *prop, int device)`.
        static V2: RealFn<GetProperties> =
            unsafe { RealFn::optional(c"cudaGetDeviceProperties_v2") };
        // SAFETY: `cudaGetDeviceProperties` has the same signature.
        static V1: RealFn<GetProperties> = unsafe { RealFn::optional(c"cudaGetDeviceProperties") };
        let f = V2.get().or_else(|| V1.get())?;
        // Far larger than any cudaDeviceProp so far (about 1 KiB), so any version fits.
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: the buffer is larger than any `cudaDeviceProp`.
        if unsafe { f(buf.as_mut_ptr(), device) } != SUCCESS {
            return None;
        }
        let name = CStr::from_bytes_until_nul(&buf[..256]).ok()?;
        Some(name.to_string_lossy().into_owned())
    }

    /// `cudaRuntimeGetVersion` of the runtime in the process (optional: no message when absent).
    pub fn runtime_version() -> Option<i32> {
        // SAFETY: `cudaError_t cudaRuntimeGetVersion(int *version)`.
        static GET: RealFn<unsafe extern "C" fn(*mut c_int) -> c_int> =
            unsafe { RealFn::optional(c"cudaRuntimeGetVersion") };
        super::version_of(&GET)
    }
}
