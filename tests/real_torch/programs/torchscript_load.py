"""A TorchScript archive saved and loaded (an inference service's start-up), then served."""
import io
import warnings

import torch

warnings.simplefilter("ignore", FutureWarning)
torch.manual_seed(0)
buf = io.BytesIO()
torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Sigmoid())), buf)
buf.seek(0)
served = torch.jit.load(buf)
with torch.inference_mode():
    print([round(v, 4) for v in served(torch.ones(2, 4)).flatten().tolist()])
print(type(served).__name__)
