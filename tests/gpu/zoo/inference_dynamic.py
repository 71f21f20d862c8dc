"""An inference server with dynamic shapes: each request has its own size; its activation is
freed but a small per-request cache entry is kept. The entries land inside the freed blocks and
split them, until a large request finds no block big enough in a cache that has plenty free."""
import torch

from _zoo import load_weights, report_truth

torch.manual_seed(0)
weights = load_weights(0.5)
cache = []
print("serving")
with torch.inference_mode():
    for request in range(1, 100_000):
        n = (300 + (request * 7919) % 400) << 20
        activation = torch.empty(n, dtype=torch.uint8, device="cuda")
        cache.append(torch.empty(8 << 20, dtype=torch.uint8, device="cuda"))  # EXPECT-LINE
        del activation
        if request % 50 == 0:
            try:
                big = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                report_truth(6 << 30)
                raise
            del big
