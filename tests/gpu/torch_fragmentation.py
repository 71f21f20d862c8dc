"""GPU check: fragmentation in PyTorch's cache (the brief's case). Fill the GPU with 1 GiB
tensors, then replace each by a 600 MiB tensor: torch reuses each 1 GiB segment and splits it,
leaving ~57 GiB "reserved but unallocated" in 424 MiB pieces, so a 2 GiB request fails although
the cache holds far more than 2 GiB free. Prints one JSON line with torch's own numbers."""
import json
import sys

import torch

GiB = 1 << 30


def main():
    free, _ = torch.cuda.mem_get_info()
    n = free // GiB - 1
    big = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    keep = []
    for i in range(n):
        big[i] = None  # the 1 GiB block goes back to torch's cache...
        keep.append(torch.empty(600 << 20, dtype=torch.uint8, device="cuda"))  # ...and is split
    result = {"segments": n}
    try:
        torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
        result["raised"] = None
    except torch.cuda.OutOfMemoryError as e:
        result.update(raised=type(e).__name__, reserved=torch.cuda.memory_reserved(),
                      allocated=torch.cuda.memory_allocated())
    print(json.dumps(result))
    return 0 if result["raised"] else 1


if __name__ == "__main__":
    sys.exit(main())
