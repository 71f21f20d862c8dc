"""oomshim as PyTorch's CUDA allocator ("allocator mode").

    import oomshim.torch
    oomshim.torch.enable()          # first thing, before anything touches CUDA
    ...
    oomshim.torch.memory_stats()    # torch's keys and meanings
    oomshim.torch.fragmentation()   # the exact free-block state

or, without changing the program: `oomshim run --torch-allocator -- python train.py`.

Under a pluggable allocator torch's own `torch.cuda.memory_stats()`, `memory_allocated()`,
`max_memory_allocated()` and `reset_peak_memory_stats()` raise; `enable()` makes them answer from
oomshim's allocator instead (pass `patch_torch=False` to leave torch alone), and this module
offers the same functions directly.

What torch cannot do on any pluggable allocator, and how allocator mode keeps the program working:

- `torch.compile` with CUDA graphs (`mode="reduce-overhead"`, `"max-autotune"`, the option
  `triton.cudagraphs`, `backend="cudagraphs"`): torch's CUDA graph trees re-record after replays
  by checkpointing the allocator's pool and re-attaching torch's own deleters to live storages
  (`_cuda_setCheckpointPoolState`), which only torch's C++ allocator can do. `oomshim run
  --torch-allocator` reads the program first (`unservable_uses()`) and keeps torch's allocator
  where the program asks for them; where it could not tell, `enable()` compiles without CUDA
  graphs (same kernels, same results, the launch overhead stays) and says so once.
- `torch.cuda.MemPool`: the same reading keeps torch's allocator for it; found only at run
  time, a MemPool torch refuses is served by oomshim's allocator (one line): `use_mem_pool` and
  `torch.cuda.graph(pool=pool.id)` work, its tensors come from oomshim's cache (no separate
  pool; an allocator given to the pool is not called) and its `snapshot()` is empty.
- `torch.backends.cudnn.benchmark = True`: cuDNN's search asks the allocator for `cacheInfo`;
  the same reading keeps torch's allocator, and found only at run time the setting stays off
  (cuDNN's heuristics choose the algorithms), said once.
- `torch.cuda.memory_snapshot()`, `torch.cuda.memory._snapshot()` and `_dump_snapshot()` answer
  from oomshim's segments and blocks; torch's memory history (`_record_memory_history`, any of
  its options) is kept by oomshim's allocator, so they carry `device_traces` and the frames of
  each block as torch's do, with Python frames only (`stacks="all"` adds no C++ frames).
  `get_allocator_backend()` stays "pluggable".

Torch's out-of-memory observers (`torch._C._cuda_attach_out_of_memory_observer`), which torch
calls under no pluggable allocator, are called by oomshim's, as torch would: on the failing
thread, with (device, requested bytes, device total, free bytes), before the dump is written.

Every tensor is recorded with the Python stack that made it. On CPython 3.12 and 3.13 `enable()`
also has the shim register a code watcher (one of the interpreter's eight), so that stack costs
about a third of what it did (see the README's "Python stacks").

An allocation that cannot be served, even after the cache was emptied and the request retried,
raises `torch.OutOfMemoryError` (a `RuntimeError` where torch's C++ error type is not found),
with torch's wording plus oomshim's verdict and the path of the dump it wrote.

The library is found by this rule, first match wins:
  1. the `OOMSHIM_LIB` environment variable (a path to liboomshim.so);
  2. the shim already loaded in this process (by `oomshim run` or LD_PRELOAD, whatever its file
     is named), so there is only ever one copy of the shim's state;
  3. liboomshim.so inside this package (the wheel);
  4. the build directory of the repository this package sits in (target/release, or
     target/release/deps where `cargo run` leaves it; the newer of the two).
"""

import ctypes
import functools
import json
import os
import re
import sys

from . import _locate

__all__ = [
    "enable",
    "enabled",
    "library_path",
    "memory_stats",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "fragmentation",
    "empty_cache",
    "dump",
    "exception_kind",
    "snapshot",
    "unservable_uses",
]

_ALLOC = "oomshim_torch_alloc"
_FREE = "oomshim_torch_free"

_state = {"lib": None, "path": None, "allocator": None, "keep": [], "observer": None, "code_watcher": False}
# The shape of this module's state: a copy that has the same one can stand in for another
# (oomshim's Python hook carries a copy, see the end of this file).
_STATE_FORMAT = 1


def __dir__():
    return sorted(__all__)


def _import_torch():
    """torch, or an ImportError that says what to do when this Python cannot import it."""
    try:
        import torch
    except ImportError as e:
        missing = getattr(e, "name", None) == "torch"
        error = ModuleNotFoundError if missing else ImportError
        raise error(
            f"oomshim.torch needs PyTorch, which this Python ({sys.executable}) cannot import "
            f"({type(e).__name__}: {e}). Install it into this environment (`{sys.executable} -m pip "
            "install torch`, or the command for your CUDA version from "
            "https://pytorch.org/get-started/locally/), or run the program with the Python that "
            "has it.",
            name="torch",
        ) from (None if missing else e)
    return torch


def library_path():
    """Where liboomshim.so is, by the documented rule (see oomshim._locate.library_path); raises
    FileNotFoundError naming every place it looked."""
    return _locate.library_path()


def _lib():
    if _state["lib"] is None:
        path = library_path()
        lib = ctypes.CDLL(path)
        for name in ("oomshim_torch_memory_stats", "oomshim_torch_free_blocks", "oomshim_torch_segments",
                     "oomshim_torch_history"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
            fn.restype = ctypes.c_size_t
        for name in ("oomshim_torch_reset_peak", "oomshim_torch_reset_accumulated"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_int]
            fn.restype = None
        lib.oomshim_torch_exception_kind.restype = ctypes.c_char_p
        lib.oomshim_torch_record_history.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_int]
        lib.oomshim_torch_record_history.restype = ctypes.c_int
        lib.oomshim_dump.argtypes = [ctypes.c_char_p]
        lib.oomshim_dump.restype = ctypes.c_int
        _state["lib"], _state["path"] = lib, path
    return _state["lib"]


def _watch_code():
    """CPython 3.12+: has the shim count code objects created and destroyed (a code watcher), so
    that the Python stack it records for every tensor knows a code object by its address while
    none is freed, instead of checking its name, file and line table at every allocation. Through
    ctypes.PyDLL: the call must hold the GIL. True when a watcher counts."""
    if sys.version_info < (3, 12):
        return False
    watch = ctypes.PyDLL(_state["path"]).oomshim_watch_python_code
    watch.argtypes = []
    watch.restype = ctypes.c_int
    return watch() == 1


def enabled():
    """True once enable() made oomshim torch's CUDA allocator in this process."""
    return _state["allocator"] is not None


def enable(patch_torch=True):
    """Makes oomshim PyTorch's CUDA allocator. Must run before CUDA is initialised (before the
    first CUDA tensor, `torch.cuda.set_device`, `current_device()`...): torch cannot swap an
    allocator that already handed out memory. Calling it again is harmless. Raises ImportError
    (ModuleNotFoundError) saying how to install PyTorch when this Python cannot import it."""
    torch = _import_torch()
    if _state["allocator"] is not None:
        return
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "oomshim.torch.enable() was called after CUDA was initialised in this process; torch "
            "cannot change its allocator then. Call it first thing (right after `import torch`), "
            "or start the program with `oomshim run --torch-allocator -- python ...`."
        )
    lib = _lib()
    path = _state["path"]
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, _ALLOC, _FREE)
    raw = allocator.allocator()
    hooks = [
        ("set_init_fn", "oomshim_torch_init"),
        ("set_reset_fn", "oomshim_torch_empty_cache"),
        ("set_record_stream_fn", "oomshim_torch_record_stream"),
        ("set_memory_fraction_fn", "oomshim_torch_set_memory_fraction"),
    ]
    for setter, fn in hooks:
        set_fn = getattr(raw, setter, None)
        if set_fn is None:
            continue  # an older torch without this hook: the feature stays torch's no-op
        set_fn(ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(allocator)
    _state["code_watcher"] = _watch_code()
    # torch keeps raw function pointers: the library and the allocator object must live as long
    # as the process.
    _state["allocator"] = allocator
    _state["keep"].append(lib)
    if patch_torch:
        _patch_torch_stats(torch)


def _patch_torch_stats(torch):
    """Points torch's statistics entry points (which raise under a pluggable allocator) at
    oomshim's, so `torch.cuda.memory_allocated()` and friends keep working in user code."""
    C = torch._C

    def memory_stats(device):
        return _nested(_stats(device))

    def reset_peak(device):
        _lib().oomshim_torch_reset_peak(_device_index(device))

    def reset_accumulated(device):
        _lib().oomshim_torch_reset_accumulated(_device_index(device))

    original_snapshot = getattr(C, "_cuda_memorySnapshot", None)

    def memory_snapshot(*args, **kwargs):
        pool = args[0] if args else kwargs.get("mempool_id")
        if pool is not None and tuple(pool)[:2] in _served_pool_ids:
            # A MemPool oomshim serves holds no segments of its own (see _ServedPool).
            return {"segments": [], "device_traces": [], "allocator_settings": {}, "external_annotations": []}
        if pool is not None and tuple(pool)[:2] != (0, 0):
            # One pool's segments: oomshim keys graph memory by capture, not by torch's pool
            # ids, so this stays torch's answer (which raises under a pluggable allocator).
            return original_snapshot(*args, **kwargs)
        return snapshot()

    fractions = {}
    original_set_fraction = getattr(C, "_cuda_setMemoryFraction", None)

    def set_memory_fraction(fraction, device):
        original_set_fraction(fraction, device)
        fractions[_device_index(device)] = float(fraction)

    def get_memory_fraction(device):
        return fractions.get(_device_index(device), 1.0)

    def record_memory_history(enabled, context="all", stacks="all", max_entries=sys.maxsize,
                              clear_history=False, *rest):
        # torch._C._cuda_record_memory_history, as torch.cuda.memory._record_memory_history
        # calls it (positionally); torch's checks and messages.
        if enabled is not None and enabled not in ("state", "all"):
            raise RuntimeError("expected state to be 'state', 'all', or None")
        if context is not None and context not in ("state", "alloc", "all"):
            raise RuntimeError("expected context to be 'state', 'alloc', 'all', or None")
        if stacks not in ("python", "all"):
            raise RuntimeError("expected stacks to be 'python', or 'all'")
        level = {None: 0, "state": 1, "alloc": 2, "all": 3}[context]
        _record_history(enabled is not None, level, max_entries if enabled == "all" else 1, clear_history)

    def record_memory_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                                     trace_alloc_record_context=False, record_context_cpp=False,
                                     clear_history=False, *rest):
        level = 2 if trace_alloc_record_context else 1 if record_context else 0
        _record_history(bool(enabled), level, trace_alloc_max_entries, clear_history)

    def attach_oom_observer(fn):
        _attach_oom_observer(fn)

    replacements = [
        ("_cuda_memoryStats", memory_stats),
        ("_cuda_resetPeakMemoryStats", reset_peak),
        ("_cuda_resetAccumulatedMemoryStats", reset_accumulated),
        ("_cuda_record_memory_history", record_memory_history),
        ("_cuda_record_memory_history_legacy", record_memory_history_legacy),
        ("_cuda_isHistoryEnabled", lambda: _history["on"]),
        ("_cuda_attach_out_of_memory_observer", attach_oom_observer),
    ]
    if original_snapshot is not None:
        replacements.append(("_cuda_memorySnapshot", memory_snapshot))
    if original_set_fraction is not None:
        replacements.append(("_cuda_setMemoryFraction", set_memory_fraction))
        replacements.append(("_cuda_getMemoryFraction", get_memory_fraction))
    for name, fn in replacements:
        if hasattr(C, name):
            setattr(C, name, fn)
    _patch_compile(torch)
    _patch_cudnn_benchmark(torch)
    _patch_mem_pool(torch)


# torch's out-of-memory observers in allocator mode: torch calls none under a pluggable
# allocator, so the library calls `_call_oom_observers` through one ctypes callback
# (`oomshim_torch_set_oom_observer`) when an allocation cannot be served, on the failing thread,
# before it writes its dump and raises, as torch calls its own.
_oom_observers = []
_OOM_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)


def _call_oom_observers(device, alloc, total, free):
    """Every observer, in the order attached, with torch's arguments (device, requested bytes,
    device total or the allowed maximum, free bytes). One that raises is said once and the others
    still run: the OutOfMemoryError follows either way."""
    for fn in list(_oom_observers):
        try:
            fn(device, alloc, total, free)
        except Exception as e:
            _say_once("observer-raised", f"oomshim: an out-of-memory observer raised ({type(e).__name__}: {e}); "
                                         "torch's OutOfMemoryError follows")


def _attach_oom_observer(fn):
    """`torch._C._cuda_attach_out_of_memory_observer` in allocator mode. The library's callback
    is set at the first observer (a program without any takes no GIL at a failure) and cleared at
    exit (Python must not be called once it finalises)."""
    _oom_observers.append(fn)
    if _state.get("observer") is not None:
        return
    lib = _lib()
    setter = getattr(lib, "oomshim_torch_set_oom_observer", None)
    if setter is None:
        _say_once("observer", "oomshim: this liboomshim.so cannot call torch's out-of-memory observers in "
                              "allocator mode (an older build); they are not called")
        return
    import atexit

    callback = _OOM_OBSERVER(_call_oom_observers)
    setter.argtypes = [ctypes.c_void_p]
    setter.restype = None
    setter(ctypes.cast(callback, ctypes.c_void_p))
    _state["observer"] = callback  # the library keeps the raw pointer: so must we
    atexit.register(setter, None)


# Ids of the MemPools oomshim serves (torch refused to create them on a pluggable allocator).
_served_pool_ids = set()


class _ServedPool:
    """A `torch.cuda.MemPool` that torch refused to create under oomshim's allocator (torch 2.11:
    the pool's constructor asks the allocator to `createOrIncrefPool`, which a pluggable
    allocator does not implement). The program keeps working: its id is a fresh one from torch's
    own counter (`graph_pool_handle`), so `torch.cuda.graph(pool=pool.id)` shares it as usual;
    tensors made under `use_mem_pool(pool)` come from oomshim's cache like any other (no separate
    pool: the pool's own allocator, if one was given, is not called); `snapshot()` is empty
    (no segment belongs to the pool alone); `use_count()` counts this object and each
    `use_mem_pool` it is inside."""

    _next = [1 << 40]  # ids when torch has no graph_pool_handle: far above torch's counter

    def __init__(self, allocator=None, use_on_oom=False, no_split=False, *args, **kwargs):
        import torch

        try:
            pool_id = tuple(torch.cuda.graph_pool_handle())[:2]
        except Exception:
            self._next[0] += 1
            pool_id = (0, self._next[0])
        self._id = pool_id
        self._allocator = allocator
        self._uses = 0
        _served_pool_ids.add(pool_id)

    @property
    def id(self):
        return self._id

    @property
    def allocator(self):
        return self._allocator

    def use_count(self):
        return 1 + self._uses

    def snapshot(self, include_traces=True):
        return []

    def __repr__(self):
        return f"<MemPool id={self._id} served by oomshim's allocator>"


def _refused(error):
    """torch's refusal of a pool feature under a pluggable allocator ("pluggable does not yet
    support createOrIncrefPool ...")."""
    return isinstance(error, RuntimeError) and "does not yet support" in str(error)


def _patch_mem_pool(torch):
    """`torch.cuda.MemPool` and `use_mem_pool` keep working in allocator mode where the reading
    of the program did not see them (a library makes the pool): torch's own pool first; where
    torch refuses it under a pluggable allocator, a `_ServedPool`, said once."""
    import contextlib

    memory = getattr(torch.cuda, "memory", None)
    original = getattr(memory, "MemPool", None)
    original_use = getattr(memory, "use_mem_pool", None)
    if original is None or original_use is None or getattr(original, "_oomshim_served", False):
        return

    class _PoolType(type):
        # isinstance(pool, torch.cuda.MemPool) holds for torch's pools and for served ones.
        def __instancecheck__(cls, obj):
            return isinstance(obj, (original, _ServedPool))

        def __subclasscheck__(cls, sub):
            return isinstance(sub, type) and issubclass(sub, (original, _ServedPool))

    class MemPool(metaclass=_PoolType):
        __doc__ = original.__doc__
        _oomshim_served = True

        def __new__(cls, *args, **kwargs):
            try:
                return original(*args, **kwargs)
            except RuntimeError as e:
                if not _refused(e):
                    raise
                why = str(e).splitlines()[0][:120]
            pool = _ServedPool(*args, **kwargs)
            own = pool.allocator is not None
            _say_once(
                "mempool-allocator" if own else "mempool",
                "oomshim: torch.cuda.MemPool is served by oomshim's allocator in allocator mode "
                f"(torch refuses it on a pluggable allocator: {why}): its tensors come from "
                "oomshim's cache, not a separate pool"
                + (", and the allocator given to the pool is not called" if own else "")
                + ". Run without --torch-allocator to keep torch's pools.",
            )
            return pool

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        if not isinstance(pool, _ServedPool):
            with original_use(pool, device) as value:
                yield value
            return
        # torch's begin/end calls are no-ops on a pluggable allocator, and a capturing graph
        # cannot retain a pool that is not torch's: the tensors are oomshim's either way.
        pool._uses += 1
        try:
            yield
        finally:
            pool._uses -= 1

    use_mem_pool.__doc__ = original_use.__doc__
    for module in (torch.cuda, memory):
        if getattr(module, "MemPool", None) is original:
            module.MemPool = MemPool
        if getattr(module, "use_mem_pool", None) is original_use:
            module.use_mem_pool = use_mem_pool


def _patch_cudnn_benchmark(torch):
    """In allocator mode `cudnn.benchmark = True` keeps cuDNN's heuristics instead: its search
    asks the allocator for `cacheInfo`, which torch refuses under a pluggable allocator (every
    convolution would raise). Said once."""
    try:
        import importlib

        cudnn = importlib.import_module("torch.backends.cudnn")
        original = torch._C._set_cudnn_benchmark
        ContextProp = importlib.import_module("torch.backends").ContextProp
    except Exception:
        return

    def set_benchmark(on):
        if on:
            _say_once(
                "cudnn",
                "oomshim: cudnn.benchmark stays off in allocator mode (cuDNN's search asks the "
                "allocator for cacheInfo, which torch refuses under a pluggable allocator); cuDNN "
                "picks convolution algorithms by its heuristics. Run without --torch-allocator to "
                "benchmark them.",
            )
        original(False)

    torch._C._set_cudnn_benchmark = set_benchmark
    try:
        type(cudnn).benchmark = ContextProp(torch._C._get_cudnn_benchmark, set_benchmark)
    except Exception:
        pass


_said = set()


def _say_once(key, line):
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write(line + "\n")
    except Exception:
        pass


# torch.compile's modes that turn CUDA graphs on, and the same mode without them.
_GRAPH_MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def _shown(path):
    """`path` as a message names it: relative to the working directory when it lies below it,
    else whole (`../../../../work/train.py` says less than `/work/train.py`)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return os.path.abspath(path) if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _called_at(frame):
    """` at FILE:LINE` of the program's call in `frame` (see _shown), or nothing when it cannot
    be told."""
    try:
        return f" at {_shown(frame.f_code.co_filename)}:{frame.f_lineno}"
    except (AttributeError, ValueError, OSError):
        return ""


def _patch_compile(torch):
    """In allocator mode `torch.compile` runs without CUDA graphs: torch's CUDA graph trees
    checkpoint the allocator's pool between replays and re-attach their own deleters to live
    storages (`_cuda_setCheckpointPoolState`), which a pluggable allocator cannot serve (torch
    raises "pluggable does not yet support checkPoolLiveAllocations" at the first compiled
    call). The kernels are the same, so the results are too; the launch overhead CUDA graphs
    remove stays."""
    original = getattr(torch, "compile", None)
    if original is None or getattr(original, "_oomshim_no_graphs", False):
        return

    @functools.wraps(original)
    def compile(*args, **kwargs):
        asked = None
        mode = kwargs.get("mode")
        if mode in _GRAPH_MODES:
            kwargs["mode"] = _GRAPH_MODES[mode]
            asked = f'mode="{mode}"'
        options = kwargs.get("options")
        if isinstance(options, dict) and options.get("triton.cudagraphs"):
            kwargs["options"] = dict(options, **{"triton.cudagraphs": False})
            asked = 'options={"triton.cudagraphs": True}'
        if kwargs.get("backend") == "cudagraphs":
            kwargs["backend"] = "aot_eager"
            asked = 'backend="cudagraphs"'
        inductor = sys.modules.get("torch._inductor.config")
        triton = getattr(inductor, "triton", None)
        if getattr(triton, "cudagraphs", False):
            triton.cudagraphs = False
            asked = "torch._inductor.config.triton.cudagraphs = True"
        if asked:
            _say_once(
                "compile",
                f"oomshim: torch.compile runs without CUDA graphs in allocator mode ({asked}"
                f"{_called_at(sys._getframe(1))} asked "
                "for them; torch's CUDA graph trees checkpoint the allocator, which a pluggable "
                "allocator cannot serve): same kernels and results, the launch overhead stays. "
                "Run without --torch-allocator to keep them.",
            )
        return original(*args, **kwargs)

    compile._oomshim_no_graphs = True
    torch.compile = compile


# What a program's text shows of the features torch cannot run on a pluggable allocator: a
# pattern and the feature it names. Read before allocator mode is turned on (unservable_uses).
_UNSERVABLE = [
    (re.compile(r"reduce-overhead"), 'torch.compile with CUDA graphs (mode="reduce-overhead")'),
    (re.compile(r"max-autotune(?!-no-cudagraphs)"), 'torch.compile with CUDA graphs (mode="max-autotune")'),
    (re.compile(r"triton\.cudagraphs|[\"']cudagraphs[\"']|cudagraph_trees"), "torch.compile with CUDA graphs"),
    (re.compile(r"\bMemPool\b|\buse_mem_pool\b"), "torch.cuda.MemPool"),
    (re.compile(r"cudnn\.benchmark\s*=\s*True"), "cudnn.benchmark (torch asks the allocator for cacheInfo)"),
]
# What every match of each pattern above contains: a file without it is not searched.
_UNSERVABLE_WORDS = [("reduce-overhead",), ("max-autotune",), ("cudagraph",), ("MemPool", "use_mem_pool"),
                     ("cudnn",)]
# How much of a program is read: the main script, then the program's own modules it imports
# (transitively, in the order met) and the config files its command line names, until one of
# these limits.
_SCAN_FILES = 200
_SCAN_BYTES = 8 << 20
_CONFIG_EXTS = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")
# Modules never read as the program's: torch (its own sources name every feature) and oomshim.
_NOT_THE_PROGRAM = ("torch", "oomshim", "_oomshim_hook")
# Import statements (a `from` list in parentheses, or continued with backslashes) and imports by
# a literal name. Read by pattern, not parsed: a program's whole sources are read before its
# first CUDA call, and Python's parser takes seconds for megabytes.
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#;]*(?:\\\n[^\n#;]*)*)", re.M)
_FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n#;]*(?:\\\n[^\n#;]*)*)", re.M
)
_IMPORT_BY_NAME = re.compile(r"(?:import_module|__import__)\(\s*[\"']([\w.]+)[\"']")


def unservable_uses(argv=None):
    """Where this program asks for a feature torch cannot run on a pluggable allocator: a list of
    (where, feature), read from the command line, the config files it names, the main script
    and the program's own modules that it imports (those found on `sys.path` outside the
    standard library and installed packages, followed from import to import; comments and
    docstrings do not count). A file the program does not import is not read. Empty when none
    is seen (a program can still reach one through a library or a computed string: `enable()`
    keeps those working, see the module's docstring)."""
    argv = sys.argv if argv is None else argv
    found = []

    def look(where, text, python):
        prose = None
        for (pattern, feature), words in zip(_UNSERVABLE, _UNSERVABLE_WORDS):
            if any(f == feature for _, f in found) or not any(w in text for w in words):
                continue
            for m in pattern.finditer(text):
                if python:
                    # Only the code counts, not its comments and docstrings.
                    prose = prose or _Prose(text)
                    if prose.covers(m.start()):
                        continue
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{where}:{line}" if where != "the command line" else where, feature))
                break

    look("the command line", " ".join(str(a) for a in argv[1:]), False)
    # Config files named on the command line (`--config train.yaml`, `--config=train.yaml`).
    configs = [a for a in (str(a).partition("=")[2] or str(a) for a in argv[1:])
               if a.endswith(_CONFIG_EXTS) and os.path.isfile(a)]
    script = os.path.abspath(str(argv[0])) if argv and os.path.isfile(str(argv[0])) else None
    # The script's directory is where Python imports its modules from first (sys.path[0]),
    # except under `python -m`, where that is the working directory (on sys.path already).
    by_module = argv is sys.argv and getattr(sys.modules.get("__main__"), "__spec__", None) is not None
    resolve = _OwnModules([os.path.dirname(script)] if script and not by_module else [])
    paths = ([script] if script else []) + configs
    budget, seen, read = _SCAN_BYTES, set(), 0
    while paths and read <= _SCAN_FILES and budget > 0:
        path = os.path.abspath(paths.pop(0))
        if path in seen:
            continue
        seen.add(path)
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > budget:
                continue
            with open(path, "rb") as f:
                data = f.read(budget)
        except OSError:
            continue
        read += 1
        budget -= len(data)
        text = data.decode("utf-8", "replace")
        python = path.endswith(".py")
        look(_shown(path), text, python)
        if python:
            paths += [p for p in resolve.imported_by(path, text) if p not in seen]
    return found


class _Prose:
    """The comments and docstrings (strings that are statements of their own) of a Python
    source, found by tokenizing it only as far as asked."""

    def __init__(self, text):
        import io
        import tokenize

        self._starts = [0]
        for line in io.StringIO(text).readlines():
            self._starts.append(self._starts[-1] + len(line))
        self._tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        self._previous = tokenize.NEWLINE
        self._spans = []
        self._upto = 0
        self._done = False

    def _offset(self, row_col):
        row, col = row_col
        return self._starts[min(row, len(self._starts)) - 1] + col

    def covers(self, offset):
        """Whether `offset` lies in a comment or a docstring. Past where the source stops
        tokenizing, nothing does (what follows counts as code)."""
        import tokenize

        while not self._done and self._upto <= offset:
            try:
                tok = next(self._tokens)
            except (StopIteration, tokenize.TokenError, SyntaxError):
                self._done = True
                break
            statement_start = self._previous in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                                 tokenize.DEDENT)
            if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and statement_start):
                self._spans.append((self._offset(tok.start), self._offset(tok.end)))
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                self._previous = tok.type
            self._upto = self._offset(tok.end)
        return any(a <= offset < b for a, b in self._spans)


class _OwnModules:
    """Finds the files of the program's own modules an import names: on `sys.path` as Python
    searches it, where the first entry that has the name is not the standard library or an
    installed package's directory."""

    def __init__(self, first=()):
        import sysconfig

        libraries = set()
        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if paths.get(key):
                libraries.add(os.path.realpath(paths[key]))
        self._libraries = libraries
        self._entries = [os.path.realpath(e or os.getcwd())
                         for e in [*first, *sys.path] if isinstance(e, str)]
        self._top = {}

    def _library(self, entry):
        parts = entry.split(os.sep)
        return ("site-packages" in parts or "dist-packages" in parts
                or any(entry == lib or entry.startswith(lib + os.sep) for lib in self._libraries))

    def _root_of(self, top):
        """The sys.path entry that Python imports `top` from when it is the program's own, else
        None."""
        if top not in self._top:
            root = None
            if top not in sys.builtin_module_names and top not in _NOT_THE_PROGRAM:
                for entry in self._entries:
                    here = os.path.join(entry, top)
                    if os.path.isdir(here) or os.path.isfile(here + ".py"):
                        root = None if self._library(entry) else entry
                        break
            self._top[top] = root
        return self._top[top]

    @staticmethod
    def _files_below(base, parts):
        """The files that run when `parts` is imported from directory `base`: each package's
        `__init__.py` on the way and the module itself ([] when it is not there)."""
        files = []
        for i, part in enumerate(parts):
            here = os.path.join(base, part)
            init = os.path.join(here, "__init__.py")
            if os.path.isfile(init):
                files.append(init)
            elif i == len(parts) - 1 and os.path.isfile(here + ".py"):
                return files + [here + ".py"]
            elif not os.path.isdir(here):
                return []
            base = here
        return files

    def _absolute(self, name):
        parts = [p for p in name.split(".") if p]
        root = self._root_of(parts[0]) if parts else None
        return self._files_below(root, parts) if root else []

    def imported_by(self, path, text):
        """The own modules' files the Python source `text` (of `path`) imports."""
        out = []
        for m in _IMPORT.finditer(text):
            for name in _names(m.group(1)):
                out += self._absolute(name)
        for m in _FROM_IMPORT.finditer(text):
            dots, module, names = m.group(1), m.group(2), _names(m.group(3))
            if dots:
                # Relative to the importing file's package.
                base = os.path.dirname(path)
                for _ in range(len(dots) - 1):
                    base = os.path.dirname(base)
                parts = [p for p in module.split(".") if p]
                files = self._files_below(base, parts) if parts else []
                out += files
                below = os.path.join(base, *parts)
                for n in names:
                    out += self._files_below(below, [n])[-1:]
            elif module:
                out += self._absolute(module)
                for n in names:
                    out += self._absolute(f"{module}.{n}")[-1:]
        for m in _IMPORT_BY_NAME.finditer(text):
            out += self._absolute(m.group(1))
        return out


def _names(text):
    """The module names of an import list (`a.b as c, d`, in parentheses or continued)."""
    text = re.sub(r"#[^\n]*", "", text).replace("\\\n", " ").strip().strip("()")
    names = []
    for item in text.split(","):
        name = item.split(" as ")[0].strip().split()
        if name and name[0] != "*":
            names.append(name[0])
    return names


def _nested(flat):
    """torch's nested form of the statistics (what torch._C._cuda_memoryStats returns)."""
    out = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def _device_index(device=None):
    if device is None:
        return _import_torch().cuda.current_device()
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is not None:
        return index
    if isinstance(device, str) and ":" in device:
        return int(device.rsplit(":", 1)[1])
    return _import_torch().cuda.current_device()


def _json_call(fn, device):
    size = 1 << 14
    while True:
        buf = ctypes.create_string_buffer(size)
        n = fn(device, buf, size)
        if n < size:
            return json.loads(buf.value.decode())
        size = n + 1


def _stats(device=None):
    return _json_call(_lib().oomshim_torch_memory_stats, _device_index(device))


def memory_stats(device=None):
    """torch.cuda.memory_stats() of oomshim's allocator: the same flat keys
    ("allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms", ...)."""
    return dict(sorted(_stats(device).items()))


def memory_allocated(device=None):
    return _stats(device).get("allocated_bytes.all.current", 0)


def memory_reserved(device=None):
    return _stats(device).get("reserved_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return _stats(device).get("allocated_bytes.all.peak", 0)


def max_memory_reserved(device=None):
    return _stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    _lib().oomshim_torch_reset_peak(_device_index(device))


def reset_accumulated_memory_stats(device=None):
    _lib().oomshim_torch_reset_accumulated(_device_index(device))


# torch's memory history in allocator mode: whether it is on (torch._C._cuda_isHistoryEnabled).
_history = {"on": False}


def _record_history(on, context_level, max_entries, clear):
    """torch's `_record_memory_history` served by oomshim's allocator: a trace of torch's actions
    per device (a ring of `max_entries`) and, from `context_level` 1 ("state") up, the Python
    stack of each allocation (2 "alloc": on its trace entries too; 3 "all": frees' own stacks).
    Off drops the traces, as torch does."""
    max_entries = max(1, min(int(max_entries), (1 << 64) - 1))
    if _lib().oomshim_torch_record_history(1 if on else 0, context_level, max_entries, 1 if clear else 0) != 0:
        # The shim is off (it failed and passes through): the program goes on without history.
        _say_once("history", "oomshim: torch's memory history is not recorded: oomshim's allocator "
                             "refused it (see the line above); snapshots carry no traces")
        on = False
    _history["on"] = bool(on)


def _history_of(device):
    """The device's trace and stacks (oomshim_torch_history), frames as torch lists them."""
    h = _json_call(_lib().oomshim_torch_history, device)
    stacks = {int(k): v for k, v in h.get("stacks", {}).items()}
    trace = []
    for e in h.get("trace", []):
        entry = {k: v for k, v in e.items() if k != "stack"}
        entry["compile_context"] = "N/A"
        entry["user_metadata"] = ""
        if e.get("stack"):
            entry["frames"] = stacks.get(e["stack"], [])
        trace.append(entry)
    blocks = {addr: stacks.get(sid, []) for addr, sid in h.get("blocks", [])}
    return trace, blocks


def snapshot():
    """torch's `_snapshot()` of oomshim's allocator: every segment of every device with its
    blocks (`active_allocated`, `active_pending_free`, `inactive`), and, while torch's memory
    history is or was on (`_record_memory_history`), each device's trace in `device_traces` and
    the Python frames of the blocks allocated meanwhile (torch's keys; Python frames only, no C++
    frames; like torch, each snapshot taken while it is on adds a `snapshot` entry). A segment of a CUDA graph capture has `segment_pool_id` (capture id,
    0): oomshim keys graph memory by capture, not by torch's pool ids."""
    torch = _import_torch()

    devices = torch.cuda.device_count() if torch.cuda.is_initialized() else 0
    segments = []
    traces = []
    for device in range(devices):
        trace, block_frames = _history_of(device)
        traces.append(trace)
        state = _json_call(_lib().oomshim_torch_segments, device)
        if state.get("segment_map_omitted"):
            _say_once(
                "omitted",
                f"oomshim: the snapshot leaves out {state['segment_map_omitted']} segments of "
                f"device {device} (over {len(state.get('segment_map', []))} segments' blocks)",
            )
        for seg in state.get("segment_map", []):
            blocks = [
                {
                    "address": int(b["address"], 16),
                    "size": b["bytes"],
                    "requested_size": b["requested_bytes"],
                    "state": b["state"],
                    "frames": block_frames.get(int(b["address"], 16), []) if b["state"] != "inactive" else [],
                }
                for b in seg["blocks"]
            ]
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            active = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append({
                "device": device,
                "address": int(seg["address"], 16),
                "total_size": seg["bytes"],
                "allocated_size": allocated,
                "active_size": active,
                "requested_size": sum(b["requested_size"] for b in blocks if b["state"] != "inactive"),
                "stream": int(seg["stream"], 16),
                "segment_type": seg["pool"],
                "segment_pool_id": (seg["capture"], 0) if seg.get("capture") else (0, 0),
                "is_expandable": False,
                "frames": [],  # torch 2.11 gives a segment no frames either
                "blocks": blocks,
            })
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf, "expandable_segments": False},
        "external_annotations": [],
    }


def fragmentation(device=None):
    """The exact free-block state: reserved, allocated and free bytes, the largest free block,
    fragmentation = 1 - largest/free, inactive split bytes and the power-of-two histogram of
    free blocks (the dump's `free_blocks`)."""
    return _json_call(_lib().oomshim_torch_free_blocks, _device_index(device))


def empty_cache():
    """Returns every fully free segment to CUDA (what torch.cuda.empty_cache() does once
    enable() ran)."""
    fn = _lib().oomshim_torch_empty_cache
    fn.restype = None
    fn()


def dump(reason="python"):
    """Writes a dump now (allocations, free blocks, verdict); True when written."""
    return _lib().oomshim_dump(str(reason).encode("utf-8", "replace")) == 0


def exception_kind():
    """The Python exception an allocation failure raises in this process."""
    return _lib().oomshim_torch_exception_kind().decode()


# One allocator mode per process. oomshim's Python hook carries a copy of this file as
# `_oomshim_hook.allocator` and loads it to turn allocator mode on (`oomshim run
# --torch-allocator`); a program that then imports `oomshim.torch` gets that copy, so `enabled()`,
# the observers and the history have one state. (The hook uses this module instead when the
# program imported it first.)
_HOOK_COPY = "_oomshim_hook.allocator"
if __name__ != _HOOK_COPY and getattr(sys.modules.get(_HOOK_COPY), "_STATE_FORMAT", None) == _STATE_FORMAT:
    sys.modules[__name__] = sys.modules[_HOOK_COPY]
