"""A training script that only imports torch (and the zoo's truth helpers), next to a file of
its project, other.py, that asks torch.compile for CUDA graphs and that this script never
imports. The step runs out with a batch four times what fits. Under `oomshim run
--torch-allocator` the script runs in allocator mode: what a file beside it says is not what it
runs.
KINDS: dominant=activations phase=forward batch=yes alloc_mode=on"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _zoo import batch_truth, kinds_truth, too_large, total_bytes  # noqa: E402

D, H = 2048, 16384
# Four blocks keep about 280 KiB of bfloat16 activations a row; four times what fits.
BATCH = 4 * total_bytes() // (280 << 10)
model = nn.Sequential(*[nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)) for _ in range(4)])
model = model.cuda().to(torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


def train_step(batch):
    x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    out = model(x)  # EXPECT-LINE
    out.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
failed = None
try:
    too_large(train_step, BATCH)
except torch.OutOfMemoryError as e:
    failed = e.batch
    print("out of memory in the forward pass")
    kinds_truth("sibling_compile", "activations", [model], [opt])
if failed:
    batch_truth(train_step, failed, reset=lambda: opt.zero_grad(set_to_none=True))
