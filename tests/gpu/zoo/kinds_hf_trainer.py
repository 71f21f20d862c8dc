"""A Hugging Face Trainer (GPT-2 medium from its config: 24 layers × 1024, no download) with a
batch about four times what fits (about 2.5 GB of bf16 activations and logits a sequence of
1024), bf16. The program's only line is `trainer.train()`; the dump still names the module of
GPT-2 and the batch, and the activations. The largest batch that fits is then found by
bisection, with a fresh Trainer (and optimizer) for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes"""
import os

from _zoo import Fresh, Tokens, fail_then_bisect, hf_trainer, kinds_truth, require, total_bytes

require("transformers", "accelerate")
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

os.environ.setdefault("WANDB_DISABLED", "true")
BATCH = max(8, int(4 * total_bytes() / 2.5e9))
config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50257)
with torch.device("cuda"):  # built on the device: initialising on the CPU is slow
    model = GPT2LMHeadModel(config)
train_at = Fresh(lambda batch: hf_trainer(model, Tokens(1024, 50257), batch),
                 lambda trainer: trainer.train(), model)  # EXPECT-LINE


def truth():
    trainer = train_at.latest
    kinds_truth("kinds_hf_trainer", "activations", [trainer.model], [o for o in [trainer.optimizer] if o is not None])


print(f"training at batch {BATCH}")
fail_then_bisect(train_at, BATCH, truth, reset=train_at.forget, said="out of memory in the Trainer")
