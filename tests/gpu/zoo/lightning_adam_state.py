"""A Lightning model of large float32 layers (22% of the device) with Adam: the first optimizer
step, run by Lightning around the program's training_step, creates the two moments (44% more)
and the update's temporaries do not fit. Optimizer state dominates. The truth is counted in a
callback's on_exception, before Lightning's teardown moves the model and the optimizer's state
to the CPU.
KINDS: dominant=optimizer_state phase=optimizer framework=lightning"""
import importlib

from _zoo import GiB, lightning_trainer, require, total_bytes

(LIGHTNING,) = require("lightning.pytorch|pytorch_lightning")
pl = importlib.import_module(LIGHTNING)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

LAYERS = max(2, round(0.22 * total_bytes() / GiB))  # float32 16384×16384: 1 GiB a layer


class Wide(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(16384, 16384, bias=False) for _ in range(LAYERS)])

    def forward(self, x):
        return self.net(x)

    def training_step(self, x, index):
        return self(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4, foreach=True)


class Rows(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.randn(16384, generator=torch.Generator().manual_seed(i))


with torch.device("cuda"):  # built on the device: initialising this many weights on the CPU is slow
    module = Wide()
trainer = lightning_trainer(pl, "lightning_adam_state", "optimizer_state", precision="32-true", max_steps=3)
print(f"training {LAYERS} layers")
try:
    trainer.fit(module, DataLoader(Rows(), batch_size=8))  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory in the optimizer step")
