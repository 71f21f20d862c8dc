//! The caching allocator behind torch's pluggable-allocator calls (the entry points are in
//! `ffi/torch_alloc.rs`): created on the first call from torch (never at load time), serving
//! tensors from segments of the CUDA runtime it is handed ([`CudaRuntime`]), recording each tensor
//! in the ledger, telling the allocator which graph captures ended, and turning a request it
//! cannot serve into a dump and the exception's message.

use super::captures::OpenCaptures;
use super::config::{config_from_env, native_tensor_stacks};
use super::free_blocks::{free_blocks_for_dump, free_blocks_with_segment_map};
use super::host::Host;
use super::message::{c_message, judged_mem_info, memory_cap, out_of_memory_text, MESSAGE_BYTES};
use super::source::{self, CudaRuntime, CudaSource};
use crate::cuda::context::FailureContext;
use crate::failure::{FrameworkNote, OomEvent};
use dump::model::FreeBlocks;
use dump::units::human_bytes;
use oomshim_host::alloc::{CachingAllocator, HistoryConfig, OomCause, OutOfMemory, RecordContext};
use oomshim_host::ledger::Api;
use oomshim_host::sys::cuda_error::MEMORY_ALLOCATION;
use std::sync::OnceLock;

/// The allocator, created on the first call from torch (never at load time).
static ALLOCATOR: OnceLock<CachingAllocator<CudaSource>> = OnceLock::new();

/// The allocator, created now over `cuda` unless it exists.
pub fn allocator(cuda: &'static dyn CudaRuntime) -> &'static CachingAllocator<CudaSource> {
    ALLOCATOR.get_or_init(|| CachingAllocator::new(CudaSource(cuda), config_from_env()))
}

/// The allocator's free blocks of `device` with every segment (for a dump), when allocator mode
/// is on; `None` (and no allocator created) otherwise.
pub fn free_blocks_if_active(device: i32) -> Option<FreeBlocks> {
    let a = ALLOCATOR.get()?;
    Some(free_blocks_with_segment_map(a, device))
}

/// Captures whose end the allocator has not been told of yet.
static OPEN_CAPTURES: OpenCaptures = OpenCaptures::new();

/// Tells the allocator about captures that ended since the last check.
fn retire_ended_captures(cuda: &dyn CudaRuntime, a: &CachingAllocator<CudaSource>) {
    OPEN_CAPTURES.retire(
        |stream| source::capture_of(cuda, stream as u64),
        |id| a.end_capture(id),
    );
}

/// What `alloc` hands back when it cannot serve the request.
pub enum Failure {
    /// The request cannot be served: what the allocator found, before the observers ran and the
    /// dump was written, and the stack of torch's `oom` history entry.
    Unserved(Box<OutOfMemory>, u32),
    /// The request cannot be served: the message for the exception.
    OutOfMemory(Box<[u8; MESSAGE_BYTES]>),
    /// CUDA failed for another reason than memory (an invalid device, a sticky error): the
    /// message for a plain runtime error.
    CudaError(Box<[u8; MESSAGE_BYTES]>),
    /// The shim is broken (a panic): pass through to a plain cudaMalloc.
    PassThrough,
}

/// A tensor of `size` bytes on `device` for `stream`: its address, recorded in the ledger.
pub fn alloc(
    cuda: &'static dyn CudaRuntime,
    host: &dyn Host,
    size: usize,
    device: i32,
    stream: u64,
) -> Result<u64, Failure> {
    let a = allocator(cuda);
    retire_ended_captures(cuda, a);
    let capture = source::capture_of(cuda, stream);
    if let Some(id) = capture {
        OPEN_CAPTURES.note(stream as usize, id);
    }
    source::set_capturing(capture.is_some());
    let context = history_stack(host, a, RecordContext::State);
    let result = a.malloc_in_context(device, size as u64, stream, capture, context);
    source::set_capturing(false);
    match result {
        Ok(block) => {
            host.record_tensor(
                block.addr as usize,
                size as u64,
                device,
                stream as usize,
                native_tensor_stacks() || !oomshim_host::pystack::active(),
            );
            Ok(block.addr)
        }
        Err(OutOfMemory {
            cause: OomCause::DeviceExhausted { cuda_error },
            segment_bytes,
            ..
        }) if cuda_error != MEMORY_ALLOCATION => {
            Err(Failure::CudaError(Box::new(c_message(&format!(
                "CUDA error {cuda_error} from cudaMalloc of a {} segment for a {} tensor on device {device} (oomshim allocator)",
                human_bytes(segment_bytes),
                human_bytes(size as u64)
            )))))
        }
        Err(oom) => Err(Failure::Unserved(Box::new(oom), context)),
    }
}

/// Frees a tensor; false when `ptr` is not one of the allocator's blocks.
pub fn free(cuda: &'static dyn CudaRuntime, host: &dyn Host, device: i32, ptr: u64) -> bool {
    let a = allocator(cuda);
    retire_ended_captures(cuda, a);
    host.forget(ptr as usize);
    let context = history_stack(host, a, RecordContext::All);
    a.free_in_context(device, ptr, context).is_some()
}

/// A plain segment of `size` bytes on `device`, outside the cache: the pass-through when the
/// shim itself failed.
pub fn pass_through_alloc(cuda: &'static dyn CudaRuntime, size: usize, device: i32) -> Option<u64> {
    use oomshim_host::alloc::MemorySource;
    CudaSource(cuda)
        .alloc_segment(device, size.max(1) as u64)
        .ok()
}

/// Gives a pass-through allocation back to CUDA.
pub fn pass_through_free(cuda: &'static dyn CudaRuntime, device: i32, ptr: u64, size: usize) {
    use oomshim_host::alloc::MemorySource;
    let _ = CudaSource(cuda).free_segment(device, ptr, size as u64);
}

/// The caller's Python stack for torch's memory history when it keeps stacks at `level` or
/// above (an allocation from `state`, a free at `all`); 0 otherwise, after one relaxed load.
#[inline]
fn history_stack(host: &dyn Host, a: &CachingAllocator<CudaSource>, level: RecordContext) -> u32 {
    match a.history_context() {
        Some(l) if l >= level => host.python_stack(),
        _ => 0,
    }
}

/// Records the failure (its dump is written now, with the framework's word `note` when its
/// observer gave one) and builds the exception's message; `context` is the stack of torch's
/// `oom` history entry.
pub fn out_of_memory(
    cuda: &'static dyn CudaRuntime,
    host: &dyn Host,
    oom: &OutOfMemory,
    stream: u64,
    mem_info: Option<(u64, u64)>,
    note: Option<FrameworkNote>,
    context: u32,
) -> [u8; MESSAGE_BYTES] {
    if allocator(cuda).history_context().is_some() {
        // torch's `oom` entry: the rounded request and what CUDA said was free.
        let free = mem_info.map_or(0, |m| m.0);
        allocator(cuda).record_oom(oom.device, oom.rounded, free, stream, context);
    }
    let outcome = host.out_of_memory(
        OomEvent {
            api: Api::TorchAlloc,
            bytes: oom.requested,
            device: oom.device,
            error_code: MEMORY_ALLOCATION,
            stream: stream as usize,
            context: FailureContext {
                memory_cap: memory_cap(oom, mem_info),
                ..failure_context(
                    oom.device,
                    judged_mem_info(oom, mem_info),
                    Some(free_blocks_with_segment_map(allocator(cuda), oom.device)),
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

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`: caps what the cache may
/// reserve on `device` at `fraction` of its total (no cap outside [0, 1)).
pub fn set_memory_fraction(cuda: &'static dyn CudaRuntime, fraction: f64, device: i32) {
    let total = source::mem_info_on(cuda, device).map(|m| m.1);
    let limit = match total {
        Some(t) if (0.0..1.0).contains(&fraction) => Some((t as f64 * fraction) as u64),
        _ => None,
    };
    allocator(cuda).set_memory_limit(device, limit);
}

/// torch's `memory_stats(device)` as a flat JSON object with torch's key names.
pub fn memory_stats_json(cuda: &'static dyn CudaRuntime, device: i32) -> String {
    let stats = allocator(cuda).stats(device).torch_keys();
    let map: serde_json::Map<String, serde_json::Value> =
        stats.into_iter().map(|(k, v)| (k, v.into())).collect();
    serde_json::Value::Object(map).to_string()
}

/// The free-block state of `device` as JSON (the dump's `free_blocks` object).
pub fn free_blocks_json(cuda: &'static dyn CudaRuntime, device: i32) -> String {
    serde_json::to_string(&free_blocks_for_dump(allocator(cuda), device))
        .ok()
        .unwrap_or_else(|| "{}".into())
}

/// The free-block state plus every segment of `device` with its blocks, as JSON.
pub fn segments_json(cuda: &'static dyn CudaRuntime, device: i32) -> String {
    serde_json::to_string(&free_blocks_with_segment_map(allocator(cuda), device))
        .ok()
        .unwrap_or_else(|| "{}".into())
}

/// torch's `_record_memory_history`: off when `enabled` is false (dropping the traces), else on
/// at context `level` (0 none, 1 state, 2 alloc, 3 all) with a ring of `max_entries` per device;
/// `clear` drops what was recorded. 0, or -1 for a level out of range (nothing changed).
pub fn record_history(
    cuda: &'static dyn CudaRuntime,
    enabled: bool,
    level: i32,
    max_entries: u64,
    clear: bool,
) -> i32 {
    let Some(context) = RecordContext::from_level(level) else {
        return -1;
    };
    let config = enabled.then_some(HistoryConfig {
        context,
        max_entries: usize::try_from(max_entries).unwrap_or(usize::MAX),
    });
    allocator(cuda).record_history(config, clear);
    0
}

/// torch's memory history of `device` as JSON (`crate::allocator_mode::history::history_json`); as
/// torch's snapshot does, a `snapshot` entry is recorded once the trace was read.
pub fn history_json(cuda: &'static dyn CudaRuntime, host: &dyn Host, device: i32) -> String {
    let a = allocator(cuda);
    let json = super::history::history_json(host, &a.trace(device), &a.segments(device));
    a.record_snapshot(device);
    json
}

/// What an allocator-mode failure on `device` knows, gathered on the failing thread: free/total
/// as asked for the exception's message, the allocator's exact free blocks, and what the process
/// learnt before (the UUID, the CUDA versions); the allocator asks CUDA nothing more.
fn failure_context(
    device: i32,
    mem_info: Option<(u64, u64)>,
    free_blocks: Option<FreeBlocks>,
) -> FailureContext {
    FailureContext {
        free_blocks,
        ..FailureContext::learnt_before(Some(device), mem_info)
    }
}

/// The allocator's free-block state of `device` (device 0 when none), when allocator mode is on.
pub(crate) fn free_blocks(device: Option<i32>) -> Option<FreeBlocks> {
    free_blocks_if_active(device.unwrap_or(0))
}
