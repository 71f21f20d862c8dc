"""Batched generation with a Llama-style model (from its config, bf16, 1.9 GB of weights) at a
batch about four times what fits: the key/value cache of 264 tokens a sequence (128 KiB a token)
and the prefill's temporaries. No autograd (generate runs under no_grad): the phase is
inference, the cache is "activations and other live tensors". The largest batch that fits is
found by bisection.
KINDS: dominant=activations phase=inference batch=yes"""
from _zoo import fail_then_bisect, kinds_truth, llama, require, total_bytes

require("transformers")
import torch  # noqa: E402

PROMPT, NEW = 256, 8
BATCH = max(8, int(4 * total_bytes() / ((PROMPT + NEW) * (128 << 10) * 1.3)))
model = llama(2048, 5632, 16, torch.bfloat16).eval()  # 16 heads of 128: 128 KiB of cache a token


def generate(batch):
    prompts = torch.randint(3, 32000, (batch, PROMPT), device="cuda")
    out = model.generate(prompts, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)  # EXPECT-LINE
    return out.shape


print(f"generating for a batch of {BATCH}")
fail_then_bisect(generate, BATCH, lambda: kinds_truth("hf_generate_batch", "activations", [model]),
                 said="out of memory in generate")
