"""torch.compile with its defaults (inductor): a training step and an evaluation pass, then the
compile and recompile counts as the program sees them (torch._dynamo's counters)."""
import torch
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
compiled = torch.compile(model)
for step in range(3):
    loss = compiled(torch.randn(5, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step", step, round(loss.item(), 4))
with torch.no_grad():
    print("eval", [round(v, 4) for v in compiled(torch.ones(5, 8)).sum(1).tolist()])
torch.compiler.set_stance("fail_on_recompile")
for step in range(2):
    loss = compiled(torch.randn(5, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("steady", step, round(loss.item(), 4))
with torch.no_grad():
    print("eval", [round(v, 4) for v in compiled(torch.ones(5, 8)).sum(1).tolist()])
print("stats", dict(sorted(counters["stats"].items())))
print("frames", dict(sorted(counters["frames"].items())))
print("recompiles", sum(v for k, v in counters["recompiles"].items()) if counters["recompiles"] else 0)
print("graph breaks", sum(counters["graph_break"].values()))
