"""GPU check: one story per failure (the stderr line, the dump and the report agree), with real PyTorch on the device.

torch's caching allocator, at a block it cannot find, calls cudaMalloc; when that fails it frees
its cached segments and asks again; when that fails too it calls its OOM observers and raises
OutOfMemoryError. One program (written to OUT_DIR/one_story.py), sized from
torch.cuda.mem_get_info() (S, about an eighth of the free memory; everything else is a multiple
of it), four cases, each under plain LD_PRELOAD and `oomshim run`:

- recover: 2 S in torch's cache, S/2 free; a 1.5 S tensor fits once the cache is freed. One quiet
  "recovered" line, one dump with recovered true, no "CUDA out of memory" line.
- raise: S cached, S/4 free; a 1.5 S tensor fails, and again after the cache is freed: torch
  raises. One summary ("2 failures with its retries; torch raised OutOfMemoryError"), one dump.
- twice: as recover, then a second 1.5 S tensor (an op's output, then the next op's): the first
  recovers, the second finds nothing left to free and torch raises. ONE story: no "recovered"
  line, one summary saying "1 earlier request recovered just before", one dump with
  failed_request.recovered_before 1 (before this work: a recovered line, then a summary, two
  dumps).
- smaller: nothing cached, S/2 free; 2 S raises, the program catches it and tries S, which raises
  too (a new request, a second story), then S/4, which fits. Two summaries, two dumps.

and `raise` and `twice` under `oomshim run --torch-allocator` too (oomshim's allocator retries
inside itself: one summary, one dump, no "recovered" line). In every case stdout is what the
program prints bare, each summary line ends with its dump's top finding, and `oomshim report
--json` judges each dump as the dump does.

Rows: one PASS/FAIL per case and launcher, and an [INFO] row with its summary line. Bounded: each
run has a 180 s timeout; about 2-3 minutes in all on an H100.

    main(root, lib, cli, out_dir) -> [(check, ok, detail)]  (ok None: an [INFO] row)

Run alone: python3 tests/gpu/check_one_story.py OUT_DIR (tests/gpu/standalone.py:
OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI name the build, default target/release/...). `--dry-run` writes
the program to OUT_DIR, checks it compiles and that the checks of each case accept the outputs
they expect and refuse the two stories this work removed, without a GPU."""

import glob
import json
import os
import subprocess
import sys

PROGRAM = r'''
import sys
import torch

MiB = 1 << 20
torch.cuda.init()
free, _ = torch.cuda.mem_get_info()
# S: about an eighth of what is free, a multiple of 4 MiB (so 1.5 S is one of torch's 2 MiB
# rounding steps); every size below is a multiple of it.
S = max(64 * MiB, (free // 8) // (4 * MiB) * (4 * MiB))


def fill(cached, left):
    """Holds all of the free memory but `left` bytes and `cached` blocks of S, which are then
    freed: torch keeps them in its cache."""
    free_now, _ = torch.cuda.mem_get_info()
    kept = torch.empty(free_now - left - cached * S, dtype=torch.uint8, device="cuda")
    blocks = [torch.empty(S, dtype=torch.uint8, device="cuda") for _ in range(cached)]
    del blocks
    return kept


def attempt(n):
    """An op's output of n bytes: (the tensor, what happened)."""
    try:
        return torch.empty(n, dtype=torch.uint8, device="cuda"), "fits"  # REQUEST_LINE
    except torch.OutOfMemoryError:
        return None, "OutOfMemoryError"


case = sys.argv[1]
said = []
if case == "recover":
    kept = fill(2, S // 2)
    a, w = attempt(3 * S // 2)
    said.append(w)
elif case == "raise":
    kept = fill(1, S // 4)
    a, w = attempt(3 * S // 2)
    said.append(w)
elif case == "twice":
    kept = fill(2, S // 2)
    a, w = attempt(3 * S // 2)
    said.append(w)
    b, w = attempt(3 * S // 2)
    said.append(w)
elif case == "smaller":
    kept = fill(0, S // 2)
    for n in (2 * S, S, S // 4):
        t, w = attempt(n)
        said.append(w)
        del t
print(" ".join(said), flush=True)
'''

# What each case prints, how many summaries ("CUDA out of memory") and "recovered" lines its
# stderr has, and what its dumps say: (resolution, recovered_before) in order, None where the
# launcher's dumps differ in form (allocator mode).
EXPECT = {
    "recover": ("fits", 0, 1, [("retry_succeeded", 0)]),
    "raise": ("OutOfMemoryError", 1, 0, [("framework_raised", 0)]),
    "twice": ("fits OutOfMemoryError", 1, 0, [("framework_raised", 1)]),
    "smaller": ("OutOfMemoryError OutOfMemoryError fits", 2, 0, [("framework_raised", 0), ("framework_raised", 0)]),
}
# What the summary line itself must say, per case.
SAYS = {
    "raise": ["2 failures with its retries; torch raised OutOfMemoryError"],
    "twice": ["2 failures with its retries; torch raised OutOfMemoryError; 1 earlier request recovered just before"],
}
LAUNCHERS = ("preload", "run")
ALLOCATOR_CASES = ("raise", "twice")


def _dumps(d):
    return sorted((p for p in glob.glob(os.path.join(d, "oomshim-*.json"))
                   if not os.path.basename(p).startswith("oomshim-torch-")),
                  key=lambda p: int(os.path.splitext(p)[0].rsplit("-", 1)[1]))


def _summaries(err):
    return [l for l in err.splitlines() if l.startswith("oomshim: CUDA out of memory")]


def _recovered_lines(err):
    return [l for l in err.splitlines() if "then its retry succeeded (recovered)" in l]


def judge(case, launcher, stdout, err, dumps, report_kinds):
    """(ok, detail) of one run: `dumps` the parsed dumps in order, `report_kinds` the verdict kind
    `oomshim report --json` gives each."""
    printed, n_summaries, n_recovered, outcomes = EXPECT[case]
    wrong = []
    if stdout.strip() != printed:
        wrong.append(f"printed {stdout.strip()!r}, bare prints {printed!r}")
    summaries, recovered = _summaries(err), _recovered_lines(err)
    if len(summaries) != n_summaries:
        wrong.append(f"{len(summaries)} summaries, want {n_summaries}")
    if len(recovered) != n_recovered:
        wrong.append(f"{len(recovered)} 'recovered' lines, want {n_recovered}")
    got = [((d.get("failed_request") or {}).get("resolution"),
            (d.get("failed_request") or {}).get("recovered_before", 0)) for d in dumps]
    if launcher == "allocator":
        if len(dumps) != len(outcomes):
            wrong.append(f"{len(dumps)} dumps, want {len(outcomes)}")
    elif got != outcomes:
        wrong.append(f"dumps {got}, want {outcomes}")
    for want in SAYS.get(case, []) if launcher != "allocator" else []:
        if not any(want in l for l in summaries):
            wrong.append(f"no summary says {want!r}")
    stood = [d for d in dumps if (d.get("failed_request") or {}).get("recovered") is not True]
    for line, d in zip(summaries, stood):
        top = (d.get("verdict", {}).get("findings") or [{}])[0]
        if not line.endswith(f"{top.get('kind')}: {top.get('headline')}"):
            wrong.append(f"summary {line[:160]!r} is not its dump's top finding {top.get('kind')}")
    for d, kind in zip(dumps, report_kinds):
        if kind != d.get("verdict", {}).get("kind"):
            wrong.append(f"oomshim report judges {kind}, the dump {d.get('verdict', {}).get('kind')}")
    detail = "; ".join(wrong) if wrong else (
        f"printed {printed!r}; {len(summaries)} summaries, {len(recovered)} recovered lines; dumps {got}")
    return not wrong, detail


def _run(root, lib, cli, out_dir, case, launcher):
    work = os.path.join(out_dir, f"one-story-{case}-{launcher}")
    dumps_dir = os.path.join(work, "dumps")
    os.makedirs(dumps_dir, exist_ok=True)
    script = os.path.join(out_dir, "one_story.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    if launcher == "preload":
        cmd = [sys.executable, script, case]
        env.update(LD_PRELOAD=lib, OOMSHIM_DIR=dumps_dir)
    else:
        cmd = [cli, "run", "--lib", lib, "--dir", dumps_dir]
        if launcher == "allocator":
            cmd.append("--torch-allocator")
        cmd += ["--", sys.executable, script, case]
    try:
        p = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=180)
        out, err = p.stdout, p.stderr
    except subprocess.TimeoutExpired as t:
        out = t.stdout.decode(errors="replace") if isinstance(t.stdout, bytes) else (t.stdout or "")
        err = (t.stderr.decode(errors="replace") if isinstance(t.stderr, bytes) else (t.stderr or "")) + "\ntimed out"
    with open(os.path.join(work, "stderr.txt"), "w") as f:
        f.write(err)
    files = _dumps(dumps_dir)
    dumps, kinds = [], []
    for path in files:
        with open(path) as f:
            dumps.append(json.load(f))
        r = subprocess.run([cli, "report", "--json", path], capture_output=True, text=True, timeout=120)
        try:
            kinds.append(json.loads(r.stdout)["verdict"]["kind"])
        except (ValueError, KeyError):
            kinds.append(f"no report ({r.stderr.strip()[:120]})")
    return out, err, dumps, kinds


def main(root, lib, cli, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "one_story.py"), "w") as f:
        f.write(PROGRAM)
    rows = []
    runs = [(c, l) for c in EXPECT for l in LAUNCHERS] + [(c, "allocator") for c in ALLOCATOR_CASES]
    for case, launcher in runs:
        name = f"one story: {case} under {launcher}"
        try:
            out, err, dumps, kinds = _run(root, lib, cli, out_dir, case, launcher)
            ok, detail = judge(case, launcher, out, err, dumps, kinds)
            if not ok:
                detail += f"; stderr {err[-600:]!r}"
            rows.append((name, ok, detail))
            for line in _summaries(err) + _recovered_lines(err):
                rows.append((f"{name}: stderr", None, line[:400]))
        except Exception as e:  # a broken case is a failed row, not a lost table
            rows.append((name, False, f"{type(e).__name__}: {e}"))
    return rows


def _dry_run(root, out):
    """Without a GPU: the program compiles, and each case's judge accepts what the case should
    print and refuses the two stories of one failure."""
    compile(PROGRAM, "one_story.py", "exec")
    with open(os.path.join(out, "one_story.py"), "w") as f:
        f.write(PROGRAM)
    rows = []
    top = {"kind": "own_allocations", "headline": "this process's own allocations fill device 0"}

    def dump(resolution, before=0):
        d = {"failed_request": {"resolution": resolution, "recovered": resolution == "retry_succeeded"},
             "verdict": {"kind": "own_allocations", "findings": [top]}}
        if before:
            d["failed_request"]["recovered_before"] = before
        return d

    summary = ("oomshim: CUDA out of memory on device 0 (cudaMalloc of 1.50 GiB failed; 2 failures with its "
               "retries; torch raised OutOfMemoryError{}): own_allocations: this process's own allocations "
               "fill device 0")
    one = summary.format("; 1 earlier request recovered just before")
    ok, detail = judge("twice", "preload", "fits OutOfMemoryError\n", one + "\n",
                       [dump("framework_raised", 1)], ["own_allocations"])
    rows.append(("dry run: one story for the twice case is accepted", ok, detail))
    two = ("oomshim: cudaMalloc of 1.50 GiB on device 0 failed, then its retry succeeded (recovered); dump: x\n"
           + summary.format("") + "\n")
    ok, detail = judge("twice", "preload", "fits OutOfMemoryError\n", two,
                       [dump("retry_succeeded"), dump("framework_raised")], ["own_allocations"] * 2)
    rows.append(("dry run: two stories for the twice case are refused", not ok, detail))
    ok, detail = judge("raise", "preload", "OutOfMemoryError\n", summary.format("") + "\n",
                       [dump("framework_raised")], ["own_allocations"])
    rows.append(("dry run: the raise case is accepted", ok, detail))
    return rows


if __name__ == "__main__":
    import standalone

    sys.exit(standalone.run(main, _dry_run, "/tmp/oomshim-one-story"))
