"""Memory by kind (issue 23): Adam on a large float32 model. Its two moments are twice the
weights; the step runs out (the foreach update's temporaries on top of weights, gradients and
state). Optimizer state dominates, named against the weights it steps.
KINDS: dominant=optimizer_state phase=optimizer"""
import torch
import torch.nn as nn
from _zoo import kinds_truth

model = nn.Sequential(*[nn.Linear(16384, 16384, bias=False, device="cuda") for _ in range(30)])  # 30 GiB fp32, built on the device
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn(8, 16384, device="cuda")
try:
    for step in range(3):
        model(x).pow(2).mean().backward()
        opt.step()  # EXPECT-LINE
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    print("out of memory in the optimizer step")
    kinds_truth("kinds_adam_large", "optimizer_state", [model], [opt])
