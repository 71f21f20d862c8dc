//! Verdicts reproduced against the simulated CUDA: a leak with step marks (`leak`, with the growth
//! history), a request larger than the device (`request_exceeds_device`), and the configuration
//! snapshot (allowlisted variables only).

mod common;

use common::{run_client, shim_lib, wait_with_watchdog};
use oomshim::dump::model::Dump;
use oomshim::dump::read::read_dump;
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

fn only_dump(dir: &Path) -> Dump {
    read_dump(&only_dump_file(dir)).expect("dump parses")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
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
    // 64 MiB free at the failure, less than one step's growth: OOM projected at this step.
    assert_eq!(g.free_bytes, Some(64 * MIB));
    assert_eq!(site.projected_oom_step, Some(19));
    assert_eq!(g.projected_oom_step, Some(19));

    let v = &dump.verdict;
    assert_eq!(v.kind, "leak", "{}", v.summary);
    for needle in [
        "keep_activations (",
        "steps_leak.c:",
        "grows by 96.00 MiB every step",
        "18 steps observed",
        "runs out at step 19",
    ] {
        assert!(v.summary.contains(needle), "{needle}: {}", v.summary);
    }
    assert!(v.suggestions.iter().any(|s| s.contains("loss.item()")));
    assert!(v
        .evidence
        .iter()
        .any(|e| e.contains("adds 96.00 MiB per step")));
}

#[test]
fn the_same_leak_without_step_marks_is_own_allocations() {
    // The loop runs far under a second: no time bucket closes, so there is no growth history.
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let out = run_client("leak_until_oom", &[], &env, true);
    assert!(out.status.success());
    let dump = only_dump(dir.path());
    assert!(dump.growth.is_none());
    assert_eq!(dump.verdict.kind, "own_allocations");
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
        config.env.keys().all(|k| oomshim::facts::env::allowed(k)),
        "{:?}",
        config.env
    );
    // The simulated driver answers cuDriverGetVersion with 13000 (13.0).
    assert_eq!(config.cuda_driver_version, Some(13000));
    // The terminal report shows it in a short section.
    let report = oomshim::report::render_terminal(
        &dump,
        &oomshim::report::ReportOptions {
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
        eprintln!("no python3: skipped");
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
