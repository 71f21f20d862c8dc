"""GPU check: time to write a dump of a process with 100,000 live tensors.
argv[1] == "oomshim": under the shim with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor is its
own cudaMalloc, so 100,000 live holders), time `oomshim_dump()`.
argv[1] == "torch": torch's own `_record_memory_history()` (Python and C++ stacks) over the same
tensors, then time `_dump_snapshot()`. Prints one JSON line."""
import ctypes
import json
import os
import sys
import tempfile
import time

import torch


def make(n):
    return [torch.empty(128, device="cuda") for _ in range(n)]


def main():
    who = sys.argv[1]
    n = 100_000
    if who == "torch":
        torch.cuda.memory._record_memory_history()
        keep = make(n)
        path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
        t0 = time.perf_counter()
        torch.cuda.memory._dump_snapshot(path)
        dt = time.perf_counter() - t0
        print(json.dumps({"who": who, "tensors": len(keep), "seconds": dt, "bytes": os.path.getsize(path)}))
    else:
        keep = make(n)
        dump = ctypes.CDLL(None).oomshim_dump
        dump.argtypes = [ctypes.c_char_p]
        t0 = time.perf_counter()
        rc = dump(b"dump-time")
        dt = time.perf_counter() - t0
        print(json.dumps({"who": who, "tensors": len(keep), "seconds": dt, "rc": rc}))


if __name__ == "__main__":
    main()
