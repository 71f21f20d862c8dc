"""GPU check: an out-of-memory error inside loss.backward(). The forward pass fits; then the
rest of the GPU is taken, leaving less than backward needs for its gradients. Backward runs on
torch's autograd device thread, which has no Python frames. Prints one JSON line."""
import json
import sys

import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(8192, 8192), torch.nn.GELU())]).cuda()
    x = torch.randn(16384, 8192, device="cuda", requires_grad=True)
    loss = model(x).square().mean()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(free - (256 << 20), dtype=torch.uint8, device="cuda")  # noqa: F841
    where = None
    try:
        loss.backward()
    except torch.cuda.OutOfMemoryError:
        where = "backward"
    print(json.dumps({"oom_in": where}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
