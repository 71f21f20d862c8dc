"""A training loop that runs 30 healthy steps, then starts keeping every step's output."""
import torch
import torch.nn as nn

from _zoo import load_weights

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
weights = load_weights(16)
history = []
print("training")
for step in range(1, 10_000):
    x = torch.randn(8192, 4096, device="cuda")
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step > 30:
        history.append(out.detach() * 1.0)  # EXPECT-LINE
