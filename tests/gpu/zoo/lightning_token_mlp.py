"""A Lightning model (token embedding, four residual MLP blocks, a classifier head) trained with
bf16-mixed precision at a batch about four times what fits (about 40 MB of activations a
sequence of 512). Lightning moves the model to the CPU when fit ends on an error, so the truth is
counted in a callback's on_exception, while the failure's memory is still on the device. The
largest batch that fits is found by bisection, a fresh Trainer for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes framework=lightning"""
import importlib

from _zoo import batch_truth, kinds_truth, require, too_large, total_bytes

(LIGHTNING,) = require("lightning.pytorch|pytorch_lightning")
pl = importlib.import_module(LIGHTNING)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

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
        ids, labels = batch
        return F.cross_entropy(self(ids), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Tokens(Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 32000, (SEQ,), generator=g), i % 10


class Truth(pl.Callback):
    """The program's own count at its first failure, before Lightning's teardown moves the model."""
    said = False

    def on_exception(self, trainer, module, exception):
        if isinstance(exception, torch.OutOfMemoryError) and not Truth.said:
            Truth.said = True
            kinds_truth("lightning_token_mlp", "activations", [module], trainer.optimizers)


module = TokenMLP()
trainer = None


def train_at(batch):
    global trainer
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=1, precision="bf16-mixed", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Truth()])
    trainer.fit(module, DataLoader(Tokens(), batch_size=batch))  # EXPECT-LINE


def forget():
    global trainer
    trainer = None
    module.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
failed = None
try:
    too_large(train_at, BATCH)
except torch.OutOfMemoryError as e:
    failed = e.batch
    print("out of memory")
if failed:
    forget()
    batch_truth(train_at, failed, reset=forget)
