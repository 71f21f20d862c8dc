"""Multiprocessing workers, forked and spawned, each computing with torch; results and exit
codes as the parent sees them."""
import multiprocessing as mp

import torch


def work(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    return round(model(torch.ones(1, 4)).item(), 5)


if __name__ == "__main__":
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        with ctx.Pool(2) as pool:
            print(method, pool.map(work, range(4)))
        p = ctx.Process(target=work, args=(9,))
        p.start()
        p.join()
        print(method, "exit", p.exitcode)
