//! The thread-safe allocator: per-device locks around [`DeviceState`], and every
//! [`MemorySource`] call made between critical sections, never inside one.

use super::device::{DeviceState, PendingFree};
use super::history::{HistoryConfig, RecordContext, Trace, TraceAction, TraceEntry};
use super::interface::{
    AllocConfig, Block, FreeBlockSummary, MemorySource, OomCause, OutOfMemory, SegmentView,
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_MEMORY_ALLOCATION, MAX_DEVICES,
};
use super::lock::{SpinGuard, SpinLock};
use super::stats::{DeviceStats, PoolKind};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// Requests above this fail at once: rounding them could overflow, and no device has 4 EiB.
const MAX_REQUEST: u64 = 1 << 62;

/// One device's state on its own cache lines, so devices never contend through false sharing.
#[repr(align(128))]
struct Device {
    state: SpinLock<DeviceState>,
}

type Guard<'a> = SpinGuard<'a, DeviceState>;

/// A caching allocator with torch's native policy over a [`MemorySource`] (see the module docs).
pub struct CachingAllocator<S: MemorySource> {
    source: S,
    config: AllocConfig,
    devices: Box<[OnceLock<Box<Device>>]>,
    /// Bit d set once device d has state: `free` by address looks only at these.
    present: AtomicU64,
    /// torch's memory history: 0 off, else 1 + its [`RecordContext`] level (what callers read
    /// to know whether to gather a stack: one relaxed load).
    history: AtomicU8,
    /// The history settings while on, for devices first used later.
    history_config: Mutex<Option<HistoryConfig>>,
}

impl<S: MemorySource> CachingAllocator<S> {
    pub fn new(source: S, config: AllocConfig) -> Self {
        CachingAllocator {
            source,
            config,
            devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            present: AtomicU64::new(0),
            history: AtomicU8::new(0),
            history_config: Mutex::new(None),
        }
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn config(&self) -> &AllocConfig {
        &self.config
    }

    /// The device's state, created on first use; None for an id outside `0..MAX_DEVICES`.
    fn device(&self, device: i32) -> Option<&Device> {
        let slot = self.devices.get(usize::try_from(device).ok()?)?;
        Some(slot.get_or_init(|| {
            self.present.fetch_or(1 << device, Ordering::AcqRel);
            let mut state = DeviceState::new(device, &self.config);
            if let Some(config) = *self
                .history_config
                .lock()
                .unwrap_or_else(|e| e.into_inner())
            {
                state.trace = Some(Box::new(Trace::new(config)));
            }
            Box::new(Device {
                state: SpinLock::new(state),
            })
        }))
    }

    /// The device's state if it exists (never creates it).
    fn existing(&self, device: i32) -> Option<&Device> {
        let slot = self.devices.get(usize::try_from(device).ok()?)?;
        slot.get().map(|b| &**b)
    }

    fn present_devices(&self) -> impl Iterator<Item = i32> {
        let mask = self.present.load(Ordering::Acquire);
        (0..MAX_DEVICES as i32).filter(move |d| mask & (1 << d) != 0)
    }

    /// Torch's `round_size` without `roundup_power2_divisions`: at least one `min_block`, then
    /// a multiple of it. None when the request is beyond any device.
    fn round(&self, size: u64) -> Option<u64> {
        if size > MAX_REQUEST {
            return None;
        }
        let unit = self.config.min_block.max(1);
        Some(size.max(1).div_ceil(unit) * unit)
    }

    /// Torch's `get_allocation_size`: the segment to ask the device for.
    fn segment_size(&self, rounded: u64) -> u64 {
        let c = &self.config;
        let seg = if rounded <= c.small_size {
            c.small_segment
        } else if rounded < c.min_large_alloc {
            c.large_segment
        } else {
            let unit = c.round_large.max(1);
            rounded.div_ceil(unit) * unit
        };
        seg.max(rounded)
    }

    fn pool_kind(&self, rounded: u64) -> PoolKind {
        if rounded <= self.config.small_size {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// Retires finished `record_stream` events: queries each stream's oldest events with the
    /// lock dropped (stopping at the first unfinished one), then frees the blocks whose events
    /// are all done. Returns with the lock held again. Only one thread polls a device at a time
    /// (so no event is queried after another poller destroyed it); if one is polling already,
    /// this returns at once, or with `wait`, waits for it and then polls.
    fn poll_events<'a>(&'a self, dev: &'a Device, mut guard: Guard<'a>, wait: bool) -> Guard<'a> {
        const BATCH: usize = 16;
        loop {
            while guard.polling {
                if !wait {
                    return guard;
                }
                drop(guard);
                std::thread::yield_now();
                guard = dev.state.lock();
            }
            if !guard.has_pending() {
                return guard;
            }
            guard.polling = true;
            let fronts = guard.pending_fronts(BATCH);
            drop(guard);
            let mut full_batch = false;
            let done: Vec<(u64, usize)> = fronts
                .iter()
                .map(|(stream, events)| {
                    let n = events
                        .iter()
                        .take_while(|&&event| self.source.event_done(event))
                        .count();
                    full_batch |= n == BATCH;
                    (*stream, n)
                })
                .filter(|&(_, n)| n > 0)
                .collect();
            guard = dev.state.lock();
            guard.polling = false;
            if done.is_empty() {
                return guard;
            }
            let retired = guard.complete_fronts(&done);
            drop(guard);
            for event in retired {
                self.source.destroy_event(event);
            }
            guard = dev.state.lock();
            if !full_batch {
                return guard;
            }
        }
    }

    /// torch `release_cached_blocks` for one device: poll events, then return every fully free
    /// segment of the device-wide pools to the source. Returns (lock, bytes released).
    fn release_cached<'a>(
        &'a self,
        device: i32,
        dev: &'a Device,
        mut guard: Guard<'a>,
    ) -> (Guard<'a>, u64) {
        guard.stats.num_sync_all_streams += 1;
        if guard.has_pending() || guard.polling {
            guard = self.poll_events(dev, guard, true);
        }
        let segments = guard.release_free_segments();
        if segments.is_empty() {
            return (guard, 0);
        }
        drop(guard);
        let mut released = 0;
        for (addr, bytes) in segments {
            released += bytes;
            // A failing cudaFree leaves nothing to undo: the segment is gone from the cache.
            let _ = self.source.free_segment(device, addr, bytes);
        }
        (dev.state.lock(), released)
    }

    /// Allocates `size` bytes on `device` for `stream` (torch `DeviceCachingAllocator::malloc`).
    /// `capture`: Some(id) while the calling stream is being captured into a CUDA graph.
    // The error carries the whole state at the failure by value (the agreed API); it is built
    // only on the rare failure path, and the Ok path writes just the block.
    #[allow(clippy::result_large_err)]
    pub fn malloc(
        &self,
        device: i32,
        size: u64,
        stream: u64,
        capture: Option<u64>,
    ) -> Result<Block, OutOfMemory> {
        self.malloc_in_context(device, size, stream, capture, 0)
    }

    /// [`Self::malloc`] with the caller's stack id (`context`, 0 for none), which the block keeps
    /// and the history's entries carry while torch's memory history is on.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub fn malloc_in_context(
        &self,
        device: i32,
        size: u64,
        stream: u64,
        capture: Option<u64>,
        context: u32,
    ) -> Result<Block, OutOfMemory> {
        let Some(dev) = self.device(device) else {
            return Err(self.invalid_device(device, size));
        };
        let mut guard = dev.state.lock();
        let Some(rounded) = self.round(size) else {
            guard.stats.num_ooms += 1;
            let cause = OomCause::DeviceExhausted {
                cuda_error: CUDA_ERROR_MEMORY_ALLOCATION,
            };
            return Err(guard.out_of_memory(size, size, size, cause, 0));
        };
        if guard.has_pending() {
            guard = self.poll_events(dev, guard, false);
        }
        let pool = guard.pool_for(self.pool_kind(rounded), capture);
        if let Some(block) = guard.try_take(pool, stream, rounded, size, context) {
            return Ok(block);
        }

        let segment = self.segment_size(rounded);
        let mut released = 0;
        let mut retried = false;
        loop {
            let cause = match guard.limit {
                Some(limit)
                    if guard
                        .reserved()
                        .saturating_add(guard.inflight)
                        .saturating_add(segment)
                        > limit =>
                {
                    OomCause::FractionCap { limit }
                }
                _ => {
                    // Counted against the cap while the lock is dropped, so concurrent
                    // misses cannot overshoot it together.
                    guard.inflight += segment;
                    drop(guard);
                    let got = self.source.alloc_segment(device, segment);
                    guard = dev.state.lock();
                    guard.inflight -= segment;
                    match got {
                        Ok(addr) => {
                            return Ok(guard.insert_segment_and_take(
                                pool, addr, segment, stream, rounded, size, context,
                            ))
                        }
                        Err(cuda_error) => OomCause::DeviceExhausted { cuda_error },
                    }
                }
            };
            let out_of_memory = match cause {
                OomCause::DeviceExhausted { cuda_error } => {
                    cuda_error == CUDA_ERROR_MEMORY_ALLOCATION
                }
                OomCause::FractionCap { .. } => true,
            };
            // Torch frees its cached segments and retries once, except during graph capture
            // (cudaFree is not allowed while capturing). Other CUDA errors fail at once.
            if out_of_memory && !retried && capture.is_none() {
                retried = true;
                let (g, bytes) = self.release_cached(device, dev, guard);
                guard = g;
                released += bytes;
                guard.stats.num_alloc_retries += 1;
                // Another thread may have freed a fitting block while the lock was dropped.
                if let Some(block) = guard.try_take(pool, stream, rounded, size, context) {
                    return Ok(block);
                }
                continue;
            }
            if out_of_memory {
                guard.stats.num_ooms += 1;
            }
            return Err(guard.out_of_memory(size, rounded, segment, cause, released));
        }
    }

    fn invalid_device(&self, device: i32, size: u64) -> OutOfMemory {
        let rounded = self.round(size).unwrap_or(size);
        OutOfMemory {
            device,
            requested: size,
            rounded,
            segment_bytes: 0,
            cause: OomCause::DeviceExhausted {
                cuda_error: CUDA_ERROR_INVALID_DEVICE,
            },
            released_before_failing: 0,
            free_blocks: FreeBlockSummary::default(),
            stats: DeviceStats::new(self.config.max_split_size),
        }
    }

    /// Frees a block by address. Returns the freed block, or None for an address this
    /// allocator did not hand out (or already freed).
    pub fn free(&self, addr: u64) -> Option<Block> {
        self.present_devices()
            .find_map(|d| self.existing(d).and_then(|dev| self.free_in(dev, addr, 0)))
    }

    /// [`Self::free`] looking at `device` first (torch's free callback passes the device):
    /// one lock instead of one per device.
    pub fn free_on(&self, device: i32, addr: u64) -> Option<Block> {
        self.free_in_context(device, addr, 0)
    }

    /// [`Self::free_on`] with the stack id of the free (`context`, 0 for none), which the
    /// history's free entries carry when it keeps stacks of frees.
    #[inline]
    pub fn free_in_context(&self, device: i32, addr: u64, context: u32) -> Option<Block> {
        if let Some(block) = self
            .existing(device)
            .and_then(|dev| self.free_in(dev, addr, context))
        {
            return Some(block);
        }
        self.present_devices()
            .filter(|&d| d != device)
            .find_map(|d| {
                self.existing(d)
                    .and_then(|dev| self.free_in(dev, addr, context))
            })
    }

    fn free_in(&self, dev: &Device, addr: u64, context: u32) -> Option<Block> {
        let mut guard = dev.state.lock();
        let (block, pending) = guard.free_allocated(addr, context)?;
        drop(guard);
        if let Some(PendingFree { node, streams }) = pending {
            // Record one event per extra stream: the block is reusable once all are done.
            let mut events = Vec::with_capacity(streams.len());
            let mut failed = 0;
            for stream in streams {
                match self.source.record_event(block.device, stream) {
                    Ok(event) => events.push((stream, event)),
                    Err(_) => failed += 1,
                }
            }
            dev.state.lock().attach_events(node, &events, failed);
        }
        Some(block)
    }

    /// Tensor.record_stream: the block is not reused until work queued on `stream` up to the
    /// block's free is done. False for an unknown address.
    pub fn record_stream(&self, addr: u64, stream: u64) -> bool {
        self.present_devices().any(|d| {
            self.existing(d)
                .is_some_and(|dev| dev.state.lock().record_stream(addr, stream))
        })
    }

    /// torch.cuda.empty_cache: returns every fully free segment of the device-wide pools to the
    /// source (all devices when None), after retiring finished events. Returns bytes released.
    pub fn empty_cache(&self, device: Option<i32>) -> u64 {
        let mut released = 0;
        for d in self.present_devices() {
            if device.is_some_and(|want| want != d) {
                continue;
            }
            if let Some(dev) = self.existing(d) {
                let (_guard, bytes) = self.release_cached(d, dev, dev.state.lock());
                released += bytes;
            }
        }
        released
    }

    /// set_per_process_memory_fraction: caps reserved bytes on `device` (None lifts the cap).
    pub fn set_memory_limit(&self, device: i32, limit: Option<u64>) {
        if let Some(dev) = self.device(device) {
            dev.state.lock().limit = limit;
        }
    }

    /// The CUDA graph capture `capture` ended: its blocks are never reused or released.
    pub fn end_capture(&self, capture: u64) {
        for d in self.present_devices() {
            if let Some(dev) = self.existing(d) {
                dev.state.lock().seal_capture(capture);
            }
        }
    }

    pub fn stats(&self, device: i32) -> DeviceStats {
        match self.existing(device) {
            Some(dev) => dev.state.lock().stats,
            None => DeviceStats::new(self.config.max_split_size),
        }
    }

    pub fn reset_peak_stats(&self, device: i32) {
        if let Some(dev) = self.existing(device) {
            dev.state.lock().stats.reset_peak();
        }
    }

    pub fn reset_accumulated_stats(&self, device: i32) {
        if let Some(dev) = self.existing(device) {
            dev.state.lock().stats.reset_accumulated();
        }
    }

    /// The free-block summary of `device`, from counters kept up to date (O(bins)).
    pub fn free_blocks(&self, device: i32) -> FreeBlockSummary {
        self.existing(device)
            .map(|dev| dev.state.lock().summary())
            .unwrap_or_default()
    }

    /// Every segment of `device` with its blocks (a scan; for dumps).
    pub fn segments(&self, device: i32) -> Vec<SegmentView> {
        self.existing(device)
            .map(|dev| dev.state.lock().segment_views())
            .unwrap_or_default()
    }

    /// torch's `_record_memory_history`: `Some(config)` turns the history on (or changes its
    /// settings, keeping the entries unless `clear`), `None` turns it off and drops every trace,
    /// as torch does. Blocks keep the stack ids they were allocated with either way.
    pub fn record_history(&self, config: Option<HistoryConfig>, clear: bool) {
        let mut settings = self
            .history_config
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *settings = config;
        for d in self.present_devices() {
            if let Some(dev) = self.existing(d) {
                let mut guard = dev.state.lock();
                match (config, guard.trace.as_mut()) {
                    (None, _) => guard.trace = None,
                    (Some(c), Some(trace)) if !clear => trace.reconfigure(c),
                    (Some(c), _) => guard.trace = Some(Box::new(Trace::new(c))),
                }
            }
        }
        let level = config.map_or(0, |c| 1 + c.context as u8);
        self.history.store(level, Ordering::Relaxed);
    }

    /// The history's context level while it is on (the caller gathers a stack for an allocation
    /// from `State` up, and for a free at `All`); None while off. One relaxed load.
    #[inline]
    pub fn history_context(&self) -> Option<RecordContext> {
        match self.history.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(RecordContext::Never),
            2 => Some(RecordContext::State),
            3 => Some(RecordContext::Alloc),
            _ => Some(RecordContext::All),
        }
    }

    /// The trace of `device`, oldest first (empty while history is off).
    pub fn trace(&self, device: i32) -> Vec<TraceEntry> {
        self.existing(device)
            .and_then(|dev| dev.state.lock().trace.as_ref().map(|t| t.entries()))
            .unwrap_or_default()
    }

    /// torch's `oom` trace entry for a request [`Self::malloc`] failed: the rounded size and the
    /// device's free bytes as CUDA reported them.
    pub fn record_oom(
        &self,
        device: i32,
        rounded: u64,
        device_free: u64,
        stream: u64,
        context: u32,
    ) {
        if let Some(dev) = self.existing(device) {
            if let Some(trace) = dev.state.lock().trace.as_mut() {
                trace.record(TraceAction::Oom, device_free, rounded, stream, context);
            }
        }
    }

    /// torch's `snapshot` trace entry, recorded after a snapshot read the trace of `device`:
    /// the bytes of its active blocks (allocated or waiting for events), as torch records them.
    pub fn record_snapshot(&self, device: i32) {
        if let Some(dev) = self.existing(device) {
            let mut guard = dev.state.lock();
            let active = guard.stats.active_bytes.all.current.max(0) as u64;
            if let Some(trace) = guard.trace.as_mut() {
                trace.record(TraceAction::Snapshot, 0, active, 0, 0);
            }
        }
    }

    /// Devices that have been used, ascending.
    pub fn devices(&self) -> Vec<i32> {
        self.present_devices().collect()
    }
}
