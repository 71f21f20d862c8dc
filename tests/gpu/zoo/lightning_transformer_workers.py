"""A Lightning transformer encoder (6 layers × 512) fed by four persistent DataLoader worker
processes, bf16-mixed, at a batch about four times what fits (about 40 MB of activations a
sequence of 256). Activations dominate; the truth is counted in a callback's on_exception; the
largest batch that fits is found by bisection, a fresh Trainer and loader for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes workers=4 framework=lightning"""
import importlib

from _zoo import batch_truth, kinds_truth, require, too_large, total_bytes

(LIGHTNING,) = require("lightning.pytorch|pytorch_lightning")
pl = importlib.import_module(LIGHTNING)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

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
        ids, labels = batch
        return F.cross_entropy(self(ids), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Tokens(Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 32000, (SEQ,), generator=g), i % 2


class Truth(pl.Callback):
    said = False

    def on_exception(self, trainer, module, exception):
        if isinstance(exception, torch.OutOfMemoryError) and not Truth.said:
            Truth.said = True
            kinds_truth("lightning_transformer_workers", "activations", [module], trainer.optimizers)


module = Encoder()
trainer = None


def train_at(batch):
    global trainer
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=1, precision="bf16-mixed", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Truth()])
    loader = DataLoader(Tokens(), batch_size=batch, num_workers=4, persistent_workers=True)
    trainer.fit(module, loader)  # EXPECT-LINE


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
