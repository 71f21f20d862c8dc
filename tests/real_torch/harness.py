"""The differential harness: real PyTorch programs (tests/real_torch/programs) run bare, under
plain LD_PRELOAD and under `oomshim run`, and what each program computes and can observe of
itself compared between the three.

    python3 tests/real_torch/harness.py --lib target/release/liboomshim.so --cli target/release/oomshim
        [--python PY]... [--only NAME]... [--jobs N]

Each program prints what it computed and what it sees of itself (weak references to what it
dropped, dynamo's compile counts, sys.path and sys.modules, its descriptors, its hooks...); a
run is the same as bare when its stdout, its stderr less the shim's own `oomshim:` lines and its
exit status are. A program's first lines may say:

    # expect-dump: kinds    under the shim, at least one dump whose torch account has the memory
                            by kind (the hook's work at a failure was done, not skipped)
    # exit: N               its exit status bare (0 otherwise)
    # pythonpath: DIR       a directory of tests/real_torch/support on its PYTHONPATH too
    # version-sensitive     also run with every other --python (the rest run on the first)
    # needs: MODULE         left out (and said so) where that Python cannot import MODULE;
                            with --require-all that is a failure instead

The table printed last has one row per program and Python, one column per launcher: `same`, or
`differs:` and what. The exit status is 0 when every run is the same (and every expected dump is
there), 1 otherwise, 2 when the harness itself cannot run (torch missing, say), 3 when every run
was the same but programs were left out for a module they need.

Runs are independent processes, `--jobs` at a time (default: the CPUs), each in a fresh working
directory with its own OOMSHIM_DIR.
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
SUPPORT = os.path.join(HERE, "support")
LAUNCHERS = ("bare", "preload", "run")
TIMEOUT_S = 300

# Lines the comparison leaves out or evens out: the shim's own, and what differs between any two
# runs of the same program (times and pids in torch's log lines, the run's directory).
_SHIM_LINE = re.compile(r"^oomshim[: ]")
_TORCH_LOG = re.compile(r"^([WIEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


def header(path):
    """The program's `# key: value` lines before its docstring."""
    out = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            key, _, value = line[1:].partition(":")
            out[key.strip()] = value.strip()
    return out


def normalise(text, cwd):
    lines = []
    for line in text.splitlines():
        line = _TORCH_LOG.sub(r"\1<time pid> ", line.replace(cwd, "<cwd>"))
        lines.append(line)
    return lines


def run_one(python, program, launcher, args):
    """One run: (stdout lines, stderr lines less the shim's, exit status, dumps, seconds)."""
    meta = header(program)
    work = tempfile.mkdtemp(prefix="oomshim-real-torch-")
    dumps = os.path.join(work, "dumps")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    path = [SUPPORT, os.path.join(SUPPORT, "site-packages")]
    if meta.get("pythonpath"):
        path.append(os.path.join(SUPPORT, meta["pythonpath"]))
    env.update(PYTHONPATH=os.pathsep.join(path), OOMSHIM_DIR=dumps, PYTHONHASHSEED="0",
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    cmd = [python, program]
    if launcher == "preload":
        env["LD_PRELOAD"] = args.lib
    elif launcher == "run":
        cmd = [args.cli, "run", "--dir", dumps, "--"] + cmd
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, errors="replace", timeout=TIMEOUT_S)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"TIMEOUT after {TIMEOUT_S} s"
        rc = "timeout"
    seconds = time.monotonic() - start
    stdout = normalise(out, work)
    stderr = [line for line in normalise(err, work) if not _SHIM_LINE.match(line)]
    found = []
    for root, _, files in os.walk(dumps):
        for name in files:
            if name.endswith(".json") and not name.startswith("oomshim-torch-"):
                try:
                    with open(os.path.join(root, name)) as f:
                        found.append(json.load(f))
                except (OSError, ValueError):
                    found.append(None)
    shutil.rmtree(work, ignore_errors=True)
    return stdout, stderr, rc, found, seconds


def first_difference(name, a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"{name} line {i + 1}: {y[:140]!r} instead of {x[:140]!r}"
    if len(a) != len(b):
        extra = b[len(a)] if len(b) > len(a) else a[len(b)]
        what = "more" if len(b) > len(a) else "fewer"
        return f"{name}: {abs(len(a) - len(b))} {what} lines ({extra[:140]!r})"
    return None


def verdict(program, bare, shimmed):
    meta = header(program)
    out, err, rc, dumps, _ = shimmed
    b_out, b_err, b_rc, _, _ = bare
    problems = []
    want_rc = int(meta.get("exit", "0"))
    if b_rc != want_rc:
        problems.append(f"bare exit {b_rc}, the program means {want_rc}")
    if rc != b_rc:
        problems.append(f"exit {rc} instead of {b_rc}")
    for name, a, b in (("stdout", b_out, out), ("stderr", b_err, err)):
        d = first_difference(name, a, b)
        if d:
            problems.append(d)
    if meta.get("expect-dump") == "kinds":
        kinds = [d for d in dumps if d and ((d.get("framework") or {}).get("kinds") or {}).get("phase")]
        if not kinds:
            problems.append(f"no dump with the memory by kind ({len(dumps)} dumps)")
    return "same" if not problems else "differs: " + "; ".join(problems)


def python_version(python):
    p = subprocess.run([python, "-c", "import sys, torch; print('%d.%d' % sys.version_info[:2], torch.__version__)"],
                       capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--python", action="append", default=[])
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--require-all", action="store_true",
                    help="a program left out for a module it needs is a failure")
    args = ap.parse_args()
    args.lib, args.cli = os.path.abspath(args.lib), os.path.abspath(args.cli)
    pythons = args.python or [sys.executable]
    versions = {}
    for py in pythons:
        v = python_version(py)
        if v is None:
            if py == pythons[0]:
                print(f"harness: {py} cannot import torch", file=sys.stderr)
                return 2
            print(f"harness: {py} cannot import torch: left out", file=sys.stderr)
            continue
        versions[py] = v
    programs = sorted(os.path.join(PROGRAMS, n) for n in os.listdir(PROGRAMS) if n.endswith(".py"))
    if args.only:
        programs = [p for p in programs if os.path.basename(p)[:-3] in args.only]
    jobs = []
    left_out = []
    for program in programs:
        for i, py in enumerate(p for p in pythons if p in versions):
            if i and "version-sensitive" not in header(program):
                continue
            need = header(program).get("needs")
            if need and subprocess.run([py, "-c", f"import {need}"], capture_output=True).returncode:
                left_out.append((os.path.basename(program)[:-3], versions[py].split()[0], need))
                continue
            for launcher in LAUNCHERS:
                jobs.append((py, program, launcher))
    started = time.monotonic()
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_one, py, prog, launcher, args): (py, prog, launcher)
                   for py, prog, launcher in jobs}
        for f in concurrent.futures.as_completed(futures):
            results[futures[f]] = f.result()
    rows = []
    failed = 0
    for program in programs:
        for py in versions:
            if (py, program, "bare") not in results:
                continue
            bare = results[(py, program, "bare")]
            cells = []
            for launcher in LAUNCHERS[1:]:
                v = verdict(program, bare, results[(py, program, launcher)])
                failed += v != "same"
                cells.append(v)
            rows.append((os.path.basename(program)[:-3], versions[py].split()[0], bare[4], cells))
    print(f"\n{len(programs)} programs x {len(LAUNCHERS)} launchers ({len(jobs)} runs, "
          f"{time.monotonic() - started:.0f} s); Pythons: "
          + ", ".join(f"{v} ({p})" for p, v in versions.items()))
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'program'.ljust(width)}py    bare_s  LD_PRELOAD / oomshim run")
    for name, version, seconds, cells in rows:
        if cells[0] == cells[1]:
            shown = cells[0] + (" / same" if cells[0] == "same" else " (both)")
        else:
            shown = f"{cells[0]} / {cells[1]}"
        print(f"{name.ljust(width)}{version.ljust(6)}{seconds:6.1f}  {shown}")
    for name, version, need in left_out:
        print(f"{name.ljust(width)}{version.ljust(6)}{'':6}  left out: needs {need}, which this Python cannot import")
    print(f"{failed} of {2 * len(rows)} runs differ from bare" + (f"; {len(left_out)} left out" if left_out else ""))
    if failed or (left_out and args.require_all):
        return 1
    return 3 if left_out else 0


if __name__ == "__main__":
    sys.exit(main())
