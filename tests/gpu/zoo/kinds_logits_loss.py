"""Memory by kind (issue 23): a small language model whose logits (batch × sequence ×
vocabulary, upcast to float32 in the loss) do not fit: the failure is in the loss, and the
advice is a chunked loss.
KINDS: dominant=activations phase=forward in_loss=1"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from _zoo import kinds_truth

VOCAB, DIM, SEQ, BATCH = 256_000, 1024, 4096, 24  # bf16 logits 50 GiB; float32 100 GiB


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.block = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU(), nn.Linear(DIM, DIM))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids, labels):
        h = self.block(self.embed(input_ids))
        logits = self.lm_head(h)
        return compute_loss(logits, labels)


def compute_loss(logits, labels):
    return F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))  # EXPECT-LINE


model = TinyLM().cuda().to(torch.bfloat16)
ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
try:
    loss = model(ids, ids)  # EXPECT-LINE
    loss.backward()
except torch.OutOfMemoryError:
    print("out of memory in the loss")
    kinds_truth("kinds_logits_loss", "activations", [model])
