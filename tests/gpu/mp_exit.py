"""Workers of a multiprocessing pool (spawn) that use CUDA: one ends with os._exit(0), one is
SIGKILLed; the pool's parent (alive) reaps both. Expect one post-mortem (the killed one) only."""
import multiprocessing as mp, os, signal, sys, time

def work(kind):
    import torch
    kept = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    time.sleep(3)  # a few publishes of the live summary
    if kind == "exit":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=work, args=(k,)) for k in ("exit", "kill")]
    for p in ps: p.start()
    for p in ps: p.join()
    print("exitcodes", [p.exitcode for p in ps], "pids", [p.pid for p in ps], flush=True)
    time.sleep(1.5)
