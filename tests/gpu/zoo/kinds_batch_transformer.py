"""Memory by kind (issue 23): a transformer encoder's forward with a batch far too big. The
activations dominate; the failure is in the forward of one of the encoder's layers, with the
batch (the leading dimension of the model's input) known.
KINDS: dominant=activations phase=forward batch=4096"""
import torch
import torch.nn as nn
from _zoo import kinds_truth

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = nn.TransformerEncoder(layer, num_layers=24).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(4096, 512, 1024, device="cuda")  # a batch of 4096 sequences of 512
try:
    out = model(x)  # EXPECT-LINE
    out.float().pow(2).mean().backward()
    opt.step()
except torch.OutOfMemoryError:
    print("out of memory in the forward pass")
    kinds_truth("kinds_batch_transformer", "activations", [model], [opt])
