# expect-dump: kinds
# version-sensitive
"""OOM-retry loops in a worker thread and in a generator's frame (a data pipeline that shrinks
its batches): each frees what it drops."""
import threading
import weakref

import torch
from _oomsim import fail

torch.manual_seed(0)
model = torch.nn.Linear(5, 5)


def use(x):
    if x.shape[0] > 4:
        fail(x.shape[0] << 24)
    return model(x).sum().item()


def batches(size):
    while size:
        x = torch.randn(size, 5)
        ref = weakref.ref(x)
        try:
            yield use(x)
            return
        except torch.OutOfMemoryError:
            pass
        del x
        yield ("alive", ref() is not None)
        size //= 2


def worker(out):
    size = 32
    while True:
        x = torch.randn(size, 5)
        ref = weakref.ref(x)
        try:
            out.append(("fit", size))
            use(x)
            return
        except torch.OutOfMemoryError:
            pass
        del x
        out.append(("alive", ref() is not None))
        size //= 2


print("generator", [v if isinstance(v, tuple) else round(v, 4) for v in batches(16)])
found = []
t = threading.Thread(target=worker, args=(found,), name="worker")
t.start()
t.join()
print("thread", found)
