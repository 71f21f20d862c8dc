"""Batch inference with a timm ConvNeXt-Base in bf16 under torch.inference_mode(), at a batch
about four times what fits (about 8 MB of temporaries an image in its first stage). The phase is
inference; activations (the batch and one block's temporaries) dominate. The largest batch that
fits is found by bisection.
KINDS: dominant=activations phase=inference batch=yes"""
from _zoo import fail_then_bisect, kinds_truth, require, total_bytes

require("timm")
import timm  # noqa: E402
import torch  # noqa: E402

BATCH = max(16, int(4 * total_bytes() / 8e6))
model = timm.create_model("convnext_base", pretrained=False).cuda().to(torch.bfloat16).eval()


def classify(batch):
    with torch.inference_mode():
        images = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        return model(images).argmax(-1).sum().item()  # EXPECT-LINE


print(f"classifying a batch of {BATCH}")
fail_then_bisect(classify, BATCH, lambda: kinds_truth("timm_convnext_inference", "activations", [model]))
