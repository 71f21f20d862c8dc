"""A small language model whose logits (batch × sequence × vocabulary, upcast to float32 in the
loss) do not fit: the bfloat16 logits take 40% of the device, their float32 copy 80%. The
failure is in the loss, and the advice is a chunked loss; the largest batch that fits is then
found by bisection.
KINDS: dominant=activations phase=forward in_loss=1 batch=yes"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from _zoo import fail_then_bisect, kinds_truth, total_bytes

VOCAB, DIM, SEQ = 256_000, 1024, 1024
BATCH = max(2, int(0.4 * total_bytes() / (SEQ * VOCAB * 2)))


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


def train_step(batch):
    ids = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
    loss = model(ids, ids)  # EXPECT-LINE
    loss.backward()
    model.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("kinds_logits_loss", "activations", [model]),
                 reset=lambda: model.zero_grad(set_to_none=True), said="out of memory in the loss")
