//! Writing a dump of a large process: 100,000 live allocations over 10,000 distinct native
//! stacks (32 frames each, every address inside real functions of this binary, so symbolisation
//! does real work). Measures snapshot + holders/sites + symbolisation + verdict + JSON, as the
//! shim does on an out-of-memory failure, with the default `OOMSHIM_TOP` (20) and with every
//! site written (`OOMSHIM_TOP=10000`: all 10,000 stacks symbolised). Goal: ≤ 1 s.
//!
//! And the large case: 1,000,000 live allocations over 100,000 stacks at the
//! default top (goal ≤ 1 s), with the host memory the ledger takes per live allocation, from glibc's heap
//! statistics before and after building it (stacks measured apart).
//!
//! `cargo bench -p oomshim-benches --bench dump`

use criterion::{criterion_group, criterion_main, Criterion};
use oomshim_benches::{stack_pool, ALLOCATIONS, STACKS};
use std::hint::black_box;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let pool = stack_pool();
    let mut g = c.benchmark_group("dump");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for top in [20usize, 10_000] {
        let shim = oomshim::shim::bench_support::synthetic(ALLOCATIONS, STACKS, &pool, top);
        let bytes = shim.dump_json().len();
        eprintln!("top {top}: dump of {bytes} bytes");
        g.bench_function(format!("100k_allocs_10k_stacks_top_{top}"), |b| {
            b.iter(|| black_box(shim.dump_json()))
        });
    }
    let heap_before = heap_in_use();
    let stacks_only = oomshim::shim::bench_support::synthetic(0, 100_000, &pool, 20);
    let heap_stacks = heap_in_use();
    let big = oomshim::shim::bench_support::synthetic(1_000_000, 100_000, &pool, 20);
    let heap_big = heap_in_use();
    let stacks_bytes = heap_stacks.saturating_sub(heap_before);
    let ledger_bytes = heap_big
        .saturating_sub(heap_stacks)
        .saturating_sub(stacks_bytes);
    eprintln!(
        "1M live allocations: {:.1} bytes each in the ledger; 100k interned 32-frame stacks: {:.0} bytes each",
        ledger_bytes as f64 / 1e6,
        stacks_bytes as f64 / 1e5
    );
    drop(stacks_only);
    eprintln!(
        "1M allocations, 100k stacks, top 20: dump of {} bytes",
        big.dump_json().len()
    );
    g.bench_function("1M_allocs_100k_stacks_top_20", |b| {
        b.iter(|| black_box(big.dump_json()))
    });
    g.finish();
}

/// Heap bytes in use (glibc's `mallinfo2`: arena blocks in use plus mmapped blocks). Not the
/// resident set: memory freed by earlier cases and reused would hide the growth there.
fn heap_in_use() -> u64 {
    // SAFETY: `mallinfo2` takes no argument and returns a struct by value.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

criterion_group!(benches, bench);
criterion_main!(benches);
