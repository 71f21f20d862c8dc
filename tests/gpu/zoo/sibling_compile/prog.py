"""A training script that only imports torch (and the zoo's truth helpers), next to a file of
its project, other.py, that asks torch.compile for CUDA graphs and that this script never
imports. The step runs out with a batch four times what fits. Under `oomshim run
--torch-allocator` the script runs in allocator mode: what a file beside it says is not what it
runs.
KINDS: dominant=activations phase=forward batch=yes alloc_mode=on"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _zoo import fail_then_bisect, kinds_truth, total_bytes, wide_mlp  # noqa: E402

D, H = 2048, 16384
# Four blocks keep about 280 KiB of bfloat16 activations a row; four times what fits.
BATCH = 4 * total_bytes() // (280 << 10)
model = wide_mlp(D, H)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


def train_step(batch):
    x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    out = model(x)  # EXPECT-LINE
    out.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("sibling_compile", "activations", [model], [opt]),
                 reset=lambda: opt.zero_grad(set_to_none=True), said="out of memory in the forward pass")
