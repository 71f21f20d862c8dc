"""Evaluation that sums the loss as a tensor (`total += loss`, not `loss.item()`), so every
batch's graph, and its activations, stay alive."""
import torch
import torch.nn as nn

from _zoo import load_weights

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 10)).cuda()
criterion = nn.CrossEntropyLoss()
weights = load_weights(0.3)
total = 0.0
print("evaluating")
for batch in range(1, 10_000):
    x = torch.randn(16384, 4096, device="cuda")
    y = torch.randint(0, 10, (16384,), device="cuda")
    total = total + criterion(model(x), y)  # EXPECT-LINE
