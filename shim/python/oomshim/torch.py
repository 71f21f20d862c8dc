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

An allocation that cannot be served, even after the cache was emptied and the request retried,
raises `torch.OutOfMemoryError` (a `RuntimeError` where torch's C++ error type is not found),
with torch's wording plus oomshim's verdict and the path of the dump it wrote.

The library is found by this rule, first match wins:
  1. the `OOMSHIM_LIB` environment variable (a path to liboomshim.so);
  2. the liboomshim.so already loaded in this process (by `oomshim run` or LD_PRELOAD), so there
     is only ever one copy of the shim's state;
  3. liboomshim.so inside this package (the wheel);
  4. the build directory of the repository this package sits in (target/release, or
     target/release/deps where `cargo run` leaves it; the newer of the two).
"""

import ctypes
import json

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
]

_ALLOC = "oomshim_torch_alloc"
_FREE = "oomshim_torch_free"

_state = {"lib": None, "path": None, "allocator": None, "keep": []}


def library_path():
    """Where liboomshim.so is, by the documented rule (see oomshim._locate.library_path); raises
    FileNotFoundError naming every place it looked."""
    return _locate.library_path()


def _lib():
    if _state["lib"] is None:
        path = library_path()
        lib = ctypes.CDLL(path)
        for name in ("oomshim_torch_memory_stats", "oomshim_torch_free_blocks"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
            fn.restype = ctypes.c_size_t
        for name in ("oomshim_torch_reset_peak", "oomshim_torch_reset_accumulated"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_int]
            fn.restype = None
        lib.oomshim_torch_exception_kind.restype = ctypes.c_char_p
        lib.oomshim_dump.argtypes = [ctypes.c_char_p]
        lib.oomshim_dump.restype = ctypes.c_int
        _state["lib"], _state["path"] = lib, path
    return _state["lib"]


def enabled():
    """True once enable() made oomshim torch's CUDA allocator in this process."""
    return _state["allocator"] is not None


def enable(patch_torch=True):
    """Makes oomshim PyTorch's CUDA allocator. Must run before CUDA is initialised (before the
    first CUDA tensor, `torch.cuda.set_device`, `current_device()`...): torch cannot swap an
    allocator that already handed out memory. Calling it again is harmless."""
    import torch

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

    for name, fn in (
        ("_cuda_memoryStats", memory_stats),
        ("_cuda_resetPeakMemoryStats", reset_peak),
        ("_cuda_resetAccumulatedMemoryStats", reset_accumulated),
    ):
        if hasattr(C, name):
            setattr(C, name, fn)


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
        import torch

        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is not None:
        return index
    if isinstance(device, str) and ":" in device:
        return int(device.rsplit(":", 1)[1])
    import torch

    return torch.cuda.current_device()


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
