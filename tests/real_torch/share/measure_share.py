"""How well the hook's sizes of a forward pass's leaf modules (`_OutputSizes`, which reads only
the modules' attributes) predict where the activations of a real model's pass are, on the CPU.

For each model: its leaf modules are run once in training (batch 2) with forward hooks that note
each leaf's real output size and a `saved_tensors_hooks` pair that notes which leaf was running
when autograd saved each tensor (parameters and tensors saved twice not counted): at each leaf,
the share of the pass's saved bytes (the loss's included) that autograd held when it ended. The
batch advice scales what a failure held by the share the hook predicts, so the prediction over
the truth, at every fifth of the pass, is what this prints, one JSON object a model:
`{"model", "leaves", "sized", "exact", "ratios": [..], "leaf_ratios": [..]}` (`ratios` by output
size, `leaf_ratios` counting leaves alike, as the hook did before).

    python3 measure_share.py HOOK_DIR [MODEL ...]    # gpt2 bert llama resnet50 vit convnext

Needs torch, transformers and timm (models from their configs: nothing is downloaded)."""
import json
import sys

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from _oomshim_hook import kinds as hook  # noqa: E402

QUANTILES = (0.2, 0.4, 0.6, 0.8)


def leaves(model):
    return [m for _, m in model.named_modules() if next(iter(m.children()), None) is None]


def measure(name, model, x, loss_of):
    model.train()
    ls = leaves(model)
    index = {id(m): i for i, m in enumerate(ls)}
    batch = x.shape[0]
    real = [0] * len(ls)
    saved = [0] * (len(ls) + 1)  # bytes saved while each leaf ran; the last: the loss
    running = [0]
    seen = set()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def before(m, args):
        running[0] = index[id(m)]

    def after(m, args, out):
        t = out[0] if isinstance(out, (tuple, list)) else out
        if torch.is_tensor(t):
            real[index[id(m)]] = t.numel() // batch

    def pack(t):
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if key[0] not in params and key not in seen:
            seen.add(key)
            saved[running[0]] += s.nbytes()
        return t

    handles = [h for m in ls for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
            running[0] = len(ls)
            loss_of(out)
    finally:
        for h in handles:
            h.remove()
    sizes = hook._OutputSizes(list(x.shape))
    sized = [sizes.after(m) for m in ls]
    true_total, sized_total = sum(saved), sum(sized)
    ratios, leaf_ratios = [], []
    for q in QUANTILES:
        i = int(q * len(ls))
        truth = sum(saved[: i + 1]) / true_total
        ratios.append(round(sum(sized[: i + 1]) / sized_total / truth, 3))
        leaf_ratios.append(round((i + 1) / len(ls) / truth, 3))
    ran = [i for i in range(len(ls)) if real[i]]
    print(json.dumps({"model": name, "leaves": len(ls), "sized": sizes.known,
                      "exact": sum(1 for i in ran if sized[i] == real[i]) / max(len(ran), 1),
                      "ratios": ratios, "leaf_ratios": leaf_ratios}), flush=True)


def lm_loss(x):
    return lambda o: nn.functional.cross_entropy(o.logits.float().flatten(0, 1), x.flatten())


def main():
    import timm
    import transformers

    torch.manual_seed(0)
    t = transformers
    models = {
        "gpt2": lambda: (t.GPT2LMHeadModel(t.GPT2Config(n_layer=6)), torch.randint(0, 50257, (2, 256)), "lm"),
        "bert": lambda: (t.BertForSequenceClassification(t.BertConfig(num_hidden_layers=6)),
                         torch.randint(0, 30000, (2, 256)), "sum"),
        "llama": lambda: (t.LlamaForCausalLM(t.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                                           num_attention_heads=4, num_key_value_heads=4,
                                                           vocab_size=32000)),
                          torch.randint(0, 32000, (2, 128)), "lm"),
        "resnet50": lambda: (timm.create_model("resnet50"), torch.randn(2, 3, 160, 160), "sum"),
        "vit": lambda: (timm.create_model("vit_small_patch16_224"), torch.randn(2, 3, 224, 224), "sum"),
        "convnext": lambda: (timm.create_model("convnext_tiny"), torch.randn(2, 3, 160, 160), "sum"),
    }
    for name in sys.argv[2:] or list(models):
        model, x, loss = models[name]()
        measure(name, model, x, lm_loss(x) if loss == "lm" else (lambda o: (o.logits if hasattr(o, "logits") else o).sum()))


if __name__ == "__main__":
    main()
