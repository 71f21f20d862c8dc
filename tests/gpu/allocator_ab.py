"""Issue 26, item 3: allocator mode against torch's native allocator and against torch's own
recorder, A/B in one run. Prints figures (medians, ranges, the goals beside them), never a pass.

    python3 tests/gpu/allocator_ab.py            # about 90 s on an H200 (6 rounds took 44 s)
    AB_ROUNDS=12 AB_LOOP=200000 AB_STEPS=10 python3 tests/gpu/allocator_ab.py   # the defaults

Allocator mode must be chosen before CUDA starts, and can never be switched back to torch's
allocator, so the three arms cannot share one process. Each arm is one long-lived worker process
(warmed once: CUDA context, kernels, caches, optimizer state) and the parent runs their blocks
one at a time, alternating, while the others wait on a pipe:

    native | allocator | native | recorder | native | allocator | ...

Each arm's block is divided by the mean of the two native blocks around it, so a ratio compares
blocks seconds apart on the same machine at the same load; the median of those ratios and their
range (min-max, and the half-width of the middle half, which should be under 2%) are printed.

Arms: `native` (torch's caching allocator), `allocator` (oomshim.torch.enable(): oomshim is
torch's allocator, its default stacks), `recorder` (torch's allocator with
torch.cuda.memory._record_memory_history(stacks="python")). Cases: the `torch.empty(1024)`+`del`
loop (goal: allocator <= 1.05x native) and a GPT-2-small bf16 AdamW training step (goal <= 1.01x),
and allocator mode below the recorder in both. liboomshim.so: OOMSHIM_LIB or target/release.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("native", "allocator", "recorder")
GOALS = {"loop": 1.05, "step": 1.01}


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


# ---------------------------------------------------------------- worker (one arm per process)

def worker(arm):
    sys.path.insert(0, HERE)
    import torch  # noqa: E402
    import torch_alloc  # noqa: E402  (the GPT-2-small model; puts shim/python on sys.path)

    if arm == "allocator":
        torch_alloc.enable()
    elif arm == "recorder":
        torch.cuda.memory._record_memory_history(stacks="python")

    loop = torch_alloc.empty_block
    steps = torch_alloc.timed_steps()

    loop(5000)
    steps(6)
    print("ready", flush=True)
    for line in sys.stdin:
        case, n = line.split()
        t = loop(int(n)) if case == "loop" else steps(int(n))[0]
        print(t, flush=True)


# ---------------------------------------------------------------- parent

def main():
    rounds = int(os.environ.get("AB_ROUNDS", "12"))
    sizes = {"loop": int(os.environ.get("AB_LOOP", "200000")),
             "step": int(os.environ.get("AB_STEPS", "10"))}
    procs = {}
    for arm in ARMS:
        procs[arm] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", arm],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for arm, p in procs.items():
        line = p.stdout.readline().strip()
        if line != "ready":
            sys.exit(f"allocator_ab: the {arm} worker did not start (said {line!r})")

    def block(arm, case):
        p = procs[arm]
        p.stdin.write(f"{case} {sizes[case]}\n")
        p.stdin.flush()
        return float(p.stdout.readline())

    results = {}
    t0 = time.time()
    for case in ("loop", "step"):
        ratios = {"allocator": [], "recorder": []}
        natives = []
        for r in range(rounds):
            # Alternate which arm goes first, so neither always follows the other.
            order = ("allocator", "recorder") if r % 2 == 0 else ("recorder", "allocator")
            for arm in order:
                a = block("native", case)
                b = block(arm, case)
                c = block("native", case)
                ratios[arm].append(b / ((a + c) / 2))
                natives += [a, c]
        results[case] = {"native": median(natives), "ratios": ratios}
    for p in procs.values():
        p.stdin.close()
        p.wait(timeout=60)

    unit = {"loop": ("us per torch.empty+del", 1e3), "step": ("ms per training step", 1e6)}
    print(f"\nallocator mode A/B, {rounds} rounds, {time.time() - t0:.0f} s "
          f"({time.strftime('%Y-%m-%d', time.gmtime())})")
    table = {}
    for case, r in results.items():
        name, scale = unit[case]
        print(f"\n{case}: native {r['native'] / scale:.3f} {name} (median of {len(r['ratios']['allocator']) * 4} blocks)")
        for arm, v in r["ratios"].items():
            s = sorted(v)
            q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
            med = median(v)
            half = (q3 - q1) / 2 / med * 100
            goal = GOALS[case] if arm == "allocator" else None
            against = f"   goal <= {goal:.2f}x: {'within' if med <= goal else 'over by ' + format((med / goal - 1) * 100, '.1f') + '%'}" if goal else ""
            print(f"  {arm:9s} {med:.3f}x native   range {min(v):.3f}-{max(v):.3f}   "
                  f"middle half +-{half:.1f}%{against}")
            table[f"{case}_{arm}"] = {"median": med, "min": min(v), "max": max(v), "iqr_half_pct": half}
        a, rec = median(r["ratios"]["allocator"]), median(r["ratios"]["recorder"])
        print(f"  allocator / recorder: {a / rec:.3f} (goal below 1)")
    print(json.dumps({"case": "allocator_ab", "rounds": rounds, "sizes": sizes, **table}))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "worker":
        worker(sys.argv[2])
    else:
        main()
