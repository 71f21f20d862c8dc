"""Two different out-of-memory errors 3 ms apart: a request twice the device that is caught,
then a 2 GiB one that fails because the cache is fragmented."""
import time

import torch

GiB = 1 << 30
free, total = torch.cuda.mem_get_info()
n = free // GiB - 1
blocks = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
kept = []
for i in range(n):
    blocks[i] = None
    kept.append(torch.empty(600 << 20, dtype=torch.uint8, device="cuda"))
try:
    huge = torch.empty(2 * total, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    print("the buffer twice the device does not fit")
time.sleep(0.003)
big = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")  # EXPECT-LINE
