//! The caching allocator's hit path: a malloc + free pair served from a warm cache (no segment
//! allocation), for a 4 KiB block (small pool) and a 4 MiB block (large pool), on one thread and
//! with 8 threads contending for the same device's lock. Goal: < 100 ns a pair single-threaded.
//!
//! The cache is warmed with 1,000 live blocks of mixed sizes (and the holes between them) so the
//! free lists and the live map have realistic depth.
//!
//! `cargo bench -p oomshim-benches --bench alloc`

use criterion::{criterion_group, criterion_main, Criterion};
use oomshim_host::alloc::{AllocConfig, CachingAllocator, MemorySource};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A device with unlimited memory whose events finish at once.
struct Unlimited {
    next: AtomicU64,
}

impl MemorySource for Unlimited {
    fn alloc_segment(&self, _device: i32, bytes: u64) -> Result<u64, i32> {
        Ok(self
            .next
            .fetch_add(bytes.next_multiple_of(2 << 20), Ordering::Relaxed))
    }
    fn free_segment(&self, _device: i32, _addr: u64, _bytes: u64) -> Result<(), i32> {
        Ok(())
    }
    fn record_event(&self, _device: i32, _stream: u64) -> Result<u64, i32> {
        Ok(1)
    }
    fn event_done(&self, _event: u64) -> bool {
        true
    }
    fn destroy_event(&self, _event: u64) {}
}

const THREADS: usize = 8;

fn warm_allocator() -> Arc<CachingAllocator<Unlimited>> {
    let a = Arc::new(CachingAllocator::new(
        Unlimited {
            next: AtomicU64::new(1 << 40),
        },
        AllocConfig::default(),
    ));
    // 2,000 blocks of mixed sizes, every other one freed: holes in the free lists.
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut blocks = Vec::new();
    for _ in 0..2000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let size = if rng.is_multiple_of(4) {
            (rng >> 8) % (16 << 20)
        } else {
            (rng >> 8) % (512 << 10)
        };
        blocks.push(a.malloc(0, size, 0, None).unwrap().addr);
    }
    for addr in blocks.iter().step_by(2) {
        a.free(*addr).unwrap();
    }
    a
}

#[inline(always)]
fn pair(a: &CachingAllocator<Unlimited>, size: u64) {
    let b = a.malloc(0, black_box(size), 0, None).unwrap();
    black_box(a.free_on(0, b.addr));
}

fn bench(c: &mut Criterion) {
    let a = warm_allocator();
    let mut g = c.benchmark_group("alloc malloc+free, warm cache");
    g.measurement_time(Duration::from_secs(5));
    for (label, size) in [("4KiB", 4u64 << 10), ("4MiB", 4 << 20)] {
        pair(&a, size); // the segment it needs exists from here on
        g.bench_function(format!("{label} 1 thread"), |b| b.iter(|| pair(&a, size)));
        // Each sample: every one of 8 threads does `iters` pairs on device 0 at once. The time
        // reported per iteration is the wall time of one round of 8 concurrent pairs.
        g.bench_function(
            format!("{label} {THREADS} threads (per round of {THREADS} pairs)"),
            |b| {
                b.iter_custom(|iters| {
                    let start = Arc::new(Barrier::new(THREADS));
                    let handles: Vec<_> = (0..THREADS)
                        .map(|_| {
                            let (a, start) = (a.clone(), start.clone());
                            std::thread::spawn(move || {
                                start.wait();
                                let t = Instant::now();
                                for _ in 0..iters {
                                    pair(&a, size);
                                }
                                t.elapsed()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap())
                        .max()
                        .unwrap()
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
