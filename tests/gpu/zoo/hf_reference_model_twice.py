"""A policy and its frozen reference copy (as DPO or RLHF trainers keep them): a Llama-style
model from its config, bf16, 36% of the device, and `copy.deepcopy` of it. The reference's
forward pass over a large batch runs out. Parameters dominate, held by two models of the same
shapes: the model is named as held twice.
KINDS: dominant=parameters duplicate=2 phase=inference"""
import copy

from _zoo import kinds_truth, llama, llama_layer_bytes, require, total_bytes

require("transformers")
import torch  # noqa: E402

T = total_bytes()
HIDDEN, INTER, SEQ = 4096, 11008, 1024
LAYERS = max(2, round(0.36 * T / llama_layer_bytes(HIDDEN, INTER, 2)))
policy = llama(HIDDEN, INTER, LAYERS, torch.bfloat16, positions=SEQ)
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
