# expect-dump: kinds
# version-sensitive
"""An OOM-retry loop in the program's own function: halve the batch until it fits (what serving
fallbacks and hand-written batch finders do). The failed batch is freed by the program's `del`
before the retry: a weak reference to it is dead at once, no garbage collection."""
import weakref

import torch
from _oomsim import fail

torch.manual_seed(0)
FITS = 4  # a batch over this does not fit


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        if x.shape[0] > FITS:
            fail(x.shape[0] * (64 << 20))  # the activations of this batch do not fit
        return torch.relu(h)


model = torch.nn.Sequential(Block(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(batch_size):
    alive = []
    while True:
        x = torch.randn(batch_size, 16)
        seen = weakref.ref(x)
        try:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return batch_size, alive, loss.item()
        except torch.OutOfMemoryError as e:
            print("oom at", batch_size, str(e).split(".")[0])
        # The error (and the frames of its traceback) is gone here: only `x` holds the batch.
        del x
        alive.append(seen() is not None)
        batch_size //= 2


bs, alive, loss = train_step(64)
print("fits at", bs, "loss", round(loss, 4))
print("failed batches still alive after del:", alive)
