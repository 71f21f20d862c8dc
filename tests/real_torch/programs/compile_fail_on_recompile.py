"""A model that ran eagerly first, then compiled three ways (torch.compile(model),
model.compile(), a compiled function that calls the model) and its optimizer step compiled too;
after the first calls the stance is fail_on_recompile: any recompile raises."""
import torch
from torch._dynamo.utils import counters
from _models import TwoLayers

torch.manual_seed(0)

model = TwoLayers(6, 2, torch.nn.Sigmoid)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
x = torch.randn(3, 6)
model(x).sum().backward()  # eager first
opt.step()
opt.zero_grad()

compiled = torch.compile(model, backend="aot_eager")
other = TwoLayers(6, 2, torch.nn.Sigmoid)
other.compile(backend="aot_eager")


@torch.compile(backend="aot_eager")
def infer(inp):
    return model(inp).softmax(-1)


@torch.compile(backend="eager")
def opt_step():
    opt.step()


def round_all(t):
    return [round(v, 4) for v in t.flatten().tolist()]


for phase in ("warm", "steady"):
    for i in range(2):
        out = compiled(x + i)
        out.sum().backward()
        opt_step()
        opt.zero_grad()
        print(phase, i, round_all(out), round_all(other(x)), round_all(infer(x)))
    if phase == "warm":
        torch.compiler.set_stance("fail_on_recompile")
print("unique graphs", counters["stats"]["unique_graphs"])
print("graph breaks", sum(counters["graph_break"].values()))
