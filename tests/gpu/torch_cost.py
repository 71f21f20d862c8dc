"""GPU check: cost of a `torch.empty` + `del` loop, printed as one JSON line.
argv[1]: plain | hist_python | hist_all  (torch's own _record_memory_history, for comparison).
Run under LD_PRELOAD=liboomshim.so with OOMSHIM_STACKS=off|native|python|all for the shim's cost,
and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor reaches cudaMalloc/cudaFree."""
import json
import sys
import time

import torch


def loop(n):
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(1024, device="cuda")
        del x
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    if mode == "hist_python":
        torch.cuda.memory._record_memory_history(stacks="python")
    elif mode == "hist_all":
        torch.cuda.memory._record_memory_history()
    loop(2000)  # warm-up: CUDA context, caches
    runs = sorted(loop(n) for _ in range(5))
    print(json.dumps({"mode": mode, "us_per_iter": runs[2]}))


if __name__ == "__main__":
    main()
