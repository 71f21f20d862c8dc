"""Shared by the OOM zoo's Python programs: the "model" that fills most of the GPU (so each
program's own pattern needs only a few steps to run out), and a step mark that works with or
without oomshim."""
import torch

GiB = 1 << 30


def load_weights(leave_gib):
    """Weights that leave `leave_gib` GiB of the device free (one allocation, untouched)."""
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(max(free - leave_gib * GiB, 0), dtype=torch.uint8, device="cuda")


def mark_step():
    try:
        import oomshim
    except ImportError:
        return
    oomshim.step()


def report_truth(request):
    """torch's own account of a failed request, on stderr (the zoo reads it from the run without
    oomshim): `truth: fragmentation` when its cache holds at least the request free, and at
    least a tenth of what it reserves, but no block that large; else `truth: own_allocations`."""
    import sys

    try:
        snapshot = torch.cuda.memory._snapshot()
    except Exception:
        return
    reserved = free = largest = 0
    for seg in snapshot.get("segments", []):
        reserved += seg.get("total_size", 0)
        for b in seg.get("blocks", []):
            if b.get("state") == "inactive":
                free += b["size"]
                largest = max(largest, b["size"])
    frag = free >= request and largest < request and free >= 0.1 * reserved
    sys.stderr.write(f"truth: {'fragmentation' if frag else 'own_allocations'} "
                     f"(free in cache {free >> 20} MiB, largest {largest >> 20} MiB, reserved {reserved >> 20} MiB)\n")


def kinds_truth(name, dominant, models=(), optimizers=()):
    """The program's own count of its memory by kind, on stderr as one line that
    tests/gpu/zoo/check_kinds.py compares with the dump's `framework.kinds`:
    `oomshim-kinds-truth: {json}`. Storages are counted once; only CUDA tensors count. Call it
    after catching the OutOfMemoryError (parameters, gradients and optimizer state are what they
    were at the failure; the failed step's activations are gone by then)."""
    import json
    import sys

    seen = set()

    def count(t):
        if t is None or not isinstance(t, torch.Tensor) or not t.is_cuda:
            return 0
        s = t.untyped_storage()
        if s.data_ptr() in seen:
            return 0
        seen.add(s.data_ptr())
        return s.nbytes()

    params = sum(count(p) for m in models for p in m.parameters())
    grads = sum(count(p.grad) for m in models for p in m.parameters())
    state = 0
    for o in optimizers:
        for st in o.state.values():
            for v in (st.values() if isinstance(st, dict) else ()):
                state += count(v)
    truth = {"program": name, "dominant": dominant, "parameters_bytes": params, "gradients_bytes": grads,
             "optimizer_state_bytes": state, "torch_allocated_bytes": torch.cuda.memory_allocated()}
    sys.stderr.write("oomshim-kinds-truth: " + json.dumps(truth) + "\n")
    sys.stderr.flush()
