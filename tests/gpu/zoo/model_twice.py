"""A model loaded twice by mistake (a second copy for "evaluation"): the second load runs out.
Weight loading is no leak."""
import torch
import torch.nn as nn


def load():
    layers = [nn.Linear(16384, 16384, bias=False, device="cuda", dtype=torch.bfloat16)  # EXPECT-LINE
              for _ in range(150)]
    return nn.Sequential(*layers)


print("loading")
model = load()
eval_model = load()
