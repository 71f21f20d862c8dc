"""A DataLoader-fed training loop with sequences of varying length (dynamic shapes); the
longest batch does not fit."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from _zoo import load_weights

torch.manual_seed(0)


class Lengths(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        # Sequence lengths grow with a wobble: each batch has a shape of its own, and the last
        # ones are far longer than the first.
        n = 256 + (i * 37) % 512 + i * i
        return torch.randint(0, 32000, (n,))


def collate(batch):
    n = max(len(b) for b in batch)
    return torch.stack([nn.functional.pad(b, (0, n - len(b))) for b in batch])


model = nn.Sequential(nn.Embedding(32000, 1024), nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
weights = load_weights(0.1)
print("training")
for tokens in DataLoader(Lengths(), batch_size=8, collate_fn=collate):
    tokens = tokens.cuda()
    out = model(tokens)  # EXPECT-LINE
    loss = out.float().pow(2).mean()
    # The longest batches fail in the forward (the line above) or here, in their backward pass.
    loss.backward()  # EXPECT-LINE
    opt.step()
    opt.zero_grad(set_to_none=True)
