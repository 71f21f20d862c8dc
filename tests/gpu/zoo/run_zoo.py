"""The OOM zoo, scored: every program in this directory run bare and under each launcher
(plain LD_PRELOAD, `oomshim run`, `oomshim run --torch-allocator` for PyTorch), each run bounded,
each row written to OUT/zoo.jsonl as it finishes, a scored table printed last.

Scored per run: output unchanged (stdout and exit code as bare), a dump for the failure, the
verdict right (the last failure that stood), the program's line named in its headline (the line
marked `# EXPECT-LINE` / `// EXPECT-LINE` in the source), and stderr's first line saying what the
dump and `oomshim report --json` say. A run is `ok` only when all of these hold; a program that
does not build is a failed row (`launcher: build`). OUT/zoo.jsonl holds this run's rows only.
Exit status 0 when every run is ok, 1 otherwise.

    python3 tests/gpu/zoo/run_zoo.py OUT [CASE ...]
    ZOO_LAUNCHERS=alloc python3 tests/gpu/zoo/run_zoo.py OUT [CASE ...]   # bare and these only
"""
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI: the build to test (the carried copies), else the repo's.
LIB = os.environ.get("OOMSHIM_GPU_LIB") or os.path.join(ROOT, "target/release/liboomshim.so")
CLI = os.environ.get("OOMSHIM_GPU_CLI") or os.path.join(ROOT, "target/release/oomshim")
PY = sys.executable

TORCH = ("bare", "preload", "run", "alloc")
NO_ALLOCATOR = ("bare", "preload", "run")


class Case:
    def __init__(self, name, program, final, launchers=TORCH, env=None, count=None, kinds=None,
                 holder=False, truth=False, build=None, note=""):
        self.name = name
        self.program = program
        self.final = set(final)  # verdicts right for the last failure that stood
        self.launchers = launchers
        self.env = env or {}
        self.count = count  # failures that stood, with a dump each (None: at least one)
        self.kinds = set(kinds) if kinds else None  # every stood dump's verdict within these
        self.holder = holder  # another process holds most of the GPU meanwhile
        self.truth = truth  # the right verdict is torch's own account (`truth:` on stderr, bare)
        self.build = build  # nvcc flags for a .cu program
        self.note = note


CASES = [
    Case("retain_graph", "retain_graph.py", {"leak"}),
    Case("retain_graph_marked", "retain_graph_marked.py", {"leak"}),
    Case("eval_no_inference_mode", "eval_no_inference_mode.py", {"leak"}),
    Case("loss_accumulated", "loss_accumulated.py", {"leak"}),
    Case("spread_leak", "spread_leak.py", {"leak"}, note="twelve lines share the growth"),
    Case("late_leak", "late_leak.py", {"leak"}),
    Case("expandable_leak", "expandable_leak.py", {"leak"}, launchers=NO_ALLOCATOR,
         env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    Case("async_leak", "async_leak.py", {"leak"}, launchers=NO_ALLOCATOR,
         env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    Case("model_twice", "model_twice.py", {"own_allocations"}, count=1),
    Case("too_large", "too_large.py", {"request_exceeds_device"}, count=1),
    Case("batch_finder", "batch_finder.py", {"own_allocations", "request_exceeds_device"},
         kinds={"own_allocations", "request_exceeds_device"}),
    Case("fragmentation_first", "fragmentation_first.py", {"fragmentation"}, count=1),
    Case("two_ooms", "two_ooms.py", {"fragmentation"}, count=2, kinds={"own_allocations", "fragmentation"}),
    Case("other_process", "other_process.py", {"other_processes"}, holder=True),
    Case("threads_oom", "threads_oom.py", {"own_allocations"}, count=1),
    Case("dataloader_dynamic", "dataloader_dynamic.py", {"own_allocations"}),
    Case("inference_dynamic", "inference_dynamic.py", {"own_allocations", "leak"}, truth=True),
    Case("jax_list", "jax_list.py", {"leak"}, launchers=NO_ALLOCATOR,
         env={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
    Case("jax_prealloc", "jax_prealloc.py", {"own_allocations"}, launchers=NO_ALLOCATOR),
    Case("cupy_pool", "cupy_pool.py", {"own_allocations"}, launchers=NO_ALLOCATOR),
    Case("nvcc_static_leak", "static_leak.cu", {"leak"}, launchers=NO_ALLOCATOR, build=["-cudart", "static"]),
    Case("plain_c", "plain_c.cu", {"own_allocations"}, launchers=NO_ALLOCATOR, build=["-cudart", "shared"]),
    # Memory by kind (issue 23): each program prints its own count of parameters, gradients and
    # optimizer state (`oomshim-kinds-truth:`), which check_kinds.py compares with the dump's kinds.
    Case("kinds_batch_transformer", "kinds_batch_transformer.py", {"own_allocations"}, count=1),
    Case("kinds_logits_loss", "kinds_logits_loss.py", {"own_allocations"}, count=1),
    Case("kinds_model_twice", "kinds_model_twice.py", {"own_allocations"}, count=1),
    Case("kinds_adam_large", "kinds_adam_large.py", {"own_allocations"}, count=1),
    Case("kinds_grads_never_zeroed", "kinds_grads_never_zeroed.py", {"own_allocations"}, count=1),
    Case("kinds_hook_keeps", "kinds_hook_keeps.py", {"leak"}),
    Case("kinds_hf_trainer", "kinds_hf_trainer.py", {"own_allocations"}),
    # The leak's headline names the list that keeps it (`held in list `history` (...)`).
    Case("kinds_list_keeps", "kinds_list_keeps.py", {"leak"}),
    # kinds_growth_killed.py (growth over time, no steps, SIGKILLed) waits for issue 23 item 3.
]


def launcher_filter():
    """The launchers named in ZOO_LAUNCHERS (comma-separated, of preload, run and alloc), or None
    when it is unset or empty. A name that is no launcher is a ValueError (a typo would score
    nothing)."""
    only = [l.strip() for l in os.environ.get("ZOO_LAUNCHERS", "").split(",") if l.strip()]
    unknown = [l for l in only if l not in TORCH[1:]]
    if unknown:
        raise ValueError(f"ZOO_LAUNCHERS: {', '.join(unknown)} is no launcher (one of {', '.join(TORCH[1:])})")
    return set(only) or None


def launchers_of(case):
    """The case's launchers this run uses: `bare` always (the reference for the output), and
    those of launcher_filter(), else all."""
    only = launcher_filter()
    return [l for l in case.launchers if l == "bare" or only is None or l in only]


def expected_runs(names=()):
    """(case, launcher) of every scored run for these case names (all cases when none)."""
    chosen = [c for n in names for c in CASES if c.name == n] if names else CASES
    return [(c.name, l) for c in chosen for l in launchers_of(c) if l != "bare"]


def run_ok(row):
    """What a scored row promises: output unchanged, the dumps, the verdict, the EXPECT-LINE line
    named where one is marked, and stderr saying what the dump and the report say."""
    return bool(row.get("output_unchanged") and row.get("dump_ok") and row.get("verdict_ok")
                and row.get("line_ok") is not False and row.get("agree"))


def run(cmd, env, timeout, cwd=None):
    e = dict(os.environ)
    e.update(env)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as t:
        out = t.stdout.decode() if isinstance(t.stdout, bytes) else (t.stdout or "")
        err = t.stderr.decode() if isinstance(t.stderr, bytes) else (t.stderr or "")
        return 124, out, err + f"\n[timed out after {timeout} s]", time.time() - t0


def expect_lines(path):
    """`file:line` of every line marked EXPECT-LINE (any of them may be named); [] when the
    line is not the point (another process holds the GPU)."""
    return [f"{os.path.basename(path)}:{i}" for i, line in enumerate(open(path), 1) if "EXPECT-LINE" in line]


def dumps_in(d):
    files = [p for p in glob.glob(os.path.join(d, "oomshim-*.json")) if not os.path.basename(p).startswith("oomshim-torch-")]

    def seq(p):
        m = re.search(r"-(\d+)\.json$", p)
        return int(m.group(1)) if m else 0

    return sorted(files, key=seq)


def summaries(err):
    return [l for l in err.splitlines() if l.startswith("oomshim: CUDA out of memory")]


def score(case, launcher, bare, result, d, line):
    rc, out, err, secs = result
    row = {"case": case.name, "launcher": launcher, "rc": rc, "secs": round(secs, 1)}
    row["output_unchanged"] = (out == bare[1] and rc == bare[0])
    files = dumps_in(d)
    stood = []
    for f in files:
        try:
            dump = json.load(open(f))
        except Exception:
            continue
        req = dump.get("failed_request")
        if req and req.get("recovered") is not True:
            stood.append((f, dump))
    row["dumps"] = len(files)
    row["stood"] = len(stood)
    row["dump_ok"] = bool(stood) and (case.count is None or len(stood) == case.count)
    if not stood:
        row.update(verdict=None, verdict_ok=False, line_ok=False, agree=False, stderr=err[-600:], ok=False)
        return row
    final_path, final = stood[-1]
    top = (final["verdict"].get("findings") or [{}])[0]
    right = case.final
    if case.truth:
        m = re.search(r"^truth: (\w+)", bare[2], re.M)
        right = {m.group(1)} if m else set()
        row["truth"] = m.group(1) if m else None
        if row["truth"] == "own_allocations":
            # Not fragmentation by torch's account; the kept cache entries also make it a leak.
            right |= case.final
    row["verdict"] = final["verdict"]["kind"]
    row["verdicts"] = [d["verdict"]["kind"] for _, d in stood]
    row["verdict_ok"] = row["verdict"] in right and (case.kinds is None or set(row["verdicts"]) <= case.kinds)
    headline = top.get("headline", "")
    row["headline"] = headline[:300]
    row["line"] = line
    base = os.path.splitext(os.path.basename(case.program))[0]
    # Named in the headline (the first line a user reads), the whole of it (the row keeps only its
    # start): None when no line is expected.
    row["line_ok"] = any(l in headline for l in line) if line else None
    # stderr: one summary per stood dump, in order; the last says the final dump's top finding.
    lines = summaries(err)
    said = lines[-1] if lines else ""
    row["stderr_line"] = said[:300]
    rep = run([CLI, "report", "--json", final_path], {}, 60)
    try:
        judged = json.loads(rep[1])["verdict"]["kind"]
    except Exception:
        judged = None
    row["report_kind"] = judged
    row["agree"] = bool(said) and said.endswith(f"{top.get('kind')}: {top.get('headline')}") and judged == row["verdict"]
    row["resolution"] = (final.get("failed_request") or {}).get("resolution")
    g = final.get("growth") or {}
    row["steps"] = g.get("steps")
    row["_base"] = base
    row["ok"] = run_ok(row)
    return row


def main():
    # OUT gets the scored rows; the dumps and stderr of every run go to ZOO_WORK (default
    # OUT/runs), which can be kept apart (the GPU tool returns only files near the top of OUT).
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/zoo"
    try:
        launcher_filter()
    except ValueError as e:
        sys.exit(str(e))
    os.makedirs(out_dir, exist_ok=True)
    runs_dir = os.environ.get("ZOO_WORK") or os.path.join(out_dir, "runs")
    work = os.path.join(runs_dir, "work")
    os.makedirs(work, exist_ok=True)
    log = open(os.path.join(out_dir, "zoo.jsonl"), "w")  # this run's rows, never stale ones
    rows = []
    # Named cases run in the order named (the ones that matter most first, for a run cut short).
    named = [c for n in sys.argv[2:] for c in CASES if c.name == n]
    for case in named or CASES:
        src = os.path.join(HERE, case.program)
        line = expect_lines(src)
        if case.build:
            exe = os.path.join(work, case.name)
            b = run(["nvcc", "-O2", "-g", *case.build, "-o", exe, src], {}, 240)
            if b[0] != 0:
                row = {"case": case.name, "launcher": "build", "rc": b[0], "stderr": b[2][-500:], "ok": False}
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(json.dumps(row)[:700], flush=True)
                continue
            cmd = [exe]
        else:
            cmd = [PY, src]
        results = {}
        for launcher in launchers_of(case):
            d = os.path.join(runs_dir, case.name, launcher)
            os.makedirs(d, exist_ok=True)
            env = dict(case.env, PYTHONUNBUFFERED="1")
            if launcher == "bare":
                full = cmd
            elif launcher == "preload":
                env.update(LD_PRELOAD=LIB, OOMSHIM_DIR=d)
                full = cmd
            elif launcher == "run":
                full = [CLI, "run", "--lib", LIB, "--dir", d, "--"] + cmd
            else:
                full = [CLI, "run", "--torch-allocator", "--lib", LIB, "--dir", d, "--"] + cmd
            holder = None
            if case.holder:
                holder = subprocess.Popen([PY, os.path.join(HERE, "holder.py")], stdout=subprocess.PIPE, text=True)
                holder.stdout.readline()
            try:
                results[launcher] = run(full, env, int(os.environ.get("ZOO_TIMEOUT", "90")), cwd=work)
            finally:
                if holder:
                    holder.kill()
                    holder.wait()
            if launcher == "bare":
                with open(os.path.join(d, "stdout.txt"), "w") as f:
                    f.write(results["bare"][1])
                with open(os.path.join(d, "stderr.txt"), "w") as f:
                    f.write(results["bare"][2])
                row = {"case": case.name, "launcher": "bare", "rc": results["bare"][0],
                       "secs": round(results["bare"][3], 1),
                       "stdout": results["bare"][1][-300:], "stderr_tail": results["bare"][2][-300:]}
            else:
                row = score(case, launcher, results["bare"], results[launcher], d, line)
                with open(os.path.join(d, "stderr.txt"), "w") as f:
                    f.write(results[launcher][2])
                with open(os.path.join(d, "stdout.txt"), "w") as f:
                    f.write(results[launcher][1])
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps({k: v for k, v in row.items() if k not in ("stderr", "stdout")})[:700], flush=True)
    # The table.
    scored = [r for r in rows if r.get("launcher") not in ("bare", "build")]
    print()
    print(f"{'case':24} {'launcher':8} {'out':4} {'dump':4} {'verdict':24} {'ok':3} {'line':4} {'agree':5}")
    for r in scored:
        print(f"{r['case']:24} {r['launcher']:8} {'Y' if r.get('output_unchanged') else 'N':4} "
              f"{'Y' if r.get('dump_ok') else 'N':4} {str(r.get('verdict')):24} {'Y' if r.get('verdict_ok') else 'N':3} "
              f"{({True: 'Y', False: 'N'}).get(r.get('line_ok'), '-'):4} {'Y' if r.get('agree') else 'N':5}")
    by = {}
    for r in scored:
        s = by.setdefault(r["launcher"], [0, 0, 0, 0, 0, 0])
        s[0] += 1
        s[1] += bool(r.get("output_unchanged"))
        s[2] += bool(r.get("dump_ok"))
        s[3] += bool(r.get("verdict_ok"))
        s[4] += r.get("line_ok") is not False
        s[5] += bool(r.get("agree"))
    print()
    print(f"{'launcher':8} {'runs':>4} {'output':>7} {'dumps':>6} {'verdict':>8} {'line':>5} {'agree':>6}")
    for k, s in by.items():
        n = s[0] or 1
        print(f"{k:8} {s[0]:4} {100 * s[1] // n:6}% {100 * s[2] // n:5}% {100 * s[3] // n:7}% {100 * s[4] // n:4}% {100 * s[5] // n:5}%")
    json.dump(rows, open(os.path.join(out_dir, "zoo.json"), "w"), indent=1)
    failed = [f"{r['case']} ({r['launcher']})" for r in rows if r.get("launcher") != "bare" and not r.get("ok")]
    print(f"\n{len(failed)} run(s) not as promised: {failed}" if failed else "\nevery run as promised")
    return 1 if failed or not scored else 0


if __name__ == "__main__":
    sys.exit(main())
