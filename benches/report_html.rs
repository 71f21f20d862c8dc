//! Rendering the HTML report (`oomshim report DUMP --html`) of a large process's dump: 100,000
//! live allocations over 10,000 distinct native stacks of 32 frames (every address inside real
//! functions of this binary, symbolised as at an out-of-memory failure), as `benches/dump.rs`
//! writes it, with the default `OOMSHIM_TOP` (20) and with 1,000 holders and sites (a user who
//! asked for many; a 64 MB dump, the largest worth opening in a browser). Measured apart, as the
//! CLI does them one after the other: reading the dump file's bytes into the dump model
//! (`parse`), and the page from the parsed dump (`render`: the report model, the page's JSON
//! payload and the page itself). Goal: each within 1 s, as the dump itself.
//!
//! `cargo bench -p oomshim-benches --bench report_html`

use criterion::{criterion_group, criterion_main, Criterion};
use oomshim_benches::{stack_pool, ALLOCATIONS, STACKS};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let pool = stack_pool();
    let name = Path::new("bench-dump.json");
    let mut g = c.benchmark_group("report_html");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for top in [20usize, 1_000] {
        let bytes =
            oomshim::shim::bench_support::synthetic(ALLOCATIONS, STACKS, &pool, top).dump_json();
        let dump = dump::read::parse_dump(&bytes, name).expect("the shim's own dump parses");
        let page = oomshim_cli::report::html::render_html(&dump);
        eprintln!(
            "top {top}: dump of {} bytes ({} holders, {} sites), page of {} bytes",
            bytes.len(),
            dump.largest_holders.len(),
            dump.sites.len(),
            page.len()
        );
        drop(page);
        g.bench_function(format!("parse_100k_allocs_10k_stacks_top_{top}"), |b| {
            b.iter(|| black_box(dump::read::parse_dump(black_box(&bytes), name).unwrap()))
        });
        g.bench_function(format!("render_100k_allocs_10k_stacks_top_{top}"), |b| {
            b.iter(|| black_box(oomshim_cli::report::html::render_html(black_box(&dump))))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
