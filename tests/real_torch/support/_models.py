"""The models more than one program of tests/real_torch/programs builds, written once."""
import torch


class TwoLayers(torch.nn.Module):
    """Linear (`width` to `width`), an activation (a module class: TorchScript compiles modules,
    not functions kept on one), linear (`width` to `out`)."""

    def __init__(self, width=6, out=2, activation=torch.nn.ReLU):
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.act = activation()
        self.b = torch.nn.Linear(width, out)

    def forward(self, x):
        return self.b(self.act(self.a(x)))
