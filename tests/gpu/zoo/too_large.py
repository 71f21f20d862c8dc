"""One request larger than the whole device (a wrong shape)."""
import torch

print("allocating")
attention = torch.empty(1 << 16, 1 << 16, 64, dtype=torch.bfloat16, device="cuda")  # EXPECT-LINE
