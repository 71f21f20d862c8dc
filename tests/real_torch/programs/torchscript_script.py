"""A TorchScript model (torch.jit.script) served: its first forward and the next ones."""
import warnings

import torch

warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


scripted = torch.jit.script(Net())
with torch.no_grad():
    for i in range(3):
        print(i, [round(v, 4) for v in scripted(torch.ones(1, 6) * i).flatten().tolist()])
print(type(scripted).__name__, len(scripted._forward_hooks), len(scripted._forward_pre_hooks))
