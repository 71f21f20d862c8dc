"""A training loop fed by four DataLoader worker processes (pinned memory) with sequences that
grow longer batch after batch (a length curriculum, no bucketing): the batch of about the 28th
step does not fit. Activations dominate, in the forward or the backward pass.
KINDS: dominant=activations phase=forward|backward workers=4"""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from _zoo import kinds_truth, total_bytes

torch.manual_seed(0)
PER_TOKEN = 22 << 10  # bf16 activations a token, about
# Lengths that reach twice what fits by the 40th batch of 8.
LONGEST = int(2 * total_bytes() / (PER_TOKEN * 8))


class Lengths(Dataset):
    def __len__(self):
        return 8 * 48

    def __getitem__(self, i):
        n = 256 + int(LONGEST * (i // 8 / 40) ** 2)
        return torch.randint(0, 32000, (n,), generator=torch.Generator().manual_seed(i))


def collate(batch):
    n = max(len(b) for b in batch)
    return torch.stack([nn.functional.pad(b, (0, n - len(b))) for b in batch])


model = nn.Sequential(nn.Embedding(32000, 1024), nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
model = model.cuda().to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = DataLoader(Lengths(), batch_size=8, collate_fn=collate, num_workers=4, pin_memory=True)
print("training")
try:
    for tokens in loader:
        tokens = tokens.cuda(non_blocking=True)
        out = model(tokens)  # EXPECT-LINE
        loss = out.float().pow(2).mean()
        loss.backward()  # EXPECT-LINE
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("dataloader_workers_lengths", "activations", [model], [opt])
