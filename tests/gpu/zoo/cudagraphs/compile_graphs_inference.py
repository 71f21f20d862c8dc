"""Inference through torch.compile with CUDA graphs (its "reduce overhead" mode), at a batch where
one gated layer's two projections do not fit together: each is about three quarters of the device,
so no single request is larger than the device (the first version, an MLP at four times what fits,
asked inductor for one buffer twice the device's size while it compiled, and the failure was the
request's, not the program's memory). In its own folder, so that the zoo's other programs have no
file beside them that asks for CUDA graphs. Under `oomshim run --torch-allocator` allocator mode
either stays on with the graphs turned off or is off with a line that names this file.
KINDS: dominant=activations phase=inference compile=cudagraphs"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _zoo import kinds_truth, too_large, total_bytes  # noqa: E402

D, H = 1024, 32768


class Gated(nn.Module):
    """SwiGLU's shape: gate(x) and up(x) are both live when they are multiplied."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, H)
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


BATCH = 3 * total_bytes() // 4 // (H * 2)  # one [batch, H] bfloat16 projection: 3/4 of the device
model = nn.Sequential(Gated(), Gated()).cuda().to(torch.bfloat16).eval()
compiled = torch.compile(model, mode="reduce-overhead")  # COMPILE-LINE


def out_of_memory(e):
    """The OutOfMemoryError an exception is or was raised from: one torch.compile hit while it
    compiled comes wrapped (BackendCompilerFailed)."""
    seen = 0
    while e is not None and seen < 16:
        if isinstance(e, torch.OutOfMemoryError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def serve(batch):
    with torch.inference_mode():
        x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
        try:
            return compiled(x).float().mean().item()  # EXPECT-LINE
        except torch.OutOfMemoryError:
            raise
        except Exception as e:
            oom = out_of_memory(e)
            if oom is None:
                raise
            raise oom from None


print(f"serving a batch of {BATCH}")
try:
    too_large(serve, BATCH)
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("compile_graphs_inference", "activations", [model])
