"""A Hugging Face Trainer fine-tuning a BERT-base classifier (from its config) on sequences of
512, fed by two DataLoader worker processes, bf16, with a batch about four times what fits
(about 0.5 GB of activations a sequence). Activations dominate; the largest batch that fits is
found by bisection with a fresh Trainer for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes workers=2"""
import tempfile

from _zoo import require

require("transformers", "accelerate")
import torch  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402

from _zoo import batch_truth, kinds_truth, too_large, total_bytes  # noqa: E402

SEQ = 512
BATCH = max(8, int(4 * total_bytes() / 0.5e9))
with torch.device("cuda"):
    model = BertForSequenceClassification(BertConfig(num_labels=2))


class Reviews(torch.utils.data.Dataset):
    def __len__(self):
        return 16 * BATCH  # items are made when asked for: room for the doubled batches of too_large

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(1000, 30000, (SEQ,), generator=g),
                "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": torch.tensor(i % 2)}


def trainer_at(batch):
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, max_steps=1, bf16=True,
                             report_to=[], save_strategy="no", logging_steps=1000, dataloader_num_workers=2,
                             disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=Reviews())


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
    kinds_truth("hf_trainer_bert_workers", "activations", [trainer.model], [o for o in [trainer.optimizer] if o is not None])
if failed:
    forget()
    batch_truth(train_at, failed, reset=forget)
