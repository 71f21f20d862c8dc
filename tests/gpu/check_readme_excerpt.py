"""GPU check of what a PyTorch user sees at an out-of-memory error, and the README's "On a GPU"
excerpt made from it: a small training loop that keeps one activation-sized tensor per step
(sized from the device: a fortieth of its total each, so the device fills in about 40 steps)
runs under `oomshim run` (torch's allocator, watched under LD_PRELOAD) and under
`oomshim run --torch-allocator` until torch raises OutOfMemoryError. For each:

- [PASS/FAIL] the program's own output and exit are torch's (it dies of OutOfMemoryError);
- [PASS/FAIL] stderr carries oomshim's two lines (the verdict, the dump);
- [PASS/FAIL] `oomshim report --width 80` opens with at most 12 lines, none over 80 columns,
  with the verdict, the change and where the details are in them;
- [PASS/FAIL] the stderr line's verdict is the report's (the same words);
- [PASS/FAIL] the verdict names the leaking line of the program (`keep.append`'s line);
- [INFO] the excerpt for the README (dated, with the GPU and torch version) in
  OUT_DIR/readme_gpu_excerpt.md, for the lead to paste under "On a GPU".

Each case runs at most 300 s. Lines go to stdout as they are decided and to OUT_DIR/rows.txt.

    python3 tests/gpu/check_readme_excerpt.py OUT_DIR          on the GPU machine
    python3 tests/gpu/check_readme_excerpt.py OUT_DIR --demo   here: the same checks on
                                                                `oomshim demo` (no GPU)

OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI name liboomshim.so and the CLI (default target/release/...)."""

import datetime
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = os.environ.get("OOMSHIM_GPU_LIB", os.path.join(ROOT, "target/release/liboomshim.so"))
CLI = os.environ.get("OOMSHIM_GPU_CLI", os.path.join(ROOT, "target/release/oomshim"))
TIMEOUT = 300
FIRST_SCREEN_LINES = 12
WIDTH = 80

# A training loop that keeps a tensor per step (the classic leak: activations kept for
# logging). KEEP_LINE is the line the verdict should name.
PROGRAM = r'''
import torch
free, total = torch.cuda.mem_get_info()
per_step = total // 40
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
keep = []
for step in range(10000):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    keep.append(torch.empty(per_step, dtype=torch.uint8, device="cuda"))  # KEEP_LINE
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.4f}", flush=True)
'''
KEEP_LINE = next(i + 1 for i, l in enumerate(PROGRAM.splitlines()) if "KEEP_LINE" in l)


def row(out_dir, status, name, detail):
    line = f"[{status}] {name}: {detail}"
    print(line, flush=True)
    with open(os.path.join(out_dir, "rows.txt"), "a") as f:
        f.write(line + "\n")


def run(cmd, cwd, env=None, timeout=TIMEOUT):
    e = dict(os.environ)
    e.update(env or {})
    e.setdefault("PAGER", "cat")
    try:
        return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as t:
        return subprocess.CompletedProcess(cmd, 124, t.stdout or "", f"timed out after {timeout} s")


def first_screen(report_text):
    """The report's lines up to its first blank line."""
    return report_text.split("\n\n", 1)[0].splitlines()


def verdict_words(lines):
    """The verdict as one line: the `Verdict: ` line and its indented continuation."""
    out, inside = [], False
    for l in lines:
        if l.startswith("Verdict: "):
            inside = True
            out.append(l[len("Verdict: "):])
        elif inside and l.startswith("  "):
            out.append(l.strip())
        elif inside:
            break
    return " ".join(out)


def check_case(out_dir, name, cwd, stderr_text, expect_line):
    """The checks on one run's stderr and report; returns the first screen."""
    shim = [l for l in stderr_text.splitlines() if l.startswith("oomshim: ") and "snapshot" not in l]
    oom = [l for l in shim if "out of memory" in l]
    dump = [l for l in shim if l.startswith("oomshim:   dump: ")]
    row(out_dir, "PASS" if oom and dump else "FAIL", f"{name}: stderr has oomshim's two lines",
        (oom[0][:160] + " …") if oom else "no out-of-memory line: " + stderr_text[-400:])
    rep = run([CLI, "report", "--width", str(WIDTH)], cwd)
    if rep.returncode != 0:
        row(out_dir, "FAIL", f"{name}: oomshim report", rep.stderr[-400:])
        return []
    screen = first_screen(rep.stdout)
    wide = [l for l in rep.stdout.splitlines() if len(l) > WIDTH]
    ok = (len(screen) <= FIRST_SCREEN_LINES and not wide
          and any(l.startswith("Verdict: ") for l in screen)
          and screen[-1].startswith("Details below"))
    row(out_dir, "PASS" if ok else "FAIL", f"{name}: the report's first screen is the answer within {WIDTH} columns",
        f"{len(screen)} lines, {len(wide)} lines over {WIDTH} columns in the whole report"
        + ("" if ok else "; first screen: " + " | ".join(screen)))
    said = verdict_words(screen).rstrip("…")
    stderr_verdict = oom[0].split("): ", 1)[1] if oom and "): " in oom[0] else ""
    same = bool(said) and re.sub(r"\s+", " ", stderr_verdict).startswith(re.sub(r"\s+", " ", said))
    row(out_dir, "PASS" if same else "FAIL", f"{name}: stderr says what the report says",
        said[:120] if same else f"stderr {stderr_verdict[:120]!r} vs report {said[:120]!r}")
    if expect_line:
        named = expect_line in " ".join(screen)
        row(out_dir, "PASS" if named else "FAIL", f"{name}: the verdict names the leaking line",
            expect_line if named else f"{expect_line} not in: " + " | ".join(screen))
    return screen


def excerpt(out_dir, title, stderr_lines, screen):
    path = os.path.join(out_dir, "readme_gpu_excerpt.md")
    with open(path, "a") as f:
        f.write(f"{title}\n\n```\n" + "\n".join(stderr_lines) + "\n```\n\n```\n" + "\n".join(screen) + "\n```\n\n")
    row(out_dir, "INFO", "readme excerpt", f"{title} -> {path}")


def gpu(out_dir):
    probe = run([sys.executable, "-c",
                 "import torch; print(torch.__version__); print(torch.cuda.get_device_name(0))"], out_dir, timeout=120)
    if probe.returncode != 0:
        row(out_dir, "FAIL", "torch on a GPU", probe.stderr[-400:])
        return
    torch_version, gpu_name = probe.stdout.strip().splitlines()[-2:]
    today = datetime.date.today().isoformat()
    for name, extra in (("preload", []), ("allocator mode", ["--torch-allocator"])):
        cwd = os.path.join(out_dir, "readme-" + name.replace(" ", "-"))
        os.makedirs(cwd, exist_ok=True)
        with open(os.path.join(cwd, "train.py"), "w") as f:
            f.write(PROGRAM)
        p = run([CLI, "run", "--lib", LIB] + extra + ["--", sys.executable, "train.py"], cwd)
        died = p.returncode != 0 and "OutOfMemoryError" in p.stderr
        row(out_dir, "PASS" if died else "FAIL", f"{name}: the program dies of torch's OutOfMemoryError",
            f"exit {p.returncode}" + ("" if died else ": " + p.stderr[-400:]))
        dumps = [d for d in glob.glob(os.path.join(cwd, "oomshim-dumps", "oomshim-*.json"))
                 if not os.path.basename(d).startswith("oomshim-torch-")]
        if not dumps:
            row(out_dir, "FAIL", f"{name}: a dump", "none in " + os.path.join(cwd, "oomshim-dumps"))
            continue
        screen = check_case(out_dir, name, cwd, p.stderr, f"train.py:{KEEP_LINE}")
        lines = [l.replace(cwd, "~/project") for l in p.stderr.splitlines() if l.startswith("oomshim: ")]
        excerpt(out_dir, f"{name}, {gpu_name}, torch {torch_version}, {today}:", lines, screen)


def demo(out_dir):
    cwd = os.path.join(out_dir, "readme-demo")
    os.makedirs(cwd, exist_ok=True)
    p = run([CLI, "demo", "--lib", LIB], cwd)
    row(out_dir, "PASS" if p.returncode == 0 else "FAIL", "demo: runs", f"exit {p.returncode}")
    screen = check_case(out_dir, "demo", cwd, p.stderr, "demo_train.c:76")
    lines = [l.replace(cwd, "~/project") for l in p.stderr.splitlines()
             if l.startswith("oomshim: ") and "snapshot" not in l]
    excerpt(out_dir, f"demo, {datetime.date.today().isoformat()}:", lines, screen)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out_dir = os.path.abspath(sys.argv[1])
    os.makedirs(out_dir, exist_ok=True)
    if "--demo" in sys.argv[2:]:
        demo(out_dir)
    else:
        gpu(out_dir)
    with open(os.path.join(out_dir, "rows.txt")) as f:
        failed = any(l.startswith("[FAIL]") for l in f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
