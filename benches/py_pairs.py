"""The Python client benches/hook_instructions.rs counts under valgrind: N allocate+free pairs
(libpy_pairs.so's py_pair) from a Python stack of DEPTH + 2 frames (nest() DEPTH times, leaf(),
the module). With `watch`, first has the preloaded shim register its code watcher (CPython
3.12+, as oomshim's hook does when torch or jax is imported) and exits 1 when it could not.

    python py_pairs.py LIBPY_PAIRS N DEPTH watch|nowatch
"""
import ctypes
import sys

lib, n, depth, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if mode == "watch":
    watch = ctypes.PyDLL(None).oomshim_watch_python_code  # under the GIL
    watch.restype = ctypes.c_int
    if watch() != 1:
        sys.exit("py_pairs: the shim registered no code watcher")
pair = ctypes.CDLL(lib).py_pair
pair.argtypes = [ctypes.c_size_t]
pair.restype = ctypes.c_int


def leaf():
    for _ in range(n):
        if pair(512) != 0:
            sys.exit("py_pairs: a CUDA call failed")


def nest(d):
    return leaf() if d == 0 else nest(d - 1)


nest(depth)
