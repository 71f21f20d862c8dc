"""Memory by kind (issue 23): the same model loaded twice (a second copy kept "for evaluation"),
then a forward pass that no longer fits. Parameters dominate, and the second copy is named a
duplicate (same parameter shapes).
KINDS: dominant=parameters duplicate=1"""
import torch
import torch.nn as nn
from _zoo import kinds_truth


def load():
    # Built on the device in bfloat16: initialising 48 GiB of float32 weights on the CPU takes minutes.
    return nn.Sequential(*[nn.Linear(16384, 16384, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(96)])


model = load()        # 48 GiB of bfloat16 weights
eval_model = load()   # the same, again
x = torch.randn(786432, 16384, device="cuda", dtype=torch.bfloat16)  # 24 GiB; its output does not fit
try:
    with torch.no_grad():
        y = model(x)  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("kinds_model_twice", "parameters", [model, eval_model])
