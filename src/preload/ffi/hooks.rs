//! The exported functions. Each hook calls the real function exactly once with exactly the
//! caller's arguments, returns exactly its result, and only reads out-parameters after a
//! success (never dereferencing NULL). Recording happens after the call, inside the guard.

#![allow(non_snake_case, reason = "CUDA's exported names")]

use super::cuda_error::{INITIALIZATION_ERROR, SUCCESS};
use super::real::real_fn;
use super::{Guard, RealFn};
use crate::live;
use oomshim_core::ledger::Api;
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

/// Resolves the real function of the given type, or returns the runtime's error from the hook.
macro_rules! real {
    ($name:literal, $ty:ty) => {{
        match real_fn!($name, $ty) {
            Some(f) => f,
            None => return INITIALIZATION_ERROR,
        }
    }};
}

unsafe fn read_ptr(out: *mut *mut c_void) -> usize {
    if out.is_null() {
        0
    } else {
        *out as usize
    }
}

// The runtime layer's device queries, shared by the hooks here and allocator mode
// (`torch_alloc.rs`): one lookup of each real function.

/// The calling thread's current device, from the real runtime (no context is created by it);
/// `None` when the runtime is missing or the call fails.
pub(super) fn runtime_device() -> Option<i32> {
    let f = real_fn!(c"cudaGetDevice", unsafe extern "C" fn(*mut c_int) -> c_int)?;
    let mut d: c_int = 0;
    (unsafe { f(&mut d) } == SUCCESS).then_some(d)
}

/// The calling thread's current device, 0 when the runtime cannot tell.
fn current_device() -> i32 {
    runtime_device().unwrap_or(0)
}

/// (free, total) bytes of the calling thread's current device.
pub(super) fn mem_info() -> Option<(u64, u64)> {
    let f = real_fn!(
        c"cudaMemGetInfo",
        unsafe extern "C" fn(*mut usize, *mut usize) -> c_int
    )?;
    let (mut free, mut total) = (0usize, 0usize);
    (unsafe { f(&mut free, &mut total) } == SUCCESS).then_some((free as u64, total as u64))
}

/// The device's name: the leading `char name[256]` of `cudaDeviceProp`, whatever its version.
fn device_name(device: i32) -> Option<String> {
    static V2: RealFn = RealFn::optional(c"cudaGetDeviceProperties_v2");
    static V1: RealFn = RealFn::optional(c"cudaGetDeviceProperties");
    let p = V2.get().or_else(|| V1.get())?;
    let f: unsafe extern "C" fn(*mut u8, c_int) -> c_int = unsafe { std::mem::transmute(p) };
    // Far larger than any cudaDeviceProp so far (about 1 KiB), so any version fits.
    let mut buf = vec![0u8; 16 * 1024];
    if unsafe { f(buf.as_mut_ptr(), device) } != SUCCESS {
        return None;
    }
    let name = CStr::from_bytes_until_nul(&buf[..256]).ok()?;
    Some(name.to_string_lossy().into_owned())
}

/// The runtime layer's answers for the shared bookkeeping (`super::after_alloc`).
static RUNTIME: super::Layer = super::Layer {
    current_device,
    mem_info,
    device_name,
    runtime_version,
};

fn after_alloc(guard: &Guard, api: Api, rc: c_int, addr: usize, bytes: u64, stream: usize) {
    super::after_alloc(&RUNTIME, guard, api, rc, addr, bytes, stream);
}

fn free_with(guard: Option<&Guard>, ptr: *mut c_void, real_free: impl FnOnce() -> c_int) -> c_int {
    super::free_with(guard, ptr as usize, real_free)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> c_int {
    let real = real!(
        c"cudaMalloc",
        unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int
    );
    let guard = Guard::enter();
    let rc = real(dev_ptr, size);
    if let Some(g) = &guard {
        after_alloc(g, Api::CudaMalloc, rc, read_ptr(dev_ptr), size as u64, 0);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> c_int {
    let real = real!(c"cudaFree", unsafe extern "C" fn(*mut c_void) -> c_int);
    let guard = Guard::enter();
    free_with(guard.as_ref(), dev_ptr, || real(dev_ptr))
}

/// A hook for a stream-ordered allocation function (and, invoked again, its per-thread-stream
/// `_ptsz` twin: same signature, different real function).
macro_rules! async_alloc_hook {
    ($name:ident, $real:literal, $api:expr, ($($arg:ident : $ty:ty),*), $stream:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev_ptr: *mut *mut c_void, size: usize $(, $arg: $ty)*) -> c_int {
            let real = real!($real, unsafe extern "C" fn(*mut *mut c_void, usize $(, $ty)*) -> c_int);
            let guard = Guard::enter();
            let rc = real(dev_ptr, size $(, $arg)*);
            if let Some(g) = &guard {
                after_alloc(g, $api, rc, read_ptr(dev_ptr), size as u64, $stream as usize);
            }
            rc
        }
    };
}

async_alloc_hook!(cudaMallocAsync, c"cudaMallocAsync", Api::CudaMallocAsync, (stream: Stream), stream);
async_alloc_hook!(cudaMallocAsync_ptsz, c"cudaMallocAsync_ptsz", Api::CudaMallocAsync, (stream: Stream), stream);
async_alloc_hook!(
    cudaMallocFromPoolAsync,
    c"cudaMallocFromPoolAsync",
    Api::CudaMallocFromPoolAsync,
    (pool: MemPool, stream: Stream),
    stream
);
async_alloc_hook!(
    cudaMallocFromPoolAsync_ptsz,
    c"cudaMallocFromPoolAsync_ptsz",
    Api::CudaMallocFromPoolAsync,
    (pool: MemPool, stream: Stream),
    stream
);

macro_rules! async_free_hook {
    ($name:ident, $real:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dev_ptr: *mut c_void, stream: Stream) -> c_int {
            let real = real!($real, unsafe extern "C" fn(*mut c_void, Stream) -> c_int);
            let guard = Guard::enter();
            free_with(guard.as_ref(), dev_ptr, || real(dev_ptr, stream))
        }
    };
}

async_free_hook!(cudaFreeAsync, c"cudaFreeAsync");
async_free_hook!(cudaFreeAsync_ptsz, c"cudaFreeAsync_ptsz");

#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(
    dev_ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> c_int {
    let real = real!(
        c"cudaMallocManaged",
        unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int
    );
    let guard = Guard::enter();
    let rc = real(dev_ptr, size, flags);
    if let Some(g) = &guard {
        after_alloc(
            g,
            Api::CudaMallocManaged,
            rc,
            read_ptr(dev_ptr),
            size as u64,
            0,
        );
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(
    dev_ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> c_int {
    let real = real!(
        c"cudaMallocPitch",
        unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> c_int
    );
    let guard = Guard::enter();
    let rc = real(dev_ptr, pitch, width, height);
    if let Some(g) = &guard {
        // The allocation holds pitch × height bytes; before success only width × height is known.
        let row = if rc == SUCCESS && !pitch.is_null() {
            *pitch
        } else {
            width
        };
        let bytes = (row as u64).saturating_mul(height as u64);
        after_alloc(g, Api::CudaMallocPitch, rc, read_ptr(dev_ptr), bytes, 0);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc3D(pitched: *mut CudaPitchedPtr, extent: CudaExtent) -> c_int {
    let real = real!(
        c"cudaMalloc3D",
        unsafe extern "C" fn(*mut CudaPitchedPtr, CudaExtent) -> c_int
    );
    let guard = Guard::enter();
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
        after_alloc(g, Api::CudaMalloc3D, rc, addr, bytes, 0);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    let real = real!(
        c"cudaMallocHost",
        unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int
    );
    let guard = Guard::enter();
    let rc = real(ptr, size);
    if let Some(g) = &guard {
        after_alloc(g, Api::CudaMallocHost, rc, read_ptr(ptr), size as u64, 0);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    let real = real!(
        c"cudaHostAlloc",
        unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int
    );
    let guard = Guard::enter();
    let rc = real(ptr, size, flags);
    if let Some(g) = &guard {
        after_alloc(g, Api::CudaHostAlloc, rc, read_ptr(ptr), size as u64, 0);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    let real = real!(c"cudaFreeHost", unsafe extern "C" fn(*mut c_void) -> c_int);
    let guard = Guard::enter();
    free_with(guard.as_ref(), ptr, || real(ptr))
}

/// `cudaRuntimeGetVersion` of the runtime in the process (optional: no message when absent).
fn runtime_version() -> Option<i32> {
    static GET: RealFn = RealFn::optional(c"cudaRuntimeGetVersion");
    let f: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(GET.get()?) };
    let mut v: c_int = 0;
    (unsafe { f(&mut v) } == SUCCESS && v > 0).then_some(v)
}

/// The `oomshim_*` functions programs (and oomshim's Python package and hook) call.
pub const PROGRAM_API: &[&str] = &[
    "oomshim_dump",
    "oomshim_step",
    "oomshim_mark_step",
    "oomshim_mark_step_live",
    "oomshim_framework_attached",
    "oomshim_framework_oom",
    "oomshim_set_recording",
    "oomshim_recording",
];

/// Switches what the shim records from now on: 0 pass-through (the hooks only forward), 1
/// totals (sizes and totals, no stacks), 2 native stacks, 3 all stacks (native and Python), 4
/// Python stacks. Safe at any moment: an allocation made in one mode may be freed in any other.
/// Returns the mode before, or -1 when `mode` is unknown (nothing changes) or the shim is off.
/// For benchmarks that alternate modes inside one process.
#[no_mangle]
pub unsafe extern "C" fn oomshim_set_recording(mode: c_int) -> c_int {
    let Some(mode) = live::Recording::from_code(mode) else {
        return -1;
    };
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    guard
        .run(|| live::set_recording(mode))
        .flatten()
        .map_or(-1, |before| before as c_int)
}

/// The recording mode now (the numbers of [`oomshim_set_recording`]), -1 when the shim is off.
#[no_mangle]
pub unsafe extern "C" fn oomshim_recording() -> c_int {
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    guard
        .run(live::current_recording)
        .flatten()
        .map_or(-1, |m| m as c_int)
}

/// Marks the end of a training step: the shim samples live device bytes per allocation site
/// (see the dump's `growth` key). One walk of the live allocations, off the allocation path:
/// cheap enough for every step.
#[no_mangle]
pub unsafe extern "C" fn oomshim_step() {
    if let Some(guard) = Guard::enter() {
        guard.run(|| live::step(live::StepSource::Program, None));
    }
}

/// A step boundary found by `source`: 0 the program itself (the same as `oomshim_step`), 1 an
/// optimizer step, 2 a forward pass of the program's outermost module (the last two are marked by
/// oomshim's Python hook). Other values are ignored. Returns 1 when the process has grown
/// steadily with these steps so far (the hook then asks torch to record where new tensors come
/// from), else 0.
#[no_mangle]
pub unsafe extern "C" fn oomshim_mark_step(source: c_int) -> c_int {
    mark_step(source, None)
}

/// [`oomshim_mark_step`], with the framework's own count of its live tensors at this step
/// (torch's `memory_stats()`: allocated bytes, and the number of allocations, `u64::MAX` when
/// unknown): under preload the shim sees torch's segments, whose cache grows with varying
/// shapes although no tensor is kept; the leak is judged on these.
#[no_mangle]
pub unsafe extern "C" fn oomshim_mark_step_live(
    source: c_int,
    live_bytes: u64,
    live_allocations: u64,
) -> c_int {
    mark_step(
        source,
        Some(live::FrameworkLive::new(live_bytes, live_allocations)),
    )
}

fn mark_step(source: c_int, live: Option<live::FrameworkLive>) -> c_int {
    let Some(source) = live::StepSource::from_code(source) else {
        return 0;
    };
    let Some(guard) = Guard::enter() else {
        return 0;
    };
    guard
        .run(|| {
            live::step(source, live);
            live::growing(source)
        })
        .map_or(0, c_int::from)
}

/// oomshim's Python hook attached to a framework's out-of-memory reporting (torch's OOM
/// observer): failures then wait for the framework's word. `name` is informational.
#[no_mangle]
pub unsafe extern "C" fn oomshim_framework_attached(_name: *const c_char) {
    if let Some(guard) = Guard::enter() {
        guard.run(live::framework_attached);
    }
}

/// The framework raised its out-of-memory error on the calling thread. `json`/`len`: the
/// framework's account as UTF-8 JSON (schema `oomshim.framework-oom/1`, see
/// `crate::live::framework`). Returns once the dump that explains the failure is written
/// (bounded): its path is copied into `path_out` (`cap` bytes, NUL-terminated; may be NULL) and
/// 0 is returned when the account is in that dump, 1 when the dump was final before it arrived,
/// 2 when the failure repeats an earlier dumped one; -1 when no dump explains the failure.
#[no_mangle]
pub unsafe extern "C" fn oomshim_framework_oom(
    json: *const c_char,
    len: usize,
    path_out: *mut c_char,
    cap: usize,
) -> c_int {
    if json.is_null() || len > live::framework::MAX_REPORT_BYTES {
        return -1;
    }
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    let bytes = std::slice::from_raw_parts(json.cast::<u8>(), len);
    let path = guard
        .run(|| {
            let (note, mem_info) = live::framework::parse(bytes)?;
            live::framework_oom(note, mem_info)
        })
        .flatten();
    match path {
        Some((p, word)) => {
            if !path_out.is_null() && cap > 0 {
                let text = p.to_string_lossy();
                let n = text.len().min(cap - 1);
                std::ptr::copy_nonoverlapping(text.as_ptr(), path_out.cast::<u8>(), n);
                *path_out.add(n) = 0;
            }
            word as c_int
        }
        None => -1,
    }
}

/// Writes a dump now. `reason` (may be NULL) is recorded in the dump's `reason` key.
/// Returns 0 when a dump was written, -1 otherwise (the reason is printed on stderr).
#[no_mangle]
pub unsafe extern "C" fn oomshim_dump(reason: *const c_char) -> c_int {
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    let reason = if reason.is_null() {
        "on-demand".to_string()
    } else {
        live::dump_reason(CStr::from_ptr(reason).to_bytes())
    };
    let written = guard.run(|| {
        // Through the runtime when the process has one, else through the driver (a static
        // runtime or a driver-only program): never a "not found" message for the absent one.
        static RUNTIME: RealFn = RealFn::optional(c"cudaGetDevice");
        type Ask = (
            fn() -> i32,
            fn() -> Option<(u64, u64)>,
            fn(i32) -> Option<String>,
        );
        let (current, info_of, name_of): Ask = if RUNTIME.get().is_some() {
            (current_device, mem_info, device_name)
        } else {
            (
                super::driver::current_device,
                super::driver::mem_info,
                super::driver::device_name,
            )
        };
        let device = live::device_for_on_demand_dump(current);
        live::dump_now(&reason, super::on_demand_context(device, info_of, name_of))
    });
    match written {
        Some(true) => 0,
        _ => -1,
    }
}
