"""What oomshim's Python hook costs a torch program by being there, against its budget:

- `import torch` under the shim (LD_PRELOAD, the hook on) against bare, and with the hook off
  (OOMSHIM_TORCH_HOOK=0: the native library alone), median of PAIRS alternating fresh processes
  (goal: at most 50 ms added, the hook's part and the whole), and the hook's own work at the
  import timed in-process (steady where separate processes spread by a tenth of a second);
- a forward pass of a 3-layer MLP on the CPU (20,000 forwards after a warm-up, best of 5 blocks),
  goal at most 1 µs a forward: by default the hook puts nothing on a forward's path (no module
  hook, global or the module's own: counted in the shimmed process, which makes the figure 0 by
  construction; a bare and a shimmed process are timed too, for the record, whose difference is
  the spread between processes); with OOMSHIM_AUTO_STEPS=forward its global module hooks are taken
  out and put back between blocks of one shimmed process (what they cost);
- an SGD step with and without the hook's optimizer post-hook, same process (for the record).

    python3 benches/python_hook.py [--lib target/release/liboomshim.so] [--pairs 8]

Prints `[FIGURE] name: value vs goal X; detail` lines; exits 0 (figures, not pass/fail).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORT = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"

# In a shimmed process whose hook is off (OOMSHIM_TORCH_HOOK=0, the hook's directory given on
# PYTHONPATH: the package is imported, not started):
# the hook's own work when the program imports torch, timed in that process.
ATTACH = ("import time, torch, _oomshim_hook as h; t = time.perf_counter(); h._attach_torch(torch); "
          "print(time.perf_counter() - t)")

# Runs in the measured process: prints "name seconds" lines.
FORWARD = textwrap.dedent(r"""
    import sys, time, torch
    from torch.nn.modules import module as M
    from torch.optim import optimizer as O
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 64)
    N = 20000

    def block():
        start = time.perf_counter()
        for _ in range(N):
            model(x)
        return (time.perf_counter() - start) / N

    def hooks_out():
        saved = (dict(M._global_forward_pre_hooks), dict(M._global_forward_hooks),
                 dict(getattr(M, "_global_forward_hooks_always_called", {})))
        M._global_forward_pre_hooks.clear()
        M._global_forward_hooks.clear()
        return saved

    def hooks_in(saved):
        M._global_forward_pre_hooks.update(saved[0])
        M._global_forward_hooks.update(saved[1])
        getattr(M, "_global_forward_hooks_always_called", {}).update(saved[2])

    with torch.no_grad():
        for _ in range(2000):
            model(x)
        with_hooks, without = [], []
        for _ in range(5):
            with_hooks.append(block())
            saved = hooks_out()
            without.append(block())
            hooks_in(saved)
    print("forward_with", min(with_hooks))
    print("forward_without", min(without))
    print("global_hooks", len(M._global_forward_pre_hooks) + len(M._global_forward_hooks))
    print("own_hooks", sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()))

    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)

    def steps():
        start = time.perf_counter()
        for _ in range(5000):
            opt.step()
        return (time.perf_counter() - start) / 5000

    steps()
    with_post, without_post = [], []
    for _ in range(5):
        with_post.append(steps())
        saved = dict(O._global_optimizer_post_hooks)
        O._global_optimizer_post_hooks.clear()
        without_post.append(steps())
        O._global_optimizer_post_hooks.update(saved)
    print("step_with", min(with_post))
    print("step_without", min(without_post))
""")


def run(code, env_extra, lib):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    env["OMP_NUM_THREADS"] = "1"
    if lib:
        env["LD_PRELOAD"] = lib
        env["OOMSHIM_DIR"] = os.path.join("/tmp", f"oomshim-bench-{os.getpid()}")
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd="/tmp", timeout=600)
    if out.returncode != 0:
        sys.exit(f"bench: the measured process failed:\n{out.stderr[-2000:]}")
    return out.stdout


def figure(name, value, goal, detail):
    print(f"[FIGURE] {name}: {value} vs goal {goal}; {detail}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "target/release/liboomshim.so"))
    ap.add_argument("--pairs", type=int, default=8)
    args = ap.parse_args()
    lib = os.path.abspath(args.lib)
    if not os.path.isfile(lib):
        sys.exit(f"bench: no {lib} (cargo build --release)")

    # Import time: bare, hook on, hook off, alternating, one fresh process each.
    times = {"bare": [], "hook": [], "no_hook": []}
    for _ in range(args.pairs):
        times["bare"].append(float(run(IMPORT, {}, None)))
        times["hook"].append(float(run(IMPORT, {}, lib)))
        times["no_hook"].append(float(run(IMPORT, {"OOMSHIM_TORCH_HOOK": "0"}, lib)))
    med = {k: statistics.median(v) for k, v in times.items()}
    whole = (med["hook"] - med["bare"]) * 1000
    hook = (med["hook"] - med["no_hook"]) * 1000
    detail = (f"import torch median of {args.pairs}: bare {med['bare']:.3f} s, shimmed {med['hook']:.3f} s, "
              f"hook off {med['no_hook']:.3f} s")
    written = run("import os, _oomshim_hook as h; print(os.path.dirname(os.path.dirname(h.__file__)))",
                  {}, lib).strip()
    # A copy: with the hook off the shim takes its own directory off PYTHONPATH again.
    hook_dir = os.path.join(tempfile.mkdtemp(prefix="oomshim-bench-"), "hook")
    shutil.copytree(written, hook_dir)
    attach = statistics.median(float(run(ATTACH, {"OOMSHIM_TORCH_HOOK": "0", "PYTHONPATH": hook_dir}, lib))
                               for _ in range(args.pairs))
    shutil.rmtree(os.path.dirname(hook_dir), ignore_errors=True)
    figure("import torch, the Python hook's work at the import (in-process)", f"{attach * 1000:.1f} ms", "50 ms",
           f"median of {args.pairs} processes: attaching to torch (observer, step hook) timed where it runs")
    figure("import torch, added by the Python hook", f"{hook:+.0f} ms", "50 ms", detail)
    figure("import torch, added by the shim and its hook", f"{whole:+.0f} ms", "50 ms", detail)

    # Per forward.
    def parse(text):
        return {k: float(v) for k, v in (line.split() for line in text.strip().splitlines())}

    bare = parse(run(FORWARD, {}, None))
    default = parse(run(FORWARD, {}, lib))
    forward = parse(run(FORWARD, {"OOMSHIM_AUTO_STEPS": "forward"}, lib))
    us = 1e6
    hooks = int(default["global_hooks"] + default["own_hooks"])
    figure("a forward under the shim, default (OOMSHIM_AUTO_STEPS unset)",
           "0 µs (no hook on its path)" if hooks == 0 else f"{hooks} module hooks on its path", "1 µs",
           f"for the record, separate processes: bare {bare['forward_with'] * us:.2f} µs, shimmed "
           f"{default['forward_with'] * us:.2f} µs ({(default['forward_with'] - bare['forward_with']) * us:+.2f} µs)")
    figure("a forward with OOMSHIM_AUTO_STEPS=forward (its global hooks, same process)",
           f"{(forward['forward_with'] - forward['forward_without']) * us:+.2f} µs", "1 µs",
           f"{forward['forward_with'] * us:.2f} µs with the hooks, {forward['forward_without'] * us:.2f} µs "
           f"without, 6 module calls a forward (opt-in: every module call pays)")
    figure("an SGD step, the hook's optimizer post-hook (same process)",
           f"{(default['step_with'] - default['step_without']) * us:+.2f} µs", "none (for the record)",
           f"{default['step_with'] * us:.2f} µs with it, {default['step_without'] * us:.2f} µs without "
           f"(a mark of the shim's growth history per step)")


if __name__ == "__main__":
    main()
