"""A model loaded twice by mistake (a second copy for "evaluation"): the second load runs out.
Weight loading is no leak."""
import torch
import torch.nn as nn


LAYERS = round(0.6 * torch.cuda.mem_get_info()[1] / (2 * 16384 * 16384))  # 60% of the device a copy


def load():
    layers = [nn.Linear(16384, 16384, bias=False, device="cuda", dtype=torch.bfloat16)  # EXPECT-LINE
              for _ in range(LAYERS)]
    return nn.Sequential(*layers)


print("loading")
model = load()
eval_model = load()
