"""A Lightning model (token embedding, four residual MLP blocks, a classifier head) trained with
bf16-mixed precision at a batch about four times what fits (about 40 MB of activations a
sequence of 512). Lightning moves the model to the CPU when fit ends on an error, so the truth is
counted in a callback's on_exception, while the failure's memory is still on the device. The
largest batch that fits is found by bisection, a fresh Trainer for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes framework=lightning"""
import importlib

from _zoo import Tokens, fail_then_bisect, lightning_trainer, require, total_bytes

(LIGHTNING,) = require("lightning.pytorch|pytorch_lightning")
pl = importlib.import_module(LIGHTNING)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

SEQ, D, H = 512, 1024, 4096
BATCH = max(16, int(4 * total_bytes() / 40e6))


class TokenMLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32000, D)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)) for _ in range(4)])
        self.head = nn.Linear(D, 10)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)  # EXPECT-LINE
        return self.head(h.mean(1))

    def training_step(self, batch, index):
        return F.cross_entropy(self(batch["input_ids"]), batch["labels"])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


module = TokenMLP()


def train_at(batch):
    trainer = lightning_trainer(pl, "lightning_token_mlp", "activations")
    trainer.fit(module, DataLoader(Tokens(SEQ, 32000, classes=10), batch_size=batch))  # EXPECT-LINE


print(f"training at batch {BATCH}")
# The account is printed by the callback, in Lightning's on_exception.
fail_then_bisect(train_at, BATCH, lambda: None, reset=lambda: module.zero_grad(set_to_none=True))
