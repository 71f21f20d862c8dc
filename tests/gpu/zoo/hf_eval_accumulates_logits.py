"""Trainer.evaluate with a compute_metrics function and no eval_accumulation_steps: the Trainer
keeps every batch's logits (8 × 512 × 50257 float32, 0.8 GB) on the GPU, concatenated, until
the end of the evaluation, and runs out part way. GPT-2 small from its config. Activations (the
kept logits) dominate, grown one evaluation batch at a time inside transformers.
KINDS: dominant=activations phase=outside|inference leak=1"""
import tempfile

from _zoo import require

require("transformers", "accelerate")
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from _zoo import kinds_truth, total_bytes  # noqa: E402

SEQ, BATCH = 512, 8
# Enough batches to hold the device's worth of logits twice over.
BATCHES = int(2 * total_bytes() / (BATCH * SEQ * 50257 * 4)) + 8
with torch.device("cuda"):
    model = GPT2LMHeadModel(GPT2Config())


class Held(torch.utils.data.Dataset):
    def __len__(self):
        return BATCH * BATCHES

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 50257, (SEQ,), generator=g)
        return {"input_ids": ids, "labels": ids}


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_eval_batch_size=BATCH, report_to=[],
                         save_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
trainer = Trainer(model=model, args=args, eval_dataset=Held(), compute_metrics=accuracy)
print(f"evaluating {BATCHES} batches")
try:
    trainer.evaluate()  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory in evaluate")
    kinds_truth("hf_eval_accumulates_logits", "activations", [trainer.model])
