"""GPU check: the classic leak — a training loop that keeps every step's activations alive in a
list — until torch raises OutOfMemoryError. Prints one JSON line with what torch reported right
after the error, so the GPU script can compare it with the shim's dump."""
import json
import sys

import torch

try:  # importable under `oomshim run`; marks steps so the shim can measure growth per step
    from oomshim import step as step_mark
except ImportError:
    def step_mark():
        pass


def train_step(model, history):
    x = torch.randn(4096, 8192, device="cuda")
    y = model(x)
    history.append(y)  # the bug: should be y.item()/detach().cpu() or nothing at all
    return y


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8192, 16384), torch.nn.ReLU(), torch.nn.Linear(16384, 16384)).cuda()
    history = []
    step = 0
    result = {"raised": None}
    try:
        with torch.no_grad():
            while step < 100000:
                train_step(model, history)
                step += 1
                step_mark()
    except torch.cuda.OutOfMemoryError as e:
        free, total = torch.cuda.mem_get_info()
        result = {
            "raised": type(e).__name__,
            "message_head": str(e).split(".")[0],
            "step": step,
            "reserved": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated(),
            "free": free,
            "total": total,
        }
    print(json.dumps(result))
    sys.stdout.flush()
    return 0 if result["raised"] else 1


if __name__ == "__main__":
    sys.exit(main())
