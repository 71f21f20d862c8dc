"""GPU check: the answer reaches the job. `torchrun` runs a data-parallel job under `oomshim run`
(gloo backend, so two ranks can share the one GPU) in which rank 1 loads a second full copy of the
model, sized from the device so that rank 1 runs out of memory and rank 0 does not. Its entry
point is decorated with torchelastic's `@record`, as recommended for torchrun jobs.

Prints torchrun's "Root Cause" block, the termination message (OOMSHIM_TERMINATION_LOG set to a
file of the check's own) and `oomshim merge`'s answer, and asserts:

- the root cause is rank 1, keeps the program's own traceback and `OutOfMemoryError`, and shows
  oomshim's headline (the verdict of rank 1's dump, word for word), its retry hint and its dump;
- the termination message has the same headline and is at most 4096 bytes;
- `merge` names rank 1 as the first to run out of memory.

Cases:
- one_gpu: `--nproc_per_node=2` on device 0 (both ranks share it);
- all_gpus: `--nproc_per_node=torch.cuda.device_count()`, one GPU per rank, rank 1 loading the
  second copy on its own GPU: runs unchanged when a multi-GPU machine is lent; [INFO] on one GPU.

Every step has a timeout; the one-GPU case takes about a minute.

    main(root, lib, cli, out_dir) -> [(check, ok, detail)], ok None for an [INFO] row

Run alone: python3 tests/gpu/check_torchrun_rank.py OUT_DIR (OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI:
the build to test, default target/release/...). `--self-test` checks the parsing on canned
torchrun output, without a GPU."""

import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standalone  # noqa: E402 (run alone, and the commands and dumps, as every GPU check has them)
from standalone import dumps_in, load_dumps, run_command  # noqa: E402

# The worker: every rank builds the model once (`COPY_BYTES` of float16 parameters in 1 GiB
# tensors); rank 1 then builds a second full copy, which does not fit; the others wait at a
# barrier (torchrun's agent ends them when rank 1 fails).
WORKER = r'''
import os
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

GIB = 1 << 30


class Model(torch.nn.Module):
    def __init__(self, nbytes, device):
        super().__init__()
        sizes = [GIB] * (nbytes // GIB) + ([nbytes % GIB] if nbytes % GIB else [])
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float16, device=device))
            for n in sizes
        )


@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    per_gpu = os.environ["CHECK_PER_GPU"] == "1"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) if per_gpu else 0)
    torch.cuda.set_device(device)
    nbytes = int(os.environ["COPY_BYTES"])
    model = Model(nbytes, device)
    dist.barrier()
    if rank == 1:
        print(f"rank 1: loading a second copy of {nbytes / GIB:.1f} GiB", flush=True)
        second = Model(nbytes, device)  # the line to change: a second full copy
        print("rank 1: it fit (the check sized it wrong)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

# The device's free memory and GPU count, asked in a process of its own (its context is gone
# before the job starts).
PROBE = r'''
import json, torch
free, total = torch.cuda.mem_get_info(0)
print(json.dumps({"free": free, "total": total, "count": torch.cuda.device_count()}))
'''


def root_cause(text):
    """torchrun's "Root Cause (first observed failure)" block, up to its closing rule; None."""
    start = text.find("Root Cause (first observed failure):")
    if start < 0:
        return None
    rest = text[start:]
    end = rest.find("\n====")
    return rest if end < 0 else rest[:end]


def _headline(dump):
    v = dump["verdict"]
    return v["findings"][0]["headline"] if v.get("findings") else v["summary"]


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _case(name, cli, lib, out_dir, nproc, per_gpu, copy_bytes):
    """One torchrun job; rows of (check, ok, detail), ok None for what is only shown."""
    rows = []
    d = os.path.join(out_dir, f"torchrun-rank-{name}")
    dumps = os.path.join(d, "dumps")
    os.makedirs(dumps, exist_ok=True)
    script = os.path.join(d, "second_copy.py")
    with open(script, "w") as f:
        f.write(WORKER)
    term = os.path.join(d, "termination-log")
    cmd = [cli, "run", "--dir", dumps, "--lib", lib, "--", sys.executable, "-m", "torch.distributed.run",
           f"--nproc_per_node={nproc}", f"--master_port={_free_port()}", "--log-dir", os.path.join(d, "logs"),
           script]
    p = run_command(cmd, env={"COPY_BYTES": str(copy_bytes), "CHECK_PER_GPU": "1" if per_gpu else "0",
                              "OOMSHIM_TERMINATION_LOG": term, "OMP_NUM_THREADS": "1"}, timeout=150)
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(p.stderr)
    with open(os.path.join(d, "stdout.txt"), "w") as f:
        f.write(p.stdout)
    cause = root_cause(p.stderr)
    print(f"--- {name}: torchrun's root cause ---\n{cause}\n", flush=True)
    ooms = [(path, x) for path, x in load_dumps(dumps_in(dumps))
            if x.get("failed_request") and x["process"].get("rank") == 1]
    if cause is None or not ooms:
        return rows + [(f"torchrun {name}: rank 1 ran out of memory and torchrun named a root cause", False,
                    f"rc {p.returncode}; {len(ooms)} OOM dumps of rank 1; stderr tail: {p.stderr[-800:]}")]
    path, dump = ooms[0]
    headline = _headline(dump)
    kind = dump["verdict"]["kind"]
    retry = (dump["verdict"].get("retry") or {}).get("hint")
    rows.append((f"torchrun {name}: the root cause is rank 1 with its own traceback",
                 "rank      : 1" in cause and "OutOfMemoryError" in cause and "Traceback" in cause,
                 cause.splitlines()[3].strip() if len(cause.splitlines()) > 3 else cause[:200]))
    rows.append((f"torchrun {name}: the root cause shows oomshim's headline after it",
                 f"{kind}: {headline}" in cause and cause.find("OutOfMemoryError") < cause.find("oomshim: "),
                 f"{kind}: {headline[:160]}"))
    rows.append((f"torchrun {name}: the root cause shows the retry hint and the dump",
                 retry is not None and f"retry: {retry} (" in cause and path in cause, f"retry {retry}; {path}"))
    try:
        with open(term, "rb") as f:
            message = f.read()
    except OSError as e:
        message = b""
        rows.append((f"torchrun {name}: a termination message", False, str(e)))
    text = message.decode(errors="replace")
    print(f"--- {name}: termination message ({len(message)} bytes) ---\n{text}", flush=True)
    if message:
        rows.append((f"torchrun {name}: the termination message has the headline, within 4096 bytes",
                     headline in text and len(message) <= 4096, f"{len(message)} bytes"))
    m = run_command([cli, "merge", dumps], timeout=60)
    print(f"--- {name}: oomshim merge ---\n{m.stdout}", flush=True)
    with open(os.path.join(d, "merge.txt"), "w") as f:
        f.write(m.stdout + m.stderr)
    first = [line for line in m.stdout.splitlines() if "first to run out of memory" in line]
    rows.append((f"torchrun {name}: merge names rank 1 as the first to run out",
                 bool(first) and "rank 1 (" in first[0], first[0].strip() if first else m.stderr[-300:]))
    why = m.stdout.split("\nWhy this rank\n")
    rows.append((f"torchrun {name}: merge's why this rank",
                 None, why[1].split("\n\n")[0].strip() if len(why) > 1 else "(no section)"))
    rows.append((f"torchrun {name}: rank 1's verdict", None, f"{kind}; retry {retry}"))
    return rows


def main(root, lib, cli, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    probe = run_command([sys.executable, "-c", PROBE], timeout=60)
    try:
        dev = json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [("torchrun rank: the device answered", False, probe.stderr[-300:])]
    rows = []
    # Shared GPU: both ranks' first copies fit (2 × 0.38 of free), rank 1's second does not
    # (3 × 0.38 > 1); what is left covers the two CUDA contexts.
    try:
        rows += _case("one_gpu", cli, lib, out_dir, 2, False, int(dev["free"] * 0.38))
    except Exception as e:  # a broken check is a failed row, not a lost table
        rows.append(("torchrun one_gpu", False, f"{type(e).__name__}: {e}"))
    if dev["count"] < 2:
        rows.append(("torchrun all_gpus", None,
                     f"skipped: {dev['count']} GPU here; runs unchanged with nproc = torch.cuda.device_count()"))
    else:
        # One GPU per rank: one copy fits (0.55 of free), two do not (1.1).
        try:
            rows += _case("all_gpus", cli, lib, out_dir, dev["count"], True, int(dev["free"] * 0.55))
        except Exception as e:
            rows.append(("torchrun all_gpus", False, f"{type(e).__name__}: {e}"))
    return rows


def _self_test():
    """The parsing, on torchrun's block as torch 2.x prints it (no GPU needed)."""
    canned = ("x\n====\nRoot Cause (first observed failure):\n[0]:\n  time      : t\n  host      : h\n"
              "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 7)\n  error_file: /l/1/error.json\n"
              "  traceback : Traceback (most recent call last):\n  OutOfMemoryError: CUDA out of memory.\n"
              "  oomshim: CUDA out of memory on device 0 (cudaMalloc of 1.00 GiB failed): k: h\n"
              "============================================================\n")
    c = root_cause(canned)
    assert c is not None and c.startswith("Root Cause") and c.rstrip().endswith("k: h"), c
    assert "rank      : 1" in c and c.find("OutOfMemoryError") < c.find("oomshim: ")
    assert root_cause("nothing") is None
    d = {"verdict": {"summary": "s", "findings": [{"headline": "first"}]}}
    assert _headline(d) == "first" and _headline({"verdict": {"summary": "s"}}) == "s"
    compile(WORKER, "second_copy.py", "exec")
    compile(PROBE, "probe.py", "exec")
    print("[PASS] check_torchrun_rank self-test: root cause parsing, worker compiles")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        _self_test()
        sys.exit(0)
    sys.exit(standalone.run(main, None, "/tmp/oomshim-torchrun-rank"))
