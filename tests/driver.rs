//! Driver coverage (issue #3): C clients that reach the simulated driver (`libcuda.so.1`,
//! tests/sim/cuda_driver_sim.c) the ways real programs do — static-cudart-shaped
//! `dlopen` + `dlsym` + `cuGetProcAddress_v2`, direct PLT calls, VMM, the stream-ordered
//! allocator, the runtime's `cudaGetDriverEntryPointByVersion`, and the runtime calling the
//! driver underneath `cudaMalloc` — run with and without `LD_PRELOAD=liboomshim.so`.

use crate::common;

use common::dumps;
use dump::model::{Dump, Frame};
use oomshim_cli::testbed;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// liboomshim.so, built up to date first (`cargo test` alone never builds the cdylib).
fn shim_lib() -> PathBuf {
    common::shim_lib()
}

fn run(name: &str, args: &[&str], env: &[(&str, &str)], with_shim: bool) -> Output {
    let mut cmd = Command::new(testbed::client(name));
    cmd.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("SIMCUDA_RUNTIME_VIA_DRIVER")
        .env("OOMSHIM_SETTLE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if with_shim {
        cmd.env("LD_PRELOAD", shim_lib());
    }
    common::wait_with_watchdog(cmd, Duration::from_secs(120))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a client bare and under the shim: same stdout, same exit code, nothing on the bare
/// stderr. Returns the shimmed run and its dumps (sorted by sequence).
fn both(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, Vec<Dump>) {
    let dir = tempfile::tempdir().unwrap();
    let mut env: Vec<(&str, &str)> = env.to_vec();
    let d = dir.path().to_str().unwrap().to_string();
    env.push(("OOMSHIM_DIR", &d));
    let bare = run(name, args, &env, false);
    let shim = run(name, args, &env, true);
    assert_eq!(
        stdout(&bare),
        stdout(&shim),
        "{name} {args:?}: output changed by the shim"
    );
    assert_eq!(
        bare.status.code(),
        shim.status.code(),
        "{name} {args:?}: exit code changed"
    );
    assert_eq!(
        stderr(&bare),
        "",
        "{name} {args:?}: bare run wrote to stderr"
    );
    (shim, dumps(dir.path()))
}

fn dump<'a>(dumps: &'a [Dump], reason: &str) -> &'a Dump {
    dumps
        .iter()
        .find(|d| d.reason == reason)
        .unwrap_or_else(|| {
            panic!(
                "no dump with reason {reason}: {:?}",
                dumps.iter().map(|d| &d.reason).collect::<Vec<_>>()
            )
        })
}

fn names(stack: &[Frame]) -> Vec<&str> {
    stack.iter().filter_map(|f| f.function.as_deref()).collect()
}

fn has_frame(stack: &[Frame], function: &str) -> bool {
    names(stack).contains(&function)
}

fn device0(d: &Dump) -> (u64, u64) {
    let dev = d
        .devices
        .iter()
        .find(|x| x.index == 0)
        .expect("device 0 in dump");
    (dev.tracked_bytes, dev.tracked_count)
}

/// An OOM dump: the failing API and function, every holder from `site` with `api`, and the
/// device's untracked bytes (total − free − tracked) equal to the simulated context.
fn assert_oom(d: &Dump, api: &str, site: &str, holders: u64, holder_bytes: u64) {
    assert_eq!(d.reason, "oom");
    let req = d.failed_request.as_ref().expect("failed_request");
    assert_eq!(req.api, api);
    assert_eq!(req.error_code, 2);
    assert!(
        has_frame(&req.stack, site),
        "failing stack {:?} lacks {site}",
        names(&req.stack)
    );
    let (tracked, count) = device0(d);
    assert_eq!(count, holders);
    assert_eq!(tracked, holders * holder_bytes);
    for h in &d.largest_holders {
        assert_eq!(h.api, api);
        assert!(
            has_frame(&h.stack, site),
            "holder stack {:?} lacks {site}",
            names(&h.stack)
        );
    }
    let dev = &d.devices[0];
    let untracked = dev.total_bytes.unwrap() - dev.free_bytes.unwrap() - tracked;
    assert_eq!(
        untracked,
        256 * MIB,
        "only the simulated context is untracked"
    );
    assert_eq!(d.recording.oom_failures, 1);
}

#[test]
fn a_static_runtime_shaped_program_is_seen_through_dlsym_and_cu_get_proc_address() {
    let (shim, dumps) = both("drv_static", &["leak"], &[]);
    assert_eq!(stdout(&shim), "leaked 7 GiB, then rc=2\n");
    assert_eq!(dumps.len(), 1);
    assert_oom(&dumps[0], "cuMemAlloc", "leak_one_gib", 7, GIB);
    assert!(
        stderr(&shim).contains("cuMemAlloc of 1.00 GiB failed"),
        "{}",
        stderr(&shim)
    );
}

#[test]
fn allocations_and_frees_through_resolved_pointers_are_recorded() {
    let (_, dumps) = both("drv_static", &["hold"], &[]);
    let held = dump(&dumps, "hold");
    assert_eq!(device0(held), (300 * MIB, 3));
    assert!(held
        .largest_holders
        .iter()
        .all(|h| h.api == "cuMemAlloc" && has_frame(&h.stack, "hold_three")));
    assert_eq!(device0(dump(&dumps, "released")), (0, 0));
    assert_eq!(dump(&dumps, "released").recording.unknown_frees, 0);
}

#[test]
fn lookups_the_shim_does_not_track_and_rtld_next_are_unchanged() {
    let (shim, _) = both("drv_static", &["lookups"], &[]);
    let out = stdout(&shim);
    for line in [
        "dlsym missing: null",
        "getproc missing: rc=500 status=1 pfn=null",
        "getproc too old: rc=500 status=2",
        "getproc NULL status: rc=0",
        "cuMemAlloc@13000 == dlsym cuMemAlloc_v2: 1",
        "cuMemAlloc@3000 == dlsym cuMemAlloc: 1",
        "cuMemAlloc@3000 != cuMemAlloc@13000: 1",
        "cuGetProcAddress@13000 == dlsym cuGetProcAddress_v2: 1",
        "ptsz cuMemAllocAsync == dlsym _ptsz: 1",
        "ptsz != legacy: 1",
        "legacy alloc: rc=0",
        "cuDeviceGetCount: rc=0 count=1",
        // RTLD_NEXT is relative to the caller: from the helper library nothing follows it;
        // had the shim's dlsym made itself the caller, the helper's own symbol would be found.
        "RTLD_NEXT from helper: null",
        "RTLD_NEXT from main: 42",
        "RTLD_DEFAULT: 42",
        "RTLD_DEFAULT missing: null",
        "RTLD_NEXT malloc: libc.so.6",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "missing `{line}` in:\n{out}"
        );
    }
}

#[test]
fn resolvers_hand_out_wrappers_by_pointer_identity_only() {
    let out = stdout(&run("drv_static", &["where"], &[], true));
    let want = [
        ("dlsym cuMemAlloc_v2", "liboomshim.so"),
        ("dlsym cuGetProcAddress_v2", "liboomshim.so"),
        ("dlsym cuDeviceGetCount", "libcuda.so.1"),
        ("getproc cuMemAlloc@13000", "liboomshim.so"),
        // The legacy 32-bit cuMemAlloc is another function: never swapped for cuMemAlloc_v2's wrapper.
        ("getproc cuMemAlloc@3000", "libcuda.so.1"),
        ("getproc cuMemCreate", "liboomshim.so"),
        ("getproc cuGetProcAddress", "liboomshim.so"),
        ("getproc cuGetProcAddress@11030", "liboomshim.so"),
        ("getproc cuMemFreeAsync ptsz", "liboomshim.so"),
        ("getproc cuMemGetInfo", "libcuda.so.1"),
    ];
    for (what, module) in want {
        let line = format!("{what}: {module}");
        assert!(
            out.lines().any(|l| l == line),
            "missing `{line}` in:\n{out}"
        );
    }
    let bare = stdout(&run("drv_static", &["where"], &[], false));
    assert!(!bare.contains("liboomshim"), "{bare}");
}

#[test]
fn direct_driver_calls_are_recorded_with_pinned_memory_apart() {
    let (_, dumps) = both("drv_plt", &["roundtrip"], &[]);
    let d = dump(&dumps, "allocated");
    let pitch_bytes = 1024 * 1000;
    assert_eq!(device0(d), (64 * MIB + pitch_bytes + 32 * MIB, 3));
    let mut apis: Vec<&str> = d.largest_holders.iter().map(|h| h.api.as_str()).collect();
    apis.sort();
    assert_eq!(apis, ["cuMemAlloc", "cuMemAllocManaged", "cuMemAllocPitch"]);
    assert!(d
        .largest_holders
        .iter()
        .all(|h| has_frame(&h.stack, "allocate_everything")));
    assert_eq!((d.pinned_host.bytes, d.pinned_host.count), (3 * MIB, 2));
    let freed = dump(&dumps, "freed");
    assert_eq!(device0(freed), (0, 0));
    assert_eq!((freed.pinned_host.bytes, freed.pinned_host.count), (0, 0));
    assert_eq!(
        freed.recording.unknown_frees, 1,
        "the double free is counted"
    );
}

#[test]
fn driver_out_of_memory_through_the_plt_writes_the_dump() {
    let (shim, dumps) = both("drv_plt", &["leak"], &[]);
    assert_eq!(stdout(&shim), "leaked 15 x 512 MiB, then rc=2\n");
    assert_eq!(dumps.len(), 1);
    assert_oom(
        &dumps[0],
        "cuMemAlloc",
        "leak_through_driver",
        15,
        512 * MIB,
    );
}

fn check_vmm(mode: &str) {
    let (shim, dumps) = both("drv_vmm", &[mode], &[]);
    assert!(stdout(&shim).contains("release a while mapped: rc=0"));
    let mapped = dump(&dumps, "mapped");
    assert_eq!(device0(mapped), (96 * MIB, 2));
    assert!(mapped
        .largest_holders
        .iter()
        .filter(|h| h.device == 0)
        .all(|h| h.api == "cuMemCreate" && has_frame(&h.stack, "create_physical")));
    assert_eq!(
        (mapped.pinned_host.bytes, mapped.pinned_host.count),
        (2 * MIB, 1),
        "host-located handle"
    );
    // The layout: one reserved range with both handles mapped into it.
    let vmm = mapped.vmm.as_ref().expect("vmm key");
    assert_eq!((vmm.reserved_ranges, vmm.reserved_bytes), (1, 256 * MIB));
    assert_eq!(
        (vmm.mappings, vmm.mapped_bytes, vmm.released_but_mapped),
        (2, 96 * MIB, 0)
    );
    assert_eq!(vmm.ranges.len(), 1);
    assert_eq!(
        (
            vmm.ranges[0].reserved_bytes,
            vmm.ranges[0].mapped_bytes,
            vmm.ranges[0].mappings
        ),
        (256 * MIB, 96 * MIB, 2)
    );
    // Released while mapped: the memory stays held until the last unmap, as in the driver.
    let released = dump(&dumps, "released-mapped");
    assert_eq!(device0(released), (96 * MIB, 2));
    assert_eq!(released.vmm.as_ref().unwrap().released_but_mapped, 1);
    let unmapped = dump(&dumps, "unmapped-a");
    assert_eq!(device0(unmapped), (32 * MIB, 1));
    let vmm = unmapped.vmm.as_ref().unwrap();
    assert_eq!(
        (vmm.mappings, vmm.mapped_bytes, vmm.released_but_mapped),
        (1, 32 * MIB, 0)
    );
    let end = dump(&dumps, "end");
    assert_eq!(device0(end), (0, 0));
    assert_eq!(end.pinned_host.count, 0);
    assert_eq!(end.recording.total_allocations, 3);
    assert!(end.vmm.is_none(), "nothing reserved or mapped any more");
}

#[test]
fn vmm_physical_memory_is_held_until_released_and_unmapped() {
    check_vmm("plt");
}

#[test]
fn vmm_functions_from_cuda_get_driver_entry_point_by_version_are_tracked() {
    // PyTorch's expandable segments get cuMemCreate/cuMemMap/… this way.
    check_vmm("runtime");
}

#[test]
fn vmm_out_of_memory_writes_the_dump() {
    let (shim, dumps) = both("drv_vmm", &["oom"], &[]);
    assert_eq!(stdout(&shim), "created 7 x 1 GiB, then rc=2\n");
    assert_eq!(dumps.len(), 1);
    assert_oom(&dumps[0], "cuMemCreate", "grow_segment", 7, GIB);
}

#[test]
fn stream_ordered_driver_allocations_are_recorded() {
    let (shim, dumps) = both("drv_pool", &["roundtrip"], &[]);
    assert!(stdout(&shim).contains("free: rc=0 0 0"));
    let d = dump(&dumps, "pool-allocated");
    assert_eq!(device0(d), (88 * MIB, 3));
    let mut apis: Vec<&str> = d.largest_holders.iter().map(|h| h.api.as_str()).collect();
    apis.sort();
    assert_eq!(
        apis,
        [
            "cuMemAllocAsync",
            "cuMemAllocAsync",
            "cuMemAllocFromPoolAsync"
        ]
    );
    assert!(d
        .largest_holders
        .iter()
        .all(|h| has_frame(&h.stack, "pool_work")));
    let freed = dump(&dumps, "pool-freed");
    assert_eq!(device0(freed), (0, 0));
    // The freed bytes stay reserved by the pool: the dump names them as its cache.
    assert_eq!(freed.pools.len(), 1, "{:?}", freed.pools);
    let p = &freed.pools[0];
    assert_eq!(
        (p.device, p.reserved_bytes, p.used_bytes, p.cached_bytes),
        (0, 88 * MIB, 0, 88 * MIB)
    );
    let held = &dump(&dumps, "pool-allocated").pools;
    assert_eq!(
        (held[0].reserved_bytes, held[0].used_bytes),
        (88 * MIB, 88 * MIB)
    );
}

#[test]
fn pool_cache_at_out_of_memory_is_reported() {
    // A settle window, so the on-demand dump after the failure is written while the OOM dump
    // still waits: each must keep its own pool snapshot.
    let (shim, dumps) = both("drv_pool", &["cache"], &[("OOMSHIM_SETTLE", "1s")]);
    assert!(
        stdout(&shim).ends_with("leaked 11 x 512 MiB, then rc=2\n"),
        "{}",
        stdout(&shim)
    );
    assert_eq!(dumps.len(), 2);
    assert_eq!(dump(&dumps, "after-oom").pools.len(), 1);
    let d = dump(&dumps, "oom");
    assert_eq!(d.failed_request.as_ref().unwrap().api, "cuMemAlloc");
    assert_eq!(device0(d), (11 * 512 * MIB, 11));
    assert_eq!(d.pools.len(), 1, "{:?}", d.pools);
    assert_eq!(d.pools[0].cached_bytes, 2 * GIB);
    let dev = &d.devices[0];
    let untracked =
        dev.total_bytes.unwrap() - dev.free_bytes.unwrap() - device0(d).0 - d.pools[0].cached_bytes;
    assert_eq!(untracked, 256 * MIB, "only the context is left unexplained");
}

#[test]
fn programs_without_stream_ordered_allocations_get_no_pools_key() {
    let (_, dumps) = both("drv_plt", &["leak"], &[]);
    assert!(dumps[0].pools.is_empty());
}

#[test]
fn stream_ordered_out_of_memory_writes_the_dump() {
    let (_, dumps) = both("drv_pool", &["leak"], &[]);
    assert_eq!(dumps.len(), 1);
    let d = &dumps[0];
    assert_eq!(d.failed_request.as_ref().unwrap().api, "cuMemAllocAsync");
    assert!(has_frame(
        &d.failed_request.as_ref().unwrap().stack,
        "pool_leak"
    ));
    assert_eq!(device0(d), (31 * 256 * MIB, 31));
}

#[test]
fn cuda_malloc_served_by_the_driver_is_recorded_exactly_once() {
    let env = [("SIMCUDA_RUNTIME_VIA_DRIVER", "1")];
    let (_, dumps) = both("drv_once", &["hold"], &env);
    let d = dump(&dumps, "once");
    assert_eq!(device0(d), (192 * MIB, 3));
    assert_eq!(
        d.recording.total_allocations, 3,
        "one record per cudaMalloc, none for its cuMemAlloc_v2"
    );
    for h in &d.largest_holders {
        assert_eq!(h.api, "cudaMalloc");
        assert!(
            has_frame(&h.stack, "hold_via_runtime"),
            "{:?}",
            names(&h.stack)
        );
    }
    assert_eq!(device0(dump(&dumps, "once-freed")), (0, 0));
    assert_eq!(dump(&dumps, "once-freed").recording.unknown_frees, 0);
}

#[test]
fn cuda_malloc_out_of_memory_through_the_driver_is_one_failure() {
    let env = [("SIMCUDA_RUNTIME_VIA_DRIVER", "1")];
    let (_, dumps) = both("drv_once", &["leak"], &env);
    assert_eq!(dumps.len(), 1);
    assert_oom(&dumps[0], "cudaMalloc", "leak_via_runtime", 7, GIB);
    assert_eq!(dumps[0].recording.total_allocations, 7);
}

#[test]
fn a_wrapper_without_a_driver_returns_not_initialized_and_says_so_once() {
    let out = run("drv_static", &["nodriver"], &[], true);
    assert_eq!(stdout(&out), "first: rc=3\nsecond: rc=3\n");
    let err = stderr(&out);
    assert_eq!(
        err.matches("the real cuMemAlloc_v2 was not found").count(),
        1,
        "{err}"
    );
    assert_eq!(
        stdout(&run("drv_static", &["nodriver"], &[], false)),
        "no cuMemAlloc_v2\n"
    );
}

#[test]
fn the_driver_table_is_the_single_source_of_the_exports() {
    let names = oomshim::ffi::driver_exported_names();
    for n in [
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemFreeAsync",
        "cuMemFreeAsync_ptsz",
        "cuMemAllocHost_v2",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuGetProcAddress_v2_ptsz",
    ] {
        assert!(names.contains(&n), "{n} missing from the table");
    }
}

/// Issue 17: two devices failing close together, then asking for on-demand dumps at the same
/// moment. Each dump carries what its own thread learnt of its own device (pools, free/total,
/// UUID): nothing is lost or swapped between them. The simulated driver holds each thread inside
/// cuMemGetInfo for a while, so the two dumps are gathered at once: with one process-wide slot
/// for an on-demand dump's pools (as the shim once had) the first dump took the second's pools and
/// the second none.
#[test]
fn two_devices_failing_together_keep_their_own_context() {
    let env = [
        ("SIMCUDA_DEVICES", "2"),
        ("SIMCUDA_MEMINFO_DELAY_MS", "300"),
        // Both failures wait for the writer thread together.
        ("OOMSHIM_SETTLE", "1s"),
    ];
    let (shim, dumps) = both("drv_two_devices", &[], &env);
    assert_eq!(
        stdout(&shim),
        "device 0: leaked 13 x 512 MiB, then rc=2\ndevice 1: leaked 7 x 768 MiB, then rc=2\n"
    );
    assert_eq!(dumps.len(), 4, "two failures and two on-demand dumps");
    // Per device: chunk, chunks leaked, free bytes left, bytes its pool keeps cached.
    let expected = [
        (0, 512 * MIB, 13, 256 * MIB, GIB),
        (1, 768 * MIB, 7, 512 * MIB, 2 * GIB),
    ];
    let uuid = |d: i32| format!("GPU-5e1d{d:02x}13-1415-1617-1819-1a1b1c1d1e1f");
    for (device, chunk, leaked, free, cached) in expected {
        let oom = dumps
            .iter()
            .find(|d| {
                d.failed_request
                    .as_ref()
                    .is_some_and(|r| r.device == device)
            })
            .unwrap_or_else(|| panic!("no OOM dump of device {device}"));
        let req = oom.failed_request.as_ref().unwrap();
        assert_eq!((req.api.as_str(), req.bytes), ("cuMemAlloc", chunk));
        assert!(has_frame(&req.stack, "leak_on_device"));
        let on_demand = dump(&dumps, &format!("device-{device}"));
        for d in [oom, on_demand] {
            let what = format!("device {device}, dump {}", d.reason);
            assert_eq!(d.pools.len(), 1, "{what}: {:?}", d.pools);
            let p = &d.pools[0];
            assert_eq!(
                (p.device, p.reserved_bytes, p.used_bytes, p.cached_bytes),
                (device, cached, 0, cached),
                "{what}"
            );
            assert_eq!(
                p.pool,
                format!("{:#x}", 0x4d00_0000_1000u64 + device as u64 * 0x1000)
            );
            let own = d.devices.iter().find(|x| x.index == device).unwrap();
            assert_eq!(
                (own.free_bytes, own.total_bytes),
                (Some(free), Some(8 * GIB)),
                "{what}"
            );
            assert_eq!(own.uuid.as_deref(), Some(uuid(device).as_str()), "{what}");
            assert_eq!(
                own.name.as_deref(),
                Some("oomshim simulated driver device"),
                "{what}"
            );
            assert_eq!(
                (own.tracked_bytes, own.tracked_count),
                (leaked * chunk, leaked),
                "{what}"
            );
            // All that the tracked bytes and the pool's cache leave unexplained is the context.
            assert_eq!(
                8 * GIB - free - leaked * chunk - cached,
                256 * MIB,
                "{what}"
            );
            // The other device is in the dump by its ledger figures alone: no answers of the
            // other thread's CUDA calls.
            let other = d.devices.iter().find(|x| x.index == 1 - device).unwrap();
            assert_eq!(
                (other.free_bytes, other.total_bytes),
                (None, None),
                "{what}"
            );
        }
    }
}
