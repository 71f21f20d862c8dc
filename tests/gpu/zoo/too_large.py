"""One request larger than the whole device (a wrong shape)."""
import torch

print("allocating")
heads = 4 * torch.cuda.mem_get_info()[1] // ((1 << 16) * (1 << 16) * 2)  # four times the device
attention = torch.empty(heads, 1 << 16, 1 << 16, dtype=torch.bfloat16, device="cuda")  # EXPECT-LINE
