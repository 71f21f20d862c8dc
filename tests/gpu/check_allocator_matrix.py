"""GPU check that allocator mode never breaks a program: each program runs bare
(`python prog.py`) and under `oomshim run --torch-allocator` (and, where the hook's reading of the
program keeps torch's allocator, once more with `OOMSHIM_TORCH_ALLOCATOR=force`, which skips that
reading); stdout and the exit status must be the same, and each row asserts what the user relies on:

- compile: `torch.compile(mode="reduce-overhead")` inference with outputs kept across replays,
  training, dynamic shapes (re-recording), two models sharing the graph pool; outputs hashed
  bit for bit. Plain allocator mode must keep torch's allocator (the program names
  reduce-overhead) and say so in one line; forced, it must compile without CUDA graphs and
  print the same hashes;
- apis: memory_allocated/max/reserved/max_reserved, reset_peak_memory_stats, memory_stats keys,
  memory_summary(abbreviated=True), memory_snapshot's segment/block layout, empty_cache,
  set_per_process_memory_fraction, caching_allocator_alloc/delete, streams + record_stream,
  pinned host memory, torch.cuda.graph(pool=...) shared by two graphs, OutOfMemoryError: the
  values printed must equal the bare run's (get_allocator_backend is printed to stderr: it is
  "pluggable" in allocator mode);
- mempool, cudnn.benchmark: kept on torch's allocator by the reading; forced: the program still
  runs (the MemPool is served by oomshim's cache, benchmark stays off); conv (cuDNN forward and
  backward, no benchmark) in allocator mode, bit for bit;
- history: torch's memory history turned on at run time, in allocator mode (the recorder is
  served, so the reading no longer keeps torch's allocator for it): the trace's actions, sizes,
  streams and Python frames, the blocks' and segments' frames, every option (context alloc/all,
  enabled state, an oom entry, off) and the output of torch.cuda._memory_viz's readers equal a
  bare run's;
- mempool_lib: a MemPool made and used by a library (not read by the hook): in allocator mode it is
  served (one line), tensors and a CUDA graph capture with `pool=pool.id` give bare's results;
- apis [allocator]: its fraction-capped OOM is judged against the cap (not `untracked_memory`),
  the dump carries the cap (`memory_cap`) and the verdict's headline names it;
- oom: a leak to OutOfMemoryError; in allocator mode the dump's verdict is `leak` and its largest
  holder is the leaking line;
- graph_oom: a leak inside a CUDA graph's private pool (each capture's 1 GiB output kept) to
  OutOfMemoryError, under preload (what allocator mode falls back to for CUDA-graph compile and
  MemPool) and in allocator mode: the program goes on as bare, the verdict is `leak` and the
  largest holder is the leaking line.

OOMSHIM_MATRIX_CASES=name,name runs only those programs; OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI name
the build to test.

    main(root, lib, cli, out_dir) -> [(check, ok, detail)]

Every program has a timeout. Run alone: python3 tests/gpu/check_allocator_matrix.py OUT_DIR"""

import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import time

COMMON = r'''
import hashlib, json, sys, torch
MIB = 1 << 20
def h(t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
def backend():
    print("backend=" + torch.cuda.get_allocator_backend(), file=sys.stderr, flush=True)
'''

COMPILE = COMMON + r'''
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
MODE = "reduce-overhead"

# inference, outputs kept across replays (cloned, as torch documents for CUDA graph outputs)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda().eval()
f = torch.compile(net, mode=MODE)
x = torch.randn(32, 256, device="cuda")
kept, eager_equal, worst = [], True, 0.0
with torch.inference_mode():
    for i in range(6):
        y = f(x * (i + 1))
        kept.append(y.clone())
    for i, y in enumerate(kept):
        e = net(x * (i + 1))
        eager_equal = eager_equal and torch.equal(e, y)
        worst = max(worst, (e - y).abs().max().item())
print("infer", [h(y) for y in kept])
print("infer close to eager", worst < 1e-4)
print("infer-eager-bitwise", eager_equal, "max-diff", worst, file=sys.stderr)

# dynamic shapes: new batch sizes re-record, an old one replays
with torch.inference_mode():
    dyn = [h(f(torch.randn(b, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(b))).clone())
           for b in (8, 16, 32, 8, 64)]
print("dynamic", dyn)

# two models sharing the pool: one's output feeds the other, both kept
net2 = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU()).cuda().eval()
g = torch.compile(net2, mode=MODE)
with torch.inference_mode():
    pairs = []
    for i in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        a = f(x + i)
        b = g(a)
        pairs.append((h(a.clone()), h(b.clone())))
        del a, b
print("two-models", pairs)

# training
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(lambda xb: torch.nn.functional.cross_entropy(model(xb[:, :128]), xb[:, 128].long().abs() % 10), mode=MODE)
gen = torch.Generator("cuda").manual_seed(2)
losses = []
for i in range(8):
    torch.compiler.cudagraph_mark_step_begin()
    xb = torch.randn(64, 129, device="cuda", generator=gen)
    loss = step(xb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item().hex())
print("train", losses)
backend()
'''

APIS = COMMON + r'''
import pickle
out = {}
x = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
y = torch.empty(1000, dtype=torch.uint8, device="cuda")
z = torch.randn(4096, 1024, device="cuda")
out["allocated"] = torch.cuda.memory_allocated()
out["reserved"] = torch.cuda.memory_reserved()
del x
out["after_del_allocated"] = torch.cuda.memory_allocated()
out["max_allocated"] = torch.cuda.max_memory_allocated()
out["max_reserved"] = torch.cuda.max_memory_reserved()
torch.cuda.reset_peak_memory_stats()
out["max_allocated_after_reset"] = torch.cuda.max_memory_allocated()
s = torch.cuda.memory_stats()
for k in ("allocated_bytes.all.current", "requested_bytes.all.current", "active_bytes.all.current",
          "reserved_bytes.all.current", "segment.all.current", "allocation.all.current",
          "active.all.current", "inactive_split.all.current", "inactive_split_bytes.all.current",
          "allocated_bytes.small_pool.current", "allocated_bytes.large_pool.current", "num_ooms"):
    out["stats." + k] = s.get(k)
out["summary"] = torch.cuda.memory_summary(abbreviated=True).splitlines()[4:12]
out["snapshot"] = sorted((g["total_size"], g["segment_type"], [(b["size"], b["state"]) for b in g["blocks"]])
                         for g in torch.cuda.memory_snapshot())
torch.cuda.memory._dump_snapshot("snap.pickle")
out["dump_snapshot_segments"] = len(pickle.load(open("snap.pickle", "rb"))["segments"])
del z
torch.cuda.empty_cache()
out["reserved_after_empty_cache"] = torch.cuda.memory_reserved()
p = torch.cuda.caching_allocator_alloc(3 * MIB)
out["caching_allocator_alloc"] = torch.cuda.memory_allocated()
torch.cuda.caching_allocator_delete(p)
out["caching_allocator_delete"] = torch.cuda.memory_allocated()

# streams and record_stream: a busy side stream reads a tensor freed on the main stream
side = torch.cuda.Stream()
wrong = 0
for _ in range(5):
    a = torch.full((16 * MIB,), 1.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        b = a * 2
    a.record_stream(side)
    del a
    c = torch.full((16 * MIB,), 7.0, device="cuda")
    side.synchronize()
    wrong += int((b != 2).sum().item())
    del b, c
out["record_stream_wrong"] = wrong

# pinned host memory
hbuf = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
out["pinned"] = [hbuf.is_pinned(), h(hbuf.to("cuda", non_blocking=True))]

# two CUDA graphs sharing one pool
lin = torch.nn.Linear(512, 512).cuda()
sx = torch.randn(64, 512, device="cuda")
s2 = torch.cuda.Stream()
s2.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s2):
    for _ in range(3):
        lin(sx)
torch.cuda.current_stream().wait_stream(s2)
pool = torch.cuda.graph_pool_handle()
g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
with torch.cuda.graph(g1, pool=pool):
    sy = lin(sx).relu()
with torch.cuda.graph(g2, pool=pool):
    sz = lin(sy) * 2
res = []
for i in range(3):
    sx.copy_(torch.full((64, 512), float(i), device="cuda"))
    g1.replay(); g2.replay()
    torch.cuda.synchronize()
    res.append(torch.equal(sz, lin(lin(sx).relu()) * 2))
out["graph_pool_equal_eager"] = res

# per-process fraction: a request over the cap raises OutOfMemoryError, under it works
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(0.25)
try:
    big = torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    out["fraction"] = "allocated over the cap"
except torch.OutOfMemoryError:
    out["fraction"] = "OutOfMemoryError"
small = torch.empty(int(total * 0.1), dtype=torch.uint8, device="cuda")
del small
torch.cuda.set_per_process_memory_fraction(1.0)
try:
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    out["huge"] = "allocated"
except torch.OutOfMemoryError as e:
    out["huge"] = type(e).__name__
out["after_oom_works"] = h(torch.ones(10, device="cuda"))
for k, v in out.items():
    print(k, json.dumps(v))
backend()
'''

MEMPOOL = COMMON + r'''
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
b = a * 2
print("mempool", h(b), torch.cuda.memory_allocated() > 0)
del a, b
backend()
'''

# torch's memory history turned on at run time (as a library would): the trace's actions, sizes,
# streams and Python frames, the blocks' and segments' frames, every option, and torch's own
# readers of the snapshot (torch.cuda._memory_viz), printed for comparison with a bare run.
HISTORY = COMMON + r'''
import pickle, re, time
from torch.cuda import _memory_viz as viz

def user(frames):
    f = next((f for f in frames or [] if f["filename"].endswith("history.py")), None)
    return f and f"{f['line']}:{f['name']}"

def make(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")

def trace():
    (t,) = torch.cuda.memory._snapshot()["device_traces"]
    return t

def rows(t):
    return [(e["action"], e["size"], e["stream"], user(e.get("frames"))) for e in t]

start = time.time() * 1e6
torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
print("enabled", torch.cuda.memory._is_history_enabled() if hasattr(torch.cuda.memory, "_is_history_enabled") else torch._C._cuda_isHistoryEnabled())
x = [make(MIB * (i + 3)) for i in range(6)]
y = make(3000)
del x[1]
del x[2]
s = torch.cuda.memory._snapshot()
(t,) = s["device_traces"]
print("trace", rows(t))
print("times", all(start - 1e6 <= e["time_us"] <= time.time() * 1e6 for e in t) and all(a["time_us"] <= b["time_us"] for a, b in zip(t, t[1:])))
# (an inactive block's requested_size is torch's leftover of its last allocation: not compared)
print("blocks", sorted((b["size"], b["state"], b["requested_size"] if b["state"] != "inactive" else None,
                        user(b["frames"])) for g in s["segments"] for b in g["blocks"]))
print("segments", sorted((g["total_size"], g["segment_type"], user(g["frames"])) for g in s["segments"]))
torch.cuda.memory._dump_snapshot("hist.pickle")
d = pickle.load(open("hist.pickle", "rb"))
print("dump", rows(d["device_traces"][0])[len(t):])  # what the first snapshot added
text = viz.trace(d)
flame = viz.segments(d, format_flamegraph=lambda lines: lines)
mem = viz.memory(d, format_flamegraph=lambda lines: lines)
# (segment addresses, `a = cudaMalloc(ADDR, ...)`, and the raw `snapshot` entry's time_us differ
# from run to run: masked; offsets inside a segment are kept)
print("memory_viz trace", [re.sub(r"\b\d{10,}\b", "ADDR", re.sub(r"'time_us': \d+", "'time_us': T", l))
                           for l in text.splitlines()][:40])
print("memory_viz segments", sorted(l.split(";", 2)[2] for l in flame.splitlines() if ";active_allocated;" in l))
print("memory_viz memory", sorted(l.split(";", 1)[1] for l in mem.splitlines() if ";active_allocated;" in l))
print("memory_viz segsum", [l for l in viz.segsum(d).splitlines() if l.startswith(("segments:", "total_"))])
print("memory_viz trace_plot", len(viz.trace_plot(d)) > 1000)
# context="alloc": frees carry the allocation's frames; context="all": their own.
torch.cuda.memory._record_memory_history(context="alloc", stacks="python", clear_history=True)
del y
print("free alloc-context", rows(trace()))
torch.cuda.memory._record_memory_history(context="all", stacks="python", clear_history=True)
del x[0]
print("free own context", rows(trace()))
# enabled="state": one entry; an OOM entry; off.
# (cleared: torch 2.11's ring shrunk while full keeps its old entries and overwrites from the
# first, where oomshim keeps the newest)
torch.cuda.memory._record_memory_history(enabled="state", stacks="python", clear_history=True)
z = make(5000)
print("state", rows(trace()))
torch.cuda.memory._record_memory_history(stacks="python", clear_history=True)
try:
    make(1 << 50)
except torch.OutOfMemoryError:
    pass
oom = [e for e in trace() if e["action"] == "oom"]
print("oom", [(e["size"], e["device_free"] > 0, user(e.get("frames"))) for e in oom])
print("after oom", sorted((e["action"], e["size"]) for e in trace() if e["action"] != "oom"))
torch.cuda.memory._record_memory_history(enabled=None)
print("off", torch.cuda.memory._snapshot()["device_traces"])
backend()
'''

CUDNN = COMMON + r'''
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
x = torch.randn(8, 16, 64, 64, device="cuda")
y = conv(x)
torch.cuda.synchronize()
print("conv", tuple(y.shape), torch.isfinite(y).all().item())
backend()
'''

# cuDNN without benchmark: allocator mode, results bit for bit.
CONV = COMMON + r'''
torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 3)).cuda()
x = torch.randn(4, 3, 32, 32, device="cuda", requires_grad=True)
y = net(x)
y.square().mean().backward()
print("conv", h(y), h(x.grad), h(net[0].weight.grad))
backend()
'''

LEAK = COMMON + r'''
net = torch.nn.Linear(1024, 1024).cuda()
kept = []
try:
    while len(kept) < 10000:
        out = net(torch.randn(64, 1024, device="cuda"))  # a step: the hook marks each forward pass
        kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # the leaking line
except torch.OutOfMemoryError:
    print("caught OutOfMemoryError")
n = len(kept)
kept.clear()
print("usable after", torch.ones(4, device="cuda").sum().item())
print("tensors", n, file=sys.stderr)
backend()
'''

# An OOM inside a CUDA graph's private pool: each step runs the model eagerly (a step mark) and
# captures a graph whose output, 1 GiB, stays alive with the graph, so the pool grows step after
# step until a capture cannot allocate. Under preload (where allocator mode falls back to torch's
# allocator: CUDA-graph compile, MemPool) the dump must name the leaking line.
GRAPH_OOM = COMMON + r'''
net = torch.nn.Linear(1024, 1024).cuda()
x = torch.ones(64, 1024, device="cuda")
pool = torch.cuda.graph_pool_handle()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    torch.empty(1 << 20, device="cuda").fill_(1)  # warm-up before capture, as torch asks
torch.cuda.current_stream().wait_stream(s)
graphs, outs = [], []
try:
    while len(graphs) < 10000:
        net(x)  # a step: the hook marks each forward pass
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            buf = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # the leaking line
            buf.fill_(1)
        graphs.append(g)
        outs.append(buf)
except torch.OutOfMemoryError:
    print("caught OutOfMemoryError")
n = len(graphs)
outs.clear()
graphs.clear()
torch.cuda.synchronize()
print("usable after", torch.ones(4, device="cuda").sum().item())
print("graphs", n, file=sys.stderr)
backend()
'''

# A MemPool made by a library (a module the hook's reading of the program does not see: not the
# script, not beside it), used for tensors and for a CUDA graph capture.
POOL_LIB = r'''
import torch


def make_pool():
    return torch.cuda.MemPool()


def arange_in(pool, n):
    with torch.cuda.use_mem_pool(pool):
        return torch.arange(n, device="cuda", dtype=torch.float32)
'''

MEMPOOL_LIB = COMMON + r'''
sys.path.insert(0, "lib")
import poolmaker
pool = poolmaker.make_pool()
a = poolmaker.arange_in(pool, 1 << 20)
b = a * 2
lin = torch.nn.Linear(256, 256).cuda()
sx = torch.randn(8, 256, device="cuda")
s2 = torch.cuda.Stream()
s2.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s2):
    lin(sx)
torch.cuda.current_stream().wait_stream(s2)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=pool.id):
    sy = lin(sx).relu()
res = []
for i in range(3):
    sx.copy_(torch.full((8, 256), float(i), device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    res.append(torch.equal(sy, lin(sx).relu()))
print("mempool-lib", h(b), res, torch.cuda.memory_allocated() > 0)
del a, b
backend()
'''

FALLBACK = "oomshim: allocator mode is off for this process"


def _write(out_dir, name, text):
    # Each program in its own directory: the hook reads the sources beside the script.
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name + ".py")
    with open(path, "w") as f:
        f.write(text)
    if name == "mempool_lib":
        os.makedirs(os.path.join(d, "lib"), exist_ok=True)
        with open(os.path.join(d, "lib", "poolmaker.py"), "w") as f:
            f.write(POOL_LIB)
    return d, path


def _run(cli, lib, d, path, how, timeout=420):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    dumps = os.path.join(d, "dumps-" + how)
    os.makedirs(dumps, exist_ok=True)
    if how == "bare":
        cmd = [sys.executable, path]
    elif how == "preload":
        cmd = [cli, "run", "--lib", lib, "--dir", dumps, "--", sys.executable, path]
    else:
        cmd = [cli, "run", "--torch-allocator", "--lib", lib, "--dir", dumps, "--", sys.executable, path]
        if how == "forced":
            env["OOMSHIM_TORCH_ALLOCATOR"] = "force"
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, so, se = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    return {"rc": rc, "stdout": so, "stderr": se, "secs": round(time.time() - t0, 1), "dumps": dumps}


def _backend(r):
    for line in r["stderr"].splitlines():
        if line.startswith("backend="):
            return line.split("=", 1)[1]
    return "?"


def _oomshim_lines(r):
    return [l for l in r["stderr"].splitlines() if l.startswith("oomshim:")]


def _same(name, bare, other, how):
    ok = bare["rc"] == 0 and other["rc"] == bare["rc"] and other["stdout"] == bare["stdout"]
    if ok:
        detail = f"{len(bare['stdout'].splitlines())} lines equal, exit 0 ({bare['secs']}s / {other['secs']}s)"
    else:
        b, o = bare["stdout"].splitlines(), other["stdout"].splitlines()
        diff = [f"bare: {x} | {how}: {y}" for x, y in zip(b, o) if x != y][:3]
        detail = (f"exit {bare['rc']} vs {other['rc']}; {diff or (len(b), len(o))}; "
                  f"stderr: {other['stderr'][-600:]!r}")
    return (f"{name} [{how}]: stdout and exit status equal a bare run", ok, detail)


def _case(name, text, root, lib, cli, out_dir, modes):
    d, path = _write(out_dir, name, text)
    runs = {how: _run(cli, lib, d, path, how) for how in ["bare"] + modes}
    return name, runs


def _rows(name, runs):
    rows = []
    bare = runs["bare"]
    for how, r in runs.items():
        with open(os.path.join(os.path.dirname(r["dumps"]), f"{how}.log"), "w") as f:
            f.write(f"rc {r['rc']}\n--- stdout\n{r['stdout']}\n--- stderr\n{r['stderr']}")
        if how == "bare":
            continue
        rows.append(_same(name, bare, r, how))
        lines = _oomshim_lines(r)
        if how == "allocator" and name in ("compile", "mempool", "cudnn"):
            fb = [l for l in lines if l.startswith(FALLBACK)]
            rows.append((f"{name} [allocator]: read before the swap, torch keeps its allocator, one line says why",
                         len(fb) == 1 and _backend(r) == "native", (fb[0] if fb else lines)[:300] if fb else
                         f"backend {_backend(r)}; {lines}"))
        elif how in ("allocator", "forced"):
            rows.append((f"{name} [{how}]: oomshim is torch's allocator", _backend(r) == "pluggable",
                         f"backend {_backend(r)}; oomshim lines: {[l[:160] for l in lines]}"))
        if name == "mempool_lib" and how == "allocator":
            served = [l for l in lines if l.startswith("oomshim: torch.cuda.MemPool is served")]
            rows.append(("mempool_lib [allocator]: a library's MemPool is served, one line says so",
                         len(served) == 1, (served or lines)[:2]))
        if name == "apis" and how == "allocator":
            rows.append(_fraction_row(r))
    return rows


def _fraction_row(r):
    """The fraction-capped OOM of the apis program (0.3 of the device asked under a 0.25 cap) is
    judged against the cap: the dump's device total is the cap (torch reports the allowed maximum
    the same way), so the verdict is not `untracked_memory`."""
    found = []
    for p in sorted(glob.glob(os.path.join(r["dumps"], "*.json"))):
        if os.path.basename(p).startswith("oomshim-torch-"):
            continue
        try:
            d = json.load(open(p))
        except Exception:
            continue
        req = d.get("failed_request") or {}
        dev = next((x for x in d.get("devices", []) if x.get("index") == req.get("device")), {})
        v = d.get("verdict") or {}
        found.append((req.get("bytes"), dev.get("total_bytes"), v.get("kind"),
                      ((v.get("findings") or [{}])[0]).get("headline"), dev.get("memory_cap")))
    capped = [f for f in found if f[0] and f[0] < (1 << 45)]
    ok = len(capped) == 1 and capped[0][2] not in ("untracked_memory", None) and capped[0][1] \
        and capped[0][1] < capped[0][0] and "cap set by set_per_process_memory_fraction(0.25) of device 0's" \
        in (capped[0][3] or "") and (capped[0][4] or {}).get("bytes") == capped[0][1]
    return ("apis [allocator]: the fraction-capped OOM is judged against the cap and its verdict names it",
            bool(ok), f"(request, judged total, verdict, headline, memory_cap) per dump: {found}")


def _graph_oom_rows(runs):
    """An OOM inside a CUDA graph's private pool, under preload: the program goes on as bare, the
    dump's verdict is leak and its largest holder is the leaking line."""
    rows = []
    bare = runs["bare"]
    n = lambda r: next((l.split()[1] for l in r["stderr"].splitlines() if l.startswith("graphs ")), "?")
    for how in [h for h in runs if h != "bare"]:
        r = runs[how]
        ok = (bare["rc"] == 0 and r["rc"] == 0 and bare["stdout"] == r["stdout"]
              and "caught OutOfMemoryError" in r["stdout"])
        rows.append((f"graph_oom [{how}]: OutOfMemoryError inside a graph's pool caught as bare, program goes on",
                     ok, f"bare {n(bare)} graphs, {how} {n(r)}; exit {bare['rc']}/{r['rc']}; "
                     f"stderr tail {r['stderr'][-300:]!r}" if not ok else f"bare {n(bare)} graphs, {how} {n(r)}"))
        dumps = [p for p in sorted(glob.glob(os.path.join(r["dumps"], "*.json")))
                 if not os.path.basename(p).startswith("oomshim-torch-")]
        if not dumps:
            rows.append((f"graph_oom [{how}]: the dump names the leak", False, f"no dump in {r['dumps']}"))
            continue
        d = json.load(open(dumps[0]))
        kind = (d.get("verdict") or {}).get("kind")
        top = (d.get("largest_holders") or [{}])[0]
        line = next((f"{f.get('file')}:{f.get('line')}" for f in top.get("stack", [])
                     if (f.get("file") or "").endswith("graph_oom.py")), None)
        src = open(os.path.join(os.path.dirname(r["dumps"]), "graph_oom.py")).read().splitlines()
        want = next(i + 1 for i, l in enumerate(src) if "the leaking line" in l)
        ok = kind == "leak" and line is not None and line.endswith(f":{want}")
        rows.append((f"graph_oom [{how}]: the dump's verdict is leak and its largest holder is the leaking line", ok,
                     f"verdict {kind}; top holder {top.get('bytes')} B via {top.get('api')} at {line} "
                     f"(leak at line {want}); {len(dumps)} dump(s)"))
    return rows


def _oom_rows(runs):
    rows = []
    bare, alloc = runs["bare"], runs["allocator"]
    ok = (bare["rc"] == 0 and alloc["rc"] == 0 and bare["stdout"] == alloc["stdout"]
          and "caught OutOfMemoryError" in alloc["stdout"])
    n = lambda r: next((l.split()[1] for l in r["stderr"].splitlines() if l.startswith("tensors ")), "?")
    rows.append(("oom [allocator]: OutOfMemoryError raised and caught where torch raises it, program goes on", ok,
                 f"bare {n(bare)} x 1 GiB, allocator {n(alloc)} x 1 GiB; exit {bare['rc']}/{alloc['rc']}"))
    dumps = sorted(glob.glob(os.path.join(alloc["dumps"], "*.json")))
    dumps = [p for p in dumps if not os.path.basename(p).startswith("oomshim-torch-")]
    if not dumps:
        rows.append(("oom [allocator]: the dump names the leak", False, f"no dump in {alloc['dumps']}"))
        return rows
    d = json.load(open(dumps[0]))
    kind = (d.get("verdict") or {}).get("kind")
    holders = d.get("largest_holders") or []
    top = holders[0] if holders else {}
    line = next((f"{f.get('file')}:{f.get('line')}" for f in top.get("stack", [])
                 if (f.get("file") or "").endswith("oom.py")), None)
    src = open(os.path.join(os.path.dirname(alloc["dumps"]), "oom.py")).read().splitlines()
    want = next(i + 1 for i, l in enumerate(src) if "the leaking line" in l)
    ok = kind == "leak" and line is not None and line.endswith(f":{want}") and top.get("api") == "oomshim_torch_alloc"
    rows.append(("oom [allocator]: the dump's verdict is leak and its largest holder is the leaking line", ok,
                 f"verdict {kind}; top holder {top.get('bytes')} B via {top.get('api')} at {line} (leak at line {want}); "
                 f"free_blocks {d.get('free_blocks', {}).get('source')}"))
    return rows


def main(root, lib, cli, out_dir):
    rows = []
    only = [c for c in os.environ.get("OOMSHIM_MATRIX_CASES", "").split(",") if c]
    cases = [
        ("compile", COMPILE, ["allocator", "forced"]),
        ("apis", APIS, ["allocator"]),
        ("mempool", MEMPOOL, ["allocator", "forced"]),
        ("mempool_lib", MEMPOOL_LIB, ["allocator"]),
        ("history", HISTORY, ["allocator"]),
        ("cudnn", CUDNN, ["allocator", "forced"]),
        ("conv", CONV, ["allocator"]),
    ]
    cases = [c for c in cases if not only or c[0] in only]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
        futures = [pool.submit(_case, n, t, root, lib, cli, out_dir, m) for n, t, m in cases]
        for fut in futures:
            try:
                name, runs = fut.result()
                new = _rows(name, runs)
            except Exception as e:  # a broken check is a failed row, not a lost table
                new = [(f"case {cases[futures.index(fut)][0]}", False, f"{type(e).__name__}: {e}")]
            for row in new:
                print(f"[{'PASS' if row[1] else 'FAIL'}] {row[0]}: {row[2]}", flush=True)
            rows.extend(new)
    # Alone, one after the other: each fills the GPU.
    for name, text, modes, judge in [("oom", LEAK, ["allocator"], _oom_rows),
                                     ("graph_oom", GRAPH_OOM, ["preload", "allocator"], _graph_oom_rows)]:
        if only and name not in only:
            continue
        try:
            _, runs = _case(name, text, root, lib, cli, out_dir, modes)
            new = judge(runs)
        except Exception as e:
            new = [(name, False, f"{type(e).__name__}: {e}")]
        for row in new:
            print(f"[{'PASS' if row[1] else 'FAIL'}] {row[0]}: {row[2]}", flush=True)
        rows.extend(new)
    return rows


if __name__ == "__main__":
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/oomshim-allocator-matrix")
    os.makedirs(out, exist_ok=True)
    results = main(here, os.environ.get("OOMSHIM_GPU_LIB") or os.path.join(here, "target/release/liboomshim.so"),
                   os.environ.get("OOMSHIM_GPU_CLI") or os.path.join(here, "target/release/oomshim"), out)
    print()
    for c, ok, detail in results:
        print(f"| {'PASS' if ok else 'FAIL'} | {c} | {detail} |")
    sys.exit(0 if all(ok for _, ok, _ in results) else 1)
