"""A timm ResNet-50 trained with autocast (bf16) and channels_last on uint8 images that three
DataLoader worker processes make, pinned, at a batch about four times what fits (about 50 MB of
activations an image). Activations dominate; the largest batch that fits is found by bisection
(its probes take their images straight on the device: the device holds the same).
KINDS: dominant=activations phase=forward|backward batch=yes workers=3"""
import shutil

from _zoo import fail_then_bisect, kinds_truth, require, total_bytes

require("timm")
import timm  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

BATCH = max(16, int(4 * total_bytes() / 50e6))
IMAGE = 3 * 224 * 224
model = timm.create_model("resnet50", pretrained=False).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


class Images(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8, generator=g), i % 1000


def loader(batch):
    # Workers hand batches over in shared memory: three batches in flight must fit in /dev/shm.
    try:
        room = shutil.disk_usage("/dev/shm").free
    except OSError:
        room = 0
    workers = 3 if room > 4 * batch * IMAGE else 0
    return DataLoader(Images(), batch_size=batch, num_workers=workers, pin_memory=True,
                      prefetch_factor=1 if workers else None)


def step_on(images, labels):
    x = images.cuda(non_blocking=True).float().div_(255).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), labels.cuda())  # EXPECT-LINE
    loss.backward()  # EXPECT-LINE
    opt.step()
    opt.zero_grad(set_to_none=True)


def train_step(batch):
    images, labels = next(iter(loader(batch)))
    step_on(images, labels)


def probe_step(batch):
    step_on(torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8, device="cuda"),
            torch.randint(0, 1000, (batch,), device="cuda"))


print(f"training at batch {BATCH}")
fail_then_bisect(train_step, BATCH, lambda: kinds_truth("timm_resnet_workers", "activations", [model], [opt]),
                 reset=lambda: opt.zero_grad(set_to_none=True), warm=1, probe=probe_step)
