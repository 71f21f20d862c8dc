"""GPU checks of driver coverage (issue #3): programs that reach device memory without the
runtime's PLT — nvcc's default static cudart, dlopen+dlsym of libcuda, PyTorch expandable
segments and cudaMallocAsync, JAX/XLA (platform allocator and default preallocation), CuPy's
pool. For each: stdout (its deterministic part) and exit code identical with and without the
shim, a dump present, and the device memory the dump leaves unexplained,
untracked = total - free - tracked, below 1 GiB (the CUDA context and library workspaces).

Wired into run_all.py by the lead: `checks(ctx)` returns rows (check, ok, detail); ctx has ROOT,
LIB, CLI, OUT, WORK and run(cmd, env) -> CompletedProcess.

Each Python workload prints one JSON line last: `det` (the deterministic part, compared between
the runs) and `meas` (measurements). Under the shim it also asks for an on-demand dump
(`oomshim_dump("after-oom")` through ctypes) after its out-of-memory error, so a dump exists even
when the framework's own arena ran out without a driver failure (JAX preallocation), and it
records nvidia-smi's used/total at that moment, for when the dump could not ask the driver for
free/total from that thread.
"""
import glob
import json
import os
import subprocess
import sys

GIB = 2**30

# Appended to every Python workload.
COMMON = r'''
import ctypes, json, os, subprocess, sys

def after_oom(result):
    try:
        dump = ctypes.CDLL(None).oomshim_dump
        dump.argtypes = [ctypes.c_char_p]
        dump.restype = ctypes.c_int
        result["meas"]["on_demand_dump"] = dump(b"after-oom")
    except (AttributeError, OSError):
        pass
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits",
                        "-i", "0"], capture_output=True, text=True).stdout.strip().split(",")
    try:
        result["meas"]["smi_used"] = int(q[0]) * 2**20
        result["meas"]["smi_total"] = int(q[1]) * 2**20
    except (ValueError, IndexError):
        pass
    print(json.dumps(result))
    sys.stdout.flush()
'''

TORCH = r'''
import torch

def leak_one_gib(keep):
    keep.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))

keep = []
result = {"det": {}, "meas": {}}
try:
    while len(keep) < 100000:
        leak_one_gib(keep)
except torch.cuda.OutOfMemoryError as e:
    result["det"] = {"raised": type(e).__name__, "held_gib": len(keep)}
    free, total = torch.cuda.mem_get_info()
    result["meas"] = {"reserved": torch.cuda.memory_reserved(), "free": free, "total": total}
after_oom(result)
'''

JAX = r'''
import jax, jax.numpy as jnp

def leak_one_gib(keep):
    keep.append(jnp.ones((GIB // 4,), jnp.float32).block_until_ready())

keep = []
result = {"det": {}, "meas": {}}
try:
    while len(keep) < 100000:
        leak_one_gib(keep)
except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
    result["det"] = {"raised": type(e).__name__, "resource_exhausted": "RESOURCE_EXHAUSTED" in str(e),
                     "held_gib": len(keep)}
after_oom(result)
'''

CUPY = r'''
import cupy as cp

def leak_one_gib(keep):
    keep.append(cp.empty(GIB, dtype=cp.uint8))

keep = []
result = {"det": {}, "meas": {}}
try:
    while len(keep) < 100000:
        leak_one_gib(keep)
except cp.cuda.memory.OutOfMemoryError as e:
    pool = cp.get_default_memory_pool()
    result["det"] = {"raised": type(e).__name__, "held_gib": len(keep)}
    result["meas"] = {"pool_total": pool.total_bytes(), "pool_used": pool.used_bytes()}
after_oom(result)
'''

DLSYM_C = r'''
/* Reaches the driver only through dlopen("libcuda.so.1") + dlsym, as XLA's stub does. */
#include <dlfcn.h>
#include <stdio.h>
typedef int (*init_t)(unsigned);
typedef int (*dev_t_)(int *, int);
typedef int (*retain_t)(void **, int);
typedef int (*setcur_t)(void *);
typedef int (*alloc_t)(unsigned long long *, size_t);
static alloc_t g_alloc;
__attribute__((noinline)) int leak_one_gib_through_dlsym(unsigned long long *p) {
    int rc = g_alloc(p, (size_t)1 << 30);
    __asm__ volatile("" ::: "memory");
    return rc;
}
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("no driver\n"); return 4; }
    int dev = 0;
    void *ctx = 0;
    if (((init_t)dlsym(h, "cuInit"))(0) || ((dev_t_)dlsym(h, "cuDeviceGet"))(&dev, 0) ||
        ((retain_t)dlsym(h, "cuDevicePrimaryCtxRetain"))(&ctx, dev) || ((setcur_t)dlsym(h, "cuCtxSetCurrent"))(ctx)) {
        printf("init failed\n");
        return 5;
    }
    g_alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    unsigned long long p;
    int n = 0, rc;
    while ((rc = leak_one_gib_through_dlsym(&p)) == 0) n++;
    printf("held %d GiB, then rc=%d\n", n, rc);
    return rc == 2 ? 3 : 1;
}
'''


def _dumps(d):
    return sorted(glob.glob(os.path.join(d, "oomshim-*.json")), key=os.path.getmtime)


def _load(p):
    with open(p) as f:
        return json.load(f)


def _names(stack):
    return [f.get("function") or "" for f in stack]


def _gib(b):
    return f"{b / GIB:.2f} GiB"


def _untracked(dump, meas=None):
    """(untracked bytes, how) from the dump's device of the failure, else nvidia-smi."""
    fr = dump.get("failed_request") or {}
    devs = dump.get("devices") or []
    dev = next((x for x in devs if x["index"] == fr.get("device", 0)), devs[0] if devs else None)
    if dev is None:
        return None, "no device in dump"
    tracked = dev["tracked_bytes"]
    pools = sum(p.get("reserved_bytes", 0) - p.get("used_bytes", 0) for p in dump.get("pools", []) or [])
    if dev.get("free_bytes") is not None and dev.get("total_bytes"):
        return dev["total_bytes"] - dev["free_bytes"] - tracked - pools, "dump free/total"
    if meas and "smi_used" in meas:
        return meas["smi_used"] - tracked - pools, "nvidia-smi used"
    return None, "no free/total"


def checks(ctx):
    ROOT, LIB, OUT, WORK, run = ctx["ROOT"], ctx["LIB"], ctx["OUT"], ctx["WORK"], ctx["run"]
    rows = []
    # OOMSHIM_GPU_ONLY=torch-default,cupy-pool runs just those workloads.
    only = [x for x in os.environ.get("OOMSHIM_GPU_ONLY", "").split(",") if x]

    def wanted(name):
        return not only or name in only

    def row(check, ok, detail):
        rows.append((check, bool(ok), detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {check}: {detail}", flush=True)

    def outdir(name):
        d = os.path.join(OUT, "driver-" + name)
        os.makedirs(d, exist_ok=True)
        return d

    def judge(name, bare, shim, d, bare_out, shim_out, api_prefixes, site=None, meas=None, min_holder=None):
        same = bare_out == shim_out and bare.returncode == shim.returncode
        row(f"{name}: output and exit code unchanged", same,
            f"exit {bare.returncode} vs {shim.returncode}; {str(shim_out)[:160]}")
        files = _dumps(d)
        if not files:
            row(f"{name}: dump present", False, f"no dump; stderr: {shim.stderr[-600:]}")
            return
        ooms = [f for f in files if _load(f).get("reason") == "oom"]
        pick = _load(ooms[0]) if ooms else _load(files[-1])
        fr = pick.get("failed_request") or {}
        row(f"{name}: dump present", True,
            f"{len(files)} dump(s), {len(ooms)} oom; failed via {fr.get('api')}; verdict {pick['verdict']['kind']}")
        holders = pick.get("largest_holders") or []
        apis = sorted({h["api"] for h in holders})
        row(f"{name}: holders seen through the expected API", any(
            a.startswith(p) for a in apis for p in api_prefixes), f"apis {apis} (expected {api_prefixes})")
        if site:
            # C++ names come demangled with their parameters: grow_leaky_buffer(int).
            where = [n.split("(")[0] for h in holders for n in _names(h["stack"])]
            row(f"{name}: holders name {site}", site in where, f"{[n for n in _names(holders[0]['stack']) if n][:4] if holders else []}")
        if min_holder is not None:
            top = holders[0]["bytes"] if holders else 0
            row(f"{name}: the arena is one large holder", top >= min_holder, f"largest {_gib(top)}")
        # Untracked at the moment of the dump used (the OOM one when there is one).
        u, how = _untracked(pick, meas if not ooms else None)
        if u is None and ooms and files[-1] != ooms[0]:
            u, how = _untracked(_load(files[-1]), meas)
        row(f"{name}: untracked below 1 GiB", u is not None and u < GIB,
            f"untracked {_gib(u) if u is not None else '?'} ({how})")

    # ---- 1. nvcc, default (static) cudart ----
    exe = os.path.join(WORK, "leak_static")
    p = None if not wanted("nvcc-static") else run(["nvcc", "-O2", "-g", "-o", exe, os.path.join(ROOT, "tests/gpu/leak.cu")], None)
    if p is None:
        pass
    elif p.returncode != 0:
        row("nvcc static cudart: build", False, p.stderr[-400:])
    else:
        d = outdir("nvcc-static")
        bare = run([exe], None)
        shim = run([exe], {"LD_PRELOAD": LIB, "OOMSHIM_DIR": d})
        judge("nvcc static cudart leak", bare, shim, d, bare.stdout, shim.stdout, ["cuMemAlloc"],
              site="grow_leaky_buffer")

    # ---- 2. C program, driver through dlopen + dlsym only ----
    src = os.path.join(WORK, "dlsym_leak.c")
    exe = os.path.join(WORK, "dlsym_leak")
    with open(src, "w") as f:
        f.write(DLSYM_C)
    p = run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", exe, src, "-ldl"], None) if wanted("dlsym") else None
    if p is None:
        pass
    elif p.returncode != 0:
        row("dlsym C: build", False, p.stderr[-400:])
    else:
        d = outdir("dlsym")
        bare = run([exe], None)
        shim = run([exe], {"LD_PRELOAD": LIB, "OOMSHIM_DIR": d})
        judge("C via dlopen+dlsym leak", bare, shim, d, bare.stdout, shim.stdout, ["cuMemAlloc"],
              site="leak_one_gib_through_dlsym")

    # ---- Python workloads ----
    def py(name, body, env, api_prefixes, site="leak_one_gib", min_holder=None, extra=None):
        if not wanted(name):
            return None
        script = os.path.join(WORK, f"{name}.py")
        with open(script, "w") as f:
            f.write(f"GIB = {GIB}\n" + COMMON + body)
        d = outdir(name)
        bare = run([sys.executable, script], env)
        shim = run([sys.executable, script], dict(env, LD_PRELOAD=LIB, OOMSHIM_DIR=d))
        try:
            rb = json.loads(bare.stdout.strip().splitlines()[-1])
            rs = json.loads(shim.stdout.strip().splitlines()[-1])
        except Exception:
            row(f"{name}: ran", False, f"bare rc {bare.returncode}, shim rc {shim.returncode}: "
                f"{bare.stderr[-400:]} | {shim.stderr[-600:]}")
            return None
        judge(name, bare, shim, d, rb["det"], rs["det"], api_prefixes, site=None, meas=rs["meas"],
              min_holder=min_holder)
        if extra:
            extra(d, rs)
        return rs

    def torch_reserved(label):
        def check(d, rs):
            files = [f for f in _dumps(d) if _load(f).get("reason") == "after-oom"]
            if not files or "reserved" not in rs["meas"]:
                row(f"{label}: tracked vs memory_reserved", False, "no after-oom dump")
                return
            dump = _load(files[-1])
            tracked = sum(x["tracked_bytes"] for x in dump["devices"])
            reserved = rs["meas"]["reserved"]
            err = abs(tracked - reserved) / max(reserved, 1)
            row(f"{label}: tracked vs memory_reserved (within 1%)", err <= 0.01,
                f"tracked {tracked} vs reserved {reserved} ({err * 100:.3f}%); "
                f"{dump['recording']['live_allocations']} live, apis {sorted({h['api'] for h in dump['largest_holders']})}")
        return check

    # The classic allocator: cudaMalloc (PLT hook) whose cuMemAlloc_v2 inside the runtime reaches
    # the driver wrapper too; counted once, so tracked still equals torch's reserved.
    py("torch-default", TORCH, {}, ["cudaMalloc"], extra=torch_reserved("torch default (exactly once)"))
    py("torch-expandable", TORCH, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, ["cuMemCreate"],
       extra=torch_reserved("torch expandable_segments"))
    def pools_reported(d, rs):
        ooms = [_load(f) for f in _dumps(d) if _load(f).get("reason") == "oom"]
        pools = ooms[0].get("pools", []) if ooms else []
        row("torch-mallocasync: pools reported at the failure", bool(pools),
            "; ".join(f"pool {p['pool']}: reserved {_gib(p['reserved_bytes'])}, used {_gib(p['used_bytes'])}"
                      for p in pools) or "no pools key")

    py("torch-mallocasync", TORCH, {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
       ["cudaMallocAsync", "cuMemAllocAsync"], extra=pools_reported)
    py("jax-platform", JAX, {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
       ["cuMem"])
    py("jax-prealloc", JAX, {}, ["cuMem"], min_holder=GIB * 8)
    py("cupy-pool", CUPY, {}, ["cuMemAlloc", "cudaMalloc"])
    return rows


if __name__ == "__main__":
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def _run(cmd, env, timeout=600):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)

    ctx = {
        "ROOT": root,
        "LIB": os.path.join(root, "target/release/liboomshim.so"),
        "CLI": os.path.join(root, "target/release/oomshim"),
        "OUT": sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="oomshim-gpu-"),
        "WORK": tempfile.mkdtemp(prefix="oomshim-gpu-work-"),
        "run": _run,
    }
    rows = checks(ctx)
    print("\n| check | result | detail |\n|---|---|---|")
    for c, ok, dt in rows:
        print(f"| {c} | {'PASS' if ok else 'FAIL'} | {dt} |")
    sys.exit(0 if all(ok for _, ok, _ in rows) else 1)
