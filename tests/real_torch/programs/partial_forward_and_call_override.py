# expect-dump: kinds
"""A model whose `forward` is a functools.partial set on the instance, and an nn.Module
subclass that overrides __call__; both run, one runs out of memory inside its forward and the
program retries smaller."""
import functools
import weakref

import torch
from _oomsim import fail

torch.manual_seed(0)


def scaled_forward(module, scale, x):
    if x.shape[0] > 2:
        fail(x.shape[0] << 26)
    return module.lin(x) * scale


class Partial(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.forward = functools.partial(scaled_forward, self, 0.5)


class OwnCall(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return super().__call__(*args, **kwargs) + 1

    def forward(self, x):
        return self.lin(x)


first, second = Partial(), OwnCall()


def run(n):
    x = torch.randn(n, 3)
    ref = weakref.ref(x)
    try:
        return second(first(x)), None
    except torch.OutOfMemoryError:
        pass
    del x
    return None, ref() is not None


n, alive = 8, []
while True:
    out, kept = run(n)
    if out is not None:
        break
    alive.append(kept)
    n //= 2
print("ran at", n, [round(v, 4) for v in out.flatten().tolist()], "calls", second.calls, "alive", alive)
