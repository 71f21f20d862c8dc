# expect-dump: kinds
"""Inference servers: requests under torch.no_grad() and torch.inference_mode(); a request too
big for the device is split in halves and served (the fallback the server has)."""
import torch
from _oomsim import fail

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def predict(batch):
    if batch.shape[0] > 8:
        fail(batch.shape[0] << 27)
    return model(batch).argmax(-1)


def serve(batch):
    try:
        return predict(batch)
    except torch.OutOfMemoryError:
        half = batch.shape[0] // 2
        return torch.cat([serve(batch[:half]), serve(batch[half:])])


requests = [torch.randn(n, 16) for n in (1, 4, 8, 32, 3, 16)]
with torch.no_grad():
    print("no_grad", [serve(r).tolist() for r in requests])
with torch.inference_mode():
    print("inference_mode", [serve(r).tolist() for r in requests])
