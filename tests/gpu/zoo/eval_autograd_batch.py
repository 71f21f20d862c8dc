"""Evaluation in eval mode but with autograd on (no `torch.no_grad()`/`inference_mode()`), at a
batch four times what fits: every activation is kept for a backward that never comes. The
largest batch that fits this way is found by bisection.
KINDS: dominant=activations phase=forward eval=1 batch=yes"""
import torch
import torch.nn as nn
from _zoo import batch_truth, kinds_truth, too_large, total_bytes

D, H = 2048, 16384
BATCH = 4 * total_bytes() // (280 << 10)  # about 280 KiB of kept activations a row
model = nn.Sequential(*[nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)) for _ in range(4)])
model = model.cuda().to(torch.bfloat16).eval()


def evaluate(batch):
    x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    scores = model(x)  # EXPECT-LINE
    return scores.float().mean().item()


print(f"evaluating at batch {BATCH}")
failed = None
try:
    too_large(evaluate, BATCH)
except torch.OutOfMemoryError as e:
    failed = e.batch
    print("out of memory in evaluation")
    kinds_truth("eval_autograd_batch", "activations", [model])
if failed:
    batch_truth(evaluate, failed)
