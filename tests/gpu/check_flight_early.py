"""GPU check of the flight recorder on the two deaths it used to miss (both early in the program), both under
`oomshim run` with PyTorch:

- load: a program moves a model onto the device (a few large Linear layers holding about 25% of
  the free memory, sized from cudaMemGetInfo) and is SIGKILLed about 0.3 s after the load, long
  before a first OOMSHIM_LIVE_INTERVAL. Its post-mortem must exist, name the program's line that
  loads the model, and not call the load a leak.
- slow leak: a program with no step marks keeps a tensor every ~100 ms in a list (about 1/300
  of the free memory each) and is SIGKILLed after 15 s. Its post-mortem must carry a leak
  finding that names the program's line, in bytes per second.

Each prints its post-mortem's headline (an [INFO] row). Bounded: each case has its own timeout,
about 40 s in all on an H100.

    main(root, lib, cli, out_dir) -> [(check, ok, detail)]  (ok None: an [INFO] row)

Run alone: python3 tests/gpu/check_flight_early.py OUT_DIR (OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI
name the build, default target/release/...). `--dry-run` writes the two programs to OUT_DIR and
checks they compile, without a GPU."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

LOAD = r'''
import os, sys, time
import torch
free, _ = torch.cuda.mem_get_info()
layers, width = 6, 8192
# A few large layers holding about 25% of the free memory: width x width float32 each.
while layers * width * width * 4 < free // 4:
    width += 1024
# Uninitialised on the host (initialising gigabytes of weights there would take longer than the
# check): the load is the copy to the device.
model = torch.nn.Sequential(
    *[torch.nn.utils.skip_init(torch.nn.Linear, width, width, bias=False) for _ in range(layers)]
)
model = model.to("cuda")  # LOAD_LINE
torch.cuda.synchronize()
print(f"loaded {os.getpid()} {sum(p.numel() * 4 for p in model.parameters())}", flush=True)
time.sleep(600)
'''

LEAK = r'''
import os, sys, time
import torch
free, _ = torch.cuda.mem_get_info()
size = max(2 << 20, (free // 300) & ~((2 << 20) - 1))
keep = []
print(f"started {os.getpid()} {size}", flush=True)
while True:
    keep.append(torch.empty(size, dtype=torch.uint8, device="cuda"))  # KEEP_LINE
    time.sleep(0.1)
'''


def _line(source, marker):
    return next(i for i, l in enumerate(source.splitlines(), 1) if marker in l)


def _dumps(d):
    return sorted(p for p in glob.glob(os.path.join(d, "oomshim-*.json"))
                  if not os.path.basename(p).startswith("oomshim-torch-"))


def _killed_run(cli, lib, script, ready_word, wait_after, dumps, live, timeout):
    """Runs `python script` under `oomshim run`, waits for `ready_word PID ...` on its stdout,
    then `wait_after` seconds, SIGKILLs the program and returns (oomshim run's status, its stderr,
    the post-mortems written, what the program printed)."""
    env = dict(os.environ, OOMSHIM_LIVE_DIR=live)
    env.pop("OOMSHIM_LIVE_INTERVAL", None)
    env.pop("OOMSHIM_LIVE_CHANGE", None)
    p = subprocess.Popen([cli, "run", "--dir", dumps, "--lib", lib, "--", sys.executable, script],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = ""
    try:
        deadline = time.time() + timeout
        while not said.startswith(ready_word) and time.time() < deadline:
            said = p.stdout.readline()
            if not said and p.poll() is not None:
                break
        if said.startswith(ready_word):
            time.sleep(wait_after)
            os.kill(int(said.split()[1]), signal.SIGKILL)
        else:
            p.kill()
        _, err = p.communicate(timeout=60)
    except Exception as e:  # a broken case is a failed row, not a lost table
        p.kill()
        _, err = p.communicate()
        err += f"\n{type(e).__name__}: {e}"
    pms = []
    for f in _dumps(dumps):
        with open(f) as fh:
            d = json.load(fh)
        if d.get("reason") == "post_mortem":
            pms.append(d)
    return p.returncode, err, pms, said.strip()


def _killed(lib, cli, out_dir, case, name, source, marker, ready_word, wait_after):
    """Writes `source` as `name` in a folder of its own and runs it, killed `wait_after` s after
    it said `ready_word`: (its one post-mortem, saved as OUT/flight-early-CASE-post-mortem.json,
    or None and why; what it said; `name:line` of `marker`)."""
    work = os.path.join(out_dir, f"flight-early-{case}")
    os.makedirs(work, exist_ok=True)
    script = os.path.join(work, name)
    with open(script, "w") as f:
        f.write(source)
    rc, err, pms, said = _killed_run(cli, lib, script, ready_word, wait_after, os.path.join(work, "dumps"),
                                     os.path.join(work, "live"), 90)
    want = f"{name}:{_line(source, marker)}"
    if len(pms) != 1:
        return None, f"{len(pms)} post-mortems; rc {rc}; program said {said!r}; stderr {err[-800:]}", said, want
    with open(os.path.join(out_dir, f"flight-early-{case}-post-mortem.json"), "w") as f:
        json.dump(pms[0], f)
    return pms[0], "", said, want


def _case_load(lib, cli, out_dir):
    pm, why, said, want = _killed(lib, cli, out_dir, "load", "load_model.py", LOAD, "LOAD_LINE", "loaded", 0.3)
    rows = []
    if pm is None:
        return [("flight early: a model load killed 0.3 s after it has a post-mortem", False, why)]
    head = pm["verdict"]["findings"][0]["headline"]
    rows.append(("flight early: a model load killed 0.3 s after it has a post-mortem",
                 pm["post_mortem"]["signal_name"] == "SIGKILL" and pm["post_mortem"]["generation"] >= 1,
                 f"publish {pm['post_mortem']['generation']}, {pm['devices'][0]['tracked_bytes'] / 2**30:.2f} GiB "
                 f"tracked; the program loaded {int(said.split()[2]) / 2**30:.2f} GiB" if said else "no load"))
    rows.append(("flight early: the load's post-mortem names the program's line", want in head,
                 f"{want} in the headline"))
    leak = [f for f in pm["verdict"]["findings"] if f["kind"] == "leak"]
    rows.append(("flight early: a model load is not called a leak", not leak and "leak:" not in head,
                 "; ".join(f["headline"][:200] for f in leak) or "no leak finding"))
    rows.append(("flight early: the load's post-mortem", None, head))
    return rows


def _case_leak(lib, cli, out_dir):
    pm, why, said, want = _killed(lib, cli, out_dir, "leak", "slow_leak.py", LEAK, "KEEP_LINE", "started", 15)
    if pm is None:
        return [("flight early: a slow leak killed after 15 s has a post-mortem", False, why)]
    findings = pm["verdict"]["findings"]
    head = findings[0]["headline"]
    leak = [f for f in findings if f["kind"] == "leak"]
    named = [f for f in leak if want in f["headline"] and "every second" in f["headline"]]
    growth = pm.get("growth") or {}
    return [
        ("flight early: a slow leak without steps killed after 15 s has a post-mortem",
         pm["post_mortem"]["signal_name"] == "SIGKILL", f"publish {pm['post_mortem']['generation']}"),
        ("flight early: the slow leak's post-mortem is a leak at the program's line, per second", bool(named),
         f"{want}; growth.steps {growth.get('steps')}; "
         + ("; ".join(f["headline"][:240] for f in leak) or "no leak finding")),
        ("flight early: the slow leak's post-mortem", None, head),
    ]


def main(root, lib, cli, out_dir):
    rows = []
    for case in (_case_load, _case_leak):
        try:
            rows.extend(case(lib, cli, out_dir))
        except Exception as e:  # a broken case is a failed row, not a lost table
            rows.append((f"flight early: {case.__name__}", False, f"{type(e).__name__}: {e}"))
    return rows


def _keep(out_dir, line):
    print(line, flush=True)
    with open(os.path.join(out_dir, "rows.txt"), "a") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    out = args[0] if args else "/tmp/oomshim-flight-early"
    os.makedirs(out, exist_ok=True)
    if "--dry-run" in sys.argv:
        # Without a GPU: the two programs compile, and their marked lines are where the check
        # looks for them.
        for name, src, marker in (("load_model.py", LOAD, "LOAD_LINE"), ("slow_leak.py", LEAK, "KEEP_LINE")):
            compile(src, name, "exec")
            _keep(out, f"[INFO] dry run: {name} compiles; {marker} is line {_line(src, marker)}")
        sys.exit(0)
    lib = os.environ.get("OOMSHIM_GPU_LIB") or os.path.join(here, "target/release/liboomshim.so")
    cli = os.environ.get("OOMSHIM_GPU_CLI") or os.path.join(here, "target/release/oomshim")
    results = main(here, lib, cli, out)
    failed = False
    for c, ok, detail in results:
        if ok is None:
            _keep(out, f"[INFO] {c}: {detail}")
            continue
        failed |= not ok
        _keep(out, f"[{'PASS' if ok else 'FAIL'}] {c}: {detail}")
    sys.exit(1 if failed else 0)
