//! One device's allocator state: segments cut into blocks, the free lists, the live-block map, the
//! blocks waiting for `record_stream` events, torch's stats and the free-block summary counters.
//!
//! Everything here runs under the device's lock and never calls out (no `MemorySource` call):
//! `allocator.rs` does the calls between the lock's critical sections.

use super::history::{Trace, TraceAction};
use super::interface::{
    AllocConfig, Block, BlockState, BlockView, FreeBlockSummary, HistBin, OomCause, OutOfMemory,
    SegmentView,
};
use super::stats::{DeviceStats, PoolKind};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, VecDeque};

/// "No block" in the intrusive neighbour links.
const NIL: u32 = u32::MAX;
/// The device-wide pools; CUDA graph captures get their own pair after these.
const GENERAL_SMALL: u32 = 0;
const GENERAL_LARGE: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeState {
    /// Handed out and not freed.
    Allocated,
    /// Freed, but `record_stream` events are outstanding: still active, not reusable.
    Pending,
    /// Free: in its pool's free list (or, in an ended capture's pool, retained for good).
    Free,
}

/// A block of a segment. Blocks of a segment form a doubly linked list in address order, which
/// is what makes coalescing O(1).
#[derive(Debug)]
struct Node {
    addr: u64,
    size: u64,
    requested: u64,
    /// The stream the segment was allocated for; every block of a segment keeps it.
    stream: u64,
    prev: u32,
    next: u32,
    pool: u32,
    state: NodeState,
    /// Events still outstanding while `Pending`.
    pending_events: u32,
    /// Streams recorded by `record_stream` on the current allocation (never the block's own).
    stream_uses: Vec<u64>,
    /// The caller's stack id of the current allocation (history on), else 0.
    context: u32,
}

/// A pool's free blocks of one stream, ordered by (size, address): with the stream chosen
/// first, this is torch's `BlockComparatorSize` order (stream, size, address), so the first
/// entry at or after (size, 0) is torch's best fit. One map per stream keeps the maps small and
/// gives each stream's largest free block as its last entry. The key is (size, address) packed
/// into one u128 (see [`free_key`]): one wide comparison per key instead of two.
type FreeList = BTreeMap<u128, u32>;

/// The free-list key of a block: size in the high half, address in the low half.
#[inline]
fn free_key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

#[derive(Debug)]
struct Pool {
    kind: PoolKind,
    /// The CUDA graph capture this private pool belongs to.
    capture: Option<u64>,
    /// The capture ended: its blocks may be replayed into at any time, so none is reused.
    sealed: bool,
    free: StreamLists,
}

/// A pool's free lists by stream. Programs use a handful of streams, so a linear scan of a
/// short vector beats hashing on the hot path.
#[derive(Debug, Default)]
struct StreamLists(Vec<(u64, FreeList)>);

impl StreamLists {
    #[inline]
    fn get(&self, stream: u64) -> Option<&FreeList> {
        self.0.iter().find(|(s, _)| *s == stream).map(|(_, l)| l)
    }

    #[inline]
    fn get_mut(&mut self, stream: u64) -> Option<&mut FreeList> {
        self.0
            .iter_mut()
            .find(|(s, _)| *s == stream)
            .map(|(_, l)| l)
    }

    #[inline]
    fn entry(&mut self, stream: u64) -> &mut FreeList {
        match self.0.iter().position(|(s, _)| *s == stream) {
            Some(i) => &mut self.0[i].1,
            None => {
                self.0.push((stream, FreeList::new()));
                &mut self.0.last_mut().expect("just pushed").1
            }
        }
    }

    fn values(&self) -> impl Iterator<Item = &FreeList> {
        self.0.iter().map(|(_, l)| l)
    }
}

#[derive(Debug)]
struct Segment {
    /// The first block; stable for the segment's life because merges keep the lower block.
    head: u32,
    size: u64,
    /// The stack id of the allocation that made the segment (history on), else 0.
    context: u32,
}

/// What `free_allocated` left to do outside the lock.
pub(crate) struct PendingFree {
    pub node: u32,
    pub streams: Vec<u64>,
}

/// The size-related part of the configuration used on the hot path.
#[derive(Debug, Clone, Copy)]
struct Limits {
    small_size: u64,
    min_block: u64,
    /// `u64::MAX` when unlimited.
    max_split: u64,
    max_non_split_rounding: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct HistCell {
    count: u64,
    bytes: u64,
}

pub(crate) struct DeviceState {
    device: i32,
    limits: Limits,
    nodes: Vec<Node>,
    spare_nodes: Vec<u32>,
    pools: Vec<Pool>,
    capture_pools: FxHashMap<u64, [u32; 2]>,
    ended_captures: FxHashSet<u64>,
    live: FxHashMap<u64, u32>,
    segments: BTreeMap<u64, Segment>,
    /// Outstanding events per recorded stream, in the order they were attached (≈ recorded),
    /// each with the pending block it guards. Work on a stream completes in order, so polling
    /// stops at a stream's first unfinished event, as torch's `process_events` does.
    pending: FxHashMap<u64, VecDeque<(u64, u32)>>,
    pending_count: usize,
    pub(crate) stats: DeviceStats,
    // The free-block summary, maintained on every change so reading it is O(bins). Covers free
    // blocks that can serve an allocation (not those retained by ended captures).
    hist: [HistCell; 64],
    free_total: u64,
    retained_free: u64,
    pending_bytes: u64,
    /// Reserved-bytes cap (set_per_process_memory_fraction).
    pub(crate) limit: Option<u64>,
    /// Segment bytes being requested from the source right now (counted against `limit`).
    pub(crate) inflight: u64,
    /// A thread is querying events with the lock dropped. Only one thread polls at a time, so
    /// an event is never queried after another poller retired and destroyed it.
    pub(crate) polling: bool,
    /// torch's memory history while it is on (see `history.rs`); None, and never touched
    /// beyond that test, while it is off.
    pub(crate) trace: Option<Box<Trace>>,
}

/// Power-of-two bin of a non-zero size.
#[inline]
fn bin_of(size: u64) -> usize {
    63 - size.max(1).leading_zeros() as usize
}

impl DeviceState {
    pub(crate) fn new(device: i32, config: &AllocConfig) -> Self {
        let pool = |kind| Pool {
            kind,
            capture: None,
            sealed: false,
            free: StreamLists::default(),
        };
        DeviceState {
            device,
            limits: Limits {
                small_size: config.small_size,
                min_block: config.min_block.max(1),
                max_split: config.max_split_size.unwrap_or(u64::MAX),
                max_non_split_rounding: config.max_non_split_rounding,
            },
            nodes: Vec::new(),
            spare_nodes: Vec::new(),
            pools: vec![pool(PoolKind::Small), pool(PoolKind::Large)],
            capture_pools: FxHashMap::default(),
            ended_captures: FxHashSet::default(),
            live: FxHashMap::default(),
            segments: BTreeMap::new(),
            pending: FxHashMap::default(),
            pending_count: 0,
            stats: DeviceStats::new(config.max_split_size),
            hist: [HistCell::default(); 64],
            free_total: 0,
            retained_free: 0,
            pending_bytes: 0,
            limit: None,
            inflight: 0,
            polling: false,
            trace: None,
        }
    }

    pub(crate) fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all.current as u64
    }

    #[inline]
    pub(crate) fn has_pending(&self) -> bool {
        self.pending_count > 0
    }

    /// The pool serving `kind` requests for `capture` (created on first use).
    #[inline]
    pub(crate) fn pool_for(&mut self, kind: PoolKind, capture: Option<u64>) -> u32 {
        let pair = match capture {
            None => [GENERAL_SMALL, GENERAL_LARGE],
            Some(id) => match self.capture_pools.get(&id) {
                Some(pair) => *pair,
                None => {
                    let sealed = self.ended_captures.contains(&id);
                    let base = self.pools.len() as u32;
                    for kind in [PoolKind::Small, PoolKind::Large] {
                        self.pools.push(Pool {
                            kind,
                            capture: Some(id),
                            sealed,
                            free: StreamLists::default(),
                        });
                    }
                    let pair = [base, base + 1];
                    self.capture_pools.insert(id, pair);
                    pair
                }
            },
        };
        match kind {
            PoolKind::Small => pair[0],
            PoolKind::Large => pair[1],
        }
    }

    // ---- node storage ------------------------------------------------------------------

    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare_nodes.pop() {
            Some(idx) => {
                self.nodes[idx as usize] = node;
                idx
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn recycle(&mut self, idx: u32) {
        let node = &mut self.nodes[idx as usize];
        node.prev = NIL;
        node.next = NIL;
        node.stream_uses = Vec::new();
        self.spare_nodes.push(idx);
    }

    #[inline]
    fn node(&self, idx: u32) -> &Node {
        &self.nodes[idx as usize]
    }

    #[inline]
    fn node_mut(&mut self, idx: u32) -> &mut Node {
        &mut self.nodes[idx as usize]
    }

    // ---- free lists and the summary counters ---------------------------------------------

    /// Puts a block (already in state Free) into its pool's free list and the summary counters;
    /// a block of a sealed pool is only counted as retained.
    #[inline]
    fn add_free(&mut self, idx: u32) {
        let (stream, size, addr, pool) = {
            let n = self.node(idx);
            (n.stream, n.size, n.addr, n.pool)
        };
        let pool = &mut self.pools[pool as usize];
        if pool.sealed {
            self.retained_free += size;
            return;
        }
        pool.free.entry(stream).insert(free_key(size, addr), idx);
        self.free_total += size;
        let cell = &mut self.hist[bin_of(size)];
        cell.count += 1;
        cell.bytes += size;
    }

    /// Takes a free block out of its free list and the summary counters (inverse of `add_free`).
    #[inline]
    fn remove_free(&mut self, idx: u32) {
        let (stream, size, addr, pool) = {
            let n = self.node(idx);
            (n.stream, n.size, n.addr, n.pool)
        };
        let pool = &mut self.pools[pool as usize];
        if pool.sealed {
            self.retained_free -= size;
            return;
        }
        if let Some(list) = pool.free.get_mut(stream) {
            list.remove(&free_key(size, addr));
        }
        self.free_total -= size;
        let cell = &mut self.hist[bin_of(size)];
        cell.count -= 1;
        cell.bytes -= size;
    }

    /// The block's share of torch's inactive_split stats: a free block in a segment that also
    /// holds other blocks.
    #[inline]
    fn inactive_split_share(&self, idx: u32) -> (i64, i64) {
        let n = self.node(idx);
        if n.state == NodeState::Free && (n.prev != NIL || n.next != NIL) {
            (1, n.size as i64)
        } else {
            (0, 0)
        }
    }

    /// Applies one operation's net change of inactive_split (torch applies the net change too,
    /// so peaks never see an intermediate value).
    fn apply_inactive_split(&mut self, kind: PoolKind, before: (i64, i64), after: (i64, i64)) {
        self.stats.inactive_split.add(kind, after.0 - before.0);
        self.stats
            .inactive_split_bytes
            .add(kind, after.1 - before.1);
    }

    // ---- allocation --------------------------------------------------------------------

    /// Best fit from the free list of `pool` on `stream` (torch `get_free_block`), or None.
    #[inline]
    pub(crate) fn try_take(
        &mut self,
        pool: u32,
        stream: u64,
        rounded: u64,
        requested: u64,
        context: u32,
    ) -> Option<Block> {
        let p = &self.pools[pool as usize];
        if p.sealed {
            return None;
        }
        let (&key, &idx) = p.free.get(stream)?.range(free_key(rounded, 0)..).next()?;
        let size = (key >> 64) as u64;
        let max_split = self.limits.max_split;
        // Torch's oversize rules: a request below max_split never takes an unsplittable block,
        // and a large request takes one only if it wastes less than max_non_split_rounding.
        if rounded < max_split && size >= max_split {
            return None;
        }
        if rounded >= max_split
            && size >= rounded.saturating_add(self.limits.max_non_split_rounding)
        {
            return None;
        }
        self.remove_free(idx);
        Some(self.carve(idx, rounded, requested, context))
    }

    /// Registers a new segment from the source and serves the request from it.
    // The request's fields and the segment's, on the miss path: a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_segment_and_take(
        &mut self,
        pool: u32,
        addr: u64,
        bytes: u64,
        stream: u64,
        rounded: u64,
        requested: u64,
        context: u32,
    ) -> Block {
        let kind = self.pools[pool as usize].kind;
        let idx = self.new_node(Node {
            addr,
            size: bytes,
            requested: 0,
            stream,
            prev: NIL,
            next: NIL,
            pool,
            state: NodeState::Free,
            pending_events: 0,
            stream_uses: Vec::new(),
            context: 0,
        });
        self.segments.insert(
            addr,
            Segment {
                head: idx,
                size: bytes,
                context,
            },
        );
        if let Some(trace) = &mut self.trace {
            trace.record(TraceAction::SegmentAlloc, addr, bytes, stream, context);
        }
        self.stats.segment.add(kind, 1);
        self.stats.reserved_bytes.add(kind, bytes as i64);
        self.stats.num_device_alloc += 1;
        if bytes >= self.limits.max_split {
            self.stats.oversize_segments.add(1);
        }
        self.carve(idx, rounded, requested, context)
    }

    /// Torch's `should_split`.
    #[inline]
    fn should_split(&self, kind: PoolKind, block_size: u64, rounded: u64) -> bool {
        let remaining = block_size - rounded;
        match kind {
            PoolKind::Small => remaining >= self.limits.min_block,
            PoolKind::Large => {
                rounded < self.limits.max_split && remaining > self.limits.small_size
            }
        }
    }

    /// Allocates the free block `idx` (already out of the free lists), splitting off the rest
    /// when torch would (`alloc_found_block`).
    #[inline]
    fn carve(&mut self, idx: u32, rounded: u64, requested: u64, context: u32) -> Block {
        let before = self.inactive_split_share(idx);
        let (addr, size, stream, pool, next) = {
            let n = self.node(idx);
            (n.addr, n.size, n.stream, n.pool, n.next)
        };
        let kind = self.pools[pool as usize].kind;
        let mut after = (0, 0);
        let mut block_size = size;
        if self.should_split(kind, size, rounded) {
            let rest = self.new_node(Node {
                addr: addr + rounded,
                size: size - rounded,
                requested: 0,
                stream,
                prev: idx,
                next,
                pool,
                state: NodeState::Free,
                pending_events: 0,
                stream_uses: Vec::new(),
                context: 0,
            });
            if next != NIL {
                self.node_mut(next).prev = rest;
            }
            let n = self.node_mut(idx);
            n.next = rest;
            n.size = rounded;
            block_size = rounded;
            self.add_free(rest);
            after = self.inactive_split_share(rest);
        }
        let n = self.node_mut(idx);
        n.state = NodeState::Allocated;
        n.requested = requested;
        n.context = context;
        n.stream_uses.clear();
        self.apply_inactive_split(kind, before, after);
        let s = &mut self.stats;
        s.allocation.add(kind, 1);
        s.allocated_bytes.add(kind, block_size as i64);
        s.active.add(kind, 1);
        s.active_bytes.add(kind, block_size as i64);
        s.requested_bytes.add(kind, requested as i64);
        if block_size >= self.limits.max_split {
            s.oversize_allocations.add(1);
        }
        self.live.insert(addr, idx);
        if let Some(trace) = &mut self.trace {
            trace.record(TraceAction::Alloc, addr, requested, stream, context);
        }
        Block {
            addr,
            size: block_size,
            requested,
            device: self.device,
            stream,
            pool: kind,
        }
    }

    // ---- free --------------------------------------------------------------------------

    /// Torch's `free`: the block stops being allocated at once; it becomes reusable now, or,
    /// if streams were recorded on it, once their events (to be recorded by the caller outside
    /// the lock) are done.
    #[inline]
    /// `context`: the stack id of the free (history at level `all`), else 0.
    pub(crate) fn free_allocated(
        &mut self,
        addr: u64,
        context: u32,
    ) -> Option<(Block, Option<PendingFree>)> {
        let idx = self.live.remove(&addr)?;
        let max_split = self.limits.max_split;
        let device = self.device;
        let n = &mut self.nodes[idx as usize];
        let kind = self.pools[n.pool as usize].kind;
        let block = Block {
            addr: n.addr,
            size: n.size,
            requested: n.requested,
            device,
            stream: n.stream,
            pool: kind,
        };
        let s = &mut self.stats;
        s.allocation.add(kind, -1);
        s.allocated_bytes.add(kind, -(block.size as i64));
        s.requested_bytes.add(kind, -(block.requested as i64));
        if block.size >= max_split {
            s.oversize_allocations.add(-1);
        }
        if let Some(trace) = &mut self.trace {
            let context = trace.free_context(context, n.context);
            trace.record(
                TraceAction::FreeRequested,
                block.addr,
                block.requested,
                block.stream,
                context,
            );
        }
        if n.stream_uses.is_empty() {
            self.release_block(idx, context);
            return Some((block, None));
        }
        let streams = std::mem::take(&mut n.stream_uses);
        n.state = NodeState::Pending;
        n.pending_events = streams.len() as u32;
        self.pending_bytes += block.size;
        Some((block, Some(PendingFree { node: idx, streams })))
    }

    /// The events recorded for a pending block, as (stream, event); `failed` recordings count
    /// as done (without an event there is nothing to wait for).
    pub(crate) fn attach_events(&mut self, node: u32, events: &[(u64, u64)], failed: u32) {
        for &(stream, event) in events {
            self.pending
                .entry(stream)
                .or_default()
                .push_back((event, node));
            self.pending_count += 1;
        }
        self.event_finished(node, failed);
    }

    /// The first `per_stream` outstanding events of every stream, to be queried in order
    /// outside the lock.
    pub(crate) fn pending_fronts(&self, per_stream: usize) -> Vec<(u64, Vec<u64>)> {
        self.pending
            .iter()
            .map(|(&stream, queue)| {
                (
                    stream,
                    queue.iter().take(per_stream).map(|&(e, _)| e).collect(),
                )
            })
            .collect()
    }

    /// The first `n` events of each listed stream are done: retires them and frees the blocks
    /// left with no outstanding event. Returns the retired events, for the caller to destroy
    /// outside the lock. Only the single poller calls this, and attaching only appends, so the
    /// fronts are the events it queried.
    pub(crate) fn complete_fronts(&mut self, done: &[(u64, usize)]) -> Vec<u64> {
        let mut retired = Vec::new();
        for &(stream, n) in done {
            let Some(queue) = self.pending.get_mut(&stream) else {
                continue;
            };
            let n = n.min(queue.len());
            let finished: Vec<(u64, u32)> = queue.drain(..n).collect();
            if queue.is_empty() {
                self.pending.remove(&stream);
            }
            self.pending_count -= finished.len();
            for (event, node) in finished {
                retired.push(event);
                self.event_finished(node, 1);
            }
        }
        retired
    }

    fn event_finished(&mut self, node: u32, count: u32) {
        if count == 0 {
            return;
        }
        let n = self.node_mut(node);
        n.pending_events = n.pending_events.saturating_sub(count);
        if n.pending_events == 0 {
            let size = n.size;
            self.pending_bytes -= size;
            self.release_block(node, 0);
        }
    }

    /// Torch's `free_block`: an active block becomes free, merged with free neighbours.
    /// `context`: the free's stack id (history at level `all`), else 0.
    #[inline]
    fn release_block(&mut self, idx: u32, context: u32) {
        let (size, pool) = {
            let n = self.node(idx);
            (n.size, n.pool)
        };
        if let Some(trace) = &mut self.trace {
            let n = &self.nodes[idx as usize];
            let context = trace.free_context(context, n.context);
            trace.record(
                TraceAction::FreeCompleted,
                n.addr,
                n.requested,
                n.stream,
                context,
            );
        }
        let kind = self.pools[pool as usize].kind;
        self.stats.active.add(kind, -1);
        self.stats.active_bytes.add(kind, -(size as i64));
        self.node_mut(idx).state = NodeState::Free;
        self.node_mut(idx).requested = 0;
        self.node_mut(idx).context = 0;

        let mut before = (0, 0);
        let mut survivor = idx;
        let prev = self.node(idx).prev;
        if prev != NIL && self.node(prev).state == NodeState::Free {
            let share = self.inactive_split_share(prev);
            before = (before.0 + share.0, before.1 + share.1);
            self.remove_free(prev);
            // Merge into the lower block so a segment's head never changes.
            let next = self.node(idx).next;
            self.node_mut(prev).size += size;
            self.node_mut(prev).next = next;
            if next != NIL {
                self.node_mut(next).prev = prev;
            }
            self.recycle(idx);
            survivor = prev;
        }
        let next = self.node(survivor).next;
        if next != NIL && self.node(next).state == NodeState::Free {
            let share = self.inactive_split_share(next);
            before = (before.0 + share.0, before.1 + share.1);
            self.remove_free(next);
            let (next_size, next_next) = (self.node(next).size, self.node(next).next);
            let s = self.node_mut(survivor);
            s.size += next_size;
            s.next = next_next;
            if next_next != NIL {
                self.node_mut(next_next).prev = survivor;
            }
            self.recycle(next);
        }
        let after = self.inactive_split_share(survivor);
        self.apply_inactive_split(kind, before, after);
        self.add_free(survivor);
    }

    /// Tensor.record_stream. False for an address not allocated here.
    pub(crate) fn record_stream(&mut self, addr: u64, stream: u64) -> bool {
        let Some(&idx) = self.live.get(&addr) else {
            return false;
        };
        let n = self.node_mut(idx);
        if stream != n.stream && !n.stream_uses.contains(&stream) {
            n.stream_uses.push(stream);
        }
        true
    }

    // ---- release, captures -------------------------------------------------------------

    /// Takes every fully free segment of the device-wide pools out of the cache (torch
    /// `release_cached_blocks`); the caller returns them to the source outside the lock.
    /// Capture pools are never released (a graph may replay into them).
    pub(crate) fn release_free_segments(&mut self) -> Vec<(u64, u64)> {
        let mut whole = Vec::new();
        for pool in [GENERAL_SMALL, GENERAL_LARGE] {
            for list in self.pools[pool as usize].free.values() {
                whole.extend(list.values().copied().filter(|&idx| {
                    let n = &self.nodes[idx as usize];
                    n.prev == NIL && n.next == NIL
                }));
            }
        }
        let mut released = Vec::with_capacity(whole.len());
        for idx in whole {
            self.remove_free(idx);
            let (addr, size, pool, stream) = {
                let n = self.node(idx);
                (n.addr, n.size, n.pool, n.stream)
            };
            let kind = self.pools[pool as usize].kind;
            let segment = self.segments.remove(&addr);
            if let Some(trace) = &mut self.trace {
                let context = segment.map_or(0, |s| s.context);
                trace.record(TraceAction::SegmentFree, addr, size, stream, context);
            }
            self.stats.segment.add(kind, -1);
            self.stats.reserved_bytes.add(kind, -(size as i64));
            self.stats.num_device_free += 1;
            if size >= self.limits.max_split {
                self.stats.oversize_segments.add(-1);
            }
            self.recycle(idx);
            released.push((addr, size));
        }
        released
    }

    /// The capture ended: its free blocks (and those freed later) are never reused.
    pub(crate) fn seal_capture(&mut self, capture: u64) {
        self.ended_captures.insert(capture);
        let Some(&pair) = self.capture_pools.get(&capture) else {
            return;
        };
        for pool in pair {
            if self.pools[pool as usize].sealed {
                continue;
            }
            let free: Vec<u32> = self.pools[pool as usize]
                .free
                .values()
                .flat_map(|list| list.values().copied())
                .collect();
            for &idx in &free {
                self.remove_free(idx);
            }
            self.pools[pool as usize].sealed = true;
            for &idx in &free {
                self.add_free(idx);
            }
        }
    }

    // ---- reading -----------------------------------------------------------------------

    pub(crate) fn summary(&self) -> FreeBlockSummary {
        // Each (pool, stream) free list is ordered by size: its last entry is its largest.
        let largest = self
            .pools
            .iter()
            .filter(|p| !p.sealed)
            .flat_map(|p| p.free.values())
            .filter_map(|list| list.last_key_value().map(|(&key, _)| (key >> 64) as u64))
            .max()
            .unwrap_or(0);
        let histogram = self
            .hist
            .iter()
            .enumerate()
            .filter(|(_, cell)| cell.count > 0)
            .map(|(k, cell)| HistBin {
                lo: 1u64 << k,
                hi: 1u64.checked_shl(k as u32 + 1).unwrap_or(u64::MAX),
                count: cell.count,
                bytes: cell.bytes,
            })
            .collect();
        FreeBlockSummary {
            reserved_bytes: self.reserved(),
            allocated_bytes: self.stats.allocated_bytes.all.current as u64,
            segments: self.stats.segment.all.current as u64,
            total_free_bytes: self.free_total,
            largest_free_bytes: largest,
            fragmentation: (self.free_total > 0)
                .then(|| 1.0 - largest as f64 / self.free_total as f64),
            inactive_split_bytes: self.stats.inactive_split_bytes.all.current as u64,
            histogram,
            graph_retained_free_bytes: self.retained_free,
            pending_free_bytes: self.pending_bytes,
        }
    }

    pub(crate) fn segment_views(&self) -> Vec<SegmentView> {
        self.segments
            .iter()
            .map(|(&addr, seg)| {
                let head = self.node(seg.head);
                let pool = &self.pools[head.pool as usize];
                let mut blocks = Vec::new();
                let mut idx = seg.head;
                while idx != NIL {
                    let n = self.node(idx);
                    let (state, requested, context) = match n.state {
                        NodeState::Allocated => {
                            (BlockState::ActiveAllocated, n.requested, n.context)
                        }
                        NodeState::Pending => {
                            (BlockState::ActivePendingFree, n.requested, n.context)
                        }
                        NodeState::Free => (BlockState::Inactive, 0, 0),
                    };
                    blocks.push(BlockView {
                        addr: n.addr,
                        size: n.size,
                        requested,
                        state,
                        context,
                    });
                    idx = n.next;
                }
                SegmentView {
                    device: self.device,
                    addr,
                    size: seg.size,
                    stream: head.stream,
                    pool: pool.kind,
                    capture: pool.capture,
                    context: seg.context,
                    blocks,
                }
            })
            .collect()
    }

    /// The error value for a failed request, with the state at the failure.
    pub(crate) fn out_of_memory(
        &self,
        requested: u64,
        rounded: u64,
        segment_bytes: u64,
        cause: OomCause,
        released_before_failing: u64,
    ) -> OutOfMemory {
        OutOfMemory {
            device: self.device,
            requested,
            rounded,
            segment_bytes,
            cause,
            released_before_failing,
            free_blocks: self.summary(),
            stats: self.stats,
        }
    }
}
