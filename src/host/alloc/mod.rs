//! The caching allocator behind "PyTorch allocator mode".
//!
//! Set as PyTorch's pluggable allocator, oomshim serves every tensor itself. This module is that
//! allocator as plain Rust over an abstract [`MemorySource`] (segments and events), so it runs
//! and is tested without CUDA; `src/preload/allocator_mode` runs it over the CUDA runtime,
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
mod interface;
mod lock;
mod stats;
#[cfg(test)]
mod tests;

pub use caching::CachingAllocator;
pub use history::{HistoryConfig, RecordContext, TraceAction, TraceEntry};
pub use interface::{
    AllocConfig, Block, BlockState, BlockView, FreeBlockSummary, HistBin, MemorySource, OomCause,
    OutOfMemory, SegmentView, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_MEMORY_ALLOCATION, MAX_DEVICES,
};
pub use stats::{DeviceStats, PoolKind, Stat, StatArray};
