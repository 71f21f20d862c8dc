//! oomshim's Python hook (shim/python/oomshim_hook), which the shim puts on a Python program's
//! path by itself under plain LD_PRELOAD and `oomshim run` puts there too, against a stand-in
//! `torch` package that has the few functions the hook uses and records what is done with them.
//! Device memory comes from the simulated CUDA through libsimcall.so (tests/common). The real
//! torch is exercised on the GPU machine (tests/gpu/zoo).

use crate::common;

use std::os::unix::fs::PermissionsExt;
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

_snapshots = [0]  # how often torch's view was asked for

class _Memory:
    @staticmethod
    def _snapshot():
        _snapshots[0] += 1
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
    # The device's size and the per-process fraction, where a test gives them (FAKE_TOTAL_MEMORY,
    # FAKE_FRACTION); otherwise they raise, as an API this fake lacks.
    @staticmethod
    def get_device_properties(device):
        import os, types
        return types.SimpleNamespace(total_memory=int(os.environ["FAKE_TOTAL_MEMORY"]))
    @staticmethod
    def get_per_process_memory_fraction(device):
        import os
        return float(os.environ["FAKE_FRACTION"])

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
    simcall: PathBuf,
}

fn env() -> Option<Env> {
    if Command::new(&common::python_side().python)
        .arg("-c")
        .arg("pass")
        .output()
        .is_err()
    {
        common::skip(&format!("{}", common::python_side().python.display()));
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("fake");
    std::fs::create_dir_all(fake.join("torch")).unwrap();
    std::fs::write(fake.join("torch/__init__.py"), FAKE_TORCH).unwrap();
    common::write_fake_torch_step_hooks(&fake.join("torch"));
    let user_site = tmp.path().join("user_site");
    std::fs::create_dir_all(&user_site).unwrap();
    std::fs::write(
        user_site.join("sitecustomize.py"),
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n",
    )
    .unwrap();
    let simcall = common::build_simcall(tmp.path())?;
    let dumps = tmp.path().join("dumps");
    Some(Env {
        fake,
        dumps,
        user_site,
        simcall,
        _tmp: tmp,
    })
}

/// How the program is started.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Launcher {
    /// `LD_PRELOAD=liboomshim.so python3 …`: the shim puts the hook on the path itself.
    Preload,
    /// `oomshim run -- python3 …`.
    Run,
    /// `oomshim run --no-torch-hook -- python3 …`.
    RunWithoutHook,
}

/// Runs PROGRAM with the Python, CLI and library under test (common::python_side: the
/// repository's, or the installed wheel's).
fn python(e: &Env, launcher: Launcher, program: &str, extra: &[(&str, &str)]) -> Output {
    let side = common::python_side();
    let mut cmd = match launcher {
        Launcher::Preload => {
            let mut c = Command::new(&side.python);
            c.env("LD_PRELOAD", &side.lib).env("OOMSHIM_DIR", &e.dumps);
            c
        }
        Launcher::Run | Launcher::RunWithoutHook => {
            let mut c = Command::new(&side.cli);
            c.arg("run").arg("--dir").arg(&e.dumps);
            if launcher == Launcher::RunWithoutHook {
                c.arg("--no-torch-hook");
            }
            c.arg("--").arg(&side.python);
            c.env_remove("LD_PRELOAD");
            c
        }
    };
    cmd.args(["-c", program, e.simcall.to_str().unwrap()]);
    cmd.env(
        "PYTHONPATH",
        format!("{}:{}", e.fake.display(), e.user_site.display()),
    )
    .env("SIMCUDA_CAPACITY", "2G")
    .env_remove("OOMSHIM_TORCH_HOOK");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = common::wait_with_watchdog(
        {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd
        },
        std::time::Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{launcher:?}: stdout {} stderr {}",
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

fn dumps(dir: &Path) -> Vec<PathBuf> {
    files(dir, "json")
        .into_iter()
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("oomshim-torch-")
        })
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The start of every test program: the simulated device through libsimcall, and the checks
/// that the hook is installed the way it should be.
const PRELUDE: &str = r#"
import ctypes, os, sys
sim = ctypes.CDLL(sys.argv[1])
sim.simcall_alloc.restype = ctypes.c_void_p
sim.simcall_alloc.argtypes = [ctypes.c_size_t]
MiB = 1 << 20
assert os.environ.get("USER_SITECUSTOMIZE_RAN") == "1", "the user's sitecustomize must still run"
assert not any("python-hook" in p for p in os.environ.get("PYTHONPATH", "").split(":")), \
    "children must not inherit the hook's directory: " + os.environ.get("PYTHONPATH", "")
import torch
assert not torch._observers, "nothing attached before CUDA initialises"
torch._fake_cuda_init()
"#;

/// Fills the simulated device at one line until it fails, then torch says it raised.
const OOM_PROGRAM: &str = r#"
assert len(torch._observers) == 1, "torch's OOM observer is attached"
kept = []
while True:
    p = sim.simcall_alloc(128 * MiB)  # the program's line
    if not p:
        break
    kept.append(p)
torch._fake_oom(0, 128 * MiB, 2 << 30, 0)
print("ok")
"#;

fn program(body: &str) -> String {
    format!("{PRELUDE}{body}")
}

#[test]
fn under_plain_ld_preload_and_oomshim_run_torchs_word_is_in_the_dump_before_it_is_judged() {
    let Some(e) = env() else { return };
    let mut verdicts = Vec::new();
    for launcher in [Launcher::Preload, Launcher::Run] {
        let _ = std::fs::remove_dir_all(&e.dumps);
        let start = std::time::Instant::now();
        let out = python(
            &e,
            launcher,
            &program(OOM_PROGRAM),
            &[
                (
                    "PYTORCH_CUDA_ALLOC_CONF",
                    "garbage_collection_threshold:0.8",
                ),
                // torch's word ends the wait: no settle window is sat out.
                ("OOMSHIM_SETTLE", "30s"),
            ],
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(stdout(&out), "ok");
        let files = dumps(&e.dumps);
        assert_eq!(files.len(), 1, "{launcher:?}: {files:?}\n{}", stderr(&out));
        let d = dump::read::read_dump(&files[0]).unwrap();
        let req = d.failed_request.as_ref().unwrap();
        assert_eq!(req.bytes, 128 << 20);
        assert_eq!(req.recovered, Some(false));
        assert_eq!(req.resolution.as_deref(), Some("framework_raised"));
        let fw = d.framework.as_ref().expect("torch's account");
        assert_eq!(fw.name, "torch");
        assert!(fw.raised);
        assert_eq!(
            fw.alloc_conf.as_deref(),
            Some("garbage_collection_threshold:0.8")
        );
        assert_eq!(fw.version.as_deref(), Some("0.0-fake"));
        // torch's cache: 3 segments of 1 GiB, each split by a 600 MiB tensor.
        let fb = &d.free_blocks;
        assert_eq!(fb.source, "torch-snapshot");
        assert_eq!(fb.segments, Some(3));
        assert_eq!(fb.reserved_bytes, Some(3 << 30));
        assert_eq!(fb.allocated_bytes, Some(3 * (600 << 20)));
        assert_eq!(fb.total_free_bytes, Some(3 * ((1 << 30) - (600 << 20))));
        assert_eq!(fb.largest_free_bytes, Some((1 << 30) - (600 << 20)));
        assert_eq!(fb.histogram.iter().map(|b| b.count).sum::<u64>(), 3);
        // The full snapshot beside the dump, under the name the dump gives.
        let pickle = files[0].with_file_name(fw.snapshot_file.as_deref().unwrap());
        assert!(pickle.is_file(), "{pickle:?}");
        assert_eq!(
            std::fs::metadata(&pickle).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // stderr says what the dump says, and so does `oomshim report`.
        let err = stderr(&out);
        let line = err
            .lines()
            .find(|l| l.starts_with("oomshim: CUDA out of memory"))
            .unwrap_or_else(|| panic!("{err}"));
        let top = &d.verdict.findings[0];
        assert!(line.contains("torch raised OutOfMemoryError"), "{line}");
        assert!(
            line.ends_with(&format!("{}: {}", top.kind, top.headline)),
            "{line}\n{top:?}"
        );
        let rep = Command::new(&common::python_side().cli)
            .args(["report", "--json"])
            .arg(&files[0])
            .output()
            .unwrap();
        let j: serde_json::Value = serde_json::from_slice(&rep.stdout).unwrap();
        assert_eq!(j["verdict"]["kind"], d.verdict.kind.as_str());
        assert_eq!(
            j["verdict"]["findings"][0]["headline"],
            top.headline.as_str()
        );
        verdicts.push((d.verdict.kind.clone(), top.headline.clone()));
    }
    assert_eq!(
        verdicts[0], verdicts[1],
        "plain LD_PRELOAD and oomshim run agree"
    );
}

#[test]
fn torchs_word_without_a_failed_cuda_call_is_a_dump_of_its_own() {
    // A memory-fraction cap: torch refuses without asking CUDA.
    let Some(e) = env() else { return };
    let out = python(
        &e,
        Launcher::Preload,
        &program("torch._fake_oom(0, 2 << 30, 80 << 30, 512 << 20)\nprint('ok')\n"),
        &[],
    );
    assert_eq!(stdout(&out), "ok");
    let found = dumps(&e.dumps);
    assert_eq!(found.len(), 1);
    let d = dump::read::read_dump(&found[0]).unwrap();
    let req = d.failed_request.as_ref().unwrap();
    assert_eq!(req.api, "framework_allocator");
    assert_eq!(req.bytes, 2 << 30);
    assert_eq!(
        d.devices[0].total_bytes,
        Some(80 << 30),
        "torch's allowed maximum"
    );
    assert!(
        stderr(&out).contains(
            "(torch's caching allocator of 2.00 GiB refused; torch raised OutOfMemoryError)"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(files(&e.dumps, "pickle").len(), 1);
}

#[test]
fn torchs_word_under_a_memory_fraction_names_the_cap() {
    // set_per_process_memory_fraction(0.25) of an 8 GiB device: torch refuses 3 GiB without
    // asking CUDA and tells its observers the 2 GiB cap as the total, the device's own free bytes.
    let Some(e) = env() else { return };
    let body = "torch._fake_oom(0, 3 << 30, 2 << 30, 7 << 30)\nprint('ok')\n";
    let eight = (8u64 << 30).to_string();
    let out = python(
        &e,
        Launcher::Preload,
        &program(body),
        &[("FAKE_TOTAL_MEMORY", &eight), ("FAKE_FRACTION", "0.25")],
    );
    assert_eq!(stdout(&out), "ok", "{}", stderr(&out));
    let found = dumps(&e.dumps);
    assert_eq!(found.len(), 1);
    let d = dump::read::read_dump(&found[0]).unwrap();
    let dev = &d.devices[0];
    let cap = dev.memory_cap.as_ref().expect("the cap is in the dump");
    assert_eq!((cap.bytes, cap.device_total_bytes), (2 << 30, 8 << 30));
    assert_eq!(
        (dev.total_bytes, dev.free_bytes),
        (Some(2 << 30), Some(0)),
        "judged against the cap: torch's 3 GiB reserved leave none of it free"
    );
    let place =
        "the 2.00 GiB cap set by set_per_process_memory_fraction(0.25) of device 0's 8.00 GiB";
    let headline = &d.verdict.findings[0].headline;
    assert!(
        headline.ends_with(&format!("is larger than {place}")),
        "{headline}"
    );
    assert!(stderr(&out).contains(place), "{}", stderr(&out));
    // No fraction set (torch says 1.0): the smaller total is not taken for a cap.
    std::fs::remove_dir_all(&e.dumps).unwrap();
    let out = python(
        &e,
        Launcher::Preload,
        &program(body),
        &[("FAKE_TOTAL_MEMORY", &eight), ("FAKE_FRACTION", "1.0")],
    );
    assert_eq!(stdout(&out), "ok", "{}", stderr(&out));
    let d = dump::read::read_dump(&dumps(&e.dumps)[0]).unwrap();
    assert!(d.devices[0].memory_cap.is_none());
    assert_eq!(d.devices[0].total_bytes, Some(2 << 30));
}

#[test]
fn optimizer_steps_and_forward_passes_are_marked_without_user_code() {
    let Some(e) = env() else { return };
    // Training: every step keeps 96 MiB; the hook marks torch.optim's steps.
    let training = r#"
from torch.optim.optimizer import _fake_step
kept = []
for step in range(1000):
    p = sim.simcall_alloc(96 * MiB)  # kept every step
    if not p:
        break
    kept.append(p)
    _fake_step()
torch._fake_oom(0, 96 * MiB, 2 << 30, 0)
print("ok")
"#;
    python(&e, Launcher::Preload, &program(training), &[]);
    let d = dump::read::read_dump(&dumps(&e.dumps)[0]).unwrap();
    let g = d.growth.as_ref().expect("growth");
    assert_eq!(g.steps.as_deref(), Some("optimizer"));
    assert_eq!(d.verdict.kind, "leak", "{:#?}", d.verdict);
    let headline = &d.verdict.findings[0].headline;
    assert!(headline.starts_with("<module> (<string>:"), "{headline}");
    assert!(headline.contains("optimizer steps"), "{headline}");
    // Evaluation: the outermost module's forward passes are the steps; each keeps 64 MiB.
    let _ = std::fs::remove_dir_all(&e.dumps);
    let evaluation = r#"
from torch.nn.modules.module import Module
class Head(Module):
    def forward(self, x):
        p = sim.simcall_alloc(64 * MiB)  # the prediction, kept
        if p:
            kept.append(p)
        return p
class Model(Module):
    pass
model = Model(children=[Module(params=0), Head(params=1)])
kept = []
for batch in range(1000):
    if not model(1):
        break
torch._fake_oom(0, 64 * MiB, 2 << 30, 0)
print("ok")
"#;
    // Forward passes are steps when the program asks for them (every module call pays for the
    // global hooks that see them).
    let forward = [("OOMSHIM_AUTO_STEPS", "forward")];
    python(&e, Launcher::Preload, &program(evaluation), &forward);
    let d = dump::read::read_dump(&dumps(&e.dumps)[0]).unwrap();
    let g = d.growth.as_ref().expect("growth");
    assert_eq!(g.steps.as_deref(), Some("forward"));
    assert_eq!(d.verdict.kind, "leak", "{:#?}", d.verdict);
    assert!(
        d.verdict.findings[0]
            .headline
            .starts_with("Head.forward (<string>:"),
        "{}",
        d.verdict.findings[0].headline
    );
    // Nothing is ever put on the program's modules (it would travel with torch.save, deepcopy and
    // torch.jit.script); by default no module hook at all, so no module call pays for one.
    let check = "from torch.nn.modules import module as m\nm_model = m.Module(children=[m.Module()])\nm_model(1)\nprint(len(m._pre), len(m._post), len(m_model._hooks), len(m_model.children[0]._hooks))\n";
    for (env, want) in [(&[][..], "0 0 0 0"), (&forward[..], "1 1 0 0")] {
        let out = python(&e, Launcher::Preload, &program(check), env);
        assert_eq!(stdout(&out), want, "{env:?}: {}", stderr(&out));
    }
}

#[test]
fn a_program_that_never_imports_torch_never_gets_it() {
    let Some(e) = env() else { return };
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python(
            &e,
            launcher,
            "import sys, os\nprint('torch' in sys.modules, os.environ.get('USER_SITECUSTOMIZE_RAN'))",
            &[],
        );
        assert_eq!(stdout(&out), "False 1");
    }
    assert!(files(&e.dumps, "json").is_empty());
}

#[test]
fn the_hook_can_be_switched_off() {
    let Some(e) = env() else { return };
    let program = program("assert not torch._observers\nprint('ok')\n");
    assert_eq!(
        stdout(&python(&e, Launcher::RunWithoutHook, &program, &[])),
        "ok"
    );
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python(&e, launcher, &program, &[("OOMSHIM_TORCH_HOOK", "0")]);
        assert_eq!(stdout(&out), "ok");
    }
}

#[test]
fn a_failing_snapshot_is_one_message_and_the_program_goes_on() {
    let Some(e) = env() else { return };
    let body = OOM_PROGRAM.replace(
        "torch._fake_oom(",
        "torch.cuda.memory._snapshot = None\ntorch._fake_oom(",
    );
    let out = python(&e, Launcher::Preload, &program(&body), &[]);
    assert_eq!(stdout(&out), "ok");
    let err = stderr(&out);
    let hook_lines: Vec<&str> = err.lines().filter(|l| l.contains("python hook")).collect();
    assert_eq!(hook_lines.len(), 1, "{err}");
    assert!(
        hook_lines[0].contains("oomshim: python hook: could not give the shim torch's view"),
        "{err}"
    );
    // The shim's own dump is still written (after the settle window).
    assert_eq!(dumps(&e.dumps).len(), 1, "{err}");
}

#[test]
fn python_can_ask_the_shim_for_a_dump() {
    let Some(e) = env() else { return };
    let side = common::python_side();
    let program = "import oomshim\nprint(oomshim.loaded(), oomshim.dump('from-python'))";
    // Without the shim: a clear error.
    let bare = Command::new(&side.python)
        .arg("-c")
        .arg(program)
        .env("PYTHONPATH", side.pythonpath(&[]))
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("liboomshim.so is not loaded"));
    // Under the shim, with the package where the program has it (installed, or on its path).
    let pythonpath = side.pythonpath(&[&e.fake, &e.user_site]);
    for launcher in [Launcher::Preload, Launcher::Run] {
        let _ = std::fs::remove_dir_all(&e.dumps);
        let out = python(
            &e,
            launcher,
            program,
            &[("PYTHONPATH", pythonpath.to_str().unwrap())],
        );
        assert_eq!(stdout(&out), "True True", "{}", stderr(&out));
        let dumps = dumps(&e.dumps);
        assert_eq!(dumps.len(), 1);
        let d = dump::read::read_dump(&dumps[0]).unwrap();
        assert_eq!(d.reason, "from-python");
    }
}

/// The hook adds no importable name to the program but its one package, `_oomshim_hook`: where
/// the program cannot import `oomshim` (or `kinds`, a file the hook once had) bare, it cannot
/// under the shim either, and a module of the program's own by such a name is the one it gets.
#[test]
fn the_hook_adds_no_name_a_program_could_import() {
    let Some(e) = env() else { return };
    if common::python_side().installed {
        return; // `oomshim` is installed there: importable bare too
    }
    let own = tempfile::tempdir().unwrap();
    std::fs::write(own.path().join("kinds.py"), "WHOSE = 'the program'\n").unwrap();
    let probe = "import sys\nfor name in ('oomshim', 'kinds', 'allocator', '_locate'):\n    try:\n        m = __import__(name)\n        print(name, getattr(m, 'WHOSE', 'oomshim'))\n    except ImportError:\n        print(name, 'none')\nprint(any('python-hook' in p for p in sys.path))\n";
    let pythonpath = format!(
        "{}:{}:{}",
        e.fake.display(),
        e.user_site.display(),
        own.path().display()
    );
    let bare = python_args(None, &["-c", probe], Some(&pythonpath), &[]);
    assert_eq!(
        stdout(&bare),
        "oomshim none\nkinds the program\nallocator none\n_locate none\nFalse"
    );
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python_args(Some(launcher), &["-c", probe], Some(&pythonpath), &[]);
        assert_eq!(
            stdout(&out),
            stdout(&bare),
            "{launcher:?}: {}",
            stderr(&out)
        );
    }
}

/// torch's caching allocator at a block it cannot find, on the simulated device: `cudaMalloc`,
/// and when it fails the cached segments freed (`cudaFree`) and the same size asked again; when
/// that fails too, the OOM observers called, then OutOfMemoryError raised. `cache` holds what
/// the program freed (torch keeps it), `kept` what it still uses.
const TORCH_RETRY: &str = r#"
sim.simcall_free.argtypes = [ctypes.c_void_p]
import time
GiB = 1 << 30
kept, cache = [], []

class OutOfMemoryError(RuntimeError):
    pass

def torch_malloc(n):
    p = sim.simcall_alloc(n)
    if p:
        return p
    while cache:
        sim.simcall_free(cache.pop())
    p = sim.simcall_alloc(n)
    if p:
        return p
    torch._fake_oom(0, n, 2 * GiB, 0)
    raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n >> 20} MiB")

def fill(cached_mib, free_mib):
    """The device (2 GiB, 256 MiB of it the context's) as kept 128 MiB blocks, `cached_mib` of
    them in torch's cache, and `free_mib` left free."""
    for _ in range((1792 - free_mib) // 128):
        kept.append(sim.simcall_alloc(128 * MiB))
    assert all(kept), "the device is not as full as planned"
    for _ in range(cached_mib // 128):
        cache.append(kept.pop())

def step(n):
    """One op's output of `n` bytes; the program's own line for the dump."""
    return torch_malloc(n)  # the program's line

def caught(n):
    try:
        step(n)
        return "fits"
    except OutOfMemoryError:
        return "OutOfMemoryError"
"#;

/// The stderr lines of the out-of-memory path: summaries (`CUDA out of memory`) and recovered
/// requests' quiet lines, in order.
fn stories(err: &str) -> Vec<String> {
    err.lines()
        .filter(|l| {
            l.starts_with("oomshim: CUDA out of memory")
                || l.contains("then its retry succeeded (recovered)")
        })
        .map(str::to_string)
        .collect()
}

/// Runs the program `body` after [`TORCH_RETRY`] under `launcher` and checks what a user reads:
/// what it printed, each dump's (resolution, MiB, recovered_before) in order, and the stories on
/// stderr in the same order: the summary of a dump that stood, containing `says[i]` (its top
/// finding, and `oomshim report`'s, the dump's), or a recovered request's line, starting with it.
/// Nothing else is left in the dump directory.
fn stories_are(
    launcher: Launcher,
    body: &str,
    printed: &str,
    want: &[(&str, u64, u32)],
    says: &[&str],
) {
    let e = env().unwrap();
    let out = python(&e, launcher, &program(&format!("{TORCH_RETRY}{body}")), &[]);
    let err = stderr(&out);
    assert_eq!(stdout(&out), printed, "{launcher:?}: {err}");
    let got: Vec<(String, u64, u32)> = common::dumps(&e.dumps)
        .iter()
        .map(|d| {
            let r = d.failed_request.as_ref().unwrap();
            let resolution = r.resolution.clone().unwrap_or_default();
            (resolution, r.bytes >> 20, r.recovered_before)
        })
        .collect();
    let want: Vec<(String, u64, u32)> = want
        .iter()
        .map(|(r, m, b)| (r.to_string(), *m, *b))
        .collect();
    assert_eq!(got, want, "{launcher:?}: {err}");
    let lines = stories(&err);
    assert_eq!(lines.len(), says.len(), "{launcher:?}: {err}");
    let paths = dumps(&e.dumps);
    for ((line, said), (path, (resolution, ..))) in
        lines.iter().zip(says).zip(paths.iter().zip(&got))
    {
        if resolution == "retry_succeeded" {
            assert!(line.starts_with(said), "{launcher:?}: {line}");
            assert!(line.ends_with(&dump::units::clean_path(path)), "{line}");
        } else {
            assert!(line.contains(said), "{launcher:?}: {line}");
            common::agree(line, path, &dump::read::read_dump(path).unwrap());
        }
    }
    assert_eq!(
        files(&e.dumps, "json").len(),
        got.len(),
        "{launcher:?}: nothing but the dumps"
    );
}

const RECOVERED_512: &str =
    "oomshim: cudaMalloc of 512.00 MiB on device 0 failed, then its retry succeeded (recovered)";
const RAISED_512: &str =
    "(cudaMalloc of 512.00 MiB failed; 2 failures with its retries; torch raised OutOfMemoryError";

#[test]
fn torchs_free_the_cache_and_retry_is_one_story_whatever_its_outcome() {
    for launcher in [Launcher::Preload, Launcher::Run] {
        // The retry succeeds: one quiet line, its dump says so.
        let body = "fill(512, 128)\nprint(caught(512 * MiB))\n";
        let recovered = [("retry_succeeded", 512, 0)];
        stories_are(launcher, body, "fits", &recovered, &[RECOVERED_512]);
        // The retry fails and torch raises: one dump with both failures, one story.
        let body = "fill(128, 128)\nprint(caught(512 * MiB))\n";
        let raised = [("framework_raised", 512, 0)];
        let says = format!("{RAISED_512})");
        stories_are(launcher, body, "OutOfMemoryError", &raised, &[&says]);
        // Two ops' outputs of one size back to back: the first recovers (the cache freed for
        // it), the second finds nothing left to free and torch raises. One story: no
        // "recovered" line before the alarm, one dump that counts the recovery.
        let body = "fill(512, 128)\nprint(caught(512 * MiB), caught(512 * MiB))\n";
        let one = [("framework_raised", 512, 1)];
        let says = format!("{RAISED_512}; 1 earlier request recovered just before)");
        stories_are(launcher, body, "fits OutOfMemoryError", &one, &[&says]);
    }
}

#[test]
fn a_smaller_retry_after_torch_raised_is_a_new_request_and_a_new_story() {
    let raised_1g = "(cudaMalloc of 1.00 GiB failed; 2 failures with its retries; torch raised \
                     OutOfMemoryError)";
    // The program catches OutOfMemoryError, drops its batch (torch caches it) and tries half the
    // size: cudaMalloc fails while torch holds the batch, torch frees it and the retry succeeds.
    let body = "fill(128, 128)\nprint(caught(GiB))\ncache.extend(kept.pop() for _ in range(4))\n\
                print(caught(GiB // 2))\n";
    let want = [("framework_raised", 1024, 0), ("retry_succeeded", 512, 0)];
    let says = [raised_1g, RECOVERED_512];
    stories_are(
        Launcher::Preload,
        body,
        "OutOfMemoryError\nfits",
        &want,
        &says,
    );
    // Half the size fails too (nothing to free): torch raises again, a second story.
    let body = "fill(128, 128)\nprint(caught(GiB))\nprint(caught(GiB // 2))\n";
    let want = [("framework_raised", 1024, 0), ("framework_raised", 512, 0)];
    let raised = format!("{RAISED_512})");
    let says = [raised_1g, raised.as_str()];
    stories_are(
        Launcher::Preload,
        body,
        "OutOfMemoryError\nOutOfMemoryError",
        &want,
        &says,
    );
}

#[test]
fn a_process_killed_before_torch_speaks_keeps_a_provisional_dump() {
    // The failure's first moments: torch frees its cache and retries (seconds on a busy
    // device) before its observer speaks. A process SIGKILLed then keeps a dump of the
    // failure: provisional (its outcome unknown), written at once in the background.
    let Some(e) = env() else { return };
    let body = r#"
import signal, time
kept = []
while True:
    p = sim.simcall_alloc(128 * MiB)
    if not p:
        break
    kept.append(p)
d = os.environ["OOMSHIM_DIR"]
for _ in range(500):
    if any(n.endswith(".json") for n in os.listdir(d)):
        break
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let side = common::python_side();
    let mut cmd = Command::new(&side.python);
    cmd.env("LD_PRELOAD", &side.lib)
        .env("OOMSHIM_DIR", &e.dumps)
        .args(["-c", &program(body), e.simcall.to_str().unwrap()])
        .env(
            "PYTHONPATH",
            format!("{}:{}", e.fake.display(), e.user_site.display()),
        )
        .env("SIMCUDA_CAPACITY", "2G")
        .env_remove("OOMSHIM_TORCH_HOOK")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    std::fs::create_dir_all(&e.dumps).unwrap();
    let out = common::wait_with_watchdog(cmd, std::time::Duration::from_secs(60));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    let all = common::dumps(&e.dumps);
    assert_eq!(all.len(), 1, "{}", stderr(&out));
    let req = all[0].failed_request.as_ref().unwrap();
    assert_eq!(req.bytes, 128 << 20);
    assert_eq!(
        req.recovered, None,
        "provisional: the outcome was not known"
    );
    assert_eq!(req.resolution.as_deref(), Some("unknown"));
}

#[test]
fn the_same_oom_caught_again_and_again_is_one_dump_and_a_count() {
    let Some(e) = env() else { return };
    // Three OutOfMemoryErrors from one line, as a loop that catches them and goes on.
    let body = "for _ in range(3):\n    torch._fake_oom(0, 2 << 30, 80 << 30, 512 << 20)\nprint('ok', torch._snapshots[0])\n";
    let out = python(&e, Launcher::Preload, &program(body), &[]);
    assert_eq!(dumps(&e.dumps).len(), 1, "default interval: one");
    // torch's view (its snapshot, the memory by kind: seconds in a large process) is gathered
    // for the one dump only; the repeats cost the shim's count.
    assert_eq!(stdout(&out), "ok 1", "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("2 out-of-memory failures after the last dump got no dump of their own"),
        "{}",
        stderr(&out)
    );
    let again = env().unwrap();
    let out = python(
        &again,
        Launcher::Preload,
        &program(body),
        &[("OOMSHIM_MIN_INTERVAL", "0")],
    );
    assert_eq!(dumps(&again.dumps).len(), 3, "no interval: one each");
    assert_eq!(stdout(&out), "ok 3");
    // Over the cap (OOMSHIM_MAX_DUMPS a minute): failures of other sizes get no dump, and no
    // view is gathered for them.
    let capped = env().unwrap();
    let body = "for n in range(1, 4):\n    torch._fake_oom(0, n << 30, 80 << 30, 512 << 20)\nprint('ok', torch._snapshots[0])\n";
    let out = python(
        &capped,
        Launcher::Preload,
        &program(body),
        &[("OOMSHIM_MAX_DUMPS", "1")],
    );
    assert_eq!(dumps(&capped.dumps).len(), 1, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ok 1", "{}", stderr(&out));
}

#[test]
fn with_no_settle_window_torchs_view_is_a_side_file_the_report_merges() {
    // OOMSHIM_SETTLE=0: the dump is final at the failure, before torch speaks; the hook then
    // saves torch's view beside it, and `oomshim report` merges it (matched by pid, device and
    // request).
    let Some(e) = env() else { return };
    python(
        &e,
        Launcher::Preload,
        &program(OOM_PROGRAM),
        &[("OOMSHIM_SETTLE", "0")],
    );
    let found = dumps(&e.dumps);
    assert_eq!(found.len(), 1);
    let d = dump::read::read_dump(&found[0]).unwrap();
    assert!(d.framework.is_none());
    assert_eq!(d.free_blocks.source, "unavailable");
    let side: Vec<PathBuf> = files(&e.dumps, "json")
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("oomshim-torch-")
        })
        .collect();
    assert_eq!(side.len(), 1);
    let rep = Command::new(&common::python_side().cli)
        .args(["report", "--json"])
        .arg(&found[0])
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&rep.stdout).unwrap();
    assert_eq!(j["free_blocks"]["source"], "torch-snapshot", "{j:#}");
}

#[test]
fn in_a_shared_dump_dir_torchs_files_go_to_the_users_own_subdirectory_private() {
    // A world-writable OOMSHIM_DIR (a team's /scratch/dumps): the shim writes into DIR/oomshim-UID
    // (0700, its own), and the hook's pickle and side file go there too, 0600, never into DIR
    // itself, where another user could have planted links at their names.
    let Some(e) = env() else { return };
    std::fs::create_dir_all(&e.dumps).unwrap();
    std::fs::set_permissions(&e.dumps, std::fs::Permissions::from_mode(0o1777)).unwrap();
    python(
        &e,
        Launcher::Preload,
        &program(OOM_PROGRAM),
        &[("OOMSHIM_SETTLE", "0")],
    );
    let top: Vec<String> = std::fs::read_dir(&e.dumps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // SAFETY: `getuid` takes no argument, touches no memory and cannot fail.
    let own = format!("oomshim-{}", unsafe { libc::getuid() });
    assert_eq!(
        top,
        vec![own.clone()],
        "only the user's subdirectory in DIR"
    );
    let sub = e.dumps.join(&own);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sub), 0o700);
    let names: Vec<PathBuf> = std::fs::read_dir(&sub)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let torch: Vec<&PathBuf> = names
        .iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("oomshim-torch-")
        })
        .collect();
    assert_eq!(torch.len(), 2, "the pickle and the side file: {names:?}");
    for p in torch {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    assert!(
        !names
            .iter()
            .any(|p| p.file_name().unwrap().to_string_lossy().ends_with(".tmp")),
        "no temporary file left: {names:?}"
    );
}

/// Python started with `args` (options, program and all) bare, under plain LD_PRELOAD, or under
/// `oomshim run`, with `PYTHONPATH` as given (None: unset) and `extra` in its environment.
fn python_args(
    launcher: Option<Launcher>,
    args: &[&str],
    pythonpath: Option<&str>,
    extra: &[(&str, &str)],
) -> Output {
    let side = common::python_side();
    let mut cmd = match launcher {
        None => Command::new(&side.python),
        Some(Launcher::Preload) => {
            let mut c = Command::new(&side.python);
            c.env("LD_PRELOAD", &side.lib);
            c
        }
        Some(l) => {
            let mut c = Command::new(&side.cli);
            c.arg("run");
            if l == Launcher::RunWithoutHook {
                c.arg("--no-torch-hook");
            }
            c.arg("--").arg(&side.python);
            c
        }
    };
    if launcher != Some(Launcher::Preload) {
        cmd.env_remove("LD_PRELOAD");
    }
    cmd.args(args).env_remove("OOMSHIM_TORCH_HOOK");
    match pythonpath {
        Some(p) => cmd.env("PYTHONPATH", p),
        None => cmd.env_remove("PYTHONPATH"),
    };
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    common::wait_with_watchdog(cmd, std::time::Duration::from_secs(60))
}

/// Issue 25 item 15: inside a shimmed Python process `import oomshim` finds the hook's copy of
/// the package, three levels below $TMPDIR. A file planted at $TMPDIR/target/release/oomshim
/// (anyone may create it in /tmp) must never be taken for the CLI of a checkout.
#[test]
fn the_hooks_copy_of_the_package_never_runs_a_file_from_a_shared_temporary_directory() {
    let Some(_e) = env() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // Like /tmp: writable by all, sticky.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let release = tmp.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    let marker = tmp.path().join("PLANTED-RAN");
    std::fs::write(
        release.join("oomshim"),
        format!("#!/bin/sh\ntouch '{}'\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        release.join("oomshim"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(release.join("liboomshim.so"), "not a library").unwrap();
    let env = [
        ("TMPDIR", tmp.path().to_str().unwrap()),
        ("PATH", "/usr/bin:/bin"),
    ];
    let program = "import _oomshim_hook._locate as L\nprint(L.__file__)\ntry:\n    print(L.cli_path())\nexcept FileNotFoundError:\n    print('none')\n";
    let out = python_args(Some(Launcher::Preload), &["-c", program], None, &env);
    let text = stdout(&out);
    let (file, cli) = text.split_once('\n').expect("two lines");
    assert!(
        file.contains("python-hook-"),
        "the hook's copy is the one imported: {text} {}",
        stderr(&out)
    );
    assert!(
        !cli.starts_with(tmp.path().to_str().unwrap()),
        "a planted file was taken for the CLI: {cli}"
    );
    let out = python_args(
        Some(Launcher::Preload),
        &["-m", "oomshim", "--version"],
        None,
        &env,
    );
    assert!(
        !marker.exists(),
        "`python -m oomshim` ran the planted file: {}",
        stderr(&out)
    );
}

/// Issue 25 item 21: transformers, accelerate and Lightning probe
/// `importlib.util.find_spec("torch")` before importing torch; the hook must still attach.
#[test]
fn a_find_spec_probe_before_the_import_does_not_use_up_the_hook() {
    let Some(e) = env() else { return };
    let program = "import importlib.util\nassert importlib.util.find_spec('torch') is not None\nassert importlib.util.find_spec('torch') is not None\nimport torch\ntorch._fake_cuda_init()\nprint(len(torch._observers))\n";
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python(&e, launcher, program, &[]);
        assert_eq!(stdout(&out), "1", "{launcher:?}: {}", stderr(&out));
    }
}

/// Issue 25 item 22: empty PYTHONPATH entries mean "the current directory" and are kept when
/// the hook takes its own directory off.
#[test]
fn empty_pythonpath_entries_survive_the_hooks_removal() {
    let Some(e) = env() else { return };
    let given = format!(":{}::{}:", e.fake.display(), e.user_site.display());
    let program = "import os\nprint(os.environ['PYTHONPATH'])\n";
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python(&e, launcher, program, &[("PYTHONPATH", &given)]);
        assert_eq!(stdout(&out), given, "{launcher:?}: {}", stderr(&out));
    }
}

/// Issue 25 item 23: under `python -I`, `-E` or `-S` the hook never runs; the program (and so
/// its children) must still see the PYTHONPATH it was given, not the hook's directory.
#[test]
fn under_python_i_e_s_the_program_sees_the_pythonpath_it_was_given() {
    let Some(e) = env() else { return };
    let given = e.fake.display().to_string();
    let program = "import os, sys\nprint(os.environ.get('PYTHONPATH'), any('python-hook' in p for p in sys.path))";
    for flag in ["-I", "-E", "-S", "-bS"] {
        for pythonpath in [Some(given.as_str()), None] {
            // One bare run for both launchers (a quarter of this test's Python starts).
            let bare = python_args(None, &[flag, "-c", program], pythonpath, &[]);
            for launcher in [Launcher::Preload, Launcher::Run] {
                let out = python_args(Some(launcher), &[flag, "-c", program], pythonpath, &[]);
                assert_eq!(
                    stdout(&out),
                    stdout(&bare),
                    "{flag} {launcher:?} PYTHONPATH={pythonpath:?}: {}",
                    stderr(&out)
                );
            }
        }
    }
}

/// Issue 25 item 24: a user sitecustomize that raises is reported by Python in two lines; the
/// shim's hook must not turn that into its own traceback.
#[test]
fn a_failing_user_sitecustomize_prints_what_python_prints_bare() {
    let Some(_e) = env() else { return };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("sitecustomize.py"),
        "raise ValueError('the user sitecustomize failed')\n",
    )
    .unwrap();
    let dir = tmp.path().to_str().unwrap();
    let args = ["-c", "print('ran')"];
    let bare = python_args(None, &args, Some(dir), &[]);
    assert!(
        stderr(&bare).contains("ValueError"),
        "the bare run shows the failure: {}",
        stderr(&bare)
    );
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python_args(Some(launcher), &args, Some(dir), &[]);
        assert_eq!(stdout(&out), "ran");
        assert_eq!(stderr(&out), stderr(&bare), "{launcher:?}");
    }
}

/// Two hook directories on the path (a CLI and a library of different builds each put their own
/// first, `oomshim run --lib OTHER`): each hook must skip every oomshim hook directory when it
/// looks for the program's own sitecustomize, or the two chain each other until Python's
/// recursion limit stops the start-up.
#[test]
fn a_second_hook_directory_on_the_path_is_not_taken_for_the_users_sitecustomize() {
    let Some(e) = env() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("oomshim-0").join("python-hook-other-build");
    std::fs::create_dir_all(&other).unwrap();
    // Another build's hook directory, as the library writes its own.
    for (name, text) in oomshim_core::pyhook::FILES {
        let path = other.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text.replace("oomshim's hook", "another build's hook")).unwrap();
    }
    let pythonpath = format!("{}:{}", other.display(), e.user_site.display());
    let program = "import os\nprint('ran', os.environ.get('USER_SITECUSTOMIZE_RAN'))\n";
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = python_args(Some(launcher), &["-c", program], Some(&pythonpath), &[]);
        assert_eq!(stdout(&out), "ran 1", "{launcher:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("RecursionError"),
            "{launcher:?}: {}",
            stderr(&out)
        );
    }
}
