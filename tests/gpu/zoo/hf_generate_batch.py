"""Batched generation with a Llama-style model (from its config, bf16, 1.9 GB of weights) at a
batch about four times what fits: the key/value cache of 264 tokens a sequence (128 KiB a token)
and the prefill's temporaries. No autograd (generate runs under no_grad): the phase is
inference, the cache is "activations and other live tensors". The largest batch that fits is
found by bisection.
KINDS: dominant=activations phase=inference batch=yes"""
from _zoo import require

require("transformers")
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from _zoo import batch_truth, kinds_truth, too_large, total_bytes  # noqa: E402

PROMPT, NEW = 256, 8
BATCH = max(8, int(4 * total_bytes() / ((PROMPT + NEW) * (128 << 10) * 1.3)))
config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                     num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).eval()
torch.set_default_dtype(torch.float32)


def generate(batch):
    prompts = torch.randint(3, 32000, (batch, PROMPT), device="cuda")
    out = model.generate(prompts, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)  # EXPECT-LINE
    return out.shape


print(f"generating for a batch of {BATCH}")
failed = None
try:
    too_large(generate, BATCH)
except torch.OutOfMemoryError as e:
    failed = e.batch
    print("out of memory in generate")
    kinds_truth("hf_generate_batch", "activations", [model])
if failed:
    batch_truth(generate, failed)
