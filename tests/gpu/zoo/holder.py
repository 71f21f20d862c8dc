"""The other process of other_process.py: holds all but a quarter of the GPU until killed."""
import time

import torch

free, total = torch.cuda.mem_get_info()
x = torch.empty(free - total // 4, dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(600)
