"""GPU check of ranks in one job (run with torchrun --nproc_per_node=2): two ranks sharing the one GPU.
Backend from OOMSHIM_RANKS_BACKEND (nccl or gloo). Each rank first does one all_reduce, so NCCL
allocates its buffers; rank 1 then leaks 1 GiB tensors until it runs out of memory, rank 0 holds a
steady 8 GiB. Both meet at a barrier and exit cleanly (rank 0's OOMSHIM_AT_EXIT dump is written).
Prints one JSON line per rank."""
import json
import os

import torch
import torch.distributed as dist


def main():
    backend = os.environ.get("OOMSHIM_RANKS_BACKEND", "gloo")
    torch.cuda.set_device(0)
    dist.init_process_group(backend)
    rank = dist.get_rank()
    t = torch.ones(1 << 20, device="cuda") if backend == "nccl" else torch.ones(1 << 20)
    dist.all_reduce(t)
    result = {"rank": rank, "backend": backend, "sum": float(t[0])}
    if os.environ.get("OOMSHIM_RANKS_DUMP_AFTER_INIT") == "1":
        # A dump while the communicator (and NCCL's buffers) is alive; the exit dump comes after
        # destroy_process_group has freed them.
        # The package from the checkout (oomshim's hook adds no importable name of its own).
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shim", "python"))
        import oomshim

        result["dumped"] = oomshim.dump("after_all_reduce")
    kept = []
    if rank == 1:
        try:
            while True:
                kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # the leak
        except torch.cuda.OutOfMemoryError:
            result["oom_after_gib"] = len(kept)
            kept.clear()
            torch.cuda.empty_cache()
    else:
        kept.append(torch.empty(8 << 30, dtype=torch.uint8, device="cuda"))
    dist.barrier()
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
