"""A forward hook that keeps every output in a dict (for "debugging"): each step keeps 1/60 of
the device. A leak; the hook, not the line that calls the model, keeps the memory, and the
verdict names it.
KINDS: dominant=activations leak=1 hook=keep_output"""
import torch
import torch.nn as nn
from _zoo import kinds_truth, total_bytes

D = 4096
rows = total_bytes() // 60 // (2 * D)  # one bfloat16 output of the last layer per step
model = nn.Sequential(nn.Linear(D, D, device="cuda", dtype=torch.bfloat16), nn.GELU(),
                      nn.Linear(D, D, device="cuda", dtype=torch.bfloat16))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
outputs = {}


def keep_output(module, args, output):
    outputs[len(outputs)] = output  # EXPECT-LINE


model[2].register_forward_hook(keep_output)
print("training")
try:
    for step in range(100000):
        x = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()  # EXPECT-LINE
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("kinds_hook_keeps", "activations", [model], [opt])
