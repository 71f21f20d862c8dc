"""Issue 26, item 3: allocator mode against torch's native allocator and against torch's own
recorder, A/B in ONE process. Prints figures (medians, ranges, the goals beside them), never a pass.

    python3 tests/gpu/allocator_ab.py            # about 3 minutes on an H200
    AB_ROUNDS=24 AB_LOOP=50000 AB_STEP_ROUNDS=48 AB_STEPS=4 python3 ...   # the defaults
    AB_CASES=step,forward AB_ARMS=allocator,totals,pass_through python3 ...   # a narrower run
    AB_SECONDS=300 python3 ...   # stop starting rounds after 300 s; report the rounds made

A SIGTERM (`timeout`) also ends the rounds: what was measured is reported, not lost.

How both allocators serve one process. torch asks one process-wide pointer for every tensor's
memory: `c10::cuda::CUDACachingAllocator::allocator`, an exported `std::atomic<CUDAAllocator*>` in
libc10_cuda.so (read at every allocation, which is how a pluggable allocator takes over at all).
`oomshim.torch.enable()` points it, before CUDA starts, at a CUDAPluggableAllocator over
oomshim_torch_alloc/free (and sets torch's `current_custom_allocator`, which frees that allocator's
tensors). This script reads the pointer before and after enable(), puts the native allocator back,
lets CUDA start (torch initialises the native allocator then), runs the init hook enable()
registered (`oomshim_torch_init`: allocator mode starts), and from then on stores one pointer or
the other between blocks. A tensor is always freed by the allocator that made it, whichever is
current: its DataPtr carries its deleter (the native instance's, or the pluggable allocator's
through `current_custom_allocator`). Calls through the pointer itself (memory stats, the
recorder's switch, empty_cache) are made only while native is current. torch has no supported
way to do this: it is a benchmark's device, checked below before anything is timed.

Blocks alternate, each arm's block divided by the mean of the two native blocks around it
(Python's garbage collector runs between blocks, never inside one):

    native | allocator | native | pass-through | native | recorder | native | ...   (order rotates)

Arms: `allocator` (oomshim's allocator, its default recording: every tensor in the ledger with
its Python stack), `all_stacks` (and each tensor's native stack, OOMSHIM_STACKS=all),
`pass_through` (oomshim's allocator recording nothing: the allocator and torch's pluggable
wrapper alone), `recorder` (torch's native allocator with
`torch.cuda.memory._record_memory_history(stacks="python", max_entries=100_000)`). Cases:
`torch.empty(1024)`+`del` in a Python loop (goal: allocator <= 1.05x native) and a GPT-2-small
bf16 AdamW training step (goal <= 1.01x), allocator mode below the recorder in both, and the
95% confidence interval of each median within +-2%. On request (AB_CASES, AB_ARMS): `forward`,
the step's forward pass and loss alone (every tensor allocated on the calling thread, none on
autograd's), and the arm `totals` (every tensor in the ledger, no stack). liboomshim.so:
OOMSHIM_LIB or target/release.
"""
import ctypes
import gc
import json
import os
import signal
import sys
import time
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("allocator", "all_stacks", "pass_through", "recorder")
# What oomshim records in each of its arms. Allocator mode's default records every tensor with its
# Python stack and no native one (OOMSHIM_STACKS unset); once a program picks a mode with
# set_recording the mode alone decides, so the default is picked by its name, "python".
RECORDING = {"allocator": "python", "all_stacks": "all", "totals": "totals", "pass_through": "pass-through"}
GOALS = {"loop": 1.05, "step": 1.01}
# c10::cuda::CUDACachingAllocator::allocator
POINTER_SYMBOL = "_ZN3c104cuda20CUDACachingAllocator9allocatorE"


def median_interval(v):
    """A 95% confidence interval of the median of v, from order statistics (no assumption on the
    distribution): the k-th smallest and k-th largest, k the largest with P(Binomial(n, 1/2) < k)
    <= 2.5%. More blocks narrow it; the middle half of the ratios does not narrow."""
    from math import comb

    s, n = sorted(v), len(v)
    k, below = 0, 0.0
    while k < n // 2:
        nxt = below + comb(n, k) / 2 ** n
        if nxt > 0.025:
            break
        below, k = nxt, k + 1
    k = max(k, 1)
    return s[k - 1], s[n - k]


class Allocators:
    """torch's current CUDA allocator, switchable between its native one and oomshim's."""

    def __init__(self):
        import torch

        if torch.cuda.is_initialized():
            sys.exit("allocator_ab: CUDA started before the allocators were set up")
        c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so"))
        try:
            self.slot = ctypes.c_void_p.in_dll(c10, POINTER_SYMBOL)
        except ValueError:
            sys.exit(f"allocator_ab: libc10_cuda.so exports no {POINTER_SYMBOL}; this torch cannot be A/B'd in one process")
        import oomshim
        import oomshim.torch

        self.native = self.slot.value
        oomshim.torch.enable(patch_torch=False)  # torch's own statistics must stay native's
        self.oomshim = self.slot.value
        if not self.native or self.oomshim == self.native:
            sys.exit("allocator_ab: enable() did not change torch's allocator pointer")
        self.slot.value = self.native
        torch.cuda.init()  # torch initialises the current (native) allocator
        lib = oomshim.torch._lib()
        lib.oomshim_torch_init.argtypes = [ctypes.c_int]
        lib.oomshim_torch_init(torch.cuda.device_count())  # what the pluggable allocator's init hook does
        self.torch, self.shim, self.shim_torch = torch, oomshim, oomshim.torch

    def use(self, which):
        self.slot.value = self.oomshim if which == "oomshim" else self.native

    def check(self):
        """Before anything is timed: a tensor made while oomshim is current is served by oomshim
        (its ledger grows, native's count does not), one made while native is current by native;
        each is freed by its own allocator whichever is current. Exits with what failed."""
        torch, mib = self.torch, 1 << 20
        self.use("native")
        native_before = torch.cuda.memory_stats()["allocation.all.allocated"]
        shim_before = self.shim_torch.memory_allocated()
        self.use("oomshim")
        x = torch.empty(8 * mib, dtype=torch.uint8, device="cuda")
        shim_with_x = self.shim_torch.memory_allocated()
        self.use("native")
        native_after = torch.cuda.memory_stats()["allocation.all.allocated"]
        y = torch.empty(8 * mib, dtype=torch.uint8, device="cuda")
        native_with_y = torch.cuda.memory_stats()["allocation.all.allocated"]
        del x  # made by oomshim, freed while native is current
        shim_after = self.shim_torch.memory_allocated()
        self.use("oomshim")
        del y  # made by native, freed while oomshim is current
        self.use("native")
        native_freed = torch.cuda.memory_stats()["allocation.all.freed"]
        problems = []
        if shim_with_x - shim_before < 8 * mib:
            problems.append(f"oomshim's ledger grew by {shim_with_x - shim_before} bytes for an 8 MiB tensor")
        if native_after != native_before:
            problems.append("native counted an allocation made while oomshim was current")
        if native_with_y != native_after + 1:
            problems.append("native did not count an allocation made while it was current")
        if shim_after != shim_before:
            problems.append(f"oomshim's tensor was not freed by oomshim ({shim_after - shim_before} bytes left)")
        if native_freed < 1:
            problems.append("native's tensor was not freed by native")
        if problems:
            sys.exit("allocator_ab: the allocator switch does not work here: " + "; ".join(problems))


def measure(rounds, sizes, arms, cases):
    sys.path.insert(0, HERE)
    import torch_alloc  # noqa: E402  (the model and the timed blocks; puts shim/python on sys.path)

    alloc = Allocators()

    torch, shim = alloc.torch, alloc.shim
    alloc.check()
    alloc.use("native")
    steps = torch_alloc.timed_steps()  # model, optimizer state: native's, never freed
    loop = torch_alloc.empty_block

    def block(arm, case):
        gc.collect()  # the last block's garbage is not collected inside this one
        if arm in RECORDING:
            alloc.use("oomshim")
            shim.set_recording(RECORDING[arm])
        elif arm == "recorder":
            # As torch's documentation starts it (a ring of 100,000 events), Python stacks only.
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=100_000)
        try:
            if case == "loop":
                return loop(sizes["loop"])
            return steps(sizes["step"], train=case == "step")[0]
        finally:
            if arm == "recorder":
                torch.cuda.memory._record_memory_history(enabled=None)
            alloc.use("native")

    for arm in ("native",) + arms:  # warm every arm's cache and code paths
        loop(5000)
        block(arm, "step") if arm != "native" else steps(3)
    results = {}
    t0 = time.time()
    # Rounds stop at AB_SECONDS or a SIGTERM; the rounds made so far are reported.
    deadline = t0 + float(os.environ.get("AB_SECONDS", "inf"))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    gc.disable()

    def out_of_time():
        return stop or time.time() > deadline

    for case in cases:
        if out_of_time():
            print(f"allocator_ab: {case} not measured (out of time)", flush=True)
            continue
        ratios = {arm: [] for arm in arms}
        natives = [block("native", case)]
        made = 0
        while made < rounds[case] and not out_of_time():
            for k in range(len(arms)):  # rotate the order, so that no arm always follows another
                arm = arms[(made + k) % len(arms)]
                t = block(arm, case)
                natives.append(block("native", case))
                ratios[arm].append(t / ((natives[-2] + natives[-1]) / 2))
            made += 1
        if made < rounds[case]:
            print(f"allocator_ab: {case} stopped after {made} of {rounds[case]} rounds (out of time)",
                  flush=True)
        if made:
            results[case] = {"native": median(natives), "ratios": ratios, "rounds": made}
    gc.enable()
    return results, time.time() - t0


def main():
    # Rounds and block sizes per case. A step's blocks vary by +-5% on the H200 (the step is
    # bound by the host CPU, shared with whatever else runs): many short blocks narrow the
    # median's interval, where longer blocks would not.
    rounds = {"loop": int(os.environ.get("AB_ROUNDS", "24")),
              "step": int(os.environ.get("AB_STEP_ROUNDS", "48"))}
    sizes = {"loop": int(os.environ.get("AB_LOOP", "50000")),
             "step": int(os.environ.get("AB_STEPS", "4"))}
    rounds["forward"], sizes["forward"] = rounds["step"], sizes["step"]
    # AB_ARMS / AB_CASES (comma-separated) narrow a run for profiling; totals is an extra arm.
    arms = tuple(os.environ.get("AB_ARMS", ",".join(ARMS)).split(","))
    cases = tuple(os.environ.get("AB_CASES", "loop,step").split(","))
    unit = {"loop": ("us per torch.empty+del", 1e3), "step": ("ms per training step", 1e6),
            "forward": ("ms per forward pass and loss (no backward)", 1e6)}
    # A misspelt arm would run as native (a ratio of 1 that looks like a result), a misspelt case
    # as the forward pass: refused before anything is timed.
    bad = [a for a in arms if a not in ARMS + ("totals",)] + [c for c in cases if c not in unit]
    if bad:
        sys.exit(f"allocator_ab: unknown AB_ARMS/AB_CASES entries {bad}: arms are {', '.join(ARMS)}, "
                 f"totals; cases {', '.join(unit)}")
    results, took = measure(rounds, sizes, arms, cases)
    print(f"\nallocator mode A/B in one process, {took:.0f} s "
          f"({time.strftime('%Y-%m-%d', time.gmtime())})")
    table = {}
    for case, r in results.items():
        name, scale = unit[case]
        blocks = sum(len(v) for v in r["ratios"].values()) + 1
        print(f"\n{case}: native {r['native'] / scale:.3f} {name} (median of {blocks} native blocks of "
              f"{sizes[case]}; {r['rounds']} rounds)")
        for arm, v in r["ratios"].items():
            s = sorted(v)
            q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
            med = median(v)
            half = (q3 - q1) / 2 / med * 100
            lo, hi = median_interval(v)
            ci = max(med - lo, hi - med) / med * 100
            goal = GOALS.get(case) if arm == "allocator" else None
            against = ""
            if goal:
                against = (f"   goal <= {goal:.2f}x: " + ("within" if med <= goal else
                           f"over by {(med / goal - 1) * 100:.1f}%"))
            print(f"  {arm:12s} {med:.3f}x native   95% interval {lo:.3f}-{hi:.3f} (+-{ci:.1f}%, goal +-2%)   "
                  f"range {min(v):.3f}-{max(v):.3f}   middle half +-{half:.1f}%{against}")
            table[f"{case}_{arm}"] = {"median": med, "ci95": [lo, hi], "ci95_pct": ci, "min": min(v),
                                      "max": max(v), "iqr_half_pct": half}
        if "allocator" in r["ratios"] and "recorder" in r["ratios"]:
            a, rec = median(r["ratios"]["allocator"]), median(r["ratios"]["recorder"])
            print(f"  allocator / recorder: {a / rec:.3f} (goal below 1)")
        table[f"{case}_native_ns"] = r["native"]
    made = {case: r["rounds"] for case, r in results.items()}
    print(json.dumps({"case": "allocator_ab", "one_process": True, "rounds": made, "sizes": sizes,
                      "recording": RECORDING, **table}))


if __name__ == "__main__":
    main()
