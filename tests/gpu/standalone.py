"""What a GPU check script does when run alone (`python3 tests/gpu/check_X.py OUT_DIR
[--dry-run]`): runs its `main(root, lib, cli, out_dir)` (or, with --dry-run, its
`dry_run(root, out_dir)`, which needs no GPU; None where a check has none), prints each row as
`[PASS]`, `[FAIL]` or `[INFO]` (ok None) as it comes and appends it to OUT_DIR/rows.txt.
OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI name the build, default target/release/... Returns the exit
status: 1 when a row failed.

Also the pieces those scripts and run_all.py share: running a command under a time limit, the
shim's dumps in a folder, rows printed as they come, the set-up of a script with a `--cpu` mode,
and one run of a program bare or under each launcher."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build():
    """The library and CLI under test: (lib, cli)."""
    lib = os.environ.get("OOMSHIM_GPU_LIB") or os.path.join(ROOT, "target/release/liboomshim.so")
    cli = os.environ.get("OOMSHIM_GPU_CLI") or os.path.join(ROOT, "target/release/oomshim")
    return lib, cli


def run(main, dry_run, default_out):
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    out = args[0] if args else default_out
    os.makedirs(out, exist_ok=True)
    if "--dry-run" in sys.argv:
        results = dry_run(ROOT, out) if dry_run else [("dry run", False, "this check has none")]
    else:
        lib, cli = build()
        results = main(ROOT, lib, cli, out)
    failed = False
    for check, ok, detail in results:
        failed |= ok is not None and not ok
        line = f"[{'INFO' if ok is None else 'PASS' if ok else 'FAIL'}] {check}: {detail}"
        print(line, flush=True)
        with open(os.path.join(out, "rows.txt"), "a") as f:
            f.write(line + "\n")
    return 1 if failed else 0


def run_command(cmd, env=None, timeout=300):
    """`cmd` with the environment plus `env`, its output captured; a command out of time comes
    back as exit status 124 with what it printed so far (a slow step is a failed row, not a lost
    table)."""
    e = dict(os.environ)
    e.update(env or {})
    try:
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as t:
        out = t.stdout.decode(errors="replace") if isinstance(t.stdout, bytes) else (t.stdout or "")
        err = t.stderr.decode(errors="replace") if isinstance(t.stderr, bytes) else (t.stderr or "")
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\ntimed out after {timeout} s")


def dumps_in(d, recursive=False):
    """The shim's dumps in `d` (not the Python hook's oomshim-torch-* files beside them), sorted;
    with `recursive`, in its subfolders too (`oomshim run` keeps a job's ranks apart)."""
    pattern = os.path.join(d, "**", "oomshim-*.json") if recursive else os.path.join(d, "oomshim-*.json")
    return sorted(p for p in glob.glob(pattern, recursive=recursive)
                  if not os.path.basename(p).startswith("oomshim-torch-"))


def load_dumps(paths):
    """[(path, dump)] of the dump files `paths`; one that cannot be read is left out (a check
    that needs it fails on its absence)."""
    found = []
    for path in paths:
        try:
            with open(path) as f:
                found.append((path, json.load(f)))
        except (OSError, ValueError):
            continue
    return found


class Rows:
    """Rows printed as they come and appended to OUT_DIR/rows.txt; `failed` counts the FAILs."""

    def __init__(self, out):
        self.out = out
        self.failed = 0

    def keep(self, line):
        print(line, flush=True)
        with open(os.path.join(self.out, "rows.txt"), "a") as f:
            f.write(line + "\n")

    def row(self, name, ok, detail):
        self.failed += not ok
        self.keep(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")

    def info(self, name, detail):
        self.keep(f"[INFO] {name}: {detail}")


def run_with_cpu_mode(title, prefix, body):
    """A check run as `check_X.py [OUT_DIR] [--cpu]`: makes OUT_DIR (a fresh temporary one when
    not given) and a scratch folder, fails with one row when not `--cpu` and torch sees no GPU,
    else calls `body(rows, out, cpu, work)`, prints the time it took and removes the scratch
    folder. Returns the exit status: 1 when a row failed."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cpu = "--cpu" in sys.argv
    out = args[0] if args else tempfile.mkdtemp(prefix=f"{prefix}-")
    os.makedirs(out, exist_ok=True)
    rows = Rows(out)
    if not cpu:
        import torch

        if not torch.cuda.is_available():
            rows.row(f"{title}: a GPU", False, "torch sees no CUDA device (--cpu for a dry run)")
            return 1
    work = tempfile.mkdtemp(prefix=f"{prefix}-work-")
    started = time.monotonic()
    try:
        body(rows, out, cpu, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows.info(f"{title}: time", f"{time.monotonic() - started:.0f} s")
    return 1 if rows.failed else 0


LAUNCHERS = ("bare", "preload", "run", "allocator")


def launch(program, launcher, dumps, work, cpu, timeout, env=None):
    """One run of the Python `program` (with `--cpu` on the CPU, torch's failure then simulated by
    tests/real_torch/support/_oomsim.py) by `launcher`, one of LAUNCHERS, writing its dumps into
    `dumps`, in `work`, with the environment less any OOMSHIM_* setting and LD_PRELOAD, plus `env`:
    (stdout, stderr, exit status or "timeout", [(path, dump)], seconds)."""
    lib, cli = build()
    os.makedirs(dumps, exist_ok=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    e.update(OOMSHIM_DIR=dumps)
    e.update(env or {})
    if cpu:
        e["PYTHONPATH"] = os.path.join(ROOT, "tests/real_torch/support")
    cmd = [sys.executable, program] + (["--cpu"] if cpu else [])
    if launcher == "preload":
        e["LD_PRELOAD"] = lib
    elif launcher in ("run", "allocator"):
        cmd = [cli, "run", "--dir", dumps] + (["--torch-allocator"] if launcher == "allocator" else []) + ["--"] + cmd
    elif launcher != "bare":
        raise ValueError(f"unknown launcher {launcher!r}")
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=e, cwd=work, capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", f"timed out after {timeout} s", "timeout"
    return out, err, rc, load_dumps(dumps_in(dumps, recursive=True)), time.monotonic() - start
