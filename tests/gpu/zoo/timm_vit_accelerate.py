"""A timm ViT-B/16 (no pretrained weights) trained under accelerate with bf16 mixed precision
and AdamW, at a batch about four times what fits (about 100 MB of activations an image).
Activations dominate; the largest batch that fits is found by bisection.
KINDS: dominant=activations phase=forward|backward batch=yes"""
from _zoo import fail_then_bisect, kinds_truth, require, total_bytes

require("timm", "accelerate")
import timm  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

BATCH = max(16, int(4 * total_bytes() / 100e6))
accelerator = Accelerator(mixed_precision="bf16")
model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, optimizer = accelerator.prepare(model, optimizer)
criterion = torch.nn.CrossEntropyLoss()


def train_step(batch):
    images = torch.randn(batch, 3, 224, 224, device=accelerator.device)
    labels = torch.randint(0, 1000, (batch,), device=accelerator.device)
    loss = criterion(model(images), labels)  # EXPECT-LINE
    accelerator.backward(loss)  # EXPECT-LINE
    optimizer.step()
    optimizer.zero_grad()


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("timm_vit_accelerate", "activations", [model], [optimizer]),
                 reset=lambda: optimizer.zero_grad(set_to_none=True), warm=1)
