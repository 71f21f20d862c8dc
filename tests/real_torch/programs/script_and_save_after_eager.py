"""A model that ran eagerly and stepped, then: torch.save of the whole module (pickle),
copy.deepcopy, torch.jit.script of it, and its hooks as the program sees them."""
import copy
import io
import pickle
import warnings

import torch

warnings.simplefilter("ignore", FutureWarning)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
buf = io.BytesIO()
torch.save(model, buf)
print("saved", len(buf.getvalue()) > 0)
buf.seek(0)
loaded = torch.load(buf, weights_only=False)
print("loaded equal", all(torch.equal(a, b) for a, b in zip(loaded.parameters(), model.parameters())))
print("pickled", len(pickle.dumps(model)) > 0)
twin = copy.deepcopy(model)
print("hooks", [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in (model, twin, loaded)])
scripted = torch.jit.script(model)
print("scripted", [round(v, 4) for v in scripted(torch.ones(1, 3)).flatten().tolist()])
print("optimizer hooks", len(opt._optimizer_step_post_hooks), len(opt._optimizer_step_pre_hooks))
