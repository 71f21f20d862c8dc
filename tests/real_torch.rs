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
use common::torch_python;

use std::io::Write;
use std::path::Path;
use std::process::Command;

#[test]
fn real_torch_programs_compute_and_see_exactly_what_they_do_bare() {
    let Some(python) = torch_python() else { return };
    let python = python.as_str();
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

/// Runs `python prog.py ARGS` in `dir` under `oomshim run --torch-allocator`: (stdout, the
/// shim's line saying allocator mode is off, if any).
fn under_allocator_mode(python: &str, dir: &Path, args: &[&str]) -> (String, Option<String>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oomshim"));
    cmd.args(["run", "--torch-allocator", "--lib"])
        .arg(common::shim_lib())
        .arg("--dir")
        .arg(dir.join("dumps"))
        .args(["--", python, "prog.py"])
        .args(args)
        .current_dir(dir)
        .env_remove("LD_PRELOAD")
        .env_remove("PYTHONPATH")
        .env_remove("OOMSHIM_TORCH_ALLOCATOR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait_with_watchdog(cmd, std::time::Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let off = err
        .lines()
        .find(|l| l.starts_with("oomshim: allocator mode is off"))
        .map(str::to_string);
    (String::from_utf8_lossy(&out.stdout).trim().to_string(), off)
}

/// Writes `files` (path below `dir`, text) into a fresh `dir`.
fn program_dir(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

#[test]
fn allocator_mode_is_decided_by_what_the_program_imports() {
    let Some(python) = torch_python() else { return };
    const PRINT_BACKEND: &str = "print(torch.cuda.get_allocator_backend())\n";
    let tmp = tempfile::tempdir().unwrap();

    // prog.py imports only torch; a sibling it never imports asks for CUDA graphs, so does a
    // config beside it that nothing names: allocator mode stays on.
    let alone = tmp.path().join("alone");
    program_dir(
        &alone,
        &[
            ("prog.py", &format!("import torch\n{PRINT_BACKEND}")),
            (
                "other.py",
                "import torch\nf = torch.compile(lambda x: x, mode=\"reduce-overhead\")\n",
            ),
            ("conf.yaml", "compile:\n  mode: max-autotune\n"),
        ],
    );
    assert_eq!(
        under_allocator_mode(&python, &alone, &[]),
        ("pluggable".to_string(), None)
    );

    // prog.py imports a package whose module asks for CUDA graphs (through a relative import):
    // torch keeps its allocator, and the line names that module's line.
    let imports = tmp.path().join("imports");
    program_dir(
        &imports,
        &[
            (
                "prog.py",
                &format!("import torch\nfrom helpers import model\n{PRINT_BACKEND}"),
            ),
            ("helpers/__init__.py", ""),
            ("helpers/model.py", "import torch\nfrom . import compiled\n"),
            (
                "helpers/compiled.py",
                "import torch\n\nstep = torch.compile(lambda x: x, mode=\"reduce-overhead\")\n",
            ),
            ("unused.py", "import torch\npool = torch.cuda.MemPool()\n"),
        ],
    );
    let (backend, off) = under_allocator_mode(&python, &imports, &[]);
    assert_eq!(backend, "native");
    assert_eq!(
        off.as_deref(),
        Some(
            "oomshim: allocator mode is off for this process, torch keeps its own allocator \
             (watched as under LD_PRELOAD): helpers/compiled.py:3 uses torch.compile with CUDA \
             graphs (mode=\"reduce-overhead\"), which torch cannot run on a pluggable allocator \
             (OOMSHIM_TORCH_ALLOCATOR=force overrides)"
        )
    );

    // A config the command line names is what the program runs with.
    let (backend, off) = under_allocator_mode(&python, &alone, &["--config", "conf.yaml"]);
    assert_eq!(backend, "native");
    assert!(
        off.as_deref().is_some_and(|l| l
            .contains(": conf.yaml:2 uses torch.compile with CUDA graphs (mode=\"max-autotune\")")),
        "{off:?}"
    );
}
