"""torch's CUDA out-of-memory path on a machine without a GPU, for the differential harness
(tests/real_torch/harness.py).

On a failed allocation torch calls the out-of-memory observers attached with
`torch._C._cuda_attach_out_of_memory_observer`, on the failing thread, then raises
`torch.OutOfMemoryError` ("CUDA out of memory. Tried to allocate ..."). An observer attached
before CUDA is initialised waits in torch's lazy-initialisation queue (`torch.cuda._queued_calls`),
which is never run on a machine without a GPU. `fail()` runs the queue's calls that are not
torch's own, once, with the attach function collecting what they attach, then calls what was
attached and raises, as torch does. Without the shim nothing is queued and `fail()` only raises.

`torch.cuda.memory._snapshot()` needs a GPU: where there is none it answers an empty snapshot
(no segments), as torch's does on a device with nothing allocated.
"""

import torch

_observers = None


def _collect():
    found = []
    attach = torch._C._cuda_attach_out_of_memory_observer
    torch._C._cuda_attach_out_of_memory_observer = found.append
    try:
        for fn, _where in list(torch.cuda._queued_calls):
            if (getattr(fn, "__module__", "") or "").startswith("torch"):
                continue  # torch's own checks want a GPU
            try:
                fn()
            except Exception:
                pass
    finally:
        torch._C._cuda_attach_out_of_memory_observer = attach
    return found


if not torch.cuda.is_available():
    torch.cuda.memory._snapshot = lambda *a, **k: {"segments": [], "device_traces": [[]]}


def fail(nbytes, device=0, total=80 << 30, free=1 << 30):
    """An allocation of `nbytes` on `device` that does not fit: torch's observers, then its
    error."""
    global _observers
    if _observers is None:
        _observers = _collect()
    for observe in _observers:
        observe(device, nbytes, total, free)
    raise torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {nbytes / (1 << 20):.2f} MiB. GPU {device} has a total "
        f"capacity of {total / (1 << 30):.2f} GiB of which {free / (1 << 20):.2f} MiB is free.")
