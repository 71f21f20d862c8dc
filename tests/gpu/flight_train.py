"""A PyTorch training loop for check_flight_recorder (tests/gpu/run_all.py).

  flight_train.py leak    - trains, and keeps 16 MiB of device memory a step at the marked line;
                            prints "ready" after 30 steps and goes on until it is killed.
  flight_train.py bench N - N steps without a leak; prints one JSON line of step times (ms).
"""
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


if sys.argv[1] == "leak":
    kept = []
    for i in range(1, 100000):
        step()
        kept.append(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))  # LEAK_LINE
        torch.cuda.synchronize()
        if i == 30:
            print("ready", flush=True)
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
