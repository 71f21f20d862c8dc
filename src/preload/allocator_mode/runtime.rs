//! The real CUDA runtime functions allocator mode calls, looked up once each: its segments,
//! events and stream-capture checks go through [`CUDA`], the [`CudaRuntime`] the allocator is
//! handed on every call (tests hand it a simulated one).

use super::{Call, CudaRuntime};
use crate::cuda::real::RealFn;
use oomshim_host::sys::cuda_error::SUCCESS;
use std::ffi::{c_int, c_void};

type Stream = *mut c_void;

// The real runtime functions allocator mode calls, each with its C signature.
type SetDevice = unsafe extern "C" fn(c_int) -> c_int;
type GetLastError = unsafe extern "C" fn() -> c_int;
type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type ExchangeCaptureMode = unsafe extern "C" fn(*mut c_int) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void) -> c_int;
type EventCreate = unsafe extern "C" fn(*mut *mut c_void, u32) -> c_int;
type EventRecord = unsafe extern "C" fn(*mut c_void, Stream) -> c_int;
type EventQuery = unsafe extern "C" fn(*mut c_void) -> c_int;
type EventDestroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetCaptureInfo = unsafe extern "C" fn(
    Stream,
    *mut c_int,
    *mut u64,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut usize,
) -> c_int;

// SAFETY: each type is the C signature of the function its static names, `cudaError_t`
// being a C int; so for every static below ("as above").
static SET_DEVICE: RealFn<SetDevice> = unsafe { RealFn::new(c"cudaSetDevice") };
// SAFETY: as above.
static GET_LAST_ERROR: RealFn<GetLastError> = unsafe { RealFn::new(c"cudaGetLastError") };
// SAFETY: as above.
static MALLOC: RealFn<Malloc> = unsafe { RealFn::new(c"cudaMalloc") };
// SAFETY: as above.
static EXCHANGE_CAPTURE_MODE: RealFn<ExchangeCaptureMode> =
    unsafe { RealFn::new(c"cudaThreadExchangeStreamCaptureMode") };
// SAFETY: as above.
static FREE: RealFn<Free> = unsafe { RealFn::new(c"cudaFree") };
// SAFETY: as above.
static EVENT_CREATE: RealFn<EventCreate> = unsafe { RealFn::new(c"cudaEventCreateWithFlags") };
// SAFETY: as above.
static EVENT_RECORD: RealFn<EventRecord> = unsafe { RealFn::new(c"cudaEventRecord") };
// SAFETY: as above.
static EVENT_QUERY: RealFn<EventQuery> = unsafe { RealFn::new(c"cudaEventQuery") };
// SAFETY: as above.
static EVENT_DESTROY: RealFn<EventDestroy> = unsafe { RealFn::new(c"cudaEventDestroy") };
// SAFETY: as above.
static GET_CAPTURE_INFO: RealFn<GetCaptureInfo> =
    unsafe { RealFn::new(c"cudaStreamGetCaptureInfo") };

/// The real CUDA runtime, as allocator mode calls it (`crate::allocator_mode::source`):
/// pointers and streams as integers, out-parameters as return values.
pub struct RealCuda;

/// What allocator mode is handed on every call.
pub static CUDA: RealCuda = RealCuda;

impl CudaRuntime for RealCuda {
    fn current_device(&self) -> Option<i32> {
        crate::cuda::queries::runtime::runtime_device()
    }

    fn set_device(&self, device: i32) -> bool {
        match SET_DEVICE.get() {
            // SAFETY: `cudaError_t cudaSetDevice(int)`, a plain value argument.
            Some(f) => unsafe { f(device) == SUCCESS },
            None => false,
        }
    }

    fn clear_last_error(&self) {
        if let Some(f) = GET_LAST_ERROR.get() {
            // SAFETY: `cudaError_t cudaGetLastError(void)`: no argument, no precondition.
            unsafe { f() };
        }
    }

    fn found(&self, call: Call) -> bool {
        match call {
            Call::Malloc => MALLOC.get().is_some(),
            Call::Free => FREE.get().is_some(),
            Call::EventCreate => EVENT_CREATE.get().is_some(),
            Call::EventRecord => EVENT_RECORD.get().is_some(),
            Call::ExchangeCaptureMode => EXCHANGE_CAPTURE_MODE.get().is_some(),
        }
    }

    fn malloc(&self, bytes: usize) -> Option<(i32, u64)> {
        let f = MALLOC.get()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `cudaMalloc(void **, size_t)` with a valid out-parameter.
        let rc = unsafe { f(&mut p, bytes) };
        Some((rc, p as u64))
    }

    fn exchange_capture_mode(&self, mode: &mut i32) -> Option<i32> {
        let f = EXCHANGE_CAPTURE_MODE.get()?;
        // SAFETY: `cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *)` with a valid
        // in/out mode.
        Some(unsafe { f(mode) })
    }

    fn free(&self, addr: u64) -> Option<i32> {
        let f = FREE.get()?;
        // SAFETY: `cudaFree(void *)` of a segment the allocator got from `cudaMalloc` and no
        // longer hands out (the MemorySource contract); CUDA checks the pointer itself.
        Some(unsafe { f(addr as *mut c_void) })
    }

    fn event_create(&self, flags: u32) -> Option<(i32, u64)> {
        let f = EVENT_CREATE.get()?;
        let mut e: *mut c_void = std::ptr::null_mut();
        // SAFETY: `cudaEventCreateWithFlags(cudaEvent_t *, unsigned)` with a valid
        // out-parameter.
        let rc = unsafe { f(&mut e, flags) };
        Some((rc, e as u64))
    }

    fn event_record(&self, event: u64, stream: u64) -> Option<i32> {
        let f = EVENT_RECORD.get()?;
        // SAFETY: `cudaEventRecord(cudaEvent_t, cudaStream_t)` of an event just created, on a
        // stream torch handed the allocator; CUDA reports a bad stream as an error.
        Some(unsafe { f(event as *mut c_void, stream as Stream) })
    }

    fn event_query(&self, event: u64) -> Option<i32> {
        let f = EVENT_QUERY.get()?;
        // SAFETY: `cudaEventQuery(cudaEvent_t)` of an event `record_event` created and the
        // allocator has not destroyed yet.
        Some(unsafe { f(event as *mut c_void) })
    }

    fn event_destroy(&self, event: u64) -> Option<i32> {
        let f = EVENT_DESTROY.get()?;
        // SAFETY: `cudaEventDestroy(cudaEvent_t)` of an event of `record_event`, destroyed once
        // (the allocator drops its handle).
        Some(unsafe { f(event as *mut c_void) })
    }

    fn capture_info(&self, stream: u64) -> Option<(i32, i32, u64)> {
        let f = GET_CAPTURE_INFO.get()?;
        let mut status: c_int = 0;
        let mut id: u64 = 0;
        let null = std::ptr::null_mut();
        // SAFETY: `cudaStreamGetCaptureInfo(stream, status *, id *, graph *, deps *, edges *,
        // count *)` with valid status and id out-parameters; the optional ones may be NULL.
        let rc = unsafe {
            f(
                stream as Stream,
                &mut status,
                &mut id,
                null,
                null,
                null,
                null as *mut usize,
            )
        };
        Some((rc, status, id))
    }

    fn mem_info(&self) -> Option<(u64, u64)> {
        crate::cuda::queries::runtime::mem_info()
    }
}
