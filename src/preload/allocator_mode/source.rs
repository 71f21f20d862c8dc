//! Where the allocator's memory comes from: segments and events of the CUDA runtime, through the
//! runtime functions the hooks hand in ([`CudaRuntime`]; `ffi` finds the real ones, tests pass a
//! fake), with the device switched to the allocation's and back, the stream-capture mode relaxed
//! around a segment allocated during a CUDA graph capture, and the runtime's last-error state
//! cleared after every call of ours that failed.

use oomshim_host::alloc::MemorySource;
use oomshim_host::sys::cuda_error::{INITIALIZATION_ERROR, MEMORY_ALLOCATION, SUCCESS};
use std::cell::Cell;

/// `cudaErrorNotReady`.
const NOT_READY: i32 = 600;
/// `cudaEventDisableTiming`: events used only for ordering are cheaper without timing.
const EVENT_DISABLE_TIMING: u32 = 2;
/// `cudaStreamCaptureModeRelaxed`.
const CAPTURE_MODE_RELAXED: i32 = 2;
/// `cudaStreamCaptureStatusActive`.
const CAPTURE_ACTIVE: i32 = 1;

/// A runtime function whose presence is asked before its call ([`CudaRuntime::found`]): the
/// first missing function of the runtime is the one the process is told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Malloc,
    Free,
    EventCreate,
    EventRecord,
    ExchangeCaptureMode,
}

/// The CUDA runtime functions the allocator calls, with C's arguments turned into Rust values.
/// Each returns `None` when the process has no such function (then said once, by whoever finds
/// them), else the function's error code and out-values.
pub trait CudaRuntime: Sync {
    /// `cudaGetDevice`.
    fn current_device(&self) -> Option<i32>;
    /// `cudaSetDevice`: true when it succeeded.
    fn set_device(&self, device: i32) -> bool;
    /// `cudaGetLastError`, its answer dropped (when the process has it).
    fn clear_last_error(&self);
    /// Whether the process has `call` (looked up now).
    fn found(&self, call: Call) -> bool;
    /// `cudaMalloc`: (error code, address).
    fn malloc(&self, bytes: usize) -> Option<(i32, u64)>;
    /// `cudaThreadExchangeStreamCaptureMode`, `mode` in and out.
    fn exchange_capture_mode(&self, mode: &mut i32) -> Option<i32>;
    /// `cudaFree`.
    fn free(&self, addr: u64) -> Option<i32>;
    /// `cudaEventCreateWithFlags`: (error code, event).
    fn event_create(&self, flags: u32) -> Option<(i32, u64)>;
    /// `cudaEventRecord`.
    fn event_record(&self, event: u64, stream: u64) -> Option<i32>;
    /// `cudaEventQuery`.
    fn event_query(&self, event: u64) -> Option<i32>;
    /// `cudaEventDestroy`.
    fn event_destroy(&self, event: u64) -> Option<i32>;
    /// `cudaStreamGetCaptureInfo`: (error code, capture status, capture id).
    fn capture_info(&self, stream: u64) -> Option<(i32, i32, u64)>;
    /// `cudaMemGetInfo` of the current device: (free, total), `None` when it failed too.
    fn mem_info(&self) -> Option<(u64, u64)>;
}

thread_local! {
    /// True while this thread allocates for a stream under CUDA graph capture.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Notes whether this thread now allocates for a stream under capture.
pub(super) fn set_capturing(on: bool) {
    let _ = CAPTURING.try_with(|c| c.set(on));
}

/// Runs `f` with `device` current, restoring the caller's device after.
fn on_device<R>(cuda: &dyn CudaRuntime, device: i32, f: impl FnOnce() -> R) -> R {
    let before = cuda.current_device();
    let switch = before.is_some_and(|d| d != device) && cuda.set_device(device);
    let r = f();
    if switch {
        if let Some(d) = before {
            cuda.set_device(d);
        }
    }
    r
}

/// (free, total) bytes of `device`, the runtime's error cleared when it cannot tell.
pub fn mem_info_on(cuda: &dyn CudaRuntime, device: i32) -> Option<(u64, u64)> {
    on_device(cuda, device, || current_mem_info(cuda))
}

fn current_mem_info(cuda: &dyn CudaRuntime) -> Option<(u64, u64)> {
    let info = cuda.mem_info();
    if info.is_none() {
        cuda.clear_last_error();
    }
    info
}

/// The capture `stream` is part of, if it is being captured now.
pub(super) fn capture_of(cuda: &dyn CudaRuntime, stream: u64) -> Option<u64> {
    // The legacy and per-thread default streams cannot be captured; asking about them while
    // another stream captures would itself be an error. Torch's default stream is 0.
    if stream as usize <= 2 {
        return None;
    }
    let (rc, status, id) = cuda.capture_info(stream)?;
    if rc != SUCCESS {
        cuda.clear_last_error();
        return None;
    }
    (status == CAPTURE_ACTIVE).then_some(id)
}

/// Segments and events from the CUDA runtime.
pub struct CudaSource(pub &'static dyn CudaRuntime);

impl MemorySource for CudaSource {
    fn alloc_segment(&self, device: i32, bytes: u64) -> Result<u64, i32> {
        let cuda = self.0;
        if !cuda.found(Call::Malloc) {
            return Err(INITIALIZATION_ERROR);
        }
        let bytes = usize::try_from(bytes).map_err(|_| MEMORY_ALLOCATION)?;
        let capturing = CAPTURING.with(|c| c.get());
        on_device(cuda, device, || {
            // During capture a cudaMalloc in the default (global) mode would invalidate the
            // graph being captured; torch's allocator switches to relaxed mode the same way.
            let exchange = cuda.found(Call::ExchangeCaptureMode);
            let mut mode = CAPTURE_MODE_RELAXED;
            let relaxed =
                capturing && exchange && cuda.exchange_capture_mode(&mut mode) == Some(SUCCESS);
            let (rc, p) = cuda.malloc(bytes).unwrap_or((INITIALIZATION_ERROR, 0));
            if relaxed {
                // Puts back the mode the first exchange returned.
                cuda.exchange_capture_mode(&mut mode);
            }
            if rc == SUCCESS && p != 0 {
                Ok(p)
            } else {
                cuda.clear_last_error();
                Err(if rc == SUCCESS { MEMORY_ALLOCATION } else { rc })
            }
        })
    }

    fn free_segment(&self, device: i32, addr: u64, _bytes: u64) -> Result<(), i32> {
        let cuda = self.0;
        if !cuda.found(Call::Free) {
            return Err(INITIALIZATION_ERROR);
        }
        let rc = on_device(cuda, device, || {
            cuda.free(addr).unwrap_or(INITIALIZATION_ERROR)
        });
        if rc == SUCCESS {
            Ok(())
        } else {
            cuda.clear_last_error();
            Err(rc)
        }
    }

    fn record_event(&self, device: i32, stream: u64) -> Result<u64, i32> {
        let cuda = self.0;
        if !cuda.found(Call::EventCreate) || !cuda.found(Call::EventRecord) {
            return Err(INITIALIZATION_ERROR);
        }
        on_device(cuda, device, || {
            let (rc, e) = cuda
                .event_create(EVENT_DISABLE_TIMING)
                .unwrap_or((INITIALIZATION_ERROR, 0));
            if rc != SUCCESS {
                cuda.clear_last_error();
                return Err(rc);
            }
            let rc = cuda.event_record(e, stream).unwrap_or(INITIALIZATION_ERROR);
            if rc != SUCCESS {
                cuda.clear_last_error();
                self.destroy_event(e);
                return Err(rc);
            }
            Ok(e)
        })
    }

    fn event_done(&self, event: u64) -> bool {
        match self.0.event_query(event) {
            None | Some(SUCCESS) => true,
            Some(NOT_READY) => false,
            Some(_) => {
                // A broken event can never complete: treat the block as free rather than
                // leaking it forever, and keep the error away from the program.
                self.0.clear_last_error();
                true
            }
        }
    }

    fn destroy_event(&self, event: u64) {
        if let Some(rc) = self.0.event_destroy(event) {
            if rc != SUCCESS {
                self.0.clear_last_error();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A runtime that logs its calls and answers as told.
    struct Fake {
        log: Mutex<Vec<String>>,
        device: i32,
        malloc: Option<(i32, u64)>,
        capture: Option<(i32, i32, u64)>,
    }

    impl Fake {
        fn leak(malloc: Option<(i32, u64)>, capture: Option<(i32, i32, u64)>) -> &'static Fake {
            Box::leak(Box::new(Fake {
                log: Mutex::new(Vec::new()),
                device: 0,
                malloc,
                capture,
            }))
        }
        fn note(&self, s: String) {
            self.log.lock().unwrap().push(s);
        }
        fn calls(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }
    }

    impl CudaRuntime for Fake {
        fn current_device(&self) -> Option<i32> {
            Some(self.device)
        }
        fn set_device(&self, device: i32) -> bool {
            self.note(format!("set_device {device}"));
            true
        }
        fn clear_last_error(&self) {
            self.note("clear".into());
        }
        fn found(&self, call: Call) -> bool {
            call != Call::Malloc || self.malloc.is_some()
        }
        fn malloc(&self, bytes: usize) -> Option<(i32, u64)> {
            self.note(format!("malloc {bytes}"));
            self.malloc
        }
        fn exchange_capture_mode(&self, mode: &mut i32) -> Option<i32> {
            self.note(format!("exchange {mode}"));
            *mode = 0;
            Some(SUCCESS)
        }
        fn free(&self, addr: u64) -> Option<i32> {
            self.note(format!("free {addr:#x}"));
            Some(SUCCESS)
        }
        fn event_create(&self, _flags: u32) -> Option<(i32, u64)> {
            Some((SUCCESS, 7))
        }
        fn event_record(&self, _event: u64, _stream: u64) -> Option<i32> {
            Some(NOT_READY)
        }
        fn event_query(&self, _event: u64) -> Option<i32> {
            Some(NOT_READY)
        }
        fn event_destroy(&self, event: u64) -> Option<i32> {
            self.note(format!("destroy {event}"));
            Some(SUCCESS)
        }
        fn capture_info(&self, _stream: u64) -> Option<(i32, i32, u64)> {
            self.capture
        }
        fn mem_info(&self) -> Option<(u64, u64)> {
            None
        }
    }

    #[test]
    fn a_segment_is_allocated_on_its_device_and_the_callers_device_is_put_back() {
        let cuda = Fake::leak(Some((SUCCESS, 0x1000)), None);
        assert_eq!(CudaSource(cuda).alloc_segment(1, 4096), Ok(0x1000));
        assert_eq!(
            cuda.calls(),
            ["set_device 1", "malloc 4096", "set_device 0"]
        );
    }

    #[test]
    fn a_refused_segment_clears_the_runtimes_error_and_a_null_one_is_out_of_memory() {
        let refused = Fake::leak(Some((MEMORY_ALLOCATION, 0)), None);
        assert_eq!(
            CudaSource(refused).alloc_segment(0, 1),
            Err(MEMORY_ALLOCATION)
        );
        assert_eq!(refused.calls(), ["malloc 1", "clear"]);
        let null = Fake::leak(Some((SUCCESS, 0)), None);
        assert_eq!(CudaSource(null).alloc_segment(0, 1), Err(MEMORY_ALLOCATION));
        let missing = Fake::leak(None, None);
        assert_eq!(
            CudaSource(missing).alloc_segment(0, 1),
            Err(INITIALIZATION_ERROR)
        );
        assert!(missing.calls().is_empty());
    }

    #[test]
    fn under_capture_the_mode_is_relaxed_around_the_segment_and_put_back() {
        let cuda = Fake::leak(Some((SUCCESS, 0x2000)), None);
        set_capturing(true);
        let got = CudaSource(cuda).alloc_segment(0, 8);
        set_capturing(false);
        assert_eq!(got, Ok(0x2000));
        assert_eq!(cuda.calls(), ["exchange 2", "malloc 8", "exchange 0"]);
    }

    #[test]
    fn an_event_that_cannot_be_recorded_is_destroyed_and_a_pending_one_is_not_done() {
        let cuda = Fake::leak(None, None);
        let source = CudaSource(cuda);
        assert_eq!(source.record_event(0, 9), Err(NOT_READY));
        assert_eq!(cuda.calls(), ["clear", "destroy 7"]);
        assert!(!source.event_done(7));
    }

    #[test]
    fn only_an_active_capture_of_a_capturable_stream_counts() {
        let active = Fake::leak(None, Some((SUCCESS, CAPTURE_ACTIVE, 42)));
        assert_eq!(capture_of(active, 2), None); // a default stream: not even asked
        assert_eq!(capture_of(active, 0x55), Some(42));
        let idle = Fake::leak(None, Some((SUCCESS, 0, 42)));
        assert_eq!(capture_of(idle, 0x55), None);
        let failing = Fake::leak(None, Some((1, CAPTURE_ACTIVE, 42)));
        assert_eq!(capture_of(failing, 0x55), None);
        assert_eq!(failing.calls(), ["clear"]);
    }
}
