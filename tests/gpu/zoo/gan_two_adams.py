"""A GAN with two models and two Adam optimizers: a large float32 generator (22% of the
device), a small discriminator. The discriminator's step fits; the generator's first step
creates its moments (44% more) and its update's temporaries do not fit. Optimizer state
dominates, held by two optimizers.
KINDS: dominant=optimizer_state phase=optimizer optimizers=2"""
import torch
import torch.nn as nn
from _zoo import GiB, kinds_truth, total_bytes

T = total_bytes()
G_LAYERS = max(2, round(0.22 * T / GiB))  # float32 16384×16384: 1 GiB a layer
generator = nn.Sequential(*[nn.Linear(16384, 16384, bias=False, device="cuda") for _ in range(G_LAYERS)])
discriminator = nn.Sequential(nn.Linear(16384, 4096, device="cuda"), nn.LeakyReLU(0.2), nn.Linear(4096, 1, device="cuda"))
opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999), foreach=True)
opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999), foreach=True)
bce = nn.BCEWithLogitsLoss()
print(f"training a generator of {G_LAYERS} layers")
try:
    for step in range(3):
        z = torch.randn(16, 16384, device="cuda")
        real = torch.randn(16, 16384, device="cuda")
        fake = generator(z)
        d_loss = bce(discriminator(real), torch.ones(16, 1, device="cuda")) + \
            bce(discriminator(fake.detach()), torch.zeros(16, 1, device="cuda"))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(discriminator(fake), torch.ones(16, 1, device="cuda"))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()  # EXPECT-LINE
except torch.OutOfMemoryError:
    print("out of memory in the generator's step")
    kinds_truth("gan_two_adams", "optimizer_state", [generator, discriminator], [opt_g, opt_d])
