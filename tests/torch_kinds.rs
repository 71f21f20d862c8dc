//! Memory by kind at a torch OOM: oomshim's Python hook (shim/python/oomshim_hook/
//! kinds.py) counts parameters per model, gradients, optimizer state and activations, the phase,
//! the module and the batch, and the verdict words its headline and advice by the kind that
//! dominates. Against a stand-in `torch` whose tensors take real (simulated) device memory
//! through libsimcall.so, installed under a `site-packages` directory as real torch is (so its
//! frames count as the framework's, not the program's). Under plain LD_PRELOAD, `oomshim run` and
//! `oomshim run --torch-allocator` (the stand-in then has torch's pluggable-allocator API: its
//! tensors come from oomshim's allocator, and it calls no OOM observer, as torch does not under a
//! pluggable allocator).
//! The real torch is exercised on the GPU machine (tests/gpu/zoo, check_kinds.py).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fake torch with tensors that allocate device memory, modules that call their children and
/// run global and own forward hooks like `Module.__call__`, optimizers with state, and torch's
/// OOM path: a failed allocation calls the OOM observers on the allocating thread, then raises.
/// Once a pluggable allocator is current, tensors come from it through ctypes (which releases
/// the GIL, as torch does before it reaches the allocator), an allocation it refuses raises
/// without any observer, and the observer and statistics entry points raise, as torch's do.
const FAKE_TORCH: &str = r#"
import ctypes as _ct
__version__ = "0.0-fake-kinds"
_queued, _observers = [], []
_current = None
_ALLOC = _ct.CFUNCTYPE(_ct.c_void_p, _ct.c_size_t, _ct.c_int, _ct.c_void_p)
_INIT = _ct.CFUNCTYPE(None, _ct.c_int)
_initialized = False
_alloc = None          # _use_simcall sets it: bytes -> device pointer (0 when full)
_allocated = [0]
_count = [0]
_grad_enabled = [True]

class OutOfMemoryError(RuntimeError):
    pass

class dtype:
    def __init__(self, name, size):
        self.name, self.size = name, size
    def __str__(self):
        return "torch." + self.name
float32 = dtype("float32", 4)
bfloat16 = dtype("bfloat16", 2)

class device:
    def __init__(self, type, index):
        self.type, self.index = type, index

class _Storage:
    def __init__(self, ptr, n):
        self._ptr, self._n = ptr, n
    def data_ptr(self):
        return self._ptr
    def nbytes(self):
        return self._n

def _use_simcall(path):
    global _alloc
    sim = _ct.CDLL(path)
    sim.simcall_alloc.restype = _ct.c_void_p
    sim.simcall_alloc.argtypes = [_ct.c_size_t]
    _alloc = lambda n: sim.simcall_alloc(n) or 0

def _allocate(n):
    if _current is not None:
        p = _current.alloc(n, 0, None)
        if not p:
            raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes (pluggable)")
        return p
    p = _reserve(n)
    _allocated[0] += n
    _count[0] += 1
    return p

def _reserve(n):
    """A segment of torch's cache (one cudaMalloc): device memory that torch's count of its live
    tensors leaves out until a tensor is carved from it."""
    p = _alloc(n)
    if not p:
        for fn in _observers:
            fn(0, n, 2 << 30, 0)
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes")
    return p

class Tensor:
    def __init__(self, *shape, dtype=float32, _storage=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device("cuda", 0)
        self.grad = None
        n = 1
        for d in shape:
            n *= d
        self._numel = n
        self._s = _storage or _Storage(_allocate(n * dtype.size), n * dtype.size)
    def untyped_storage(self):
        return self._s
    def data_ptr(self):
        return self._s._ptr
    def dim(self):
        return len(self.shape)
    def numel(self):
        return self._numel
    def element_size(self):
        return self.dtype.size
    def view(self):
        return Tensor(*self.shape, dtype=self.dtype, _storage=self._s)
    def backward(self):
        from .autograd import _engine_run_backward
        _engine_run_backward(self)

def empty(*shape, dtype=float32):
    t = Tensor(*shape, dtype=dtype)
    _record(t)
    return t

# torch's cache, as far as the records go: `_cache_grow` reserves a segment (one cudaMalloc, at
# whatever line runs then), `empty_cached` carves a tensor from it (no cudaMalloc); with history
# on, each tensor is recorded with its frames (innermost first), as `_snapshot()` gives them.
_pool, _records, _history_on, _history_calls = [], [], [False], []

def _cache_grow(n):
    _pool.append([_allocate(n), n, 0])

def empty_cached(*shape, dtype=float32):
    n = dtype.size
    for d in shape:
        n *= d
    seg = next(s for s in _pool if s[1] - s[2] >= n)
    t = Tensor(*shape, dtype=dtype, _storage=_Storage(seg[0] + seg[2], n))
    seg[2] += n
    _record(t)
    return t

def _record(t):
    if _history_on[0]:
        import traceback
        stack = traceback.extract_stack()[:-2]
        frames = [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(stack)]
        _records.append({"address": t.data_ptr(), "size": t.untyped_storage().nbytes(),
                         "state": "active_allocated", "frames": frames})

def is_grad_enabled():
    return _grad_enabled[0]

class no_grad:
    def __enter__(self):
        self.before = _grad_enabled[0]
        _grad_enabled[0] = False
    def __exit__(self, *a):
        _grad_enabled[0] = self.before

class _C:
    @staticmethod
    def _cuda_isHistoryEnabled():
        return _history_on[0]
    @staticmethod
    def _cuda_attach_out_of_memory_observer(fn):
        if _current is not None:
            raise RuntimeError("CUDAPluggableAllocator does not yet support attachOutOfMemoryObserver.")
        _observers.append(fn)
    @staticmethod
    def _cuda_memoryStats(device):
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")
    @staticmethod
    def _current_autograd_node():
        from .autograd import _engine
        return getattr(_engine, "node", None)

class _Raw:
    def __init__(self):
        self.hooks = {}
    def set_init_fn(self, p): self.hooks["init"] = p
    def set_reset_fn(self, p): self.hooks["reset"] = p

class _Pluggable:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        lib = _ct.CDLL(path)
        self.alloc = _ALLOC(_ct.cast(getattr(lib, alloc_fn_name), _ct.c_void_p).value)
        self._allocator = _Raw()
    def allocator(self):
        return self._allocator

def _change_current_allocator(a):
    global _current
    if _initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    _current = a

def _flatten(nested, prefix, out):
    for k, v in nested.items():
        key = prefix + "." + k if prefix else k
        if isinstance(v, dict):
            _flatten(v, key, out)
        else:
            out[key] = v

class _Memory:
    CUDAPluggableAllocator = _Pluggable
    change_current_allocator = staticmethod(_change_current_allocator)
    @staticmethod
    def _snapshot():
        # One segment holding every live tensor, no free block.
        n = _allocated[0]
        seg = {"device": 0, "address": 1 << 32, "total_size": n, "stream": 0,
               "blocks": [{"address": 1 << 32, "size": n, "state": "active_allocated"}]}
        if _records:
            seg["blocks"] = list(_records)
        return {"segments": [seg] if n else [], "device_traces": [[]]}
    @staticmethod
    def _record_memory_history(**kw):
        _history_calls.append(kw)
        _history_on[0] = True

class cuda:
    memory = _Memory
    @staticmethod
    def _lazy_call(fn):
        if _initialized:
            fn()
        else:
            _queued.append(fn)
    @staticmethod
    def is_initialized():
        return _initialized
    @staticmethod
    def current_device():
        return 0
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def memory_stats(device=None):
        if _current is not None:
            out = {}
            _flatten(_C._cuda_memoryStats(0), "", out)
            return out
        return {"allocated_bytes.all.current": _allocated[0], "reserved_bytes.all.current": _allocated[0],
                "allocation.all.current": _count[0]}

def _fake_cuda_init():
    global _initialized
    _initialized = True
    if _current is not None and "init" in _current.allocator().hooks:
        _INIT(_current.allocator().hooks["init"])(1)
    for fn in _queued:
        fn()

from . import nn, optim
"#;

/// torch's backward pass: autograd's engine runs it on a thread of its own, where no frame of
/// the program is (here only torch's), with the node it runs current, while the program's
/// thread waits in `_engine_run_backward`; a failure there reaches the program as the raise.
/// The gradients it makes are the shapes in `_grad_shapes`.
const FAKE_AUTOGRAD: &str = r#"
import _thread
import threading as _threading
_engine = _threading.local()

def _engine_run_backward(t):
    done, failed = _threading.Event(), []
    def run():
        _engine.node = t
        try:
            from .. import Tensor
            t._grads = [Tensor(*shape) for shape in getattr(t, "_grad_shapes", [t.shape])]
        except BaseException as e:
            failed.append(e)
        finally:
            _engine.node = None
            done.set()
    _thread.start_new_thread(run, ())
    done.wait()
    if failed:
        raise failed[0]
"#;

const FAKE_NN: &str = r#"
from .. import Tensor, float32
from .modules import module as _m
from .modules.module import Module

class Parameter(Tensor):
    def __init__(self, *shape, dtype=float32):
        super().__init__(*shape, dtype=dtype)
"#;

const FAKE_MODULE: &str = r#"
_pre, _post, _always = {}, {}, set()
_next = [0]

class _Handle:
    def __init__(self, table, key):
        self.table, self.key = table, key
    def remove(self):
        self.table.pop(self.key, None)

def register_module_forward_pre_hook(hook):
    _next[0] += 1
    _pre[_next[0]] = hook
    return _Handle(_pre, _next[0])

def register_module_forward_hook(hook, *, always_call=False):
    _next[0] += 1
    _post[_next[0]] = hook
    if always_call:
        _always.add(_next[0])
    return _Handle(_post, _next[0])

class Module:
    def __init__(self):
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_forward_hooks", {})
        object.__setattr__(self, "training", True)
    def __setattr__(self, name, value):
        from .. import Tensor
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Tensor) and type(value).__name__ == "Parameter":
            self._parameters[name] = value
        object.__setattr__(self, name, value)
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(prefix + "." + name if prefix else name)
    def children(self):
        yield from self._modules.values()
    def parameters(self):
        for _, m in self.named_modules():
            yield from m._parameters.values()
    def register_forward_hook(self, hook):
        _next[0] += 1
        self._forward_hooks[_next[0]] = hook
        return _Handle(self._forward_hooks, _next[0])
    def eval(self):
        for _, m in self.named_modules():
            object.__setattr__(m, "training", False)
        return self
    def __call__(self, *args, **kwargs):
        return self._call_impl(*args, **kwargs)
    def _call_impl(self, *args, **kwargs):
        for h in list(_pre.values()):
            h(self, args)
        try:
            out = self.forward(*args, **kwargs)
        except Exception:
            for k, h in list(_post.items()):
                if k in _always:
                    h(self, args, None)
            raise
        for h in list(_post.values()):
            h(self, args, out)
        for h in list(self._forward_hooks.values()):
            h(self, args, out)
        return out
"#;

const FAKE_OPTIM: &str = r#"
from .optimizer import Optimizer

class SGD(Optimizer):
    def _update(self):
        pass

class Adam(Optimizer):
    def _update(self):
        from .. import Tensor
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.setdefault(p, {})
                if not st:
                    st["exp_avg"] = Tensor(*p.shape, dtype=p.dtype)
                    st["exp_avg_sq"] = Tensor(*p.shape, dtype=p.dtype)
"#;

const FAKE_OPTIMIZER: &str = r#"
_post_hooks = []

def register_optimizer_step_post_hook(hook):
    _post_hooks.append(hook)

class Optimizer:
    def __init__(self, params):
        self.param_groups = [{"params": list(params)}]
        self.state = {}
    def zero_grad(self, set_to_none=True):
        if set_to_none:
            for g in self.param_groups:
                for p in g["params"]:
                    p.grad = None
    def step(self):
        self._update()
        if getattr(self, "_grow_cache", 0):
            from .. import _cache_grow
            _cache_grow(self._grow_cache)   # torch's cache grows during the step
        for h in list(_post_hooks):
            h(self, (), {})
"#;

struct Env {
    _tmp: tempfile::TempDir,
    site: PathBuf,
    dumps: PathBuf,
    simcall: PathBuf,
}

fn env() -> Option<Env> {
    if Command::new(&common::python_side().python)
        .arg("-c")
        .arg("pass")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 is needed for these tests in CI"
        );
        eprintln!("SKIPPED: python3 not found");
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let site = tmp.path().join("site-packages");
    for (name, text) in [
        ("torch/__init__.py", FAKE_TORCH),
        ("torch/autograd/__init__.py", FAKE_AUTOGRAD),
        ("torch/nn/__init__.py", FAKE_NN),
        ("torch/nn/modules/__init__.py", "from . import module\n"),
        ("torch/nn/modules/module.py", FAKE_MODULE),
        ("torch/optim/__init__.py", FAKE_OPTIM),
        ("torch/optim/optimizer.py", FAKE_OPTIMIZER),
    ] {
        let path = site.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let simcall = common::build_simcall(tmp.path())?;
    let dumps = tmp.path().join("dumps");
    Some(Env {
        site,
        dumps,
        simcall,
        _tmp: tmp,
    })
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Launcher {
    Preload,
    Run,
    /// `oomshim run --torch-allocator`.
    Allocator,
}

/// The start of every program: torch's tensors take simulated device memory (through torch's
/// own code, as real torch's do: no frame of the program sits between a tensor and the device).
const PRELUDE: &str = r#"
import sys
MiB = 1 << 20
import torch
from torch import nn
torch._use_simcall(sys.argv[1])
torch._fake_cuda_init()
"#;

fn run(e: &Env, launcher: Launcher, body: &str) -> Output {
    run_with(e, launcher, body, &[])
}

/// The command that runs `body` (after [`PRELUDE`]) under `launcher` against the stand-in torch
/// on a simulated device of 2 GiB, its dumps into `e.dumps`: each case adds what it needs (its
/// environment, its pipes).
fn command(e: &Env, launcher: Launcher, body: &str) -> Command {
    let side = common::python_side();
    let mut cmd = match launcher {
        Launcher::Preload => {
            let mut c = Command::new(&side.python);
            c.env("LD_PRELOAD", &side.lib).env("OOMSHIM_DIR", &e.dumps);
            c
        }
        Launcher::Run | Launcher::Allocator => {
            let mut c = Command::new(&side.cli);
            c.arg("run");
            if launcher == Launcher::Allocator {
                c.arg("--torch-allocator");
            }
            c.arg("--dir").arg(&e.dumps).arg("--");
            c.arg(&side.python);
            c.env_remove("LD_PRELOAD");
            c
        }
    };
    let program = format!("{PRELUDE}{body}");
    cmd.args(["-c", &program, e.simcall.to_str().unwrap()])
        .env("PYTHONPATH", &e.site)
        .env("SIMCUDA_CAPACITY", "2G")
        .env_remove("OOMSHIM_TORCH_HOOK");
    cmd
}

/// [`run`] with `extra` in the program's environment.
fn run_with(e: &Env, launcher: Launcher, body: &str, extra: &[(&str, &str)]) -> Output {
    let _ = std::fs::remove_dir_all(&e.dumps);
    let mut cmd = command(e, launcher, body);
    cmd.envs(extra.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait_with_watchdog(cmd, std::time::Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{launcher:?}: stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("python hook"),
        "the hook said something went wrong: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn the_dump(dir: &Path) -> (PathBuf, dump::model::Dump) {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("oomshim-torch-")
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let d = dump::read::read_dump(&found[0]).unwrap();
    (found[0].clone(), d)
}

fn report(path: &Path) -> String {
    let out = Command::new(&common::python_side().cli)
        .arg("report")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const MIB: u64 = 1 << 20;

/// The dump's memory by kind, which every dump of these programs has (the hook ran at the failure).
fn kinds_of(d: &dump::model::Dump) -> &dump::model::Kinds {
    d.framework
        .as_ref()
        .and_then(|f| f.kinds.as_ref())
        .unwrap_or_else(|| panic!("no memory by kind in the dump: {:#?}", d.framework))
}

/// Each program under both launchers: its dump, the report, stderr.
fn each_launcher(body: &str, check: impl Fn(Launcher, &dump::model::Dump, &str, &str)) {
    each_launcher_with(body, &[], check)
}

/// [`each_launcher`] with `extra` in the program's environment.
fn each_launcher_with(
    body: &str,
    extra: &[(&str, &str)],
    check: impl Fn(Launcher, &dump::model::Dump, &str, &str),
) {
    each_launcher_out(body, extra, |launcher, d, report, err, _| {
        check(launcher, d, report, err)
    })
}

/// [`each_launcher_with`], the check also given the program's stdout.
fn each_launcher_out(
    body: &str,
    extra: &[(&str, &str)],
    check: impl Fn(Launcher, &dump::model::Dump, &str, &str, &str),
) {
    let Some(e) = env() else { return };
    for launcher in [Launcher::Preload, Launcher::Run, Launcher::Allocator] {
        let out = run_with(&e, launcher, body, extra);
        let (path, d) = the_dump(&e.dumps);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if launcher == Launcher::Allocator {
            // oomshim's allocator served torch and wrote the dump at the failure, and the kinds
            // are in it (no side file: the_dump takes the only dump there is).
            assert_eq!(
                d.failed_request.as_ref().map(|r| r.api.as_str()),
                Some("oomshim_torch_alloc"),
                "{err}"
            );
            assert_eq!(d.free_blocks.source, "oomshim-allocator");
            assert_eq!(std::fs::read_dir(&e.dumps).unwrap().count(), 1, "{err}");
        }
        common::assert_single_spaced(&serde_json::to_value(&d).unwrap(), &format!("{launcher:?}"));
        // The stderr line says what the dump says.
        let top = &d.verdict.findings[0];
        assert!(
            err.contains(&format!("{}: {}", top.kind, top.headline)),
            "{launcher:?}\n{err}\n{top:#?}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        check(launcher, &d, &report(&path), &err, &stdout);
    }
}

const BATCH_TOO_BIG: &str = r#"
class Attention(nn.Module):
    def forward(self, x):
        # 8 MiB of activations per sample, kept for backward
        return torch.empty(x.shape[0], 2 * MiB)
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.w = nn.Parameter(4 * MiB)  # 16 MiB of float32 weights
    def forward(self, x):
        self.kept = self.attn(x)
        return x
class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(4):
            setattr(self, str(i), Block())
    def forward(self, x):
        for b in self._modules.values():
            x = b(x)
        return x
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = Blocks()
    def forward(self, input_ids):
        return self.blocks(input_ids)
model = Net()
opt = torch.optim.SGD(model.parameters())
x = torch.empty(64, 16)
try:
    model(x)
except torch.OutOfMemoryError:
    print("oom")
"#;

#[test]
fn a_batch_too_big_is_activations_in_the_forward_of_a_module_with_the_batch_that_fits() {
    each_launcher(BATCH_TOO_BIG, |launcher, d, report, _| {
        let k = d
            .framework
            .as_ref()
            .and_then(|f| f.kinds.as_ref())
            .unwrap_or_else(|| panic!("{launcher:?}: no kinds in {:#?}", d.framework));
        assert_eq!(k.parameters_bytes, 64 * MIB, "{k:#?}");
        assert_eq!(k.gradients_bytes, 0);
        assert_eq!(k.optimizer_state_bytes, 0);
        // Three blocks' activations (512 MiB each) and the input.
        assert_eq!(k.activations_bytes, Some(3 * 512 * MIB + 64 * 16 * 4));
        assert_eq!(k.phase.as_deref(), Some("forward"));
        let m = k.module.as_ref().unwrap();
        assert_eq!(
            (m.class.as_str(), m.path.as_deref()),
            ("Attention", Some("blocks.3.attn"))
        );
        assert_eq!(k.batch, Some(64));
        assert_eq!(k.input_shape, vec![64, 16]);
        assert_eq!(k.models.len(), 1);
        assert_eq!(k.models[0].class, "Net");
        assert_eq!(k.models[0].dtypes.get("float32"), Some(&(64 * MIB)));
        let top = &d.verdict.findings[0];
        assert_eq!(top.kind, "own_allocations");
        assert!(
            top.headline
                .starts_with("activations and other live tensors fill device 0: 1.50 GiB of the"),
            "{}",
            top.headline
        );
        assert!(
            top.headline
                .contains("in the forward pass, in Attention.forward (<string>:"),
            "{}",
            top.headline
        );
        assert!(
            top.headline
                .contains("at `blocks.3.attn`, batch 64 (64×16)"),
            "{}",
            top.headline
        );
        let advice = d.verdict.suggestions.join("\n");
        // (1.5 GiB held + the 512 MiB request) / 64 = 32 MiB a sample; the failing module is the
        // last of the model's four leaves, so that is the whole pass's rate; the model is in
        // training mode, so its backward needs one and a half leaves' more (8 MiB each): 44 MiB.
        assert_eq!(
            k.forward_progress,
            Some(dump::model::ForwardProgress {
                leaves_before: 3,
                leaves_in_module: 1,
                leaves: 4,
                // The leaves are of no kind the hook sizes: each keeps the input's 16 a sample.
                elements_before: Some(48),
                elements_in_module: Some(16),
                elements: Some(64),
                failing_leaf_io: Some(32),
                largest_leaf_io: Some(32),
                widest_leaf_elements: Some(16),
                last_leaf_elements: Some(16),
            })
        );
        assert!(
            advice.contains("The batch of 64 failed 100% of the way through its forward pass")
                && advice.contains(
                    "about 44.00 MiB per sample for the whole pass and the backward's gradients"
                ),
            "{advice}"
        );
        let fits: u64 = advice
            .split("so a batch of about ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{advice}"));
        // The device's 2 GiB less the 64 MiB of weights, at 44 MiB a sample: at most 45.
        assert!((25..=45).contains(&fits), "{advice}");
        assert!(advice.contains("Gradient checkpointing"), "{advice}");
        assert!(advice.contains("autocast"), "{advice}");
        assert!(report.contains("By kind"), "{report}");
        assert!(report.contains("activations"), "{report}");
    });
}

/// A backward pass that does not fit: it fails on autograd's thread, where neither the program's
/// line nor the batch is on the stack. The dump still has both: the line that called
/// `backward()` (from the thread waiting in it) and the batch of the model's last forward; and
/// since "activations and other live tensors" is everything but the weights, gradients and
/// optimizer state, the headline names the line that holds most of it.
const BACKWARD_DOES_NOT_FIT: &str = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(4 * MiB)   # 16 MiB of weights
    def forward(self, x):
        self.kept = torch.empty(x.shape[0], 2 * MiB)   # 8 MiB a sample, kept for backward
        return self.kept
model = Net()
buffer = torch.empty(256 * MiB)   # 1 GiB: the largest holder
out = model(torch.empty(64, 16))
out._grad_shapes = [(64, 2 * MiB), (64, 2 * MiB)]
try:
    out.backward()
except torch.OutOfMemoryError:
    print("oom")
"#;

#[test]
fn a_backward_pass_that_does_not_fit_names_the_backward_call_its_batch_and_the_largest_holder() {
    let buffer = line_of(BACKWARD_DOES_NOT_FIT, "buffer = ");
    let backward = line_of(BACKWARD_DOES_NOT_FIT, "out.backward()");
    // The batch of a backward pass is the last forward's, which only the forward marks see
    // (OOMSHIM_AUTO_STEPS=forward). Without them the dump says no batch rather than a stale one,
    // and the rest is the same.
    each_launcher(BACKWARD_DOES_NOT_FIT, |launcher, d, _, _| {
        let k = kinds_of(d);
        assert_eq!(k.phase.as_deref(), Some("backward"), "{launcher:?} {k:#?}");
        assert!(k.input_shape.is_empty() && k.batch.is_none(), "{k:#?}");
        let program = k.program_frame.as_ref().unwrap();
        assert_eq!(program.line, backward, "{launcher:?} {k:#?}");
        assert!(d.verdict.findings[0].headline.contains(&format!(
            "; the largest holder: 1.00 GiB at <module> (<string>:{buffer})"
        )));
    });
    let forward = [("OOMSHIM_AUTO_STEPS", "forward")];
    each_launcher_with(
        BACKWARD_DOES_NOT_FIT,
        &forward,
        |launcher, d, report, err| {
            let k = kinds_of(d);
            assert_eq!(k.phase.as_deref(), Some("backward"), "{launcher:?} {k:#?}");
            assert_eq!(k.input_shape, vec![64, 16], "{launcher:?} {k:#?}");
            assert_eq!(k.batch, Some(64));
            let program = k
                .program_frame
                .as_ref()
                .unwrap_or_else(|| panic!("{launcher:?} {k:#?}"));
            assert_eq!(program.line, backward, "{launcher:?} {k:#?}");
            let top = &d.verdict.findings[0];
            assert_eq!(top.kind, "own_allocations");
            let want = [
                "activations and other live tensors fill device 0: ".to_string(),
                format!("; the largest holder: 1.00 GiB at <module> (<string>:{buffer})"),
                "; in the backward pass, batch 64 (64×16); the 512.00 MiB request at ".to_string(),
                format!("(<string>:{backward}) failed"),
            ];
            for w in &want {
                assert!(
                    top.headline.contains(w.as_str()),
                    "{launcher:?}: want {w:?} in\n{}",
                    top.headline
                );
            }
            assert!(err.contains(&top.headline), "{launcher:?}\n{err}");
            assert!(report.contains(&format!("<string>:{buffer}")), "{report}");
        },
    );
}

#[test]
fn a_model_loaded_twice_is_named_a_duplicate() {
    let body = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(64 * MiB)   # 256 MiB
        self.b = nn.Parameter(64 * MiB)
        self.c = nn.Parameter(64 * MiB)
    def forward(self, x):
        return torch.empty(x.shape[0], 150 * MiB)  # 600 MiB
model = Net()
again = Net()   # loaded a second time, never run
try:
    model(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher(body, |launcher, d, report, _| {
        let k = kinds_of(d);
        assert_eq!(k.parameters_bytes, 1536 * MIB, "{launcher:?} {k:#?}");
        assert_eq!(k.models.len(), 2, "{k:#?}");
        assert_eq!(k.models[1].duplicate_of, Some(0));
        let top = &d.verdict.findings[0];
        let words = "the Net model is held twice (2 × 768.00 MiB, identical parameter shapes)";
        assert!(
            top.headline
                .starts_with("parameters (the weights) fill device 0: 1.50 GiB")
                && top.headline.contains(words),
            "{}",
            top.headline
        );
        assert!(
            d.verdict.suggestions[0]
                .starts_with("The Net model is held twice: 1 more copy holds 768.00 MiB"),
            "{:#?}",
            d.verdict.suggestions
        );
        assert!(flat(report).contains(words), "{report}");
    });
}

#[test]
fn adam_state_twice_the_weights_is_named_against_them() {
    let body = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(50 * MiB)   # 200 MiB
        self.b = nn.Parameter(50 * MiB)
    def forward(self, x):
        self.h1 = torch.empty(x.shape[0], 75 * MiB)  # 300 MiB each
        self.h2 = torch.empty(x.shape[0], 75 * MiB)
        self.h3 = torch.empty(x.shape[0], 75 * MiB)
        return self.h3
model = Net()
opt = torch.optim.Adam(model.parameters())
for p in model.parameters():
    p.grad = torch.empty(*p.shape)   # backward
opt.step()                            # Adam's two moments: 800 MiB
opt.zero_grad(set_to_none=True)
try:
    model(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher(body, |launcher, d, _, _| {
        let k = kinds_of(d);
        assert_eq!(k.optimizer_state_bytes, 800 * MIB, "{launcher:?} {k:#?}");
        assert_eq!(k.optimizers.len(), 1);
        assert_eq!(k.optimizers[0].class, "Adam");
        assert_eq!(k.optimizers[0].param_bytes, 400 * MIB);
        assert_eq!(k.found_by.as_deref(), Some("hooks"));
        let top = &d.verdict.findings[0];
        assert!(
            top.headline.starts_with(
                "Adam's optimizer state (2.0× the weights it steps) fill device 0: 800.00 MiB"
            ),
            "{}",
            top.headline
        );
        let advice = &d.verdict.suggestions[0];
        assert!(
            advice.contains("Adam's state is 800.00 MiB, 2.0× the 400.00 MiB of weights it steps")
                && advice.contains("8-bit")
                && advice.contains("ZeRO"),
            "{advice}"
        );
    });
}

#[test]
fn gradients_never_zeroed_are_said_to_be_kept() {
    let body = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(4):
            setattr(self, f"w{i}", nn.Parameter(32 * MiB))  # 128 MiB each
    def forward(self, x):
        self.acts = [torch.empty(x.shape[0], 64 * MiB) for _ in range(4)]  # 256 MiB each
        return self.acts[-1]
model = Net()
opt = torch.optim.SGD(model.parameters())
for p in model.parameters():
    p.grad = torch.empty(*p.shape)   # backward
opt.step()                            # and never zero_grad
try:
    model(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher(body, |launcher, d, _, _| {
        let k = kinds_of(d);
        assert_eq!(k.gradients_bytes, 512 * MIB, "{launcher:?} {k:#?}");
        assert_eq!(k.parameters_bytes, 512 * MIB);
        assert_eq!(k.phase.as_deref(), Some("forward"));
        let advice = d.verdict.suggestions.join("\n");
        assert!(
            advice.contains("Gradients of 512.00 MiB are still live in the forward pass")
                && advice.contains("zero_grad(set_to_none=True)"),
            "{advice}"
        );
    });
}

#[test]
fn a_forward_hook_that_keeps_outputs_is_named_as_the_keeper() {
    let body = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = Head()
    def forward(self, x):
        return self.fc(x)
class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(MiB)
    def forward(self, x):
        return torch.empty(x.shape[0], 24 * MiB)  # 96 MiB
outputs = {}
def keep(module, args, output):
    outputs[len(outputs)] = output
model = Net()
model.fc.register_forward_hook(keep)
try:
    for step in range(100):
        model(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    let line = format!("{PRELUDE}{body}")
        .lines()
        .position(|l| l.starts_with("def keep"))
        .unwrap() as u32
        + 1;
    // An evaluation loop, no optimizer: its forward passes are the steps the leak is counted
    // in, which the hook marks when asked (OOMSHIM_AUTO_STEPS=forward; without, the shim detects
    // steps of its own, later and with fewer samples).
    each_launcher_with(
        body,
        &[("OOMSHIM_AUTO_STEPS", "forward")],
        |launcher, d, report, _| {
            let k = kinds_of(d);
            assert_eq!(k.forward_hooks.len(), 1, "{launcher:?} {k:#?}");
            let h = &k.forward_hooks[0];
            assert_eq!((h.function.as_str(), h.module.as_str()), ("keep", "fc"));
            assert_eq!(h.line, line, "the hook's own line in the program");
            let top = &d.verdict.findings[0];
            assert_eq!(top.kind, "leak", "{:#?}", d.verdict);
            assert!(
                top.headline.ends_with(&format!(
                "possibly kept by keep (<string>:{line}), a forward hook of the program on `fc`"
            )),
                "{}",
                top.headline
            );
            assert!(
                d.verdict
                    .suggestions
                    .iter()
                    .any(|s| s.contains("detach().cpu()")),
                "{:#?}",
                d.verdict.suggestions
            );
            assert!(report.contains("By kind"), "{report}");
        },
    );
}

#[test]
fn memory_outside_any_step_is_found_without_hooks() {
    // An OOM while loading: no forward and no step seen yet; the model is found at the failure.
    let body = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = []
        for i in range(40):
            setattr(self, f"w{i}", nn.Parameter(16 * MiB))  # 64 MiB each
model = None
try:
    model = Net()
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher(body, |launcher, d, _, _| {
        let k = kinds_of(d);
        assert_eq!(k.phase.as_deref(), Some("outside"), "{launcher:?} {k:#?}");
        assert_eq!(k.found_by.as_deref(), Some("gc"));
        // The model under construction is found by the garbage collector's walk: every live
        // tensor is one of its parameters.
        assert!(k.parameters_bytes >= 1536 * MIB, "{k:#?}");
        assert_eq!(Some(k.parameters_bytes), k.torch_allocated_bytes);
        assert_eq!(k.models[0].class, "Net");
        assert!(
            d.verdict.findings[0]
                .headline
                .starts_with("parameters (the weights) fill device 0"),
            "{}",
            d.verdict.findings[0].headline
        );
    });
}

#[test]
fn an_oom_caught_in_the_optimizer_step_gets_its_kinds_and_the_programs_observer_is_called() {
    // The program catches the error outside any forward (Adam's first step), and has its own
    // OOM observer. In allocator mode torch calls no observer under a pluggable allocator: oomshim's
    // allocator calls both the hook's (the kinds join the dump written at the failure, and the
    // stderr line) and the program's, with torch's arguments.
    let body = r#"
seen = []
torch._C._cuda_attach_out_of_memory_observer(lambda d, a, t, f: seen.append((d, a, t, f)))
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(128 * MiB)   # 512 MiB
        self.b = nn.Parameter(128 * MiB)   # 512 MiB
    def forward(self, x):
        return torch.empty(x.shape[0], 4)
model = Net()
opt = torch.optim.Adam(model.parameters())
model(torch.empty(1, 4))
model.a.grad = torch.empty(128 * MiB)   # 512 MiB: only `a` got a gradient
try:
    opt.step()                          # Adam's first moment of `a`: 512 MiB more
except torch.OutOfMemoryError:
    print("oom in step")
assert len(seen) == 1, seen
d, a, t, f = seen[0]
assert (d, a, t) == (0, 512 * MiB, 2 << 30), seen
print("observed")
"#;
    each_launcher(body, |launcher, d, _, _| {
        let k = d
            .framework
            .as_ref()
            .and_then(|f| f.kinds.as_ref())
            .unwrap_or_else(|| panic!("{launcher:?}: no kinds in {:#?}", d.framework));
        assert_eq!(k.phase.as_deref(), Some("optimizer"), "{launcher:?} {k:#?}");
        assert_eq!(k.parameters_bytes, 1024 * MIB);
        assert_eq!(k.gradients_bytes, 512 * MIB);
        assert_eq!(k.optimizer_state_bytes, 0);
        let top = &d.verdict.findings[0];
        assert!(
            top.headline
                .starts_with("parameters (the weights) fill device 0: 1.00 GiB"),
            "{launcher:?} {}",
            top.headline
        );
        assert!(
            top.headline.contains("in the optimizer step"),
            "{}",
            top.headline
        );
    });
}

/// The line of `body` (in the program PRELUDE + body) that starts with `start` (trimmed), 1-based.
fn line_of(body: &str, start: &str) -> u32 {
    format!("{PRELUDE}{body}")
        .lines()
        .position(|l| l.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no line {start}")) as u32
        + 1
}

/// A model whose forward's output takes 96 MiB a sample (its weights 4 MiB).
const NET_96_MIB: &str = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(MiB)
    def forward(self, x):
        return torch.empty(x.shape[0], 24 * MiB)  # 96 MiB
"#;

/// `body`, an evaluation loop that keeps each forward's output, under each launcher: the leak is
/// the top finding and names its keeper, `(container, name, scope)`, at the line of `body` that
/// starts with `grows_at`, in the dump and in the headline (`; held in container `name`
/// (<string>:LINE, scope: `). `more` checks the rest, given the line.
fn leak_kept_by(
    body: &str,
    grows_at: &str,
    keeper: (&str, &str, &str),
    more: impl Fn(Launcher, &dump::model::Keeper, &dump::model::Finding, u32),
) {
    let line = line_of(body, grows_at);
    // An evaluation loop, no optimizer: its forward passes are the steps the leak is counted
    // in, which the hook marks when asked (OOMSHIM_AUTO_STEPS=forward; without, the shim detects
    // steps of its own, later and with fewer samples).
    each_launcher_with(
        body,
        &[("OOMSHIM_AUTO_STEPS", "forward")],
        |launcher, d, _, _| {
            let k = kinds_of(d);
            let top = &d.verdict.findings[0];
            assert_eq!(top.kind, "leak", "{launcher:?} {:#?}", d.verdict);
            let found = k
                .keepers
                .first()
                .unwrap_or_else(|| panic!("{launcher:?} {k:#?}"));
            assert_eq!(
                (
                    found.container.as_str(),
                    found.name.as_str(),
                    found.scope.as_str()
                ),
                keeper,
                "{launcher:?} {k:#?}"
            );
            assert_eq!(found.line, Some(line), "{launcher:?} {found:#?}");
            let (container, name, scope) = keeper;
            assert!(
                top.headline.contains(&format!(
                    "; held in {container} `{name}` (<string>:{line}, {scope}: "
                )),
                "{launcher:?} {}",
                top.headline
            );
            more(launcher, found, top, line);
        },
    );
}

#[test]
fn a_leak_names_the_global_list_that_keeps_it_at_the_line_that_grows_it() {
    let body = format!(
        r#"{NET_96_MIB}model = Net()
history = []
unrelated = [1, 2, 3]
try:
    for step in range(100):
        out = model(torch.empty(1, 4))
        history.append(out)
except torch.OutOfMemoryError:
    print("oom")
"#
    );
    let keeper = ("list", "history", "a global of __main__");
    leak_kept_by(
        &body,
        "history.append(out)",
        keeper,
        |launcher, found, top, line| {
            assert_eq!(found.file.as_deref(), Some("<string>"));
            assert_eq!(found.bytes, found.tensors * 96 * MIB, "{found:#?}");
            assert!(found.tensors >= 10, "{found:#?}");
            let held = format!(
            "; held in list `history` (<string>:{line}, a global of __main__: {} in {} tensors)",
            dump::units::human_bytes(found.bytes),
            found.tensors
        );
            assert!(
                top.headline.ends_with(&held),
                "{launcher:?}\n{}\n{held}",
                top.headline
            );
        },
    );
}

#[test]
fn a_leak_names_the_local_dict_of_a_function_that_keeps_it() {
    let body = format!(
        r#"{NET_96_MIB}def train(model):
    preds = {{}}
    for step in range(100):
        x = torch.empty(1, 4)
        preds[step] = model(x)
try:
    train(Net())
except torch.OutOfMemoryError:
    print("oom")
"#
    );
    let keeper = ("dict", "preds", "a local of train");
    leak_kept_by(&body, "preds[step] = model(x)", keeper, |_, _, _, _| {});
}

/// Starts `body` (after [`PRELUDE`]) under plain preload or in allocator mode, publishing its
/// live region into `live` every 100 ms, with stdin and stdout piped: the child, and the first
/// line it printed (the programs print `ready` once there is something to see, then wait for a
/// line on stdin).
fn start_with_live_region(
    e: &Env,
    launcher: Launcher,
    body: &str,
    live: &Path,
) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = command(e, launcher, body)
        .env("OOMSHIM_LIVE_DIR", live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    (child, first)
}

#[test]
fn top_and_the_exporter_show_memory_by_kind_counted_at_an_optimizer_step() {
    // The hook counts the kinds at an optimizer step (at most every 10 s, here the first step)
    // and hands them to the shim, whose live region carries them to `oomshim top` and the
    // exporter's `oomshim_gpu_memory_bytes{kind=...}`.
    use std::io::Write;
    let Some(e) = env() else { return };
    let body = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(16 * MiB)   # 64 MiB
    def forward(self, x):
        return torch.empty(x.shape[0], 4 * MiB)   # 16 MiB a sample
model = Net()
opt = torch.optim.Adam(model.parameters())
for step in range(3):
    out = model(torch.empty(2, 4))
    model.a.grad = torch.empty(16 * MiB)   # 64 MiB each step, the last one live
    opt.step()                             # Adam's moments: 128 MiB
print("ready", flush=True)
sys.stdin.readline()
"#;
    let side = common::python_side();
    for launcher in [Launcher::Preload, Launcher::Allocator] {
        let live = e.dumps.with_file_name(format!("live-{launcher:?}"));
        std::fs::create_dir_all(&live).unwrap();
        let (mut child, first) = start_with_live_region(&e, launcher, body, &live);
        let cli = |args: &[&str]| {
            let out = Command::new(&side.cli)
                .args(args)
                .arg(&live)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let start = std::time::Instant::now();
        let (mut metrics, mut top) = (String::new(), String::new());
        while first == "ready" && start.elapsed() < std::time::Duration::from_secs(20) {
            metrics = cli(&["exporter", "--once", "--dir"]);
            top = cli(&["top", "--once", "--dir"]);
            if metrics.contains("oomshim_gpu_memory_bytes{") && top.contains("by kind") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let _ = child.stdin.take().unwrap().write_all(b"\n");
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            first,
            "ready",
            "{launcher:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{launcher:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value = |kind: &str| -> u64 {
            metrics
                .lines()
                .find(|l| {
                    l.starts_with("oomshim_gpu_memory_bytes{")
                        && l.contains(&format!("kind=\"{kind}\""))
                        && l.contains("device=\"0\"")
                })
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{launcher:?}: no {kind} in\n{metrics}"))
        };
        assert_eq!(value("parameters"), 64 * MIB, "{launcher:?}");
        assert_eq!(value("gradients"), 64 * MIB, "{launcher:?}");
        assert_eq!(value("optimizer_state"), 128 * MIB, "{launcher:?}");
        assert!(value("activations") >= 32 * MIB, "{launcher:?}\n{metrics}");
        assert!(
            metrics.contains("# TYPE oomshim_gpu_memory_bytes gauge")
                && metrics.contains("oomshim_gpu_memory_kinds_age_seconds{"),
            "{metrics}"
        );
        assert!(
            top.contains("by kind on device 0 (")
                && top.contains("parameters 64.00 MiB, gradients 64.00 MiB, optimizer state 128.00 MiB, activations "),
            "{launcher:?}\n{top}"
        );
    }
}

#[test]
fn top_shows_the_last_failure_with_its_verdict_under_preload_and_in_allocator_mode() {
    // A failed allocation reaches the live region at once (`oomshim top`'s "last failure"),
    // then the dump's path and headline once it is written: the same in both launchers.
    use std::io::Write;
    let Some(e) = env() else { return };
    let body = r#"
keep = [torch.empty(64 * MiB) for _ in range(6)]   # 1.5 GiB of the 2 GiB device
try:
    torch.empty(256 * MiB)                         # 1 GiB: does not fit
except torch.OutOfMemoryError:
    print("ready", flush=True)
sys.stdin.readline()
"#;
    let side = common::python_side();
    for launcher in [Launcher::Preload, Launcher::Allocator] {
        let _ = std::fs::remove_dir_all(&e.dumps);
        let live = e.dumps.with_file_name(format!("live-failure-{launcher:?}"));
        std::fs::create_dir_all(&live).unwrap();
        let (mut child, first) = start_with_live_region(&e, launcher, body, &live);
        let start = std::time::Instant::now();
        let mut top = String::new();
        // The dump is final once torch raised ("ready"); the region may show its provisional
        // dump's headline until the next publish.
        let final_headline = if first == "ready" {
            the_dump(&e.dumps).1.verdict.headline().to_string()
        } else {
            String::new()
        };
        while first == "ready" && start.elapsed() < std::time::Duration::from_secs(20) {
            let out = Command::new(&side.cli)
                .args(["top", "--once", "--dir"])
                .arg(&live)
                .output()
                .unwrap();
            top = String::from_utf8_lossy(&out.stdout).into_owned();
            if top.contains(&format!("{final_headline}  (dump ")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let _ = child.stdin.take().unwrap().write_all(b"\n");
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(first, "ready", "{launcher:?}: {stderr}");
        assert!(out.status.success(), "{launcher:?}: {stderr}");
        let (path, dump) = the_dump(&e.dumps);
        let line = top
            .lines()
            .find(|l| l.trim_start().starts_with("last failure: 1.00 GiB of "))
            .unwrap_or_else(|| panic!("{launcher:?}: no last failure in\n{top}"));
        assert!(
            line.contains(&format!(
                ": {}  (dump {})",
                dump.verdict.headline(),
                path.display()
            )),
            "{launcher:?}: {line}"
        );
    }
}

/// A model whose optimizer step grows the stand-in's cache by 16 MiB (new segments cut there),
/// and the list the training loops below keep a tensor a step in: the two tests that follow.
const KEPT_FROM_STEP_SEGMENTS: &str = r#"class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(MiB)
model = Net()
opt = torch.optim.SGD(model.parameters())
opt._grow_cache = 16 * MiB
kept = []"#;

#[test]
fn a_post_mortem_names_the_line_that_keeps_tensors_carved_from_segments_of_the_optimizer_step() {
    // Under preload the shim sees torch's segments: when the kept tensors are carved from
    // segments torch's cache reserved during the optimizer step, the growing site is the
    // `opt.step()` line. Once the process grows, the hook turns torch's history on and hands its
    // records to the live region with the kinds; a SIGKILL's post-mortem names the kept line.
    let body = format!(
        r#"
import os, signal, time
{KEPT_FROM_STEP_SEGMENTS}
for step in range(1, 100000):
    opt.step()
    kept.append(torch.empty_cached(4 * MiB))   # 16 MiB kept a step
    time.sleep(0.01)
    if step == 300:
        os.kill(os.getpid(), signal.SIGKILL)
"#
    );
    let body = body.as_str();
    let Some(e) = env() else { return };
    let kept = line_of(body, "kept.append(");
    let step = line_of(body, "opt.step()");
    let _ = std::fs::remove_dir_all(&e.dumps);
    let mut cmd = command(&e, Launcher::Run, body);
    cmd.env("SIMCUDA_CAPACITY", "16G")
        .env("OOMSHIM_LIVE_DIR", e.dumps.with_file_name("live-pm"))
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait_with_watchdog(cmd, std::time::Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    let (_, d) = the_dump(&e.dumps);
    assert_eq!(d.reason, "post_mortem", "{err}");
    let top = &d.verdict.findings;
    let leak = top
        .iter()
        .find(|f| f.kind == "leak")
        .unwrap_or_else(|| panic!("no leak in {:#?}\n{err}", d.verdict));
    assert!(
        leak.headline.starts_with(&format!(
            "leak: <module> (<string>:{kept}) holds the growth (100.0% of the tensors allocated since it began, by torch's records)"
        )),
        "{}\n{err}",
        leak.headline
    );
    let site = d
        .growth
        .as_ref()
        .and_then(|g| g.sites.first())
        .map(|s| oomshim_core::verdict::short_label(&s.stack));
    // The shim's own site is where the segments were reserved, the `opt.step()` line: what the
    // post-mortem named before.
    let site = site.unwrap_or_default();
    assert_eq!(site, format!("<module> (<string>:{step})"));
    assert_ne!(kept, step);
    let f = d
        .framework
        .as_ref()
        .expect("the live kinds and records in the post-mortem");
    assert!(f.kinds.is_some() && !f.raised);
    assert!(
        err.contains(&leak.headline) || err.contains(&top[0].headline),
        "{err}"
    );
}

#[test]
fn an_oom_names_the_line_that_keeps_tensors_carved_from_segments_of_the_optimizer_step() {
    // The post-mortem's case above, run to an out-of-memory error instead of a SIGKILL: the
    // dump at the failure names the kept line from torch's records too, where the shim's own
    // growing site is the stand-in's allocation reached from `opt.step()`, and the stderr line
    // says the same.
    let body = format!(
        r#"
{KEPT_FROM_STEP_SEGMENTS}
try:
    for step in range(1, 100000):
        opt.step()
        kept.append(torch.empty_cached(4 * MiB))   # 16 MiB kept a step
except torch.OutOfMemoryError:
    print("oom")
"#
    );
    let body = body.as_str();
    let Some(e) = env() else { return };
    let kept = line_of(body, "kept.append(");
    let out = run(&e, Launcher::Preload, body);
    let err = String::from_utf8_lossy(&out.stderr);
    let (_, d) = the_dump(&e.dumps);
    assert!(d.failed_request.is_some(), "{err}");
    let top = &d.verdict.findings[0];
    assert_eq!(top.kind, "leak", "{:#?}\n{err}", d.verdict);
    assert!(
        top.headline.starts_with(&format!(
            "<module> (<string>:{kept}) holds the growth (100.0% of the tensors allocated since it began, by torch's records)"
        )),
        "{}\n{err}",
        top.headline
    );
    let site = d
        .growth
        .as_ref()
        .and_then(|g| g.sites.first())
        .map(|s| oomshim_core::verdict::short_label(&s.stack))
        .unwrap_or_default();
    assert!(!site.contains(&format!(":{kept})")), "{site}");
    assert!(
        err.contains(&format!("{}: {}", top.kind, top.headline)),
        "{err}"
    );
}

/// An OOM-retry loop in the program's own function (halve the batch until it fits): each failed
/// batch is freed by the program's `del` as the next line runs, as without the shim. Reading the
/// function's locals at the failure (the keepers, the forward's `self` and input) must leave
/// nothing behind in its frame: CPython's `frame.f_locals` up to 3.12 would.
#[test]
fn an_oom_retry_loop_frees_each_failed_batch_at_its_del() {
    let body = r#"
import weakref
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(MiB)
    def forward(self, x):
        return torch.empty(x.shape[0], 256 * MiB)   # 1 GiB a sample
model = Net()
history = []
def fit(n):
    alive = []
    while True:
        x = torch.empty(n, 4)
        seen = weakref.ref(x)
        kept = [x]
        try:
            history.append(model(x))
            return n, alive
        except torch.OutOfMemoryError:
            pass
        del x, kept
        alive.append(seen() is not None)
        n //= 2
print(fit(8))
"#;
    let Some(e) = env() else { return };
    for launcher in [Launcher::Preload, Launcher::Run, Launcher::Allocator] {
        let out = run(&e, launcher, body);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "(1, [False, False, False])",
            "{launcher:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A curriculum under preload: the sequence grows by 4 MiB of input a step, and each step's
/// tensors go back into torch's cache, which keeps a segment for every size it served (what the
/// shim tracks grows by each new segment); `KEEP` is what the program keeps from each step
/// beyond that. The step's input is gone by the optimizer step (the forward and backward run
/// in a function of their own).
const CURRICULUM: &str = r#"
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(MiB)
    def forward(self, x):
        return x
model = Net()
opt = torch.optim.SGD(model.parameters())
cache = {}
kept = []

def carved(nbytes):
    # A tensor torch carves from its cache: live in its count, no new device memory.
    if nbytes not in cache:
        cache[nbytes] = torch._reserve(nbytes)
    torch._allocated[0] += nbytes
    torch._count[0] += 1
    return nbytes

def freed(nbytes):
    torch._allocated[0] -= nbytes
    torch._count[0] -= 1

def forward_backward(length):
    x = carved(length * MiB)
    y = carved(2 * length * MiB)   # the forward's activations
    freed(y)
    if KEEP:
        kept.append(torch.empty(KEEP * MiB // 4))
    freed(x)

try:
    for step in range(40):
        length = 4 * (step + 1)
        forward_backward(length)
        opt.step()
except torch.OutOfMemoryError:
    print("oom at length", length)
"#;

/// `KEEP` MiB kept from each step of [`CURRICULUM`], under plain preload and `oomshim run`
/// (in allocator mode oomshim's allocator is the cache, and what it tracks is tensors): the
/// verdict's kind, the stderr line saying what the dump says, and the report's `Why:`.
fn curriculum_verdicts(keep: u64, check: impl Fn(Launcher, &dump::model::Dump, &str)) {
    let Some(e) = env() else { return };
    let body = CURRICULUM.replace("kept = []", &format!("kept = []\nKEEP = {keep}"));
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = run(&e, launcher, &body);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("oom at length"),
            "{launcher:?}: {err}"
        );
        let (path, d) = the_dump(&e.dumps);
        let top = &d.verdict.findings[0];
        assert!(
            err.contains(&format!("{}: {}", top.kind, top.headline)),
            "{launcher:?}\n{err}\n{top:#?}"
        );
        let report = flat(&report(&path));
        assert!(
            report.contains(&format!("Why: {}", top.kind)),
            "{launcher:?}: {report}"
        );
        check(launcher, &d, &report);
    }
}

#[test]
fn a_sequence_that_grows_until_it_fails_is_no_leak_under_preload() {
    curriculum_verdicts(0, |launcher, d, report| {
        let g = d.growth.as_ref().unwrap();
        assert_eq!(g.steps.as_deref(), Some("optimizer"), "{launcher:?}");
        assert!(!g.framework_live.is_empty(), "{launcher:?} {g:#?}");
        assert_eq!(
            d.verdict.kind, "own_allocations",
            "{launcher:?} {:#?}",
            d.verdict
        );
        assert!(
            report.contains("what grew is torch's cache"),
            "{launcher:?}: {report}\n{g:?}"
        );
    });
}

#[test]
fn what_each_step_keeps_beside_a_growing_sequence_is_a_leak() {
    curriculum_verdicts(24, |launcher, d, _| {
        assert_eq!(d.verdict.kind, "leak", "{launcher:?} {:?}", d.growth);
        let fit = d.growth.as_ref().unwrap().fit.as_ref().unwrap();
        assert_eq!(fit.of.as_deref(), Some("framework_live"), "{launcher:?}");
        // The kept tensors, one a step: not the batch's growth.
        assert_eq!(fit.bytes_per_step / MIB, 24, "{launcher:?} {fit:#?}");
    });
}

/// A program that records torch's memory history itself (for pytorch.org/memory_viz) keeps its
/// settings: the hook never calls `_record_memory_history` over them, and the program's records
/// serve the dump (the line that keeps the growth).
#[test]
fn the_programs_own_memory_history_is_left_as_it_chose() {
    let body = format!(
        r#"
torch.cuda.memory._record_memory_history(enabled="all", max_entries=77)
{KEPT_FROM_STEP_SEGMENTS}
try:
    for step in range(1, 100000):
        opt.step()
        kept.append(torch.empty_cached(4 * MiB))   # 16 MiB kept a step
except torch.OutOfMemoryError:
    print("oom")
print(torch._history_calls)
"#
    );
    let body = body.as_str();
    let Some(e) = env() else { return };
    let kept = line_of(body, "kept.append(");
    for launcher in [Launcher::Preload, Launcher::Run] {
        let out = run(&e, launcher, body);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "oom\n[{'enabled': 'all', 'max_entries': 77}]",
            "{launcher:?}: {err}"
        );
        let (_, d) = the_dump(&e.dumps);
        let top = &d.verdict.findings[0];
        assert!(
            top.headline
                .starts_with(&format!("<module> (<string>:{kept}) holds the growth")),
            "{launcher:?}: {}\n{err}",
            top.headline
        );
    }
}

/// The report's text with every run of whitespace one space (its notes wrap to the width).
pub(crate) fn flat(report: &str) -> String {
    report.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The number the program printed after `label` (its own count of its memory).
pub(crate) fn printed(out: &str, label: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("the program printed no `{label}`: {out}"))
}

/// The program's own count of the parameter bytes of `models` (a Python expression): every
/// storage once, as torch's own accounting would have it.
pub(crate) const OWN_PARAMETERS: &str = r#"
def own_parameters(models):
    storages = {}
    for m in models:
        for p in m.parameters():
            s = p.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())
"#;

#[test]
fn forty_models_are_all_counted_and_sixteen_listed() {
    // 40 models of different sizes (1.54 GiB of weights in all): far more than the 16 a dump
    // lists. Every one is counted in the totals, so the weights are not taken for activations.
    let body = format!(
        r#"{OWN_PARAMETERS}
class Net(nn.Module):
    def __init__(self, mib):
        super().__init__()
        self.w = nn.Parameter(mib * MiB // 4)   # float32: `mib` MiB
    def forward(self, x):
        return torch.empty(x.shape[0], 128 * MiB)   # 512 MiB
models = [Net(20 + i) for i in range(40)]
print("own parameters", own_parameters(models))
try:
    models[7](torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#
    );
    each_launcher_out(&body, &[], |launcher, d, report, err, out| {
        let k = kinds_of(d);
        let own = printed(out, "own parameters");
        assert_eq!(own, 1580 * MIB);
        assert_eq!(k.parameters_bytes, own, "{launcher:?} {k:#?}");
        assert!(k.complete && k.short_kinds.is_empty(), "{k:#?}");
        assert_eq!(k.models.len(), 16, "{k:#?}");
        assert_eq!(k.more_models, 24);
        let listed: u64 = k.models.iter().map(|m| m.bytes).sum();
        assert_eq!(listed + k.more_models_bytes, own);
        // The running model first, then the largest.
        assert_eq!(k.models[0].bytes, 27 * MIB);
        assert_eq!(k.models[1].bytes, 59 * MIB);
        assert!(k.duplicates.is_empty(), "{:#?}", k.duplicates);
        let top = &d.verdict.findings[0];
        assert!(
            top.headline
                .starts_with("parameters (the weights) fill device 0: 1.54 GiB"),
            "{launcher:?} {}",
            top.headline
        );
        assert!(flat(report).contains("24 more models"), "{report}");
        assert!(
            d.verdict.findings[0]
                .evidence
                .iter()
                .any(|e| e.contains("24 more models")),
            "{:#?}\n{err}",
            d.verdict.findings[0].evidence
        );
    });
}

/// A model loaded again and again, each copy kept, layer by layer into a list (a notebook cell
/// run once more): building the fifth copy runs out, before any step. More loose layers of the
/// copy being built than a dump lists: every launcher's kinds are the program's own count, and
/// the copies are named by the model held four times, not by its layer.
#[test]
fn models_loaded_without_any_step_are_counted_alike_under_every_launcher() {
    let body = format!(
        r#"{OWN_PARAMETERS}
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(MiB)   # 4 MiB
class Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)
building = []
def load():
    building.clear()
    for _ in range(100):
        building.append(Layer())
    model = Stack(building)   # 400 MiB
    building.clear()
    return model
copies = []
try:
    for i in range(8):
        copies.append(load())
except torch.OutOfMemoryError:
    print("copies", len(copies), "building", len(building))
    print("own parameters", own_parameters(copies + building))
"#
    );
    each_launcher_out(&body, &[], |launcher, d, report, err, out| {
        let k = kinds_of(d);
        assert!(out.contains("copies 4 building"), "{out}");
        assert!(
            printed(out, "copies 4 building") > 16,
            "more loose layers than a dump lists: {out}"
        );
        assert_eq!(
            k.parameters_bytes,
            printed(out, "own parameters"),
            "{launcher:?} {k:#?}"
        );
        assert_eq!(k.phase.as_deref(), Some("outside"));
        assert_eq!(k.duplicates.len(), 1, "{:#?}", k.duplicates);
        let dup = &k.duplicates[0];
        assert_eq!(
            (dup.class.as_str(), dup.copies, dup.bytes_each),
            ("Stack", 4, 400 * MIB)
        );
        let words = "the Stack model is held 4 times (4 × 400.00 MiB, identical parameter shapes)";
        let top = &d.verdict.findings[0];
        assert!(
            top.headline
                .starts_with("parameters (the weights) fill device 0")
                && top.headline.contains(words),
            "{launcher:?} {}",
            top.headline
        );
        assert!(err.contains(words), "{err}");
        assert!(flat(report).contains(words), "{report}");
        assert!(!top.headline.contains("Layer model"), "{}", top.headline);
    });
}

#[test]
fn four_copies_of_a_model_are_named_as_the_model_held_four_times() {
    let body = r#"
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(16 * MiB)   # 64 MiB
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(4):
            setattr(self, f"b{i}", Block())   # 256 MiB
    def forward(self, x):
        return torch.empty(x.shape[0], 256 * MiB)   # 1 GiB
model = Net()
snapshots = [Net() for _ in range(3)]   # "the best so far", kept each time
try:
    model(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher(body, |launcher, d, report, err| {
        let k = kinds_of(d);
        assert_eq!(k.parameters_bytes, 1024 * MIB, "{launcher:?} {k:#?}");
        let words = "the Net model is held 4 times (4 × 256.00 MiB, identical parameter shapes)";
        let top = &d.verdict.findings[0];
        assert!(
            top.headline.contains(words),
            "{launcher:?} {}",
            top.headline
        );
        assert!(!top.headline.contains("Block"), "{}", top.headline);
        assert!(err.contains(words), "{err}");
        assert!(flat(report).contains(words), "{report}");
        assert!(
            d.verdict.suggestions[0]
                .starts_with("The Net model is held 4 times: 3 more copies hold 768.00 MiB"),
            "{:#?}",
            d.verdict.suggestions
        );
        // The listed copies point at the first one, as older readers expect.
        assert_eq!(
            k.models.iter().filter(|m| m.duplicate_of.is_some()).count(),
            3,
            "{k:#?}"
        );
    });
}

#[test]
fn one_model_of_forty_eight_identical_blocks_is_no_duplicate() {
    // Built block by block on the device: the failure comes while the blocks are still loose
    // (not yet in the model), 30 of them identical. Then the same model, whole, fails in its
    // forward pass.
    let build = r#"
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Parameter(2 * MiB)   # 8 MiB
        self.mlp = nn.Parameter(6 * MiB)    # 24 MiB
class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        for i, b in enumerate([Block() for _ in range(n)]):
            setattr(self, f"h{i}", b)
    def forward(self, x):
        return torch.empty(x.shape[0], 150 * MiB)   # 600 MiB
"#;
    let while_built = format!(
        "{build}\ntry:\n    model = Net(80)   # 2.5 GiB: does not fit\nexcept torch.OutOfMemoryError:\n    print(\"oom\")\n"
    );
    let whole = format!(
        "{build}\nmodel = Net(48)   # 1.5 GiB\ntry:\n    model(torch.empty(1, 4))\nexcept torch.OutOfMemoryError:\n    print(\"oom\")\n"
    );
    for (what, body) in [("while built", while_built), ("whole", whole)] {
        each_launcher(&body, |launcher, d, report, err| {
            let k = kinds_of(d);
            assert!(k.duplicates.is_empty(), "{what} {launcher:?} {k:#?}");
            assert!(
                k.models.iter().all(|m| m.duplicate_of.is_none()),
                "{what} {launcher:?} {k:#?}"
            );
            let top = &d.verdict.findings[0];
            assert!(
                !top.headline.contains("held") && !top.headline.contains("twice"),
                "{what} {launcher:?} {}",
                top.headline
            );
            assert!(!flat(report).contains("is held"), "{report}");
            assert!(!err.contains("is held"), "{err}");
        });
    }
}

#[test]
fn two_models_sharing_a_submodule_are_no_copies_and_it_counts_once() {
    // Two towers of one class over one shared encoder (a siamese pair, or a policy and a value
    // head on one trunk): the same parameter shapes, but the second is no copy of the first.
    let body = r#"
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(64 * MiB)   # 256 MiB
class Tower(nn.Module):
    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Parameter(16 * MiB)   # 64 MiB
    def forward(self, x):
        return torch.empty(x.shape[0], 448 * MiB)   # 1.75 GiB
shared = Encoder()
left, right = Tower(shared), Tower(shared)
try:
    left(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher(body, |launcher, d, report, err| {
        let k = kinds_of(d);
        assert_eq!(k.parameters_bytes, 384 * MIB, "{launcher:?} {k:#?}");
        assert!(k.duplicates.is_empty(), "{launcher:?} {k:#?}");
        assert!(k.models.iter().all(|m| m.duplicate_of.is_none()), "{k:#?}");
        let top = &d.verdict.findings[0];
        assert!(
            !top.headline.contains("held") && !top.headline.contains("twice"),
            "{}",
            top.headline
        );
        assert!(!flat(report).contains("second copy"), "{report}");
        assert!(!err.contains("twice"), "{err}");
    });
}

#[test]
fn a_walk_out_of_time_says_which_kinds_may_be_short_and_names_no_dominant_kind() {
    // The model running the forward pass is counted first, and reading its parameters takes
    // longer than the whole budget (a module whose `parameters()` is slow): the walk stops there.
    let body = r#"
import time
class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(64 * MiB)   # 256 MiB
    def parameters(self):
        time.sleep(0.6)
        return super().parameters()
    def forward(self, x):
        return torch.empty(x.shape[0], 256 * MiB)   # 1 GiB
class Big(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(192 * MiB)   # 768 MiB
model, other = Slow(), Big()
try:
    model(torch.empty(1, 4))
except torch.OutOfMemoryError:
    print("oom")
"#;
    each_launcher_with(
        body,
        &[("OOMSHIM_KINDS_BUDGET_MS", "300")],
        |launcher, d, report, _| {
            let k = kinds_of(d);
            assert!(!k.complete, "{launcher:?} {k:#?}");
            for kind in ["parameters", "gradients", "optimizer_state"] {
                assert!(
                    k.short_kinds.iter().any(|s| s == kind),
                    "{kind}: {launcher:?} {k:#?}"
                );
            }
            // What was counted is a lower bound of the weights and the rest (activations) an
            // upper bound: neither can be named as what fills the device.
            let top = &d.verdict.findings[0];
            assert!(
                top.headline
                    .starts_with("this process's own allocations fill device 0"),
                "{launcher:?} {}",
                top.headline
            );
            let evidence = top.evidence.join("\n");
            assert!(
                evidence.contains("the time budget ran out before parameters, gradients and optimizer state were all counted"),
                "{evidence}"
            );
            assert!(
                flat(report).contains("the time budget ran out before parameters, gradients and optimizer state were all counted"),
                "{report}"
            );
        },
    );
}
