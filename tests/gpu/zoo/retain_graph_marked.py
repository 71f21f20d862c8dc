"""The retain_graph loop, with `oomshim.step()` at the end of every step."""
import torch
import torch.nn as nn

from _zoo import load_weights, mark_step

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
weights = load_weights(0.3)
outputs = []
print("training")
for step in range(1, 10_000):
    x = torch.randn(16384, 4096, device="cuda")
    out = model(x)  # EXPECT-LINE
    loss = out.pow(2).mean()
    loss.backward(retain_graph=True)
    opt.step()
    opt.zero_grad()
    outputs.append(out)
    mark_step()
