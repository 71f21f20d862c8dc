//! The run-time recording switch (`oomshim_set_recording`): allocations made in one mode and
//! freed in another leave an exact ledger, totals and unknown-free count, whenever the switch
//! happens (tests/clients/recording_switch.c under `LD_PRELOAD`).

use crate::common;

use common::{only_dump, run_client};
use dump::model::Dump;
use std::process::Output;

const MIB: u64 = 1 << 20;

fn lines_after(o: &Output, key: &str) -> Vec<i64> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().parse().unwrap())
        .collect()
}

fn holder_functions(d: &Dump, bytes: u64) -> Vec<String> {
    let h = d
        .largest_holders
        .iter()
        .find(|h| h.bytes == bytes)
        .unwrap_or_else(|| panic!("no holder of {bytes} bytes in {:#?}", d.largest_holders));
    h.stack.iter().filter_map(|f| f.function.clone()).collect()
}

#[test]
fn allocations_freed_in_another_mode_leave_an_exact_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("OOMSHIM_DIR", dir.path().to_str().unwrap())];
    let out = run_client("recording_switch", &["sequence"], &env, true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Each switch returns the mode before it: all (the default), pass-through, totals, native.
    assert_eq!(lines_after(&out, "before "), [3, 0, 1, 2]);
    assert_eq!(lines_after(&out, "now "), [3]);
    let d = only_dump(dir.path());
    assert_eq!(d.reason, "switch-end");
    // Live and tracked: the buffers kept from all (1 MiB), totals (3 MiB) and native (4 MiB)
    // modes; the pass-through one (2 MiB) was never recorded. The buffers freed in a later mode
    // left the ledger, and the pass-through one freed in totals mode is no unknown free.
    assert_eq!(d.devices[0].tracked_bytes, 8 * MIB);
    assert_eq!(d.devices[0].tracked_count, 3);
    assert_eq!(d.recording.live_allocations, 3);
    assert_eq!(d.recording.unknown_frees, 0);
    // The peak never saw the 20 MiB passed through: 1 + 30 + 3 + 4, once the 10 MiB recorded in
    // all mode had left in pass-through mode.
    assert_eq!(d.devices[0].peak_tracked_bytes, 38 * MIB);
    let mut sizes: Vec<u64> = d.largest_holders.iter().map(|h| h.bytes).collect();
    sizes.sort();
    assert_eq!(sizes, [MIB, 3 * MIB, 4 * MIB]);
    // Stacks as the mode was when each buffer was made.
    assert!(holder_functions(&d, MIB)
        .iter()
        .any(|f| f == "alloc_in_all_mode"));
    assert!(holder_functions(&d, 4 * MIB)
        .iter()
        .any(|f| f == "alloc_in_native_mode"));
    assert!(holder_functions(&d, 3 * MIB).is_empty());
}

#[test]
fn switching_while_threads_allocate_loses_and_invents_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("OOMSHIM_DIR", dir.path().to_str().unwrap())];
    let out = run_client("recording_switch", &["stress"], &env, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = only_dump(dir.path());
    assert_eq!(d.reason, "stress-end");
    // Every allocation was freed, whichever modes it was made and freed in.
    let tracked: u64 = d.devices.iter().map(|d| d.tracked_bytes).sum();
    assert_eq!(tracked, 0);
    assert_eq!(d.recording.live_allocations, 0);
    assert_eq!(d.recording.unknown_frees, 0);
    assert!(d.recording.total_allocations > 0);
}

#[test]
fn an_unknown_mode_is_refused_and_changes_nothing() {
    let env = [("OOMSHIM_STACKS", "native")];
    let out = run_client("recording_switch", &["bad"], &env, true);
    assert!(out.status.success());
    assert_eq!(lines_after(&out, "bad "), [-1, -1]);
    // The mode OOMSHIM_STACKS started the shim in.
    assert_eq!(lines_after(&out, "now "), [2]);
}

/// The calls asking about the device (free/total, name) made while a cudaMalloc failed for lack
/// of memory in recording mode `mode`, and the dumps written.
fn device_queries_of_an_oom(mode: &str) -> (i64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let env = [("OOMSHIM_DIR", dir.path().to_str().unwrap())];
    let out = run_client("recording_switch", &["oom", mode], &env, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // cudaErrorMemoryAllocation reaches the program in every mode.
    assert_eq!(lines_after(&out, "rc "), [2]);
    let queries = lines_after(&out, "queries ");
    assert_eq!(queries.len(), 1);
    (queries[0], common::dumps(dir.path()).len())
}

#[test]
fn pass_through_asks_cuda_nothing_about_an_oom() {
    // Recording: the failure's context is asked on the failing thread (free/total at least),
    // and its dump written: the counter sees the shim's queries.
    let (queries, dumps) = device_queries_of_an_oom("3");
    assert!(queries >= 1, "{queries} queries while recording");
    assert_eq!(dumps, 1);
    // Pass-through drops the failure: nothing gathered for it, no dump.
    assert_eq!(device_queries_of_an_oom("0"), (0, 0));
}
