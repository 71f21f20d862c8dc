"""A PEFT LoRA fine-tune of GPT-2 medium (from its config, base weights bf16, adapters on the
attention and projections) under the Hugging Face Trainer, bf16, with a batch about four times
what fits (about 2.5 GB of activations and logits a sequence of 1024). Activations dominate;
the largest batch that fits is found by bisection with a fresh Trainer for each probe.
KINDS: dominant=activations phase=forward|backward batch=yes peft=lora"""
from _zoo import Fresh, Tokens, fail_then_bisect, hf_trainer, kinds_truth, require, total_bytes

require("peft", "transformers", "accelerate")
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

BATCH = max(8, int(4 * total_bytes() / 2.5e9))
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    base = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16))
torch.set_default_dtype(torch.float32)
model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["c_attn", "c_proj"],
                                        fan_in_fan_out=True, task_type="CAUSAL_LM"))
train_at = Fresh(lambda batch: hf_trainer(model, Tokens(1024, 50257), batch),
                 lambda trainer: trainer.train(), model)  # EXPECT-LINE


def truth():
    trainer = train_at.latest
    kinds_truth("peft_lora_trainer", "activations", [model], [o for o in [trainer.optimizer] if o is not None])


print(f"fine-tuning at batch {BATCH}")
fail_then_bisect(train_at, BATCH, truth, reset=train_at.forget, said="out of memory in the Trainer")
