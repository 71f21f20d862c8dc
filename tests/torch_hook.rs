//! The Python hook `oomshim run` injects (shim/python/oomshim_hook), against a stand-in `torch`
//! package that has the few functions the hook uses and records what is done with them. The
//! real torch is exercised on the GPU machine (tests/gpu/run_all.py).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fake torch: `_lazy_call` queues until `_fake_cuda_init()`, the OOM observer is stored and
/// fired by `_fake_oom()`, and `_snapshot()` describes 3 segments of 1 GiB, each split by a
/// 600 MiB tensor (the fragmentation case from the brief).
const FAKE_TORCH: &str = r#"
import sys
__version__ = "0.0-fake"
_queued = []
_observers = []
_initialized = False

class _C:
    @staticmethod
    def _cuda_attach_out_of_memory_observer(fn):
        _observers.append(fn)

class _Memory:
    @staticmethod
    def _snapshot():
        segs = []
        for i in range(3):
            base = (i + 1) << 32
            segs.append({"device": 0, "address": base, "total_size": 1 << 30, "stream": 0,
                         "blocks": [{"address": base, "size": 600 << 20, "state": "active_allocated"},
                                    {"address": base + (600 << 20), "size": (1 << 30) - (600 << 20), "state": "inactive"}]})
        return {"segments": segs, "device_traces": [[]]}

class cuda:
    memory = _Memory
    @staticmethod
    def _lazy_call(fn):
        if _initialized:
            fn()
        else:
            _queued.append(fn)
    @staticmethod
    def memory_stats(device):
        return {"inactive_split_bytes.all.current": 3 * ((1 << 30) - (600 << 20)), "num_ooms": 1}

def _fake_cuda_init():
    global _initialized
    _initialized = True
    for fn in _queued:
        fn()

def _fake_oom(device, alloc, total, free):
    for fn in _observers:
        fn(device, alloc, total, free)
"#;

struct Env {
    _tmp: tempfile::TempDir,
    fake: PathBuf,
    dumps: PathBuf,
    user_site: PathBuf,
}

fn env() -> Option<Env> {
    if Command::new(&common::python_side().python)
        .arg("-c")
        .arg("pass")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: python3 not found");
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("fake");
    std::fs::create_dir_all(fake.join("torch")).unwrap();
    std::fs::write(fake.join("torch/__init__.py"), FAKE_TORCH).unwrap();
    let user_site = tmp.path().join("user_site");
    std::fs::create_dir_all(&user_site).unwrap();
    std::fs::write(
        user_site.join("sitecustomize.py"),
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n",
    )
    .unwrap();
    let dumps = tmp.path().join("dumps");
    Some(Env {
        fake,
        dumps,
        user_site,
        _tmp: tmp,
    })
}

/// `oomshim run -- python -c PROGRAM` with the CLI and Python under test (common::python_side:
/// the repository's, or the installed wheel's, which finds its own library).
fn run_python(e: &Env, program: &str, extra: &[(&str, &str)], hook: bool) -> Output {
    let side = common::python_side();
    let mut cmd = Command::new(&side.cli);
    cmd.arg("run").arg("--dir").arg(&e.dumps);
    if !hook {
        cmd.arg("--no-torch-hook");
    }
    cmd.arg("--").arg(&side.python).args(["-c", program]);
    cmd.env(
        "PYTHONPATH",
        format!("{}:{}", e.fake.display(), e.user_site.display()),
    );
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == ext))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

const OOM_PROGRAM: &str = r#"
import os, sys
import torch
assert os.environ.get("USER_SITECUSTOMIZE_RAN") == "1", "the user's sitecustomize must still run"
assert not torch._observers, "nothing attached before CUDA initialises"
torch._fake_cuda_init()
assert len(torch._observers) == 1
torch._fake_oom(0, 2 << 30, 80 << 30, 512 << 20)
print("ok")
"#;

#[test]
fn at_oom_the_hook_saves_torchs_cache_next_to_the_dumps() {
    let Some(e) = env() else { return };
    let out = run_python(
        &e,
        OOM_PROGRAM,
        &[(
            "PYTORCH_CUDA_ALLOC_CONF",
            "garbage_collection_threshold:0.8",
        )],
        true,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summaries = files(&e.dumps, "json");
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(
        files(&e.dumps, "pickle").len(),
        1,
        "the full snapshot is kept too"
    );
    let c: oomshim::report::torch_cache::TorchCache =
        serde_json::from_slice(&std::fs::read(&summaries[0]).unwrap()).unwrap();
    assert_eq!(c.request_bytes, 2 << 30);
    assert_eq!(c.device_free_bytes, Some(512 << 20));
    assert_eq!(c.alloc_conf, "garbage_collection_threshold:0.8");
    assert_eq!(c.cache.segments, 3);
    assert_eq!(c.cache.reserved_bytes, 3 << 30);
    assert_eq!(c.cache.allocated_bytes, 3 * (600 << 20));
    assert_eq!(c.cache.total_free_bytes, 3 * ((1 << 30) - (600 << 20)));
    assert_eq!(c.cache.largest_free_bytes, (1 << 30) - (600 << 20));
    assert_eq!(c.cache.inactive_split_bytes, c.cache.total_free_bytes);
    let frag = c.cache.fragmentation.unwrap();
    assert!((frag - 2.0 / 3.0).abs() < 1e-9, "{frag}");
    assert_eq!(c.cache.histogram.iter().map(|b| b.count).sum::<u64>(), 3);
}

#[test]
fn a_program_that_never_imports_torch_never_gets_it() {
    let Some(e) = env() else { return };
    let out = run_python(
        &e,
        "import sys, os\nprint('torch' in sys.modules, os.environ.get('USER_SITECUSTOMIZE_RAN'))",
        &[],
        true,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "False 1");
    assert!(files(&e.dumps, "json").is_empty());
}

#[test]
fn the_hook_can_be_switched_off() {
    let Some(e) = env() else { return };
    let program = OOM_PROGRAM.replace(
        "assert len(torch._observers) == 1",
        "assert not torch._observers",
    );
    run_python(&e, &program, &[], false);
    run_python(&e, &program, &[("OOMSHIM_TORCH_HOOK", "0")], true);
    assert!(files(&e.dumps, "json").is_empty());
}

#[test]
fn a_failing_snapshot_is_one_message_and_the_program_goes_on() {
    let Some(e) = env() else { return };
    let program = OOM_PROGRAM.replace(
        "import torch\n",
        "import torch\ntorch.cuda.memory._snapshot = None\n",
    );
    let out = run_python(&e, &program, &[], true);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("oomshim: torch hook: could not save torch's snapshot"),
        "{err}"
    );
}

#[test]
fn python_can_ask_the_shim_for_a_dump() {
    let Some(e) = env() else { return };
    let side = common::python_side();
    let pkg = side.pythonpath(&[]);
    let program = "import oomshim\nprint(oomshim.loaded(), oomshim.dump('from-python'))";
    // Without the shim: a clear error.
    let bare = Command::new(&side.python)
        .arg("-c")
        .arg(program)
        .env("PYTHONPATH", &pkg)
        .output()
        .unwrap();
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("liboomshim.so is not loaded"));
    // Under the shim: a dump with that reason.
    let out = Command::new(&side.python)
        .arg("-c")
        .arg(program)
        .env("PYTHONPATH", &pkg)
        .env("LD_PRELOAD", &side.lib)
        .env("OOMSHIM_DIR", &e.dumps)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "True True",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dumps = files(&e.dumps, "json");
    assert_eq!(dumps.len(), 1);
    let d = oomshim::dump::read::read_dump(&dumps[0]).unwrap();
    assert_eq!(d.reason, "from-python");
}

#[test]
fn oomshim_run_makes_the_python_package_importable() {
    let Some(e) = env() else { return };
    let out = run_python(
        &e,
        "import oomshim\nprint(oomshim.loaded(), oomshim.dump('via-run'))",
        &[],
        true,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "True True");
    let dumps = files(&e.dumps, "json");
    assert_eq!(dumps.len(), 1, "{dumps:?}");
}

#[test]
fn a_program_that_keeps_catching_ooms_gets_one_snapshot_per_interval() {
    let Some(e) = env() else { return };
    // Three OutOfMemoryErrors in a row, as a loop that catches them and goes on.
    let program = OOM_PROGRAM.replace(
        "torch._fake_oom(0, 2 << 30, 80 << 30, 512 << 20)\n",
        "for _ in range(3):\n    torch._fake_oom(0, 2 << 30, 80 << 30, 512 << 20)\n",
    );
    run_python(&e, &program, &[], true);
    assert_eq!(files(&e.dumps, "json").len(), 1, "default interval: one");
    assert_eq!(files(&e.dumps, "pickle").len(), 1);
    let again = env().unwrap();
    run_python(&again, &program, &[("OOMSHIM_MIN_INTERVAL", "0")], true);
    assert_eq!(files(&again.dumps, "json").len(), 3, "interval 0: every one");
}
