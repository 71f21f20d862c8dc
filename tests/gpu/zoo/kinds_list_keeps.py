"""A loop that keeps every step's output in a global list (issue 23: a leak names the container
that keeps it, `history`, at the line that grows it, next to the line that allocated it)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).cuda()
history = []
print("running")
try:
    for step in range(100_000):
        x = torch.randn(4096, 4096, device="cuda")
        with torch.no_grad():
            out = model(x)  # EXPECT-LINE
        history.append(out)  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory")
