"""Four threads that each keep 1 GiB buffers until the device is full; each stops at its
first OutOfMemoryError."""
import threading

import torch

GiB = 1 << 30
kept = []
lock = threading.Lock()
stopped = []


def worker(i):
    torch.cuda.set_device(0)
    while True:
        try:
            t = torch.empty(GiB, dtype=torch.uint8, device="cuda")  # EXPECT-LINE
        except torch.OutOfMemoryError:
            with lock:
                stopped.append(i)
            return
        with lock:
            kept.append(t)


threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"{len(stopped)} threads stopped")
