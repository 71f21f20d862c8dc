//! Torch's `memory_stats` counters (c10 `DeviceStats`), kept with torch's meanings so that
//! `torch_keys()` can stand in for `torch.cuda.memory_stats()` when oomshim is the allocator.

/// Torch's two block pools: small (≤ 1 MiB requests, 2 MiB segments) and large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    Small,
    Large,
}

/// One torch `Stat`: the current value, its peak since the last `reset_peak_stats`, and the sums
/// of all increases (`allocated`) and decreases (`freed`) since the last `reset_accumulated_stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    /// Applies a signed change the way torch's `Stat::increase`/`decrease` do.
    #[inline]
    pub(crate) fn add(&mut self, delta: i64) {
        if delta >= 0 {
            self.current += delta;
            self.allocated += delta;
            if self.current > self.peak {
                self.peak = self.current;
            }
        } else {
            self.current += delta;
            self.freed -= delta;
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A torch `StatArray`: the same counter for all pools and for each pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    /// Changes "all" and the block's own pool, as torch's `update_stat_array` does.
    #[inline]
    pub(crate) fn add(&mut self, pool: PoolKind, delta: i64) {
        if delta == 0 {
            return;
        }
        self.all.add(delta);
        match pool {
            PoolKind::Small => self.small_pool.add(delta),
            PoolKind::Large => self.large_pool.add(delta),
        }
    }

    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Small => &self.small_pool,
            PoolKind::Large => &self.large_pool,
        }
    }

    fn each_mut(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }
}

/// Torch's memory_stats counters for one device, with torch's meanings:
///
/// - `allocation` / `allocated_bytes`: blocks handed out and not yet freed (rounded sizes).
/// - `segment` / `reserved_bytes`: segments obtained from the device and not released.
/// - `active` / `active_bytes`: allocated blocks plus freed blocks still waiting for their
///   `record_stream` events.
/// - `inactive_split` / `inactive_split_bytes`: free blocks in segments that also hold other
///   blocks (they cannot be released to the device).
/// - `requested_bytes`: the unrounded sizes of allocated blocks.
/// - `oversize_allocations` / `oversize_segments`: blocks / segments of at least `max_split_size`.
/// - `max_split_size`: the configured value, -1 when unlimited (as torch reports SIZE_MAX).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub max_split_size: i64,
}

impl DeviceStats {
    pub(crate) fn new(max_split_size: Option<u64>) -> Self {
        DeviceStats {
            max_split_size: max_split_size.map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            ..Default::default()
        }
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// torch.cuda.reset_peak_memory_stats: every peak becomes the current value.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.each_mut() {
                stat.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// torch.cuda.reset_accumulated_memory_stats: the `allocated`/`freed` sums and the event
    /// counters go back to zero.
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.each_mut() {
                stat.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// Flattened with torch's exact key names, sorted by key as torch's `memory_stats()`
    /// returns them: "allocation.all.current", "allocated_bytes.small_pool.peak", ...,
    /// "oversize_allocations.freed", "num_ooms", "max_split_size". The count family is
    /// "allocation", as torch/csrc/cuda/Module.cpp builds the dict (the memory_stats docstring
    /// says "allocated", which no torch version returns).
    pub fn torch_keys(&self) -> Vec<(String, i64)> {
        fn stat(out: &mut Vec<(String, i64)>, prefix: &str, s: &Stat) {
            out.push((format!("{prefix}.current"), s.current));
            out.push((format!("{prefix}.peak"), s.peak));
            out.push((format!("{prefix}.allocated"), s.allocated));
            out.push((format!("{prefix}.freed"), s.freed));
        }
        let families: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        let mut out = Vec::with_capacity(9 * 12 + 8 + 6);
        for (name, array) in families {
            stat(&mut out, &format!("{name}.all"), &array.all);
            stat(&mut out, &format!("{name}.small_pool"), &array.small_pool);
            stat(&mut out, &format!("{name}.large_pool"), &array.large_pool);
        }
        stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        stat(&mut out, "oversize_segments", &self.oversize_segments);
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        out.push(("num_alloc_retries".into(), clamp(self.num_alloc_retries)));
        out.push(("num_ooms".into(), clamp(self.num_ooms)));
        out.push((
            "num_sync_all_streams".into(),
            clamp(self.num_sync_all_streams),
        ));
        out.push(("num_device_alloc".into(), clamp(self.num_device_alloc)));
        out.push(("num_device_free".into(), clamp(self.num_device_free)));
        out.push(("max_split_size".into(), self.max_split_size));
        out.sort();
        out
    }
}
