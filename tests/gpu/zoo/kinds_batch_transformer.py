"""A transformer encoder's training step with a batch four times what fits (about 1 GiB of
float32 activations a sequence of 512). The activations dominate; the failure is in the forward
of one of the encoder's layers, with the batch (the leading dimension of the model's input)
known. The largest batch that fits is then found by bisection.
KINDS: dominant=activations phase=forward batch=yes"""
import torch
import torch.nn as nn
from _zoo import GiB, fail_then_bisect, kinds_truth, total_bytes

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = nn.TransformerEncoder(layer, num_layers=24).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
BATCH = max(8, 4 * total_bytes() // GiB)  # sequences of 512


def train_step(batch):
    x = torch.randn(batch, 512, 1024, device="cuda")
    out = model(x)  # EXPECT-LINE
    out.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("kinds_batch_transformer", "activations", [model], [opt]),
                 reset=lambda: opt.zero_grad(set_to_none=True), warm=1, said="out of memory in the forward pass")
