# expect-dump: kinds
# version-sensitive
"""The shape of Lightning's batch-size finder (power mode): a trainer object grows the batch
until a step runs out of memory, keeping the batch of each trial in its own frame and on
itself, frees it (`del`, then its garbage collection and cache clearing) and settles on the last
size that fit."""
import gc
import weakref

import torch
from _oomsim import fail

torch.manual_seed(0)
LIMIT = 48


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 1))

    def forward(self, x):
        if x.shape[0] > LIMIT:
            fail(x.shape[0] << 25)
        return self.body(x)


def is_oom_error(e):
    return isinstance(e, torch.OutOfMemoryError) or "CUDA out of memory" in str(e)


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self.refs = []

    def fit_one(self, batch_size):
        batch = torch.randn(batch_size, 10)
        self.refs.append(weakref.ref(batch))
        loss = self.model(batch).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def scale_batch_size(self, size=2, max_trials=10):
        last_good = None
        for _ in range(max_trials):
            try:
                self.fit_one(size)
                last_good = size
                size *= 2
            except RuntimeError as e:
                if not is_oom_error(e):
                    raise
                break
        gc.collect()
        torch.cuda.empty_cache()
        return last_good


trainer = Trainer(Model())
print("largest batch", trainer.scale_batch_size())
print("trial batches alive:", [r() is not None for r in trainer.refs])
