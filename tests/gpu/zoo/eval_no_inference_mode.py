"""A validation loop without `torch.inference_mode()` that appends every batch's predictions
(still attached to their graph) on the GPU."""
import torch
import torch.nn as nn

from _zoo import load_weights

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 8192), nn.ReLU(), nn.Linear(8192, 1024)).cuda()
model.eval()
weights = load_weights(0.3)
predictions = []
print("evaluating")
for batch in range(1, 10_000):
    x = torch.randn(16384, 4096, device="cuda")
    predictions.append(model(x))  # EXPECT-LINE
