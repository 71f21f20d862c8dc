"""A Hugging Face Trainer (GPT-2 medium from its config: 24 layers × 1024, no download) with a
batch about five times what fits (about 2.5 GB of bf16 activations and logits a sequence of
1024), bf16. The program's only line is `trainer.train()`; the dump still names the module of
GPT-2 and the batch, and the activations. The largest batch that fits is then found by
bisection, with a fresh Trainer (and optimizer) for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes"""
import os
import tempfile

from _zoo import require

require("transformers", "accelerate")
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from _zoo import batch_truth, kinds_truth, too_large, total_bytes  # noqa: E402

os.environ.setdefault("WANDB_DISABLED", "true")
BATCH = max(8, int(4 * total_bytes() / 2.5e9))
config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50257)
with torch.device("cuda"):  # built on the device: initialising on the CPU is slow
    model = GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16 * BATCH  # items are made when asked for: room for the doubled batches of too_large

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 50257, (1024,), generator=g)
        return {"input_ids": ids, "labels": ids}


def trainer_at(batch):
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, max_steps=1, bf16=True,
                             report_to=[], save_strategy="no", logging_steps=1000, dataloader_num_workers=0,
                             disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=Tokens())


trainer = None


def train_at(batch):
    global trainer
    trainer = trainer_at(batch)
    trainer.train()  # EXPECT-LINE


def forget():
    global trainer
    trainer = None
    model.zero_grad(set_to_none=True)


print(f"training at batch {BATCH}")
failed = None
try:
    too_large(train_at, BATCH)
except torch.OutOfMemoryError as e:
    failed = e.batch
    print("out of memory in the Trainer")
    kinds_truth("kinds_hf_trainer", "activations", [trainer.model], [o for o in [trainer.optimizer] if o is not None])
if failed:
    forget()
    batch_truth(train_at, failed, reset=forget)
