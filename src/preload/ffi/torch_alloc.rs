//! PyTorch allocator mode: the functions torch's `CUDAPluggableAllocator` calls when
//! `oomshim.torch.enable()` made oomshim its CUDA allocator.
//!
//! - `oomshim_torch_alloc(size, device, stream)` / `oomshim_torch_free(ptr, size, device,
//!   stream)`: every tensor. The caching allocator ([`oomshim_core::alloc`]) serves it from segments it
//!   gets from the real `cudaMalloc` (never through this library's own hook, so the ledger holds
//!   tensors, not segments), and the tensor is recorded with its stack.
//! - `oomshim_torch_empty_cache()`, `oomshim_torch_record_stream(ptr, stream)`,
//!   `oomshim_torch_set_memory_fraction(fraction, device)`, `oomshim_torch_init(count)`: the
//!   optional hooks torch offers (`set_reset_fn`, `set_record_stream_fn`,
//!   `set_memory_fraction_fn`, `set_init_fn`).
//! - `oomshim_torch_memory_stats(device, buf, cap)`, `oomshim_torch_free_blocks(device, buf,
//!   cap)`, `oomshim_torch_reset_peak(device)`, `oomshim_torch_reset_accumulated(device)`: what
//!   the Python package reads (torch's own `memory_stats` raises under a pluggable allocator).
//! - `oomshim_torch_segments(device, buf, cap)`: the free-block state plus every segment with its
//!   blocks, from which the Python package answers `torch.cuda.memory_snapshot()` (torch's own
//!   `snapshot` raises under a pluggable allocator).
//! - `oomshim_torch_record_history(enabled, context, max_entries, clear)` and
//!   `oomshim_torch_history(device, buf, cap)`: torch's memory history kept by the allocator
//!   (`_record_memory_history`; `device_traces` and frames in `_snapshot()`). While it is off
//!   `alloc`/`free` pay one relaxed load for it.
//!
//! A request the allocator cannot serve (after emptying its cache and retrying, as torch does)
//! writes its dump at once and raises a C++ exception naming it ([`super::cxx_throw`]): torch
//! hands whatever `alloc` returns to the tensor unchecked, so NULL is never returned to it.
//!
//! CUDA graphs: an allocation on a stream that is being captured belongs to that capture
//! (`oomshim_core::alloc` keeps such blocks for the graph's replays); the segment `cudaMalloc` then runs
//! in relaxed capture mode, as torch's own allocator does, so it cannot invalidate the capture.

use super::cuda_error::SUCCESS;
use super::real::real_fn;
use crate::live::allocator_mode::{
    c_message, config_from_env, free_blocks_for_dump, judged_mem_info, memory_cap,
    native_tensor_stacks, out_of_memory_text, MESSAGE_BYTES,
};
use dump::model::FreeBlocks;
use dump::units::human_bytes;
use oomshim_core::alloc::{
    CachingAllocator, HistoryConfig, MemorySource, OomCause, OutOfMemory, RecordContext,
};
use oomshim_core::ledger::Api;
use oomshim_core::sys::fn_ptr::FnPtr;
use std::cell::Cell;
use std::ffi::{c_char, c_double, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

type Stream = *mut c_void;

/// Every function this file exports (the export-list test reads it).
pub const EXPORTED_NAMES: &[&str] = &[
    "oomshim_torch_alloc",
    "oomshim_torch_free",
    "oomshim_torch_empty_cache",
    "oomshim_torch_record_stream",
    "oomshim_torch_set_memory_fraction",
    "oomshim_torch_init",
    "oomshim_torch_memory_stats",
    "oomshim_torch_free_blocks",
    "oomshim_torch_segments",
    "oomshim_torch_reset_peak",
    "oomshim_torch_reset_accumulated",
    "oomshim_torch_exception_kind",
    "oomshim_torch_record_history",
    "oomshim_torch_history",
    "oomshim_torch_set_oom_observer",
];

const NOT_READY: c_int = 600;
/// `cudaEventDisableTiming`: events used only for ordering are cheaper without timing.
const EVENT_DISABLE_TIMING: u32 = 2;
/// `cudaStreamCaptureModeRelaxed`.
const CAPTURE_MODE_RELAXED: c_int = 2;
/// `cudaStreamCaptureStatusActive`.
const CAPTURE_ACTIVE: c_int = 1;

fn get_device() -> Option<i32> {
    super::runtime::runtime_device()
}

fn set_device(device: i32) -> bool {
    match real_fn!(c"cudaSetDevice", unsafe extern "C" fn(c_int) -> c_int) {
        // SAFETY: `cudaError_t cudaSetDevice(int)`, a plain value argument.
        Some(f) => unsafe { f(device) == SUCCESS },
        None => false,
    }
}

/// Clears the runtime's last-error state after a call of ours failed, so the program's next
/// `cudaGetLastError` (torch checks it after every kernel launch) does not see our error.
fn clear_last_error() {
    if let Some(f) = real_fn!(c"cudaGetLastError", unsafe extern "C" fn() -> c_int) {
        // SAFETY: `cudaError_t cudaGetLastError(void)`: no argument, no precondition.
        unsafe { f() };
    }
}

/// Runs `f` with `device` current, restoring the caller's device after.
fn on_device<R>(device: i32, f: impl FnOnce() -> R) -> R {
    let before = get_device();
    let switch = before.is_some_and(|d| d != device) && set_device(device);
    let r = f();
    if switch {
        if let Some(d) = before {
            set_device(d);
        }
    }
    r
}

thread_local! {
    /// True while this thread allocates for a stream under CUDA graph capture.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Segments and events from the real CUDA runtime.
pub(crate) struct CudaSource;

impl MemorySource for CudaSource {
    fn alloc_segment(&self, device: i32, bytes: u64) -> Result<u64, i32> {
        let malloc = real_fn!(
            c"cudaMalloc",
            unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int
        )
        .ok_or(super::cuda_error::INITIALIZATION_ERROR)?;
        let bytes = usize::try_from(bytes).map_err(|_| super::cuda_error::MEMORY_ALLOCATION)?;
        let capturing = CAPTURING.with(|c| c.get());
        on_device(device, || {
            // During capture a cudaMalloc in the default (global) mode would invalidate the
            // graph being captured; torch's allocator switches to relaxed mode the same way.
            let exchange = real_fn!(
                c"cudaThreadExchangeStreamCaptureMode",
                unsafe extern "C" fn(*mut c_int) -> c_int
            );
            let mut mode = CAPTURE_MODE_RELAXED;
            // SAFETY: `cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *)` with a
            // valid in/out mode.
            let relaxed = capturing && exchange.is_some_and(|f| unsafe { f(&mut mode) } == SUCCESS);
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: `cudaMalloc(void **, size_t)` with a valid out-parameter.
            let rc = unsafe { malloc(&mut p, bytes) };
            if relaxed {
                if let Some(f) = exchange {
                    // SAFETY: as above; puts back the mode the first exchange returned.
                    unsafe { f(&mut mode) };
                }
            }
            if rc == SUCCESS && !p.is_null() {
                Ok(p as u64)
            } else {
                clear_last_error();
                Err(if rc == SUCCESS {
                    super::cuda_error::MEMORY_ALLOCATION
                } else {
                    rc
                })
            }
        })
    }

    fn free_segment(&self, device: i32, addr: u64, _bytes: u64) -> Result<(), i32> {
        let free = real_fn!(c"cudaFree", unsafe extern "C" fn(*mut c_void) -> c_int)
            .ok_or(super::cuda_error::INITIALIZATION_ERROR)?;
        // SAFETY: `cudaFree(void *)` of a segment the allocator got from `cudaMalloc` and no
        // longer hands out (the MemorySource contract); CUDA checks the pointer itself.
        let rc = on_device(device, || unsafe { free(addr as *mut c_void) });
        if rc == SUCCESS {
            Ok(())
        } else {
            clear_last_error();
            Err(rc)
        }
    }

    fn record_event(&self, device: i32, stream: u64) -> Result<u64, i32> {
        let create = real_fn!(
            c"cudaEventCreateWithFlags",
            unsafe extern "C" fn(*mut *mut c_void, u32) -> c_int
        )
        .ok_or(super::cuda_error::INITIALIZATION_ERROR)?;
        let record = real_fn!(
            c"cudaEventRecord",
            unsafe extern "C" fn(*mut c_void, Stream) -> c_int
        )
        .ok_or(super::cuda_error::INITIALIZATION_ERROR)?;
        on_device(device, || {
            let mut e: *mut c_void = std::ptr::null_mut();
            // SAFETY: `cudaEventCreateWithFlags(cudaEvent_t *, unsigned)` with a valid
            // out-parameter.
            let rc = unsafe { create(&mut e, EVENT_DISABLE_TIMING) };
            if rc != SUCCESS {
                clear_last_error();
                return Err(rc);
            }
            // SAFETY: `cudaEventRecord(cudaEvent_t, cudaStream_t)` of the event just created, on
            // a stream torch handed the allocator; CUDA reports a bad stream as an error.
            let rc = unsafe { record(e, stream as Stream) };
            if rc != SUCCESS {
                clear_last_error();
                self.destroy_event(e as u64);
                return Err(rc);
            }
            Ok(e as u64)
        })
    }

    fn event_done(&self, event: u64) -> bool {
        let Some(query) = real_fn!(
            c"cudaEventQuery",
            unsafe extern "C" fn(*mut c_void) -> c_int
        ) else {
            return true;
        };
        // SAFETY: `cudaEventQuery(cudaEvent_t)` of an event `record_event` created and the
        // allocator has not destroyed yet.
        match unsafe { query(event as *mut c_void) } {
            SUCCESS => true,
            NOT_READY => false,
            _ => {
                // A broken event can never complete: treat the block as free rather than
                // leaking it forever, and keep the error away from the program.
                clear_last_error();
                true
            }
        }
    }

    fn destroy_event(&self, event: u64) {
        if let Some(f) = real_fn!(
            c"cudaEventDestroy",
            unsafe extern "C" fn(*mut c_void) -> c_int
        ) {
            // SAFETY: `cudaEventDestroy(cudaEvent_t)` of an event of `record_event`, destroyed
            // once (the allocator drops its handle).
            if unsafe { f(event as *mut c_void) } != SUCCESS {
                clear_last_error();
            }
        }
    }
}

/// The allocator, created on the first call from torch (never at load time).
static ALLOCATOR: OnceLock<CachingAllocator<CudaSource>> = OnceLock::new();

fn allocator() -> &'static CachingAllocator<CudaSource> {
    ALLOCATOR.get_or_init(|| {
        // For the dumps no hook gathers (the shim's own trigger threads, a framework's word):
        // the runtime cannot reach this module otherwise.
        crate::live::allocator_mode::set_free_blocks_source(free_blocks_with_segment_map);
        CachingAllocator::new(CudaSource, config_from_env())
    })
}

/// The allocator's free blocks of `device` for a dump gathered on a hook's thread, when allocator
/// mode is on; `None` (and no allocator created) otherwise.
pub(super) fn free_blocks_if_active(device: i32) -> Option<FreeBlocks> {
    ALLOCATOR.get()?;
    free_blocks_with_segment_map(device)
}

/// Captures whose end the allocator has not been told of yet.
static OPEN_CAPTURES: crate::live::allocator_mode::OpenCaptures =
    crate::live::allocator_mode::OpenCaptures::new();

/// The capture `stream` is part of, if it is being captured now.
fn capture_of(stream: Stream) -> Option<u64> {
    // The legacy and per-thread default streams cannot be captured; asking about them while
    // another stream captures would itself be an error. Torch's default stream is 0.
    if (stream as usize) <= 2 {
        return None;
    }
    let info = real_fn!(
        c"cudaStreamGetCaptureInfo",
        unsafe extern "C" fn(
            Stream,
            *mut c_int,
            *mut u64,
            *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut usize,
        ) -> c_int
    )?;
    let mut status: c_int = 0;
    let mut id: u64 = 0;
    let null = std::ptr::null_mut();
    // SAFETY: `cudaStreamGetCaptureInfo(stream, status *, id *, graph *, deps *, edges *,
    // count *)` with valid status and id out-parameters; the optional ones may be NULL.
    let rc = unsafe {
        info(
            stream,
            &mut status,
            &mut id,
            null,
            null,
            null,
            null as *mut usize,
        )
    };
    if rc != SUCCESS {
        clear_last_error();
        return None;
    }
    (status == CAPTURE_ACTIVE).then_some(id)
}

/// Tells the allocator about captures that ended since the last check.
fn retire_ended_captures(a: &CachingAllocator<CudaSource>) {
    OPEN_CAPTURES.retire(
        |stream| capture_of(stream as Stream),
        |id| a.end_capture(id),
    );
}

fn note_capture(stream: Stream, id: u64) {
    OPEN_CAPTURES.note(stream as usize, id);
}

/// What `alloc` hands back when it cannot serve the request.
enum Failure {
    /// The request cannot be served: what the allocator found, before the observers ran and the
    /// dump was written ([`unserved`]).
    Unserved(Box<OutOfMemory>, u32),
    /// The request cannot be served: the message for the exception.
    OutOfMemory(Box<[u8; MESSAGE_BYTES]>),
    /// CUDA failed for another reason than memory (an invalid device, a sticky error): the
    /// message for a plain runtime error.
    CudaError(Box<[u8; MESSAGE_BYTES]>),
    /// The shim is broken (a panic): pass through to a plain cudaMalloc.
    PassThrough,
}

fn alloc_impl(size: usize, device: c_int, stream: Stream) -> Result<*mut c_void, Failure> {
    let a = allocator();
    retire_ended_captures(a);
    let capture = capture_of(stream);
    if let Some(id) = capture {
        note_capture(stream, id);
    }
    let _ = CAPTURING.try_with(|c| c.set(capture.is_some()));
    let context = history_stack(a, RecordContext::State);
    let result = a.malloc_in_context(device, size as u64, stream as u64, capture, context);
    let _ = CAPTURING.try_with(|c| c.set(false));
    match result {
        Ok(block) => {
            crate::live::record_alloc_with(
                Api::TorchAlloc,
                block.addr as usize,
                size as u64,
                device,
                stream as usize,
                native_tensor_stacks() || !oomshim_core::pystack::active(),
            );
            Ok(block.addr as *mut c_void)
        }
        Err(OutOfMemory {
            cause: OomCause::DeviceExhausted { cuda_error },
            segment_bytes,
            ..
        }) if cuda_error != super::cuda_error::MEMORY_ALLOCATION => {
            Err(Failure::CudaError(Box::new(c_message(&format!(
                "CUDA error {cuda_error} from cudaMalloc of a {} segment for a {} tensor on device {device} (oomshim allocator)",
                human_bytes(segment_bytes),
                human_bytes(size as u64)
            )))))
        }
        Err(oom) => Err(Failure::Unserved(Box::new(oom), context)),
    }
}

/// The caller's Python stack for torch's memory history when it keeps stacks at `level` or
/// above (an allocation from `state`, a free at `all`); 0 otherwise, after one relaxed load.
#[inline]
fn history_stack(a: &CachingAllocator<CudaSource>, level: RecordContext) -> u32 {
    match a.history_context() {
        Some(l) if l >= level => crate::live::history::python_stack(),
        _ => 0,
    }
}

/// The framework's out-of-memory observer (`void observer(int device, size_t requested, size_t
/// total, size_t free)`), 0 when none: oomshim's Python package registers one that calls the
/// program's observers and the hook's (see [`oomshim_torch_set_oom_observer`]).
static OOM_OBSERVER: AtomicUsize = AtomicUsize::new(0);

type OomObserver = unsafe extern "C" fn(c_int, u64, u64, u64);

/// Sets (or, with NULL, clears) the function called when an allocation cannot be served, before
/// its dump is written and the exception raised: torch calls its out-of-memory observers there
/// (`torch._C._cuda_attach_out_of_memory_observer`), with (device, requested bytes, device total
/// or the allowed maximum under a memory fraction, free bytes), but not under a pluggable
/// allocator. It runs on the failing thread with no lock of the shim held (it takes the GIL);
/// what the hook tells the shim from inside it (`oomshim_framework_oom`) goes into that dump.
/// Not called again while it runs on the same thread (an allocation it makes that fails is
/// dumped without it).
#[no_mangle]
pub extern "C" fn oomshim_torch_set_oom_observer(observer: Option<OomObserver>) {
    OOM_OBSERVER.store(observer.map_or(0, |f| f as usize), Ordering::Release);
}

/// An allocation the allocator cannot serve, even after emptying its cache: the observers run
/// first, as torch calls its own after releasing its allocator's lock and before it raises
/// (Python runs there, so neither a shim lock nor the guard is held: the hook's own calls into
/// the shim must get in), then the failure is recorded, its dump written and the exception's
/// message built. `context`: the caller's stack for torch's history (0 when off). `outermost`: the failing call entered the shim from outside (never observers
/// from inside the shim).
fn unserved(oom: &OutOfMemory, stream: Stream, context: u32, outermost: bool) -> Failure {
    let mem_info = contained(|| on_device(oom.device, device_mem_info)).flatten();
    let observer = OOM_OBSERVER.load(Ordering::Acquire);
    let note = if outermost && observer != 0 {
        let (free, total) = judged_mem_info(oom, mem_info).unwrap_or((0, 0));
        crate::live::allocator_mode::observe(|| {
            // SAFETY: a non-zero `observer` was stored by oomshim_torch_set_oom_observer from a
            // function of this type, and its caller keeps it callable while it is set.
            let Some(f) = (unsafe { <OomObserver as FnPtr>::from_addr(observer) }) else {
                return;
            };
            // SAFETY: called with the four values of its C signature; no lock of the shim and
            // no guard is held (it runs Python).
            unsafe { f(oom.device, oom.requested, total, free) };
        })
    } else {
        None
    };
    let guard = super::Guard::enter();
    let message =
        contained(|| out_of_memory(oom, stream, mem_info, note, context)).unwrap_or_else(|| {
            c_message(&format!(
                "CUDA out of memory. Tried to allocate {} (oomshim allocator).",
                human_bytes(oom.requested)
            ))
        });
    drop(guard);
    Failure::OutOfMemory(Box::new(message))
}

/// Records the failure (its dump is written now, with the framework's word `note` when its
/// observer gave one) and builds the exception's message; `context` is the stack of torch's
/// `oom` history entry.
fn out_of_memory(
    oom: &OutOfMemory,
    stream: Stream,
    mem_info: Option<(u64, u64)>,
    note: Option<crate::live::FrameworkNote>,
    context: u32,
) -> [u8; MESSAGE_BYTES] {
    if allocator().history_context().is_some() {
        // torch's `oom` entry: the rounded request and what CUDA said was free.
        let free = mem_info.map_or(0, |m| m.0);
        allocator().record_oom(oom.device, oom.rounded, free, stream as u64, context);
    }
    let outcome = crate::live::allocator_mode::oom_now(
        crate::live::OomEvent {
            api: Api::TorchAlloc,
            bytes: oom.requested,
            device: oom.device,
            error_code: super::cuda_error::MEMORY_ALLOCATION,
            stream: stream as usize,
            context: crate::live::FailureContext {
                memory_cap: memory_cap(oom, mem_info),
                ..crate::live::allocator_mode::failure_context(
                    oom.device,
                    judged_mem_info(oom, mem_info),
                    free_blocks_with_segment_map(oom.device),
                )
            },
        },
        note,
    );
    c_message(&out_of_memory_text(
        oom,
        mem_info,
        outcome.verdict.as_ref(),
        outcome.path.as_deref(),
    ))
}

fn device_mem_info() -> Option<(u64, u64)> {
    let info = super::runtime::mem_info();
    if info.is_none() {
        clear_last_error();
    }
    info
}

/// A plain cudaMalloc of `size` on `device`: the pass-through when the shim itself failed.
fn pass_through_alloc(size: usize, device: c_int) -> *mut c_void {
    CudaSource
        .alloc_segment(device, size.max(1) as u64)
        .map_or(std::ptr::null_mut(), |p| p as *mut c_void)
}

/// Runs shim code inside the shim's panic boundary ([`oomshim_core::sys::contain`]): a panic turns the
/// shim off (one message) instead of unwinding into torch.
fn contained<R>(f: impl FnOnce() -> R) -> Option<R> {
    oomshim_core::sys::contain(f, |_| "internal error in allocator mode".to_string())
}

/// `void* alloc(size_t size, int device, cudaStream_t stream)`, called by torch for every
/// tensor. Raises a C++ exception (torch.OutOfMemoryError in Python) when the request cannot be
/// served; never returns NULL to torch.
#[no_mangle]
pub unsafe extern "C-unwind" fn oomshim_torch_alloc(
    size: usize,
    device: c_int,
    stream: Stream,
) -> *mut c_void {
    // The guard makes any hooked call below (the segment's cudaMalloc, when this library is also
    // preloaded) pass straight through.
    let guard = super::Guard::enter();
    let outermost = guard.is_some();
    let outcome =
        contained(|| alloc_impl(size, device, stream)).unwrap_or(Err(Failure::PassThrough));
    drop(guard);
    let outcome = match outcome {
        Err(Failure::Unserved(oom, context)) => Err(unserved(&oom, stream, context, outermost)),
        other => other,
    };
    match outcome {
        Ok(p) => p,
        // (Unserved never gets here: it became OutOfMemory above.)
        Err(Failure::PassThrough | Failure::Unserved(..)) => pass_through_alloc(size, device),
        Err(Failure::OutOfMemory(boxed)) => {
            // Out of the box first: nothing with a destructor is live while the exception
            // unwinds through this frame to torch.
            let message: [u8; MESSAGE_BYTES] = *boxed;
            // SAFETY: `c_message` always ends the buffer with a NUL, and nothing with a
            // destructor or a lock is live in this frame (the guard and the box are gone).
            unsafe { super::cxx_throw::throw_out_of_memory(&message) };
            // No C++ runtime in the process (not torch): the caller checks for NULL.
            std::ptr::null_mut()
        }
        Err(Failure::CudaError(boxed)) => {
            let message: [u8; MESSAGE_BYTES] = *boxed;
            // SAFETY: as for the out-of-memory exception above.
            unsafe { super::cxx_throw::throw_runtime_error(&message) };
            std::ptr::null_mut()
        }
    }
}

/// `void free(void* ptr, size_t size, int device, cudaStream_t stream)`: `size` is the
/// requested size and `stream` the one current at allocation (torch keeps both).
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: Stream,
) {
    let _ = (size, stream);
    if ptr.is_null() {
        return;
    }
    let guard = super::Guard::enter();
    let known = contained(|| {
        let a = allocator();
        retire_ended_captures(a);
        let _ = crate::live::take(ptr as usize);
        let context = history_stack(a, RecordContext::All);
        a.free_in_context(device, ptr as u64, context).is_some()
    });
    drop(guard);
    if known != Some(true) {
        // Not one of the allocator's blocks: a pass-through allocation made while the shim was
        // failing. Give it back to CUDA.
        let _ = CudaSource.free_segment(device, ptr as u64, size as u64);
    }
}

/// `torch.cuda.empty_cache()` (torch's `set_reset_fn`): returns every fully free segment.
#[no_mangle]
pub extern "C" fn oomshim_torch_empty_cache() {
    let guard = super::Guard::enter();
    contained(|| allocator().empty_cache(None));
    drop(guard);
}

/// `Tensor.record_stream(stream)` (torch's `set_record_stream_fn`): the block is not reused
/// until the work queued on `stream` when it is freed has finished.
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_record_stream(ptr: *mut c_void, stream: Stream) {
    let guard = super::Guard::enter();
    contained(|| allocator().record_stream(ptr as u64, stream as u64));
    drop(guard);
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)` (torch's
/// `set_memory_fraction_fn`): caps what the cache may reserve on `device`.
#[no_mangle]
pub extern "C" fn oomshim_torch_set_memory_fraction(fraction: c_double, device: c_int) {
    let guard = super::Guard::enter();
    contained(|| {
        let total = on_device(device, device_mem_info).map(|m| m.1);
        let limit = match total {
            Some(t) if (0.0..1.0).contains(&fraction) => Some((t as f64 * fraction) as u64),
            _ => None,
        };
        allocator().set_memory_limit(device, limit);
    });
    drop(guard);
}

/// Torch's `set_init_fn`: called at CUDA initialisation with the device count. The allocator
/// is created here, off the first allocation's path.
#[no_mangle]
pub extern "C" fn oomshim_torch_init(device_count: c_int) {
    let _ = device_count;
    let guard = super::Guard::enter();
    contained(allocator);
    drop(guard);
}

/// Copies `text` into `buf` (NUL-terminated when it fits) and returns its length: the caller
/// retries with a bigger buffer when the length is not below `cap`.
///
/// # Safety
/// A non-NULL `buf` is writable for `cap` bytes.
unsafe fn copy_out(text: &str, buf: *mut c_char, cap: usize) -> usize {
    let bytes = text.as_bytes();
    if !buf.is_null() && cap > bytes.len() {
        // SAFETY: `buf` is writable for `cap > len` bytes (this function's contract), so the
        // text and its NUL fit; a Rust string cannot overlap the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
            *buf.add(bytes.len()) = 0;
        }
    }
    bytes.len()
}

/// torch's `memory_stats(device)` as a flat JSON object with torch's key names.
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_memory_stats(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = contained(|| {
        let stats = allocator().stats(device).torch_keys();
        let map: serde_json::Map<String, serde_json::Value> =
            stats.into_iter().map(|(k, v)| (k, v.into())).collect();
        serde_json::Value::Object(map).to_string()
    })
    .unwrap_or_else(|| "{}".into());
    // SAFETY: the caller hands `cap` writable bytes at `buf`, or NULL (this function's
    // contract, as torch's and the Python package's callers keep it).
    unsafe { copy_out(&text, buf, cap) }
}

/// The free-block state of `device` as JSON (the dump's `free_blocks` object).
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_free_blocks(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = contained(|| {
        serde_json::to_string(&free_blocks_for_dump(allocator(), device))
            .ok()
            .unwrap_or_else(|| "{}".into())
    })
    .unwrap_or_else(|| "{}".into());
    // SAFETY: the caller hands `cap` writable bytes at `buf`, or NULL (this function's
    // contract, as torch's and the Python package's callers keep it).
    unsafe { copy_out(&text, buf, cap) }
}

/// [`oomshim_torch_free_blocks`] plus `segment_map`: every segment of `device` with its blocks
/// (address, size, requested size, torch's block state), as JSON. A scan of the device's
/// segments: meant for snapshots, not for every step.
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_segments(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = contained(|| {
        free_blocks_with_segment_map(device)
            .and_then(|f| serde_json::to_string(&f).ok())
            .unwrap_or_else(|| "{}".into())
    })
    .unwrap_or_else(|| "{}".into());
    // SAFETY: the caller hands `cap` writable bytes at `buf`, or NULL (this function's
    // contract, as torch's and the Python package's callers keep it).
    unsafe { copy_out(&text, buf, cap) }
}

#[no_mangle]
pub extern "C" fn oomshim_torch_reset_peak(device: c_int) {
    contained(|| allocator().reset_peak_stats(device));
}

#[no_mangle]
pub extern "C" fn oomshim_torch_reset_accumulated(device: c_int) {
    contained(|| allocator().reset_accumulated_stats(device));
}

/// torch's `_record_memory_history`: `enabled` 0 turns it off (and drops the traces), else on
/// with `context` 0 none, 1 state, 2 alloc, 3 all (torch's option of that name) and a ring of
/// `max_entries` per device (at least 1); `clear` drops what was recorded. Returns 0, or -1 for
/// a context level out of range (nothing changed).
#[no_mangle]
pub extern "C" fn oomshim_torch_record_history(
    enabled: c_int,
    context: c_int,
    max_entries: u64,
    clear: c_int,
) -> c_int {
    let guard = super::Guard::enter();
    let rc = contained(|| {
        let Some(context) = RecordContext::from_level(context) else {
            return -1;
        };
        let config = (enabled != 0).then_some(HistoryConfig {
            context,
            max_entries: usize::try_from(max_entries).unwrap_or(usize::MAX),
        });
        allocator().record_history(config, clear != 0);
        0
    })
    .unwrap_or(-1);
    drop(guard);
    rc
}

/// torch's memory history of `device` as JSON (`crate::live::history::history_json`): its
/// trace, the stacks of its live blocks, and those stacks resolved. As torch's snapshot does,
/// a `snapshot` entry is recorded once the trace was read (it shows in the next one).
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_history(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = contained(|| {
        let a = allocator();
        let json = crate::live::history::history_json(&a.trace(device), &a.segments(device));
        a.record_snapshot(device);
        json
    })
    .unwrap_or_else(|| "{}".into());
    // SAFETY: the caller hands `cap` writable bytes at `buf`, or NULL (this function's
    // contract, as torch's and the Python package's callers keep it).
    unsafe { copy_out(&text, buf, cap) }
}

/// Which exception an allocation failure raises here: `torch.OutOfMemoryError`,
/// `RuntimeError` or `none` (NUL-terminated, static).
#[no_mangle]
pub extern "C" fn oomshim_torch_exception_kind() -> *const c_char {
    match contained(super::cxx_throw::exception_kind) {
        Some("torch.OutOfMemoryError") => c"torch.OutOfMemoryError".as_ptr(),
        Some("RuntimeError") => c"RuntimeError".as_ptr(),
        _ => c"none".as_ptr(),
    }
}

/// The allocator's free blocks of `device` with every segment (for a dump).
fn free_blocks_with_segment_map(device: i32) -> Option<FreeBlocks> {
    Some(crate::live::allocator_mode::free_blocks_with_segment_map(
        allocator(),
        device,
    ))
}
