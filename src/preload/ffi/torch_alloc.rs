//! PyTorch allocator mode: the functions torch's `CUDAPluggableAllocator` calls when
//! `oomshim.torch.enable()` made oomshim its CUDA allocator.
//!
//! - `oomshim_torch_alloc(size, device, stream)` / `oomshim_torch_free(ptr, size, device,
//!   stream)`: every tensor. The caching allocator ([`oomshim_host::alloc`]) serves it from segments it
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
//! (`oomshim_host::alloc` keeps such blocks for the graph's replays); the segment `cudaMalloc` then runs
//! in relaxed capture mode, as torch's own allocator does, so it cannot invalidate the capture.
//!
//! This file is the C side only: the entry points, their arguments turned into Rust values, the
//! panic boundary, the observer call and the C++ exception. What each call does with the
//! allocator is `crate::allocator_mode`, which gets its segments and events through the real
//! runtime functions in `crate::allocator_mode::runtime`.

use crate::allocator_mode::runtime::CUDA;
use crate::allocator_mode::{self as mode, c_message, judged_mem_info, Failure, MESSAGE_BYTES};
use crate::shim;
use dump::units::human_bytes;
use oomshim_host::alloc::OutOfMemory;
use oomshim_host::sys::fn_ptr::FnPtr;
use oomshim_host::sys::Guard;
use std::ffi::{c_char, c_double, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

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
    let mem_info = contained(|| mode::mem_info_on(&CUDA, oom.device)).flatten();
    let observer = OOM_OBSERVER.load(Ordering::Acquire);
    let note = if outermost && observer != 0 {
        let (free, total) = judged_mem_info(oom, mem_info).unwrap_or((0, 0));
        mode::observe(|| {
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
    let guard = Guard::enter();
    let message = contained(|| {
        mode::out_of_memory(
            &CUDA,
            &shim::ALLOCATOR_HOST,
            oom,
            stream as u64,
            mem_info,
            note,
            context,
        )
    })
    .unwrap_or_else(|| {
        c_message(&format!(
            "CUDA out of memory. Tried to allocate {} (oomshim allocator).",
            human_bytes(oom.requested)
        ))
    });
    drop(guard);
    Failure::OutOfMemory(Box::new(message))
}

/// Runs shim code inside the shim's panic boundary ([`oomshim_host::sys::contain`]): a panic turns the
/// shim off (one message) instead of unwinding into torch.
fn contained<R>(f: impl FnOnce() -> R) -> Option<R> {
    oomshim_host::sys::contain(f, |_| "internal error in allocator mode".to_string())
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
    let guard = Guard::enter();
    let outermost = guard.is_some();
    let outcome =
        contained(|| mode::alloc(&CUDA, &shim::ALLOCATOR_HOST, size, device, stream as u64))
            .unwrap_or(Err(Failure::PassThrough));
    drop(guard);
    let outcome = match outcome {
        Err(Failure::Unserved(oom, context)) => Err(unserved(&oom, stream, context, outermost)),
        other => other,
    };
    match outcome {
        Ok(p) => p as *mut c_void,
        // (Unserved never gets here: it became OutOfMemory above.) A plain cudaMalloc when the
        // shim itself failed.
        Err(Failure::PassThrough | Failure::Unserved(..)) => {
            mode::pass_through_alloc(&CUDA, size, device)
                .map_or(std::ptr::null_mut(), |p| p as *mut c_void)
        }
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
    let guard = Guard::enter();
    let known = contained(|| mode::free(&CUDA, &shim::ALLOCATOR_HOST, device, ptr as u64));
    drop(guard);
    if known != Some(true) {
        // Not one of the allocator's blocks: a pass-through allocation made while the shim was
        // failing. Give it back to CUDA.
        mode::pass_through_free(&CUDA, device, ptr as u64, size);
    }
}

/// `torch.cuda.empty_cache()` (torch's `set_reset_fn`): returns every fully free segment.
#[no_mangle]
pub extern "C" fn oomshim_torch_empty_cache() {
    let guard = Guard::enter();
    contained(|| mode::allocator(&CUDA).empty_cache(None));
    drop(guard);
}

/// `Tensor.record_stream(stream)` (torch's `set_record_stream_fn`): the block is not reused
/// until the work queued on `stream` when it is freed has finished.
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_record_stream(ptr: *mut c_void, stream: Stream) {
    let guard = Guard::enter();
    contained(|| mode::allocator(&CUDA).record_stream(ptr as u64, stream as u64));
    drop(guard);
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)` (torch's
/// `set_memory_fraction_fn`): caps what the cache may reserve on `device`.
#[no_mangle]
pub extern "C" fn oomshim_torch_set_memory_fraction(fraction: c_double, device: c_int) {
    let guard = Guard::enter();
    contained(|| mode::set_memory_fraction(&CUDA, fraction, device));
    drop(guard);
}

/// Torch's `set_init_fn`: called at CUDA initialisation with the device count. The allocator
/// is created here, off the first allocation's path.
#[no_mangle]
pub extern "C" fn oomshim_torch_init(device_count: c_int) {
    let _ = device_count;
    let guard = Guard::enter();
    contained(|| mode::allocator(&CUDA));
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
    let text = contained(|| mode::memory_stats_json(&CUDA, device)).unwrap_or_else(|| "{}".into());
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
    let text = contained(|| mode::free_blocks_json(&CUDA, device)).unwrap_or_else(|| "{}".into());
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
    let text = contained(|| mode::segments_json(&CUDA, device)).unwrap_or_else(|| "{}".into());
    // SAFETY: the caller hands `cap` writable bytes at `buf`, or NULL (this function's
    // contract, as torch's and the Python package's callers keep it).
    unsafe { copy_out(&text, buf, cap) }
}

#[no_mangle]
pub extern "C" fn oomshim_torch_reset_peak(device: c_int) {
    contained(|| mode::allocator(&CUDA).reset_peak_stats(device));
}

#[no_mangle]
pub extern "C" fn oomshim_torch_reset_accumulated(device: c_int) {
    contained(|| mode::allocator(&CUDA).reset_accumulated_stats(device));
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
    let guard = Guard::enter();
    let rc =
        contained(|| mode::record_history(&CUDA, enabled != 0, context, max_entries, clear != 0))
            .unwrap_or(-1);
    drop(guard);
    rc
}

/// torch's memory history of `device` as JSON (`crate::allocator_mode::history::history_json`): its
/// trace, the stacks of its live blocks, and those stacks resolved. As torch's snapshot does,
/// a `snapshot` entry is recorded once the trace was read (it shows in the next one).
#[no_mangle]
pub unsafe extern "C" fn oomshim_torch_history(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    let text = contained(|| mode::history_json(&CUDA, &shim::ALLOCATOR_HOST, device))
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
