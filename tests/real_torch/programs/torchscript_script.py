"""A TorchScript model (torch.jit.script) served: its first forward and the next ones."""
import warnings

import torch
from _models import TwoLayers

warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
torch.manual_seed(0)
scripted = torch.jit.script(TwoLayers(6, 2, torch.nn.ReLU))
with torch.no_grad():
    for i in range(3):
        print(i, [round(v, 4) for v in scripted(torch.ones(1, 6) * i).flatten().tolist()])
print(type(scripted).__name__, len(scripted._forward_hooks), len(scripted._forward_pre_hooks))
