"""What `oomshim run --torch-allocator` costs a program before allocator mode is turned on: the
reading of the program for features torch cannot run on a pluggable allocator
(`oomshim.torch.unservable_uses`, run once, when the program imports torch). Times it in this
process, median of RUNS, on two programs written into a temporary directory:

- small: a script that imports a package of its own of three modules;
- at the bound: a script whose own package chains imports through as many modules as the reading
  takes (200 files, 8 MiB: 40 KiB each), the last of which compiles with CUDA graphs, with a
  docstring that mentions them in every module (so each is tokenized as far as that mention).

    python3 benches/allocator_reading.py [--runs 7]

Prints `[FIGURE] name: value vs goal X; detail` lines (goal: the hook's budget at the import of
torch, 50 ms, for the small program; none at the bound); exits 0 (figures, not pass/fail).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def small(d):
    write(os.path.join(d, "prog.py"), "import torch\nfrom helpers import model\n")
    write(os.path.join(d, "helpers/__init__.py"), "")
    write(os.path.join(d, "helpers/model.py"), "import torch\nfrom . import layers, data\n")
    write(os.path.join(d, "helpers/layers.py"), "import torch\nx = torch.nn.Linear(4, 4)\n")
    write(os.path.join(d, "helpers/data.py"), "import torch\n")
    return os.path.join(d, "prog.py")


def at_the_bound(d, files=200, size=40 << 10):
    filler = "".join(f"def f{i}(x):\n    return x * {i} + 1  # arithmetic\n\n" for i in range(2000))
    write(os.path.join(d, "prog.py"), "import torch\nimport proj.m0\n")
    write(os.path.join(d, "proj/__init__.py"), "")
    for i in range(files - 2):
        head = f'"""Module {i}: not with mode="reduce-overhead", it was slower."""\nimport torch\n'
        nxt = f"from . import m{i + 1}\n" if i + 1 < files - 2 else \
            'step = torch.compile(lambda x: x, mode="reduce-overhead")\n'
        body = head + nxt
        write(os.path.join(d, f"proj/m{i}.py"), body + filler[: max(0, size - len(body))])
    return os.path.join(d, "prog.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "shim/python"))
    from oomshim.torch import unservable_uses

    for name, make, goal in (("small program (4 files)", small, "50 ms"),
                             ("at the bound (200 files, 8 MiB)", at_the_bound, "none")):
        with tempfile.TemporaryDirectory() as d:
            script = make(d)
            here = os.getcwd()
            os.chdir(d)
            saved = list(sys.path)
            sys.path.insert(0, d)
            try:
                times, found = [], None
                for _ in range(args.runs):
                    t = time.perf_counter()
                    found = unservable_uses([script])
                    times.append(time.perf_counter() - t)
            finally:
                sys.path[:] = saved
                os.chdir(here)
            print(f"[FIGURE] allocator mode's reading, {name}: {statistics.median(times) * 1000:.1f} ms "
                  f"vs goal {goal}; median of {args.runs}, found {found}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
