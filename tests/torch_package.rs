//! `oomshim.torch` (allocator mode's Python side, shim/python/oomshim/torch.py) against a
//! stand-in `torch` whose pluggable-allocator API behaves like torch's own: it opens the library
//! with ctypes and looks the two functions up by name, keeps the hook pointers it is given,
//! refuses to swap allocators once CUDA is initialised, and raises from `memory_stats` as torch
//! does under a pluggable allocator. Allocations go through the function pointers to
//! liboomshim.so and the simulated CUDA runtime. The real torch is exercised on the GPU machine
//! (tests/gpu/torch_alloc.py).

use crate::common;
use common::succeeded as ok;

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
    @staticmethod
    def _cuda_memorySnapshot(mempool_id):
        raise RuntimeError("CUDAPluggableAllocator does not yet support snapshot.")
    @staticmethod
    def _cuda_record_memory_history(enabled, *rest):
        raise RuntimeError("CUDAPluggableAllocator does not yet support recordHistory.")
    @staticmethod
    def _cuda_record_memory_history_legacy(enabled, *rest):
        raise RuntimeError("CUDAPluggableAllocator does not yet support recordHistory.")
    @staticmethod
    def _cuda_isHistoryEnabled():
        return False
    @staticmethod
    def _cuda_attach_out_of_memory_observer(fn):
        raise RuntimeError("CUDAPluggableAllocator does not yet support attachOutOfMemoryObserver.")
    # No-ops on a pluggable allocator without the pool hooks, as in torch.
    @staticmethod
    def _cuda_beginAllocateCurrentThreadToPool(device, pool): pass
    @staticmethod
    def _cuda_endAllocateToPool(device, pool): pass
    @staticmethod
    def _cuda_releasePool(device, pool): pass

# torch.compile as far as allocator mode cares: what it was asked for. `compiled` keeps every call.
compiled = []
def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None, disable=False):
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    def wrap(fn):
        compiled.append({"mode": mode, "options": options, "backend": backend})
        return fn
    return wrap if model is None else wrap(model)

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
        def _snapshot(device=None):
            return _C._cuda_memorySnapshot(None)
        # torch.cuda.memory's history functions, as torch 2.11 calls into torch._C.
        @staticmethod
        def _record_memory_history(enabled="all", *args, **kwargs):
            if isinstance(enabled, bool):
                return cuda.memory._record_memory_history_legacy(enabled, *args, **kwargs)
            return cuda.memory._record_memory_history_impl(enabled, *args, **kwargs)
        @staticmethod
        def _record_memory_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                                          trace_alloc_record_context=False, device=None,
                                          record_context_cpp=False, clear_history=False,
                                          compile_context=False, global_record_annotations=False,
                                          skip_actions=None):
            _C._cuda_record_memory_history_legacy(enabled, record_context, trace_alloc_max_entries,
                trace_alloc_record_context, record_context_cpp, clear_history, compile_context,
                global_record_annotations, skip_actions or [])
        @staticmethod
        def _record_memory_history_impl(enabled="all", context="all", stacks="all",
                                        max_entries=2**63 - 1, device=None, clear_history=False,
                                        compile_context=False, global_record_annotations=False,
                                        skip_actions=None):
            _C._cuda_record_memory_history(enabled, context, stacks, max_entries, clear_history,
                compile_context, global_record_annotations, skip_actions or [])
        @staticmethod
        def _dump_snapshot(filename="dump_snapshot.pickle"):
            import pickle
            with open(filename, "wb") as f:
                pickle.dump(cuda.memory._snapshot(), f)
    @staticmethod
    def memory_snapshot(mempool_id=None):
        return _C._cuda_memorySnapshot(mempool_id)["segments"]
    @staticmethod
    def is_initialized():
        return _initialized
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def _lazy_call(fn):
        pass
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

# torch's MemPool (torch._C._MemPool): its constructor asks the current allocator to create the
# pool, which a pluggable allocator refuses (torch 2.11's message); ids come from one counter.
_pool_uid = [0]
class _MemPool:
    def __init__(self, allocator=None, is_user_created=True, use_on_oom=False, no_split=False):
        if _current is not None:
            raise RuntimeError("pluggable does not yet support createOrIncrefPool. If you need it, please file an issue describing your use case.")
        _pool_uid[0] += 1
        self.id = (0, _pool_uid[0])
        self.allocator = allocator

class _PyMemPool(_MemPool):
    def __init__(self, allocator=None, use_on_oom=False, no_split=False):
        super().__init__(allocator, True, use_on_oom, no_split)

def _graph_pool_handle():
    _pool_uid[0] += 1
    return (0, _pool_uid[0])

class _Graph:
    retained = []
    def _retain_pool(self, pool):
        if not isinstance(pool, _MemPool):
            raise TypeError("_retain_pool(): incompatible function arguments")
        self.retained.append(pool)

import contextlib
@contextlib.contextmanager
def _use_mem_pool(pool, device=None):
    # torch.cuda.memory.use_mem_pool, line for line.
    _C._cuda_beginAllocateCurrentThreadToPool(0, pool.id)
    try:
        if cuda._capturing:
            _Graph()._retain_pool(pool)
        yield
    finally:
        _C._cuda_endAllocateToPool(0, pool.id)
        _C._cuda_releasePool(0, pool.id)

def _empty(nbytes):
    """A CUDA tensor's storage: through the current allocator, as torch does."""
    _lazy_init()
    if _current is None:
        raise RuntimeError("the fake torch has only the pluggable allocator")
    return _current.alloc(nbytes, 0, None)

def _free(ptr, nbytes):
    _current.free(ptr, nbytes, 0, None)

cuda._capturing = False
cuda.memory.MemPool = cuda.MemPool = _PyMemPool
cuda.memory.use_mem_pool = cuda.use_mem_pool = _use_mem_pool
cuda.graph_pool_handle = _graph_pool_handle
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

/// The package's namespace is its API: `dir()` lists what `__all__` does, not the modules it
/// uses (`ctypes`, `sys`...).
#[test]
fn the_packages_namespace_is_its_public_api() {
    let Some(e) = env() else { return };
    let out = python(
        &e,
        "import oomshim, oomshim.torch as ot\nfor m in (oomshim, ot):\n    print(dir(m) == sorted(m.__all__), [n for n in ('ctypes', 'sys', 'os', 'json', 're', 'functools') if n in dir(m)])\n",
        &[],
    );
    assert_eq!(ok(&out).trim(), "True []\nTrue []");
}

/// `oomshim.torch.enable()` in a Python that cannot import torch says so and how to install it,
/// as an ImportError (ModuleNotFoundError) naming torch, not a bare traceback of the import.
#[test]
fn enable_without_torch_says_how_to_install_it() {
    let Some(e) = env() else { return };
    let program = "import sys\nsys.modules['torch'] = None  # torch cannot be imported here\nimport oomshim.torch as ot\ntry:\n    ot.enable()\nexcept ModuleNotFoundError as x:\n    print(x.name, '|', x)\n";
    let text = ok(&python(&e, program, &[]));
    assert!(
        text.starts_with("torch | oomshim.torch needs PyTorch, which this Python ("),
        "{text}"
    );
    assert!(text.contains("-m pip install torch"), "{text}");
    assert!(
        text.contains("https://pytorch.org/get-started/locally/"),
        "{text}"
    );
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
        // The program's own `oomshim` (installed, or on its path): it shares allocator mode's
        // state with the hook's copy that turned it on.
        .env("PYTHONPATH", side.pythonpath(&[&e.fake, &user_site]))
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

/// `oomshim run --lib` takes a library of any name. The package found the preloaded copy by the
/// name liboomshim.so only, so a renamed one (a versioned file, a test build) was missed: the
/// package then loaded another copy (a second shim with its own ledger, from the checkout's
/// build) or none (allocator mode off, torch's own allocator kept). Found on the H200.
#[test]
fn oomshim_run_torch_allocator_uses_a_preloaded_library_of_any_name() {
    let Some(e) = env() else { return };
    let side = common::python_side();
    let renamed = e.tmp.path().join("liboomshim-test-build.so");
    std::fs::copy(&side.lib, &renamed).unwrap();
    let program = r#"
import torch, oomshim.torch as ot
assert ot.enabled(), "allocator mode is on"
p = torch._empty(3 << 20)
print(ot.library_path())
"#;
    let out = Command::new(&side.cli)
        .args(["run", "--torch-allocator", "--dir"])
        .arg(e.tmp.path().join("dumps"))
        .arg("--lib")
        .arg(&renamed)
        .arg("--")
        .arg(&side.python)
        .args(["-c", program])
        .env("PYTHONPATH", side.pythonpath(&[&e.fake]))
        .env("SIM_CUDART", oomshim_cli::testbed::sim_cudart())
        .env_remove("OOMSHIM_LIB")
        .output()
        .unwrap();
    let text = ok(&out);
    let renamed = std::fs::canonicalize(&renamed).unwrap();
    assert_eq!(text.trim(), renamed.display().to_string());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A shim rebuilt while the program runs: its file is replaced, /proc/self/maps names the loaded
/// copy "PATH (deleted)", and loading PATH would map the new build as a second shim. The package
/// names the loaded copy by its mapping's map_files link (dlopen gives that same copy back), or,
/// where the process may not open that link, refuses with an error rather than load another.
#[test]
fn a_loaded_shim_replaced_on_disk_is_still_the_one_used() {
    let Some(e) = env() else { return };
    let copy = e.tmp.path().join("liboomshim.so");
    std::fs::copy(common::shim_lib(), &copy).unwrap();
    let program = format!(
        r#"
import ctypes, os, shutil
lib = ctypes.CDLL({copy:?}, mode=ctypes.RTLD_GLOBAL)  # as LD_PRELOAD leaves it: in the global scope
loaded = ctypes.cast(lib.oomshim_torch_alloc, ctypes.c_void_p).value
os.unlink({copy:?})
shutil.copy({copy:?} + ".new", {copy:?})  # the rebuild
os.environ.pop("OOMSHIM_LIB", None)
import oomshim.torch as ot
try:
    path = ot.library_path()
except FileNotFoundError as x:
    print("refused:", x)
    raise SystemExit(0)
again = ctypes.cast(ctypes.CDLL(path).oomshim_torch_alloc, ctypes.c_void_p).value
print("same copy" if again == loaded else "another copy", path)
"#,
        copy = copy.display().to_string()
    );
    std::fs::copy(common::shim_lib(), e.tmp.path().join("liboomshim.so.new")).unwrap();
    let text = ok(&python(&e, &program, &[]));
    let opens_map_files = {
        // The same test the package makes: can this process open its own map_files links?
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let range = maps
            .lines()
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        std::fs::File::open(format!("/proc/self/map_files/{range}")).is_ok()
    };
    if opens_map_files {
        assert!(
            text.starts_with("same copy /proc/self/map_files/"),
            "{text}"
        );
    } else {
        assert!(
            text.starts_with("refused:") && text.contains("removed or replaced on disk"),
            "{text}"
        );
    }
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
# An unservable request in pass-through fails as ever and writes no dump (the glob below finds
# only the one asked for).
assert not torch._empty(1 << 50)
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

#[test]
fn torch_compile_runs_without_cuda_graphs_in_allocator_mode_and_says_so_once() {
    let Some(e) = env() else { return };
    // torch's CUDA graph trees checkpoint the allocator's pool, which no pluggable allocator can
    // serve (torch raises at the first compiled call): every way of asking for them is turned
    // into the same compile without them, and everything else is left as asked.
    let program = r#"
import torch, oomshim.torch as ot
f = lambda x: x
torch.compile(f, mode="reduce-overhead")
assert torch.compiled[-1]["mode"] == "reduce-overhead", "untouched before enable()"
ot.enable()
torch.compile(f, mode="reduce-overhead")
torch.compile(f, mode="max-autotune")
torch.compile(f, options={"triton.cudagraphs": True, "max_autotune": True})
torch.compile(f, backend="cudagraphs")
torch.compile(mode="reduce-overhead")(f)  # as a decorator
torch.compile(f, mode="max-autotune-no-cudagraphs")
torch.compile(f)
for c in torch.compiled[1:]:
    print(c["mode"], c["options"], c["backend"])
"#;
    let out = python(&e, program, &[]);
    let text = ok(&out);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "default None inductor",
            "max-autotune-no-cudagraphs None inductor",
            "None {'triton.cudagraphs': False, 'max_autotune': True} inductor",
            "None None aot_eager",
            "default None inductor",
            "max-autotune-no-cudagraphs None inductor",
            "None None inductor",
        ]
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line, once: {err}");
    assert!(
        lines[0].starts_with(
            "oomshim: torch.compile runs without CUDA graphs in allocator mode \
             (mode=\"reduce-overhead\" at <string>:7 asked for them;"
        ),
        "{err}"
    );
}

#[test]
fn snapshots_history_and_observers_answer_from_the_allocator_instead_of_raising() {
    let Some(e) = env() else { return };
    let program = format!(
        r#"
import pickle, torch, oomshim.torch as ot
ot.enable()
a = torch._empty({a})
b = torch._empty(1000)
c = torch._empty(3000)
torch._free(b, 1000)
s = torch.cuda.memory._snapshot()
segs = sorted(s["segments"], key=lambda g: g["total_size"])
assert [g["total_size"] for g in segs] == [{small}, {large}], segs
assert sum(g["total_size"] for g in segs) == ot.memory_reserved()
small, large = segs
assert small["segment_type"] == "small" and large["segment_type"] == "large", segs
assert small["allocated_size"] == 3072 and large["allocated_size"] == {a}, segs
states = [(bl["size"], bl["state"]) for bl in small["blocks"]]
assert states == [(1024, "inactive"), (3072, "active_allocated"), ({small} - 4096, "inactive")], states
assert large["blocks"][0] == {{"address": a, "size": {a}, "requested_size": {a}, "state": "active_allocated", "frames": []}}, large
assert sum(bl["size"] for g in segs for bl in g["blocks"]) == ot.memory_reserved()
assert s["device_traces"] == [[]] and pickle.loads(pickle.dumps(s)) == s
assert torch.cuda.memory_snapshot() == s["segments"]
# One pool's segments stay torch's answer (oomshim keys graph memory by capture).
try:
    torch.cuda.memory_snapshot((7, 0))
    raise SystemExit("a pool's snapshot was invented")
except RuntimeError as x:
    assert "does not yet support snapshot" in str(x)
# torch's OOM observers, which torch calls under no pluggable allocator, are called by oomshim's
# at a failure, with torch's arguments, in order; one that raises is said once, the rest run.
seen = []
def broken(*a):
    raise ValueError("observer bug")
torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(("first",) + a))
torch._C._cuda_attach_out_of_memory_observer(broken)
torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(("last",) + a))
assert not torch._empty(1 << 50), "a request no device serves"
assert [s[:3] for s in seen] == [("first", 0, 1 << 50), ("last", 0, 1 << 50)], seen
assert seen[0][3] == 8 << 30 and 0 < seen[0][4] <= seen[0][3], seen
print("ok")
"#,
        a = 5 * MIB,
        small = 2 * MIB,
        large = 20 * MIB,
    );
    let out = python(&e, &program, &[]);
    assert_eq!(ok(&out).trim(), "ok");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    // Beside the failure's own summary (its headline and dump), one line: the observer that raised.
    let others: Vec<&&str> = lines
        .iter()
        .filter(|l| {
            !l.starts_with("oomshim: CUDA out of memory") && !l.starts_with("oomshim:   dump:")
        })
        .collect();
    assert_eq!(others.len(), 1, "one line, once: {err}");
    assert!(
        others[0]
            .starts_with("oomshim: an out-of-memory observer raised (ValueError: observer bug)"),
        "{err}"
    );
    assert!(
        !err.contains("observers are not called"),
        "observers are called in allocator mode now: {err}"
    );
}

#[test]
fn torchs_memory_history_turned_on_at_run_time_is_kept_by_the_allocator() {
    // A library turns torch's recorder on (nothing in the program's text says so): _snapshot()
    // and _dump_snapshot() carry device_traces with torch's actions and sizes, and the Python
    // frames of each allocation, as torch's own allocator records them; its options hold.
    let Some(e) = env() else { return };
    let dump = e.tmp.path().join("snap.pickle");
    let program = format!(
        r#"
import pickle, sys, torch, oomshim.torch as ot
MIB = 1 << 20
ot.enable()
early = torch._empty(1000)  # before the history: no frames

def make_activation(n):
    return torch._empty(n)

def drop(p, n):
    torch._free(p, n)

def replay(trace, segments):
    # What pytorch.org/memory_viz replays: every event must find what it acts on.
    segs, live, pending = {{}}, {{}}, set()
    for g in segments:  # segments that already existed when the trace began
        segs.setdefault(g["address"], g["total_size"])
    for e in trace:
        a, n = e.get("addr"), e["size"]
        if e["action"] == "segment_alloc":
            segs[a] = n
        elif e["action"] == "alloc":
            assert any(s <= a < s + z for s, z in segs.items()), e
            assert a not in live, e
            live[a] = n
        elif e["action"] == "free_requested":
            assert live.get(a) == n, e
            pending.add(a)
        elif e["action"] == "free_completed":
            assert a in pending, e
            pending.discard(a); del live[a]
        elif e["action"] == "segment_free":
            assert segs.pop(a) == n and not any(a <= b < a + n for b in live), e
    return live

names = lambda fs: [f["name"] for f in fs]
assert not torch._C._cuda_isHistoryEnabled()
torch.cuda.memory._record_memory_history(max_entries=100000)  # torch's defaults: "all" everything
assert torch._C._cuda_isHistoryEnabled()
a = make_activation(5 * MIB)  # a new 20 MiB segment
b = make_activation(3000)     # the small segment `early` made
drop(a, 5 * MIB)
torch.cuda.empty_cache()       # the 20 MiB segment goes back
s = torch.cuda.memory._snapshot()
(trace,) = s["device_traces"]
print([(e["action"], e["size"]) for e in trace])
assert all(e["stream"] == 0 and e["time_us"] > 1.6e15 for e in trace), trace
assert trace[0]["addr"] == trace[5]["addr"] == trace[1]["addr"] == a and trace[2]["addr"] == b
for e in trace[:3]:
    assert names(e["frames"])[:2] == ["_empty", "make_activation"], e
    assert e["frames"][0]["filename"].endswith("torch/__init__.py") and e["frames"][1]["line"] == 8, e
for e in trace[3:5]:  # context="all": a free carries its own stack
    assert names(e["frames"])[:2] == ["_free", "drop"], e
(seg,) = s["segments"]
assert seg["frames"] == [], "made before the history"
blocks = {{bl["address"]: bl for bl in seg["blocks"]}}
assert blocks[early]["frames"] == [] and names(blocks[b]["frames"])[:2] == ["_empty", "make_activation"]
assert replay(trace, s["segments"]) == {{b: 3000}}
torch.cuda.memory._dump_snapshot({dump:?})
later = pickle.load(open({dump:?}, "rb"))["device_traces"][0]
assert later[:3] == trace[:3]
# As torch does, the first snapshot left an entry: the bytes of the active blocks then.
assert [(e["action"], e["addr"], e["size"], "frames" in e) for e in later[6:]] == [("snapshot", 0, 4096, False)], later

# enabled="state": a trace of one entry; context="state": live blocks keep their frames, the
# trace's entries have none.
torch.cuda.memory._record_memory_history(enabled="state", context="state")
c = make_activation(4000)
(t,) = torch.cuda.memory._snapshot()["device_traces"]
assert [(e["action"], e["size"], "frames" in e) for e in t] == [("alloc", 4000, False)], t
# Off: no trace, blocks keep the frames they were allocated with (torch keeps them too).
torch.cuda.memory._record_memory_history(enabled=None)
assert not torch._C._cuda_isHistoryEnabled()
s = torch.cuda.memory._snapshot()
assert s["device_traces"] == [[]]
assert names([bl for g in s["segments"] for bl in g["blocks"] if bl["address"] == c][0]["frames"])[1] == "make_activation"
# context="alloc" with a ring of 2: frees carry the allocation's stack; the newest two stay.
torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2)
drop(c, 4000)
(t,) = torch.cuda.memory._snapshot()["device_traces"]
assert [(e["action"], names(e["frames"])[1]) for e in t] == [("free_requested", "make_activation"), ("free_completed", "make_activation")], t
# The legacy form, and torch's errors for options it does not know.
torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=5, trace_alloc_record_context=True, clear_history=True)
d = make_activation(512)
(t,) = torch.cuda.memory._snapshot()["device_traces"]
assert [(e["action"], names(e["frames"])[1]) for e in t] == [("alloc", "make_activation")], t
for bad, message in (({{"enabled": "everything"}}, "expected state to be 'state', 'all', or None"),
                     ({{"context": "some"}}, "expected context to be 'state', 'alloc', 'all', or None"),
                     ({{"stacks": "cpp"}}, "expected stacks to be 'python', or 'all'")):
    try:
        torch.cuda.memory._record_memory_history(**bad)
        raise SystemExit(f"{{bad}} was accepted")
    except RuntimeError as x:
        assert str(x) == message, x
assert torch._C._cuda_isHistoryEnabled(), "a refused call changes nothing"
# A program that names the recorder keeps allocator mode: the history is served.
assert ot.unservable_uses(["-c", "torch.cuda.memory._record_memory_history()"]) == []
print("ok")
"#,
        dump = dump.display().to_string()
    );
    let out = python(&e, &program, &[]);
    let text = ok(&out);
    let mib = 1u64 << 20;
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            format!(
                "[('segment_alloc', {s}), ('alloc', {a}), ('alloc', 3000), ('free_requested', {a}), ('free_completed', {a}), ('segment_free', {s})]",
                s = 20 * mib,
                a = 5 * mib
            )
            .as_str(),
            "ok"
        ]
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_program_is_read_for_features_no_pluggable_allocator_serves() {
    let Some(e) = env() else { return };
    let dir = e.tmp.path().join("prog");
    std::fs::create_dir_all(&dir).unwrap();
    // train.py imports model.py; a sibling it never imports, a comment and a docstring ask for
    // CUDA graphs too, and a config names them: only what the program runs counts.
    std::fs::write(
        dir.join("train.py"),
        "\"\"\"Train. Not with mode=\"reduce-overhead\".\"\"\"\nimport torch\nimport model  # cudnn.benchmark = True was slower\nx = 1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("model.py"),
        "import torch\n\n\npool = torch.cuda.MemPool()\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("other.py"),
        "import torch\nf = torch.compile(lambda x: x, mode=\"reduce-overhead\")\n",
    )
    .unwrap();
    std::fs::write(dir.join("conf.yaml"), "compile:\n  mode: max-autotune\n").unwrap();
    let clean = e.tmp.path().join("clean");
    std::fs::create_dir_all(&clean).unwrap();
    std::fs::write(
        clean.join("serve.py"),
        "import torch\nf = torch.compile(lambda x: x, mode='max-autotune-no-cudagraphs')\ntorch.backends.cudnn.benchmark = False\n",
    )
    .unwrap();
    let program = format!(
        r#"
import oomshim.torch as ot
for row in ot.unservable_uses([{train:?}]):
    print(*row, sep=" | ")
print("-")
for row in ot.unservable_uses([{train:?}, "--config", {conf:?}]):
    print(*row, sep=" | ")
print("--")
print(ot.unservable_uses([{serve:?}, "--lr", "0.1"]))
print(ot.unservable_uses(["-c", "--compile-mode", "reduce-overhead"]))
"#,
        train = dir.join("train.py").display().to_string(),
        conf = dir.join("conf.yaml").display().to_string(),
        serve = clean.join("serve.py").display().to_string(),
    );
    let out = python(&e, &program, &[]);
    let text = ok(&out);
    // As the messages name a file: relative to the working directory when below it, else whole.
    let rel = |n: &str| {
        let p = dir.join(n);
        let cwd = std::env::current_dir().unwrap();
        p.strip_prefix(&cwd)
            .map(|r| r.display().to_string())
            .unwrap_or_else(|_| p.display().to_string())
    };
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            format!("{}:4 | torch.cuda.MemPool", rel("model.py")).as_str(),
            "-",
            format!(
                "{}:2 | torch.compile with CUDA graphs (mode=\"max-autotune\")",
                rel("conf.yaml")
            )
            .as_str(),
            format!("{}:4 | torch.cuda.MemPool", rel("model.py")).as_str(),
            "--",
            "[]",
            "[('the command line', 'torch.compile with CUDA graphs (mode=\"reduce-overhead\")')]",
        ]
    );
}

#[test]
fn oomshim_run_torch_allocator_keeps_torchs_allocator_for_a_program_that_asks_for_cuda_graphs() {
    let Some(e) = env() else { return };
    let side = common::python_side();
    let dir = e.tmp.path().join("graphs");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("serve.py");
    std::fs::write(
        &script,
        "import torch, oomshim.torch as ot\nf = torch.compile(lambda x: x, mode=\"reduce-overhead\")\nprint(ot.enabled(), torch.compiled[-1][\"mode\"])\n",
    )
    .unwrap();
    let run_in = |cwd: &std::path::Path, extra: &[(&str, &str)]| {
        let mut cmd = Command::new(&side.cli);
        cmd.args(["run", "--torch-allocator", "--dir"])
            .arg(e.tmp.path().join("dumps"));
        if !side.installed {
            cmd.arg("--lib").arg(&side.lib);
        }
        cmd.arg("--")
            .arg(&side.python)
            .arg(&script)
            .current_dir(cwd)
            .env("PYTHONPATH", side.pythonpath(&[&e.fake]))
            .env("SIM_CUDART", oomshim_cli::testbed::sim_cudart())
            .env_remove("OOMSHIM_LIB");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let run = |extra: &[(&str, &str)]| run_in(&dir, extra);
    // Read before the swap: torch keeps its allocator (and its CUDA graphs), one line says why.
    let out = run(&[]);
    assert_eq!(ok(&out).trim(), "False reduce-overhead");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        "oomshim: allocator mode is off for this process, torch keeps its own allocator (watched \
         as under LD_PRELOAD): serve.py:2 uses torch.compile with CUDA graphs \
         (mode=\"reduce-overhead\"), which torch cannot run on a pluggable allocator \
         (OOMSHIM_TORCH_ALLOCATOR=force overrides)"
    );
    // Run from a folder beside the program's: the file is named whole, not as `../…`.
    let elsewhere = e.tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let out = run_in(&elsewhere, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    let whole = format!(
        ": {}:2 uses torch.compile with CUDA graphs",
        script.display()
    );
    assert!(err.contains(&whole), "{whole}\n{err}");
    // Forced: allocator mode, and the compile goes on without CUDA graphs.
    let out = run(&[("OOMSHIM_TORCH_ALLOCATOR", "force")]);
    assert_eq!(ok(&out).trim(), "True default");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.trim().starts_with(
            "oomshim: torch.compile runs without CUDA graphs in allocator mode \
             (mode=\"reduce-overhead\" at serve.py:2 asked for them;"
        ),
        "{err}"
    );
}

#[test]
fn a_mempool_torch_refuses_is_served_and_the_program_goes_on() {
    // A library makes a MemPool the reading of the program did not see: torch refuses it under a
    // pluggable allocator ("pluggable does not yet support createOrIncrefPool"); allocator mode
    // serves it instead, and use_mem_pool works, inside a CUDA graph capture too.
    let Some(e) = env() else { return };
    let program = r#"
import torch, oomshim.torch as ot
ot.enable()
pool = torch.cuda.MemPool()
assert isinstance(pool, torch.cuda.MemPool) and pool.allocator is None, pool
assert pool.use_count() == 1
other = torch.cuda.graph_pool_handle()
assert pool.id[0] == 0 and pool.id != other, (pool.id, other)
before = ot.memory_allocated()
with torch.cuda.use_mem_pool(pool):
    assert pool.use_count() == 2
    a = torch._empty(3 << 20)
assert pool.use_count() == 1
assert ot.memory_allocated() == before + (3 << 20), "served by oomshim's allocator"
torch.cuda._capturing = True  # torch's use_mem_pool would have the capturing graph retain it
with torch.cuda.memory.use_mem_pool(pool):
    b = torch._empty(1000)
torch.cuda._capturing = False
assert pool.snapshot() == [] and torch.cuda.memory_snapshot(pool.id) == []
torch._free(a, 3 << 20)
torch._free(b, 1000)
assert ot.memory_allocated() == before
mine = torch.cuda.MemPool(allocator="their-allocator")
assert mine.allocator == "their-allocator" and mine.id not in (pool.id, other)
try:
    torch.cuda.MemPool(None, False, False, "one too many")
    raise SystemExit("a wrong call was accepted")
except TypeError:
    pass  # torch's own error for a wrong call stays
print("ok")
"#;
    let out = python(&e, program, &[]);
    assert_eq!(ok(&out).trim(), "ok");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "one line for pools, one for a pool's own allocator: {err}"
    );
    assert_eq!(
        lines[0],
        "oomshim: torch.cuda.MemPool is served by oomshim's allocator in allocator mode (torch \
         refuses it on a pluggable allocator: pluggable does not yet support createOrIncrefPool. \
         If you need it, please file an issue describing your use case.): its tensors come from \
         oomshim's cache, not a separate pool. Run without --torch-allocator to keep torch's pools."
    );
    assert!(
        lines[1]
            .contains("not a separate pool, and the allocator given to the pool is not called."),
        "{err}"
    );
}
