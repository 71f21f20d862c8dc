//! The shim in real processes: C clients built against the simulated CUDA runtime run under
//! `LD_PRELOAD=liboomshim.so`, and the dumps they leave are read back and checked.

use crate::common;

use common::{cli, only_dump, run_client, shim_lib};
use dump::model::{Dump, Frame};
use dump::read::read_dump;
use oomshim_cli::testbed;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn dumps_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn value_after(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .map(|v| v.split_whitespace().next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no `{key}` in output:\n{text}"))
}

fn has_frame<'a>(stack: &'a [Frame], function: &str) -> Option<&'a Frame> {
    stack
        .iter()
        .find(|f| f.function.as_deref() == Some(function))
}

/// Line numbers in a client source whose text contains `needle`.
fn source_lines(client_source: &str, needle: &str) -> Vec<u32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(client_source);
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i as u32 + 1)
        .collect()
}

#[test]
fn leak_until_oom_writes_one_dump_that_names_the_leak() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let bare = run_client("leak_until_oom", &[], &env, false);
    let shim = run_client("leak_until_oom", &[], &env, true);
    assert_eq!(
        stdout(&bare),
        stdout(&shim),
        "program output changed by the shim"
    );
    assert_eq!(bare.status.code(), shim.status.code());
    assert!(stderr(&bare).is_empty());

    let held = value_after(&stdout(&shim), "held ");
    assert!(held > 10, "{}", stdout(&shim));
    let dump = only_dump(dir.path());
    assert_eq!(dump.schema, "oomshim.dump/1");
    assert_eq!(dump.reason, "oom");
    let req = dump.failed_request.as_ref().expect("failed_request");
    assert_eq!(req.bytes, 64 * MIB);
    assert_eq!(req.api, "cudaMalloc");
    assert_eq!(req.error_code, 2);
    assert_eq!(req.recovered, Some(false), "the program never retried");
    assert!(
        has_frame(&req.stack, "leaky_cache_grow").is_some(),
        "failing stack: {:?}",
        req.stack
    );

    let dev = dump
        .devices
        .iter()
        .find(|d| d.index == 0)
        .expect("device 0");
    assert_eq!(
        dev.tracked_bytes,
        held * 64 * MIB,
        "tracked bytes equal what the client holds"
    );
    assert_eq!(dev.tracked_count, held);
    assert_eq!(dev.total_bytes, Some(2 << 30));
    assert!(
        dev.free_bytes.unwrap() < 64 * MIB,
        "free {:?}",
        dev.free_bytes
    );
    assert_eq!(dev.name.as_deref(), Some("oomshim simulated device"));

    let top = &dump.largest_holders[0];
    assert_eq!(top.bytes, 64 * MIB);
    let frame =
        has_frame(&top.stack, "leaky_cache_grow").unwrap_or_else(|| panic!("{:?}", top.stack));
    assert!(
        frame
            .file
            .as_deref()
            .unwrap_or("")
            .ends_with("leak_until_oom.c"),
        "{frame:?}"
    );
    let call_lines = source_lines("leak_until_oom.c", "cudaMalloc(");
    assert!(
        call_lines.contains(&frame.line.unwrap_or(0)),
        "line {:?} not a cudaMalloc call {call_lines:?}",
        frame.line
    );
    assert!(
        has_frame(&top.stack, "main").is_some(),
        "the walk continues past the leak: {:?}",
        top.stack
    );

    assert_eq!(dump.sites.len(), 1, "every chunk comes from the same site");
    assert_eq!(dump.sites[0].count, held);
    assert_eq!(dump.verdict.kind, "own_allocations");
    assert!(
        dump.verdict.summary.contains("leaky_cache_grow"),
        "{}",
        dump.verdict.summary
    );

    let err = stderr(&shim);
    assert!(
        err.contains("oomshim: CUDA out of memory on device 0 (cudaMalloc of 64.00 MiB failed"),
        "{err}"
    );
    assert!(err.contains("leaky_cache_grow"), "{err}");
    assert!(
        err.contains(dir.path().to_str().unwrap()),
        "summary names the dump: {err}"
    );
}

#[test]
fn sixteen_threads_leave_an_exact_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("OOMSHIM_DIR", dir.path().to_str().unwrap())];
    let out = run_client("threads", &["20000"], &env, true);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(value_after(&text, "dump_rc "), 0);
    let dump = only_dump(dir.path());
    assert_eq!(dump.reason, "threads-end");
    assert!(dump.failed_request.is_none());
    let tracked: u64 = dump.devices.iter().map(|d| d.tracked_bytes).sum();
    let count: u64 = dump.devices.iter().map(|d| d.tracked_count).sum();
    assert_eq!(tracked, value_after(&text, "held_bytes "));
    assert_eq!(count, value_after(&text, "held_count "));
    assert_eq!(dump.recording.unknown_frees, 0);
    assert_eq!(dump.recording.live_allocations, count);
    assert!(dump.recording.total_allocations >= 16 * 20000);
    assert!(dump.largest_holders.iter().all(|h| !h.stack.is_empty()));
}

#[test]
fn every_result_and_out_parameter_passes_through_unchanged() {
    let bare = run_client("passthrough", &[], &[], false);
    let shim = run_client("passthrough", &[], &[], true);
    assert_eq!(
        bare.status.code(),
        Some(0),
        "the client disagrees with the sim: {}",
        stdout(&bare)
    );
    assert_eq!(stdout(&bare), stdout(&shim));
    assert_eq!(bare.status.code(), shim.status.code());
    assert!(
        stdout(&bare).lines().count() > 50,
        "the client exercised little"
    );
}

/// dlopen(3)'s idiom (clear dlerror, dlsym, a non-NULL dlerror is a failure) on libraries that
/// are not CUDA gives the program's own answers under the shim: its probes for a driver leave
/// no message behind (a stale dlerror would fail the program's next check).
#[test]
fn dlerror_is_left_as_the_programs_own_dlsym_left_it() {
    let bare = run_client("dl_idiom", &[], &[], false);
    assert_eq!(bare.status.code(), Some(0), "bare: {}", stdout(&bare));
    let shim = run_client("dl_idiom", &[], &[], true);
    assert_eq!(
        stdout(&shim).trim(),
        "problems 0",
        "under the shim: {}",
        stdout(&shim)
    );
    assert_eq!(shim.status.code(), Some(0));
}

#[test]
fn a_recovered_failure_is_one_quiet_line() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_SETTLE", "60s"),
    ];
    shim_lib(); // built (or found up to date) before the clock starts
    let start = Instant::now();
    let out = run_client("retry_after_oom", &[], &env, true);
    assert!(out.status.success());
    assert!(stdout(&out).contains("recovered 1"));
    // Without the early end the program would wait out the whole 60 s settle window; half of it
    // leaves a loaded runner all the room it needs.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "recovery ends the settle wait early ({:?})",
        start.elapsed()
    );
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("recovered") && !err.contains("CUDA out of memory"),
        "{err}"
    );
    let dump = only_dump(dir.path());
    let req = dump.failed_request.unwrap();
    assert_eq!(req.recovered, Some(true));
    assert_eq!(req.bytes, 256 * MIB);
}

#[test]
fn unwritable_dump_dir_falls_back_to_the_private_temp_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", "/proc/oomshim-cannot-write-here"),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ];
    let bare = run_client("leak_until_oom", &[], &env, false);
    let shim = run_client("leak_until_oom", &[], &env, true);
    assert_eq!(stdout(&bare), stdout(&shim));
    assert_eq!(bare.status.code(), shim.status.code());
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let fallback = tmp.path().join(format!("oomshim-{uid}"));
    let dump = only_dump(&fallback);
    assert_eq!(dump.failed_request.unwrap().bytes, 64 * MIB);
    let err = stderr(&shim);
    assert!(
        err.contains("cannot write to /proc/oomshim-cannot-write-here"),
        "{err}"
    );
}

#[test]
fn nowhere_to_write_costs_one_message_and_nothing_else() {
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", "/proc/oomshim-no"),
        ("TMPDIR", "/proc/oomshim-no-either"),
    ];
    let bare = run_client("leak_until_oom", &[], &env, false);
    let shim = run_client("leak_until_oom", &[], &env, true);
    assert_eq!(stdout(&bare), stdout(&shim));
    assert_eq!(bare.status.code(), shim.status.code());
    let err = stderr(&shim);
    assert!(err.contains("no dump written"), "{err}");
}

#[test]
fn malformed_settings_warn_once_each_and_defaults_apply() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_DEPTH", "lots"),
        ("OOMSHIM_TOP", "-1"),
    ];
    let bare = run_client("leak_until_oom", &[], &env, false);
    let shim = run_client("leak_until_oom", &[], &env, true);
    assert_eq!(stdout(&bare), stdout(&shim));
    let err = stderr(&shim);
    let depth_lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("OOMSHIM_DEPTH"))
        .collect();
    assert_eq!(depth_lines.len(), 1, "{err}");
    assert!(
        depth_lines[0].contains("\"lots\"") && depth_lines[0].contains("using 64"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.contains("OOMSHIM_TOP")).count(),
        1,
        "{err}"
    );
    let dump = only_dump(dir.path());
    assert_eq!(dump.recording.depth, 64);
}

#[test]
fn stacks_off_still_counts_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_STACKS", "off"),
    ];
    let out = run_client("leak_until_oom", &[], &env, true);
    let held = value_after(&stdout(&out), "held ");
    let dump = only_dump(dir.path());
    assert_eq!(dump.recording.stacks, "off");
    assert_eq!(dump.devices[0].tracked_bytes, held * 64 * MIB);
    assert!(dump.largest_holders.iter().all(|h| h.stack.is_empty()));
}

#[test]
fn no_cuda_in_the_process_means_no_messages_and_no_change() {
    let bare = Command::new("/bin/echo").arg("hello").output().unwrap();
    let shim = Command::new("/bin/echo")
        .arg("hello")
        .env("LD_PRELOAD", shim_lib())
        .output()
        .unwrap();
    assert_eq!(bare.stdout, shim.stdout);
    assert!(
        shim.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&shim.stderr)
    );
}

#[test]
fn oomshim_run_preloads_and_returns_the_childs_status() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli()
        .args(["run", "--dir", dir.path().to_str().unwrap(), "--"])
        .arg(testbed::client("leak_until_oom"))
        .env("SIMCUDA_CAPACITY", "1G")
        .env("OOMSHIM_SETTLE", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("held "));
    let dump = only_dump(dir.path());
    assert_eq!(dump.failed_request.unwrap().bytes, 64 * MIB);

    let status = cli()
        .args(["run", "--", "sh", "-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));
    // oomshim run ends as its program did: a program killed by a signal leaves oomshim killed
    // by it, exactly as without oomshim (a shell then reports 128 + 9).
    // (A SIGKILL before the first live summary gets a post-mortem: into the test's directory.)
    let status = cli()
        .args(["run", "--dir", dir.path().to_str().unwrap(), "--"])
        .args(["sh", "-c", "kill -KILL $$"])
        .status()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

#[test]
fn oomshim_run_forwards_signals_sent_to_it() {
    let mut child = cli()
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(rest.contains("got-term"), "{rest}");
    // Reaped, and as the program ended: its trap's exit code.
    assert_eq!(child.wait().unwrap().code(), Some(42));
}

#[test]
fn oomshim_report_reads_a_real_dump_and_rejects_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    run_client("leak_until_oom", &[], &env, true);
    let dump = dumps_in(dir.path()).remove(0);
    let out = cli().arg("report").arg(&dump).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("leaky_cache_grow") && text.contains("64.00 MiB"),
        "{text}"
    );
    let json = cli()
        .arg("report")
        .arg(&dump)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("--json prints JSON");
    assert!(v.is_object());

    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, b"{\"schema\": \"oomshim.dump/1\", \"reason\": ").unwrap();
    let out = cli().arg("report").arg(&garbage).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("garbage.json"), "{err}");
}

#[test]
fn oomshim_demo_runs_end_to_end_without_a_gpu() {
    let cwd = tempfile::tempdir().unwrap();
    let out = cli().arg("demo").current_dir(cwd.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = stdout(&out);
    assert!(
        report.contains("save_activation_for_logging") || report.contains("forward_layer"),
        "{report}"
    );
    let dumps = dumps_in(&cwd.path().join("oomshim-dumps"));
    // Issue 27 item 5: a snapshot at step 20 as well as the OOM dump, so `diff` has two states.
    assert_eq!(dumps.len(), 2, "{dumps:?}");
    let by_reason = |r: &str| {
        dumps
            .iter()
            .find(|p| read_dump(p).unwrap().reason == r)
            .unwrap_or_else(|| panic!("no {r} dump in {dumps:?}"))
            .clone()
    };
    let snapshot = by_reason("snapshot at step 20");
    let oom = by_reason("oom");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "oomshim diff oomshim-dumps/{} oomshim-dumps/{}",
            snapshot.file_name().unwrap().to_string_lossy(),
            oom.file_name().unwrap().to_string_lossy()
        )),
        "{err}"
    );
    let diff = cli().arg("diff").arg(&snapshot).arg(&oom).output().unwrap();
    assert!(diff.status.success(), "{}", stderr(&diff));
    let diff = stdout(&diff);
    assert!(
        diff.contains("forward_layer") && diff.contains("allocations 20 → 67"),
        "{diff}"
    );
    let dump = read_dump(&oom).unwrap();
    assert_eq!(dump.reason, "oom");
    // Every live device allocation is a holder in the dump, so the memory_viz export has no
    // "not in the dump" remainder (with OOMSHIM_TOP's default of 20, 62% of it was one).
    for d in &dump.devices {
        let listed = dump
            .largest_holders
            .iter()
            .filter(|h| h.device == d.index)
            .count() as u64;
        assert_eq!(listed, d.tracked_count, "device {}", d.index);
    }
    let pickle = cwd.path().join("demo.pickle");
    let export = cli()
        .arg("export")
        .arg(&oom)
        .arg("--memory-viz")
        .arg(&pickle)
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", stderr(&export));
    assert!(!stderr(&export).contains("warning"), "{}", stderr(&export));
    // The demo marks its steps, so the kept activations show as growth per step.
    assert_eq!(dump.verdict.kind, "leak", "{}", dump.verdict.summary);
    assert!(
        dump.verdict.summary.contains("forward_layer"),
        "{}",
        dump.verdict.summary
    );
    assert!(
        dump.pinned_host.bytes > 0,
        "the demo's pinned staging buffer is tracked apart"
    );
}

#[test]
fn a_missing_runtime_returns_cuda_initialization_error_and_says_so_once() {
    let bare = run_client("no_runtime", &[], &[], false);
    assert_eq!(stdout(&bare), "no cudaMalloc in this process\n");
    let shim = run_client("no_runtime", &[], &[], true);
    assert_eq!(shim.status.code(), Some(0));
    assert_eq!(
        stdout(&shim),
        "cudaMalloc -> 3, out untouched\ncudaFree -> 3\n"
    );
    let err = stderr(&shim);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cudaMalloc was not found"), "{err}");
}

#[test]
fn frees_of_unknown_pointers_are_counted_and_passed_through() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("OOMSHIM_DIR", dir.path().to_str().unwrap())];
    let bare = run_client("frees_and_bursts", &["frees"], &env, false);
    let shim = run_client("frees_and_bursts", &["frees"], &env, true);
    assert_eq!(stdout(&bare), stdout(&shim));
    assert_eq!(shim.status.code(), Some(0), "{}", stderr(&shim));
    assert!(
        stdout(&shim).contains("cudaFree(p) again -> 1"),
        "the sim rejects a double free"
    );
    let dump = only_dump(dir.path());
    assert_eq!(dump.reason, "frees-end");
    // The double free, the stack address and the made-up async free; cudaFree(NULL) is no free.
    assert_eq!(dump.recording.unknown_frees, 3);
    assert_eq!(dump.recording.live_allocations, 0);
    assert_eq!(dump.devices.iter().map(|d| d.tracked_bytes).sum::<u64>(), 0);
}

#[test]
fn a_burst_of_retries_is_one_request_with_one_dump() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let bare = run_client("frees_and_bursts", &["burst", "5"], &env, false);
    let shim = run_client("frees_and_bursts", &["burst", "5"], &env, true);
    assert_eq!(stdout(&bare), stdout(&shim));
    let dump = only_dump(dir.path());
    let req = dump.failed_request.unwrap();
    assert_eq!(
        req.failures_in_burst, 6,
        "the first failure and five retries"
    );
    assert_eq!(req.recovered, Some(false));
    assert_eq!(dump.recording.oom_failures, 6);
    assert_eq!(
        stderr(&shim).matches("CUDA out of memory").count(),
        1,
        "{}",
        stderr(&shim)
    );

    // Retries are not repeats: with no repeat interval the burst is still one request.
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_MIN_INTERVAL", "0"),
    ];
    run_client("frees_and_bursts", &["burst", "2"], &env, true);
    let files = dumps_in(dir.path());
    assert_eq!(files.len(), 1, "one request and its retries");
    let dump = dump::read::read_dump(&files[0]).unwrap();
    assert_eq!(dump.failed_request.unwrap().failures_in_burst, 3);
}

#[test]
fn the_runtime_table_is_the_single_source_of_the_exports() {
    let mut names = oomshim::ffi::runtime_exported_names();
    names.sort();
    assert_eq!(
        names,
        [
            "cudaFree",
            "cudaFreeAsync",
            "cudaFreeAsync_ptsz",
            "cudaFreeHost",
            "cudaGetDriverEntryPoint",
            "cudaGetDriverEntryPointByVersion",
            "cudaGetDriverEntryPointByVersion_ptsz",
            "cudaGetDriverEntryPoint_ptsz",
            "cudaHostAlloc",
            "cudaMalloc",
            "cudaMalloc3D",
            "cudaMallocAsync",
            "cudaMallocAsync_ptsz",
            "cudaMallocFromPoolAsync",
            "cudaMallocFromPoolAsync_ptsz",
            "cudaMallocHost",
            "cudaMallocManaged",
            "cudaMallocPitch",
        ]
    );
}

#[test]
fn the_library_exports_the_hooks_and_nothing_else() {
    if !common::require("nm") {
        return;
    }
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(shim_lib())
        .output()
        .expect("nm");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    names.sort();
    let mut expected = vec!["dlsym"];
    // The functions programs call (src/preload/ffi/hooks.rs).
    expected.extend(oomshim::ffi::PROGRAM_API_EXPORTS);
    // The runtime and driver functions come from their single-source tables, so a hook added
    // there is exported without a second list to forget.
    expected.extend(oomshim::ffi::runtime_exported_names());
    expected.extend(oomshim::ffi::driver_exported_names());
    // Allocator mode's entry points (src/preload/ffi/torch_alloc.rs).
    expected.extend(oomshim::ffi::TORCH_ALLOCATOR_EXPORTS);
    // `_exit`/`_Exit`: the live region goes at every deliberate end (src/preload/ffi/process_exit.rs).
    expected.extend(oomshim::ffi::PROCESS_EXIT_EXPORTS);
    expected.sort();
    assert_eq!(names, expected);
}

#[test]
fn diff_and_merge_work_on_real_dumps() {
    let dir = tempfile::tempdir().unwrap();
    // Two ranks of one "job": rank 1 gets a smaller device and runs out sooner.
    for (rank, capacity) in [("0", "2G"), ("1", "1G")] {
        let env = [
            ("SIMCUDA_CAPACITY", capacity),
            ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
            ("RANK", rank),
            ("WORLD_SIZE", "2"),
        ];
        run_client("leak_until_oom", &[], &env, true);
    }
    let dumps = dumps_in(dir.path());
    assert_eq!(dumps.len(), 2);
    assert!(
        dumps.iter().any(|p| p.to_str().unwrap().contains("-r1-")),
        "rank in the file name: {dumps:?}"
    );

    let out = cli().arg("merge").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("2 dumps\n") && text.contains("peak tracked memory per process"),
        "{text}"
    );

    let (small, big) = {
        let a = read_dump(&dumps[0]).unwrap();
        if a.process.rank == Some(1) {
            (dumps[0].clone(), dumps[1].clone())
        } else {
            (dumps[1].clone(), dumps[0].clone())
        }
    };
    let out = cli().arg("diff").arg(&small).arg(&big).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let growth = text
        .lines()
        .find(|l| l.contains("leaky_cache_grow"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        growth.trim_start().starts_with('+'),
        "the leak grew between the dumps: {growth}"
    );

    let empty = tempfile::tempdir().unwrap();
    let out = cli().arg("merge").arg(empty.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn export_writes_a_memory_viz_pickle_python_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    run_client("leak_until_oom", &[], &env, true);
    let dump = dumps_in(dir.path()).remove(0);
    let out = dir.path().join("snapshot.pickle");
    let status = cli()
        .arg("export")
        .arg(&dump)
        .arg("--memory-viz")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let check = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
segs = sorted(d["segments"], key=lambda s: -s["total_size"])
b = segs[0]["blocks"][0]
assert b["state"] == "active_allocated" and b["size"] == segs[0]["total_size"], b
print(segs[0]["total_size"], [f["name"] for f in b["frames"]])
"#;
    let Ok(py) = Command::new("python3")
        .arg("-c")
        .arg(check)
        .arg(&out)
        .output()
    else {
        common::skip("python3 (to read the pickle back)");
        return;
    };
    assert!(py.status.success(), "{}", stderr(&py));
    let text = stdout(&py);
    assert!(
        text.starts_with(&(64 * MIB).to_string()) && text.contains("leaky_cache_grow"),
        "{text}"
    );
}

#[test]
fn dumps_carry_host_memory_and_say_why_gpu_processes_are_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    run_client("leak_until_oom", &[], &env, true);
    let dump = only_dump(dir.path());
    let host = dump.host.expect("host memory");
    assert!(host.total_bytes.unwrap() > 0 && host.rss_bytes.unwrap() > 0);
    let procs = dump.gpu_processes.expect("gpu_processes");
    assert_eq!(procs.device, 0);
    if !Path::new("/dev/nvidiactl").exists() {
        assert!(
            procs.error.as_deref().unwrap_or("").contains("NVML"),
            "{procs:?}"
        );
    }
}

#[test]
fn on_demand_dumps_by_signal_interval_and_exit_are_opt_in() {
    // Not asked for: no handler, so SIGUSR2's default action ends the program as without the shim.
    let bare = run_client("on_demand", &["signal"], &[], false);
    let shim = run_client("on_demand", &["signal"], &[], true);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(bare.status.signal(), Some(libc::SIGUSR2));
    assert_eq!(
        shim.status.signal(),
        Some(libc::SIGUSR2),
        "no handler installed unasked"
    );

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = run_client(
        "on_demand",
        &["signal"],
        &[("OOMSHIM_DIR", d), ("OOMSHIM_SIGNAL", "USR2")],
        true,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let dump = only_dump(dir.path());
    assert_eq!(dump.reason, "signal");
    assert_eq!(
        dump.devices.iter().map(|d| d.tracked_bytes).sum::<u64>(),
        6 * MIB
    );
    assert!(has_frame(&dump.largest_holders[0].stack, "keep_three_buffers").is_some());

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // The program waits until three interval dumps are there (polling, as long as a loaded
    // runner needs: a fixed window gave a single dump on a busy 2-core machine) and says how
    // long it waited.
    let out = run_client(
        "on_demand",
        &["dumps", "3"],
        &[("OOMSHIM_DIR", d), ("OOMSHIM_INTERVAL", "0.3s")],
        true,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let waited = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("waited_ms ")?.parse::<u64>().ok())
        .expect("waited_ms");
    // Repeated, and never faster than the interval: at most one per 0.3 s of the wait, plus
    // one for the time between the shim's start and the wait's, and one that may have landed
    // between the program's last look and its exit.
    let dumps = dumps_in(dir.path());
    assert!(
        dumps.len() >= 3 && dumps.len() as u64 <= waited / 300 + 2,
        "{} dumps in {waited} ms: {dumps:?}",
        dumps.len()
    );
    assert!(dumps
        .iter()
        .all(|p| read_dump(p).unwrap().reason == "interval"));

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = run_client(
        "on_demand",
        &["exit"],
        &[("OOMSHIM_DIR", d), ("OOMSHIM_AT_EXIT", "1")],
        true,
    );
    assert!(out.status.success());
    let dump = only_dump(dir.path());
    assert_eq!(dump.reason, "exit");
    assert_eq!(
        dump.recording.live_allocations, 2,
        "what the program never freed"
    );
    assert_eq!(dump.devices[0].tracked_bytes, 5 * MIB);
}

/// A dump the simulated CUDA produced, with what differs from run to run and machine to machine
/// (pid, host, times, thread ids, the checkout's paths, libc frames) pinned down.
fn normalised(mut d: Dump) -> Dump {
    d.process.pid = 4242;
    d.process.host = "host".into();
    d.process.command_line = vec!["leak_until_oom".into()];
    d.time = "2026-01-01T00:00:00.000Z".into();
    d.time_unix_ms = 0;
    d.recording.version = "x".into();
    d.host = None;
    d.gpu_processes = None;
    // The allowlisted environment differs between runners (CUDA_VISIBLE_DEVICES, RANK, …).
    d.config = None;
    let keep = |f: &Frame| {
        f.module
            .as_deref()
            .map(|m| m.rsplit('/').next().unwrap_or(m))
            .is_some_and(|m| m == "leak_until_oom" || m == "libcudart.so.13")
    };
    let fix = |stack: &mut Vec<Frame>| {
        stack.retain(keep);
        for f in stack.iter_mut() {
            f.address = "0x0".into();
            f.module = f
                .module
                .as_deref()
                .map(|m| m.rsplit('/').next().unwrap_or(m).to_string());
            f.file = f
                .file
                .as_deref()
                .map(|m| m.rsplit('/').next().unwrap_or(m).to_string());
        }
    };
    if let Some(r) = d.failed_request.as_mut() {
        fix(&mut r.stack);
        if let Some(l) = r.last_failure.as_mut() {
            l.time_unix_ms = 0;
        }
    }
    for h in &mut d.largest_holders {
        fix(&mut h.stack);
        h.thread = 1;
        h.age_s = 0.0;
    }
    for s in &mut d.sites {
        fix(&mut s.stack);
    }
    d
}

#[test]
fn golden_terminal_report_of_a_simulated_oom() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "1G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    run_client("leak_until_oom", &[], &env, true);
    let dump = normalised(only_dump(dir.path()));
    let text = oomshim_cli::report::render_terminal(
        &dump,
        &oomshim_cli::report::ReportOptions {
            top: 3,
            color: false,
        },
    );
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sim_leak_until_oom.report.txt");
    if std::env::var_os("OOMSHIM_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&golden, &text).unwrap();
        return;
    }
    let expected =
        std::fs::read_to_string(&golden).expect("golden file (OOMSHIM_BLESS=1 writes it)");
    assert_eq!(
        text,
        expected,
        "rendered report differs from {} (OOMSHIM_BLESS=1 to accept)",
        golden.display()
    );
}

/// `OOMSHIM_LOG` turns the shim's own diagnostics on by level and by target, leaves the
/// program's output alone, and a value that is no filter is said once (diagnostics off), never
/// a crash.
#[test]
fn the_log_setting_filters_the_shims_diagnostics_and_refuses_garbage_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_str().unwrap();
    let bare = run_client("passthrough", &[], &[("OOMSHIM_DIR", dir)], false);
    for (setting, started) in [
        ("debug", true),
        ("oomshim=debug", true),
        ("some_other_crate=debug", false),
        ("warn", false),
    ] {
        let out = run_client(
            "passthrough",
            &[],
            &[("OOMSHIM_LOG", setting), ("OOMSHIM_DIR", dir)],
            true,
        );
        assert_eq!(stdout(&out), stdout(&bare), "{setting}");
        let err = stderr(&out);
        assert_eq!(
            err.contains("oomshim started"),
            started,
            "OOMSHIM_LOG={setting}: {err}"
        );
    }
    let out = run_client(
        "passthrough",
        &[],
        &[("OOMSHIM_LOG", "debug=[{"), ("OOMSHIM_DIR", dir)],
        true,
    );
    assert_eq!(stdout(&out), stdout(&bare));
    let err = stderr(&out);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("OOMSHIM_LOG")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("is not a filter"), "{err}");
    assert!(!err.contains("oomshim started"), "{err}");
}
