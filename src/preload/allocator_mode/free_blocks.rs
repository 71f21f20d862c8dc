//! The allocator's free-block state as the dump's `free_blocks` object.

use dump::model::{FreeBlocks, HistogramBin};
use oomshim_host::alloc::{CachingAllocator, MemorySource};

/// The dump's `free_blocks` for `device`, from the allocator's continuously kept counters.
pub fn free_blocks_for_dump<S: MemorySource>(a: &CachingAllocator<S>, device: i32) -> FreeBlocks {
    let f = a.free_blocks(device);
    FreeBlocks {
        source: "oomshim-allocator".to_string(),
        reason: None,
        total_free_bytes: Some(f.total_free_bytes),
        largest_free_bytes: Some(f.largest_free_bytes),
        fragmentation: f.fragmentation,
        histogram: f
            .histogram
            .iter()
            .map(|b| HistogramBin {
                lo: b.lo,
                hi: b.hi,
                count: b.count,
                bytes: b.bytes,
            })
            .collect(),
        reserved_bytes: Some(f.reserved_bytes),
        allocated_bytes: Some(f.allocated_bytes),
        inactive_split_bytes: Some(f.inactive_split_bytes),
        segments: Some(f.segments),
        ..Default::default()
    }
}

/// [`free_blocks_for_dump`] plus every segment with its blocks (a scan of the device's segments,
/// done only when a dump is assembled), so `export --memory-viz` can lay out the real cache.
pub fn free_blocks_with_segment_map<S: MemorySource>(
    a: &CachingAllocator<S>,
    device: i32,
) -> FreeBlocks {
    use dump::model::{SegmentBlock, SegmentEntry, SEGMENT_MAP_MAX_BLOCKS};
    use oomshim_host::alloc::{BlockState, PoolKind};
    let mut fb = free_blocks_for_dump(a, device);
    let mut blocks = 0usize;
    for seg in a.segments(device) {
        if blocks + seg.blocks.len() > SEGMENT_MAP_MAX_BLOCKS {
            fb.segment_map_omitted += 1;
            continue;
        }
        blocks += seg.blocks.len();
        fb.segment_map.push(SegmentEntry {
            address: format!("{:#x}", seg.addr),
            bytes: seg.size,
            stream: format!("{:#x}", seg.stream),
            pool: match seg.pool {
                PoolKind::Small => "small",
                PoolKind::Large => "large",
            }
            .to_string(),
            capture: seg.capture,
            blocks: seg
                .blocks
                .iter()
                .map(|b| SegmentBlock {
                    address: format!("{:#x}", b.addr),
                    bytes: b.size,
                    requested_bytes: b.requested,
                    state: match b.state {
                        BlockState::ActiveAllocated => "active_allocated",
                        BlockState::ActivePendingFree => "active_pending_free",
                        BlockState::Inactive => "inactive",
                    }
                    .to_string(),
                })
                .collect(),
        });
    }
    fb
}

#[cfg(test)]
mod tests {
    use super::*;
    use oomshim_host::alloc::AllocConfig;

    /// Segments at made-up addresses, never refused.
    struct Bump(std::sync::atomic::AtomicU64);

    impl MemorySource for Bump {
        fn alloc_segment(&self, _: i32, bytes: u64) -> Result<u64, i32> {
            let step = bytes.div_ceil(1 << 21) * (1 << 21);
            Ok(self.0.fetch_add(step, std::sync::atomic::Ordering::Relaxed))
        }
        fn free_segment(&self, _: i32, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn record_event(&self, _: i32, _: u64) -> Result<u64, i32> {
            Ok(1)
        }
        fn event_done(&self, _: u64) -> bool {
            true
        }
        fn destroy_event(&self, _: u64) {}
    }

    #[test]
    fn the_dump_s_free_blocks_are_the_allocator_s() {
        let a = CachingAllocator::new(Bump(0x7f00_0000_0000.into()), AllocConfig::default());
        let kept = a.malloc(0, 3 << 20, 0, None).unwrap();
        let freed = a.malloc(0, 5 << 20, 0, None).unwrap();
        a.free(freed.addr);
        let fb = free_blocks_with_segment_map(&a, 0);
        assert_eq!(fb.source, "oomshim-allocator");
        let own = a.free_blocks(0);
        assert_eq!(fb.reserved_bytes, Some(own.reserved_bytes));
        assert_eq!(fb.allocated_bytes, Some(own.allocated_bytes));
        assert_eq!(fb.total_free_bytes, Some(own.total_free_bytes));
        assert!(own.total_free_bytes > 0 && own.allocated_bytes > 0);
        assert_eq!(fb.segments, Some(fb.segment_map.len() as u64));
        let states: Vec<(&str, &str)> = fb
            .segment_map
            .iter()
            .flat_map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.address.as_str(), b.state.as_str()))
            })
            .collect();
        let kept = format!("{:#x}", kept.addr);
        assert!(
            states.contains(&(kept.as_str(), "active_allocated")),
            "{states:?}"
        );
        assert!(states.iter().any(|s| s.1 == "inactive"), "{states:?}");
        // Without the scan: the same counters, no segments listed.
        let plain = free_blocks_for_dump(&a, 0);
        assert!(plain.segment_map.is_empty());
        assert_eq!(plain.reserved_bytes, fb.reserved_bytes);
    }
}
