"""Memory by kind (issue 23): a forward hook that keeps every output in a dict (for "debugging").
A leak; the hook, not the line that calls the model, keeps the memory, and the verdict names it.
KINDS: dominant=activations leak=1 hook=keep_output"""
import torch
import torch.nn as nn
from _zoo import kinds_truth

model = nn.Sequential(nn.Linear(8192, 8192, device="cuda"), nn.GELU(), nn.Linear(8192, 8192, device="cuda"))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
outputs = {}


def keep_output(module, args, output):
    outputs[len(outputs)] = output  # EXPECT-LINE


model[2].register_forward_hook(keep_output)
try:
    for step in range(100000):
        x = torch.randn(16384, 8192, device="cuda")
        loss = model(x).pow(2).mean()  # EXPECT-LINE
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    print("out of memory after", len(outputs), "steps")
    kinds_truth("kinds_hook_keeps", "activations", [model], [opt])
