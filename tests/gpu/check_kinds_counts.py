"""GPU check: memory by kind counts every model, finds models loaded outside any step under every
launcher, and names copies of a model by the model, not by its layers.

Three programs, each run under LD_PRELOAD, `oomshim run` and `oomshim run --torch-allocator`,
each sized from the device's free memory, each printing its own count of its parameters at the
failure (every storage once):

- forty models: 40 models of different sizes (60% of the free memory in all), then a forward pass
  whose activations (60% more) do not fit. The dump's parameters must equal the program's count,
  16 models listed and 24 more said, and the headline names the parameters as what fills the
  device (a dump that counted only the 16 listed called the rest "activations");
- four copies: a model of bfloat16 layers, each copy 22% of the device, kept four times; the
  fifth runs out while its layers are built (torch raises from a layer's constructor, before any
  step). Every launcher's parameters must equal the program's count, and the dump, its headline
  and the stderr line name "the Sequential model is held 4 times (4 × …, identical parameter
  shapes)", not a layer class;
- forty-eight blocks: one model of 48 identical blocks, each 1/40 of the free memory, built block
  by block: it runs out while built. Parameters as counted by the program, and no copy named.

    python3 tests/gpu/check_kinds_counts.py OUT_DIR [--cpu]

OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI: the library and CLI under test (default target/release/...).
`--cpu` runs the same programs on a machine without a GPU (a dry run of this script): torch's
failure comes from tests/real_torch/support/_oomsim.py, the hook counts the CPU's tensors, and
allocator mode (which needs CUDA) is left out. Prints `[PASS]`/`[FAIL]`/`[INFO]` lines and
appends them to OUT_DIR/rows.txt; exits 1 on a FAIL. Bounded: each run has a 180 s timeout; the
whole script takes about 3 minutes on an H100.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standalone  # noqa: E402 (rows, the set-up and one run by each launcher, as every check has them)

LIB, CLI = standalone.build()
LAUNCHERS = ("preload", "run", "allocator")
TIMEOUT_S = 180

PRELUDE = r'''
import sys
import torch
from torch import nn
CPU = "--cpu" in sys.argv
dev = "cpu" if CPU else "cuda"
if CPU:
    from _oomsim import fail
    try:
        import _oomshim_hook.kinds as _hook_kinds   # only under the shim: count the CPU's tensors
        _hook_kinds._DEVICE_TYPE = "cpu"
    except ImportError:
        pass
    free = 256 << 20
else:
    free, _total = torch.cuda.mem_get_info()


def own_parameters(models):
    storages = {}
    for m in models:
        for p in m.parameters():
            s = p.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())
'''

FORTY = PRELUDE + r'''
class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 1024, bias=False, device=dev)

    def forward(self, x):
        n = int(0.6 * free)
        if CPU:
            fail(n)
        return torch.empty(n // 4, device=dev)


each = 0.6 * free / 40 / 4096  # widths of a 1024-wide float32 layer
models = [Net(max(1, int(each * (0.8 + 0.4 * i / 39)))) for i in range(40)]
print("own parameters", own_parameters(models), flush=True)
try:
    models[3](torch.zeros(1, device=dev))
except torch.OutOfMemoryError:
    print("oom", flush=True)
'''

FOUR = PRELUDE + r'''
D = 64 if CPU else 8192
DTYPE = torch.float32 if CPU else torch.bfloat16
LAYER = D * D * (4 if CPU else 2)
LAYERS = 10 if CPU else max(2, round(0.22 * free / LAYER))
copies, building = [], []


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        if CPU and len(copies) == 4 and len(building) == 3:
            fail(LAYER)  # the weights of this layer do not fit
        self.weight = nn.Parameter(torch.empty(D, D, dtype=DTYPE, device=dev))


def load():
    building.clear()
    for _ in range(LAYERS):
        building.append(Layer())
    model = nn.Sequential(*building)
    building.clear()
    return model


try:
    for _ in range(8):
        copies.append(load())
except torch.OutOfMemoryError:
    print("copies", len(copies), "layers built of the next", len(building), flush=True)
    print("own parameters", own_parameters(copies + building), flush=True)
    print("copy bytes", LAYERS * LAYER, flush=True)
'''

BLOCKS = PRELUDE + r'''
E = max(1, int(free / 40 / 2 / 4))  # two float32 parameters a block: 1/40 of the free memory
blocks = []


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        if CPU and len(blocks) == 39:
            fail(E * 4)
        self.attn = nn.Parameter(torch.empty(E, device=dev))
        self.mlp = nn.Parameter(torch.empty(E, device=dev))


try:
    for _ in range(48):
        blocks.append(Block())
    model = nn.Sequential(*blocks)
    print("built", flush=True)
except torch.OutOfMemoryError:
    print("blocks built", len(blocks), flush=True)
    print("own parameters", own_parameters(blocks), flush=True)
'''


def launch(program, launcher, work, cpu):
    """One run: (stdout, stderr, exit status, [(dump path, dump)])."""
    dumps = os.path.join(work, f"dumps-{os.path.basename(program)}-{launcher}")
    out, err, rc, found, _ = standalone.launch(program, launcher, dumps, work, cpu, TIMEOUT_S,
                                               env={"PYTHONHASHSEED": "0"})
    return out, err, rc, found


def printed(out, label):
    for line in out.splitlines():
        if line.startswith(label):
            try:
                return int(line[len(label):].split()[0])
            except (ValueError, IndexError):
                return None
    return None


def report(path):
    try:
        p = subprocess.run([CLI, "report", path], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return ""
    return " ".join(p.stdout.split())


def judge(name, run, cpu):
    """What the run's dump must say, as [(what, ok, detail)]; `ok` None for what is only shown (on
    the CPU no device memory is tracked, so the verdict is about untracked memory, not about the
    weights: the headline and the stderr line are shown, the dump and the report checked)."""
    out, err, rc, found = run
    if rc != 0 or not found:
        return [("ran to its dump", False, f"exit {rc}, {len(found)} dumps; stderr: {err.strip()[-400:]!r}")]
    path, dump = found[0]
    k = (dump.get("framework") or {}).get("kinds") or {}
    top = ((dump.get("verdict") or {}).get("findings") or [{}])[0]
    headline = top.get("headline", "")
    own = printed(out, "own parameters")
    counted = k.get("parameters_bytes")
    if name == "forty-eight blocks":
        # The program counts the blocks it finished; the walk also finds the layers of the block
        # being built when the device ran out (device memory too): within the 5%, never less.
        ok = own is not None and counted is not None and own <= counted <= own * 1.05
        what = "parameters as the program counts them, within 5% (the block being built counted too)"
    else:
        ok = own is not None and counted == own
        what = "parameters as the program counts them"
    rows = [(what, ok, f"dump {counted} B, program {own} B; short {k.get('short_kinds')}, {k.get('elapsed_ms')} ms")]
    held = " ".join(str(d) for d in k.get("duplicates") or [])
    if name == "forty models":
        listed, more = len(k.get("models") or []), k.get("more_models")
        rows.append(("16 listed, 24 more said", listed == 16 and more == 24
                     and "24 more models" in report(path), f"{listed} listed, {more} more"))
        rows.append(("the headline names the parameters", None if cpu else headline.startswith("parameters"),
                     headline[:240]))
        return rows
    if name == "four copies":
        copies, each = printed(out, "copies"), printed(out, "copy bytes")
        words = "the Sequential model is held 4 times (4 × "
        dups = k.get("duplicates") or []
        first = dups[0] if dups else {}
        rows.append(("the copies are the model held 4 times, in the dump and the report",
                     copies == 4 and first.get("class") == "Sequential" and first.get("copies") == 4
                     and first.get("bytes_each") == each and words in report(path),
                     f"{copies} copies kept of {each} B each; duplicates {held or 'none'}"))
        rows.append(("the headline and the stderr line name the model held 4 times",
                     None if cpu else words in headline and words in " ".join(err.split()), headline[:240]))
    else:
        rows.append(("no copy named", not k.get("duplicates") and "is held" not in err and "is held" not in headline
                     and "is held" not in report(path),
                     f"{printed(out, 'blocks built')} blocks built; duplicates {held or 'none'}; "
                     f"headline {headline[:200]!r}"))
    rows.append(("outside any step", k.get("phase") == "outside", f"phase {k.get('phase')}"))
    return rows


def count_all(rows, out, cpu, work):
    """Each program under every launcher, judged; their outputs kept in `out`."""
    for name, text in (("forty models", FORTY), ("four copies", FOUR), ("forty-eight blocks", BLOCKS)):
        program = os.path.join(work, name.replace(" ", "_").replace("-", "_") + ".py")
        with open(program, "w") as f:
            f.write(text)
        for launcher in LAUNCHERS:
            if cpu and launcher == "allocator":
                rows.info(f"{name}: {launcher}", "left out on the CPU (allocator mode needs CUDA)")
                continue
            t = time.monotonic()
            run = launch(program, launcher, work, cpu)
            with open(os.path.join(out, f"{os.path.basename(program)}-{launcher}.txt"), "w") as f:
                f.write(run[0] + "\n--- stderr ---\n" + run[1])
            for what, ok, detail in judge(name, run, cpu):
                if ok is None:
                    rows.info(f"{name}: {launcher}: {what}", detail)
                else:
                    rows.row(f"{name}: {launcher}: {what}", ok, detail)
            rows.info(f"{name}: {launcher}: time", f"{time.monotonic() - t:.0f} s")


if __name__ == "__main__":
    sys.exit(standalone.run_with_cpu_mode("kinds counts", "oomshim-kinds-counts", count_all))
