"""Fragmentation as the program's first out-of-memory error: 1 GiB blocks each replaced by a
600 MiB tensor leave ~57 GiB free in torch's cache, in 424 MiB pieces; a 2 GiB request fails."""
import torch

GiB = 1 << 30
free, _ = torch.cuda.mem_get_info()
n = free // GiB - 1
blocks = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
kept = []
for i in range(n):
    blocks[i] = None
    kept.append(torch.empty(600 << 20, dtype=torch.uint8, device="cuda"))
print("fragmented")
big = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")  # EXPECT-LINE
