"""torch.fx symbolic tracing (a custom submodule that fx calls, with proxies, through
Module.__call__) and torch.export of the same model: the graphs as the program sees them."""
import torch
import torch.fx

torch.manual_seed(0)


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.inner(x) + x)


model = Outer()
traced = torch.fx.symbolic_trace(model)
print(traced.code.strip())
print("fx nodes", len(traced.graph.nodes))
exported = torch.export.export(model, (torch.randn(3, 4),))
print("export ops", sorted(str(n.target) for n in exported.graph.nodes if n.op == "call_function"))
x = torch.ones(3, 4)
print("same", torch.allclose(traced(x), model(x)), torch.allclose(exported.module()(x), model(x)))
