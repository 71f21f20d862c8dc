//! Tests of the caching allocator against a fake device: deterministic scenarios (torch's
//! segment sizes, splitting and coalescing, empty_cache, the fragmentation OOM, the memory cap,
//! streams, record_stream, graph captures, many threads) and a property test that checks every
//! invariant, recomputed from scratch, after every operation of random sequences.

use super::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

/// A failed check of the property test (below): where, and what was found.
type TestCaseError = String;

/// The property test's checks return their failure instead of panicking, so that a failing
/// sequence can be shrunk.
macro_rules! prop_assert {
    ($cond:expr) => {
        prop_assert!($cond, "{}", stringify!($cond))
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("{}:{}: {}", file!(), line!(), format!($($fmt)+)));
        }
    };
}

macro_rules! prop_assert_eq {
    ($a:expr, $b:expr) => {
        prop_assert_eq!($a, $b, "")
    };
    ($a:expr, $b:expr, $($fmt:tt)*) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!(
                "{}:{}: {} == {}: {:?} != {:?} {}",
                file!(),
                line!(),
                stringify!($a),
                stringify!($b),
                a,
                b,
                format!($($fmt)*)
            ));
        }
    }};
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// ---- the fake device -------------------------------------------------------------------------

#[derive(Default)]
struct FakeState {
    /// Bytes each device may hand out in total; absent = unlimited.
    capacity: HashMap<i32, u64>,
    /// Outstanding segments: (device, addr) → bytes.
    segments: BTreeMap<(i32, u64), u64>,
    next_addr: u64,
    refusals: u64,
    next_event: u64,
    /// event → done
    events: HashMap<u64, bool>,
    /// event → the stream it was recorded on
    event_stream: HashMap<u64, u64>,
    destroyed: HashSet<u64>,
    /// Events finish as soon as they are recorded (for the threaded test).
    auto_complete: bool,
    /// Refuse every segment with this CUDA error.
    fail_with: Option<i32>,
    /// Protocol violations seen by the fake (double free, destroying a running event, ...).
    violations: Vec<String>,
}

#[derive(Default)]
struct FakeSource {
    state: Mutex<FakeState>,
}

impl FakeSource {
    fn with_capacity(caps: &[(i32, u64)]) -> Self {
        let fake = FakeSource::default();
        {
            let mut s = fake.state.lock().unwrap();
            s.capacity = caps.iter().copied().collect();
            s.next_addr = 1 << 40;
            s.next_event = 1;
        }
        fake
    }

    fn used(&self, device: i32) -> u64 {
        let s = self.state.lock().unwrap();
        s.segments
            .iter()
            .filter(|((d, _), _)| *d == device)
            .map(|(_, b)| b)
            .sum()
    }

    fn free_room(&self, device: i32) -> u64 {
        let cap = self.state.lock().unwrap().capacity.get(&device).copied();
        cap.map_or(u64::MAX, |c| c - self.used(device))
    }

    fn segments_of(&self, device: i32) -> Vec<(u64, u64)> {
        let s = self.state.lock().unwrap();
        s.segments
            .iter()
            .filter(|((d, _), _)| *d == device)
            .map(|((_, a), b)| (*a, *b))
            .collect()
    }

    fn complete_event(&self, event: u64) {
        if let Some(done) = self.state.lock().unwrap().events.get_mut(&event) {
            *done = true;
        }
    }

    fn undone_events(&self) -> Vec<u64> {
        let s = self.state.lock().unwrap();
        let mut v: Vec<u64> = s
            .events
            .iter()
            .filter(|(e, done)| !**done && !s.destroyed.contains(e))
            .map(|(e, _)| *e)
            .collect();
        v.sort();
        v
    }

    /// Completes the oldest unfinished event of one of the streams that have some (picked by
    /// `pick`): work on a stream finishes in order.
    fn complete_oldest(&self, pick: usize) {
        let undone = self.undone_events();
        let streams: Vec<u64> = {
            let s = self.state.lock().unwrap();
            let mut v: Vec<u64> = undone.iter().map(|e| s.event_stream[e]).collect();
            v.sort();
            v.dedup();
            v
        };
        if streams.is_empty() {
            return;
        }
        let stream = streams[pick % streams.len()];
        let oldest = {
            let s = self.state.lock().unwrap();
            undone.into_iter().find(|e| s.event_stream[e] == stream)
        };
        if let Some(e) = oldest {
            self.complete_event(e);
        }
    }

    fn is_done(&self, event: u64) -> bool {
        self.state
            .lock()
            .unwrap()
            .events
            .get(&event)
            .copied()
            .unwrap_or(true)
    }

    fn next_event(&self) -> u64 {
        self.state.lock().unwrap().next_event
    }

    fn refusals(&self) -> u64 {
        self.state.lock().unwrap().refusals
    }

    fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }
}

impl MemorySource for FakeSource {
    fn alloc_segment(&self, device: i32, bytes: u64) -> Result<u64, i32> {
        let used = self.used(device);
        let mut s = self.state.lock().unwrap();
        if let Some(code) = s.fail_with {
            return Err(code);
        }
        if let Some(&cap) = s.capacity.get(&device) {
            if used.saturating_add(bytes) > cap {
                s.refusals += 1;
                return Err(2);
            }
        }
        let addr = s.next_addr;
        // Addresses are never reused, so a stale block can never alias a new segment; a gap
        // keeps segments from touching.
        s.next_addr += bytes.div_ceil(2 * MIB) * 2 * MIB + 2 * MIB;
        s.segments.insert((device, addr), bytes);
        Ok(addr)
    }

    fn free_segment(&self, device: i32, addr: u64, bytes: u64) -> Result<(), i32> {
        let mut s = self.state.lock().unwrap();
        match s.segments.remove(&(device, addr)) {
            Some(b) if b == bytes => Ok(()),
            other => {
                s.violations.push(format!(
                    "free_segment({device}, {addr:#x}, {bytes}) of {other:?}"
                ));
                Err(1)
            }
        }
    }

    fn record_event(&self, _device: i32, stream: u64) -> Result<u64, i32> {
        let mut s = self.state.lock().unwrap();
        let e = s.next_event;
        s.next_event += 1;
        let done = s.auto_complete;
        s.events.insert(e, done);
        s.event_stream.insert(e, stream);
        Ok(e)
    }

    fn event_done(&self, event: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        if s.destroyed.contains(&event) {
            s.violations
                .push(format!("event_done({event}) after destroy"));
        }
        s.events.get(&event).copied().unwrap_or(true)
    }

    fn destroy_event(&self, event: u64) {
        let mut s = self.state.lock().unwrap();
        if s.events.get(&event) != Some(&true) {
            s.violations
                .push(format!("destroy_event({event}) not done"));
        }
        if !s.destroyed.insert(event) {
            s.violations.push(format!("destroy_event({event}) twice"));
        }
    }
}

fn allocator(caps: &[(i32, u64)]) -> CachingAllocator<FakeSource> {
    CachingAllocator::new(FakeSource::with_capacity(caps), AllocConfig::default())
}

fn seg_of(a: &CachingAllocator<FakeSource>, device: i32, addr: u64) -> SegmentView {
    a.segments(device)
        .into_iter()
        .find(|s| s.addr <= addr && addr < s.addr + s.size)
        .expect("block inside a segment")
}

// ---- deterministic tests -----------------------------------------------------------------------

#[test]
fn torch_segment_sizes() {
    let a = allocator(&[]);
    let small = a.malloc(0, KIB, 0, None).unwrap();
    assert_eq!((small.size, small.pool), (KIB, PoolKind::Small));
    assert_eq!(seg_of(&a, 0, small.addr).size, 2 * MIB);

    let big = a.malloc(0, 100 * MIB, 0, None).unwrap();
    assert_eq!(seg_of(&a, 0, big.addr).size, 100 * MIB);

    let odd = a.malloc(0, 11 * MIB + 1, 0, None).unwrap();
    assert_eq!(
        odd.size,
        12 * MIB,
        "a remainder under 1 MiB is not split off"
    );
    assert_eq!(seg_of(&a, 0, odd.addr).size, 12 * MIB);

    // 5 MiB: its own 20 MiB segment (the 12 MiB one has less than 1 MiB left).
    let mid = a.malloc(0, 5 * MIB, 0, None).unwrap();
    assert_eq!((mid.size, mid.pool), (5 * MIB, PoolKind::Large));
    assert_eq!(seg_of(&a, 0, mid.addr).size, 20 * MIB);

    // Exactly 1 MiB is still small; 0 bytes is served as 512 B.
    assert_eq!(a.malloc(0, MIB, 0, None).unwrap().pool, PoolKind::Small);
    let zero = a.malloc(0, 0, 0, None).unwrap();
    assert_eq!((zero.size, zero.requested), (512, 0));

    let s = a.stats(0);
    // 1 MiB and 0 B fit in the first small segment.
    assert_eq!(s.segment.all.current, 4);
    assert_eq!(
        s.reserved_bytes.all.current as u64,
        2 * MIB + 100 * MIB + 12 * MIB + 20 * MIB
    );
    assert_eq!(
        s.requested_bytes.all.current as u64,
        KIB + 100 * MIB + 11 * MIB + 1 + 5 * MIB + MIB
    );
    assert_eq!(
        s.allocated_bytes.all.current as u64,
        KIB + 100 * MIB + 12 * MIB + 5 * MIB + MIB + 512
    );
    assert_eq!(s.num_device_alloc, 4);
}

#[test]
fn split_reuse_and_coalesce() {
    let a = allocator(&[]);
    let x = a.malloc(0, 3 * KIB, 0, None).unwrap();
    let y = a.malloc(0, 5 * KIB, 0, None).unwrap();
    let z = a.malloc(0, 1000, 0, None).unwrap();
    // All in one 2 MiB segment, back to back.
    assert_eq!(y.addr, x.addr + 3 * KIB);
    assert_eq!(z.addr, y.addr + 5 * KIB);
    assert_eq!(z.size, KIB);
    assert_eq!(a.stats(0).segment.all.current, 1);

    // Freeing y leaves a hole; best fit reuses it for a request that fits.
    a.free(y.addr).unwrap();
    let s = a.stats(0);
    assert_eq!(s.inactive_split.all.current, 2); // the hole and the tail
    assert_eq!(s.inactive_split_bytes.all.current as u64, 2 * MIB - 4 * KIB);
    let w = a.malloc(0, 4 * KIB, 0, None).unwrap();
    assert_eq!(
        w.addr, y.addr,
        "best fit takes the 5 KiB hole, not the big tail"
    );

    // Free everything: the segment is one free block again.
    for b in [x, w, z] {
        a.free(b.addr).unwrap();
    }
    let segs = a.segments(0);
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].blocks.len(), 1);
    assert_eq!(segs[0].blocks[0].state, BlockState::Inactive);
    let s = a.stats(0);
    assert_eq!(s.inactive_split.all.current, 0);
    assert_eq!(s.allocated_bytes.all.current, 0);
    assert_eq!(s.active.all.current, 0);
    assert_eq!(s.allocated_bytes.all.peak as u64, 9 * KIB);

    // Large pool: a remainder of at most 1 MiB is not split off.
    let big = a.malloc(0, 8 * MIB, 0, None).unwrap();
    assert_eq!(
        big.size,
        8 * MIB,
        "the 12 MiB rest of the 20 MiB segment is split off"
    );
    a.free(big.addr).unwrap();
    let big2 = a.malloc(0, 20 * MIB - MIB + 512, 0, None).unwrap();
    assert_eq!(big2.addr, big.addr);
    assert_eq!(big2.size, 20 * MIB, "remainder < 1 MiB stays in the block");
}

#[test]
fn free_of_unknown_address_is_none() {
    let a = allocator(&[]);
    assert!(a.free(0x1234).is_none());
    let b = a.malloc(0, 100, 0, None).unwrap();
    assert!(a.free(b.addr + 512).is_none());
    assert!(a.free(b.addr).is_some());
    assert!(a.free(b.addr).is_none(), "double free");
    assert!(!a.record_stream(b.addr, 7));
    assert!(a.malloc(-1, 100, 0, None).is_err());
    assert!(a.malloc(MAX_DEVICES as i32, 100, 0, None).is_err());
}

#[test]
fn huge_request_is_out_of_memory() {
    let a = allocator(&[]);
    for size in [u64::MAX, u64::MAX - 511, 1 << 63] {
        let e = a.malloc(0, size, 0, None).unwrap_err();
        assert_eq!(e.requested, size);
        assert!(matches!(
            e.cause,
            OomCause::DeviceExhausted { cuda_error: 2 }
        ));
    }
    assert_eq!(a.stats(0).num_ooms, 3);
}

#[test]
fn other_cuda_errors_fail_without_retry() {
    let a = allocator(&[]);
    let x = a.malloc(0, 4 * KIB, 0, None).unwrap();
    a.free(x.addr).unwrap();
    a.source().state.lock().unwrap().fail_with = Some(700);
    let e = a.malloc(0, 50 * MIB, 0, None).unwrap_err();
    assert_eq!(e.cause, OomCause::DeviceExhausted { cuda_error: 700 });
    assert_eq!(e.released_before_failing, 0);
    let s = a.stats(0);
    assert_eq!((s.num_alloc_retries, s.num_ooms), (0, 0));
    assert_eq!(s.segment.all.current, 1, "the cache was not emptied");
    // Cached blocks are still served.
    assert_eq!(a.malloc(0, 4 * KIB, 0, None).unwrap().addr, x.addr);
}

#[test]
fn devices_are_separate() {
    let a = allocator(&[(0, 4 * MIB), (1, 64 * MIB)]);
    let x = a.malloc(1, 30 * MIB, 0, None).unwrap();
    let y = a.malloc(0, 3 * MIB, 0, None);
    assert!(
        y.is_err(),
        "device 0 has 4 MiB: a 20 MiB segment does not fit"
    );
    assert_eq!(a.devices(), vec![0, 1]);
    // free by address finds the device; free_on with the wrong device still finds it.
    let z = a.malloc(1, 4 * KIB, 0, None).unwrap();
    assert_eq!(a.free_on(0, z.addr).map(|b| b.device), Some(1));
    assert_eq!(a.free(x.addr).map(|b| b.device), Some(1));
    assert_eq!(a.stats(0).allocation.all.current, 0);
    assert_eq!(a.stats(1).allocation.all.current, 0);
    assert_eq!(a.stats(1).segment.all.current, 2);
    assert_eq!(a.stats(7), DeviceStats::new(None));
    assert_eq!(a.free_blocks(7), FreeBlockSummary::default());
    assert!(a.segments(7).is_empty());
}

#[test]
fn empty_cache_waits_for_pending_blocks_only_while_their_events_run() {
    let a = allocator(&[]);
    let x = a.malloc(0, 30 * MIB, 1, None).unwrap();
    a.record_stream(x.addr, 2);
    let event = a.source().next_event();
    a.free(x.addr).unwrap();
    assert_eq!(
        a.empty_cache(None),
        0,
        "pending: its segment is not free yet"
    );
    a.source().complete_event(event);
    assert_eq!(a.empty_cache(None), 30 * MIB);
    assert!(a.source().violations().is_empty());
}

#[test]
fn empty_cache_releases_exactly_fully_free_segments() {
    let a = allocator(&[]);
    let s1 = a.malloc(0, 100 * KIB, 0, None).unwrap(); // small segment A
    let s2 = a.malloc(0, 100 * KIB, 0, None).unwrap(); // same segment A
    let l1 = a.malloc(0, 50 * MIB, 0, None).unwrap(); // large segment B
    let l2 = a.malloc(0, 60 * MIB, 0, None).unwrap(); // large segment C
    a.free(s1.addr).unwrap(); // A still holds s2
    a.free(l1.addr).unwrap(); // B fully free
    assert_eq!(a.empty_cache(Some(0)), 50 * MIB);
    assert_eq!(a.source().segments_of(0).len(), 2);
    a.free(s2.addr).unwrap();
    a.free(l2.addr).unwrap();
    assert_eq!(a.empty_cache(None), 2 * MIB + 60 * MIB);
    assert!(a.source().segments_of(0).is_empty());
    let s = a.stats(0);
    assert_eq!(s.reserved_bytes.all.current, 0);
    assert_eq!(s.num_device_free, 3);
    assert_eq!(s.num_sync_all_streams, 2);
    assert_eq!(a.free_blocks(0).total_free_bytes, 0);
}

#[test]
fn fragmentation_scenario() {
    let a = allocator(&[(0, 10 * GIB + 100 * MIB)]);
    let whole: Vec<Block> = (0..10)
        .map(|_| a.malloc(0, GIB, 0, None).unwrap())
        .collect();
    for b in &whole {
        a.free(b.addr).unwrap();
    }
    let tensors: Vec<Block> = (0..10)
        .map(|_| a.malloc(0, 600 * MIB, 0, None).unwrap())
        .collect();
    assert_eq!(
        a.stats(0).segment.all.current,
        10,
        "each 1 GiB segment split by one tensor"
    );
    let e = a.malloc(0, 2 * GIB, 0, None).unwrap_err();
    assert_eq!(e.cause, OomCause::DeviceExhausted { cuda_error: 2 });
    assert_eq!(e.segment_bytes, 2 * GIB);
    assert_eq!(e.released_before_failing, 0);
    let f = &e.free_blocks;
    assert_eq!(f.reserved_bytes, 10 * GIB);
    assert_eq!(f.allocated_bytes, 6000 * MIB);
    assert_eq!(f.total_free_bytes, 4240 * MIB);
    assert_eq!(f.largest_free_bytes, 424 * MIB);
    assert_eq!(f.inactive_split_bytes, 4240 * MIB);
    let frag = f.fragmentation.unwrap();
    assert!((frag - (1.0 - 424.0 / 4240.0)).abs() < 1e-12, "{frag}");
    assert_eq!(
        f.histogram,
        vec![HistBin {
            lo: 256 * MIB,
            hi: 512 * MIB,
            count: 10,
            bytes: 4240 * MIB
        }]
    );
    assert_eq!(e.stats.num_ooms, 1);
    assert_eq!(e.stats.num_alloc_retries, 1);
    assert!(e.to_string().contains("refused"));
    for t in tensors {
        a.free(t.addr).unwrap();
    }
    // Now the 2 GiB fits after the retry releases the ten free segments.
    let ok = a.malloc(0, 2 * GIB, 0, None).unwrap();
    assert_eq!(ok.size, 2 * GIB);
    let s = a.stats(0);
    assert_eq!(s.num_alloc_retries, 2);
    assert_eq!(s.segment.all.current, 1);
}

#[test]
fn memory_limit_caps_reserved_bytes() {
    let a = allocator(&[]);
    a.set_memory_limit(0, Some(50 * MIB));
    let x = a.malloc(0, 30 * MIB, 0, None).unwrap();
    let e = a.malloc(0, 30 * MIB, 0, None).unwrap_err();
    assert_eq!(e.cause, OomCause::FractionCap { limit: 50 * MIB });
    assert!(
        a.source().refusals() == 0,
        "the cap is checked before asking the device"
    );
    // Freed and cached: the retry releases the cached segment and then fits under the cap.
    a.free(x.addr).unwrap();
    let y = a.malloc(0, 40 * MIB, 0, None).unwrap();
    assert_eq!(a.stats(0).reserved_bytes.all.current as u64, 40 * MIB);
    a.set_memory_limit(0, None);
    a.malloc(0, 40 * MIB, 0, None).unwrap();
    a.free(y.addr).unwrap();
}

#[test]
fn streams_do_not_share_free_blocks() {
    let a = allocator(&[]);
    let x = a.malloc(0, 4 * KIB, 1, None).unwrap();
    a.free(x.addr).unwrap();
    let y = a.malloc(0, 4 * KIB, 2, None).unwrap();
    assert_ne!(seg_of(&a, 0, y.addr).addr, seg_of(&a, 0, x.addr).addr);
    let z = a.malloc(0, 4 * KIB, 1, None).unwrap();
    assert_eq!(z.addr, x.addr);
}

#[test]
fn record_stream_delays_reuse_until_events_done() {
    let a = allocator(&[]);
    let x = a.malloc(0, 4 * KIB, 1, None).unwrap();
    assert!(a.record_stream(x.addr, 2));
    assert!(a.record_stream(x.addr, 2)); // recorded once
    assert!(a.record_stream(x.addr, 1)); // its own stream: nothing to wait for
    let before = a.source().next_event();
    a.free(x.addr).unwrap();
    assert_eq!(a.source().next_event(), before + 1);
    let s = a.stats(0);
    assert_eq!((s.allocation.all.current, s.active.all.current), (0, 1));
    assert_eq!(a.free_blocks(0).pending_free_bytes, 4 * KIB);
    let y = a.malloc(0, 4 * KIB, 1, None).unwrap();
    assert_ne!(y.addr, x.addr, "pending block not reused");
    a.source().complete_event(before);
    let z = a.malloc(0, 4 * KIB, 1, None).unwrap();
    assert_eq!(z.addr, x.addr, "reused once the event is done");
    assert!(a.source().violations().is_empty());
    assert!(a.source().state.lock().unwrap().destroyed.contains(&before));
}

#[test]
fn captured_blocks_stay_in_their_capture() {
    let a = allocator(&[]);
    let c = a.malloc(0, 4 * KIB, 1, Some(7)).unwrap();
    assert_eq!(seg_of(&a, 0, c.addr).capture, Some(7));
    a.free(c.addr).unwrap();
    // Outside the capture: a different segment.
    let o = a.malloc(0, 4 * KIB, 1, None).unwrap();
    assert_eq!(seg_of(&a, 0, o.addr).capture, None);
    // Same capture: reused.
    let c2 = a.malloc(0, 4 * KIB, 1, Some(7)).unwrap();
    assert_eq!(c2.addr, c.addr);
    a.end_capture(7);
    a.free(c2.addr).unwrap();
    let f = a.free_blocks(0);
    assert_eq!(f.graph_retained_free_bytes, 2 * MIB);
    // Never released, never reused.
    a.empty_cache(None);
    assert_eq!(a.stats(0).segment.all.current, 2);
    let n = a.malloc(0, 4 * KIB, 1, Some(8)).unwrap();
    assert_ne!(seg_of(&a, 0, n.addr).capture, Some(7));
    // OOM under capture does not release cached segments (cudaFree is illegal while capturing).
    let b = allocator(&[(0, 4 * MIB)]);
    let x = b.malloc(0, 4 * KIB, 0, None).unwrap();
    b.free(x.addr).unwrap();
    b.malloc(0, 4 * KIB, 0, Some(1)).unwrap();
    let e = b
        .malloc(0, 2 * MIB - 4 * KIB + 512, 0, Some(1))
        .unwrap_err();
    assert_eq!(e.released_before_failing, 0);
    assert_eq!(e.stats.num_alloc_retries, 0);
}

#[test]
fn oversize_blocks_follow_max_split_size() {
    let cfg = AllocConfig {
        max_split_size: Some(64 * MIB),
        ..AllocConfig::default()
    };
    let a = CachingAllocator::new(FakeSource::with_capacity(&[]), cfg);
    let big = a.malloc(0, 100 * MIB, 0, None).unwrap();
    a.free(big.addr).unwrap();
    // A request under max_split never takes (or splits) the oversize block.
    let small = a.malloc(0, 30 * MIB, 0, None).unwrap();
    assert_ne!(small.addr, big.addr);
    // A request ≥ max_split takes it only if < 20 MiB would be wasted.
    let near = a.malloc(0, 90 * MIB, 0, None).unwrap();
    assert_eq!((near.addr, near.size), (big.addr, 100 * MIB));
    a.free(near.addr).unwrap();
    let far = a.malloc(0, 70 * MIB, 0, None).unwrap();
    assert_ne!(far.addr, big.addr);
    let s = a.stats(0);
    assert_eq!(s.max_split_size as u64, 64 * MIB);
    assert_eq!(s.oversize_segments.current, 2);
    assert_eq!(s.oversize_allocations.current, 1);
    let keys: HashMap<String, i64> = s.torch_keys().into_iter().collect();
    assert_eq!(keys["oversize_segments.current"], 2);
    assert_eq!(keys["max_split_size"], 64 * MIB as i64);
}

#[test]
fn torch_key_names() {
    let a = allocator(&[]);
    a.malloc(0, 4 * KIB, 0, None).unwrap();
    let keys = a.stats(0).torch_keys();
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    // 9 families × 3 pools × 4 + 2 oversize × 4 + 6 scalars.
    assert_eq!(names.len(), 9 * 12 + 8 + 6);
    let map: HashMap<&str, i64> = keys.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(map["allocated_bytes.all.current"], 4096);
    assert_eq!(map["allocated_bytes.small_pool.allocated"], 4096);
    assert_eq!(map["allocation.all.current"], 1);
    assert_eq!(map["reserved_bytes.small_pool.current"], 2 * MIB as i64);
    assert_eq!(
        map["inactive_split_bytes.all.current"],
        2 * MIB as i64 - 4096
    );
    assert_eq!(map["requested_bytes.all.peak"], 4096);
    assert_eq!(map["segment.large_pool.current"], 0);
    assert_eq!(map["max_split_size"], -1);
    for k in [
        "active.all.freed",
        "active_bytes.large_pool.peak",
        "inactive_split.small_pool.current",
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "oversize_allocations.peak",
    ] {
        assert!(map.contains_key(k), "{k}");
    }
}

#[test]
fn reset_stats() {
    let a = allocator(&[]);
    let x = a.malloc(0, 8 * MIB, 0, None).unwrap();
    a.free(x.addr).unwrap();
    a.malloc(0, 4 * KIB, 0, None).unwrap();
    a.reset_peak_stats(0);
    let s = a.stats(0);
    assert_eq!(s.allocated_bytes.all.peak, 4096);
    assert_eq!(s.reserved_bytes.all.peak, s.reserved_bytes.all.current);
    a.reset_accumulated_stats(0);
    let s = a.stats(0);
    assert_eq!(
        (s.allocated_bytes.all.allocated, s.allocated_bytes.all.freed),
        (0, 0)
    );
    assert_eq!((s.num_device_alloc, s.num_device_free), (0, 0));
    assert_eq!(s.allocated_bytes.all.current, 4096);
}

#[test]
fn threads_smoke() {
    // Room enough that no thread runs out: eight threads keep up to 16 blocks of up to 16 MiB,
    // and the cache of each stream (which others cannot use) and the blocks waiting on events
    // come on top. With 4 GiB a device, one malloc in about 40 runs found the device exhausted by
    // the others' caches at that moment (a true out-of-memory, not this test's subject).
    let a = std::sync::Arc::new(allocator(&[(0, 64 * GIB), (1, 64 * GIB)]));
    a.source().state.lock().unwrap().auto_complete = true;
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut rng = (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut live: Vec<u64> = Vec::new();
                for _ in 0..100_000 {
                    let r = next();
                    if live.len() < 16 && (r & 1 == 0 || live.is_empty()) {
                        let size = match (r >> 1) % 8 {
                            0 => (r >> 8) % (16 * MIB),
                            1..=3 => (r >> 8) % MIB,
                            _ => (r >> 8) % (64 * KIB),
                        };
                        let device = (t % 2) as i32;
                        let stream = t % 3;
                        let b = a.malloc(device, size, stream, None).expect("fits");
                        if r % 7 == 0 {
                            a.record_stream(b.addr, stream + 1);
                        }
                        live.push(b.addr);
                    } else {
                        let i = (r >> 1) as usize % live.len();
                        let addr = live.swap_remove(i);
                        assert!(a.free(addr).is_some());
                    }
                    if r % 50_000 == 1 {
                        a.empty_cache(None);
                    }
                }
                for addr in live {
                    assert!(a.free(addr).is_some());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for e in a.source().undone_events() {
        a.source().complete_event(e);
    }
    a.empty_cache(None);
    for d in [0, 1] {
        let s = a.stats(d);
        assert_eq!(s.allocated_bytes.all.current, 0);
        assert_eq!(s.allocation.all.current, 0);
        assert_eq!(s.active.all.current, 0);
        assert_eq!(s.requested_bytes.all.current, 0);
        assert_eq!(s.reserved_bytes.all.current, 0);
        assert_eq!(a.source().used(d), 0);
    }
    assert!(
        a.source().violations().is_empty(),
        "{:?}",
        a.source().violations()
    );
}

// ---- the property test -------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Malloc { device: i32, size: u64, stream: u64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u64 },
    CompleteEvent { pick: usize },
    EmptyCache { device: Option<i32> },
    BeginCapture { stream: u64 },
    EndCapture { stream: u64 },
    SetLimit { device: i32, limit: Option<u64> },
    ResetPeak { device: i32 },
}

/// xorshift64*: the source of the random sequences, seeded per case so that a failure names the
/// case that reproduces it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: u64, hi_inclusive: u64) -> u64 {
        lo + self.below(hi_inclusive - lo + 1)
    }

    /// An index into `weights`, drawn with those weights.
    fn weighted(&mut self, weights: &[u64]) -> usize {
        let mut r = self.below(weights.iter().sum());
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        unreachable!("r is below the sum of the weights")
    }

    fn maybe<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        (self.below(2) == 0).then(|| f(self))
    }
}

/// Request sizes: mostly small-pool and 1-10 MiB requests, some large ones, 0 and u64::MAX.
fn random_size(r: &mut Rng) -> u64 {
    match r.weighted(&[6, 2, 3, 2, 1, 1]) {
        0 => r.range(1, MIB),
        1 => r.range(1, 8 * KIB),
        2 => r.range(MIB + 1, 10 * MIB - 1),
        3 => r.range(10 * MIB, 40 * MIB - 1),
        4 => 0,
        _ => u64::MAX,
    }
}

fn random_op(r: &mut Rng) -> Op {
    match r.weighted(&[10, 8, 2, 3, 1, 1, 1, 1, 1]) {
        0 => Op::Malloc {
            device: r.below(2) as i32,
            size: random_size(r),
            stream: r.below(3),
        },
        1 => Op::Free {
            pick: r.next() as usize,
        },
        2 => Op::RecordStream {
            pick: r.next() as usize,
            stream: r.below(3),
        },
        3 => Op::CompleteEvent {
            pick: r.next() as usize,
        },
        4 => Op::EmptyCache {
            device: r.maybe(|r| r.below(2) as i32),
        },
        5 => Op::BeginCapture { stream: r.below(3) },
        6 => Op::EndCapture { stream: r.below(3) },
        7 => Op::SetLimit {
            device: r.below(2) as i32,
            limit: r.maybe(|r| r.range(20, 119) * MIB),
        },
        _ => Op::ResetPeak {
            device: r.below(2) as i32,
        },
    }
}

/// The harness's own record of what it was given and what it expects.
struct Model {
    config: AllocConfig,
    a: CachingAllocator<FakeSource>,
    /// Live blocks and the capture each was allocated under.
    live: Vec<(Block, Option<u64>)>,
    /// Freed blocks waiting for events: (device, addr, size, events).
    pending: Vec<(i32, u64, u64, Vec<u64>)>,
    /// Live address → the other streams recorded on it.
    recorded: HashMap<u64, HashSet<u64>>,
    capturing: [Option<u64>; 3],
    next_capture: u64,
    ended: HashSet<u64>,
    /// (device, segment addr) → (size, stream, capture), as first seen.
    seen_segments: HashMap<(i32, u64), (u64, u64, Option<u64>)>,
    /// Running maxima of recomputed current values, for the peaks: [device][stat][pool].
    peaks: HashMap<(i32, &'static str, usize), i64>,
    limits: HashMap<i32, u64>,
}

const DEVICES: [i32; 2] = [0, 1];

impl Model {
    fn new(config: AllocConfig) -> Self {
        let a = CachingAllocator::new(
            FakeSource::with_capacity(&[(0, 96 * MIB), (1, 64 * MIB)]),
            config.clone(),
        );
        Model {
            config,
            a,
            live: Vec::new(),
            pending: Vec::new(),
            recorded: HashMap::new(),
            capturing: [None; 3],
            next_capture: 100,
            ended: HashSet::new(),
            seen_segments: HashMap::new(),
            peaks: HashMap::new(),
            limits: HashMap::new(),
        }
    }

    fn rounded(size: u64) -> u64 {
        size.max(1).div_ceil(512) * 512
    }

    fn max_split(&self) -> u64 {
        self.config.max_split_size.unwrap_or(u64::MAX)
    }

    fn fits(&self, block: u64, rounded: u64) -> bool {
        let ms = self.max_split();
        block >= rounded
            && !(rounded < ms && block >= ms)
            && !(rounded >= ms && block >= rounded + self.config.max_non_split_rounding)
    }

    fn expected_segment(rounded: u64) -> u64 {
        if rounded <= MIB {
            2 * MIB
        } else if rounded < 10 * MIB {
            20 * MIB
        } else {
            rounded.div_ceil(2 * MIB) * 2 * MIB
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Malloc {
                device,
                size,
                stream,
            } => {
                let capture = self.capturing[stream as usize];
                let segs_before: HashSet<u64> =
                    self.a.segments(device).iter().map(|s| s.addr).collect();
                let refusals_before = self.a.source().refusals();
                match self.a.malloc(device, size, stream, capture) {
                    Ok(b) => self.check_block(device, size, stream, capture, &b, &segs_before)?,
                    Err(e) => self.check_oom(device, size, stream, capture, &e, refusals_before)?,
                }
                if size <= 1 << 62 {
                    // The malloc polled the events: no pending block has all its events done.
                    self.check_no_finished_pending(device)?;
                }
            }
            Op::Free { pick } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let (b, _) = self.live.swap_remove(pick % self.live.len());
                let first_event = self.a.source().next_event();
                let freed = self.a.free(b.addr);
                prop_assert_eq!(freed, Some(b));
                let last_event = self.a.source().next_event();
                let recorded = self.recorded.remove(&b.addr).unwrap_or_default();
                prop_assert_eq!(
                    (last_event - first_event) as usize,
                    recorded.len(),
                    "one event per other stream recorded"
                );
                if last_event > first_event {
                    self.pending.push((
                        b.device,
                        b.addr,
                        b.size,
                        (first_event..last_event).collect(),
                    ));
                }
                prop_assert!(self.a.free(b.addr).is_none());
            }
            Op::RecordStream { pick, stream } => {
                if self.live.is_empty() {
                    prop_assert!(!self.a.record_stream(1 << 20, stream));
                    return Ok(());
                }
                let (b, _) = self.live[pick % self.live.len()];
                prop_assert!(self.a.record_stream(b.addr, stream));
                if stream != b.stream {
                    self.recorded.entry(b.addr).or_default().insert(stream);
                }
            }
            Op::CompleteEvent { pick } => self.a.source().complete_oldest(pick),
            Op::EmptyCache { device } => {
                let before: u64 = DEVICES
                    .iter()
                    .map(|&d| self.a.stats(d).reserved_bytes.all.current as u64)
                    .sum();
                let released = self.a.empty_cache(device);
                let after: u64 = DEVICES
                    .iter()
                    .map(|&d| self.a.stats(d).reserved_bytes.all.current as u64)
                    .sum();
                prop_assert_eq!(before - after, released);
                for d in DEVICES {
                    if device.is_none_or(|want| want == d) {
                        // No fully free device-wide segment survives empty_cache.
                        for s in self.a.segments(d) {
                            prop_assert!(
                                s.capture.is_some()
                                    || s.blocks.len() > 1
                                    || s.blocks[0].state != BlockState::Inactive,
                                "fully free segment after empty_cache: {:?}",
                                s
                            );
                        }
                        self.check_no_finished_pending(d)?;
                    }
                }
            }
            Op::BeginCapture { stream } => {
                if self.capturing[stream as usize].is_none() {
                    self.capturing[stream as usize] = Some(self.next_capture);
                    self.next_capture += 1;
                }
            }
            Op::EndCapture { stream } => {
                if let Some(id) = self.capturing[stream as usize].take() {
                    self.a.end_capture(id);
                    self.ended.insert(id);
                }
            }
            Op::SetLimit { device, limit } => {
                self.a.set_memory_limit(device, limit);
                match limit {
                    Some(l) => self.limits.insert(device, l),
                    None => self.limits.remove(&device),
                };
            }
            Op::ResetPeak { device } => {
                self.a.reset_peak_stats(device);
                self.peaks.retain(|(d, _, _), _| *d != device);
            }
        }
        self.pending
            .retain(|(_, _, _, events)| events.iter().any(|&e| !self.a.source().is_done(e)));
        self.check_invariants()
    }

    fn segment_containing(&self, device: i32, addr: u64) -> Option<SegmentView> {
        self.a
            .segments(device)
            .into_iter()
            .find(|s| s.addr <= addr && addr < s.addr + s.size)
    }

    fn check_block(
        &mut self,
        device: i32,
        size: u64,
        stream: u64,
        capture: Option<u64>,
        b: &Block,
        segs_before: &HashSet<u64>,
    ) -> Result<(), TestCaseError> {
        let rounded = Self::rounded(size);
        prop_assert_eq!((b.device, b.stream, b.requested), (device, stream, size));
        prop_assert!(b.size >= rounded && b.size.is_multiple_of(512));
        prop_assert_eq!(b.pool == PoolKind::Small, rounded <= MIB);
        let seg = self.segment_containing(device, b.addr);
        prop_assert!(seg.is_some(), "block outside every segment");
        let seg = seg.unwrap();
        prop_assert!(b.addr + b.size <= seg.addr + seg.size);
        prop_assert_eq!(seg.stream, stream, "block of another stream's segment");
        prop_assert_eq!(seg.capture, capture, "block crosses a capture boundary");
        prop_assert!(seg.capture.is_none_or(|c| !self.ended.contains(&c)));
        prop_assert_eq!(seg.pool, b.pool);
        if !segs_before.contains(&seg.addr) {
            prop_assert_eq!(seg.size, Self::expected_segment(rounded));
        }
        for (d, addr, psize, events) in &self.pending {
            let busy = events.iter().any(|&e| !self.a.source().is_done(e));
            let overlaps = *d == device && b.addr < addr + psize && *addr < b.addr + b.size;
            prop_assert!(
                !(busy && overlaps),
                "pending block handed out before its events"
            );
        }
        self.live.push((*b, capture));
        Ok(())
    }

    fn check_oom(
        &self,
        device: i32,
        size: u64,
        stream: u64,
        capture: Option<u64>,
        e: &OutOfMemory,
        refusals_before: u64,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(e.device, device);
        prop_assert_eq!(e.requested, size);
        if size > 1 << 62 {
            return Ok(());
        }
        let rounded = Self::rounded(size);
        prop_assert_eq!(e.rounded, rounded);
        prop_assert_eq!(e.segment_bytes, Self::expected_segment(rounded));
        let reserved = self.a.stats(device).reserved_bytes.all.current as u64;
        match e.cause {
            OomCause::DeviceExhausted { cuda_error } => {
                prop_assert_eq!(cuda_error, 2);
                prop_assert!(self.a.source().refusals() > refusals_before);
                prop_assert!(self.a.source().free_room(device) < e.segment_bytes);
            }
            OomCause::FractionCap { limit } => {
                prop_assert_eq!(Some(&limit), self.limits.get(&device));
                prop_assert!(reserved + e.segment_bytes > limit);
            }
        }
        // Nothing cached could have served it.
        let kind = if rounded <= MIB {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        for s in self.a.segments(device) {
            if capture.is_none() && s.capture.is_none() {
                prop_assert!(
                    s.blocks.len() > 1 || s.blocks[0].state != BlockState::Inactive,
                    "OOM with a fully free cached segment left"
                );
            }
            if s.stream != stream || s.capture != capture || s.pool != kind {
                continue;
            }
            for blk in &s.blocks {
                prop_assert!(
                    !(blk.state == BlockState::Inactive && self.fits(blk.size, rounded)),
                    "OOM although a free block of {} fits {}",
                    blk.size,
                    rounded
                );
            }
        }
        prop_assert_eq!(&e.free_blocks, &self.a.free_blocks(device));
        Ok(())
    }

    fn check_no_finished_pending(&self, device: i32) -> Result<(), TestCaseError> {
        for s in self.a.segments(device) {
            for blk in &s.blocks {
                if blk.state == BlockState::ActivePendingFree {
                    let rec = self
                        .pending
                        .iter()
                        .find(|(d, a, _, _)| *d == device && *a == blk.addr);
                    prop_assert!(rec.is_some_and(|(_, _, _, ev)| ev
                        .iter()
                        .any(|&e| !self.a.source().is_done(e))));
                }
            }
        }
        Ok(())
    }

    fn peak(&mut self, device: i32, name: &'static str, pool: usize, current: i64) -> i64 {
        let p = self.peaks.entry((device, name, pool)).or_insert(current);
        *p = (*p).max(current);
        *p
    }

    fn check_invariants(&mut self) -> Result<(), TestCaseError> {
        prop_assert!(
            self.a.source().violations().is_empty(),
            "{:?}",
            self.a.source().violations()
        );
        for device in DEVICES {
            let segs = self.a.segments(device);
            let stats = self.a.stats(device);
            // Segments: disjoint, each exactly tiled by its blocks, free neighbours merged.
            let mut last_end = 0;
            for s in &segs {
                prop_assert!(s.addr >= last_end);
                last_end = s.addr + s.size;
                let mut at = s.addr;
                for (i, blk) in s.blocks.iter().enumerate() {
                    prop_assert_eq!(blk.addr, at, "blocks do not tile the segment");
                    prop_assert!(blk.size > 0);
                    at += blk.size;
                    if i > 0 {
                        prop_assert!(
                            !(blk.state == BlockState::Inactive
                                && s.blocks[i - 1].state == BlockState::Inactive),
                            "adjacent free blocks not coalesced"
                        );
                    }
                }
                prop_assert_eq!(at, s.addr + s.size);
                let seen = self
                    .seen_segments
                    .entry((device, s.addr))
                    .or_insert((s.size, s.stream, s.capture));
                prop_assert_eq!(
                    *seen,
                    (s.size, s.stream, s.capture),
                    "segment changed identity"
                );
            }
            // The source's outstanding segments are exactly the allocator's.
            let ours: Vec<(u64, u64)> = segs.iter().map(|s| (s.addr, s.size)).collect();
            prop_assert_eq!(ours, self.a.source().segments_of(device));
            // Live blocks are exactly the allocated blocks.
            let mut allocated: Vec<(u64, u64, u64)> = segs
                .iter()
                .flat_map(|s| s.blocks.iter())
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .map(|b| (b.addr, b.size, b.requested))
                .collect();
            allocated.sort();
            let mut expected: Vec<(u64, u64, u64)> = self
                .live
                .iter()
                .filter(|(b, _)| b.device == device)
                .map(|(b, _)| (b.addr, b.size, b.requested))
                .collect();
            expected.sort();
            prop_assert_eq!(allocated, expected);
            // Pending blocks whose events are not done are still pending.
            for (d, addr, size, _) in &self.pending {
                if *d != device {
                    continue;
                }
                let blk = segs
                    .iter()
                    .flat_map(|s| s.blocks.iter())
                    .find(|b| b.addr == *addr);
                prop_assert!(
                    blk.is_some_and(|b| b.state == BlockState::ActivePendingFree && b.size == *size),
                    "pending block reused or merged early"
                );
            }

            // Stats recomputed from the segments.
            #[derive(Default, Clone, Copy)]
            struct Recount {
                allocation: i64,
                allocated_bytes: i64,
                requested_bytes: i64,
                active: i64,
                active_bytes: i64,
                segment: i64,
                reserved_bytes: i64,
                inactive_split: i64,
                inactive_split_bytes: i64,
            }
            let mut by_pool = [Recount::default(); 3]; // all, small, large
            let mut free_sizes: Vec<u64> = Vec::new();
            let mut retained = 0;
            let mut pending_bytes = 0;
            for s in &segs {
                let p = match s.pool {
                    PoolKind::Small => 1,
                    PoolKind::Large => 2,
                };
                let sealed = s.capture.is_some_and(|c| self.ended.contains(&c));
                for slot in [0, p] {
                    let r = &mut by_pool[slot];
                    r.segment += 1;
                    r.reserved_bytes += s.size as i64;
                    for b in &s.blocks {
                        match b.state {
                            BlockState::ActiveAllocated => {
                                r.allocation += 1;
                                r.allocated_bytes += b.size as i64;
                                r.requested_bytes += b.requested as i64;
                                r.active += 1;
                                r.active_bytes += b.size as i64;
                            }
                            BlockState::ActivePendingFree => {
                                r.active += 1;
                                r.active_bytes += b.size as i64;
                            }
                            BlockState::Inactive if s.blocks.len() > 1 => {
                                r.inactive_split += 1;
                                r.inactive_split_bytes += b.size as i64;
                            }
                            BlockState::Inactive => {}
                        }
                    }
                }
                for b in &s.blocks {
                    match b.state {
                        BlockState::Inactive if sealed => retained += b.size,
                        BlockState::Inactive => free_sizes.push(b.size),
                        BlockState::ActivePendingFree => pending_bytes += b.size,
                        BlockState::ActiveAllocated => {}
                    }
                }
            }
            for (slot, r) in by_pool.iter().enumerate() {
                let pick = |a: &StatArray| *[&a.all, &a.small_pool, &a.large_pool][slot];
                let checks: [(&'static str, &StatArray, i64); 9] = [
                    ("allocation", &stats.allocation, r.allocation),
                    ("allocated_bytes", &stats.allocated_bytes, r.allocated_bytes),
                    ("requested_bytes", &stats.requested_bytes, r.requested_bytes),
                    ("active", &stats.active, r.active),
                    ("active_bytes", &stats.active_bytes, r.active_bytes),
                    ("segment", &stats.segment, r.segment),
                    ("reserved_bytes", &stats.reserved_bytes, r.reserved_bytes),
                    ("inactive_split", &stats.inactive_split, r.inactive_split),
                    (
                        "inactive_split_bytes",
                        &stats.inactive_split_bytes,
                        r.inactive_split_bytes,
                    ),
                ];
                for (name, array, current) in checks {
                    let stat = pick(array);
                    prop_assert_eq!(
                        stat.current,
                        current,
                        "{} current (pool slot {})",
                        name,
                        slot
                    );
                    let peak = self.peak(device, name, slot, current);
                    if name.starts_with("inactive_split") {
                        // A malloc that retires a pending block frees it (raising inactive
                        // split) before carving (lowering it): torch's peak sees that
                        // intermediate value too, this harness cannot.
                        prop_assert!(stat.peak >= peak, "{} peak", name);
                        self.peaks.insert((device, name, slot), stat.peak);
                    } else {
                        prop_assert_eq!(stat.peak, peak, "{} peak (pool slot {})", name, slot);
                    }
                    prop_assert_eq!(stat.allocated - stat.freed, stat.current, "{}", name);
                }
            }
            prop_assert_eq!(
                stats.num_device_alloc - stats.num_device_free,
                stats.segment.all.current as u64
            );

            // The continuously kept summary equals a recount.
            let f = self.a.free_blocks(device);
            let total: u64 = free_sizes.iter().sum();
            let largest = free_sizes.iter().copied().max().unwrap_or(0);
            prop_assert_eq!(f.total_free_bytes, total);
            prop_assert_eq!(f.largest_free_bytes, largest);
            prop_assert_eq!(f.graph_retained_free_bytes, retained);
            prop_assert_eq!(f.pending_free_bytes, pending_bytes);
            prop_assert_eq!(f.reserved_bytes, by_pool[0].reserved_bytes as u64);
            prop_assert_eq!(f.allocated_bytes, by_pool[0].allocated_bytes as u64);
            prop_assert_eq!(f.segments, segs.len() as u64);
            prop_assert_eq!(
                f.inactive_split_bytes,
                by_pool[0].inactive_split_bytes as u64
            );
            prop_assert_eq!(
                f.fragmentation,
                (total > 0).then(|| 1.0 - largest as f64 / total as f64)
            );
            let mut hist: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            for &s in &free_sizes {
                let e = hist.entry(63 - s.leading_zeros()).or_default();
                e.0 += 1;
                e.1 += s;
            }
            let hist: Vec<HistBin> = hist
                .into_iter()
                .map(|(k, (count, bytes))| HistBin {
                    lo: 1 << k,
                    hi: 1 << (k + 1),
                    count,
                    bytes,
                })
                .collect();
            prop_assert_eq!(f.histogram, hist);
        }
        Ok(())
    }
}

fn run_model(config: AllocConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut m = Model::new(config);
    for op in ops {
        m.apply(op)?;
    }
    // Drain: free everything, finish every event, empty the cache: only capture segments stay.
    while !m.live.is_empty() {
        m.apply(&Op::Free { pick: 0 })?;
    }
    for e in m.a.source().undone_events() {
        m.a.source().complete_event(e);
    }
    m.pending.clear();
    m.a.empty_cache(None);
    m.check_invariants()?;
    for d in DEVICES {
        let s = m.a.stats(d);
        prop_assert_eq!(s.allocation.all.current, 0);
        prop_assert_eq!(s.active.all.current, 0);
        for seg in m.a.segments(d) {
            prop_assert!(
                seg.capture.is_some(),
                "non-capture segment left after drain"
            );
        }
    }
    Ok(())
}

/// Runs [`run_model`] on random sequences of 1 to 199 operations: 256 cases, each from its own
/// seed (the same cases every run). A failing sequence is shrunk
/// (operations removed one at a time while it still fails) and printed with its case number.
/// Hand-written rather than proptest: proptest and its dependencies (rand, regex-syntax) were
/// about 23 s of CPU in every fresh `cargo test` for these two tests.
fn check_random_sequences(config: AllocConfig) {
    for case in 0..256u64 {
        let mut r = Rng(0x9E37_79B9_7F4A_7C15 ^ (case + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let len = r.range(1, 199) as usize;
        let ops: Vec<Op> = (0..len).map(|_| random_op(&mut r)).collect();
        if let Err(error) = outcome(&config, &ops) {
            let (ops, error) = shrink(&config, ops, error);
            panic!(
                "case {case} fails: {error}\nshrunk to {} operations: {ops:#?}",
                ops.len()
            );
        }
    }
}

/// The model's verdict on `ops`, a panic inside it included.
fn outcome(config: &AllocConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    std::panic::catch_unwind(AssertUnwindSafe(|| run_model(config.clone(), ops))).unwrap_or_else(
        |p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("panicked: {what}"))
        },
    )
}

/// `ops` with operations removed, one at a time, for as long as it still fails.
fn shrink(
    config: &AllocConfig,
    mut ops: Vec<Op>,
    mut error: TestCaseError,
) -> (Vec<Op>, TestCaseError) {
    let mut i = 0;
    while i < ops.len() {
        let mut fewer = ops.clone();
        fewer.remove(i);
        match outcome(config, &fewer) {
            Err(e) => (ops, error) = (fewer, e),
            Ok(()) => i += 1,
        }
    }
    (ops, error)
}

#[test]
fn random_sequences_keep_invariants() {
    check_random_sequences(AllocConfig::default());
}

#[test]
fn random_sequences_with_max_split_size() {
    check_random_sequences(AllocConfig {
        max_split_size: Some(8 * MIB),
        ..AllocConfig::default()
    });
}

// ---- torch's memory history ------------------------------------------------------------------

fn actions(a: &CachingAllocator<FakeSource>, device: i32) -> Vec<(&'static str, u64, u64, u32)> {
    a.trace(device)
        .iter()
        .map(|e| (e.action.torch_name(), e.addr, e.size, e.context))
        .collect()
}

fn history(context: RecordContext, max_entries: usize) -> Option<HistoryConfig> {
    Some(HistoryConfig {
        context,
        max_entries,
    })
}

#[test]
fn history_records_torchs_actions_in_order_with_their_stacks() {
    let a = allocator(&[(0, 64 * MIB)]);
    let before = a.malloc(0, 4 * KIB, 0, None).unwrap();
    assert_eq!(a.history_context(), None);
    assert!(a.trace(0).is_empty(), "nothing while off");
    a.record_history(history(RecordContext::Alloc, usize::MAX), false);
    assert_eq!(a.history_context(), Some(RecordContext::Alloc));
    let x = a.malloc_in_context(0, 5 * MIB, 0, None, 11).unwrap();
    let y = a.malloc_in_context(0, 1000, 0, None, 12).unwrap();
    assert!(a.record_stream(y.addr, 3));
    a.free_in_context(0, x.addr, 21).unwrap(); // a free's own stack is kept only at `all`
    a.free_in_context(0, y.addr, 0).unwrap(); // waits for stream 3
    a.source().complete_oldest(0);
    a.malloc_in_context(0, 512, 0, None, 13).unwrap(); // polls the event: y completes
    a.empty_cache(None);
    assert_eq!(
        a.malloc_in_context(0, 80 * MIB, 0, None, 14)
            .unwrap_err()
            .requested,
        80 * MIB
    );
    a.record_oom(0, 80 * MIB, 9 * MIB, 0, 14);
    let seg_x = seg_of(&a, 0, before.addr).addr;
    let t = actions(&a, 0);
    let large = t[0].1;
    assert_eq!(
        t,
        [
            ("segment_alloc", large, 20 * MIB, 11),
            ("alloc", x.addr, 5 * MIB, 11),
            ("alloc", y.addr, 1000, 12),
            ("free_requested", x.addr, 5 * MIB, 11),
            ("free_completed", x.addr, 5 * MIB, 11),
            ("free_requested", y.addr, 1000, 12),
            ("free_completed", y.addr, 1000, 12),
            ("alloc", t[7].1, 512, 13),
            ("segment_free", large, 20 * MIB, 11),
            ("oom", 9 * MIB, 80 * MIB, 14),
        ]
    );
    assert_eq!(seg_of(&a, 0, t[7].1).addr, seg_x, "the small segment stays");
    assert!(a.trace(0).windows(2).all(|w| w[0].time_us <= w[1].time_us));
    // Live blocks keep their allocation's stack; the one from before history has none.
    let blocks: Vec<(u64, u32)> = a.segments(0)[0]
        .blocks
        .iter()
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| (b.addr, b.context))
        .collect();
    assert_eq!(blocks, [(before.addr, 0), (t[7].1, 13)]);
}

#[test]
fn history_levels_ring_size_and_off() {
    let a = allocator(&[]);
    // `all`: a free carries its own stack.
    a.record_history(history(RecordContext::All, usize::MAX), false);
    let x = a.malloc_in_context(0, 4 * KIB, 0, None, 5).unwrap();
    a.free_in_context(0, x.addr, 6).unwrap();
    let ctx: Vec<u32> = a.trace(0).iter().map(|e| e.context).collect();
    assert_eq!(ctx, [5, 5, 6, 6]);
    // `state`: no stack on any entry, but blocks keep theirs.
    a.record_history(history(RecordContext::State, usize::MAX), true);
    assert!(a.trace(0).is_empty(), "cleared");
    let y = a.malloc_in_context(0, 4 * KIB, 0, None, 7).unwrap();
    assert_eq!(a.trace(0)[0].context, 0);
    assert_eq!(seg_of(&a, 0, y.addr).blocks[0].context, 7);
    // A ring of 3 keeps the newest 3; settings change without clearing.
    a.record_history(history(RecordContext::Alloc, 3), false);
    for _ in 0..3 {
        let z = a.malloc_in_context(0, 4 * KIB, 0, None, 8).unwrap();
        a.free_in_context(0, z.addr, 0).unwrap();
    }
    let t: Vec<&str> = actions(&a, 0).iter().map(|e| e.0).collect();
    assert_eq!(t, ["alloc", "free_requested", "free_completed"]);
    // A device used for the first time while on records too.
    a.malloc_in_context(1, 4 * KIB, 0, None, 9).unwrap();
    assert_eq!(actions(&a, 1).len(), 2);
    // Off: every trace goes, and nothing more is recorded.
    a.record_history(None, false);
    assert_eq!(a.history_context(), None);
    a.malloc_in_context(0, 4 * KIB, 0, None, 0).unwrap();
    assert!(a.trace(0).is_empty() && a.trace(1).is_empty());
    assert_eq!(
        seg_of(&a, 0, y.addr).blocks[0].context,
        7,
        "blocks keep theirs"
    );
}
