"""GPU check: allocator mode is decided by what the program runs, under
`oomshim run --torch-allocator` with real PyTorch on the device. Two program folders, written to
OUT_DIR/allocator-choice/:

- alone: prog.py imports only torch and trains a small model a few steps on the device; other.py
  beside it, never imported, compiles with CUDA graphs. Allocator mode must stay on
  (`torch.cuda.get_allocator_backend()` is "pluggable", no "allocator mode is off" line).
- imports: prog.py imports helpers.model, which imports helpers/compiled.py, whose line marked
  COMPILE_LINE compiles a function with `backend="cudagraphs"`; prog.py runs it on the device.
  Torch must keep its own allocator ("native"), the line saying so must name
  helpers/compiled.py and that line, and the compiled function must give the eager result (CUDA
  graphs run under torch's allocator). With OOMSHIM_TORCH_ALLOCATOR=force, allocator mode is on
  ("pluggable"), the function gives the same result without CUDA graphs, and the line saying so
  names the same file and line.

Rows: one PASS/FAIL per case. Bounded: each run has a 240 s timeout; about a minute in all on an
H100 (most of it importing torch and compiling).

    main(root, lib, cli, out_dir) -> [(check, ok, detail)]

Run alone: python3 tests/gpu/check_allocator_choice.py OUT_DIR (tests/gpu/standalone.py:
OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI name the build, default target/release/...). `--dry-run` writes
the folders to OUT_DIR and checks that their files compile and that the reading
(shim/python/oomshim/torch.py) names the marked line, without a GPU."""

import os
import subprocess
import sys

TRAIN = '''import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(torch.cuda.get_allocator_backend(), bool(torch.isfinite(loss).item()))
'''

FOLDERS = {
    "alone": {
        "prog.py": TRAIN,
        "other.py": 'import torch\n\nstep = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")\n',
    },
    "imports": {
        "prog.py": '''import torch
from helpers import model

x = torch.randn(256, 256, device="cuda")
for _ in range(4):
    y = model.step(x)
torch.cuda.synchronize()
print(torch.cuda.get_allocator_backend(), bool(torch.allclose(y, x * 2 + 1)))
''',
        "helpers/__init__.py": "",
        "helpers/model.py": "from . import compiled\n\nstep = compiled.step\n",
        "helpers/compiled.py": ('import torch\n\n'
                                'step = torch.compile(lambda x: x * 2 + 1, backend="cudagraphs")  # COMPILE_LINE\n'),
    },
}


def _compile_line():
    text = FOLDERS["imports"]["helpers/compiled.py"]
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "COMPILE_LINE" in l)
    return f"helpers/compiled.py:{line}"


def _write(out_dir):
    base = os.path.join(out_dir, "allocator-choice")
    for folder, files in FOLDERS.items():
        for name, text in files.items():
            path = os.path.join(base, folder, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    return base


def _run(lib, cli, folder, force=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    env.pop("PYTHONPATH", None)
    if force:
        env["OOMSHIM_TORCH_ALLOCATOR"] = "force"
    cmd = [cli, "run", "--torch-allocator", "--lib", lib, "--dir", os.path.join(folder, "dumps"), "--",
           sys.executable, "prog.py"]
    try:
        p = subprocess.run(cmd, env=env, cwd=folder, capture_output=True, text=True, timeout=240)
        return p.returncode, p.stdout.strip(), p.stderr
    except subprocess.TimeoutExpired as t:
        err = t.stderr.decode(errors="replace") if isinstance(t.stderr, bytes) else (t.stderr or "")
        return 124, "", err + "\ntimed out after 240 s"


def _lines(err, start):
    return [l for l in err.splitlines() if l.startswith(start)]


def main(root, lib, cli, out_dir):
    base = _write(out_dir)
    rows = []
    want = _compile_line()
    try:
        rc, out, err = _run(lib, cli, os.path.join(base, "alone"))
        off = _lines(err, "oomshim: allocator mode is off")
        rows.append(("allocator choice: a sibling the program never imports keeps allocator mode on",
                     rc == 0 and out == "pluggable True" and not off,
                     f"exit {rc}; printed {out!r}; {off[0][:300] if off else 'no line saying it is off'}"))
    except Exception as e:  # a broken case is a failed row, not a lost table
        rows.append(("allocator choice: alone", False, f"{type(e).__name__}: {e}"))
    try:
        rc, out, err = _run(lib, cli, os.path.join(base, "imports"))
        off = _lines(err, "oomshim: allocator mode is off")
        named = bool(off) and f": {want} uses torch.compile with CUDA graphs" in off[0]
        rows.append(("allocator choice: an imported module compiling with CUDA graphs keeps torch's allocator, "
                     "its line named", rc == 0 and out == "native True" and named,
                     f"exit {rc}; printed {out!r}; want {want}; {off[0][:300] if off else 'no line: ' + err[-300:]}"))
    except Exception as e:
        rows.append(("allocator choice: imports", False, f"{type(e).__name__}: {e}"))
    try:
        rc, out, err = _run(lib, cli, os.path.join(base, "imports"), force=True)
        said = _lines(err, "oomshim: torch.compile runs without CUDA graphs in allocator mode")
        named = bool(said) and f'(backend="cudagraphs" at {want} asked for them' in said[0]
        rows.append(("allocator choice: forced, the same program runs without CUDA graphs, the line named",
                     rc == 0 and out == "pluggable True" and named,
                     f"exit {rc}; printed {out!r}; {said[0][:300] if said else 'no line: ' + err[-300:]}"))
    except Exception as e:
        rows.append(("allocator choice: forced", False, f"{type(e).__name__}: {e}"))
    return rows


def _dry_run(root, out):
    """Without a GPU: the folders' files compile, and the reading names the marked line for
    `imports` and nothing for `alone`."""
    base = _write(out)
    for files in FOLDERS.values():
        for name, text in files.items():
            compile(text, name, "exec")
    sys.path.insert(0, os.path.join(root, "shim/python"))
    from oomshim.torch import unservable_uses

    rows = []
    here = os.getcwd()
    for folder, expect in (("alone", []), ("imports", [(_compile_line(), "torch.compile with CUDA graphs")])):
        os.chdir(os.path.join(base, folder))
        try:
            got = unservable_uses([os.path.join(base, folder, "prog.py")])
        finally:
            os.chdir(here)
        rows.append((f"dry run: the reading of {folder}", got == expect, f"{got} (want {expect})"))
    return rows


if __name__ == "__main__":
    import standalone

    sys.exit(standalone.run(main, _dry_run, "/tmp/oomshim-allocator-choice"))
