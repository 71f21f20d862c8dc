"""A residual MLP compiled with torch.compile (inductor, dynamic shapes), trained at a batch
about four times what fits (about 200 KiB of bf16 activations a row). The failure is inside the
compiled code; activations dominate; the largest batch that fits is found by bisection with the
same compiled graph (dynamic: no recompilation).
KINDS: dominant=activations phase=forward|backward batch=yes compile=inductor"""
import torch
import torch.nn as nn
from _zoo import fail_then_bisect, kinds_truth, total_bytes

D, H = 2048, 16384
BATCH = 4 * total_bytes() // (200 << 10)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


model = nn.Sequential(*[Block() for _ in range(4)]).cuda().to(torch.bfloat16)
compiled = torch.compile(model, dynamic=True)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


def train_step(batch):
    x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16)
    loss = compiled(x).float().pow(2).mean()  # EXPECT-LINE
    loss.backward()  # EXPECT-LINE
    opt.step()
    opt.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("compile_mlp_dynamic", "activations", [model], [opt]),
                 reset=lambda: opt.zero_grad(set_to_none=True))
