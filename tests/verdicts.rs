//! Verdicts reproduced against the simulated CUDA, asserting the ranked findings and their
//! numbers: a leak with step marks and with steps detected automatically (`leak`, with the
//! growth history), another process holding memory (`other_processes`, through a simulated NVML),
//! a request larger than the device (`request_exceeds_device`), fragmentation with dynamic shapes
//! and the framework's cache (free blocks from an allocator source, fed to `oomshim report`), host
//! pressure, and the configuration snapshot (allowlisted variables only).

use crate::common;

use common::{only_dump, run_client, shim_lib, wait_with_watchdog};
use dump::model::Dump;
use dump::read::read_dump;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn only_dump_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1, "expected one dump: {files:?}");
    files[0].clone()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const GIB: u64 = 1 << 30;

fn kinds(dump: &Dump) -> Vec<&str> {
    dump.verdict
        .findings
        .iter()
        .map(|f| f.kind.as_str())
        .collect()
}

/// The two-line stderr summary of an out-of-memory failure: (line 1, line 2).
fn summary_lines(err: &str) -> (String, String) {
    let lines: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("oomshim: CUDA out of memory"))
        .collect();
    assert!(lines.len() >= 2, "no summary in stderr:\n{err}");
    assert!(
        lines[1].starts_with("oomshim:   dump: ") && lines[1].contains("(details: oomshim report "),
        "{err}"
    );
    assert!(
        lines.get(2).is_none_or(|l| !l.starts_with("oomshim:   ")),
        "two lines only:\n{err}"
    );
    (lines[0].to_string(), lines[1].to_string())
}

/// Line 1 of the stderr summary is the failed request and the dump's top finding, in the
/// verdict's own words (their wording is tested on the dump, not on stderr).
fn assert_line1_is_top_finding(line1: &str, failed: &str, dump: &Dump) {
    let top = &dump.verdict.findings[0];
    assert_eq!(
        line1,
        format!(
            "oomshim: CUDA out of memory on device 0 ({failed}): {}: {}",
            top.kind, top.headline
        )
    );
}

/// `oomshim report --json` of `dump` (written to a file first).
fn report_json(dir: &Path, dump: &Dump) -> serde_json::Value {
    let path = dir.join("edited.json");
    std::fs::write(&path, serde_json::to_vec_pretty(dump).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .args(["report", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn report_text(path: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .arg("report")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn a_leak_with_step_marks_is_named_with_bytes_per_step_and_projected_step() {
    let dir = tempfile::tempdir().unwrap();
    // 2 GiB less the 256 MiB context: 1792 MiB for the program. Step i keeps i × 96 MiB, so
    // keep_activations fails at step 19 (19 × 96 = 1824 MiB).
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let bare = run_client("steps_leak", &[], &env, false);
    let shim = run_client("steps_leak", &[], &env, true);
    assert_eq!(
        stdout(&bare),
        stdout(&shim),
        "program output changed by the shim"
    );
    assert!(
        stdout(&shim).contains("step 19: keep_activations failed with 2"),
        "{}",
        stdout(&shim)
    );

    let dump = only_dump(dir.path());
    let g = dump.growth.as_ref().expect("growth key");
    assert_eq!(g.unit, "step");
    assert_eq!(g.steps.as_deref(), Some("marked"));
    assert!(g.detected.is_none());
    assert_eq!(g.current, 19, "19 step marks");
    let site = &g.sites[0];
    assert_eq!(site.bytes_per_step, 96 * MIB, "exact bytes per step");
    assert!(site.r_squared > 0.999, "{}", site.r_squared);
    // Step 1's mark saw nothing live; from step 2 on the site holds (i - 1) × 96 MiB.
    assert_eq!((site.first.step, site.first.bytes), (2, 96 * MIB));
    assert_eq!((site.last.step, site.last.bytes), (19, 18 * 96 * MIB));
    assert_eq!(site.samples, 18);
    assert!(
        site.stack
            .iter()
            .any(|f| f.function.as_deref() == Some("keep_activations")),
        "{:?}",
        site.stack
    );
    // The transient allocations are freed before every mark: they never grow.
    assert!(!g.sites.iter().any(|s| s
        .stack
        .iter()
        .any(|f| f.function.as_deref() == Some("transient_work"))));
    // 64 MiB free at the failure, less than one step's growth: OOM projected in the step in
    // progress, the one after the last mark.
    assert_eq!(g.free_bytes, Some(64 * MIB));
    assert_eq!(site.projected_oom_step, Some(20));
    assert_eq!(g.projected_oom_step, Some(20));

    let v = &dump.verdict;
    assert_eq!(v.kind, "leak", "{}", v.summary);
    for needle in [
        "keep_activations (",
        "steps_leak.c:",
        "grows by 96.00 MiB every step",
        // The process's own samples start at mark 1 (nothing live yet).
        "19 marked steps observed, from 0 B at step 1",
        "runs out at step 20",
    ] {
        assert!(v.summary.contains(needle), "{needle}: {}", v.summary);
    }
    // A C program: C's advice.
    assert!(v
        .suggestions
        .iter()
        .any(|s| s.starts_with("Free what keep_activations (")));
    assert!(v
        .evidence
        .iter()
        .any(|e| e.contains("adds 96.00 MiB per step")));
    // One finding: the leak, with the bytes the process grew over its samples (marks 1 to 19).
    assert_eq!(kinds(&dump), ["leak"]);
    assert_eq!(v.findings[0].bytes, 18 * 96 * MIB);
    // The terminal's first line is the dump's top finding (its wording is the verdict's, tested
    // above and beside the rules), for the request that failed.
    let f = &v.findings[0];
    let (line1, _) = summary_lines(&stderr(&shim));
    assert_eq!(
        line1,
        format!(
            "oomshim: CUDA out of memory on device 0 (cudaMalloc of 96.00 MiB failed): {}: {}",
            f.kind, f.headline
        )
    );
    assert!(
        f.headline.starts_with("keep_activations (steps_leak.c:")
            && f.headline.ends_with("free memory runs out at step 20"),
        "{}",
        f.headline
    );
}

/// A C program that only allocates (no marks, no repeating step): its growth is judged over
/// time, per second, and the OOM verdict is a leak named at the line that allocates: such a
/// program has no step for growth to be measured by.
#[test]
fn a_program_that_only_allocates_is_judged_a_leak_over_time() {
    let dir = tempfile::tempdir().unwrap();
    // 3 GiB less the 256 MiB context: 2816 MiB, 48 MiB every 100 ms: about 6 s of growth.
    let env = [
        ("SIMCUDA_CAPACITY", "3G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let shim = run_client("grow_only", &[], &env, true);
    assert!(
        stdout(&shim).contains("failed after 58 chunks with 2"),
        "{}",
        stdout(&shim)
    );
    let dump = only_dump(dir.path());
    let g = dump.growth.as_ref().expect("growth key");
    assert_eq!(g.unit, "second");
    // Fitted from the live allocations' own times, not from one-second samples, which a
    // program younger than two seconds lacks.
    assert_eq!(g.steps.as_deref(), Some("timeline"));
    let fit = g.fit.as_ref().expect("a fit of the growth over time");
    // 480 MiB a second when each nap is 100 ms; a loaded runner naps longer.
    assert!(
        (100 * MIB..=500 * MIB).contains(&fit.bytes_per_step) && fit.r_squared >= 0.9,
        "{fit:?}"
    );
    let v = &dump.verdict;
    assert_eq!(v.kind, "leak", "{}", v.summary);
    let f = &v.findings[0];
    assert!(
        f.headline.starts_with("grow_forever (grow_only.c:")
            && f.headline
                .contains(" every second (steadily over its last "),
        "{}",
        f.headline
    );
    assert!(
        f.summary
            .contains("The program marks no steps and no repeating step was found"),
        "{}",
        f.summary
    );
    assert!(v.suggestions.iter().any(|s| s.contains("oomshim_step()")));
    common::assert_single_spaced(&serde_json::to_value(&dump).unwrap(), "grow_only");
    let (line1, _) = summary_lines(&stderr(&shim));
    assert_line1_is_top_finding(&line1, "cudaMalloc of 48.00 MiB failed", &dump);
}

/// A program that keeps stepping after its first failure (C programs that ignore errors do):
/// its dump's growth is the history up to that failure, so the leak is still a leak (the steps after it
/// grow nothing and would dilute the rate).
#[test]
fn growth_evidence_stops_at_the_first_failure() {
    let dir = tempfile::tempdir().unwrap();
    // 2 GiB less the 256 MiB context: 1792 MiB; step i keeps i × 96 MiB: step 19 fails, and
    // 200 steps more follow (each failing), far more than a growth ring holds.
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let shim = run_client("grow_only", &["keep-going"], &env, true);
    let out = stdout(&shim);
    assert!(
        out.contains("first failure at step 19") && out.contains("stepped 218"),
        "{out}"
    );
    let mut all = common::dumps(dir.path());
    all.sort_by_key(|d| d.time_unix_ms);
    let dump = all.first().expect("a dump of the first failure");
    let g = dump.growth.as_ref().expect("growth key");
    assert_eq!(g.steps.as_deref(), Some("marked"));
    assert_eq!(
        g.current, 19,
        "the growth as it was at the failure, in step 19"
    );
    let v = &dump.verdict;
    assert_eq!(v.kind, "leak", "{}", v.summary);
    assert!(
        v.findings[0]
            .headline
            .starts_with("keep_activations (grow_only.c:")
            && v.findings[0]
                .headline
                .contains("grows by 96.00 MiB every step"),
        "{}",
        v.findings[0].headline
    );
}

#[test]
fn steps_are_detected_without_marks_and_the_leak_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // 2 GiB less the 256 MiB context: 1792 MiB. Step i keeps i × 64 MiB and works in 32 MiB:
    // step 28 needs 28 × 64 + 32 = 1824 MiB, so transient_work fails there.
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let bare = run_client("verdict_autosteps", &[], &env, false);
    let shim = run_client("verdict_autosteps", &[], &env, true);
    assert_eq!(stdout(&bare), stdout(&shim), "program output changed");
    assert!(
        stdout(&shim).contains("step 28: transient_work failed with 2"),
        "{}",
        stdout(&shim)
    );
    let dump = only_dump(dir.path());
    let g = dump.growth.as_ref().expect("growth key");
    assert_eq!(g.unit, "step");
    assert_eq!(g.steps.as_deref(), Some("detected"));
    let d = g.detected.as_ref().expect("detected");
    assert_eq!(d.period, 2, "keep + transient per step");
    // The anchor keep_activations recurs at steps 1..28: gaps from step 2 on; four equal gaps
    // (steps 2-5) confirm it at step 5, which is detected step 1; step 28 is detected step 24.
    assert_eq!(d.steps, 24);
    assert_eq!(
        d.freeing_intervals, d.intervals,
        "every step frees its working memory"
    );
    assert!(d.intervals >= 20, "{d:?}");
    assert!(
        d.anchor
            .iter()
            .any(|f| f.function.as_deref() == Some("keep_activations")),
        "{:?}",
        d.anchor
    );
    let site = &g.sites[0];
    assert_eq!(site.bytes_per_step, 64 * MIB, "exact bytes per step");
    assert!(site
        .stack
        .iter()
        .any(|f| f.function.as_deref() == Some("keep_activations")));
    // Sampled at detected steps 1..24 (at the anchor, so the step's own 64 MiB is counted):
    // step 5 holds 5 × 64 MiB, step 28 holds 28 × 64 MiB.
    assert_eq!((site.first.step, site.first.bytes), (1, 5 * 64 * MIB));
    assert_eq!((site.last.step, site.last.bytes), (24, 28 * 64 * MIB));

    assert_eq!(kinds(&dump), ["leak"], "{:#?}", dump.verdict);
    let f = &dump.verdict.findings[0];
    assert_eq!(
        f.bytes,
        23 * 64 * MIB,
        "grown from the first to the last sample"
    );
    assert!(
        f.headline
            .starts_with("keep_activations (verdict_autosteps.c:")
            && f.headline.contains(
                "grows by 64.00 MiB every step (over the last 24 detected steps; 1.44 GiB so far"
            ),
        "{}",
        f.headline
    );
    assert!(
        f.summary.contains("Steps were detected automatically"),
        "{}",
        f.summary
    );
    // A C program: C's advice and C's way to mark steps, not PyTorch's.
    assert!(f.suggestions.iter().any(|s| s.contains("oomshim_step()")));
    assert!(f
        .suggestions
        .iter()
        .any(|s| s.starts_with("Free what keep_activations (")));
    assert!(!f.suggestions.iter().any(|s| s.contains("loss.item()")));
    let (line1, line2) = summary_lines(&stderr(&shim));
    assert_line1_is_top_finding(&line1, "cudaMalloc of 32.00 MiB failed", &dump);
    assert!(line2.contains(dir.path().to_str().unwrap()), "{line2}");
}

#[test]
fn the_same_leak_without_step_marks_is_own_allocations() {
    // The loop runs far under a second: its growth over time is too young to be a leak, and
    // one site allocating back to back is not a step (no working memory is freed).
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let out = run_client("leak_until_oom", &[], &env, true);
    assert!(out.status.success());
    let dump = only_dump(dir.path());
    assert_eq!(
        dump.growth.as_ref().and_then(|g| g.steps.as_deref()),
        Some("timeline")
    );
    assert_eq!(dump.verdict.kind, "own_allocations");
    assert_eq!(kinds(&dump), ["own_allocations"]);
    let tracked = dump.devices[0].tracked_bytes;
    assert_eq!(dump.verdict.findings[0].bytes, tracked);
    let f = &dump.verdict.findings[0];
    assert!(
        f.headline.starts_with(&format!(
            "this process's own allocations fill device 0: {} of the",
            dump::units::human_bytes(tracked)
        )) && f
            .headline
            .contains("at leaky_cache_grow (leak_until_oom.c:"),
        "{}",
        f.headline
    );
    let (line1, _) = summary_lines(&stderr(&out));
    let req = dump.failed_request.as_ref().unwrap();
    let failed = format!(
        "{} of {} failed",
        req.api,
        dump::units::human_bytes(req.bytes)
    );
    assert_line1_is_top_finding(&line1, &failed, &dump);
}

#[test]
fn another_process_holding_memory_is_the_top_finding() {
    let dir = tempfile::tempdir().unwrap();
    let lib = tempfile::tempdir().unwrap();
    common::build_fake_nvml(lib.path());
    // The "other process": a sibling of the program, owned by the same user.
    let mut other = Command::new("sleep").arg("120").spawn().unwrap();
    let other_bytes = 5 * GIB;
    let processes = format!("{}:{other_bytes}", other.id());
    let env = [
        ("SIMCUDA_CAPACITY", "8G"),
        ("SIMCUDA_OTHER_PROCESS_BYTES", "5G"),
        ("SIMNVML_PROCESSES", processes.as_str()),
        ("LD_LIBRARY_PATH", lib.path().to_str().unwrap()),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let shim = run_client("steps_leak", &[], &env, true);
    other.kill().ok();
    other.wait().ok();
    // 8 GiB - 5 GiB - 256 MiB context = 2816 MiB: step 29 needs 29 × 96 = 2784 MiB plus 32 MiB of
    // working memory, which fits exactly; step 30's 96 MiB does not.
    assert!(
        stdout(&shim).contains("step 30: keep_activations failed with 2"),
        "{}",
        stdout(&shim)
    );
    let dump = only_dump(dir.path());
    let g = dump.gpu_processes.as_ref().expect("gpu_processes");
    assert_eq!(g.error, None, "the simulated NVML answered");
    assert_eq!(g.processes.len(), 1);
    assert_eq!(g.processes[0].used_bytes, Some(other_bytes));
    assert_eq!(g.processes[0].name.as_deref(), Some("sleep"));

    // Ranked: the other process's 5 GiB, then the leak's growth (samples at marks 2..30 hold
    // 1..29 × 96 MiB: 28 × 96 MiB grown, and one more step's 96 MiB kept before the failure).
    // The untracked rest (the 256 MiB context) is too small to be a finding, and the leak
    // accounts for this process's own memory.
    assert_eq!(
        kinds(&dump),
        ["other_processes", "leak"],
        "{:#?}",
        dump.verdict
    );
    let bytes: Vec<u64> = dump.verdict.findings.iter().map(|f| f.bytes).collect();
    assert_eq!(bytes, [other_bytes, 29 * 96 * MIB]);
    assert_eq!(dump.verdict.kind, "other_processes");
    let top = &dump.verdict.findings[0];
    assert_eq!(
        top.headline,
        format!(
            "other processes hold 5.00 GiB on device 0; the largest is process {} (sleep, yours) with 5.00 GiB",
            other.id()
        )
    );
    assert!(top
        .suggestions
        .iter()
        .any(|s| s.contains(&format!("process {} (sleep) is yours", other.id()))));
    let leak = &dump.verdict.findings[1];
    assert!(
        leak.headline
            .contains("grows by 96.00 MiB every step (over the last 30 marked steps"),
        "{}",
        leak.headline
    );
    let (line1, _) = summary_lines(&stderr(&shim));
    assert!(
        line1.ends_with(&format!("): other_processes: {}", top.headline)),
        "{line1}"
    );
    // The report lists both, top first, with their bytes.
    let text = report_text(&only_dump_file(dir.path()));
    let a = text.find("1. other_processes (5.00 GiB)").expect(&text);
    let b = text.find("2. leak (2.72 GiB)").expect(&text);
    assert!(a < b);
}

#[test]
fn fragmentation_with_dynamic_shapes_and_the_framework_cache_from_allocator_free_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let out = run_client("verdict_autosteps", &["shapes"], &env, true);
    // 1792 MiB / 64 MiB = 28 blocks kept.
    assert_eq!(stdout(&out).trim(), "kept 28, failed with 2");
    let mut dump = only_dump(dir.path());
    // The request sizes the shim saw: 40 distinct working sizes, 28 kept blocks of 64 MiB.
    let sizes = dump.request_sizes.clone().expect("request_sizes");
    assert_eq!(sizes.window, 68);
    assert_eq!(
        sizes.distinct, 40,
        "64 MiB is one of the 40 working sizes (8 + 28 × 2)"
    );
    assert_eq!((sizes.large, sizes.distinct_large), (68, 40));
    assert_eq!(sizes.top[0].bytes, 64 * MIB);
    assert_eq!(sizes.top[0].count, 29);
    let bins: Vec<(u64, u64, u64)> = sizes
        .bins
        .iter()
        .map(|b| (b.lo, b.count, b.distinct))
        .collect();
    assert_eq!(
        bins,
        [
            (8 * MIB, 4, 4),
            (16 * MIB, 8, 8),
            (32 * MIB, 16, 16),
            (64 * MIB, 40, 12)
        ]
    );
    // Without free blocks, the shim's own verdict: its allocations fill the device.
    assert_eq!(kinds(&dump), ["own_allocations"]);

    // As oomshim's allocator would report its cache: 1 GiB free in blocks of at most 32 MiB,
    // for a 64 MiB request: fragmentation, named as dynamic shapes.
    dump.failed_request.as_mut().unwrap().bytes = 64 * MIB;
    dump.free_blocks = dump::model::FreeBlocks {
        source: "oomshim-allocator".into(),
        total_free_bytes: Some(GIB),
        largest_free_bytes: Some(32 * MIB),
        fragmentation: Some(1.0 - 32.0 / 1024.0),
        reserved_bytes: Some(2 * GIB),
        allocated_bytes: Some(GIB),
        inactive_split_bytes: Some(GIB),
        segments: Some(32),
        ..Default::default()
    };
    let v = report_json(dir.path(), &dump);
    let findings = v["verdict"]["findings"].as_array().unwrap();
    assert_eq!(v["verdict"]["kind"], "fragmentation");
    assert_eq!(findings[0]["kind"], "fragmentation");
    assert_eq!(findings[0]["bytes"], GIB);
    assert_eq!(findings[0]["rank"], 1);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let suggestions = findings[0]["suggestions"].as_array().unwrap();
    assert!(suggestions[0]
        .as_str()
        .unwrap()
        .starts_with("Pad or bucket"));
    assert!(suggestions
        .iter()
        .any(|s| s.as_str().unwrap().contains("expandable_segments:True")));
    assert!(findings[0]["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e == "dynamic shapes: 40 distinct sizes among the 68 requests of at least 1.00 MiB in the last 68 requests"));
    assert!(v["verdict"]["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e == "framework cache: 2.00 GiB reserved, 1.00 GiB allocated, 1.00 GiB reserved but unallocated (1.00 GiB inactive split)"));

    // The same cache, not fragmented (one 32 MiB block free, released with the device's free
    // memory it makes room): the framework's cache.
    dump.free_blocks.total_free_bytes = Some(48 * MIB);
    dump.free_blocks.largest_free_bytes = Some(32 * MIB);
    dump.free_blocks.inactive_split_bytes = Some(0);
    dump.devices[0].free_bytes = Some(16 * MIB);
    let v = report_json(dir.path(), &dump);
    let findings = v["verdict"]["findings"].as_array().unwrap();
    assert_eq!(findings[0]["kind"], "framework_cache", "{findings:#?}");
    assert_eq!(findings[0]["bytes"], 48 * MIB);
    assert!(findings[0]["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s.as_str().unwrap().contains("torch.cuda.empty_cache()")));
}

#[test]
fn host_pressure_is_a_finding_with_the_pinned_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    run_client("leak_until_oom", &[], &env, true);
    let mut dump = only_dump(dir.path());
    assert!(dump.host.is_some(), "host facts are read at dump time");
    // MemAvailable below the pinned bytes, as on a machine the pinned buffers exhausted.
    dump.pinned_host = dump::model::PinnedHost {
        bytes: 6 * GIB,
        count: 12,
        peak_bytes: 6 * GIB,
    };
    dump.host = Some(dump::model::HostMemory {
        total_bytes: Some(64 * GIB),
        available_bytes: Some(2 * GIB),
        cgroup_limit_bytes: None,
        cgroup_usage_bytes: None,
        rss_bytes: Some(8 * GIB),
    });
    let v = report_json(dir.path(), &dump);
    let findings = v["verdict"]["findings"].as_array().unwrap();
    let k: Vec<&str> = findings
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(k, ["host_memory", "own_allocations"], "{findings:#?}");
    assert_eq!(findings[0]["bytes"], 6 * GIB);
    assert_eq!(
        findings[0]["headline"],
        "host memory is low: 2.00 GiB available of 64.00 GiB (3.1%)"
    );
    // A cgroup at its limit says the same.
    dump.host = Some(dump::model::HostMemory {
        total_bytes: Some(64 * GIB),
        available_bytes: Some(40 * GIB),
        cgroup_limit_bytes: Some(8 * GIB),
        cgroup_usage_bytes: Some(8 * GIB - MIB),
        rss_bytes: None,
    });
    let v = report_json(dir.path(), &dump);
    assert_eq!(v["verdict"]["findings"][0]["kind"], "host_memory");
}

#[test]
fn a_request_larger_than_the_device_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let big = (3u64 << 30).to_string();
    let out = run_client("steps_leak", &["big", &big], &env, true);
    assert!(
        stdout(&out).contains("cudaMalloc returned 2"),
        "{}",
        stdout(&out)
    );
    let dump = only_dump(dir.path());
    assert_eq!(
        dump.verdict.kind, "request_exceeds_device",
        "{}",
        dump.verdict.summary
    );
    assert!(dump
        .verdict
        .summary
        .contains("3.00 GiB was asked of device 0, which has 1.00 GiB in total"));
    assert_eq!(kinds(&dump), ["request_exceeds_device"]);
    assert_eq!(dump.verdict.findings[0].bytes, 3 << 30);
    assert_eq!(
        dump.verdict.findings[0].headline,
        "a single request of 3.00 GiB at main (steps_leak.c:46) is larger than device 0 (1.00 GiB in total)"
    );
    let (line1, _) = summary_lines(&stderr(&out));
    assert_line1_is_top_finding(&line1, "cudaMalloc of 3.00 GiB failed", &dump);
}

#[test]
fn the_config_snapshot_keeps_allowlisted_variables_only() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("CUDA_VISIBLE_DEVICES", "0"),
        ("MY_SECRET_TOKEN", "x"),
        ("SOME_API_KEY", "do-not-copy-4b7e1c"),
    ];
    let big = (3u64 << 30).to_string();
    run_client("steps_leak", &["big", &big], &env, true);
    let file = only_dump_file(dir.path());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        !text.contains("MY_SECRET_TOKEN"),
        "a non-allowlisted variable leaked into the dump"
    );
    assert!(!text.contains("SOME_API_KEY") && !text.contains("do-not-copy-4b7e1c"));
    let dump = read_dump(&file).unwrap();
    let config = dump.config.as_ref().expect("config key");
    assert_eq!(
        config
            .env
            .get("PYTORCH_CUDA_ALLOC_CONF")
            .map(String::as_str),
        Some("expandable_segments:True")
    );
    assert_eq!(
        config.env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
        Some("0")
    );
    assert_eq!(
        config.env.get("OOMSHIM_SETTLE").map(String::as_str),
        Some("0.2s")
    );
    assert!(
        config
            .env
            .keys()
            .all(|k| oomshim_core::facts::env::allowed(k)),
        "{:?}",
        config.env
    );
    // The simulated driver answers cuDriverGetVersion with 13000 (13.0).
    assert_eq!(config.cuda_driver_version, Some(13000));
    // The terminal report shows it in a short section.
    let report = oomshim_cli::report::render_terminal(
        &dump,
        &oomshim_cli::report::ReportOptions {
            top: 3,
            color: false,
        },
    );
    assert!(report.contains("Configuration"), "{report}");
    assert!(
        report.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{report}"
    );
    assert!(report.contains("CUDA driver 13.0"), "{report}");
}

#[test]
fn python_step_marks_reach_the_shim() {
    let Ok(python) = which_python() else {
        common::skip("python3");
        return;
    };
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/python");
    let code = "import sys, oomshim; print(oomshim.step(), oomshim.step())";
    let run = |with_shim: bool| {
        let mut cmd = Command::new(&python);
        cmd.args(["-c", code])
            .env_remove("LD_PRELOAD")
            .env("PYTHONPATH", &pkg)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if with_shim {
            cmd.env("LD_PRELOAD", shim_lib());
        }
        wait_with_watchdog(cmd, Duration::from_secs(60))
    };
    let bare = run(false);
    assert_eq!(stdout(&bare).trim(), "False False", "{bare:?}");
    let shim = run(true);
    assert_eq!(stdout(&shim).trim(), "True True", "{shim:?}");
    assert!(
        shim.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
}

fn which_python() -> Result<PathBuf, ()> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map_err(|_| ())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty())
        .then(|| PathBuf::from(path))
        .ok_or(())
}

#[test]
fn the_torch_version_comes_from_a_loaded_torch_library() {
    // A fake torch package: torch/lib/libtorch_cpu.so (an empty shared library, preloaded so it
    // is mapped as torch's would be) and torch/version.py.
    let dir = tempfile::tempdir().unwrap();
    let pkg = tempfile::tempdir().unwrap();
    let lib_dir = pkg.path().join("torch/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::write(
        pkg.path().join("torch/version.py"),
        "__version__ = '2.11.0+cu130'\ngit_version = 'abc'\n",
    )
    .unwrap();
    let src = pkg.path().join("empty.c");
    std::fs::write(&src, "int oomshim_fake_torch_marker;\n").unwrap();
    let so = lib_dir.join("libtorch_cpu.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(cc)
        .args(["-fPIC", "-shared", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    let preload = format!("{}:{}", shim_lib().display(), so.display());
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("LD_PRELOAD", preload.as_str()),
    ];
    let big = (3u64 << 30).to_string();
    run_client("steps_leak", &["big", &big], &env, false);
    let file = only_dump_file(dir.path());
    let dump = read_dump(&file).unwrap();
    let config = dump.config.as_ref().unwrap();
    assert_eq!(config.torch_version.as_deref(), Some("2.11.0+cu130"));
    assert!(report_text(&file).contains("torch 2.11.0+cu130"));

    // Without torch loaded, no version.
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    run_client("steps_leak", &["big", &big], &env, true);
    assert_eq!(only_dump(dir.path()).config.unwrap().torch_version, None);
}
