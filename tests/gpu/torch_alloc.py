"""Allocator mode on the GPU: one scenario per call, a JSON line printed last.

    python3 torch_alloc.py bench native|oomshim|oomshim-native   # empty+del loop, 50 training steps
    python3 torch_alloc.py loop MODE                             # the loop alone
    python3 torch_alloc.py leak | frag | graph | compile [native] | streams | stats

`oomshim*` modes call oomshim.torch.enable() first (the package is found next to this repo's
shim/python; liboomshim.so by OOMSHIM_LIB or target/release). `oomshim-python` records Python
stacks only (OOMSHIM_STACKS=python must be set by the caller)."""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "shim", "python"))

import torch  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


def enable():
    import oomshim.torch

    oomshim.torch.enable()
    return oomshim.torch


def out(d):
    print(json.dumps(d), flush=True)


# ---------- a GPT-2-small-sized transformer from torch.nn ----------

class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        # Attention written out (matmul + softmax): deterministic on every backend.
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // h) ** 0.5)
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, ctx=256):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def train(steps=50, batch=8, ctx=256):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = GPT(ctx=ctx).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 50257, (batch, ctx + 1), generator=gen) for _ in range(steps)]
    losses, times = [], []
    for i in range(steps):
        xy = data[i].cuda(non_blocking=False)
        x, y = xy[:, :-1], xy[:, 1:]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def timed_steps(batch=8, ctx=256):
    """The GPT-2-small bf16 AdamW training step that allocator_ab.py and allocator_modes.py time
    (one model, data and step, so that their figures compare). Returns steps(n): n steps between
    two synchronisations, and the wall and CPU nanoseconds a step."""
    torch.manual_seed(0)
    model = GPT(ctx=ctx).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 50257, (batch, ctx + 1), generator=gen).cuda() for _ in range(4)]

    def steps(n, train=True):
        """train=False: the forward pass and loss alone (no backward, no optimizer): every tensor
        is then allocated on the calling thread, none on autograd's."""
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        for i in range(n):
            xy = data[i % len(data)]
            x, y = xy[:, :-1], xy[:, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
            if not train:
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / n, (time.process_time_ns() - c0) / n

    return steps


def empty_block(n):
    """torch.empty + del n times in a Python loop, between two synchronisations: ns an iteration.
    The block every loop figure of the GPU scripts times."""
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = torch.empty(1024, device="cuda")
        del x
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / n


def empty_loop(n=100_000, repeats=9):
    """The fastest of `repeats` blocks of n (the least disturbed by other work on the machine)."""
    return min(empty_block(n) for _ in range(repeats))


def bench(mode):
    mod = enable() if mode.startswith("oomshim") else None
    for _ in range(2000):  # warm the cache and the code paths
        x = torch.empty(1024, device="cuda")
        del x
    loop_ns = empty_loop()
    losses, times = train()
    steady = sorted(times[5:])
    if mod:
        peak_reserved = mod.max_memory_reserved()
        peak_alloc = mod.max_memory_allocated()
        # torch's own API answers from oomshim after enable(): the same numbers.
        same = torch.cuda.max_memory_reserved() == peak_reserved
    else:
        peak_reserved = torch.cuda.max_memory_reserved()
        peak_alloc = torch.cuda.max_memory_allocated()
        same = True
    out({"mode": mode, "loop_ns": loop_ns, "step_ms_median": steady[len(steady) // 2] * 1000,
         "losses": [l.hex() for l in losses], "last_loss": losses[-1],
         "peak_reserved": peak_reserved, "peak_allocated": peak_alloc, "torch_api_agrees": same})


def loop_only(mode):
    """The empty+del loop alone (for breaking the cost down by OOMSHIM_STACKS)."""
    if mode.startswith("oomshim"):
        enable()
    for _ in range(2000):
        x = torch.empty(1024, device="cuda")
        del x
    out({"mode": mode, "loop_ns": empty_loop()})


def leak():
    import oomshim

    enable()
    kept = []
    try:
        for step in range(10_000):
            kept.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))  # the leaking line
            oomshim.step()
    except Exception as e:  # noqa: BLE001 - the type is what we report
        kind = f"{type(e).__module__}.{type(e).__qualname__}"
        caught_oom = isinstance(e, torch.OutOfMemoryError)
        n = len(kept)
        kept.clear()
        ok_after = torch.empty(GIB, dtype=torch.uint8, device="cuda") is not None
        out({"raised": kind, "is_torch_oom": caught_oom, "tensors": n, "message": str(e)[:1500],
             "usable_after": ok_after})
        return
    out({"raised": None})


def frag():
    mod = enable()
    free, _ = torch.cuda.mem_get_info()
    n = free // GIB - 1
    big = [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    del big  # 1 GiB segments, all cached
    small = [torch.empty(600 * MIB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    fb = mod.fragmentation()
    try:
        torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
        out({"raised": None, "segments": n, "free_blocks": fb})
    except Exception as e:  # noqa: BLE001
        out({"raised": type(e).__qualname__, "segments": n, "message": str(e)[:1500],
             "free_blocks": {k: fb[k] for k in ("reserved_bytes", "allocated_bytes", "total_free_bytes",
                                                "largest_free_bytes", "fragmentation", "histogram")}})
    del small


def graph():
    enable()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    static_x = torch.randn(64, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            static_y = model(static_x)
    except Exception as e:  # noqa: BLE001
        out({"captured": False, "error": f"{type(e).__qualname__}: {str(e)[:300]}"})
        return
    worst = 0.0
    for i in range(5):
        x = torch.randn(64, 1024, device="cuda")
        # Other allocations between replays must not land in the graph's memory.
        junk = [torch.randn(256, 1024, device="cuda") for _ in range(20)]
        static_x.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        ref = model(x)
        worst = max(worst, (static_y - ref).abs().max().item())
        del junk
    out({"captured": True, "replays": 5, "max_abs_diff": worst})


def compile_reduce_overhead(allocator="oomshim"):
    """`compile [native]`: with `native`, torch's own allocator (the bare run that allocator mode
    must match: same stdout, same exit status)."""
    if allocator != "native":
        enable()
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()).cuda()
    try:
        f = torch.compile(model, mode="reduce-overhead")
        x = torch.randn(32, 256, device="cuda")
        for _ in range(3):
            y = f(x)
        torch.cuda.synchronize()
        out({"ran": True, "max_abs_diff": (y - model(x)).abs().max().item()})
    except Exception as e:  # noqa: BLE001
        out({"ran": False, "error": f"{type(e).__qualname__}: {str(e).splitlines()[0][:300]}"})


def streams():
    enable()
    n = 64 * MIB // 4
    s = torch.cuda.Stream()
    bad = 0
    for _ in range(20):
        a = torch.full((n,), 1.0, device="cuda")
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(20_000_000)  # keeps the side stream busy
            b = a * 2
        a.record_stream(s)
        del a
        c = torch.full((n,), 7.0, device="cuda")  # must not land in a's memory while s reads it
        s.synchronize()
        bad += int((b != 2).sum().item())
        del b, c
    out({"wrong_elements": bad})


def stats():
    mod = enable()
    x = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    y = torch.empty(1000, dtype=torch.uint8, device="cuda")
    s = torch.cuda.memory_stats()
    alloc = torch.cuda.memory_allocated()
    del x, y
    torch.cuda.empty_cache()
    out({"allocated_bytes.all.current": s.get("allocated_bytes.all.current"), "memory_allocated": alloc,
         "reserved_after_empty_cache": mod.memory_reserved(), "keys": len(s)})


if __name__ == "__main__":
    what = sys.argv[1]
    {"bench": lambda: bench(sys.argv[2]), "loop": lambda: loop_only(sys.argv[2]), "leak": leak, "frag": frag, "graph": graph,
     "compile": lambda: compile_reduce_overhead(*sys.argv[2:3]), "streams": streams, "stats": stats}[what]()
