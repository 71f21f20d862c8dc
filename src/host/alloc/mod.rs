//! The caching allocator behind "PyTorch allocator mode".
//!
//! Set as PyTorch's pluggable allocator, oomshim serves every tensor itself. This module is that
//! allocator as plain Rust over an abstract [`MemorySource`] (segments and events), so it runs
//! and is tested without CUDA; `src/preload/live/allocator_mode` runs it over the CUDA runtime,
//! behind the C entry points of `src/preload/ffi/torch_alloc.rs`.
//!
//! # Policy, and why
//!
//! The policy is torch's native caching allocator (c10/cuda/CUDACachingAllocator.cpp), because
//! the goal is to replace it without changing how much memory a program reserves: a different
//! policy would change peak reserved memory and could make a job OOM that fits natively.
//!
//! - **Rounding.** Requests are rounded up to a multiple of 512 B (`min_block`, torch
//!   `kMinBlockSize`); 0 B is served as 512 B (torch never calls its allocator for 0 B).
//!   `roundup_power2_divisions` is not implemented (it is off by default in torch).
//! - **Pools.** Rounded requests ≤ 1 MiB use the small pool, served from 2 MiB segments; larger
//!   ones the large pool: below 10 MiB from a 20 MiB segment, otherwise from a segment of the
//!   request rounded up to 2 MiB (torch `get_allocation_size`). Small blocks stay together, so
//!   they do not fragment the large segments.
//! - **Best fit.** Each pool keeps free blocks per stream ordered by (size, address): a request
//!   takes the smallest free block that fits, lowest address first, as torch's
//!   `BlockComparatorSize` does.
//! - **Split.** A found block is split when the remainder is ≥ 512 B (small pool) or > 1 MiB
//!   (large pool, and only for requests below `max_split_size`); otherwise the request gets
//!   the whole block, as in torch (large blocks are not cut into slivers).
//! - **Oversize** (`max_split_size`, if set): blocks of at least that size are never split,
//!   never serve a smaller request, and serve a request ≥ `max_split_size` only if it would
//!   waste less than `max_non_split_rounding` (20 MiB): torch's rule, which stops big cached
//!   blocks from being carved up by small tensors.
//! - **Coalesce.** A freed block merges with free neighbours of its segment at once, so the
//!   cache never holds two adjacent free blocks.
//! - **Streams.** A block belongs to the stream it was allocated on (torch's free callback
//!   passes that stream) and is reused only by requests on that stream: the stream's queued
//!   work may still use it, and work on one stream is ordered. Segments belong to one stream.
//! - **record_stream.** Freeing a block that other streams used records one event per such
//!   stream (outside the lock) and keeps the block *pending free* (still active, not
//!   reusable) until every event is done. Events are polled at the start of `malloc` and by
//!   `empty_cache`, each stream's oldest first, stopping at the first unfinished one (work on
//!   a stream finishes in order), as torch's `process_events` does. Only one thread polls a
//!   device at a time, so an event is never queried after another poller destroyed it.
//!   Unlike torch's `synchronize_and_free_events`, `empty_cache` and the OOM retry do not
//!   block on unfinished events (the source has no blocking wait); they retire those done.
//! - **Out of memory.** When no cached block fits and the source refuses a segment (error 2),
//!   or the segment would take reserved bytes past the `set_memory_limit` cap, every fully free
//!   cached segment of that device is released and the segment is asked for once more —
//!   torch's retry (`num_alloc_retries`). Only then is [`OutOfMemory`] returned (`num_ooms`),
//!   with the free-block summary and stats after the release. Other CUDA errors fail at once,
//!   without retry and without counting an OOM, as in torch.
//! - **History.** torch's `_record_memory_history` is kept here too (`history.rs`): a trace of
//!   torch's actions per device and the stack id of each live block, while it is on.
//! - **CUDA graphs.** A block allocated with `capture: Some(id)` comes from a private pool of
//!   that capture, with its own segments (torch's graph pool). Freed during the capture, it is
//!   reused only by later allocations of the same capture (the graph's own order makes that
//!   safe). After [`CachingAllocator::end_capture`] — or if freed after it — it is never reused
//!   and never released, because the graph may replay and write it at any time; it stays
//!   reserved until the process exits, visible in the stats (as torch counts private pools)
//!   and in [`FreeBlockSummary::graph_retained_free_bytes`]. While capturing, an OOM does not
//!   release cached segments (cudaFree is illegal during capture), as in torch.
//!
//! # Locking and cost
//!
//! One spin lock per device guards its state; no lock is ever held across a
//! [`MemorySource`] call. A miss reserves the segment's bytes against the cap, drops the lock,
//! asks the source, then retakes the lock to insert and split; two threads missing at once may
//! both get a segment, which is harmless. The hit path is two tree operations and a hash-map
//! operation each way under one lock (about 90 ns a malloc+free pair on the development
//! VM; `benches/alloc.rs`).
//! [`CachingAllocator::free_blocks`] reads counters kept on every split, merge, allocation and
//! free (total free bytes, 64 power-of-two bins, inactive split bytes) and takes the largest
//! free block from the last entry of each (pool, stream) free list, which is already ordered by
//! size: no scan of the blocks, and no second ordered set to update on the hot path.

mod caching;
mod device;
mod history;
mod lock;
mod stats;
#[cfg(test)]
mod tests;

pub use caching::CachingAllocator;
pub use history::{HistoryConfig, RecordContext, TraceAction, TraceEntry};
pub use stats::{DeviceStats, Stat, StatArray};

/// CUDA's `cudaErrorMemoryAllocation`.
pub const CUDA_ERROR_MEMORY_ALLOCATION: i32 = 2;
/// CUDA's `cudaErrorInvalidDevice`: returned for device ids outside `0..MAX_DEVICES`.
pub const CUDA_ERROR_INVALID_DEVICE: i32 = 101;
/// Device ids the allocator accepts: `0..MAX_DEVICES`.
pub const MAX_DEVICES: usize = 64;

/// Where segments and events come from. Implemented by the lead over the real CUDA runtime
/// (cudaMalloc / cudaFree / cudaEventCreateWithFlags+cudaEventRecord / cudaEventQuery /
/// cudaEventDestroy, called through the real functions), and in tests by a fake.
/// The allocator never calls a `MemorySource` method while holding one of its own locks.
pub trait MemorySource: Send + Sync {
    /// A new segment of exactly `bytes` on `device`; Err(cuda error code) when refused (2 = out of memory).
    fn alloc_segment(&self, device: i32, bytes: u64) -> Result<u64, i32>;
    fn free_segment(&self, device: i32, addr: u64, bytes: u64) -> Result<(), i32>;
    /// Records an event on `stream` (of `device`) and returns an opaque handle.
    fn record_event(&self, device: i32, stream: u64) -> Result<u64, i32>;
    /// True once all work recorded before the event is done.
    fn event_done(&self, event: u64) -> bool;
    fn destroy_event(&self, event: u64);
}

/// The allocator's tunables; `Default` gives torch's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocConfig {
    /// Blocks at least this large are never split (torch `max_split_size_mb`); None = unlimited.
    pub max_split_size: Option<u64>,
    /// Round requests up to a multiple of this (torch kMinBlockSize = 512).
    pub min_block: u64,
    /// Requests up to this size use the small pool (torch kSmallSize = 1 MiB).
    pub small_size: u64,
    /// Segment size of the small pool (torch kSmallBuffer = 2 MiB).
    pub small_segment: u64,
    /// Segment size for large requests below `min_large_alloc` (torch kLargeBuffer = 20 MiB).
    pub large_segment: u64,
    /// Large requests at least this size get a segment of their own size (torch kMinLargeAlloc = 10 MiB).
    pub min_large_alloc: u64,
    /// Those segments are rounded up to a multiple of this (torch kRoundLarge = 2 MiB).
    pub round_large: u64,
    /// A request of at least `max_split_size` may take a cached oversize block only if the block is
    /// smaller than request + this (torch `max_non_split_rounding_mb`, default 20 MiB).
    pub max_non_split_rounding: u64,
}

impl Default for AllocConfig {
    fn default() -> Self {
        const MIB: u64 = 1 << 20;
        AllocConfig {
            max_split_size: None,
            min_block: 512,
            small_size: MIB,
            small_segment: 2 * MIB,
            large_segment: 20 * MIB,
            min_large_alloc: 10 * MIB,
            round_large: 2 * MIB,
            max_non_split_rounding: 20 * MIB,
        }
    }
}

/// Torch's two block pools: small (≤ 1 MiB requests, 2 MiB segments) and large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    Small,
    Large,
}

/// A block handed out by [`CachingAllocator::malloc`] (or given back by `free`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub addr: u64,
    /// The rounded size the block occupies.
    pub size: u64,
    /// The size asked for.
    pub requested: u64,
    pub device: i32,
    pub stream: u64,
    pub pool: PoolKind,
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomCause {
    /// The device refused a new segment even after releasing every cached free segment.
    DeviceExhausted { cuda_error: i32 },
    /// The per-process memory-fraction cap (set_memory_fraction) would be exceeded.
    FractionCap { limit: u64 },
}

/// A failed allocation, with the allocator's state at the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    pub device: i32,
    pub requested: u64,
    pub rounded: u64,
    /// The segment size it tried to get from the device.
    pub segment_bytes: u64,
    pub cause: OomCause,
    /// Bytes released by emptying the cache before giving up (the retry torch also does).
    pub released_before_failing: u64,
    /// The free-block state at the failure (after that release).
    pub free_blocks: FreeBlockSummary,
    pub stats: DeviceStats,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cause {
            OomCause::DeviceExhausted { cuda_error } => write!(
                f,
                "device {} refused a segment of {} bytes for a request of {} bytes (CUDA error {})",
                self.device, self.segment_bytes, self.requested, cuda_error
            ),
            OomCause::FractionCap { limit } => write!(
                f,
                "a segment of {} bytes for a request of {} bytes on device {} would exceed the memory limit of {} bytes",
                self.segment_bytes, self.requested, self.device, limit
            ),
        }?;
        write!(
            f,
            "; reserved {} allocated {} free {} (largest free block {})",
            self.free_blocks.reserved_bytes,
            self.free_blocks.allocated_bytes,
            self.free_blocks.total_free_bytes,
            self.free_blocks.largest_free_bytes
        )
    }
}

impl std::error::Error for OutOfMemory {}

/// The free-block state of one device, maintained continuously (no scan).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FreeBlockSummary {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub segments: u64,
    /// Free bytes that can serve an allocation (blocks of ended CUDA graph captures excluded:
    /// they are in `graph_retained_free_bytes`).
    pub total_free_bytes: u64,
    pub largest_free_bytes: u64,
    /// 1 - largest/total_free; None when there are no free bytes.
    pub fragmentation: Option<f64>,
    /// Free bytes in segments that also hold live/pending blocks (torch inactive_split_bytes).
    pub inactive_split_bytes: u64,
    /// Power-of-two bins of free blocks, only non-empty bins, ascending: bin [lo, hi) where lo = 2^k, hi = 2^(k+1).
    pub histogram: Vec<HistBin>,
    /// Free bytes that belong to ended CUDA graph captures: reserved for good, never reused.
    pub graph_retained_free_bytes: u64,
    /// Bytes in blocks freed but waiting for `record_stream` events.
    pub pending_free_bytes: u64,
}

/// One power-of-two bin of free blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistBin {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
    pub bytes: u64,
}

/// One block of a segment, as torch's snapshot describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockView {
    pub addr: u64,
    pub size: u64,
    /// The requested size of an allocated or pending block; 0 for an inactive one.
    pub requested: u64,
    pub state: BlockState,
    /// The stack id its allocation passed while torch's memory history kept stacks; else 0.
    pub context: u32,
}

/// Torch snapshot block states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

/// One segment with its blocks in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView {
    pub device: i32,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: PoolKind,
    /// The CUDA graph capture the segment belongs to (torch's private pool id), if any.
    pub capture: Option<u64>,
    /// The stack id of the allocation that made it, while history kept stacks; else 0.
    pub context: u32,
    pub blocks: Vec<BlockView>,
}
