"""A Llama-style model (from its config, float32, 20% of the device) trained with accelerate and
AdamW: weights and gradients fit, the first optimizer step creates the two moments (40% more)
and the update's temporaries do not fit. Optimizer state dominates, behind accelerate's
optimizer wrapper.
KINDS: dominant=optimizer_state phase=optimizer"""
from _zoo import kinds_truth, llama, llama_layer_bytes, require, total_bytes

require("accelerate", "transformers")
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

HIDDEN, INTER = 2048, 5632
LAYERS = max(2, round(0.2 * total_bytes() / llama_layer_bytes(HIDDEN, INTER, 4)))
accelerator = Accelerator()
model = llama(HIDDEN, INTER, LAYERS, torch.float32, positions=512)
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
