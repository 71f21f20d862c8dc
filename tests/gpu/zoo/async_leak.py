"""The kept-outputs leak under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (set by the
zoo): every tensor is a cudaMallocAsync."""
import torch
import torch.nn as nn

from _zoo import load_weights

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
weights = load_weights(0.15)
kept = []
print("training")
for step in range(1, 10_000):
    x = torch.randn(16384, 4096, device="cuda")
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    kept.append(out.detach().clone())  # EXPECT-LINE
