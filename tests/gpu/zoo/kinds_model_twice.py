"""The same model loaded twice (a second copy kept "for evaluation"), 36% of the device each,
then an inference pass whose two layer outputs (10% each) no longer fit. Parameters dominate,
and the second copy is named a duplicate (same parameter shapes).
KINDS: dominant=parameters duplicate=1"""
import torch
import torch.nn as nn
from _zoo import kinds_truth, total_bytes

D = 16384
T = total_bytes()
LAYERS = max(2, round(0.36 * T / (2 * D * D)))  # bfloat16: 512 MiB a layer


def load():
    # Built on the device in bfloat16: initialising this many float32 weights on the CPU takes minutes.
    return nn.Sequential(*[nn.Linear(D, D, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)])


model = load()
eval_model = load()   # the same, again
x = torch.randn(int(0.1 * T) // (2 * D), D, device="cuda", dtype=torch.bfloat16)
print(f"two copies of {LAYERS} layers")
try:
    with torch.no_grad():
        y = model(x)  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("kinds_model_twice", "parameters", [model, eval_model])
