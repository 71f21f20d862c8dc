"""oomshim's hook for Python programs started by `oomshim run`.

`oomshim run` puts this directory first on PYTHONPATH, so Python imports this file at start-up
as `sitecustomize`. It then:

- runs the program's own `sitecustomize`, if one exists further down the path, so nothing the
  user had is lost;
- waits for the program to import torch itself (it never imports torch into a program that
  doesn't);
- with `--torch-allocator` (OOMSHIM_TORCH_ALLOCATOR=1), makes oomshim torch's CUDA allocator
  (`oomshim.torch.enable()`) right after torch is imported, and stops there;
- otherwise registers torch's out-of-memory observer through torch's lazy-initialisation queue, so CUDA
  is never initialised early (that would break programs that fork workers or choose devices
  later).

When torch raises OutOfMemoryError, the observer saves two files next to the shim's dump in
OOMSHIM_DIR:

- a summary of torch's cache: reserved and allocated bytes, free blocks, fragmentation, and the
  PYTORCH_CUDA_ALLOC_CONF in force;
- `torch.cuda.memory._snapshot()` itself.

`oomshim report` merges these into its report. Set OOMSHIM_TORCH_HOOK=0 to switch all of this
off. The hook never raises into the program; its own failures are reported once on stderr.
"""

import importlib.machinery
import importlib.util
import json
import os
import socket
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCHEMA = "oomshim.torch/1"
_said = False


def _warn(msg):
    global _said
    if not _said:
        _said = True
        try:
            sys.stderr.write(f"oomshim: torch hook: {msg}\n")
        except Exception:
            pass


def _chain_user_sitecustomize():
    """Run the sitecustomize this one shadows, as Python would have."""
    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _dump_dir():
    d = os.environ.get("OOMSHIM_DIR") or "oomshim-dumps"
    return d


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


def _write_atomic(path, data):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_count = 0
_last_saved = None


def _min_interval():
    """OOMSHIM_MIN_INTERVAL as the shim reads it ("10s", "100ms", "2m", "5"): seconds."""
    raw = os.environ.get("OOMSHIM_MIN_INTERVAL", "10s").strip().lower()
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("", 1.0))
    for suffix, scale in units:
        if raw.endswith(suffix):
            try:
                return max(float(raw[: len(raw) - len(suffix)] if suffix else raw) * scale, 0.0)
            except ValueError:
                break
    return 10.0


def _on_oom(torch, device, alloc, device_total, device_free):
    """torch's OOM observer: (device, requested bytes, device total or allowed maximum, free)."""
    global _count, _last_saved
    try:
        import pickle
        import time

        # A program that catches OutOfMemoryError and goes on may fail many times a second:
        # like the shim's own dumps, one snapshot per OOMSHIM_MIN_INTERVAL is enough.
        now = time.monotonic()
        if _last_saved is not None and now - _last_saved < _min_interval():
            return
        _last_saved = now

        _count += 1
        snapshot = torch.cuda.memory._snapshot()
        stats = {}
        try:
            s = torch.cuda.memory_stats(device)
            stats = {k: s[k] for k in ("inactive_split_bytes.all.current", "reserved_bytes.all.current",
                                       "allocated_bytes.all.current", "num_alloc_retries", "num_ooms") if k in s}
        except Exception:
            pass
        rank = os.environ.get("RANK")
        name = f"oomshim-torch-{socket.gethostname()}-{os.getpid()}" + (f"-r{rank}" if rank else "") + f"-{_count}"
        d = _dump_dir()
        os.makedirs(d, exist_ok=True)
        summary = {
            "schema": _SCHEMA,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": int(rank) if rank and rank.isdigit() else None,
            "device": device,
            "request_bytes": alloc,
            "device_total_bytes": device_total,
            "device_free_bytes": device_free,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "torch_version": getattr(torch, "__version__", None),
            "stats": stats,
            "cache": _free_block_summary(snapshot, device),
            "snapshot_file": name + ".pickle",
        }
        import time
        summary["time_unix_ms"] = int(time.time() * 1000)
        _write_atomic(os.path.join(d, name + ".pickle"), pickle.dumps(snapshot))
        _write_atomic(os.path.join(d, name + ".json"), json.dumps(summary, indent=1).encode())
    except Exception as e:  # never into the program
        _warn(f"could not save torch's snapshot ({type(e).__name__}: {e})")


def _allocator_mode():
    return os.environ.get("OOMSHIM_TORCH_ALLOCATOR", "").strip().lower() in ("1", "on", "yes", "true")


def _enable_allocator(torch):
    """`oomshim run --torch-allocator`: make oomshim torch's allocator, right after the program
    imported torch (before it can have initialised CUDA)."""
    try:
        import oomshim.torch

        oomshim.torch.enable()
    except Exception as e:
        _warn(f"allocator mode is off, torch keeps its own allocator ({type(e).__name__}: {e})")


def _attach(torch):
    if _allocator_mode():
        # torch's OOM observer and snapshot do not exist under a pluggable allocator; the shim
        # writes the exact free-block state itself.
        _enable_allocator(torch)
        return
    try:
        def register():
            torch._C._cuda_attach_out_of_memory_observer(
                lambda device, alloc, total, free: _on_oom(torch, device, alloc, total, free))
        torch.cuda._lazy_call(register)
    except Exception as e:
        _warn(f"could not attach to torch ({type(e).__name__}: {e})")


class _TorchImportWatcher:
    """A meta-path finder that only watches: when the program imports torch, let it load as
    usual and attach afterwards."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _attach(module)

        try:
            loader.exec_module = exec_module
        except Exception:
            return spec
        return spec


def _install():
    if os.environ.get("OOMSHIM_TORCH_HOOK", "1").strip().lower() in ("0", "off", "no", "false"):
        return
    if "torch" in sys.modules:
        _attach(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())


try:
    _install()
except Exception as e:
    _warn(f"not installed ({type(e).__name__}: {e})")

try:
    _chain_user_sitecustomize()
except Exception:
    # The user's own sitecustomize failed: Python would print that and go on; so do we.
    import traceback
    traceback.print_exc()
