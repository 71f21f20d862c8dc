"""A job on a GPU that another process (started by the zoo) mostly holds."""
import torch

GiB = 1 << 30
print("allocating")
chunks = []
for i in range(1000):
    chunks.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
