"""Evaluation in eval mode but with autograd on (no `torch.no_grad()`/`inference_mode()`), at a
batch four times what fits: every activation is kept for a backward that never comes. The
largest batch that fits this way is found by bisection.
KINDS: dominant=activations phase=forward eval=1 batch=yes"""
import torch
from _zoo import fail_then_bisect, kinds_truth, total_bytes, wide_mlp

D, H = 2048, 16384
BATCH = 4 * total_bytes() // (280 << 10)  # about 280 KiB of kept activations a row
model = wide_mlp(D, H).eval()


def evaluate(batch):
    x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    scores = model(x)  # EXPECT-LINE
    return scores.float().mean().item()


print(f"evaluating at batch {BATCH}")
fail_then_bisect(evaluate, BATCH, lambda: kinds_truth("eval_autograd_batch", "activations", [model]),
                 said="out of memory in evaluation")
