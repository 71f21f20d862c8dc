"""A Lightning transformer encoder (6 layers × 512) fed by four persistent DataLoader worker
processes, bf16-mixed, at a batch about four times what fits (about 40 MB of activations a
sequence of 256). Activations dominate; the truth is counted in a callback's on_exception; the
largest batch that fits is found by bisection, a fresh Trainer and loader for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes workers=4 framework=lightning"""
import importlib

from _zoo import Tokens, fail_then_bisect, lightning_trainer, require, total_bytes

(LIGHTNING,) = require("lightning.pytorch|pytorch_lightning")
pl = importlib.import_module(LIGHTNING)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

SEQ, D = 256, 512
BATCH = max(16, int(4 * total_bytes() / 40e6))


class Encoder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32000, D)
        layer = nn.TransformerEncoderLayer(d_model=D, nhead=8, dim_feedforward=4 * D, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=6)
        self.head = nn.Linear(D, 2)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(1))  # EXPECT-LINE

    def training_step(self, batch, index):
        return F.cross_entropy(self(batch["input_ids"]), batch["labels"])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


module = Encoder()


def train_at(batch):
    trainer = lightning_trainer(pl, "lightning_transformer_workers", "activations")
    loader = DataLoader(Tokens(SEQ, 32000, classes=2), batch_size=batch, num_workers=4, persistent_workers=True)
    trainer.fit(module, loader)  # EXPECT-LINE


print(f"training at batch {BATCH}")
# The account is printed by the callback, in Lightning's on_exception.
fail_then_bisect(train_at, BATCH, lambda: None, reset=lambda: module.zero_grad(set_to_none=True))
