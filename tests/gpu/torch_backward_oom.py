"""GPU check: an out-of-memory error inside loss.backward(). Backward runs on torch's autograd
device thread, which has no Python frames; prints one JSON line."""
import json
import sys

import torch


def main():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8192, 8192) for _ in range(8)]
    model = torch.nn.Sequential(*[m for l in layers for m in (l, torch.nn.GELU())]).cuda()
    batch = 8192
    where = None
    while batch < 1 << 22:
        x = torch.randn(batch, 8192, device="cuda", requires_grad=True)
        try:
            loss = model(x).square().mean()
        except torch.cuda.OutOfMemoryError:
            where = "forward"
            break
        try:
            loss.backward()
        except torch.cuda.OutOfMemoryError:
            where = "backward"
            break
        del x, loss
        batch *= 2
    print(json.dumps({"oom_in": where, "batch": batch}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
