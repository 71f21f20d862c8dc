//! The Python hook against real PyTorch (CPU): the differential harness of tests/real_torch runs
//! every program of tests/real_torch/programs bare, under plain LD_PRELOAD and under `oomshim
//! run`, and fails unless each computes, prints, exits and sees of itself exactly what it does
//! bare (TorchScript, torch.compile under `fail_on_recompile`, torch.fx and torch.export,
//! OOM-retry loops whose dropped batches must be freed at once, accelerate's and Lightning's
//! batch finders, the program's own modules and hooks, `closefrom(3)`, workers...). The table it
//! prints is the proof.
//!
//! Needs a Python with torch (and accelerate, for its batch finder): `OOMSHIM_TEST_TORCH_PYTHON`,
//! else `python3` (`.ci/run` installs them; a machine without them skips, CI fails). More
//! interpreters with torch for the version-sensitive programs: `OOMSHIM_TEST_TORCH_PYTHONS`,
//! colon-separated paths.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::Command;

#[test]
fn real_torch_programs_compute_and_see_exactly_what_they_do_bare() {
    let python = std::env::var("OOMSHIM_TEST_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let python = python.as_str();
    let has_torch = Command::new(python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        common::skip("torch");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(python);
    cmd.arg(root.join("tests/real_torch/harness.py"))
        .arg("--lib")
        .arg(common::shim_lib())
        .arg("--cli")
        .arg(env!("CARGO_BIN_EXE_oomshim"))
        .arg("--python")
        .arg(python);
    if common::in_ci() {
        cmd.arg("--require-all");
    }
    if let Ok(more) = std::env::var("OOMSHIM_TEST_TORCH_PYTHONS") {
        for p in more.split(':').filter(|p| !p.is_empty()) {
            cmd.arg("--python").arg(p);
        }
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait_with_watchdog(cmd, std::time::Duration::from_secs(1200));
    let table = String::from_utf8_lossy(&out.stdout);
    // The table in the test's output whether it passes or not (libtest captures eprintln!).
    let _ = writeln!(std::io::stderr().lock(), "{table}");
    if out.status.code() == Some(3) {
        // Every run the same, but a program was left out for a module it needs (in the table).
        common::skip("a module a program of tests/real_torch needs (see the table)");
        return;
    }
    assert!(
        out.status.success(),
        "the harness found differences:\n{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
