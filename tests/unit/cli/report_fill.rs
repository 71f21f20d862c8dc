//! Unit tests of `oomshim_cli::report::fill` (src/cli/report/fill.rs): what fills the device.

use oomshim_cli::report::fill::device_fill;

#[test]
fn the_fill_of_the_failing_device_sums_to_its_total() {
    let dump = super::fixtures::load_fixture("oom_untracked");
    let fill = device_fill(&dump).unwrap();
    assert_eq!(fill.device, 1);
    assert!(!fill.by_kind);
    let sum: u64 = fill.rows.iter().map(|r| r.bytes).sum();
    assert_eq!(sum, fill.total_bytes);
    let keys: Vec<&str> = fill.rows.iter().map(|r| r.key).collect();
    assert_eq!(keys, ["this_process", "untracked", "free"]);
}

#[test]
fn the_fill_names_the_allocators_free_cache_apart() {
    let dump = super::fixtures::load_fixture("oom_fragmentation");
    let fill = device_fill(&dump).unwrap();
    let cache = fill
        .rows
        .iter()
        .find(|r| r.key == "framework_cache")
        .unwrap();
    assert_eq!(cache.bytes, dump.free_blocks.total_free_bytes.unwrap());
    let sum: u64 = fill.rows.iter().map(|r| r.bytes).sum();
    assert_eq!(sum, fill.total_bytes);
}
