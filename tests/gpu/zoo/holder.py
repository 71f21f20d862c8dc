"""The other process of other_process.py: holds all but 20 GiB of the GPU until killed."""
import time

import torch

free, _ = torch.cuda.mem_get_info()
x = torch.empty(free - (20 << 30), dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(600)
