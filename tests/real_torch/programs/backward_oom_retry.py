# expect-dump: kinds
# version-sensitive
"""The backward pass runs out of memory (a custom autograd function whose backward needs more
than there is): the program drops the graph and its micro-batch and accumulates gradients over
smaller ones instead."""
import weakref

import torch
from _oomsim import fail

torch.manual_seed(0)


class Hungry(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if x.shape[0] > 4:
            fail(x.shape[0] << 28)
        return grad * 2


model = torch.nn.Linear(6, 6)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(16, 6)


def train(micro):
    dropped = []
    while True:
        refs = []
        try:
            for chunk in data.split(micro):
                refs.append(weakref.ref(chunk))
                loss = Hungry.apply(model(chunk)).sum() / len(data)
                loss.backward()
            opt.step()
            opt.zero_grad()
            return micro, dropped
        except torch.OutOfMemoryError:
            pass
        opt.zero_grad()
        del chunk, loss
        dropped.append([r() is not None for r in refs])
        micro //= 2


micro, dropped = train(16)
print("micro-batch", micro, "weights", round(model.weight.sum().item(), 5))
print("dropped chunks alive:", dropped)
