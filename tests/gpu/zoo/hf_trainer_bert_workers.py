"""A Hugging Face Trainer fine-tuning a BERT-base classifier (from its config) on sequences of
512, fed by two DataLoader worker processes, bf16, with a batch about four times what fits
(about 0.5 GB of activations a sequence). Activations dominate; the largest batch that fits is
found by bisection with a fresh Trainer for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes workers=2"""
from _zoo import Fresh, Tokens, fail_then_bisect, hf_trainer, kinds_truth, require, total_bytes

require("transformers", "accelerate")
import torch  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification  # noqa: E402

BATCH = max(8, int(4 * total_bytes() / 0.5e9))
with torch.device("cuda"):
    model = BertForSequenceClassification(BertConfig(num_labels=2))
train_at = Fresh(lambda batch: hf_trainer(model, Tokens(512, 30000, classes=2), batch, workers=2),
                 lambda trainer: trainer.train(), model)  # EXPECT-LINE


def truth():
    trainer = train_at.latest
    kinds_truth("hf_trainer_bert_workers", "activations", [trainer.model],
                [o for o in [trainer.optimizer] if o is not None])


print(f"fine-tuning at batch {BATCH}")
fail_then_bisect(train_at, BATCH, truth, reset=train_at.forget, said="out of memory in the Trainer")
