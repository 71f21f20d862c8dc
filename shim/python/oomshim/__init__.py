"""oomshim from Python: ask the running shim (liboomshim.so, loaded by `oomshim run` or
LD_PRELOAD) for a dump.

    import oomshim
    oomshim.dump("before-eval")     # writes a dump now; returns its success
    oomshim.step()                  # marks a training step (growth per step, leak verdict)
    oomshim.set_recording("totals") # what the shim records from now on (benchmarks); returns
                                    # the mode before

The package is pure Python and never loads CUDA or torch; without the shim in the process,
dump() raises RuntimeError saying how to load it.
"""

import ctypes as _ctypes
import sys as _sys

__all__ = ["dump", "loaded", "step", "set_recording", "recording", "RECORDING_MODES"]


def __dir__():
    return sorted(__all__)


# The modes of oomshim_set_recording, by their C numbers.
RECORDING_MODES = ("pass-through", "totals", "native", "all", "python")


def _entry():
    try:
        return _ctypes.CDLL(None).oomshim_dump
    except (AttributeError, OSError):
        return None


def loaded():
    """True when liboomshim.so is loaded in this process."""
    return _entry() is not None


def dump(reason="python"):
    """Writes a dump of the shim's ledger now, with `reason` as its reason. Returns True when a
    dump was written (its path is printed on stderr by the shim)."""
    fn = _entry()
    if fn is None:
        raise RuntimeError(
            "liboomshim.so is not loaded in this process: start the program with "
            "`oomshim run -- python ...` or LD_PRELOAD=/path/to/liboomshim.so"
        )
    fn.argtypes = [_ctypes.c_char_p]
    fn.restype = _ctypes.c_int
    return fn(str(reason).encode("utf-8", "replace")) == 0


_step_fn = None


def step():
    """Marks the end of a training step. The shim samples the live device bytes of each
    allocation site at every mark; a dump then reports the sites that grow step after step
    (its `growth` key, and the `leak` verdict). Returns True when the shim saw the mark. Without
    the shim in the process it does nothing and returns False, so it can stay in the loop."""
    global _step_fn
    if _step_fn is None:
        fn = _shim_function("oomshim_step")
        if fn is None:
            return False
        fn.argtypes = []
        fn.restype = None
        _step_fn = fn
    _step_fn()
    return True


def _shim_function(name):
    """`name` in the shim of this process: the preloaded one (global scope), else the one
    allocator mode loaded (oomshim.torch, a private ctypes handle); None without a shim."""
    try:
        return getattr(_ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        pass
    # `oomshim.torch` is oomshim's Python hook's copy where the hook turned allocator mode on.
    for module in (__name__ + ".torch", "_oomshim_hook.allocator"):
        state = getattr(_sys.modules.get(module), "_state", None)
        lib = state.get("lib") if isinstance(state, dict) else None
        if lib is not None:
            return getattr(lib, name, None)
    return None


def set_recording(mode):
    """Switches what the shim records from now on, and returns the mode before:
    "pass-through" (hooks only forward), "totals" (sizes and totals, no stacks), "native"
    (native stacks), "all" (native and Python stacks), "python" (Python stacks). Safe at any
    moment: an allocation made in one mode may be freed in another. For benchmarks that
    alternate modes in blocks inside one process. Raises ValueError for an unknown mode and
    RuntimeError without the shim in the process."""
    if mode not in RECORDING_MODES:
        raise ValueError("unknown recording mode %r; one of %s" % (mode, ", ".join(RECORDING_MODES)))
    fn = _shim_function("oomshim_set_recording")
    if fn is None:
        raise RuntimeError("liboomshim.so is not loaded in this process")
    fn.argtypes = [_ctypes.c_int]
    fn.restype = _ctypes.c_int
    before = fn(RECORDING_MODES.index(mode))
    if before < 0:
        raise RuntimeError("the shim is off in this process (see its message on stderr)")
    return RECORDING_MODES[before]


def recording():
    """The shim's recording mode now (one of RECORDING_MODES); None without a running shim."""
    fn = _shim_function("oomshim_recording")
    if fn is None:
        return None
    fn.argtypes = []
    fn.restype = _ctypes.c_int
    mode = fn()
    return RECORDING_MODES[mode] if 0 <= mode < len(RECORDING_MODES) else None
