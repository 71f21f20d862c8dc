"""GPU check of `oomshim export --memory-viz` against torch's own viewer code
(torch.cuda._memory_viz: segsum, trace, segments, memory, trace_plot, segment_plot) and the
viewer model of CI (tests/memory_viz_check.py), for the dumps that broke pytorch.org/memory_viz:

- PyTorch with expandable_segments:True under `oomshim run`: cuMemCreate holders, whose dump
  addresses have bit 63 set;
- PyTorch in allocator mode (`oomshim run --torch-allocator`): the dump's real segment map,
  exported as segments with their free blocks.

Each leaks 1 GiB tensors until torch raises OutOfMemoryError (caught), leaving one dump.

    main(root, lib, cli, out_dir) -> [(check, ok, detail)]

Every step has a timeout. Run alone: python3 tests/gpu/check_memory_viz.py OUT_DIR"""

import glob
import json
import os
import subprocess
import sys

LEAK = r'''
import torch
keep = []
try:
    while len(keep) < 10000:
        keep.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
print(len(keep))
'''

# Runs torch's viewer functions on a pickle; prints what they found, as JSON.
VIEW = r'''
import json, pickle, sys
from torch.cuda import _memory_viz as mv
d = pickle.load(open(sys.argv[1], "rb"))
out = {}
out["segsum_segments"] = int(mv.segsum(d).split("segments: ")[1].split()[0])
out["trace_lines"] = len(mv.trace(d).splitlines())
flame = mv.segments(d, format_flamegraph=lambda s: s)
out["flame_bytes"] = sum(int(l.rsplit(" ", 1)[1]) for l in flame.splitlines() if l)
mv.memory(d, format_flamegraph=lambda s: s)
out["trace_plot_html"] = len(mv.trace_plot(d))
out["segment_plot_html"] = len(mv.segment_plot(d))
ints = []
def walk(v):
    if isinstance(v, bool):
        return
    if isinstance(v, int):
        ints.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            walk(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            walk(x)
walk(d)
out["max_int"] = max(ints)
out["total"] = sum(s["total_size"] for s in d["segments"])
out["free_blocks"] = sum(1 for s in d["segments"] for b in s["blocks"] if b["state"] == "inactive")
out["ooms"] = sum(1 for t in d["device_traces"] for e in t if e["action"] == "oom")
print(json.dumps(out))
'''


def _run(cmd, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    try:
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


def _dumps(d):
    return sorted(p for p in glob.glob(os.path.join(d, "oomshim-*.json"))
                  if not os.path.basename(p).startswith("oomshim-torch-"))


def _case(name, root, lib, cli, out_dir, run_args, env):
    rows = []
    d = os.path.join(out_dir, f"memory-viz-{name}")
    os.makedirs(d, exist_ok=True)
    script = os.path.join(d, "leak.py")
    with open(script, "w") as f:
        f.write(LEAK)
    p = _run([cli, "run", "--dir", d, "--lib", lib] + run_args + ["--", sys.executable, script], env=env)
    files = _dumps(d)
    if p.returncode != 0 or len(files) != 1:
        return [(f"memory_viz {name}: leak ran and left one dump", False,
                 f"rc {p.returncode}, {len(files)} dumps; {p.stderr[-600:]}")]
    with open(files[0]) as f:
        dump = json.load(f)
    pk = os.path.join(d, "snapshot.pickle")
    e = _run([cli, "export", files[0], "--memory-viz", pk], timeout=120)
    rows.append((f"memory_viz {name}: export", e.returncode == 0, (e.stderr.strip() or "ok")[-300:]))
    if e.returncode != 0:
        return rows
    v = _run([sys.executable, "-c", VIEW, pk], timeout=300)
    try:
        got = json.loads(v.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rows.append((f"memory_viz {name}: torch.cuda._memory_viz reads it", False, v.stderr[-600:]))
        return rows
    tracked = sum(x["tracked_bytes"] for x in dump["devices"])
    rows.append((f"memory_viz {name}: torch.cuda._memory_viz segsum/trace/segments/memory/trace_plot/segment_plot",
                 v.returncode == 0 and got["trace_plot_html"] > 0 and got["segment_plot_html"] > 0
                 and got["ooms"] == 1,
                 f"{got['segsum_segments']} segments, {got['trace_lines']} trace lines, 1 oom event"))
    rows.append((f"memory_viz {name}: every integer below 2^53 (no BigInt in the web viewer)",
                 got["max_int"] < 2**53, f"largest {got['max_int']:#x}"))
    model = _run([sys.executable, os.path.join(root, "tests/memory_viz_check.py"), pk], timeout=120)
    rows.append((f"memory_viz {name}: CI's viewer model agrees", model.returncode == 0,
                 (model.stdout.strip() or model.stderr.strip())[-300:]))
    fb = dump["free_blocks"]
    if fb.get("source") == "oomshim-allocator":
        seg_map = fb.get("segment_map", [])
        ok = (len(seg_map) > 0 and got["segsum_segments"] == len(seg_map)
              and got["total"] == sum(s["bytes"] for s in seg_map))
        rows.append((f"memory_viz {name}: the allocator's real segments with their free blocks", ok,
                     f"{len(seg_map)} segments in the dump, {got['segsum_segments']} exported, "
                     f"{got['free_blocks']} free blocks"))
    else:
        rows.append((f"memory_viz {name}: every tracked byte exported", got["total"] == tracked,
                     f"{got['total']} of {tracked} bytes"))
        vmm = [h for h in dump["largest_holders"] if h["api"] == "cuMemCreate"]
        if "expandable" in name:
            rows.append((f"memory_viz {name}: the dump has bit-63 cuMemCreate addresses", len(vmm) > 0,
                         f"{len(vmm)} cuMemCreate holders, e.g. {vmm[0]['address'] if vmm else '-'}"))
    return rows


def main(root, lib, cli, out_dir):
    rows = []
    for name, args, env in (
        ("expandable", [], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "OOMSHIM_SETTLE": "0"}),
        ("allocator-mode", ["--torch-allocator"], {}),
    ):
        try:
            rows.extend(_case(name, root, lib, cli, out_dir, args, env))
        except Exception as e:  # a broken check is a failed row, not a lost table
            rows.append((f"memory_viz {name}", False, f"{type(e).__name__}: {e}"))
    return rows


if __name__ == "__main__":
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/oomshim-memory-viz"
    os.makedirs(out, exist_ok=True)
    results = main(here, os.path.join(here, "target/release/liboomshim.so"),
                   os.path.join(here, "target/release/oomshim"), out)
    for c, ok, detail in results:
        print(f"[{'PASS' if ok else 'FAIL'}] {c}: {detail}")
    sys.exit(0 if all(ok for _, ok, _ in results) else 1)
