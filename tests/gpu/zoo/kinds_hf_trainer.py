"""Memory by kind (issue 23): a Hugging Face Trainer (GPT-2 from its config: 24 layers × 1024,
no download) with a batch far too big, bf16. The program's only line is `trainer.train()`; the
dump still names the module of GPT-2 and the batch, and the activations.
KINDS: dominant=activations phase=forward|backward batch=256"""
import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from _zoo import kinds_truth

os.environ.setdefault("WANDB_DISABLED", "true")
config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50257)
with torch.device("cuda"):  # built on the device: initialising on the CPU is slow
    model = GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 50257, (1024,), generator=g)
        return {"input_ids": ids, "labels": ids}


args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=256, max_steps=2, bf16=True,
                         report_to=[], save_strategy="no", logging_steps=1000, dataloader_num_workers=0,
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
try:
    trainer.train()  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory in the Trainer")
    kinds_truth("kinds_hf_trainer", "activations", [trainer.model], [o for o in [trainer.optimizer] if o is not None])
