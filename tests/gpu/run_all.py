"""Every GPU check of oomshim in one call, a table printed last. Runs on the GPU machine from the
repository root, with target/release/liboomshim.so and target/release/oomshim built elsewhere and
carried along. Usage: python3 tests/gpu/run_all.py [OUT_DIR]"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from statistics import median

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# A command under a time limit and the shim's dumps in a folder, as the standalone checks have them.
from standalone import ROOT, build, dumps_in  # noqa: E402
from standalone import run_command as run  # noqa: E402

# OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI: the build to test (carried stripped copies), else the repo's.
LIB, CLI = build()
OUT = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="oomshim-gpu-")
os.makedirs(OUT, exist_ok=True)
WORK = tempfile.mkdtemp(prefix="oomshim-gpu-work-")
rows = []  # (check, result, detail, is_assertion)


def keep(line):
    """Prints a row and appends it to OUT/rows.txt as it is made: a run cut short by its time limit
    still brings back every row it finished."""
    print(line, flush=True)
    with open(os.path.join(OUT, "rows.txt"), "a") as f:
        f.write(line + "\n")


def row(check, ok, detail):
    """An assertion: PASS or FAIL, and any FAIL fails the run."""
    rows.append((check, "PASS" if ok else "FAIL", detail, True))
    keep(f"[{'PASS' if ok else 'FAIL'}] {check}: {detail}")


def figure(check, value, goal, detail=""):
    """A measured figure, printed against its goal: never a pass or a failure (a figure that
    misses its goal is for a person to judge, not a flaky red row). A measurement that produced
    no number is a failed assertion instead: call row(..., False, ...)."""
    result = f"{value} vs goal {goal}"
    rows.append((check, result, detail, False))
    keep(f"[FIGURE] {check}: {result}; {detail}")


def info(check, detail):
    """A fact worth printing beside the checks; neither a pass nor a failure."""
    rows.append((check, "INFO", detail, False))
    keep(f"[INFO] {check}: {detail}")


def load(path):
    with open(path) as f:
        return json.load(f)


def names(stack):
    return [f.get("function") or "" for f in stack]


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def nvcc(src, out):
    p = run(["nvcc", "-O2", "-g", "-cudart", "shared", "-o", out, src])
    if p.returncode != 0:
        print(p.stderr)
    return p.returncode == 0


def check_nvcc_leak():
    exe = os.path.join(WORK, "leak")
    if not nvcc(os.path.join(ROOT, "tests/gpu/leak.cu"), exe):
        row("nvcc leak: build", False, "nvcc failed")
        return
    bare = run([exe])
    d = os.path.join(OUT, "nvcc")
    os.makedirs(d, exist_ok=True)
    shim = run([exe], env={"LD_PRELOAD": LIB, "OOMSHIM_DIR": d})
    same = bare.stdout == shim.stdout and bare.returncode == shim.returncode
    row("nvcc leak: stdout and exit code unchanged", same,
        f"exit {bare.returncode} vs {shim.returncode}; {bare.stdout.splitlines()[0] if bare.stdout else ''}")
    files = dumps_in(d)
    if len(files) != 1:
        row("nvcc leak: one dump", False, f"{len(files)} dumps; stderr: {shim.stderr[-800:]}")
        return
    dump = load(files[0])
    held = int(shim.stdout.split()[1])
    fr = dump["failed_request"]
    dev = [x for x in dump["devices"] if x["index"] == fr["device"]][0]
    ok = fr["bytes"] == 2**30 and fr["api"] == "cudaMalloc" and dev["tracked_bytes"] == held * 2**30
    row("nvcc leak: dump numbers", ok,
        f"failed {fr['bytes']} B via {fr['api']}; tracked {gib(dev['tracked_bytes'])} = {held} chunks; "
        f"free {gib(dev['free_bytes'] or 0)} of {gib(dev['total_bytes'] or 0)}; verdict {dump['verdict']['kind']}")
    top = dump["largest_holders"][0]
    row("nvcc leak: stack names grow_leaky_buffer", "grow_leaky_buffer" in " ".join(names(top["stack"])),
        " <- ".join(n for n in names(top["stack"])[:4] if n))
    shutil.copy(files[0], os.path.join(OUT, "nvcc-dump.json"))
    with open(os.path.join(OUT, "nvcc-stderr.txt"), "w") as f:
        f.write(shim.stderr)


def check_torch():
    script = os.path.join(ROOT, "tests/gpu/torch_leak.py")
    bare = run([sys.executable, script], timeout=400)
    d = os.path.join(OUT, "torch")
    os.makedirs(d, exist_ok=True)
    shim = run([CLI, "run", "--dir", d, "--lib", LIB, "--", sys.executable, script], timeout=400)
    try:
        rb = json.loads(bare.stdout.strip().splitlines()[-1])
        rs = json.loads(shim.stdout.strip().splitlines()[-1])
    except Exception:
        row("torch leak: ran", False, f"bare rc {bare.returncode} shim rc {shim.returncode}: {shim.stderr[-1500:]}")
        return
    same = (rb["raised"] == rs["raised"] == "OutOfMemoryError" and rb["message_head"] == rs["message_head"]
            and rb["step"] == rs["step"] and bare.returncode == shim.returncode)
    row("torch leak: OutOfMemoryError raised as without the shim", same,
        f"{rs['raised']} at step {rs['step']} (bare: step {rb['step']}); exit {shim.returncode}")
    files = dumps_in(d)
    if not files:
        row("torch leak: dump exists", False, shim.stderr[-1500:])
        return
    dump = load(files[0])
    row("torch leak: dump exists", len(files) == 1, f"{len(files)} dump(s); verdict {dump['verdict']['kind']}")
    fr = dump["failed_request"]
    last = fr.get("last_failure") or {}
    reserved = rs["reserved"]
    tracked = last.get("tracked_bytes", -1)
    err = abs(tracked - reserved) / reserved
    row("torch leak: tracked_bytes vs torch reserved (at the last failure of the burst)", err <= 0.01,
        f"tracked {tracked} vs reserved {reserved} ({err * 100:.3f}%); first failure: tracked "
        f"{[x for x in dump['devices'] if x['index'] == fr['device']][0]['tracked_bytes']}, burst of {fr['failures_in_burst']}")
    free = last.get("free_bytes")
    ferr = abs(free - rs["free"]) / max(rs["total"], 1) if free is not None else 1
    row("torch leak: free_bytes vs torch.cuda.mem_get_info", free is not None and ferr <= 0.01,
        f"dump {free} vs torch {rs['free']} (diff {ferr * 100:.3f}% of total)")
    top = dump["largest_holders"][0] if dump["largest_holders"] else {"stack": []}
    row("torch leak: holders have native stacks", len(top["stack"]) > 3,
        " <- ".join(n for n in names(top["stack"])[:5] if n)[:200])
    # Python stacks: the top site's stack holds the script's own line, and the verdict names it
    # (not torch's own Python code, which is further in).
    site = dump["sites"][0] if dump["sites"] else {"stack": []}
    mine = [f for f in site["stack"] if f.get("kind") == "python" and (f.get("file") or "").endswith("torch_leak.py")]
    lines = open(script).read().splitlines()
    first = mine[0] if mine else {}
    src = lines[first["line"] - 1].strip() if first.get("line") and first["line"] <= len(lines) else ""
    row("torch leak: top site names the script's file:line (Python stack)",
        bool(mine) and "torch_leak.py" in dump["verdict"]["summary"],
        f"{first.get('function')} (torch_leak.py:{first.get('line')}) `{src}`; verdict: "
        f"{dump['verdict']['summary'][:110]}")
    shutil.copy(files[0], os.path.join(OUT, "torch-dump.json"))
    with open(os.path.join(OUT, "torch-stderr.txt"), "w") as f:
        f.write(shim.stderr)
    check_memory_viz(files[0], dump)
    rep = run([CLI, "report", files[0]])
    row("torch leak: oomshim report renders", rep.returncode == 0 and "verdict" in rep.stdout.lower(),
        f"{len(rep.stdout.splitlines())} lines")
    with open(os.path.join(OUT, "torch-report.txt"), "w") as f:
        f.write(rep.stdout + rep.stderr)


def check_memory_viz(dump_path, dump):
    """oomshim export --memory-viz, read back by torch's own torch.cuda._memory_viz."""
    pk = os.path.join(OUT, "torch-snapshot.pickle")
    p = run([CLI, "export", dump_path, "--memory-viz", pk])
    if p.returncode != 0:
        row("memory_viz export", False, p.stderr[-500:])
        return
    code = (
        "import pickle, sys\n"
        "from torch.cuda import _memory_viz as mv\n"
        "d = pickle.load(open(sys.argv[1], 'rb'))\n"
        "mv.segsum(d); mv.trace(d); mv.trace_plot(d); mv.segment_plot(d)\n"
        "mv.segments(d, format_flamegraph=lambda s: s)\n"
        # The largest holder's segment (not the remainder segment, which has no real address).
        "top = max((s for s in d['segments'] if 'oomshim_address' in s), key=lambda s: s['total_size'])\n"
        "print(top['total_size'], top['blocks'][0]['frames'][0]['name'][:80])\n"
    )
    v = run([sys.executable, "-c", code, pk])
    top = dump["largest_holders"][0]
    ok = v.returncode == 0 and v.stdout.split()[0] == str(top["bytes"])
    row("memory_viz export read by torch.cuda._memory_viz (segsum, trace, trace_plot, segment_plot)", ok,
        (v.stdout.strip() or v.stderr[-400:])[:200])


def check_torch_fragmentation():
    """The Python hook saves torch's snapshot at OutOfMemoryError; the report merges it and names
    fragmentation (the brief's 1 GiB segments split by 600 MiB tensors)."""
    script = os.path.join(ROOT, "tests/gpu/torch_fragmentation.py")
    d = os.path.join(OUT, "frag")
    os.makedirs(d, exist_ok=True)
    p = run([CLI, "run", "--dir", d, "--lib", LIB, "--", sys.executable, script], timeout=400)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        row("torch fragmentation: ran", False, p.stderr[-800:])
        return
    files = dumps_in(d)
    torch_files = sorted(glob.glob(os.path.join(d, "oomshim-torch-*.json")))
    row("torch fragmentation: OOM raised, shim dump and torch snapshot saved",
        r.get("raised") == "OutOfMemoryError" and len(files) >= 1 and len(torch_files) >= 1,
        f"{r.get('segments')} segments, reserved {gib(r.get('reserved', 0))}, allocated {gib(r.get('allocated', 0))}; "
        f"{len(files)} dump(s), {len(torch_files)} torch snapshot(s)")
    if not files:
        return
    rep = run([CLI, "report", files[-1], "--json"])
    try:
        j = json.loads(rep.stdout)
    except Exception:
        row("torch fragmentation: report", False, rep.stderr[-500:])
        return
    kind = (j.get("verdict") or {}).get("kind")
    fb = j.get("free_blocks") or {}
    row("torch fragmentation: verdict names fragmentation from torch's free blocks", kind == "fragmentation",
        f"verdict {kind}; free blocks from {fb.get('source')}: total {gib(fb.get('total_free_bytes') or 0)}, "
        f"largest {gib(fb.get('largest_free_bytes') or 0)}")
    text = run([CLI, "report", files[-1]])
    with open(os.path.join(OUT, "frag-report.txt"), "w") as f:
        f.write(text.stdout + text.stderr)


def check_other_process():
    """Another process holds most of the GPU: the verdict must say so and name it (NVML)."""
    holder = subprocess.Popen([sys.executable, "-c",
        "import torch, time, sys\n"
        "free, _ = torch.cuda.mem_get_info()\n"
        "x = torch.empty(free - (24 << 30), dtype=torch.uint8, device='cuda')\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"], stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            row("other process: holder started", False, "no ready line")
            return
        exe = os.path.join(WORK, "leak")
        # Built by check_nvcc_leak; built here when that check is not in the subset.
        if not os.path.exists(exe) and not nvcc(os.path.join(ROOT, "tests/gpu/leak.cu"), exe):
            row("other process: build", False, "nvcc failed")
            return
        d = os.path.join(OUT, "other")
        os.makedirs(d, exist_ok=True)
        p = run([exe], env={"LD_PRELOAD": LIB, "OOMSHIM_DIR": d})
        files = dumps_in(d)
        if not files:
            row("other process: dump", False, p.stderr[-500:])
            return
        dump = load(files[0])
        v = dump["verdict"]
        gp = dump.get("gpu_processes") or {}
        others = [x for x in gp.get("processes", []) if x["pid"] == holder.pid]
        row("other process: verdict other_processes names the holder's pid", v["kind"] == "other_processes"
            and str(holder.pid) in v["summary"] and bool(others),
            f"{v['kind']}: {v['summary'][:160]}; NVML: {[(x['pid'], x.get('used_bytes'), x['relation']) for x in gp.get('processes', [])][:3]} {gp.get('error') or ''}")
    finally:
        holder.kill()
        holder.wait()


def check_driver_paths():
    """Issue 3's workloads (tests/gpu/check_driver.py), a subset unless OOMSHIM_GPU_ONLY says."""
    sys.path.insert(0, os.path.join(ROOT, "tests/gpu"))
    import check_driver
    os.environ.setdefault("OOMSHIM_GPU_ONLY", "nvcc-static,torch-expandable,cupy-pool,jax-platform")
    ctx = {"ROOT": ROOT, "LIB": LIB, "CLI": CLI, "OUT": OUT, "WORK": WORK, "run": run}
    for check, ok, detail in check_driver.checks(ctx):  # check_driver prints its own rows
        rows.append((check, "PASS" if ok else "FAIL", detail, True))


def check_backward_oom():
    """An OOM inside loss.backward(): what the dump says about who allocated."""
    d = os.path.join(OUT, "backward")
    os.makedirs(d, exist_ok=True)
    p = run([CLI, "run", "--dir", d, "--lib", LIB, "--", sys.executable,
             os.path.join(ROOT, "tests/gpu/torch_backward_oom.py")], timeout=400)
    files = dumps_in(d)
    try:
        where = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        where = {}
    if files:
        dump = load(files[-1])
        fr = dump.get("failed_request") or {}
        py = [f for f in fr.get("stack", []) if f.get("kind") == "python"]
        native = [f.get("function") for f in fr.get("stack", []) if f.get("function") and f.get("kind") != "python"]
        engine = [n[:70] for n in native if "Engine" in n][:2]
        threads = sorted({h.get("thread_name") for h in dump["largest_holders"] if h.get("thread_name")})
        summary = dump["verdict"]["summary"]
        row(f"python stacks: OOM inside {where.get('oom_in')}", where.get("oom_in") == "backward",
            f"failing call: {len(py)} Python frames, engine frames {engine}; holder threads {threads[:4]}; "
            f"{summary[summary.find('site'):][:110]}")
    else:
        row("python stacks: OOM inside backward: dump", False, p.stderr[-400:] or p.stdout[-400:])


def check_python_stacks():
    """Issue 5 on the GPU: file:line with every tensor reaching cudaMalloc, an OOM inside
    backward(), the per-tensor cost of each stack mode against torch's own recorder, and the
    time to write a dump of 100,000 live tensors against torch's _dump_snapshot."""
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    # (a) every tensor is a cudaMalloc: the holders are tensors, the site the script's line.
    d = os.path.join(OUT, "nocache")
    os.makedirs(d, exist_ok=True)
    script = os.path.join(ROOT, "tests/gpu/torch_leak.py")
    p = run([CLI, "run", "--dir", d, "--lib", LIB, "--", sys.executable, script], env=nocache, timeout=400)
    files = dumps_in(d)
    if files:
        dump = load(files[0])
        summary = dump["verdict"]["summary"]
        # The line that makes each kept tensor, or the one that keeps it: found by their text
        # (a number written here went stale when the script grew its step marks).
        lines = [f"torch_leak.py:{i}" for i, text in enumerate(open(script), 1)
                 if "y = model(x)" in text or "history.append(y)" in text]
        row("python stacks, PYTORCH_NO_CUDA_MEMORY_CACHING=1: top site is the script's line",
            len(lines) == 2 and any(l in summary for l in lines),
            f"{dump['recording']['live_allocations']} live allocations; {summary[summary.find('site'):][:120]}")
    else:
        row("python stacks, PYTORCH_NO_CUDA_MEMORY_CACHING=1: dump", False, p.stderr[-400:])
    # (c) cost per torch.empty + del, interleaved.
    cost = os.path.join(ROOT, "tests/gpu/torch_cost.py")
    variants = [("torch, caching allocator", [cost, "plain"], {}),
                ("torch _record_memory_history(stacks='python')", [cost, "hist_python"], {}),
                ("torch _record_memory_history() (python+C++)", [cost, "hist_all"], {})]
    for mode in ("off", "native", "python", "all"):
        variants.append((f"shim OOMSHIM_STACKS={mode}, caching allocator", [cost, "plain"],
                         {"LD_PRELOAD": LIB, "OOMSHIM_STACKS": mode}))
    variants.append(("torch, no caching (every tensor a cudaMalloc)", [cost, "plain", "5000"], dict(nocache)))
    for mode in ("off", "native", "python", "all"):
        variants.append((f"shim OOMSHIM_STACKS={mode}, no caching", [cost, "plain", "5000"],
                         dict(nocache, LD_PRELOAD=LIB, OOMSHIM_STACKS=mode)))
    got = {}
    for _ in range(1):
        for label, args, env in variants:
            p = run(["taskset", "-c", "2", sys.executable] + args, env=env, timeout=200)
            try:
                got.setdefault(label, []).append(json.loads(p.stdout.strip().splitlines()[-1])["us_per_iter"])
            except Exception:
                got.setdefault(label, [])
    # The number to beat (design brief, section 6): torch's own recorder with Python stacks.
    hist = got.get("torch _record_memory_history(stacks='python')") or []
    for label, _, _ in variants:
        v = got.get(label) or []
        if not v:
            row(f"cost per torch.empty+del: {label}", False, "no result")
            continue
        goal = (f"< {min(hist):.2f} us/iter (torch _record_memory_history(stacks='python'), this run)"
                if label.startswith("shim") and hist else "none (reference)")
        figure(f"cost per torch.empty+del: {label}", f"{min(v):.2f} us/iter", goal)
    # (d) time to write a dump of 100,000 live tensors.
    p = run([sys.executable, os.path.join(ROOT, "tests/gpu/torch_dumptime.py"), "oomshim"],
            env=dict(nocache, LD_PRELOAD=LIB, OOMSHIM_DIR=os.path.join(OUT, "dumptime")), timeout=300)
    q = run([sys.executable, os.path.join(ROOT, "tests/gpu/torch_dumptime.py"), "torch"], timeout=150)
    try:
        a = json.loads(p.stdout.strip().splitlines()[-1])
        b = json.loads(q.stdout.strip().splitlines()[-1]) if q.returncode == 0 else None
        torch_text = (f"torch {b['seconds']:.2f} s ({b['bytes'] / 2**20:.0f} MiB)" if b else
                      "torch did not finish within 150 s")
        row("dump of 100,000 live tensors: oomshim_dump wrote its dump", a["rc"] == 0, f"rc {a['rc']}")
        figure("dump of 100,000 live tensors: oomshim_dump vs torch _dump_snapshot (C++ stacks)",
               f"oomshim {a['seconds']:.2f} s", f"faster than torch ({torch_text})")
    except Exception:
        row("dump of 100,000 live tensors", False, (p.stderr + q.stderr)[-400:])


def check_torchrun():
    """Issue 7: a 2-rank torchrun job on one GPU where rank 1 leaks; `oomshim merge` names it."""
    d = os.path.join(OUT, "torchrun")
    os.makedirs(d, exist_ok=True)
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    p = run([CLI, "run", "--dir", d, "--lib", LIB, "--", torchrun, "--nproc_per_node=2", "--master_port=29533",
             os.path.join(ROOT, "tests/gpu/torchrun_leak.py")], env={"OOMSHIM_AT_EXIT": "1"}, timeout=300)
    m = run([CLI, "merge", d])
    text = m.stdout
    mj = run([CLI, "merge", d, "--json"])
    with open(os.path.join(OUT, "torchrun-merge.txt"), "w") as f:
        f.write(text + m.stderr + "\n--- merge --json ---\n" + mj.stdout + mj.stderr
                + "\n--- job stderr ---\n" + p.stderr[-3000:])
    ok, why = merge_names_leaking_rank(mj.stdout, leaking=1)
    ok = ok and m.returncode == 0 and mj.returncode == 0
    line = next((l.strip() for l in text.splitlines() if "ran out of memory" in l), text[-300:])
    row("torchrun 2 ranks on one GPU: oomshim merge names the leaking rank", ok,
        f"job exit {p.returncode}; {why}; {line[:200]}")


def merge_names_leaking_rank(merge_json_text, leaking):
    """(ok, why) for `oomshim merge --json`: the first failure is rank `leaking`, with no other
    rank as uncertain, and only that rank's dumps are out-of-memory dumps."""
    try:
        m = json.loads(merge_json_text)
    except ValueError as e:
        return False, f"merge --json is not JSON: {e}"
    first = m.get("first_failure") or {}
    first_rank = (first.get("process") or {}).get("rank")
    uncertain = [u.get("rank") for u in first.get("uncertain_with") or []]
    oom_ranks = sorted({r.get("rank") for r in m.get("rows", []) if r.get("reason") == "oom"},
                       key=lambda r: (r is None, r))
    ok = first_rank == leaking and not uncertain and oom_ranks == [leaking]
    return ok, f"first failure rank {first_rank}, uncertain with {uncertain}, OOM dumps of ranks {oom_ranks}"


def check_ranks():
    """Issue 18: torchrun with 2 ranks sharing the one GPU, rank 1 leaking. NCCL first (it
    usually refuses two ranks on one device), then gloo. Every dump says its rank, local rank,
    world size, launcher and job; the OOM dump names the GPU by UUID; `oomshim merge` names rank 1
    as the first to fail, the imbalance and the room on rank 0; under NCCL its buffers are NCCL."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    tried = []
    for backend, port in (("nccl", "29541"), ("gloo", "29542")):
        d = os.path.join(OUT, f"ranks-{backend}")
        os.makedirs(d, exist_ok=True)
        p = run(["timeout", "240", CLI, "run", "--dir", d, "--lib", LIB, "--", torchrun, "--nproc_per_node=2",
                 f"--master_port={port}", "--rdzv-id=oomshim-issue18",
                 os.path.join(ROOT, "tests/gpu/ranks_leak.py")],
                env={"OOMSHIM_AT_EXIT": "1", "OOMSHIM_RANKS_BACKEND": backend,
                     "TORCHELASTIC_RUN_ID": "oomshim-issue18"}, timeout=260)
        tried.append(f"{backend}: exit {p.returncode}")
        with open(os.path.join(OUT, f"ranks-{backend}.stderr"), "w") as f:
            f.write(p.stderr[-8000:])
        if p.returncode == 0:
            break
    m = run(["timeout", "60", CLI, "merge", d], timeout=70)
    text = m.stdout
    with open(os.path.join(OUT, "ranks-merge.txt"), "w") as f:
        f.write(text + m.stderr + "\n--- job stdout ---\n" + p.stdout[-3000:] + "\n--- job stderr ---\n" + p.stderr[-6000:])
    dumps = [load(x) for x in dumps_in(d)]
    procs = [x["process"] for x in dumps]
    ranks_ok = sorted({(q.get("rank"), q.get("local_rank"), q.get("world_size"), q.get("launcher")) for q in procs}) == \
        [(0, 0, 2, "torchrun"), (1, 1, 2, "torchrun")]
    job_ok = all(q.get("job_id") == "oomshim-issue18" for q in procs)
    ooms = [x for x in dumps if x["reason"] == "oom" and x["process"].get("rank") == 1]
    uuid = next((dv.get("uuid") for x in ooms for dv in x["devices"] if dv.get("uuid")), None)
    mj = run(["timeout", "60", CLI, "merge", d, "--json"], timeout=70)
    first_json_ok, first_why = merge_names_leaking_rank(mj.stdout, leaking=1)
    try:
        imbalanced = [x.get("rank") for x in json.loads(mj.stdout).get("imbalanced", [])]
    except ValueError:
        imbalanced = None
    first_ok = first_json_ok and imbalanced == [1] and "room on the others" in text
    libs = {l["library"]: l["bytes"] for x in dumps for l in (x.get("library_memory") or {}).get("libraries", [])}
    nccl_ok = backend != "nccl" or libs.get("nccl", 0) > 0
    ok = p.returncode == 0 and m.returncode == 0 and ranks_ok and job_ok and bool(uuid) and first_ok and nccl_ok
    first = next((l.strip() for l in text.splitlines() if "first to run out" in l), text[-200:])
    row("torchrun 2 ranks on one GPU: ranks, job, UUID, first to fail, NCCL named", ok,
        f"{'; '.join(tried)}; ranks {ranks_ok}, job {job_ok}, uuid {uuid}, libraries "
        f"{ {k: gib(v) for k, v in libs.items()} }; {first_why}, imbalanced {imbalanced}; {first[:200]}")
    if backend == "nccl":
        return
    # NCCL refuses two ranks on one device, so its buffers are checked with one rank: a dump
    # taken while the communicator lives must name NCCL's memory as NCCL.
    d = os.path.join(OUT, "ranks-nccl1")
    os.makedirs(d, exist_ok=True)
    p = run(["timeout", "120", CLI, "run", "--dir", d, "--lib", LIB, "--", torchrun, "--nproc_per_node=1",
             "--master_port=29543", os.path.join(ROOT, "tests/gpu/ranks_leak.py")],
            env={"OOMSHIM_RANKS_BACKEND": "nccl", "OOMSHIM_RANKS_DUMP_AFTER_INIT": "1"}, timeout=140)
    dumps = [load(x) for x in dumps_in(d)]
    libs = {l["library"]: (l["bytes"], l.get("count"), l.get("modules")) for x in dumps
            for l in (x.get("library_memory") or {}).get("libraries", [])}
    nccl = libs.get("nccl")
    with open(os.path.join(OUT, "ranks-nccl1.txt"), "w") as f:
        f.write(p.stdout[-3000:] + "\n--- stderr ---\n" + p.stderr[-6000:])
    row("NCCL's buffers named NCCL (torchrun, 1 rank, NCCL, dump while the communicator lives)",
        p.returncode == 0 and bool(nccl) and nccl[0] > 0,
        f"exit {p.returncode}; {len(dumps)} dump(s); libraries "
        f"{ {k: (gib(v[0]), v[1], v[2]) for k, v in libs.items()} }; {p.stderr.strip()[-200:] if p.returncode else ''}")


def check_verdicts():
    """Issue 6 on the GPU: each case's top finding. (The other-process case is check_other_process.)"""
    # A single request larger than the device.
    d = os.path.join(OUT, "toolarge")
    os.makedirs(d, exist_ok=True)
    p = run([CLI, "run", "--dir", d, "--lib", LIB, "--", sys.executable, "-c",
             "import torch\ntry:\n    torch.empty(200 << 30, dtype=torch.uint8, device='cuda')\n"
             "except torch.cuda.OutOfMemoryError:\n    print('raised')"], timeout=120)
    files = dumps_in(d)
    kind = load(files[0])["verdict"]["kind"] if files else None
    row("verdict: a request larger than the device", kind == "request_exceeds_device",
        f"{kind}; program printed {p.stdout.strip()!r}")
    # The leak, with steps marked through the oomshim package that `oomshim run` provides.
    d = os.path.join(OUT, "torch")
    files = dumps_in(d)
    if files:
        dump = load(files[0])
        v = dump["verdict"]
        growth = dump.get("growth")
        row("verdict: activations kept in a list -> leak with bytes per step", v["kind"] == "leak",
            f"{v['kind']}: {v['summary'][:200]}; growth key: {json.dumps(growth)[:160] if growth else None}")
    # Fragmentation: the suggestion, and the same program succeeding with expandable segments.
    files = dumps_in(os.path.join(OUT, "frag"))
    if files:
        rep = run([CLI, "report", files[-1], "--json"])
        try:
            sugg = " ".join(json.loads(rep.stdout)["verdict"]["suggestions"])
        except Exception:
            sugg = ""
        row("verdict: fragmentation suggests expandable_segments", "expandable_segments:True" in sugg, sugg[:160])
    p = run([sys.executable, os.path.join(ROOT, "tests/gpu/torch_fragmentation.py")],
            env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, timeout=300)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        r = {}
    row("fragmentation case succeeds under expandable_segments:True", r.get("raised") is None and "segments" in r,
        f"{r}")


def check_overhead():
    exe = os.path.join(WORK, "pair")
    if not nvcc(os.path.join(ROOT, "tests/gpu/pair_bench.cu"), exe):
        row("overhead: build", False, "nvcc failed")
        return
    variants = {
        "bare": {},
        "shim": {"LD_PRELOAD": LIB, "OOMSHIM_DEPTH": "32"},
        "shim, stacks off": {"LD_PRELOAD": LIB, "OOMSHIM_STACKS": "off"},
    }
    got = {k: {"pair_ns_median": [], "malloc_ns_median": [], "free_ns_median": []} for k in variants}
    # Interleaved rounds, each pinned to one core, so clock and placement drift hit every
    # variant alike; the medians of the rounds are compared.
    for _ in range(5):
        for name, env in variants.items():
            p = run(["taskset", "-c", "3", exe, "31", "400"], env=env)
            for line in p.stdout.splitlines():
                k, v = line.split()
                got[name][k].append(float(v))
    missing = [f"{n} {k}" for n, m in got.items() for k, v in m.items() if not v]
    if missing:
        row("overhead: measured", False, f"no figures for {missing}")
        return
    med = {n: {k: sorted(v)[len(v) // 2] for k, v in m.items()} for n, m in got.items()}
    with open(os.path.join(OUT, "overhead.json"), "w") as f:
        json.dump(got, f)
    for v in med.values():
        # The back-to-back pair (malloc then free at once) is dominated by the driver's
        # synchronising free and too noisy to compare; the pair cost is the sum of the two calls.
        v["sum_ns"] = v["malloc_ns_median"] + v["free_ns_median"]
    for metric, label in (("malloc_ns_median", "cudaMalloc 512 B"), ("free_ns_median", "cudaFree 512 B"),
                          ("sum_ns", "cudaMalloc+cudaFree 512 B per pair")):
        b, s_, o = med["bare"][metric], med["shim"][metric], med["shim, stacks off"][metric]
        figure(f"overhead: {label}", f"shim +{s_ - b:.0f} ns ({s_ / b:.3f}x)",
               "none set (README, Overhead: +414 ns per cudaMalloc on 2026-11-29)",
               f"bare {b / 1000:.2f} us; shim {s_ / 1000:.2f} us; stacks off {o / 1000:.2f} us (+{o - b:.0f} ns)")


def check_torch_allocator():
    """Issue 4: oomshim as torch's allocator against torch's native allocator in the same run."""
    script = os.path.join(ROOT, "tests/gpu/torch_alloc.py")
    base_env = {"OOMSHIM_LIB": LIB, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OOMSHIM_MIN_INTERVAL": "0"}

    def scenario(args, env=None, timeout=300, cmd=None):
        d = tempfile.mkdtemp(prefix="alloc-", dir=OUT)
        e = dict(base_env, OOMSHIM_DIR=d, **(env or {}))
        p = run(cmd or [sys.executable, script] + args, env=e, timeout=timeout)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except Exception:
            r = {"error": (p.stderr or p.stdout)[-600:]}
        return r, d, p

    # Which C++ symbols the exception needs (informational).
    import torch
    c10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    nm = run(["nm", "-D", "--defined-only", c10]).stdout
    need = ["_ZTIN3c1016OutOfMemoryErrorE", "_ZN3c105ErrorD1Ev",
            "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"]
    # A fact, not a check: where torch does not export OutOfMemoryError's type info or ~Error
    # (torch 2.11 does not), oomshim builds the type info itself and destroys through the vtable.
    info("allocator: c10 symbols exported by torch",
         ", ".join(f"{n[:28]}..:{'yes' if n in nm else 'no'}" for n in need))

    # Speed and correctness: fresh process per mode, rounds interleaved.
    # oomshim's default in a Python program records each tensor's Python stack; "oomshim-native"
    # adds native frames (OOMSHIM_STACKS=all). Each process pinned to the same four cores.
    modes = {"native": {}, "oomshim": {}, "oomshim-native": {"OOMSHIM_STACKS": "all"}}
    res = {m: [] for m in modes}
    for rnd in range(4):
        for m, env in modes.items():
            if m == "oomshim-native" and rnd >= 2:
                continue
            r, _, p = scenario(["bench", m], env=env, timeout=400,
                               cmd=["taskset", "-c", "4-7", sys.executable, script, "bench", m])
            if "losses" not in r:
                row(f"allocator: bench {m}", False, str(r)[:300])
                return
            res[m].append(r)
    with open(os.path.join(OUT, "alloc_bench.json"), "w") as f:
        json.dump(res, f)
    nat, osh = res["native"][0], res["oomshim"][0]
    same = nat["losses"] == osh["losses"]
    first_diff = next((i for i, (a, b) in enumerate(zip(nat["losses"], osh["losses"])) if a != b), None)
    row("allocator: GPT-2-small 50 bf16 AdamW steps, losses bitwise equal to native", same,
        f"last loss native {nat['last_loss']:.6f} oomshim {osh['last_loss']:.6f}; first difference at step {first_diff}")

    def ratio(metric, mode="oomshim"):
        rs = sorted(o[metric] / n[metric] for n, o in zip(res["native"], res[mode]))
        mid = (rs[(len(rs) - 1) // 2] + rs[len(rs) // 2]) / 2
        return mid, [round(x, 3) for x in rs]

    med = lambda xs: sorted(xs)[len(xs) // 2]
    r_loop, all_loop = ratio("loop_ns")
    r_py, _ = ratio("loop_ns", "oomshim-native")
    figure("allocator: torch.empty+del loop vs native (tracing on)", f"{r_loop:.3f}x", "<= 1.15x",
        f"native {med([n['loop_ns'] for n in res['native']]):.0f} ns, oomshim {med([o['loop_ns'] for o in res['oomshim']]):.0f} ns: "
        f"{r_loop:.3f}x (rounds {all_loop}); with native stacks too (OOMSHIM_STACKS=all) {r_py:.3f}x")
    r_step, all_step = ratio("step_ms_median")
    figure("allocator: training step vs native", f"{r_step:.3f}x", "<= 1.03x",
        f"native {med([n['step_ms_median'] for n in res['native']]):.2f} ms, oomshim "
        f"{med([o['step_ms_median'] for o in res['oomshim']]):.2f} ms: {r_step:.3f}x (rounds {all_step})")
    r_res = osh["peak_reserved"] / nat["peak_reserved"]
    figure("allocator: peak reserved vs native", f"{r_res:.3f}x", "<= 1.05x",
           f"native {gib(nat['peak_reserved'])}, oomshim {gib(osh['peak_reserved'])}")
    row("allocator: torch.cuda.max_memory_reserved() answers from oomshim", osh["torch_api_agrees"] is True,
        f"torch_api_agrees {osh['torch_api_agrees']}")

    # Leak to OOM through `oomshim run --torch-allocator` (preload + hook, no code change).
    d = tempfile.mkdtemp(prefix="alloc-leak-", dir=OUT)
    p = run([CLI, "run", "--torch-allocator", "--dir", d, "--lib", LIB, "--", sys.executable, script, "leak"],
            env=dict(base_env), timeout=300)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        r = {"error": (p.stderr or p.stdout)[-600:]}
    files = dumps_in(d)
    detail = f"raised {r.get('raised')} after {r.get('tensors')} tensors; usable after: {r.get('usable_after')}"
    ok = bool(r.get("is_torch_oom")) and bool(files) and r.get("usable_after")
    if files:
        dump = load(files[-1])
        holders = dump["largest_holders"]
        lines = {f"{fr.get('file', '').split('/')[-1]}:{fr.get('line')}" for h in holders for fr in h["stack"]
                 if fr.get("kind") == "python"}
        ok = ok and all(h["api"] == "oomshim_torch_alloc" for h in holders) and any("torch_alloc.py" in l for l in lines)
        detail += (f"; dump holders {len(holders)} x {gib(holders[0]['bytes']) if holders else 0} at {sorted(lines)[:2]}; "
                   f"verdict {dump['verdict']['kind']}; free_blocks {dump['free_blocks']['source']}")
    row("allocator: leak to OOM -> catchable torch.OutOfMemoryError, dump holders are the tensors", ok, detail)
    row("allocator: the exception message", "Dump:" in r.get("message", ""), r.get("message", "")[:400])

    r, d, _ = scenario(["frag"])
    files = dumps_in(d)
    kind = load(files[-1])["verdict"]["kind"] if files else None
    fb = r.get("free_blocks", {})
    row("allocator: 1 GiB segments split by 600 MiB, 2 GiB request -> fragmentation", kind == "fragmentation"
        and r.get("raised") is not None,
        f"{r.get('segments')} segments; free {gib(fb.get('total_free_bytes', 0))}, largest {gib(fb.get('largest_free_bytes', 0))}, "
        f"fragmentation {fb.get('fragmentation')}; histogram {fb.get('histogram')}; verdict {kind}")

    r, _, _ = scenario(["streams"])
    row("allocator: record_stream keeps a block until the side stream is done", r.get("wrong_elements") == 0, str(r))
    r, _, _ = scenario(["graph"])
    row("allocator: torch.cuda.graph capture + replays match eager", r.get("captured") and r.get("max_abs_diff", 1) < 1e-3,
        str(r)[:300])
    # torch.compile(mode="reduce-overhead"): the program's outcome (stdout and exit status) in
    # allocator mode is the one it has with torch's own allocator.
    rb, _, pb = scenario(["compile", "native"], timeout=300)
    ra, _, pa = scenario(["compile"], timeout=300)
    row("allocator: torch.compile(mode='reduce-overhead') ends as with torch's allocator (stdout, exit status)",
        pa.stdout == pb.stdout and pa.returncode == pb.returncode and "ran" in rb,
        f"allocator mode: exit {pa.returncode} {str(ra)[:200]}; native: exit {pb.returncode} {str(rb)[:200]}")
    r, _, _ = scenario(["stats"])
    row("allocator: torch.cuda.memory_stats()/memory_allocated() answer under allocator mode",
        r.get("memory_allocated") == r.get("allocated_bytes.all.current") and r.get("reserved_after_empty_cache") == 0,
        str(r)[:300])


STATIC_CU = r"""
#include <cstdio>
#include <cuda_runtime.h>
int main() {
    void *p[3];
    for (int i = 0; i < 3; i++)
        if (cudaMalloc(&p[i], 64 << 20) != cudaSuccess) return 1;
    cudaMemset(p[0], 1, 64 << 20);
    unsigned char h = 0;
    cudaMemcpy(&h, p[0], 1, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 3; i++) cudaFree(p[i]);
    printf("ok %d\n", h);
    return 0;
}
"""


def check_soak():
    """Issue 8: 8 threads of torch ops + caught OOMs, a fork and a static-cudart client mid-run;
    bare vs under the shim."""
    src = os.path.join(WORK, "static_client.cu")
    with open(src, "w") as f:
        f.write(STATIC_CU)
    exe = os.path.join(WORK, "static_client")
    if run(["nvcc", "-O2", "-o", exe, src]).returncode != 0:  # nvcc's default: static cudart
        row("soak: build the static-cudart client", False, "nvcc failed")
        return
    iters = os.environ.get("OOMSHIM_SOAK_ITERS", "12000")
    script = os.path.join(ROOT, "tests/gpu/soak.py")
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    res = {}
    for mode in ("bare", "shim"):
        d = tempfile.mkdtemp(prefix=f"soak-{mode}-", dir=OUT)
        cmd = [sys.executable, script, iters, exe]
        env["OOMSHIM_TOP"] = "100000"
        if mode == "shim":
            cmd = [CLI, "run", "--dir", d, "--lib", LIB, "--"] + cmd
        p = run(cmd, env=dict(env, OOMSHIM_DIR=d), timeout=500)
        try:
            res[mode] = json.loads(p.stdout.strip().splitlines()[-1])
        except Exception:
            row(f"soak: {mode} run", False, (p.stderr or p.stdout)[-400:])
            return
    b, s_ = res["bare"], res["shim"]
    row("soak: 8 threads x torch ops + caught OOMs, results identical to bare", b["digests"] == s_["digests"]
        and b["ooms"] == s_["ooms"] and s_["ooms"] > 0,
        f"{iters} iterations/thread; bare {b['seconds']:.0f} s, shim {s_['seconds']:.0f} s; OOMs caught {s_['ooms']} "
        f"(bare {b['ooms']}); shim saw {s_.get('shim_ooms')} failed cudaMalloc calls")
    row("soak: fork mid-run (child loads libraries, no CUDA) and a static-cudart client",
        s_["fork_child"] == 0 and s_["static_rc"] == 0 and s_["static_out"] == b["static_out"],
        f"fork child exit {s_['fork_child']}; static client rc {s_['static_rc']} {s_['static_out']!r} (bare {b['static_out']!r})")
    row("soak: ledger at the end = torch's reserved bytes + cuBLAS's own workspaces", s_.get("holders_complete")
        and s_.get("torch_segments") == s_.get("reserved")
        and s_.get("tracked") == s_.get("torch_segments", 0) + s_.get("cublas_own", 0) and s_.get("unknown_frees") == 0,
        f"tracked {s_.get('tracked')} = torch's segments {s_.get('torch_segments')} (torch reserved {s_.get('reserved')}) "
        f"+ cuBLAS's own {s_.get('cublas_own')}; unknown frees {s_.get('unknown_frees')}")


def check_zoo():
    """Issue 12: the OOM zoo (tests/gpu/zoo), every program bare and under each launcher, scored.
    Its own table goes to OUT/zoo.log; here, one row per launcher and per failing run."""
    budget = int(os.environ.get("OOMSHIM_ZOO_SECONDS", "470"))
    env = {"ZOO_WORK": os.path.join(WORK, "zoo"), "OOMSHIM_GPU_LIB": LIB, "OOMSHIM_GPU_CLI": CLI}
    only = [c for c in os.environ.get("OOMSHIM_ZOO_CASES", "").split(",") if c]
    results = os.path.join(OUT, "zoo.jsonl")
    if os.path.exists(results):
        os.remove(results)  # this run's rows only (run_zoo.py starts the file afresh too)
    p = run([sys.executable, os.path.join(ROOT, "tests/gpu/zoo/run_zoo.py"), OUT] + only, env=env, timeout=budget)
    with open(os.path.join(OUT, "zoo.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    try:
        with open(results) as f:
            written = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError) as e:
        row("zoo: results written", False, f"{results}: {e}; run_zoo exit {p.returncode}: {(p.stderr or p.stdout)[-400:]}")
        return
    sys.path.insert(0, os.path.join(ROOT, "tests/gpu/zoo"))
    import run_zoo
    try:
        expected = run_zoo.expected_runs(only)
    except ValueError as e:
        row("zoo: launchers", False, str(e))
        return
    for check, ok, detail in zoo_rows(written, expected, p.returncode):
        row(check, ok, detail)


def zoo_rows(written, expected, returncode):
    """Rows for the zoo's results: a failed build, each run that fell short of what its row
    promises (run_zoo.py's `ok`: output unchanged, the dumps, the verdict, the EXPECT-LINE line
    named, stderr = report), each expected run with no result (the zoo ran out of its time),
    then one summary per launcher."""
    out = []
    for r in written:
        if r.get("launcher") == "build":
            out.append((f"zoo {r['case']}: build", False, f"exit {r.get('rc')}: {r.get('stderr', '')[-300:]}"))
    scored = [r for r in written if r.get("launcher") not in ("bare", "build")]
    built_failed = {r["case"] for r in written if r.get("launcher") == "build"}
    got = {(r["case"], r["launcher"]) for r in scored}
    missing = [(c, l) for c, l in expected if (c, l) not in got and c not in built_failed]
    for case, launcher in missing:
        out.append((f"zoo {case} ({launcher})", False, "no result (the zoo stopped before this run)"))
    by = {}
    for r in scored:
        by.setdefault(r["launcher"], []).append(r)
        if r.get("skipped"):
            # Never a pass: a program that could not run on this machine proves nothing.
            out.append((f"zoo {r['case']} ({r['launcher']})", False, f"not run: {r['skipped']} missing on this machine"))
        elif not r.get("ok"):
            broken = r.get("broken") or []
            out.append((f"zoo {r['case']} ({r['launcher']})", False,
                        (f"broken: {', '.join(map(str, broken))}; " if broken else "")
                        + f"out {r.get('output_unchanged')}, dumps {r.get('stood')}/{r.get('dumps')}, verdict {r.get('verdicts')}, "
                        f"line {r.get('line_ok')} (want {r.get('line')}), agree {r.get('agree')}: {r.get('headline', '')[:160]}"))
    for launcher, rs in by.items():
        n = len(rs)
        pct = lambda k: 100 * sum(1 for r in rs if r.get(k)) // n
        line = [r for r in rs if r.get("line_ok") is not None]
        out.append((f"zoo under {launcher}: {n} programs", all(r.get("ok") for r in rs),
                    f"all as promised {pct('ok')}%: output unchanged {pct('output_unchanged')}%, dumps {pct('dump_ok')}%, "
                    f"verdict right {pct('verdict_ok')}%, line named {100 * sum(1 for r in line if r['line_ok']) // max(len(line), 1)}% "
                    f"of {len(line)}, stderr = report {pct('agree')}%"))
    if not scored and not out:
        out.append(("zoo: results", False, f"no scored run (run_zoo exit {returncode})"))
    elif returncode not in (0, 1):
        out.append(("zoo: run_zoo.py finished", False, f"exit {returncode} (124: out of its time budget)"))
    return out


def check_views():
    """Issue 13: memory_viz pickles against torch's own viewer, and the wheel installed."""
    sys.path.insert(0, os.path.join(ROOT, "tests/gpu"))
    import check_memory_viz
    import check_wheel
    for mod in (check_memory_viz, check_wheel):
        for check, ok, detail in mod.main(ROOT, LIB, CLI, WORK):
            row(check, ok, detail)


def check_perf_table():
    """Issue 16: one table of the shim's cost with in-process A/B ratios where possible
    (tests/gpu/perf_table.py): preload with every tensor a cudaMalloc by recording mode,
    allocator mode by mode, the GPT-2-small bf16 AdamW step in every launcher, allocator mode
    and preload against torch native over short interleaved processes (minima and medians), peak
    reserved, dump time at 100k and 1M live tensors, host memory per live tensor."""
    script = os.path.join(ROOT, "tests/gpu/perf_table.py")
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    pre = {"LD_PRELOAD": LIB, "OOMSHIM_DIR": os.path.join(OUT, "perf")}
    alloc = {"OOMSHIM_LIB": LIB, "OOMSHIM_DIR": os.path.join(OUT, "perf")}
    table = []
    results = []

    def case(args, env, timeout, cmd=None, pin="2-5"):
        p = run(cmd or (["taskset", "-c", pin, sys.executable, script] + args), env=env, timeout=timeout)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except Exception:
            r = {"error": (p.stderr or p.stdout)[-300:]}
        results.append({"args": args, "env": {k: v for k, v in env.items() if k != "LD_PRELOAD"}, "result": r})
        with open(os.path.join(OUT, "perf_table.json"), "w") as f:
            json.dump(results, f, indent=1)
        return r

    def ab_rows(label, r, unit_key, unit):
        if "modes" not in r:
            table.append((label, "no result", r.get("error", "")[-200:]))
            return
        for m, v in r["modes"].items():
            table.append((f"{label}, {m} / pass-through (in-process)",
                          f"{v['median']:.3f}x", f"range {v['min']:.3f}-{v['max']:.3f}, n={v['n']}; "
                          f"pass-through {r[unit_key]:.2f} {unit}"))

    # Preload, every tensor a cudaMalloc, and with torch's cache; allocator mode; by mode.
    ab_rows("loop torch.empty+del, preload, no caching",
            case(["ab_loop", "preload"], dict(pre, **nocache), 120), "us_per_iter_pass_through", "us/iter")
    ab_rows("loop torch.empty+del, preload, caching",
            case(["ab_loop", "preload"], pre, 120), "us_per_iter_pass_through", "us/iter")
    ab_rows("loop torch.empty+del, allocator mode",
            case(["ab_loop", "allocator"], alloc, 120), "us_per_iter_pass_through", "us/iter")
    # The training step in every launcher.
    launchers = [
        ("LD_PRELOAD", ["ab_train", "preload"], pre, None),
        ("oomshim run", ["ab_train", "preload"], {"OOMSHIM_DIR": os.path.join(OUT, "perf")},
         [CLI, "run", "--lib", LIB, "--", sys.executable, script, "ab_train", "preload"]),
        ("allocator mode (enable())", ["ab_train", "allocator"], alloc, None),
        ("oomshim run --torch-allocator", ["ab_train", "preload"], {"OOMSHIM_DIR": os.path.join(OUT, "perf")},
         [CLI, "run", "--torch-allocator", "--lib", LIB, "--", sys.executable, script, "ab_train", "preload"]),
    ]
    for name, args, env, cmd in launchers:
        ab_rows(f"GPT-2-small bf16 AdamW step, {name}", case(args, env, 240, cmd=cmd),
                "ms_per_step_pass_through", "ms/step")
    # Against torch's own allocator: separate processes, short and interleaved.
    sep_modes = {"native": {}, "preload": dict(pre), "allocator": dict(alloc)}
    sep = {m: [] for m in sep_modes}
    for _ in range(int(os.environ.get("PERF_SEP_ROUNDS", "3"))):
        for m, env in sep_modes.items():
            r = case(["sep"], dict(env, PERF_SEP_MODE=m), 150)
            if "loop_us" in r:
                sep[m].append(r)
    if sep["native"]:
        nat = sep["native"]
        for m in ("preload", "allocator"):
            if not sep[m]:
                table.append((f"{m} vs torch native (separate processes)", "no result", ""))
                continue
            for key, what in (("loop_us", "loop torch.empty+del"), ("step_ms", "GPT-2-small step"),
                              ("peak_reserved", "peak reserved")):
                a = [r[key] for r in sep[m]]
                b = [r[key] for r in nat]
                table.append((f"{what}, {m} / torch native (separate processes)",
                              f"{min(a) / min(b):.3f}x by minima", f"{median(a) / median(b):.3f}x by medians, "
                              f"{len(a)}+{len(b)} processes"))
    # Dump time and host memory per live allocation (every tensor a cudaMalloc).
    r = case(["dump"], dict(pre, **nocache), 240)
    secs = r.get("seconds", {})
    for n in ("100000", "1000000"):
        v = secs.get(n)
        table.append((f"dump of {int(n):,} live tensors (oomshim.dump, 1 site)",
                      f"{v:.2f} s" if v is not None else "no result", r.get("error", "")[-200:]))
    grown = {}
    for m in ("pass-through", "all"):
        r = case(["rss", m], dict(pre, **nocache), 240)
        grown[m] = r.get("grown_kib")
    if None not in grown.values():
        table.append(("host memory per live tensor, shim all - pass-through (1M tensors)",
                      f"{(grown['all'] - grown['pass-through']) * 1024 / 1e6:.0f} bytes",
                      f"grown {grown['all']} KiB with all, {grown['pass-through']} KiB with pass-through"))
    print("\n| perf | figure | detail |\n|---|---|---|")
    for a, b, c in table:
        print(f"| {a} | {b} | {c} |", flush=True)
    row("perf table", all(b != "no result" for _, b, _ in table),
        f"{len(table)} rows; see the perf table above and {os.path.join(OUT, 'perf_table.json')}")


def check_flight_recorder():
    """Issue 15: a PyTorch training loop killed with SIGKILL under oomshim run leaves a post-mortem
    dump naming its leaking line; publishing the live summary costs at most 1% of a training step
    (oomshim run with OOMSHIM_LIVE=0 against the default, fresh processes, rounds interleaved)."""
    import signal
    import statistics
    import time
    # A directory of its own: allocator mode reads the script's directory before it swaps the
    # allocator, and tests/gpu holds programs that name CUDA graphs and MemPool (it would fall
    # back to torch's allocator, as it says on stderr, and the row would test preload twice).
    alone = os.path.join(WORK, "flight-program")
    os.makedirs(alone, exist_ok=True)
    script = os.path.join(alone, "flight_train.py")
    shutil.copy(os.path.join(ROOT, "tests/gpu/flight_train.py"), script)
    leak_line = next(i for i, l in enumerate(open(script), 1) if "LEAK_LINE" in l)
    d = os.path.join(WORK, "flight-dumps")
    live = os.path.join(WORK, "flight-live")
    env = dict(os.environ, OOMSHIM_LIVE_DIR=live)
    detail = {}
    # The row's promise under both launchers: a post-mortem of the SIGKILL naming the leak's line.
    for launcher, extra in (("preload", []), ("torch-allocator", ["--torch-allocator"])):
        d = os.path.join(WORK, f"flight-dumps-{launcher}")
        p = subprocess.Popen([CLI, "run", *extra, "--dir", d, "--lib", LIB, "--", sys.executable, script, "leak"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 120
            line = ""
            while "ready" not in line and time.time() < deadline:
                line = p.stdout.readline()
                if not line and p.poll() is not None:
                    break
            time.sleep(3)  # a few publishes after step 30
            regions = sorted((f for f in os.listdir(live) if f.endswith(".live")),
                             key=lambda f: os.path.getmtime(os.path.join(live, f))) if os.path.isdir(live) else []
            top = run([CLI, "top", "--once", "--dir", live], timeout=30).stdout
            # PIDNS-PID-STARTTICKS.live: the pid is the second field from the end.
            pid = int(regions[-1].split("-")[-2]) if regions else None
            if pid:
                os.kill(pid, signal.SIGKILL)
            _, err = p.communicate(timeout=60)
        except Exception as e:
            p.kill()
            _, err = p.communicate()
            detail[f"{launcher}_error"] = f"{type(e).__name__}: {e}"
            pid, top = None, ""
        dumps = [load(x) for x in dumps_in(d)] if os.path.isdir(d) else []
        pm = [x for x in dumps if x.get("reason") == "post_mortem"]
        for i, x in enumerate(pm):  # kept whole: which site grew, with its stacks
            with open(os.path.join(OUT, f"flight-{launcher}-post-mortem-{i}.json"), "w") as f:
                json.dump(x, f)
        findings = pm[0]["verdict"].get("findings", []) if pm else []
        headline = findings[0]["headline"] if findings else ""
        want = f"flight_train.py:{leak_line}"
        leak = [f for f in findings if f["kind"] == "leak"]
        named = any(want in f["headline"] for f in leak)
        ok = (len(pm) == 1 and pm[0]["post_mortem"]["signal_name"] == "SIGKILL" and bool(leak)
              and headline in err and p.returncode == -signal.SIGKILL and named)
        detail[launcher] = dict(pid=pid, returncode=p.returncode, dumps=len(dumps), headline=headline,
                                stderr_tail=err[-2000:], top=top[-2000:])
        row(f"check_flight_recorder: SIGKILLed training loop ({launcher})", ok,
            f"post-mortem {'names ' + want if named else 'does not name ' + want}: {headline[:300]}")

    # Cost: median training step, publishing off against on, 3 interleaved rounds of fresh processes.
    rounds = {"off": [], "on": []}
    for _ in range(3):
        for mode in ("off", "on"):
            q = run([CLI, "run", "--dir", d, "--lib", LIB, "--", sys.executable, script, "bench", "300"],
                    env=dict(env, OOMSHIM_LIVE="0" if mode == "off" else "1"), timeout=300)
            try:
                rounds[mode].append(statistics.median(json.loads(q.stdout.strip().splitlines()[-1])))
            except Exception:
                rounds[mode].append(float("nan"))
    off, on = statistics.median(rounds["off"]), statistics.median(rounds["on"])
    ratio = on / off if off else float("nan")
    detail.update(step_ms=rounds, ratio=ratio)
    if any(x != x for x in rounds["off"] + rounds["on"]):  # NaN: a bench run gave no figure
        row("check_flight_recorder: step cost of publishing measured", False, f"rounds {rounds}")
    else:
        figure("check_flight_recorder: step cost of publishing", f"{ratio:.4f}x", "<= 1.01x",
               f"median step {off:.3f} ms off, {on:.3f} ms on (rounds {rounds})")
    with open(os.path.join(OUT, "flight_recorder.json"), "w") as f:
        json.dump(detail, f, indent=1)


def check_torchrun_worker_killed():
    """Issue 25 item 14: under `oomshim run -- torchrun`, a worker that is SIGKILLed is reaped by
    torchrun's agent (alive), never by oomshim; it still gets a post-mortem naming it (rank,
    pid), how it ended (SIGKILL read from the zombie, or "not known" when torchrun reaped it
    first) and its leak's line."""
    import signal
    script = os.path.join(ROOT, "tests/gpu/flight_train.py")
    leak_line = next(i for i, l in enumerate(open(script), 1) if "LEAK_LINE" in l)
    d = os.path.join(WORK, "torchrun-killed-dumps")
    live = os.path.join(WORK, "torchrun-killed-live")
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    p = run([CLI, "run", "--dir", d, "--lib", LIB, "--", torchrun, "--nproc_per_node=2", "--master_port=29541",
             "--max-restarts=0", script, "rank-killed"], env={"OOMSHIM_LIVE_DIR": live}, timeout=240)
    dumps = [load(x) for x in dumps_in(d)] if os.path.isdir(d) else []
    pm = [x for x in dumps if x.get("reason") == "post_mortem"]
    r1 = [x for x in pm if x["process"].get("rank") == 1]
    left = [f for f in os.listdir(live) if f.endswith(".live")] if os.path.isdir(live) else []
    detail = ""
    ok = False
    if r1:
        x = r1[0]
        info_ = x["post_mortem"]
        findings = x["verdict"].get("findings", [])
        headline = findings[0]["headline"] if findings else ""
        named = any(f"flight_train.py:{leak_line}" in f["headline"] for f in findings if f["kind"] == "leak")
        how = info_.get("signal_name") or ("not known" if info_.get("exit_code") is None else f"exit {info_['exit_code']}")
        ok = (len(r1) == 1 and info_.get("signal") in (signal.SIGKILL, None) and info_.get("exit_code") is None
              and headline in p.stderr and not left)
        detail = (f"rank 1 pid {x['process']['pid']}: {how}, reaped_by {info_.get('reaped_by')}; "
                  f"leak line {'named' if named else 'NOT named'}; regions left {len(left)}; {headline[:200]}")
    else:
        detail = f"no post-mortem of rank 1 ({len(pm)} post-mortems, {len(dumps)} dumps); stderr: {p.stderr[-400:]}"
    with open(os.path.join(OUT, "torchrun_killed.txt"), "w") as f:
        f.write(p.stdout[-3000:] + "\n--- stderr ---\n" + p.stderr[-6000:] + "\n" +
                "\n".join(json.dumps(x.get("post_mortem"), default=str)[:2000] for x in pm))
    row("check_torchrun_worker_killed: post-mortem of a worker torchrun reaped", ok,
        f"job exit {p.returncode}; {detail}")


def check_multiprocessing_exit():
    """Issue 25 item 14: CUDA workers of a spawn pool under `oomshim run`, reaped by their living
    parent: the one that ends with os._exit(0) gets no post-mortem (the shim's `_exit` removes
    its region), the SIGKILLed one gets one naming SIGKILL and its parent."""
    d = os.path.join(WORK, "mp-exit-dumps")
    p = run([CLI, "run", "--lib", LIB, "--dir", d, "--", sys.executable, os.path.join(ROOT, "tests/gpu/mp_exit.py")],
            timeout=120)
    dumps = [load(x) for x in dumps_in(d)] if os.path.isdir(d) else []
    line = next((l for l in p.stdout.splitlines() if l.startswith("exitcodes")), "")
    try:
        pids = json.loads(line.split("pids", 1)[1].strip()) if line else []
    except ValueError:
        pids = []
    pm = [(x["process"]["pid"], (x.get("post_mortem") or {}).get("signal_name"),
           (x.get("post_mortem") or {}).get("reaped_by")) for x in dumps if x.get("reason") == "post_mortem"]
    ok = (len(pids) == 2 and len(pm) == 1 and pm[0][0] == pids[1] and pm[0][1] in ("SIGKILL", None)
          and pm[0][2] is not None and p.returncode == 0)
    row("check_multiprocessing_exit: os._exit worker no post-mortem, SIGKILLed worker one", ok,
        f"{line}; post-mortems (pid, signal, reaped_by): {pm}; exit {p.returncode}")


def check_exporter():
    """Issue 18: `oomshim exporter` on a real PyTorch training loop: --once and an HTTP scrape of
    loopback both give the process's tracked bytes (at most what NVML says the process uses, at
    least the 30 x 16 MiB it leaked), its steps, and a strictly formed exposition."""
    import re
    import signal
    import time
    import urllib.request
    script = os.path.join(ROOT, "tests/gpu/flight_train.py")
    live = os.path.join(WORK, "exporter-live")
    env = dict(os.environ, OOMSHIM_LIVE_DIR=live)
    p = subprocess.Popen(["timeout", "200", CLI, "run", "--dir", os.path.join(WORK, "exporter-dumps"),
                          "--lib", LIB, "--", sys.executable, script, "leak"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    detail = {}
    server = None
    try:
        deadline = time.time() + 150
        line = ""
        while "ready" not in line and time.time() < deadline:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
        time.sleep(2)  # a few publishes after step 30
        once = run([CLI, "exporter", "--once", "--dir", live], timeout=30)
        server = subprocess.Popen([CLI, "exporter", "--listen", "127.0.0.1:0", "--dir", live],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        said = server.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", said).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            ctype, body = r.headers.get("Content-Type", ""), r.read().decode()
        smi = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                  timeout=30).stdout
        smi_uuids = {u.strip() for u in run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                                            timeout=30).stdout.splitlines() if u.strip()}
    finally:
        if server:
            server.kill()
        os.killpg(p.pid, signal.SIGKILL)  # the group started above: timeout, oomshim run, python
        p.communicate(timeout=60)
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*\})? (\S+)$')
    def parse(text):
        declared, out, bad = set(), [], []
        for l in text.splitlines():
            if l.startswith("# HELP ") or l.startswith("# TYPE "):
                declared.add((l[2:6], l.split(" ")[2]))
                continue
            m = sample.match(l)
            if not m or ("HELP", m.group(1)) not in declared or ("TYPE", m.group(1)) not in declared:
                bad.append(l)
                continue
            out.append((m.group(1), dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or "")),
                        float(m.group(3))))
        return out, bad
    samples, bad = parse(body)
    samples_once, bad_once = parse(once.stdout)
    usage = [(l, v) for n, l, v in samples if n == "hw_gpu_memory_usage_bytes"]
    pids = {int(l["pid"]) for l, _ in usage}
    nvml = {}
    for l in smi.splitlines():
        try:
            a, b = [x.strip() for x in l.split(",")]
            nvml[int(a)] = int(b) << 20
        except ValueError:
            pass
    pid = next(iter(pids), None)
    tracked = sum(v for l, v in usage if int(l["pid"]) == pid)
    steps = [v for n, l, v in samples if n == "oomshim_steps_total" and int(l["pid"]) == pid]
    uuids = sorted({l.get("gpu_uuid", "") for l, _ in usage})
    # flight_train.py says "ready" after 30 marked steps; the exporter counts them. The GPU is
    # named by the UUID nvidia-smi gives it.
    steps_ok = len(steps) == 1 and steps[0] >= 30
    uuid_ok = len(uuids) == 1 and uuids[0] in smi_uuids
    ok = (len(pids) == 1 and not bad and not bad_once and "version=0.0.4" in ctype
          and tracked >= 30 * (16 << 20) and (pid not in nvml or tracked <= nvml[pid])
          and any(n == "hw_gpu_memory_usage_bytes" for n, _, _ in samples_once)
          and steps_ok and uuid_ok)
    detail.update(pid=pid, tracked=tracked, nvml=nvml.get(pid), steps=steps, uuids=uuids, smi_uuids=sorted(smi_uuids),
                  bad=bad[:5] + bad_once[:5], content_type=ctype, body=body[-4000:])
    row("check_exporter: Prometheus scrape of a PyTorch loop", ok,
        f"pid {pid}: tracked {gib(tracked)} (NVML {gib(nvml[pid]) if pid in nvml else 'n/a'}), "
        f"steps {steps} (>= 30: {steps_ok}), gpu_uuid {uuids} (nvidia-smi's: {uuid_ok}), {len(samples)} samples, {len(bad) + len(bad_once)} malformed lines")
    with open(os.path.join(OUT, "exporter.json"), "w") as f:
        json.dump(detail, f, indent=1)


def extra_check_allocator_matrix():
    """tests/gpu/check_allocator_matrix.py, when present: `main(root, lib, cli, out_dir)` returning
    (check, ok, detail) rows, like check_memory_viz.py and check_wheel.py."""
    path = os.path.join(ROOT, "tests/gpu/check_allocator_matrix.py")
    if not os.path.exists(path):
        return absent(path)
    sys.path.insert(0, os.path.join(ROOT, "tests/gpu"))
    import check_allocator_matrix
    d = os.path.join(OUT, "allocator-matrix")
    os.makedirs(d, exist_ok=True)
    got = list(check_allocator_matrix.main(ROOT, LIB, CLI, d) or [])
    if not got:
        row("check_allocator_matrix", False, "returned no rows")
    for check, ok, detail in got:
        row(check, ok, detail)


def extra_check_kinds():
    """tests/gpu/zoo/check_kinds.py, when present: run as `python3 check_kinds.py ZOO_RUNS`, the
    folder with each zoo run's dumps, stdout.txt and stderr.txt (ZOO_RUNS/CASE/LAUNCHER/), after
    check_zoo; its exit status is the row, its output goes to OUT/check_kinds.log."""
    path = os.path.join(ROOT, "tests/gpu/zoo/check_kinds.py")
    if not os.path.exists(path):
        return absent(path)
    runs = os.path.join(WORK, "zoo")
    if not os.path.isdir(runs):
        row("check_kinds", False, f"no zoo runs under {runs}: check_zoo must run first")
        return
    p = run([sys.executable, path, runs], timeout=300)
    with open(os.path.join(OUT, "check_kinds.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    row("check_kinds: every dump's kinds within 5% of each zoo program's own account", p.returncode == 0,
        f"exit {p.returncode}; {(p.stdout.strip().splitlines() or [''])[-1][:200]}")


def check_allocator_costs():
    """Issue 26, item 3: allocator mode's cost against torch native and torch's recorder
    in one process (tests/gpu/allocator_ab.py, about 3 minutes) and split by recording mode in one
    process (tests/gpu/allocator_modes.py, about 60 s). Figures against their goals; a script
    that printed no figures is a failed row. Their own output goes to OUT/allocator_costs.log."""
    log = []
    for name in ("allocator_ab.py", "allocator_modes.py"):
        # allocator_ab stops its rounds by itself before the timeout, so that what it measured is
        # printed (a killed run prints nothing).
        env = {"OOMSHIM_LIB": LIB, "AB_SECONDS": "230"}
        p = run([sys.executable, os.path.join(ROOT, "tests/gpu", name)], env=env, timeout=280)
        log.append(f"$ {name} (exit {p.returncode})\n{p.stdout}{p.stderr}")
        for check, value, goal, detail in allocator_cost_figures(name, p.stdout):
            if value is None:
                row(check, False, detail)
            else:
                figure(check, value, goal, detail)
    p = serve_ab()
    log.append(f"$ serve_ab (exit {p.returncode})\n{p.stdout}{p.stderr}")
    for check, value, goal, detail in allocator_cost_figures("serve_ab", p.stdout):
        if value is None:
            row(check, False, detail)
        else:
            figure(check, value, goal, detail)
    with open(os.path.join(OUT, "allocator_costs.log"), "w") as f:
        f.write("\n".join(log))


def serve_ab():
    """Builds tests/gpu/serve_ab.cpp against this machine's torch (its headers and libraries; about
    30 s) and runs it: torch's native allocator and allocator mode's serving path in one process."""
    import torch
    import torch.utils.cpp_extension as ce
    try:
        includes = ce.include_paths("cuda")
    except TypeError:  # torch before 2.6
        includes = ce.include_paths(cuda=True)
    libs = ce.library_paths()
    nvcc = shutil.which("nvcc")
    if nvcc:
        cuda_lib = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "lib64")
        libs = libs + [cuda_lib]
        includes = includes + [os.path.join(os.path.dirname(cuda_lib), "include")]
    exe = os.path.join(tempfile.mkdtemp(prefix="serve-ab-"), "serve_ab")
    cmd = (["g++", "-O2", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            os.path.join(ROOT, "tests/gpu/serve_ab.cpp"), "-o", exe]
           + [f"-I{i}" for i in includes] + [f"-L{d}" for d in libs] + [f"-Wl,-rpath,{d}" for d in libs]
           + ["-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda", "-lc10", "-lcudart", "-ldl"])
    built = run(cmd, timeout=150)
    if built.returncode != 0:
        return subprocess.CompletedProcess(cmd, built.returncode, "", "serve_ab did not build:\n" + built.stderr[-2000:])
    return run([exe, LIB, "15"], timeout=150)


def allocator_cost_figures(name, stdout):
    """(check, value or None, goal, detail) from the JSON line a cost script prints last."""
    last = next((l for l in reversed(stdout.strip().splitlines()) if l.startswith("{")), "")
    try:
        d = json.loads(last)
    except ValueError:
        return [(f"allocator costs: {name}", None, "", f"no figures printed: {stdout[-300:]!r}")]
    if name == "allocator_ab.py":
        out = []
        for case, goal in (("loop", 1.05), ("step", 1.01)):
            a, r = d.get(f"{case}_allocator"), d.get(f"{case}_recorder")
            if not a or not r:
                out.append((f"allocator mode / native, {case}", None, "", f"missing in {last[:200]}"))
                continue
            pt = d.get(f"{case}_pass_through") or {"median": float("nan")}
            out.append((f"allocator mode / native, {case}, one process", f"{a['median']:.3f}x", f"<= {goal}x",
                        f"95% interval +-{a.get('ci95_pct', float('nan')):.1f}% (goal: under 2%), range "
                        f"{a['min']:.2f}-{a['max']:.2f}; recording nothing {pt['median']:.3f}x; "
                        f"torch's recorder {r['median']:.3f}x"))
        return out
    if name == "serve_ab":
        if "allocator_totals" not in d:
            return [("allocator mode serving / native, one process", None, "", f"missing in {last[:200]}")]
        t, pt, dt = d["allocator_totals"], d["allocator_pass_through"], d["direct_totals"]
        return [("allocator mode serving / native, one process, ns a tensor (alloc+free)",
                 f"{t['ns']:.0f} ns / {d['native_ns']:.0f} ns = {t['over_native']:.3f}x", "(profile: part of <= 1.01x a step)",
                 f"middle half {t['q1']:.3f}-{t['q3']:.3f}; recording nothing {pt['ns']:.0f} ns; "
                 f"oomshim's entry points without torch's wrapper {dt['ns']:.0f} ns; cudaStreamGetCaptureInfo "
                 f"{d['capture_info_ns']:.0f} ns, cudaGetDevice {d['get_device_ns']:.0f} ns a call")]
    if "python_over_pass_through" not in d:
        return [("allocator mode: recording cost on a step", None, "", f"missing in {last[:200]}")]
    return [("allocator mode: Python stacks over recording nothing, one process, a training step",
             f"{d['python_over_pass_through']:.3f}x", "(part of <= 1.01x over native)",
             f"without the code watcher {d.get('python_unwatched_over_pass_through', 0):.3f}x (watcher registered: "
             f"{d.get('code_watcher')}); a tensor from 37 Python frames: its stack {d.get('loop_python_stack_ns_unwatched', 0):.0f} ns "
             f"without the watcher, {d.get('loop_python_stack_ns_watched', 0):.0f} ns with it (of "
             f"{d.get('loop_pass_through_ns', 0):.0f} ns recording nothing); all stacks {d['all_over_pass_through']:.3f}x, totals {d['totals_over_pass_through']:.3f}x; "
             f"{d.get('allocations_per_step', 0):.0f} allocations a step; allocator recording nothing "
             f"{d['pass_through_step_ms']:.1f} ms a step, torch native {d.get('native_step_ms', 0):.1f} ms (other process)")]


ROW_LINE = re.compile(r"^\[(PASS|FAIL|INFO|FIGURE)\] ([^:]*): ?(.*)$")


def script_check(script, extra=(), timeout=300, env=None):
    """Runs a standalone check script (`python3 tests/gpu/<script> OUT_DIR`, the build under test in
    OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI) and takes its `[PASS]`/`[FAIL]`/`[INFO]`/`[FIGURE]` lines as
    rows of this table. A script that ran out of time keeps the rows it printed and adds a failed
    one; a script that printed no row at all is a failed row. Its whole output goes to
    OUT/<script>.log."""
    name = os.path.splitext(os.path.basename(script))[0]
    out_dir = os.path.join(OUT, name)
    os.makedirs(out_dir, exist_ok=True)
    e = {"OOMSHIM_GPU_LIB": LIB, "OOMSHIM_GPU_CLI": CLI}
    e.update(env or {})
    p = run([sys.executable, os.path.join(ROOT, "tests/gpu", script), out_dir] + list(extra), env=e, timeout=timeout)
    with open(os.path.join(OUT, f"{name}.log"), "w") as f:
        f.write(f"$ {script} (exit {p.returncode})\n{p.stdout}\n{p.stderr}")
    seen = 0
    for line in p.stdout.splitlines():
        m = ROW_LINE.match(line.strip())
        if not m:
            continue
        seen += 1
        status, check, detail = m.groups()
        check = f"{name}: {check}"
        if status == "INFO":
            info(check, detail)
        elif status == "FIGURE":
            value, _, rest = detail.partition(" vs goal ")
            goal, _, more = rest.partition(";")
            figure(check, value.strip(), goal.strip() or "?", more.strip())
        else:
            row(check, status == "PASS", detail)
    if p.returncode == 124:
        row(f"{name}: finished", False, f"out of its {timeout} s budget after {seen} rows")
    elif not seen:
        row(f"{name}: printed its rows", False, f"exit {p.returncode}, no row: {(p.stdout + p.stderr)[-300:]!r}")


def check_hook_same():
    """The Python hook changes nothing: an OOM-retry loop and torch.compile under fail_on_recompile,
    bare against LD_PRELOAD, `oomshim run` and `oomshim run --torch-allocator` (about 3 min)."""
    script_check("check_hook_same.py", timeout=330)


def check_flight_early():
    """Post-mortems of a model load killed after 0.3 s and a slow leak killed after 15 s (about 40 s)."""
    script_check("check_flight_early.py", timeout=150)


def check_torchrun_rank():
    """torchrun's root cause, the termination message and merge name the rank that ran out (about 1 min)."""
    script_check("check_torchrun_rank.py", timeout=240)


def check_kinds_counts():
    """Memory by kind counts every model (40 models), names four copies by the model and calls
    48 identical blocks no copy, under every launcher (about 3 min)."""
    script_check("check_kinds_counts.py", timeout=330)


def check_one_story():
    """One story per failure with real torch: recovered, raised, back to back, a smaller retry,
    under every launcher (about 3 min)."""
    script_check("check_one_story.py", timeout=330)


def check_allocator_choice():
    """Allocator mode decided by what the program imports: an unused sibling keeps it on, an
    imported module asking for CUDA graphs turns it off naming its line (about 1 min)."""
    script_check("check_allocator_choice.py", timeout=240)


def check_readme_excerpt():
    """What a PyTorch user sees at an OOM under both launchers, and the README's excerpt (about 2 min)."""
    script_check("check_readme_excerpt.py", timeout=330)


def absent(path):
    """An extra check file that is not there: fails when asked for by name, is said otherwise."""
    name = os.path.splitext(os.path.basename(path))[0]
    if name in requested():
        row(name, False, f"{path} is missing")
    else:
        info(name, f"{path} not present: not run")


def requested():
    """OOMSHIM_GPU_CHECKS=check_torch,check_overhead runs a subset (names of the check functions,
    or check_allocator_matrix / check_kinds for the extra files)."""
    return [c for c in os.environ.get("OOMSHIM_GPU_CHECKS", "").split(",") if c]


def final_table():
    """The table printed last: assertions PASS/FAIL, figures as `figure vs goal`, facts INFO."""
    lines = ["| check | result | detail |", "|---|---|---|"]
    for c, r, d, _ in rows:
        lines.append(f"| {c} | {r} | {d} |")
    n_pass = sum(1 for _, r, _, a in rows if a and r == "PASS")
    n_fail = sum(1 for _, r, _, a in rows if a and r != "PASS")
    n_fig = sum(1 for _, r, _, a in rows if not a and r != "INFO")
    lines.append("")
    lines.append(f"{n_pass} passed, {n_fail} failed; {n_fig} figures against their goals (not pass/fail)")
    return "\n".join(lines)


def main():
    for f in (LIB, CLI):
        if not os.path.exists(f):
            print(f"missing {f}: build with cargo build --release and carry it")
            return 1
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip())
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda)
    checks = [(c.__name__, c) for c in (
        check_zoo, check_views, check_nvcc_leak, check_torch, check_torch_fragmentation, check_other_process,
        check_driver_paths, check_python_stacks, check_overhead, check_backward_oom, check_torchrun, check_ranks,
        check_verdicts, check_torch_allocator, check_soak, check_perf_table, check_flight_recorder,
        check_exporter, check_torchrun_worker_killed, check_multiprocessing_exit)]
    # Check files other work adds, run when present (check_kinds reads the zoo's runs).
    checks += [("check_allocator_matrix", extra_check_allocator_matrix), ("check_kinds", extra_check_kinds),
               ("check_allocator_costs", check_allocator_costs)]
    checks += [(c.__name__, c) for c in (check_hook_same, check_flight_early, check_torchrun_rank, check_readme_excerpt,
                                                   check_kinds_counts, check_one_story, check_allocator_choice)]
    only = requested()
    unknown = [n for n in only if n not in dict(checks)]
    if unknown:
        row("OOMSHIM_GPU_CHECKS", False, f"no such check: {unknown}; known: {[n for n, _ in checks]}")
    for name, check in checks:
        if only and name not in only:
            continue
        try:
            check()
        except Exception as e:  # a broken check is a failed row, not a lost table
            row(name, False, f"{type(e).__name__}: {e}")
    print()
    print(final_table())
    asserted = [r for _, r, _, a in rows if a]
    return 0 if asserted and all(r == "PASS" for r in asserted) else 1


if __name__ == "__main__":
    sys.exit(main())
