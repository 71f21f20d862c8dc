# expect-dump: kinds
# exit: 1
"""An OOM nobody catches: the traceback and the exit status are the program's own."""
import torch
from _oomsim import fail

model = torch.nn.Linear(4, 4)


def step(x):
    y = model(x)
    fail(3 << 30)
    return y


print("before", flush=True)
step(torch.ones(2, 4))
print("never")
