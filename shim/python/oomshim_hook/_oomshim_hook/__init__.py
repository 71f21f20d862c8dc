"""oomshim's hook for Python programs.

liboomshim.so puts the hook's directory first on PYTHONPATH when it is loaded into a Python
program that has not started yet (plain `LD_PRELOAD=liboomshim.so python train.py`), and `oomshim
run` does the same; Python then runs `sitecustomize.py` there at start-up, which starts this
package (`_start`) and takes the directory off `sys.path` again. The hook:

- removes its directory from the PYTHONPATH the program and its children see (a child under the
  shim gets it again from the shim); sitecustomize.py runs the program's own `sitecustomize`;
- waits for the program to import torch or jax itself (it never imports either into a program
  that doesn't, and never initialises CUDA);
- torch, with `OOMSHIM_TORCH_ALLOCATOR=1` (`oomshim run --torch-allocator`): makes oomshim torch's
  CUDA allocator right after torch is imported, unless the program's own code (its main script,
  the modules of its own that it imports, the config files its command line names) asks for a
  feature torch cannot run on a pluggable allocator (`unservable_uses` of `allocator.py`, the copy of
  `oomshim.torch` in this package; then one line says so and the next point applies; `force`
  skips the reading). A program that imports `oomshim.torch` itself shares that copy's state;
- torch: registers torch's out-of-memory observer (through torch's lazy-initialisation queue; in
  allocator mode oomshim's package calls it, as torch calls none under a pluggable allocator) and
  marks every optimizer step for the shim's growth history (`register_optimizer_step_post_hook`,
  torch's global registry; dynamo traces it as a no-op in a compiled optimizer step). Nothing is
  attached to the program's modules or objects (a hook there would travel with
  `torch.save(model)`, `copy.deepcopy` and `torch.jit.script`, and every forward would pay for
  it): the models are found at a failure. `OOMSHIM_AUTO_STEPS=forward` also marks every forward
  pass of the outermost module, through global module hooks that every module call pays for;
  `0` marks nothing;
- torch or jax, on CPython 3.12 and 3.13: has the shim register a code watcher, so the Python
  stack it records with each allocation knows the code objects it already identified by their
  address while none is created or destroyed (see the README's "Python stacks");
- jax: reports an uncaught XLA out-of-memory error (RESOURCE_EXHAUSTED) to the shim, which writes
  a dump (XLA refuses inside its preallocated pool without any CUDA call failing).

When torch raises OutOfMemoryError and the shim will write a dump for it, the observer hands the
shim torch's own account (its cache's segments and free blocks, PYTORCH_CUDA_ALLOC_CONF, counters,
memory by kind) before the dump is judged, and saves `torch.cuda.memory._snapshot()` as a pickle
beside the dump (for pytorch.org/memory_viz). A failure that gets no dump (a repeat within
OOMSHIM_MIN_INTERVAL, over OOMSHIM_MAX_DUMPS) costs a few microseconds: the shim is told, nothing
is gathered. In allocator mode the account has the memory by kind and the phase only (the shim's
dump has the exact cache itself), and joins the dump the shim writes when the observer returns.
Nothing gathered at a failure is kept once the observer returns: the program's own `del` frees
what it frees without the shim.

Set OOMSHIM_TORCH_HOOK=0 to switch all of this off. The hook never raises into the program; each
of its own failures is reported once on stderr.
"""

import os
import sys

_SCHEMA = "oomshim.framework-oom/1"
# What was said already (each failure of the hook once).
_said = set()


def _warn(msg):
    """One line on stderr per kind of failure (the message up to its parenthesis)."""
    key = msg.split(" (", 1)[0]
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write(f"oomshim: python hook: {msg}\n")
    except Exception:
        pass


def _off(name, default="1"):
    return os.environ.get(name, default).strip().lower() in ("0", "off", "no", "false")


def _start(hook_dir):
    """Called once by sitecustomize.py in `hook_dir`."""
    _forget_own_path(hook_dir)
    if _off("OOMSHIM_TORCH_HOOK"):
        return
    _install()


def _forget_own_path(hook_dir):
    """The hook's directory leaves the PYTHONPATH children inherit: a child that runs without the
    shim must not run the hook. Every other entry stays as it was, empty ones ("the current
    directory") included."""
    value = os.environ.get("PYTHONPATH")
    if value is None:
        return
    parts = value.split(os.pathsep)
    rest = [p for p in parts if not (p and os.path.abspath(p) == hook_dir)]
    if len(rest) == len(parts):
        return
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        del os.environ["PYTHONPATH"]


# The module that holds allocator mode's state, by the names it can have in this process: the
# program's own `oomshim.torch` (which takes this package's copy's place when that one was loaded
# first: oomshim/torch.py), and this package's copy.
_TORCH_MODE_NAMES = ("oomshim.torch", __name__ + ".allocator")


def _torch_mode(load=False):
    """The one module of allocator mode in this process, loading this package's copy when
    `load` and none is there; None otherwise."""
    for name in _TORCH_MODE_NAMES:
        mod = sys.modules.get(name)
        if mod is not None and isinstance(getattr(mod, "_state", None), dict):
            return mod
    if not load:
        return None
    import importlib

    return importlib.import_module(__name__ + ".allocator")


def _allocator_on():
    """Whether oomshim is torch's allocator in this process (whoever turned it on)."""
    mod = _torch_mode()
    try:
        return bool(mod is not None and mod.enabled())
    except Exception:
        return False


_shim_lib = None


def _shim():
    """liboomshim.so's functions in this process (loaded by LD_PRELOAD, or by allocator mode), or
    None."""
    global _shim_lib
    if _shim_lib is None:
        import ctypes

        lib = None
        try:
            lib = ctypes.CDLL(None)
            lib.oomshim_framework_oom  # noqa: B018 (a lookup: raises when absent)
        except (AttributeError, OSError):
            lib = None
            # Allocator mode without LD_PRELOAD: oomshim.torch loaded the library itself.
            mod = _torch_mode()
            state = getattr(mod, "_state", None) if mod else None
            handle = state.get("lib") if isinstance(state, dict) else None
            if handle is not None and hasattr(handle, "oomshim_framework_oom"):
                lib = handle
        if lib is None:
            _shim_lib = False
            return None
        c = ctypes
        for name, args, result in (
            ("oomshim_framework_oom", [c.c_char_p, c.c_size_t, c.c_char_p, c.c_size_t], c.c_int),
            ("oomshim_framework_oom_wanted", [c.c_int, c.c_uint64], c.c_int),
            ("oomshim_mark_step", [c.c_int], c.c_int),
            ("oomshim_mark_step_live", [c.c_int, c.c_uint64, c.c_uint64], c.c_int),
            ("oomshim_note_step", [c.c_int, c.c_uint64, c.c_uint64], None),
            ("oomshim_steps_grow", [c.c_int], c.c_int),
            ("oomshim_framework_attached", [c.c_char_p], None),
            ("oomshim_framework_kinds", [c.c_char_p, c.c_size_t], c.c_int),
        ):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = args
                fn.restype = result
        _shim_lib = lib
    return _shim_lib or None


def _watch_code(lib):
    """CPython 3.12+: has the shim count code objects created and destroyed (a code watcher), so
    its Python stacks know a code object by its address while none is freed, instead of checking
    its name, file and line table again at every allocation. Through ctypes.PyDLL: the call must
    hold the GIL. Quiet when it cannot (the shim then checks every frame, as before)."""
    global _code_watcher
    if sys.version_info < (3, 12) or _code_watcher:
        return
    import ctypes

    try:
        fn = ctypes.PyDLL(lib._name).oomshim_watch_python_code
    except (AttributeError, OSError):
        return
    fn.argtypes = []
    fn.restype = ctypes.c_int
    _code_watcher = fn() == 1


# Whether the shim's code watcher counts (_watch_code).
_code_watcher = False


def _tell_shim(account):
    """Hands the framework's account to the shim. Returns (code, dump path or None): 0 the
    account is in the dump, 1 the dump was final before it arrived, 2 the failure repeats an
    earlier dumped one, -1 no dump."""
    import ctypes
    import json

    lib = _shim()
    if lib is None:
        return -1, None
    data = json.dumps(account).encode()
    buf = ctypes.create_string_buffer(4096)
    rc = lib.oomshim_framework_oom(data, len(data), buf, len(buf))
    path = buf.value.decode("utf-8", "replace") if rc >= 0 and buf.value else None
    return rc, path


def _write_private(path, data):
    """Writes `data` to `path` (in the shim's dump directory, which it checked to be private or
    the user's own) through a fresh temporary file that follows no link and no one else can have
    opened: O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, then an atomic rename."""
    import secrets

    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _free_block_summary(snapshot, device):
    """Torch's free blocks on `device`: histogram by power of two, largest, total."""
    bins = {}
    total = largest = 0
    reserved = allocated = inactive_split = 0
    segments = 0
    for seg in snapshot.get("segments", []):
        if seg.get("device") != device:
            continue
        segments += 1
        reserved += seg.get("total_size", 0)
        blocks = seg.get("blocks", [])
        split = len(blocks) > 1
        for b in blocks:
            size = b.get("size", 0)
            if b.get("state") == "active_allocated":
                allocated += size
                continue
            if b.get("state") != "inactive":
                continue
            total += size
            largest = max(largest, size)
            if split:
                inactive_split += size
            lo = 1 << max(size.bit_length() - 1, 0) if size else 0
            entry = bins.setdefault(lo, [0, 0])
            entry[0] += 1
            entry[1] += size
    histogram = [{"lo": lo, "hi": lo * 2, "count": c, "bytes": b} for lo, (c, b) in sorted(bins.items())]
    return {
        "segments": segments,
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "total_free_bytes": total,
        "largest_free_bytes": largest,
        "inactive_split_bytes": inactive_split,
        "fragmentation": (1 - largest / total) if total else None,
        "histogram": histogram,
    }


_count = 0
# torch's allocation records (`_record_memory_history`), turned on by the step marks once the
# shim says the process grows step after step, unless the program records them itself.
_history = {"on": False}


def _attribution(snapshot, device):
    """Live tensors on `device` by the innermost line of the program's own code that allocated
    them, from torch's records (blocks allocated since recording began carry their frames)."""
    lines = {}
    recorded = unrecorded = 0
    for seg in snapshot.get("segments", []):
        if seg.get("device") != device:
            continue
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            size = b.get("size", 0)
            frames = b.get("frames") or []
            if not frames:
                unrecorded += size
                continue
            recorded += size
            own = [f for f in frames if not _library_file(f.get("filename", ""))]
            f = own[0] if own else frames[0]
            key = (f.get("filename", "?"), int(f.get("line", 0) or 0), f.get("name", "?"))
            entry = lines.setdefault(key, [0, 0])
            entry[0] += size
            entry[1] += 1
    if not recorded:
        return None
    top = sorted(lines.items(), key=lambda kv: -kv[1][0])[:10]
    return {"recorded_bytes": recorded, "unrecorded_bytes": unrecorded,
            "lines": [{"file": k[0], "line": k[1], "function": k[2], "bytes": v[0], "blocks": v[1]} for k, v in top]}


def _library_file(path):
    """Installed packages, the standard library, frozen modules and the code torch.compile
    generated: not the program's own code."""
    parts = path.split("/")
    return ("/site-packages/" in path or "/dist-packages/" in path or path.startswith("<frozen")
            or any(part.startswith(("python3.", "python2.", "torchinductor_")) for part in parts)
            or _inductor_output(parts))


def _inductor_output(parts):
    """A module torch.compile's inductor wrote to its code cache, wherever the cache is
    (TORCHINDUCTOR_CACHE_DIR): `XY/cXY<hash>.py` (`c` and 51 characters of base32), the folder
    named by the hash's 2nd and 3rd characters. Its frames run the compiled graph; the program's
    line is further out. src/format/view.rs `is_compiled_graph_file` says the same."""
    if len(parts) < 2:
        return False
    name, folder = parts[-1], parts[-2]
    stem = name[:-3]
    return (name.endswith(".py") and len(stem) == 52 and stem[0] == "c" and folder == stem[1:3]
            and all(ch in _HASH_CHARS for ch in stem))


_HASH_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def _kinds():
    """kinds.py of this package (imported at the first failure that wants it)."""
    from . import kinds

    return kinds


def _kinds_of(torch, device, alloc, frame):
    """Memory by kind at this failure (kinds.py), or None; its failure is one message."""
    try:
        return _kinds().kinds(torch, device, alloc, frame)
    except Exception as e:
        _warn(f"no memory by kind ({type(e).__name__}: {e})")
        return None


def _memory_cap(torch, device, device_total):
    """Under `set_per_process_memory_fraction` torch's observer gets the cap as the device's
    total: the cap and the device's own capacity then, else None."""
    try:
        capacity = int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:
        return None
    try:
        get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get is not None and float(get(device)) >= 1.0:
            return None  # no cap set: a smaller total is the device's own figure
    except Exception:
        pass  # an older torch: the totals alone tell
    if 0 < int(device_total) < capacity:
        return {"bytes": int(device_total), "device_total_bytes": capacity}
    return None


def _dump_wanted(device, alloc):
    """Whether the shim will write a dump for the failure torch raises now (not a repeat of one
    dumped within OOMSHIM_MIN_INTERVAL, not over OOMSHIM_MAX_DUMPS): only then is torch's view
    gathered (its snapshot, the memory by kind), which takes up to seconds in a large process."""
    lib = _shim()
    fn = getattr(lib, "oomshim_framework_oom_wanted", None) if lib is not None else None
    if fn is None:
        return lib is not None
    return fn(int(device), int(alloc)) == 1


def _on_torch_oom(torch, device, alloc, device_total, device_free):
    """torch's OOM observer: (device, requested bytes, device total or allowed maximum, free).
    Runs on the failing thread after torch released its allocator lock, before it raises.
    Whatever it gathers is released before it returns (the program's `except` runs next)."""
    global _count
    try:
        if _allocator_on():
            _on_allocator_oom(torch, device, alloc, device_total, device_free)
            return
        snapshot = name = None
        wanted = _dump_wanted(device, alloc)
        # A failure that gets no dump (a repeat, over the cap) is counted by the shim from the
        # request alone: torch's view would go nowhere.
        account = _torch_account(torch, device, alloc, device_total, device_free, stats=wanted)
        if wanted:
            import socket

            _count += 1
            snapshot = torch.cuda.memory._snapshot()
            rank = os.environ.get("RANK")
            name = f"oomshim-torch-{socket.gethostname()}-{os.getpid()}" + (f"-r{rank}" if rank else "") + f"-{_count}"
            account.update({
                "cache": _free_block_summary(snapshot, device),
                "snapshot_file": name + ".pickle",
                "memory_cap": _memory_cap(torch, device, device_total),
            })
            if _history["on"]:
                account["attribution"] = _attribution(snapshot, device)
            account["kinds"] = _kinds_of(torch, device, alloc, sys._getframe(1))
        # One call for both (the shim tells a repeat by the Python stack it is called from).
        rc, dump = _tell_shim(account)
        if not wanted or dump is None or rc == 2:
            return  # no dump explains it, or an earlier dump does (a repeat): nothing to add
        _save_torch_view(account, snapshot, name, dump, rc)
    except Exception as e:  # never into the program
        _warn(f"could not give the shim torch's view ({type(e).__name__}: {e})")


def _save_torch_view(account, snapshot, name, dump, rc):
    """torch's snapshot beside the dump (for memory_viz), and with `rc` 1 (the dump was final
    before torch's word arrived, OOMSHIM_SETTLE=0) its account as a side file, which `oomshim
    report` merges (matched by pid, device and request)."""
    import pickle

    d = os.path.dirname(dump)
    _write_private(os.path.join(d, name + ".pickle"), pickle.dumps(snapshot))
    if rc == 1:
        import json
        import socket
        import time

        rank = os.environ.get("RANK")
        side = dict(account, schema="oomshim.torch/1", pid=os.getpid(), host=socket.gethostname(),
                    rank=int(rank) if rank and rank.isdigit() else None,
                    time_unix_ms=int(time.time() * 1000), dump=os.path.basename(dump))
        _write_private(os.path.join(d, name + ".json"), json.dumps(side, indent=1).encode())


def _on_allocator_oom(torch, device, alloc, device_total, device_free):
    """The observer in allocator mode (oomshim's package calls it from inside the shim's failing
    allocation, before the dump is written): the memory by kind and the phase, for that dump. No
    snapshot or cache summary: the shim's dump has the allocator's exact blocks."""
    wanted = _dump_wanted(device, alloc)
    account = _torch_account(torch, device, alloc, device_total, device_free, stats=wanted)
    if wanted:
        account["kinds"] = _kinds_of(torch, device, alloc, sys._getframe(2))
    _tell_shim(account)


def _torch_account(torch, device, alloc, device_total, device_free, stats=True):
    """What both observers tell the shim of every failure: the request, torch's numbers for the
    device and (with `stats`) its allocator's counters."""
    counters = {}
    try:
        s = torch.cuda.memory_stats(device) if stats else {}
        counters = {k: int(s[k]) for k in ("inactive_split_bytes.all.current", "reserved_bytes.all.current",
                                           "allocated_bytes.all.current", "num_alloc_retries", "num_ooms") if k in s}
    except Exception:
        pass
    return {
        "schema": _SCHEMA,
        "framework": "torch",
        "version": getattr(torch, "__version__", None),
        "raised": True,
        "device": int(device),
        "request_bytes": int(alloc),
        "device_total_bytes": int(device_total),
        "device_free_bytes": int(device_free),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "stats": counters,
    }


# How often, at most, the memory by kind is counted for the live region (oomshim top, the
# exporter): oomshim_core::flight::LIVE_KINDS_EVERY_S.
_LIVE_KINDS_EVERY_S = 10
_live_next = [0.0]


def _live_kinds(torch, lib):
    """At an optimizer step, at most every _LIVE_KINDS_EVERY_S seconds: memory by kind now, for
    the shim's live region. Never initialises CUDA (a program training on the CPU gets none). A
    failure ends it, said once (a torch without these entry points silently)."""
    import time

    now = time.monotonic()
    # Once torch's history is on, its records name the line that keeps the growth: the first
    # count with them comes a second after it started (records to read), not up to 10 s later.
    records_due = _history["on"] and not _history.get("sent") and now >= _history.get("since", now) + 1.0
    if (now < _live_next[0] and not records_due) or not hasattr(lib, "oomshim_framework_kinds"):
        return
    try:
        if not torch.cuda.is_initialized():
            return
    except Exception:
        _live_next[0] = float("inf")
        return
    _live_next[0] = now + _LIVE_KINDS_EVERY_S
    try:
        import json

        device = int(torch.cuda.current_device())
        message = {"device": device, "kinds": _kinds().live(torch, device)}
        if _history["on"]:
            # Where the live tensors were allocated, by torch's records (under preload the shim
            # sees only segments): a post-mortem names the line from them.
            message["attribution"] = _attribution(torch.cuda.memory._snapshot(), device)
            _history["sent"] = True
        data = json.dumps(message).encode()
        lib.oomshim_framework_kinds(data, len(data))
    except AttributeError:
        _live_next[0] = float("inf")
    except Exception as e:
        _live_next[0] = float("inf")
        _warn(f"no live memory by kind ({type(e).__name__}: {e})")


# oomshim_note_step's "unknown" (no figure of torch's).
_UNKNOWN = (1 << 64) - 1
# A mark asks the shim whether the steps grow (a fit over its samples, about 80 µs; the mark itself
# about 3 µs) only once this many times the last answer's time has passed since it: at most 1/20th
# of the program's time goes to it, every step of a slow loop is asked about, and the forwards of
# OOMSHIM_AUTO_STEPS=forward share one ask among dozens.
_GROWTH_SHARE = 20


def _auto_steps():
    """OOMSHIM_AUTO_STEPS: what the hook marks as steps. Unset (or `optimizer`, `1`): optimizer
    steps; `forward`: also every forward pass of the outermost module; `0`: nothing."""
    v = os.environ.get("OOMSHIM_AUTO_STEPS", "").strip().lower()
    if v in ("0", "off", "no", "false"):
        return ()
    if v == "forward":
        return ("optimizer", "forward")
    if v not in ("", "1", "on", "yes", "true", "optimizer"):
        _warn(f"OOMSHIM_AUTO_STEPS={v!r} is not one of optimizer, forward, 0: optimizer steps are marked")
    return ("optimizer",)


def _is_compiling_of(torch):
    """torch.compiler.is_compiling: dynamo traces it as the constant True, so a hook it traces
    returns before doing anything (nothing of oomshim's enters a compiled graph)."""
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return fn if callable(fn) else (lambda: False)


def _tracing_of(torch, is_compiling):
    """A check for "the program's modules run under a tracer": dynamo, torch.jit.trace or
    torch.fx's symbolic tracing (whose proxies a hook must not touch: every attribute it reads
    would become a node of the program's graph)."""
    get_state = getattr(getattr(torch, "_C", None), "_get_tracing_state", None)

    def tracing():
        if is_compiling():
            return True
        if get_state is not None and get_state() is not None:
            return True
        fx = sys.modules.get("torch.fx._symbolic_trace")
        symbolic = getattr(fx, "is_fx_symbolic_tracing", None) or getattr(fx, "is_fx_tracing", None)
        return bool(symbolic is not None and symbolic())

    return tracing


def _torch_live(torch):
    """torch's own count of its live tensors: (allocated bytes, allocations), or None before CUDA
    is initialised (never initialises it). Under preload the shim sees torch's segments, which a
    cache grows with varying shapes though no tensor is kept; a leak accumulates tensors."""
    try:
        if not torch.cuda.is_initialized():
            return None
        stats = torch.cuda.memory_stats(torch.cuda.current_device())
        return int(stats["allocated_bytes.all.current"]), int(stats.get("allocation.all.current", _UNKNOWN))
    except Exception:
        return None


def _record_history(torch):
    """torch's allocation records, so that a dump names the line that keeps a growth: turned on
    once, only when the program does not record them itself (whatever it chose, `enabled`,
    `max_entries`, `stacks`, stays as it is, and its records serve the dump)."""
    if _history["on"] or _history.get("tried"):
        return
    _history["tried"] = True
    try:
        # Asks CUDA, which the growth already initialised (it came from torch's CUDA counters).
        recording = torch._C._cuda_isHistoryEnabled()
    except Exception as e:
        _warn(f"torch's allocation records stay off: this torch cannot say whether the program "
              f"records them ({type(e).__name__}: {e})")
        return
    import time

    if not recording:
        try:
            torch.cuda.memory._record_memory_history(enabled="state", context="alloc", stacks="python")
        except Exception as e:
            _warn(f"torch's allocation records are off ({type(e).__name__}: {e})")
            return
    _history["on"] = True
    _history["since"] = time.monotonic()


def _mark_steps(torch, lib):
    """Step marks without user code: optimizer steps (every optimizer's, through torch's global
    post-hook), and with OOMSHIM_AUTO_STEPS=forward forward passes of the outermost module. When
    the shim says the process grows step after step, torch is asked to record the Python stack of
    each new tensor (preload only: in allocator mode the shim sees every tensor itself), so the
    dump can name the line that holds the growth."""
    import time

    wanted = _auto_steps()
    record = not _off("OOMSHIM_TORCH_HISTORY")
    is_compiling = _is_compiling_of(torch)
    note = getattr(lib, "oomshim_note_step", None)
    grows = getattr(lib, "oomshim_steps_grow", None)
    next_ask = [0.0]

    def mark(source):
        """One step of `source` (1 optimizer, 2 forward); asks whether the steps grow as often as
        _GROWTH_SHARE allows."""
        allocator = _allocator_on()
        live = None if allocator else _torch_live(torch)
        if note is None or grows is None:
            # A library without the split calls (allocator mode may load another build).
            growing = (lib.oomshim_mark_step(source) if live is None
                       else lib.oomshim_mark_step_live(source, live[0], live[1]))
        else:
            note(source, *(live or (_UNKNOWN, _UNKNOWN)))
            if allocator or not record or _history["on"] or _history.get("tried"):
                return
            now = time.perf_counter()
            if now < next_ask[0]:
                return
            growing = grows(source)
            next_ask[0] = now + (time.perf_counter() - now) * (_GROWTH_SHARE + 1)
        if growing == 1 and record and not allocator:
            _record_history(torch)

    if "optimizer" in wanted:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def stepped(optimizer, args, kwargs):
            if is_compiling():
                return None  # a compiled optimizer step: dynamo traces this as a no-op
            try:
                _kinds().seen_optimizer(optimizer)
                mark(1)
                _live_kinds(torch, lib)
            except Exception as e:
                _warn(f"an optimizer step was not marked ({type(e).__name__}: {e})")
            return None

        # Never removed: a compiled optimizer step guards on torch's global hooks.
        register_optimizer_step_post_hook(stepped)
    if "forward" in wanted:
        _mark_forwards(torch, mark, is_compiling)


def _mark_forwards(torch, mark, is_compiling):
    """OOMSHIM_AUTO_STEPS=forward: every forward pass of the outermost module with parameters is
    a step, seen by a global forward pre-hook and post-hook (torch's registry: nothing is put on
    the program's modules, where it would travel with `torch.save(model)`, `copy.deepcopy` and
    `torch.jit.script`). Every module call pays for them, and they are never removed: a compiled
    graph that saw them keeps guarding on them (dynamo traces them as no-ops, see
    `_is_compiling_of`), and torch.compile warns that global hooks are in place."""
    import threading

    from torch.nn.modules import module as torch_module

    tracing = _tracing_of(torch, is_compiling)
    tensor = getattr(torch, "Tensor", None)
    local = threading.local()

    # Every module call runs both: the depth is all they keep up, the rest is for the outermost
    # call (a tracer's calls count too, and are left alone there).
    def pre(module, args):
        if is_compiling():
            return None
        try:
            local.depth += 1
        except AttributeError:
            local.depth = 1
        return None

    def post(module, args, output):
        if is_compiling():
            return None
        try:
            local.depth -= 1
            if local.depth != 0 or tracing() or next(module.parameters(), None) is None:
                return None
            kinds = _kinds()
            kinds.seen_model(module)
            if isinstance(tensor, type):
                kinds.seen_forward(args, tensor)
            mark(2)
        except Exception as e:
            _warn(f"a forward pass was not marked ({type(e).__name__}: {e})")
        return None

    torch_module.register_module_forward_pre_hook(pre)
    try:
        # always_call: a forward that raises still leaves the depth right.
        torch_module.register_module_forward_hook(post, always_call=True)
    except TypeError:
        torch_module.register_module_forward_hook(post)


def _enable_allocator(torch):
    """`oomshim run --torch-allocator`: make oomshim torch's allocator, right after the program
    imported torch (before it can have initialised CUDA), unless the program asks for a feature
    torch cannot run on a pluggable allocator (then torch keeps its own and the shim watches it as
    under LD_PRELOAD). True when allocator mode is on."""
    try:
        mode = _torch_mode(load=True)
        if os.environ.get("OOMSHIM_TORCH_ALLOCATOR", "").strip().lower() != "force":
            found = mode.unservable_uses()
            if found:
                where, feature = found[0]
                sys.stderr.write(
                    f"oomshim: allocator mode is off for this process, torch keeps its own allocator "
                    f"(watched as under LD_PRELOAD): {where} uses {feature}, which torch cannot run on "
                    f"a pluggable allocator (OOMSHIM_TORCH_ALLOCATOR=force overrides)\n")
                return False
        mode.enable()
        return True
    except Exception as e:
        _warn(f"allocator mode is off, torch keeps its own allocator ({type(e).__name__}: {e})")
        return False


def _attach_torch(torch):
    if os.environ.get("OOMSHIM_TORCH_ALLOCATOR", "").strip().lower() in ("1", "on", "yes", "true", "force"):
        # The shim writes the exact free-block state itself. Not enabled: watched as under
        # LD_PRELOAD.
        _enable_allocator(torch)
    lib = _shim()
    if lib is None:
        return
    try:
        _watch_code(lib)
    except Exception as e:
        _warn(f"Python stacks check every frame ({type(e).__name__}: {e})")
    try:
        def observer(device, alloc, total, free):
            _on_torch_oom(torch, device, alloc, total, free)

        if _allocator_on():
            # oomshim.torch answers the attach (torch refuses it under a pluggable allocator) and
            # has the shim call the observer before it writes the failure's dump. Attached now,
            # before the program's own observers: the kinds are counted before those run.
            torch._C._cuda_attach_out_of_memory_observer(observer)
        else:
            def register():
                # Runs inside torch's lazy CUDA initialisation: nothing may escape into it (the
                # cudaMallocAsync backend, for one, refuses OOM observers).
                try:
                    torch._C._cuda_attach_out_of_memory_observer(observer)
                    lib.oomshim_framework_attached(b"torch")
                except Exception as e:
                    _warn(f"torch's out-of-memory observer is off ({type(e).__name__}: {e}); dumps come "
                          f"without torch's view of its cache")

            torch.cuda._lazy_call(register)
    except Exception as e:
        _warn(f"could not attach to torch ({type(e).__name__}: {e})")
    try:
        _mark_steps(torch, lib)
    except Exception as e:
        _warn(f"no automatic step marks ({type(e).__name__}: {e})")


def _xla_oom(exc):
    """An XLA out-of-memory error reaching the top of a thread: the shim gets XLA's account."""
    text = str(exc)
    if "RESOURCE_EXHAUSTED" not in text:
        return
    try:
        import re

        # "allocate 17179869184 bytes", "allocate 4B", "allocate 16.00GiB".
        m = re.search(r"allocate (\d+(?:\.\d+)?)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b", text)
        units = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
                 "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4}
        where = ""
        tb = exc.__traceback__
        frame = None
        while tb is not None:
            f = tb.tb_frame.f_code.co_filename
            if "site-packages" not in f and "dist-packages" not in f and not f.startswith("<"):
                frame = tb
            tb = tb.tb_next
        if frame is not None:
            code = frame.tb_frame.f_code
            where = f" (raised at {code.co_filename}:{frame.tb_lineno} in {code.co_name})"
        jax = sys.modules.get("jax")
        _tell_shim({
            "schema": _SCHEMA,
            "framework": "xla",
            "version": getattr(jax, "__version__", None),
            "raised": True,
            "device": 0,
            "request_bytes": int(float(m.group(1)) * units[m.group(2)]) if m else None,
            "message": text[:800] + where,
        })
    except Exception as e:
        _warn(f"could not give the shim XLA's error ({type(e).__name__}: {e})")


def _attach_jax(jax):
    lib = _shim()
    if lib is not None:
        try:
            _watch_code(lib)
        except Exception as e:
            _warn(f"Python stacks check every frame ({type(e).__name__}: {e})")
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        _xla_oom(value)
        previous(kind, value, tb)

    sys.excepthook = excepthook
    try:
        import threading

        previous_thread = threading.excepthook

        def thread_excepthook(args):
            _xla_oom(args.exc_value)
            previous_thread(args)

        threading.excepthook = thread_excepthook
    except Exception:
        pass


# What the import watcher waits for, and what it then calls with the module.
_WATCHED = {"torch": _attach_torch, "jax": _attach_jax}


class _ImportWatcher:
    """A meta-path finder that only watches: when the program imports torch or jax, let it load
    as usual and attach afterwards. Every spec it hands out for a watched name carries the
    attachment, and the name stays watched until a module is actually executed: a probe such as
    `importlib.util.find_spec("torch")` before the import (transformers, accelerate and
    Lightning check availability that way) does not use the hook up."""

    def __init__(self):
        # (thread, name) pairs being resolved by this finder's own find_spec call below.
        self._resolving = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED:
            return None
        import _thread

        key = (_thread.get_ident(), name)
        if key in self._resolving:
            return None  # our own lookup below: let the other finders answer
        import importlib.util

        self._resolving.add(key)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            return None
        finally:
            self._resolving.discard(key)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            attach = _WATCHED.pop(name, None)
            if not _WATCHED:
                try:
                    sys.meta_path.remove(self)
                except ValueError:
                    pass
            if attach is None:
                return
            try:
                attach(module)
            except Exception as e:
                _warn(f"could not attach to {name} ({type(e).__name__}: {e})")

        try:
            loader.exec_module = exec_module
        except Exception:
            return spec
        return spec


def _install():
    for name in list(_WATCHED):
        if name in sys.modules:
            _WATCHED.pop(name)(sys.modules[name])
    if _WATCHED:
        sys.meta_path.insert(0, _ImportWatcher())
