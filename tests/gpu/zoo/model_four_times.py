"""A model loaded four times (a notebook cell run again and again, each result kept), each copy
22% of the device: building the fifth runs out. Parameters dominate; the model, not its layer
class, is what is held four times.
KINDS: dominant=parameters duplicate=4"""
import torch
import torch.nn as nn
from _zoo import kinds_truth, total_bytes

D = 16384
LAYERS = max(2, round(total_bytes() / 4.5 / (2 * D * D)))  # bfloat16: 512 MiB a layer
building = []  # the layers of the copy being built (the program's own truth counts them too)


def load():
    building.clear()
    for _ in range(LAYERS):
        building.append(nn.Linear(D, D, bias=False, device="cuda", dtype=torch.bfloat16))  # EXPECT-LINE
    model = nn.Sequential(*building)
    building.clear()
    return model


copies = []
print(f"loading copies of {LAYERS} layers")
try:
    for i in range(8):
        copies.append(load())
        print("copy", i + 1)
except torch.OutOfMemoryError:
    print("out of memory loading copy", len(copies) + 1)
    kinds_truth("model_four_times", "parameters", copies + building)
