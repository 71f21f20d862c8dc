"""A PEFT LoRA fine-tune whose frozen base model (Llama-style from its config, bf16) is 60% of
the device: the adapters and their optimizer are tiny, the step's activations do not fit next
to the base. Parameters dominate, and almost none of them have gradients.
KINDS: dominant=parameters phase=forward|backward peft=lora"""
from _zoo import kinds_truth, llama, llama_layer_bytes, require, total_bytes

require("peft", "transformers")
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

T = total_bytes()
HIDDEN, INTER, SEQ = 4096, 11008, 256
LAYERS = max(2, round(0.6 * T / llama_layer_bytes(HIDDEN, INTER, 2)))
base = llama(HIDDEN, INTER, LAYERS, torch.bfloat16, positions=SEQ)
model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
# Each layer keeps about 115 KiB of bf16 inputs a token for backward: a batch that needs the
# device's free 40% four times over.
BATCH = max(2, int(1.6 * T / (LAYERS * SEQ * (115 << 10))))
ids = torch.randint(3, 32000, (BATCH, SEQ), device="cuda")
print(f"fine-tuning a base of {LAYERS} layers at batch {BATCH}")
try:
    out = model(input_ids=ids, labels=ids, use_cache=False)  # EXPECT-LINE
    out.loss.backward()  # EXPECT-LINE
    optimizer.step()
except torch.OutOfMemoryError:
    print("out of memory")
    kinds_truth("peft_lora_big_base", "parameters", [model], [optimizer])
