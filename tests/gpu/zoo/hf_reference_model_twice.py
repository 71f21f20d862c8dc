"""A policy and its frozen reference copy (as DPO or RLHF trainers keep them): a Llama-style
model from its config, bf16, 36% of the device, and `copy.deepcopy` of it. The reference's
forward pass over a large batch runs out. Parameters dominate, held by two models of the same
shapes: the model is named as held twice.
KINDS: dominant=parameters duplicate=2 phase=inference"""
import copy

from _zoo import require

require("transformers")
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from _zoo import kinds_truth, total_bytes  # noqa: E402

T = total_bytes()
HIDDEN, INTER, SEQ = 4096, 11008, 1024
LAYERS = max(2, round(0.36 * T / ((4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER) * 2)))
config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, max_position_embeddings=SEQ)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    policy = LlamaForCausalLM(config)
torch.set_default_dtype(torch.float32)
reference = copy.deepcopy(policy).eval().requires_grad_(False)
# A batch whose MLP temporaries in one layer alone are half the device.
BATCH = max(2, int(0.5 * T / (SEQ * (HIDDEN + 3 * INTER) * 2)))
ids = torch.randint(3, 32000, (BATCH, SEQ), device="cuda")
print(f"two copies of {LAYERS} layers; reference pass at batch {BATCH}")
try:
    with torch.no_grad():
        ref_logits = reference(input_ids=ids, use_cache=False).logits  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory in the reference pass")
    kinds_truth("hf_reference_model_twice", "parameters", [policy, reference])
