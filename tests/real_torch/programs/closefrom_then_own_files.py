"""A daemon's start: the descriptors it inherited as it starts, then `closefrom(3)` (every
descriptor above stderr closed), then its own files at the lowest free numbers, written and read
back while it works (with torch's steps running, which the shim publishes)."""
import os

import torch


def open_fds():
    return sorted(int(n) for n in os.listdir("/proc/self/fd"))


print("at start above stderr:", [fd for fd in open_fds() if fd > 2][:-1])  # less listdir's own
os.closerange(3, 65536)
paths = [f"own-{i}.log" for i in range(4)]
fds = [os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600) for p in paths]
print("own fds", fds)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(50):
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    for fd in fds:
        os.write(fd, f"step {step}\n".encode())
for fd in fds:
    os.close(fd)
print("lines written", [open(p).read().count("\n") for p in paths])
