"""Inference through torch.compile with CUDA graphs (its "reduce overhead" mode), at a batch about
four times what fits: the failure is in the compiled function's first (warm-up) run. In its own
folder, so that the zoo's other programs have no file beside them that asks for CUDA graphs.
Under `oomshim run --torch-allocator` allocator mode either stays on with the graphs turned off
or is off with a line that names this file.
KINDS: dominant=activations phase=inference compile=cudagraphs"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _zoo import kinds_truth, too_large, total_bytes, wide_mlp  # noqa: E402

D, H = 1024, 32768
BATCH = 4 * total_bytes() // (130 << 10)  # about 130 KiB of temporaries a row in one block
model = wide_mlp(D, H).eval()
compiled = torch.compile(model, mode="reduce-overhead")  # COMPILE-LINE


def serve(batch):
    with torch.inference_mode():
        x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
        return compiled(x).float().mean().item()  # EXPECT-LINE


print(f"serving a batch of {BATCH}")
try:
    too_large(serve, BATCH)
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("compile_graphs_inference", "activations", [model])
