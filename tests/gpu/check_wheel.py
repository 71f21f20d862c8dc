"""GPU check of the wheel as a PyTorch user installs it: `pip install` into a fresh venv (with
the machine's torch visible through --system-site-packages; no network needed, --no-deps), then

- `oomshim` on the venv's PATH says the wheel's version;
- `python -m oomshim run -- python leak.py` preloads the bundled library and leaves a dump whose
  top holder is the leaking line;
- `oomshim.torch.enable()` finds the bundled library and torch allocates through it.

The wheel is carried to the GPU machine at target/wheels/oomshim-*.whl (scripts/build-wheel
builds it). main(root, lib, cli, out_dir) -> [(check, ok, detail)]; every step has a timeout.
Run alone: python3 tests/gpu/check_wheel.py OUT_DIR"""

import glob
import json
import os
import subprocess
import sys

LEAK = r'''
import torch
keep = []
def leak_one_gib():
    keep.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
try:
    while len(keep) < 10000:
        leak_one_gib()
except torch.OutOfMemoryError:
    pass
print(len(keep))
'''

ENABLE = r'''
import torch, oomshim.torch as ot
ot.enable()
x = torch.ones(1 << 20, device="cuda")
print(ot.library_path(), ot.memory_allocated(), float(x.sum()))
'''


def _run(cmd, env=None, timeout=300, cwd=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    e.update(env or {})
    try:
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


def version_key(path):
    """The wheel's version (`oomshim-VERSION-...whl`) as a sortable tuple: release numbers
    compared as numbers (0.10.0 after 0.9.0), a pre-release or local part before the plain
    release of the same numbers."""
    parts = os.path.basename(path).split("-")
    version = parts[1] if len(parts) > 1 else ""
    release, _, rest = version.partition("+")
    nums = []
    tail = ""
    for piece in release.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            tail = piece
            break
        nums.append(int(digits))
        if digits != piece:
            tail = piece[len(digits):]
            break
    return (tuple(nums), 0 if tail else 1, tail, rest)


def newest_wheel(paths):
    """The wheel built last (modification time), the higher version where two share a time:
    never the lexicographic last, which ranks 0.9.0 above 0.10.0 and ignores which is fresh."""
    return max(paths, key=lambda p: (os.path.getmtime(p), version_key(p))) if paths else None


def main(root, lib, cli, out_dir):
    wheels = glob.glob(os.path.join(root, "target", "wheels", "oomshim-*.whl"))
    if not wheels:
        return [("wheel: carried", False, "no target/wheels/oomshim-*.whl (run scripts/build-wheel and carry it)")]
    wheel = newest_wheel(wheels)
    if len(wheels) > 1:
        print(f"wheel: {os.path.basename(wheel)} (newest of {sorted(map(os.path.basename, wheels))})", flush=True)
    rows = []
    venv = os.path.join(out_dir, "wheel-venv")
    p = _run([sys.executable, "-m", "venv", "--system-site-packages", "--clear", venv], timeout=120)
    py = os.path.join(venv, "bin", "python")
    if p.returncode == 0:
        # This interpreter may itself be a venv (torch installed in it, not in the base that
        # --system-site-packages exposes): its site-packages go on the new venv's path too.
        import site
        q = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)
        if q.returncode == 0:
            with open(os.path.join(q.stdout.strip(), "_parent_site.pth"), "w") as f:
                f.write("\n".join(site.getsitepackages()) + "\n")
        p = _run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel], timeout=180)
    rows.append(("wheel: pip install into a fresh venv", p.returncode == 0,
                 os.path.basename(wheel) if p.returncode == 0 else p.stderr[-400:]))
    if p.returncode != 0:
        return rows
    version = os.path.basename(wheel).split("-")[1]
    v = _run([os.path.join(venv, "bin", "oomshim"), "--version"], timeout=30)
    rows.append(("wheel: oomshim on the venv's PATH says its version", v.stdout.strip() == f"oomshim {version}",
                 v.stdout.strip() or v.stderr[-200:]))

    d = os.path.join(out_dir, "wheel-dumps")
    os.makedirs(d, exist_ok=True)
    script = os.path.join(out_dir, "wheel_leak.py")
    with open(script, "w") as f:
        f.write(LEAK)
    r = _run([py, "-m", "oomshim", "run", "--dir", d, "--", py, script], env={"OOMSHIM_SETTLE": "0"},
             timeout=400, cwd=out_dir)
    dumps = [p for p in glob.glob(os.path.join(d, "oomshim-*.json"))
             if not os.path.basename(p).startswith("oomshim-torch-")]
    ok = r.returncode == 0 and len(dumps) == 1
    detail = f"rc {r.returncode}, {len(dumps)} dump(s)"
    if ok:
        with open(dumps[0]) as f:
            dump = json.load(f)
        top = dump["sites"][0]["stack"] if dump["sites"] else []
        named = [fr.get("function") for fr in top if fr.get("kind") == "python"]
        ok = "leak_one_gib" in named
        detail += f"; verdict {dump['verdict']['kind']}; top site {named[:2]}"
    else:
        detail += f"; {r.stderr[-400:]}"
    rows.append(("wheel: python -m oomshim run -- python leak.py (bundled library)", ok, detail))

    e = _run([py, "-c", ENABLE], timeout=300, cwd=out_dir)
    parts = e.stdout.split()
    site = os.path.join(venv, "lib")
    ok = (e.returncode == 0 and len(parts) == 3 and parts[0].startswith(site)
          and int(parts[1]) >= 4 << 20 and float(parts[2]) == float(1 << 20))
    rows.append(("wheel: oomshim.torch.enable() uses the bundled library", ok,
                 e.stdout.strip() if e.returncode == 0 else e.stderr[-400:]))
    return rows


if __name__ == "__main__":
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/oomshim-wheel-check"
    os.makedirs(out, exist_ok=True)
    results = main(here, os.path.join(here, "target/release/liboomshim.so"),
                   os.path.join(here, "target/release/oomshim"), out)
    for c, ok, detail in results:
        print(f"[{'PASS' if ok else 'FAIL'}] {c}: {detail}")
    sys.exit(0 if all(ok for _, ok, _ in results) else 1)
