# needs: accelerate
# expect-dump: kinds
"""accelerate's `find_executable_batch_size`: the decorated training function is retried with
half the batch after each CUDA out-of-memory error (accelerate recognises torch's message)."""
import weakref

import torch
from accelerate.utils import find_executable_batch_size
from _oomsim import fail

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 3))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tried, refs = [], []


@find_executable_batch_size(starting_batch_size=128)
def train(batch_size):
    tried.append(batch_size)
    x = torch.randn(batch_size, 12)
    refs.append(weakref.ref(x))
    out = model(x)
    if batch_size > 16:
        fail(batch_size << 22)
    out.square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return batch_size


print("trained at", train(), "after", tried)
print("failed batches alive:", [r() is not None for r in refs[:-1]])
print("weights", round(sum(p.sum().item() for p in model.parameters()), 5))
