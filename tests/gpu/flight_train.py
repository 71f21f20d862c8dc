"""A PyTorch training loop for check_flight_recorder (tests/gpu/run_all.py).

  flight_train.py leak    - trains, and keeps 16 MiB of device memory a step at the marked line;
                            prints "ready" after 30 steps and goes on until it is killed.
  flight_train.py bench N - N steps without a leak; prints one JSON line of step times (ms).
  flight_train.py rank-killed - under torchrun: rank 1 leaks as `leak` does and SIGKILLs itself
                            after 40 steps (torchrun reaps it, then ends rank 0); rank 0 trains.
"""
import os
import signal
import json
import sys
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(512, 4096, device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def leak_loop(at_ready):
    kept = []
    for i in range(1, 100000):
        step()
        kept.append(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))  # LEAK_LINE
        torch.cuda.synchronize()
        if i == 30:
            at_ready()
        time.sleep(0.01)


def kill_self_soon():
    print("ready", flush=True)
    # A few publishes of the live summary after the ready mark, then the end no one sees coming.
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
    signal.alarm(3)


if sys.argv[1] == "leak":
    leak_loop(lambda: print("ready", flush=True))
elif sys.argv[1] == "rank-killed":
    if os.environ.get("RANK") == "1":
        leak_loop(kill_self_soon)
    else:
        while True:
            step()
            torch.cuda.synchronize()
            time.sleep(0.01)
else:
    n = int(sys.argv[2])
    times = []
    for i in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1000)
    print(json.dumps(times[10:]), flush=True)
