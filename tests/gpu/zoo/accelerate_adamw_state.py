"""A Llama-style model (from its config, float32, 20% of the device) trained with accelerate and
AdamW: weights and gradients fit, the first optimizer step creates the two moments (40% more)
and the update's temporaries do not fit. Optimizer state dominates, behind accelerate's
optimizer wrapper.
KINDS: dominant=optimizer_state phase=optimizer"""
from _zoo import require

require("accelerate", "transformers")
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from _zoo import kinds_truth, total_bytes  # noqa: E402

HIDDEN, INTER = 2048, 5632
LAYERS = max(2, round(0.2 * total_bytes() / ((4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER) * 4)))
config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=16,
                     num_key_value_heads=16, vocab_size=32000, max_position_embeddings=512)
accelerator = Accelerator()
with torch.device("cuda"):
    model = LlamaForCausalLM(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
model, optimizer = accelerator.prepare(model, optimizer)
print(f"training {LAYERS} layers")
try:
    for step in range(3):
        ids = torch.randint(3, 32000, (2, 256), device=accelerator.device)
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()  # EXPECT-LINE
        optimizer.zero_grad()
except torch.OutOfMemoryError:
    print("out of memory in the optimizer step")
    kinds_truth("accelerate_adamw_state", "optimizer_state", [model], [optimizer])
