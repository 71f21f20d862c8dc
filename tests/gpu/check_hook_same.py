"""GPU check: oomshim's Python hook changes nothing a torch program computes, under every launcher.

Two programs, each run bare, under LD_PRELOAD, under `oomshim run` and under `oomshim run
--torch-allocator`, one after another (each sizes itself from the device's free memory), their
stdout compared exactly and their stderr less the shim's own `oomshim:` lines:

- an OOM-retry loop: a model whose forward needs `batch x S` bytes of activations, S a tenth of
  the free memory over 1.28 (so batch 64, 32 and 16 do not fit and 8 does), halving the batch
  after each torch.OutOfMemoryError until it fits, then training two steps; it prints the error's
  type each time, the batch that fits, the losses (deterministic algorithms), and whether each
  dropped batch was freed by its `del` (a weak reference, no garbage collection). Under the shim
  the dumps must carry the memory by kind (phase, models);
- a torch.compile'd model (inductor, its default) trained and evaluated, then run again under
  `torch.compiler.set_stance("fail_on_recompile")`: outputs, dynamo's graph and recompile counts.

    python3 tests/gpu/check_hook_same.py OUT_DIR [--cpu]

OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI: the library and CLI under test (default target/release/...).
`--cpu` runs the same comparisons on a machine without a GPU, the OOM reached through torch's
observer path as tests/real_torch/support/_oomsim.py does (a dry run of this script's plumbing).
Prints `[PASS]`/`[FAIL]`/`[INFO]` lines and appends them to OUT_DIR/rows.txt; exits 1 on a FAIL.
Bounded: each run has a timeout, the whole script about 3 minutes on an H100.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standalone  # noqa: E402 (rows, the set-up and one run by each launcher, as every check has them)
from standalone import LAUNCHERS  # noqa: E402

RETRY = r'''
import os, sys, weakref
import torch
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
CPU = "--cpu" in sys.argv
dev = "cpu" if CPU else "cuda"
if CPU:
    from _oomsim import fail
    free = 8 << 30
else:
    free, _total = torch.cuda.mem_get_info()
S = int(free / 12.8)  # bytes of activations a sample: 8 samples fit, 16 do not
ELEMS = max(S // 4, 1)


class Hungry(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.fc(x)
        if CPU:
            if x.shape[0] > 8:
                fail(x.shape[0] * S)
            wide = torch.zeros(1, device=dev)
        else:
            wide = torch.zeros(x.shape[0], ELEMS, device=dev)  # the activations
        return h.sum() + wide.sum() * 0


model = torch.nn.Sequential(Hungry()).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def find_batch(batch):
    dropped = []
    while True:
        x = torch.randn(batch, 32, device=dev)
        seen = weakref.ref(x)
        try:
            loss = model(x)
            return batch, loss, dropped
        except RuntimeError as e:
            if "out of memory" not in str(e):
                raise
            print("oom", batch, type(e).__name__, flush=True)
        del x
        dropped.append(seen() is not None)
        batch //= 2


batch, loss, dropped = find_batch(64)
print("fits", batch, "dropped batches alive", dropped)
if not CPU:
    # As batch finders do once the search is over: the failed attempts' cached segments go back
    # to the device. Else the backward's first cuBLAS workspace is carved out of the freed
    # activations' segment, which then cannot be released, and the next forward fails bare.
    torch.cuda.empty_cache()
for step in range(2):
    loss.backward()
    opt.step()
    opt.zero_grad()
    x = torch.randn(batch, 32, device=dev)
    loss = model(x)
    print("step", step, round(loss.item(), 4))
'''

COMPILED = r'''
import sys
import torch
from torch._dynamo.utils import counters
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = "cpu" if "--cpu" in sys.argv else "cuda"
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
compiled = torch.compile(model)
data = [torch.randn(64, 256, device=dev) for _ in range(4)]


def train(x):
    loss = compiled(x).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return round(loss.item(), 4)


print("warm", [train(x) for x in data[:2]])
with torch.no_grad():
    print("eval", round(compiled(data[0]).sum().item(), 3))
torch.compiler.set_stance("fail_on_recompile")
print("steady", [train(x) for x in data])
with torch.no_grad():
    print("eval", round(compiled(data[1]).sum().item(), 3))
print("unique graphs", counters["stats"]["unique_graphs"],
      "recompiles", sum(counters["recompiles"].values()) if counters["recompiles"] else 0,
      "graph breaks", sum(counters["graph_break"].values()))
'''

SHIM_LINE = re.compile(r"^oomshim[: ]")
TORCH_LOG = re.compile(r"^([WIEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


def launch(program, launcher, work, cpu, timeout):
    """One run: (stdout, stderr less the shim's lines, exit status, dumps, seconds)."""
    out, err, rc, found, seconds = standalone.launch(
        program, launcher, os.path.join(work, f"dumps-{launcher}"), work, cpu, timeout,
        env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0",
             "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, "inductor-cache")})
    err_lines = [TORCH_LOG.sub(r"\1<time pid> ", line) for line in err.splitlines() if not SHIM_LINE.match(line)]
    return out, err_lines, rc, [dump for _, dump in found], seconds


def compare(rows, name, runs):
    bare = runs["bare"]
    rows.info(f"{name}: bare output", " | ".join(bare[0].strip().splitlines())[:600] + f" (exit {bare[2]}, {bare[4]:.0f} s)")
    if bare[2] != 0:
        rows.row(f"{name}: runs bare", False, "\n".join(bare[1][-20:]))
        return
    for launcher in LAUNCHERS[1:]:
        out, err, rc, _, seconds = runs[launcher]
        problems = []
        if rc != bare[2]:
            problems.append(f"exit {rc} instead of {bare[2]}")
        if out != bare[0]:
            a, b = bare[0].splitlines(), out.splitlines()
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(f"stdout line {i + 1}: {b[i] if i < len(b) else '(none)'!r} instead of "
                            f"{a[i] if i < len(a) else '(none)'!r}")
        if err != bare[1]:
            extra = [line for line in err if line not in bare[1]][:3]
            missing = [line for line in bare[1] if line not in err][:3]
            problems.append(f"stderr differs (lines not in bare: {extra}; bare's lines missing: {missing}"
                            f"{'; same lines in another order' if not extra and not missing else ''})")
        rows.row(f"{name}: {launcher} runs exactly as bare", not problems,
                 "; ".join(problems) if problems else f"same stdout, stderr and exit ({seconds:.0f} s)")


def compare_all(rows, out, cpu, work):
    """Each program bare and under every launcher, compared; their outputs kept in `out`."""
    for name, text, timeout in (("OOM-retry loop", RETRY, 120), ("compiled, fail_on_recompile", COMPILED, 180)):
        program = os.path.join(work, re.sub(r"\W+", "_", name) + ".py")
        with open(program, "w") as f:
            f.write(text)
        # A first bare run, not compared, fills the caches every later run shares (inductor's
        # compiled kernels, with the warnings only a cold compile prints).
        launch(program, "bare", work, cpu, timeout)
        runs = {launcher: launch(program, launcher, work, cpu, timeout) for launcher in LAUNCHERS}
        compare(rows, name, runs)
        if name == "OOM-retry loop":
            for launcher in LAUNCHERS[1:]:
                if cpu and launcher == "allocator":
                    # oomshim's allocator calls the observers from a failed allocation of its own,
                    # which the CPU never makes: nothing to dump there.
                    continue
                dumps = runs[launcher][3]
                kinds = [((d.get("framework") or {}).get("kinds") or {}) for d in dumps]
                # (On the CPU no parameter is on a device: no model to count.)
                with_kinds = [k for k in kinds if k.get("phase") and (cpu or k.get("models"))]
                first = with_kinds[0] if with_kinds else {}
                rows.row(f"{name}: {launcher} dumps carry the memory by kind", bool(with_kinds),
                         f"{len(dumps)} dumps, {len(with_kinds)} with kinds; first: phase "
                         f"{first.get('phase')}, module {(first.get('module') or {}).get('class')}, batch "
                         f"{first.get('batch')}, activations {first.get('activations_bytes')} B, "
                         f"parameters {first.get('parameters_bytes')} B")
        for launcher in LAUNCHERS:
            with open(os.path.join(out, f"{re.sub(r'[^a-z]+', '-', name.lower())}-{launcher}.txt"), "w") as f:
                f.write(runs[launcher][0] + "\n--- stderr less oomshim: lines ---\n" + "\n".join(runs[launcher][1]))


if __name__ == "__main__":
    sys.exit(standalone.run_with_cpu_mode("hook same", "oomshim-hook-same", compare_all))
