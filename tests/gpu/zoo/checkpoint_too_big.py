"""Activation checkpointing (torch.utils.checkpoint around each of 16 blocks) that is still not
enough: the batch is four times what fits even so. The checkpoints and one block's recomputed
activations fill the device; the largest batch that fits is found by bisection.
KINDS: dominant=activations phase=forward|backward batch=yes checkpoint=1"""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from _zoo import fail_then_bisect, kinds_truth, total_bytes

D, H, BLOCKS = 2048, 16384, 16
BATCH = 4 * total_bytes() // (140 << 10)  # 16 checkpoints of 4 KiB and one block's 70 KiB a row, about
blocks = nn.ModuleList([nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)) for _ in range(BLOCKS)])
blocks = blocks.cuda().to(torch.bfloat16)
opt = torch.optim.SGD(blocks.parameters(), lr=1e-3)


def train_step(batch):
    h = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False)  # EXPECT-LINE
    h.float().pow(2).mean().backward()  # EXPECT-LINE
    opt.step()
    opt.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("checkpoint_too_big", "activations", [blocks], [opt]),
                 reset=lambda: opt.zero_grad(set_to_none=True))
