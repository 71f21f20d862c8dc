"""A PEFT LoRA fine-tune of GPT-2 medium (from its config, base weights bf16, adapters on the
attention and projections) under the Hugging Face Trainer, bf16, with a batch about four times
what fits (about 2.5 GB of activations and logits a sequence of 1024). Activations dominate;
the largest batch that fits is found by bisection with a fresh Trainer for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes peft=lora"""
import tempfile

from _zoo import require

require("peft", "transformers", "accelerate")
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from _zoo import batch_truth, kinds_truth, too_large, total_bytes  # noqa: E402

BATCH = max(8, int(4 * total_bytes() / 2.5e9))
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    base = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16))
torch.set_default_dtype(torch.float32)
model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["c_attn", "c_proj"],
                                        fan_in_fan_out=True, task_type="CAUSAL_LM"))


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
                             disable_tqdm=True, remove_unused_columns=False)
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


print(f"fine-tuning at batch {BATCH}")
failed = None
try:
    too_large(train_at, BATCH)
except torch.OutOfMemoryError as e:
    failed = e.batch
    print("out of memory in the Trainer")
    kinds_truth("peft_lora_trainer", "activations", [trainer.model], [o for o in [trainer.optimizer] if o is not None])
if failed:
    forget()
    batch_truth(train_at, failed, reset=forget)
