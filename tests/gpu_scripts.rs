//! The GPU scripts' own logic, on this machine: tests/gpu/test_harness.py (run_all.py's rows and
//! table, run_zoo.py's promises) and tests/gpu/zoo/test_corpus.py (the corpus's truth helpers,
//! scoring and a dry run of the runner). The scripts run only on the GPU machine, where a broken
//! parser costs a whole session's device time; their CPU tests run with every test run here.

use std::process::Command;
use std::time::Duration;

use crate::common;

fn python_unittest(python: &str, script: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(python);
    cmd.arg(root.join(script))
        .current_dir(root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait_with_watchdog(cmd, Duration::from_secs(300));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("Ran ") && !l.starts_with("Ran 0 ")),
        "{script} ran no test:\n{text}"
    );
}

#[test]
fn the_gpu_harness_logic_passes_its_tests() {
    if common::require("python3") {
        python_unittest("python3", "tests/gpu/test_harness.py");
    }
}

#[test]
fn the_zoo_corpus_logic_passes_its_tests() {
    // The corpus's truth helpers count real torch storages: the Python that has torch, which
    // under CI is a venv of its own, not the system's python3.
    if let Some(python) = common::torch_python() {
        python_unittest(&python, "tests/gpu/zoo/test_corpus.py");
    }
}

/// The GPU checks of one story per failure and of allocator mode's choice, without a GPU: their
/// programs compile, their judges accept the outputs they expect and refuse the ones the work
/// removed, and the reading names the line they expect (each script's `--dry-run`).
#[test]
fn the_one_story_and_allocator_choice_checks_pass_their_dry_runs() {
    if !common::require("python3") {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for script in [
        "tests/gpu/check_one_story.py",
        "tests/gpu/check_allocator_choice.py",
    ] {
        let out_dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(root.join(script))
            .arg(out_dir.path())
            .arg("--dry-run")
            .current_dir(root)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let out = common::wait_with_watchdog(cmd, Duration::from_secs(120));
        let rows = std::fs::read_to_string(out_dir.path().join("rows.txt")).unwrap_or_default();
        assert!(
            out.status.success() && rows.lines().count() >= 2,
            "{script}: {rows}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            rows.lines().all(|l| l.starts_with("[PASS] ")),
            "{script}: {rows}"
        );
    }
}
