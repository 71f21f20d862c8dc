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
