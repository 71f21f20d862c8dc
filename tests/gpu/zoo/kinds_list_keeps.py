"""A loop that keeps every step's output in a global list, 1/80 of the device a step: a leak
that names the container that keeps it, `history`, at the line that grows it, next to the line
that allocated it.
KINDS: dominant=activations leak=1 keeper=history"""
import torch
import torch.nn as nn
from _zoo import kinds_truth, total_bytes

torch.manual_seed(0)
D = 4096
rows = total_bytes() // 80 // (2 * D)
model = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, D)).cuda().to(torch.bfloat16)
history = []
print("running")
try:
    for step in range(100_000):
        x = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            out = model(x)  # EXPECT-LINE
        history.append(out)  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("kinds_list_keeps", "activations", [model])
