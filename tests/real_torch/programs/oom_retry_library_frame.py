# expect-dump: kinds
# version-sensitive
"""The OOM-retry loop in a library's frame (retrylib under site-packages/, as a training
framework's would be): the library keeps the failed batch in its own locals, catches the error,
drops the batch and halves. Freed at once, as without the shim."""
import weakref

import torch
import retrylib
from _oomsim import fail

torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 1)

    def forward(self, x):
        if x.shape[0] > 3:
            fail(x.shape[0] << 24)
        return self.b(torch.tanh(self.a(x)))


net = Net()
refs = []


def make(n):
    x = torch.randn(n, 8)
    refs.append(weakref.ref(x))
    return x


size, out = retrylib.run_with_fallback(net, make, 32)
print("ran at", size, "out", [round(v, 4) for v in out.flatten().tolist()])
print("failed batches still alive:", [r() is not None for r in refs[:-1]])
