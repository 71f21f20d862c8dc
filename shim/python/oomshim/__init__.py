"""oomshim from Python: ask the running shim (liboomshim.so, loaded by `oomshim run` or
LD_PRELOAD) for a dump.

    import oomshim
    oomshim.dump("before-eval")     # writes a dump now; returns its success
    oomshim.step()                  # marks a training step (growth per step, leak verdict)

The package is pure Python and never loads CUDA or torch; without the shim in the process,
dump() raises RuntimeError saying how to load it.
"""

import ctypes

__all__ = ["dump", "loaded", "step"]


def _entry():
    try:
        return ctypes.CDLL(None).oomshim_dump
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
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = ctypes.c_int
    return fn(str(reason).encode("utf-8", "replace")) == 0


_step_fn = None


def step():
    """Marks the end of a training step. The shim samples the live device bytes of each
    allocation site at every mark; a dump then reports the sites that grow step after step
    (its `growth` key, and the `leak` verdict). Returns True when the shim saw the mark. Without
    the shim in the process it does nothing and returns False, so it can stay in the loop."""
    global _step_fn
    if _step_fn is None:
        try:
            fn = ctypes.CDLL(None).oomshim_step
        except (AttributeError, OSError):
            return False
        fn.argtypes = []
        fn.restype = None
        _step_fn = fn
    _step_fn()
    return True
