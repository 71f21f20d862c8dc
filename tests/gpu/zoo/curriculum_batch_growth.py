"""A curriculum that doubles the batch every two steps until the device is full: every step
before the last fits, the last does not. The largest batch that fits lies between the last two;
bisection finds it.
KINDS: dominant=activations phase=forward|backward batch=yes"""
import sys

import torch
from _zoo import batch_truth, kinds_truth, total_bytes, wide_mlp

torch.manual_seed(0)
D, H = 2048, 16384
model = wide_mlp(D, H)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def train_step(batch):
    x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    loss = model(x).float().pow(2).mean()  # EXPECT-LINE
    loss.backward()  # EXPECT-LINE
    opt.step()
    opt.zero_grad(set_to_none=True)


batch = max(256, total_bytes() // (280 << 10) // 256)  # 1/256 of what fits: eight doublings to go
failed = None
print("training")
try:
    for step in range(64):
        if step and step % 2 == 0:
            batch *= 2
        train_step(batch)
except torch.OutOfMemoryError:
    failed = batch
    print("out of memory")
    sys.stderr.write(f"out of memory at step {step}, batch {batch}\n")  # the allocator decides which: not output
    kinds_truth("curriculum_batch_growth", "activations", [model], [opt])
if failed:
    # The batch before the last fitted: it is the first probe, and the momentum buffers exist.
    batch_truth(train_step, failed, reset=lambda: opt.zero_grad(set_to_none=True), warm=failed // 2)
