"""Issue 8's GPU soak: 8 threads of PyTorch ops with varying shapes on their own streams, thread 0
also provoking an out-of-memory error every 40 iterations (caught; the program goes on); mid-run
the main thread forks a child that only loads libraries (as DataLoader workers do) and runs an
nvcc-built static-cudart client. Run bare and under `oomshim run`: the per-thread result digests
must be identical. Prints one JSON line last.

    python3 soak.py ITERATIONS STATIC_CLIENT"""
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import torch

ITER = int(sys.argv[1])
STATIC = sys.argv[2]
THREADS = 8


def worker(i, out):
    torch.cuda.set_device(0)
    g = torch.Generator(device="cuda").manual_seed(1000 + i)
    s = torch.cuda.Stream()
    h = hashlib.sha256()
    ooms = 0
    with torch.cuda.stream(s):
        for n in range(ITER):
            rows = 64 + (n * 37 + i * 11) % 448
            cols = 64 + (n * 53 + i * 7) % 448
            a = torch.randn(rows, cols, generator=g, device="cuda")
            b = torch.randn(cols, rows, generator=g, device="cuda")
            keep = [torch.empty((n % 7 + 1) << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
            c = (a @ b).relu().sum(dim=0)
            h.update(c.cpu().numpy().tobytes())
            del keep
            if i == 0 and n % 40 == 7:
                try:
                    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
                except torch.OutOfMemoryError:
                    ooms += 1
    out[i] = (h.hexdigest(), ooms)


def main():
    out = {}
    threads = [threading.Thread(target=worker, args=(i, out)) for i in range(THREADS)]
    t0 = time.time()
    for t in threads:
        t.start()
    time.sleep(5)
    # Mid-run: a forked child that never touches CUDA (a DataLoader worker) must not deadlock.
    pid = os.fork()
    if pid == 0:
        try:
            ctypes.CDLL("libm.so.6")
            ctypes.CDLL(None).dlsym
        except Exception:
            pass
        os._exit(0)
    deadline = time.time() + 30
    child_status = None
    while time.time() < deadline:
        p, status = os.waitpid(pid, os.WNOHANG)
        if p:
            child_status = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    if child_status is None:
        os.kill(pid, 9)
        child_status = "hung"
    # And the static-cudart client, started from this process mid-run (inherits the preload).
    static = subprocess.run([STATIC], capture_output=True, text=True, timeout=120)
    for t in threads:
        t.join()
    seconds = time.time() - t0
    torch.cuda.synchronize()
    result = {"digests": [out[i][0] for i in range(THREADS)], "ooms": out[0][1], "seconds": seconds,
              "fork_child": child_status, "static_rc": static.returncode, "static_out": static.stdout.strip()}
    try:
        # The package from the checkout (oomshim's hook adds no importable name of its own).
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shim", "python"))
        import oomshim

        if oomshim.loaded():
            oomshim.dump("soak-end")
            d = os.environ["OOMSHIM_DIR"]
            dumps = sorted((os.path.join(d, f) for f in os.listdir(d) if f.endswith(".json")
                            and not f.startswith("oomshim-torch-")), key=os.path.getmtime)
            with open(dumps[-1]) as f:
                dump = json.load(f)
            dev = next(x for x in dump["devices"] if x["index"] == 0)

            def holds(h, word):
                return any(word in ((fr.get("function") or "") + (fr.get("file") or "")) for fr in h["stack"])

            holders = [h for h in dump["largest_holders"] if h["device"] == 0]
            # torch's caching allocator's segments vs memory other libraries took themselves
            # (cuBLAS's own per-handle workspace): torch's reserved counts only the former.
            result.update({"holders": len(holders), "holders_complete": len(holders) == dev["tracked_count"],
                           "torch_segments": sum(h["bytes"] for h in holders if holds(h, "CUDACachingAllocator")),
                           "cublas_own": sum(h["bytes"] for h in holders
                                             if holds(h, "cublas") and not holds(h, "CUDACachingAllocator"))})
            result.update({"tracked": dev["tracked_bytes"], "reserved": torch.cuda.memory_reserved(),
                           "shim_ooms": dump["recording"]["oom_failures"],
                           "unknown_frees": dump["recording"]["unknown_frees"]})
    except ImportError:
        pass
    print(json.dumps(result), flush=True)


main()
