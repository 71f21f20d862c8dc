"""A batch-size finder: halves the batch after every OutOfMemoryError until one step fits."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(8192, 8192, dtype=torch.bfloat16).cuda()
batch = 2 * torch.cuda.mem_get_info()[1] // (8192 * 2)  # an input twice the device
while batch >= 1024:
    try:
        x = torch.randn(batch, 8192, dtype=torch.bfloat16, device="cuda")  # EXPECT-LINE
        out = model(x)  # EXPECT-LINE
        out.float().mean().backward()
        print(f"batch {batch} fits")
        break
    except torch.OutOfMemoryError:
        print(f"batch {batch} does not fit")
        x = out = None
        model.zero_grad(set_to_none=True)
        batch //= 2
