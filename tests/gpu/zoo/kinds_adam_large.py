"""Adam on a large float32 model: its two moments are twice the weights. Weights and gradients
take 44% of the device, the moments 44% more, and the step's temporaries (the square root of the
second moment) do not fit. Optimizer state dominates, named against the weights it steps.
KINDS: dominant=optimizer_state phase=optimizer"""
import torch
import torch.nn as nn
from _zoo import GiB, kinds_truth, total_bytes

layers = max(2, round(0.22 * total_bytes() / GiB))  # 1 GiB of float32 weights each
model = nn.Sequential(*[nn.Linear(16384, 16384, bias=False, device="cuda") for _ in range(layers)])
opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)  # the update's temporaries are what runs out
x = torch.randn(8, 16384, device="cuda")
print(f"training {layers} layers")
try:
    for step in range(3):
        model(x).pow(2).mean().backward()
        opt.step()  # EXPECT-LINE
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    print("out of memory in the optimizer step")
    kinds_truth("kinds_adam_large", "optimizer_state", [model], [opt])
