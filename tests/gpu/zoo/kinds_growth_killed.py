"""Growth without steps: a loop that only allocates (no model, no optimizer,
no marks) and is SIGKILLed at half the device, as an OOM killer or a scheduler would. The
post-mortem should judge the growth over time (bytes per second, R²). Not yet implemented
(see the kinds branch's report): this program records the truth for when it is.
KINDS: growth_per_s=5GiB killed=1"""
import os
import signal
import sys
import time

import torch

kept = []
free, total = torch.cuda.mem_get_info()
start = time.time()
while sum(t.numel() for t in kept) < total // 2:
    kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # EXPECT-LINE
    time.sleep(0.2)
sys.stderr.write(f"oomshim-kinds-truth: {{\"program\": \"kinds_growth_killed\", \"kept_bytes\": {len(kept) << 30}, "
                 f"\"bytes_per_s\": {(len(kept) << 30) / (time.time() - start):.0f}}}\n")
sys.stderr.flush()
os.kill(os.getpid(), signal.SIGKILL)
