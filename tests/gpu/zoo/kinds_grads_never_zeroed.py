"""A loop that never zeroes its gradients. Weights take a quarter of the device, one forward
pass's activations 62%: the first step fits (the gradients appear as backward frees the
activations); from the second on the gradients, another quarter, are live through the forward
pass, and it runs out there. The advice says the gradients were kept.
KINDS: dominant=activations phase=forward grads_kept=1"""
import torch
import torch.nn as nn
from _zoo import kinds_truth, total_bytes

D = 8192
T = total_bytes()
layers = max(4, round(0.25 * T / (2 * D * D)))  # bfloat16 weights: 128 MiB a layer
rows = int(0.62 * T / (layers * 2 * D))  # each layer keeps its bfloat16 input for backward
model = nn.Sequential(*[nn.Linear(D, D, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
print(f"training {layers} layers")
try:
    for step in range(4):
        out = model(x)  # EXPECT-LINE
        out.float().mean().backward()
        opt.step()      # and never opt.zero_grad()
        print("step", step)
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("kinds_grads_never_zeroed", "activations", [model], [opt])
