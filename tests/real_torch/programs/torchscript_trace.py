"""torch.jit.trace of a model that already ran eagerly, then served traced."""
import warnings

import torch

warnings.simplefilter("ignore", FutureWarning)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
example = torch.randn(2, 5)
eager = model(example)
traced = torch.jit.trace(model, example)
print(traced.graph.__str__().count("aten::"), "aten ops in the traced graph")
print("same as eager:", torch.allclose(traced(example), eager))
print([round(v, 4) for v in traced(torch.ones(3, 5)).flatten().tolist()])
