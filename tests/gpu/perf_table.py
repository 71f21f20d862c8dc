"""Issue 16's GPU performance table: one case per call, one JSON line printed last.

    python3 perf_table.py ab_loop LAUNCH    # torch.empty+del blocks, recording modes A/B in-process
    python3 perf_table.py ab_train LAUNCH   # GPT-2-small bf16 AdamW steps, modes A/B in-process
    python3 perf_table.py sep               # loop and training step once (separate-process rounds)
    python3 perf_table.py dump              # dump time at 100k and 1M live tensors (no caching)
    python3 perf_table.py rss MODE          # host memory per live tensor, MODE pass-through|all

LAUNCH is `preload` (the caller set LD_PRELOAD or used `oomshim run`) or `allocator` (this script
calls oomshim.torch.enable()). In-process A/B: each block in a recording mode sits between two
pass-through blocks (oomshim.set_recording), and its ratio is its time over the mean of those two;
the median of the ratios and their range are reported, so a ratio is measured against the same
process, caches and core. In allocator mode pass-through still serves every tensor from oomshim's
allocator: the ratio is the cost of recording; the allocator itself against torch's needs separate
processes (`sep`)."""
import json
import os
import resource
import sys
import time
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch_alloc  # noqa: E402  (the GPT-2-small model; puts shim/python on sys.path)
import oomshim  # noqa: E402

# "python" is allocator mode's default (Python stacks, no native unwinding).
MODES = ("totals", "python", "native", "all")


def out(d):
    print(json.dumps(d), flush=True)


def launch(kind):
    if kind == "allocator":
        import oomshim.torch
        oomshim.torch.enable()


loop_block = torch_alloc.empty_block


def ab(block, rounds):
    """Pass-through | mode | pass-through for each mode, `rounds` times (modes rotated)."""
    ratios = {m: [] for m in MODES}
    base = []
    started = oomshim.recording()
    for r in range(rounds):
        for i in range(len(MODES)):
            m = MODES[(i + r) % len(MODES)]
            oomshim.set_recording("pass-through")
            a = block()
            oomshim.set_recording(m)
            b = block()
            oomshim.set_recording("pass-through")
            c = block()
            ratios[m].append(b / ((a + c) / 2))
            base += [a, c]
    oomshim.set_recording(started or "all")
    return {"pass_through": median(base),
            "modes": {m: {"median": median(v), "min": min(v), "max": max(v), "n": len(v)}
                      for m, v in ratios.items()}}


def ab_loop(kind):
    launch(kind)
    n = int(os.environ.get("PERF_LOOP_BLOCK", "3000"))
    loop_block(2000)
    r = ab(lambda: loop_block(n), int(os.environ.get("PERF_ROUNDS", "7")))
    out({"case": "ab_loop", "launch": kind, "nocache": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
         "us_per_iter_pass_through": r["pass_through"] / 1000, "modes": r["modes"]})


def trainer(batch=8, ctx=256):
    torch.manual_seed(0)
    model = torch_alloc.GPT(ctx=ctx).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 50257, (batch, ctx + 1), generator=gen).cuda() for _ in range(4)]

    def steps(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for i in range(n):
            xy = data[i % len(data)]
            x, y = xy[:, :-1], xy[:, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                                         y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / n
    return steps


def ab_train(kind):
    launch(kind)
    steps = trainer()
    steps(8)  # warm-up: kernels, cache, optimizer state
    n = int(os.environ.get("PERF_TRAIN_BLOCK", "4"))
    r = ab(lambda: steps(n), int(os.environ.get("PERF_ROUNDS", "5")))
    out({"case": "ab_train", "launch": kind, "ms_per_step_pass_through": r["pass_through"] / 1e6,
         "modes": r["modes"]})


def sep():
    """Once, for separate-process rounds: PERF_SEP_MODE native|preload|allocator."""
    mode = os.environ.get("PERF_SEP_MODE", "native")
    if mode == "allocator":
        launch("allocator")
    loop_block(2000)
    loop_us = min(loop_block(20000) for _ in range(3)) / 1000
    steps = trainer()
    steps(6)
    step_ms = median([steps(1) for _ in range(15)]) / 1e6
    if mode == "allocator":
        import oomshim.torch as ot
        peak = ot.max_memory_reserved()
    else:
        peak = torch.cuda.max_memory_reserved()
    out({"case": "sep", "mode": mode, "loop_us": loop_us, "step_ms": step_ms, "peak_reserved": peak})


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def dump():
    """Under LD_PRELOAD with PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is a live allocation."""
    keep = []
    times = {}
    for target in (100_000, 1_000_000):
        while len(keep) < target:
            keep.append(torch.empty(128, device="cuda"))
        t0 = time.perf_counter()
        ok = oomshim.dump("perf-table-%d" % target)
        times[str(target)] = time.perf_counter() - t0 if ok else None
    out({"case": "dump", "seconds": times, "live": len(keep)})


def rss(mode):
    """Host memory grown by 1,000,000 live tensors (no caching) with the shim in MODE from the
    start; the difference between `all` and `pass-through` is the shim's."""
    oomshim.set_recording(mode)
    x = torch.empty(128, device="cuda")  # CUDA context, caches
    del x
    before = rss_kib()
    keep = [torch.empty(128, device="cuda") for _ in range(1_000_000)]
    grown = rss_kib() - before
    out({"case": "rss", "mode": mode, "live": len(keep), "grown_kib": grown,
         "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})


def main():
    case = sys.argv[1]
    arg = sys.argv[2] if len(sys.argv) > 2 else None
    {"ab_loop": lambda: ab_loop(arg), "ab_train": lambda: ab_train(arg), "sep": sep, "dump": dump,
     "rss": lambda: rss(arg)}[case]()


if __name__ == "__main__":
    main()
