"""The program's own hooks: module forward hooks and pre-hooks, global module hooks, a backward
hook and an optimizer step hook; what they see and how often they run."""
import torch
from torch.nn.modules import module as m

torch.manual_seed(0)
seen = []
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
model[0].register_forward_hook(lambda mod, a, out: seen.append(("fwd", tuple(out.shape))))
model.register_forward_pre_hook(lambda mod, a: seen.append(("pre", tuple(a[0].shape))))
g = m.register_module_forward_hook(lambda mod, a, out: seen.append(("global", type(mod).__name__)))
model[2].register_full_backward_hook(lambda mod, gi, go: seen.append(("bwd", tuple(go[0].shape))))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt.register_step_post_hook(lambda o, a, k: seen.append(("step", len(o.param_groups))))
for _ in range(2):
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
g.remove()
model(torch.randn(1, 4))
print(seen)
print("global hooks left", len(m._global_forward_hooks), len(m._global_forward_pre_hooks))
