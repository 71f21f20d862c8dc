//! `oomshim.torch` (allocator mode's Python side, shim/python/oomshim/torch.py) against a
//! stand-in `torch` whose pluggable-allocator API behaves like torch's own: it opens the library
//! with ctypes and looks the two functions up by name, keeps the hook pointers it is given,
//! refuses to swap allocators once CUDA is initialised, and raises from `memory_stats` as torch
//! does under a pluggable allocator. Allocations go through the function pointers to
//! liboomshim.so and the simulated CUDA runtime. The real torch is exercised on the GPU machine
//! (tests/gpu/torch_alloc.py).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

const FAKE_TORCH: &str = r#"
import ctypes, os
__version__ = "0.0-fake"
# torch's own libraries load the CUDA runtime; here the simulated one.
_cudart = ctypes.CDLL(os.environ["SIM_CUDART"], mode=ctypes.RTLD_GLOBAL)
_initialized = False
_current = None
_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_RESET = ctypes.CFUNCTYPE(None)
_INIT = ctypes.CFUNCTYPE(None, ctypes.c_int)

class _Raw:
    def __init__(self):
        self.hooks = {}
    def set_init_fn(self, p): self.hooks["init"] = p
    def set_reset_fn(self, p): self.hooks["reset"] = p
    def set_record_stream_fn(self, p): self.hooks["record_stream"] = p
    def set_memory_fraction_fn(self, p): self.hooks["memory_fraction"] = p

class _Pluggable:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path)
        self.alloc = _ALLOC(ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value)
        self.free = _FREE(ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value)
        self._allocator = _Raw()
    def allocator(self):
        return self._allocator

def _change_current_allocator(a):
    global _current
    if _initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    _current = a

class _C:
    @staticmethod
    def _cuda_memoryStats(device):
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")
    @staticmethod
    def _cuda_resetPeakMemoryStats(device):
        raise RuntimeError("CUDAPluggableAllocator does not yet support resetPeakStats.")

def _lazy_init():
    global _initialized
    if not _initialized:
        _initialized = True
        if _current is not None and "init" in _current.allocator().hooks:
            _INIT(_current.allocator().hooks["init"])(1)

def _flatten(nested, prefix, out):
    for k, v in nested.items():
        key = prefix + "." + k if prefix else k
        if isinstance(v, dict):
            _flatten(v, key, out)
        else:
            out[key] = v

class cuda:
    class memory:
        CUDAPluggableAllocator = _Pluggable
        change_current_allocator = staticmethod(_change_current_allocator)
    @staticmethod
    def is_initialized():
        return _initialized
    @staticmethod
    def current_device():
        _lazy_init()
        return 0
    @staticmethod
    def memory_stats(device=None):
        out = {}
        _flatten(_C._cuda_memoryStats(0), "", out)
        return out
    @staticmethod
    def memory_allocated(device=None):
        return cuda.memory_stats(device).get("allocated_bytes.all.current", 0)
    @staticmethod
    def max_memory_reserved(device=None):
        return cuda.memory_stats(device).get("reserved_bytes.all.peak", 0)
    @staticmethod
    def reset_peak_memory_stats(device=None):
        _C._cuda_resetPeakMemoryStats(0)
    @staticmethod
    def empty_cache():
        if _current is not None and "reset" in _current.allocator().hooks:
            _RESET(_current.allocator().hooks["reset"])()

def _empty(nbytes):
    """A CUDA tensor's storage: through the current allocator, as torch does."""
    _lazy_init()
    if _current is None:
        raise RuntimeError("the fake torch has only the pluggable allocator")
    return _current.alloc(nbytes, 0, None)

def _free(ptr, nbytes):
    _current.free(ptr, nbytes, 0, None)
"#;

struct Env {
    tmp: tempfile::TempDir,
    fake: PathBuf,
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
    Some(Env { tmp, fake })
}

/// Runs `program` with the package under test (common::python_side: the repository's, or the
/// installed wheel's, which must then find its bundled library without OOMSHIM_LIB).
fn python(e: &Env, program: &str, extra: &[(&str, &str)]) -> Output {
    let side = common::python_side();
    let mut cmd = Command::new(&side.python);
    cmd.args(["-c", program])
        .env_remove("LD_PRELOAD")
        .env("PYTHONPATH", side.pythonpath(&[&e.fake]))
        .env("SIM_CUDART", oomshim_cli::testbed::sim_cudart())
        .env("OOMSHIM_DIR", e.tmp.path().join("dumps"));
    if side.installed {
        cmd.env_remove("OOMSHIM_LIB");
    } else {
        cmd.env("OOMSHIM_LIB", &side.lib);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const MIB: u64 = 1 << 20;

#[test]
fn enable_installs_the_allocator_its_hooks_and_torchs_statistics() {
    let Some(e) = env() else { return };
    let program = format!(
        r#"
import ctypes, torch, oomshim.torch as ot
ot.enable()
assert ot.enabled()
hooks = torch._current.allocator().hooks
lib = ctypes.CDLL(ot.library_path())
addr = lambda n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
assert hooks == {{"init": addr("oomshim_torch_init"), "reset": addr("oomshim_torch_empty_cache"),
                 "record_stream": addr("oomshim_torch_record_stream"),
                 "memory_fraction": addr("oomshim_torch_set_memory_fraction")}}, hooks
a = torch._empty({a})
b = torch._empty(1000)
# torch's own statistics answer from oomshim (they raise under a pluggable allocator otherwise).
assert torch.cuda.memory_allocated() == {a} + 1024, torch.cuda.memory_allocated()
assert ot.memory_allocated() == {a} + 1024
assert ot.memory_reserved() == {reserved}, ot.memory_reserved()
stats = ot.memory_stats()
assert stats["segment.all.current"] == 2 and stats["allocation.all.current"] == 2, stats
torch._free(a, {a}); torch._free(b, 1000)
fb = ot.fragmentation()
assert fb["source"] == "oomshim-allocator" and fb["total_free_bytes"] == {reserved}, fb
torch.cuda.empty_cache()
assert ot.memory_reserved() == 0
assert torch.cuda.max_memory_reserved() == {reserved}
torch.cuda.reset_peak_memory_stats()
assert torch.cuda.max_memory_reserved() == 0
ot.enable()  # a second call is harmless
print("ok", ot.exception_kind())
"#,
        a = 5 * MIB,
        reserved = 2 * MIB + 20 * MIB,
    );
    let out = ok(&python(&e, &program, &[]));
    // Python itself loads no C++ runtime: an unservable request would return NULL (C callers);
    // under torch it is torch.OutOfMemoryError (checked on the GPU).
    assert_eq!(out.trim(), "ok none");
}

#[test]
fn enable_after_cuda_initialised_says_how_to_fix_it() {
    let Some(e) = env() else { return };
    let out = python(
        &e,
        "import torch, oomshim.torch as ot\ntorch.cuda.current_device()\ntry:\n    ot.enable()\nexcept RuntimeError as x:\n    print(x)\n",
        &[],
    );
    let text = ok(&out);
    assert!(text.contains("after CUDA was initialised"), "{text}");
    assert!(text.contains("oomshim run --torch-allocator"), "{text}");
}

#[test]
fn the_library_is_found_by_the_documented_rule() {
    let Some(e) = env() else { return };
    // An explicit OOMSHIM_LIB that does not exist is an error naming it.
    let out = python(
        &e,
        "import oomshim.torch as ot\ntry:\n    ot.library_path()\nexcept FileNotFoundError as x:\n    print(x)\n",
        &[("OOMSHIM_LIB", "/nonexistent/liboomshim.so")],
    );
    assert!(
        ok(&out).contains("OOMSHIM_LIB=/nonexistent/liboomshim.so does not name a file"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Without it: the copy already loaded in the process wins (one shim state per process).
    let lib = common::shim_lib();
    let program = format!(
        "import ctypes, os\nctypes.CDLL({lib:?})\nos.environ.pop('OOMSHIM_LIB', None)\nimport oomshim.torch as ot\nprint(ot.library_path())",
        lib = lib.display().to_string()
    );
    let out = python(&e, &program, &[]);
    assert_eq!(ok(&out).trim(), lib.display().to_string());
    // Installed: nothing loaded, no OOMSHIM_LIB: the wheel's own copy.
    let side = common::python_side();
    if side.installed {
        let out = python(
            &e,
            "import oomshim.torch as ot\nprint(ot.library_path())",
            &[],
        );
        assert_eq!(ok(&out).trim(), side.lib.display().to_string());
    }
}

#[test]
fn oomshim_run_torch_allocator_enables_it_without_code_changes() {
    let Some(e) = env() else { return };
    let user_site = e.tmp.path().join("user_site");
    std::fs::create_dir_all(&user_site).unwrap();
    std::fs::write(
        user_site.join("sitecustomize.py"),
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n",
    )
    .unwrap();
    let side = common::python_side();
    let program = r#"
import os, torch, oomshim.torch as ot
assert os.environ.get("USER_SITECUSTOMIZE_RAN") == "1"
assert ot.enabled(), "the hook enables allocator mode right after `import torch`"
p = torch._empty(3 << 20)
print(ot.memory_allocated(), ot.library_path())
"#;
    let mut cmd = Command::new(&side.cli);
    cmd.args(["run", "--torch-allocator", "--dir"])
        .arg(e.tmp.path().join("dumps"));
    // Installed, the CLI finds the wheel's library itself.
    if !side.installed {
        cmd.arg("--lib").arg(&side.lib);
    }
    let out = cmd
        .arg("--")
        .arg(&side.python)
        .args(["-c", program])
        .env(
            "PYTHONPATH",
            format!("{}:{}", e.fake.display(), user_site.display()),
        )
        .env("SIM_CUDART", oomshim_cli::testbed::sim_cudart())
        .env_remove("OOMSHIM_LIB")
        .output()
        .unwrap();
    let text = ok(&out);
    // The preloaded copy is the one torch was given.
    let lib = std::fs::canonicalize(&side.lib).unwrap();
    assert_eq!(text.trim(), format!("{} {}", 3 * MIB, lib.display()));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_recording_switch_works_in_allocator_mode_and_leaves_the_ledger_exact() {
    let Some(e) = env() else { return };
    let program = format!(
        r#"
import glob, json, os, torch, oomshim, oomshim.torch as ot
ot.enable()
a = torch._empty({mib})
assert oomshim.recording() == "all", oomshim.recording()
assert oomshim.set_recording("pass-through") == "all"
b = torch._empty(2 * {mib})
# The allocator serves and counts as ever; only the ledger skips what pass-through made.
assert ot.memory_allocated() == 3 * {mib}, ot.memory_allocated()
torch._free(a, {mib})
assert oomshim.set_recording("totals") == "pass-through"
torch._free(b, 2 * {mib})
c = torch._empty(3 * {mib})
try:
    oomshim.set_recording("everything")
    raise SystemExit("an unknown mode was accepted")
except ValueError:
    pass
assert oomshim.recording() == "totals"
assert oomshim.step()
assert ot.dump("switched")
(path,) = glob.glob(os.path.join(os.environ["OOMSHIM_DIR"], "*.json"))
d = json.load(open(path))
r = d["recording"]
assert d["devices"][0]["tracked_bytes"] == 3 * {mib}, d["devices"]
assert r["live_allocations"] == 1 and r["unknown_frees"] == 0 and r["stacks"] == "off", r
print("ok")
"#,
        mib = MIB
    );
    let out = ok(&python(&e, &program, &[]));
    assert!(out.contains("ok"), "{out}");
}
