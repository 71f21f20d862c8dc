"""accelerate with gradient accumulation (4 micro-batches a step) and bf16, GPT-2 small from its
config, with a micro-batch about four times what fits (about 1.5 GB of activations and logits a
sequence of 1024). Activations dominate; the largest micro-batch that fits a whole accumulated
step is found by bisection.
KINDS: dominant=activations phase=forward|backward batch=yes"""
from _zoo import require

require("accelerate", "transformers")
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from _zoo import fail_then_bisect, kinds_truth, total_bytes  # noqa: E402

SEQ, ACCUMULATE = 1024, 4
BATCH = max(8, int(4 * total_bytes() / 1.5e9))
accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATE, mixed_precision="bf16")
with torch.device("cuda"):
    model = GPT2LMHeadModel(GPT2Config())
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
model, optimizer = accelerator.prepare(model, optimizer)


def accumulated_step(batch):
    for micro in range(ACCUMULATE):
        ids = torch.randint(0, 50257, (batch, SEQ), device=accelerator.device)
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss  # EXPECT-LINE
            accelerator.backward(loss)  # EXPECT-LINE
            optimizer.step()
            optimizer.zero_grad()


print(f"training at micro-batch {BATCH}")
fail_then_bisect(accumulated_step, BATCH,
                 lambda: kinds_truth("accelerate_grad_accum_batch", "activations", [model], [optimizer]),
                 reset=lambda: optimizer.zero_grad(set_to_none=True), warm=1)
