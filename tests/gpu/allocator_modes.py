"""Issue 26, item 3: where allocator mode's time goes on a training step, in one process.

    python3 tests/gpu/allocator_modes.py          # about 60 s on an H200

allocator_ab.py compares allocator mode with torch's native allocator; this splits allocator
mode's own cost by recording mode, switching what the shim records with oomshim.set_recording
between blocks (oomshim's caching allocator serves every block):

    pass-through (the allocator alone) | totals | python (Python stacks) | all (and native) | ...

Each block is divided by the mean of the two pass-through blocks around it. A second process
runs torch's native allocator for the allocations a step makes (memory_stats) and its time per
step, for scale (across processes: only a rough figure). Prints figures, never a pass.
"""
import json
import os
import subprocess
import sys
import time
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("totals", "python", "all")


def setup(allocator):
    """torch, steps(n) and, in allocator mode, a function that registers the shim's code watcher
    (enable() runs without it here: modes() measures Python stacks before and after)."""
    sys.path.insert(0, HERE)
    import torch
    import torch_alloc

    watch_code = None
    if allocator:
        import oomshim.torch
        watch_code = oomshim.torch._watch_code
        oomshim.torch._watch_code = lambda: False
        torch_alloc.enable()
    timed = torch_alloc.timed_steps()

    def steps(n):
        wall, cpu = timed(n)
        return wall / 1e6, cpu / 1e6  # milliseconds a step

    steps(6)
    return torch, steps, watch_code


def native():
    torch, steps, _ = setup(False)
    before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    ms = [steps(10)[0] for _ in range(8)]
    after = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    print(json.dumps({"native_step_ms": median(ms), "allocations_per_step": (after - before) / 80}))


def deep_loop(n, depth=30):
    """torch_alloc.empty_block(n) called through depth + 1 frames of nest(): each tensor's Python
    stack is then 37 frames deep (<module>, main, modes, stack_ns, deep_loop, 31 of nest,
    empty_block)."""
    import torch_alloc

    def nest(d):
        return torch_alloc.empty_block(n) if d == 0 else nest(d - 1)

    return nest(depth)


def between_pass_through(oomshim, mode, block, rounds):
    """`rounds` blocks recording `mode`, each between two blocks recording nothing (the one after
    a block is the next one's before): [(before, during, after)] of block()'s results."""
    oomshim.set_recording("pass-through")
    prev = block()
    runs = []
    for _ in range(rounds):
        oomshim.set_recording(mode)
        t = block()
        oomshim.set_recording("pass-through")
        nxt = block()
        runs.append((prev, t, nxt))
        prev = nxt
    return runs


def stack_ns(oomshim, rounds):
    """ns the Python stack adds to a tensor allocated from 37 Python frames: python blocks
    against the mean of the pass-through blocks around each (median over rounds), and the last
    pass-through block."""
    runs = between_pass_through(oomshim, "python", lambda: deep_loop(20000), rounds)
    return median([t - (a + c) / 2 for a, t, c in runs]), runs[-1][2]


def modes():
    torch, steps, watch_code = setup(True)
    import oomshim  # on sys.path once torch_alloc is imported
    rounds = int(os.environ.get("MODES_ROUNDS", "8"))
    loop_unwatched, loop_base = stack_ns(oomshim, 2 * rounds)
    # First without the code watcher (CPython 3.12+): Python stacks check every frame's code
    # object at every allocation; python blocks between pass-through blocks.
    unwatched = [t[0] / ((a[0] + c[0]) / 2)
                 for a, t, c in between_pass_through(oomshim, "python", lambda: steps(10), rounds)]
    # Then with it, as enable() registers it, for every mode.
    watcher = watch_code()
    loop_watched, _ = stack_ns(oomshim, 2 * rounds)
    base, by = [], {m: [] for m in MODES}
    cpu = {m: [] for m in ("pass-through",) + MODES}
    oomshim.set_recording("pass-through")
    prev = steps(10)
    cpu["pass-through"].append(prev[1])
    for _ in range(rounds):
        for m in MODES:
            oomshim.set_recording(m)
            t = steps(10)
            cpu[m].append(t[1])
            oomshim.set_recording("pass-through")
            nxt = steps(10)
            cpu["pass-through"].append(nxt[1])
            by[m].append(t[0] / ((prev[0] + nxt[0]) / 2))
            base.append(nxt[0])
            prev = nxt
    print(json.dumps({"pass_through_step_ms": median(base),
                      "code_watcher": watcher,
                      "loop_pass_through_ns": loop_base,
                      "loop_python_stack_ns_unwatched": loop_unwatched,
                      "loop_python_stack_ns_watched": loop_watched,
                      "python_unwatched_over_pass_through": median(unwatched),
                      "python_unwatched_range": [min(unwatched), max(unwatched)],
                      **{f"{m}_over_pass_through": median(v) for m, v in by.items()},
                      **{f"{m}_range": [min(v), max(v)] for m, v in by.items()},
                      **{f"{m}_cpu_ms": median(v) for m, v in cpu.items()}}))


def main():
    if len(sys.argv) > 1:
        {"native": native, "modes": modes}[sys.argv[1]]()
        return
    rows = {}
    for arm in ("native", "modes"):
        p = subprocess.run([sys.executable, __file__, arm], capture_output=True, text=True, timeout=240)
        last = (p.stdout.strip().splitlines() or [""])[-1]
        try:
            rows.update(json.loads(last))
        except ValueError:
            print(f"allocator_modes: {arm} said nothing usable (exit {p.returncode}): {p.stderr[-600:]}")
    print(f"allocator mode, one process, blocks of 10 steps ({time.strftime('%Y-%m-%d')})")
    if "native_step_ms" in rows:
        print(f"  native (other process): {rows['native_step_ms']:.2f} ms a step, "
              f"{rows['allocations_per_step']:.0f} allocations a step")
    if "pass_through_step_ms" in rows:
        print(f"  allocator, recording nothing: {rows['pass_through_step_ms']:.2f} ms a step "
              f"(cpu {rows['pass-through_cpu_ms']:.2f} ms)")
        lo, hi = rows["python_unwatched_range"]
        print(f"  recording python, each code object checked at every allocation: "
              f"{rows['python_unwatched_over_pass_through']:.3f}x   range {lo:.3f}-{hi:.3f}")
        print(f"  code watcher registered for what follows: {rows['code_watcher']}")
        print(f"  torch.empty+del from 37 Python frames: {rows['loop_pass_through_ns']:.0f} ns recording nothing; "
              f"its Python stack adds {rows['loop_python_stack_ns_unwatched']:.0f} ns without the watcher, "
              f"{rows['loop_python_stack_ns_watched']:.0f} ns with it")
        for m in MODES:
            lo, hi = rows[f"{m}_range"]
            print(f"  recording {m:6}: {rows[f'{m}_over_pass_through']:.3f}x   range {lo:.3f}-{hi:.3f}   "
                  f"cpu {rows[f'{m}_cpu_ms']:.2f} ms a step")
    print(json.dumps({"case": "allocator_modes", **rows}))


if __name__ == "__main__":
    main()
