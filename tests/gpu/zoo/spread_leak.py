"""A training loop whose leak is spread over many lines: a metrics helper keeps a dozen small
tensors per step on the GPU, each from its own line, and no line alone carries the growth. No
step marks: the optimizer's steps are found by the hook."""
import torch
import torch.nn as nn

from _zoo import load_weights

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 2048)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
weights = load_weights(0.15)
history = []


def keep_metrics(out):
    # Each kept tensor is 8 MiB and its own allocation; twelve lines, none the leak alone.
    history.append(out[:1024].clone())  # EXPECT-LINE
    history.append(out[1024:2048].clone())  # EXPECT-LINE
    history.append(out[:1024].abs())  # EXPECT-LINE
    history.append(out[:1024].square())  # EXPECT-LINE
    history.append(out[:1024].sign())  # EXPECT-LINE
    history.append(out[:1024].exp())  # EXPECT-LINE
    history.append(out[:1024].sin())  # EXPECT-LINE
    history.append(out[:1024].cos())  # EXPECT-LINE
    history.append(out[:1024].neg())  # EXPECT-LINE
    history.append(out[:1024].relu())  # EXPECT-LINE
    history.append(out[:1024].tanh())  # EXPECT-LINE
    history.append(out[:1024].sigmoid())  # EXPECT-LINE


print("training")
for step in range(1, 100_000):
    x = torch.randn(4096, 2048, device="cuda")
    out = model(x)
    out.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        keep_metrics(out.detach().float())
