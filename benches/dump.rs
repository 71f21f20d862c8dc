//! Writing a dump of a large process: 100,000 live allocations over 10,000 distinct native
//! stacks (32 frames each, every address inside real functions of this binary, so symbolisation
//! does real work). Measures snapshot + holders/sites + symbolisation + verdict + JSON, as the
//! shim does on an out-of-memory failure, with the default `OOMSHIM_TOP` (20) and with every
//! site written (`OOMSHIM_TOP=10000`: all 10,000 stacks symbolised). Goal: ≤ 1 s.
//!
//! `cargo bench --bench dump`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Duration;

const ALLOCATIONS: usize = 100_000;
const STACKS: usize = 10_000;
const FRAMES: usize = 32;

/// Return addresses of a real stack of this process, cycled to `FRAMES`.
fn pool() -> Vec<usize> {
    let mut buf = [0usize; 64];
    let n = oomshim::stacks::capture(&mut buf, false);
    assert!(n >= 3, "a real stack to vary");
    (0..FRAMES).map(|i| buf[i % n]).collect()
}

fn bench(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("dump");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for top in [20usize, 10_000] {
        let shim = oomshim::runtime::bench_support::synthetic(ALLOCATIONS, STACKS, &pool, top);
        let bytes = shim.dump_json().len();
        eprintln!("top {top}: dump of {bytes} bytes");
        g.bench_function(format!("100k_allocs_10k_stacks_top_{top}"), |b| {
            b.iter(|| black_box(shim.dump_json()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
