"""GPU check (run with torchrun --nproc_per_node=2): two ranks on the one GPU, gloo backend
(NCCL refuses two ranks on one device). Rank 1 leaks 1 GiB tensors until it runs out of memory;
rank 0 holds a steady 10 GiB. Both then meet at a barrier and exit cleanly, so rank 0's
OOMSHIM_AT_EXIT dump is written. Prints one JSON line per rank."""
import json
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    kept = []
    result = {"rank": rank}
    if rank == 1:
        try:
            while True:
                kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # the leak
        except torch.cuda.OutOfMemoryError:
            result["oom_after_gib"] = len(kept)
    else:
        kept.append(torch.empty(10 << 30, dtype=torch.uint8, device="cuda"))
    dist.barrier()
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
