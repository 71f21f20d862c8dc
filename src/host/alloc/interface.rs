//! What the allocator takes and gives: the memory source it asks for segments and events, its
//! configuration, the CUDA error codes it answers with, its blocks, the out-of-memory error, and
//! the views of its state (free-block summary, segments and their blocks). The other files of
//! `alloc/` and the shim above share these; `mod.rs` re-exports them.

use super::stats::{DeviceStats, PoolKind};

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
