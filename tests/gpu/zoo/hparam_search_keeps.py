"""A hyper-parameter search that keeps every trained copy, with its gradients, to pick the best
one at the end: each trial is a model of 1/100 of the device (a frozen float32 backbone and a
trained head), trained a few steps and appended to `trials`. Far more than 16 models are live
when it runs out; parameters dominate (the frozen backbone has no gradients). A leak by steps.
KINDS: dominant=parameters leak=1 models=many"""
import sys

import torch
import torch.nn as nn
from _zoo import kinds_truth, total_bytes

# Three float32 D×D layers are 1/100 of the device.
D = max(256, int((total_bytes() / 100 / 12) ** 0.5) // 256 * 256)
trials = []
# The layers of the trial being built: when the failure comes while building one, its first layers
# are parameters too, and the account must see them (the handler never sees build's locals).
building = []


def build():
    building.clear()
    for _ in range(3):
        building.append(nn.Linear(D, D, device="cuda"))  # EXPECT-LINE
    model = nn.Sequential(building[0], nn.ReLU(), building[1], nn.ReLU(), building[2])
    for p in list(model[0].parameters()) + list(model[2].parameters()):
        p.requires_grad_(False)  # the backbone is frozen
    return model


print(f"searching with width {D}")
model = opt = None
try:
    for trial in range(100_000):
        lr = 10 ** (-4 + (trial % 7) / 3)
        model = build()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
        for step in range(3):
            x = torch.randn(256, D, device="cuda")
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        trials.append((lr, model))  # EXPECT-LINE
        model = opt = None
except torch.OutOfMemoryError:
    print("out of memory")
    # How many trials fit depends on the allocator (allocator mode's differs): stderr, not the output.
    sys.stderr.write(f"{len(trials)} trials kept\n")
    kinds_truth("hparam_search_keeps", "parameters",
                [m for _, m in trials] + ([model] if model is not None else []) + building,
                [opt] if opt is not None else [])
