"""Memory by kind (issue 23): a loop that never zeroes its gradients. The first step fits (the
gradients appear as backward frees the activations); from the second on the gradients are live
through the forward pass, and it runs out there. The advice says the gradients were kept.
KINDS: dominant=activations phase=forward grads_kept=1"""
import torch
import torch.nn as nn
from _zoo import kinds_truth

model = nn.Sequential(*[nn.Linear(16384, 16384, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(80)])  # 40 GiB, built on the device
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(32768, 16384, device="cuda", dtype=torch.bfloat16)  # 1 GiB per layer output: 80 GiB a forward
try:
    for step in range(4):
        out = model(x)  # EXPECT-LINE
        out.float().mean().backward()
        opt.step()      # and never opt.zero_grad()
        print("step", step)
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("kinds_grads_never_zeroed", "activations", [model], [opt])
