# expect-dump: kinds
# version-sensitive
"""The batch in a retry loop's frame is also captured by a closure (a cell variable), and the
OOM happens deep in a recursion: dropped batches are freed all the same."""
import weakref

import torch
from _oomsim import fail

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)


def deep(x, n):
    if n:
        return deep(x, n - 1)
    if x.shape[0] > 2:
        fail(x.shape[0] << 25)
    return model(x)


def fit(size):
    alive = []
    while True:
        batch = torch.randn(size, 4)
        ref = weakref.ref(batch)
        report = lambda: tuple(batch.shape)  # noqa: E731 (batch is a cell now)
        try:
            return deep(batch, 30).sum().item(), report(), alive
        except torch.OutOfMemoryError:
            pass
        del batch, report
        alive.append(ref() is not None)
        size //= 2


value, shape, alive = fit(16)
print(round(value, 4), shape, alive)
