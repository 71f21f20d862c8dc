"""The OOM zoo and its labelled corpus, scored: every program in this directory run bare and under
each launcher (plain LD_PRELOAD, `oomshim run`, `oomshim run --torch-allocator` for PyTorch),
each run bounded, each row written to OUT/zoo.jsonl as it finishes, the tables printed last and
the markdown one written to OUT/zoo.md (card, memory and date in its header, for docs/).

Scored per run (scoring.py says how): output unchanged (stdout and exit code as bare), a dump of
the failure, the verdict right, the line marked `# EXPECT-LINE` named in the headline, stderr's
line saying what the dump and `oomshim report --json` say, one dump for the one failure; and for
the corpus (programs that print their own account, `_zoo.kinds_truth`): the dominant kind, each
kind within 5%, and, for programs whose failure is their batch, the largest batch the verdict
says would fit against the real one (bisection in the bare run). A run is `ok` when every
promise that applies holds. A program that says `[INFO] skipped: P missing` is not run (a row
per launcher with `skipped`), never passed. Exit status 0 when every run is ok, 1 otherwise.

    python3 tests/gpu/zoo/run_zoo.py OUT [CASE ...]
    ZOO_CASES=a,b ZOO_LAUNCHERS=preload,alloc python3 tests/gpu/zoo/run_zoo.py OUT
    ZOO_DRY=1 ZOO_DRY_DIR=RUNS python3 tests/gpu/zoo/run_zoo.py OUT   # score recorded runs, no GPU
    ZOO_DRY=1 ZOO_REVERDICT=1 ZOO_DRY_DIR=RUNS ...   # the same, each dump judged by this build's CLI

Environment: ZOO_BUDGET (seconds: cases that would end past it are not started), ZOO_CASES (comma-separated,
in the order to run; or as arguments), ZOO_SET
(`corpus` or `zoo`), ZOO_PIECE (`k/n`: the k-th of n pieces of about equal time), ZOO_LAUNCHERS
(of preload, run, alloc; bare always runs), ZOO_GPUS (GPU indices or `all`: one case at a time on
each, in parallel; unset: the default device), ZOO_TIMEOUT (seconds a run, 120), ZOO_WORK (where
each run's dumps and output go, OUT/runs), ZOO_BISECT_ALL=1 (bisect under every launcher too,
not only bare), OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI (the build to test), ZOO_REVERDICT=1 (dry runs
only: every recorded dump's verdict replaced by the one `oomshim report --json` gives it with the
CLI at hand, as for a dump read by a newer build; what the dump recorded, kinds and all, is the
GPU's, and stderr's line is then not scored, being the recording build's).
"""
import datetime
import glob
import json
import os
import re
import select
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scoring  # noqa: E402
from scoring import run_ok  # noqa: E402,F401  (run_all.py and test_harness.py use run_zoo.run_ok)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI: the build to test (the carried copies), else the repo's.
LIB = os.environ.get("OOMSHIM_GPU_LIB") or os.path.join(ROOT, "target/release/liboomshim.so")
CLI = os.environ.get("OOMSHIM_GPU_CLI") or os.path.join(ROOT, "target/release/oomshim")
PY = sys.executable

TORCH = ("bare", "preload", "run", "alloc")
NO_ALLOCATOR = ("bare", "preload", "run")


class Case:
    def __init__(self, name, program, final, launchers=TORCH, env=None, count=None, kinds=None,
                 holder=False, truth=False, build=None, note="", framework=None, batch=False,
                 alloc_mode=None, secs=20, bisect_secs=0):
        self.name = name
        self.program = program
        self.final = set(final)  # verdicts right for the failure scored
        self.launchers = launchers
        self.env = env or {}
        self.count = count  # failures that stood, with a dump each (None: at least one)
        self.kinds = set(kinds) if kinds else None  # every stood dump's verdict within these
        self.holder = holder  # another process holds most of the GPU meanwhile
        self.truth = truth  # the right verdict is torch's own account (`truth:` on stderr, bare)
        self.build = build  # nvcc flags for a .cu program
        self.note = note
        # The corpus: a program that prints its own account (`oomshim-kinds-truth:`), driven by
        # this framework ("": plain PyTorch; None: not in the corpus); `batch` when its failure
        # is its batch (it bisects for the largest that fits); `alloc_mode`: whether allocator
        # mode must be on under `alloc` (True for the corpus unless said), "either" when both are
        # right (then, when off, the line that says so names a line marked `# COMPILE-LINE`).
        self.framework = framework
        self.batch = batch
        self.alloc_mode = alloc_mode if alloc_mode is not None else (True if framework is not None else None)
        # About how long one run takes on an H100, to say what a run will take: where measured,
        # 1.4 times the longest shimmed run, rounded up to 5 s (the batch programs run on
        # 2026-12-06); elsewhere older, more generous guesses.
        self.secs = secs
        self.bisect_secs = bisect_secs  # and how much longer the bare run's bisection

    @property
    def corpus(self):
        return self.framework is not None


PLAIN = ""  # the framework label of a plain PyTorch corpus program
# Named in the table's header with their versions (or as missing).
FRAMEWORK_PACKAGES = ("transformers", "accelerate", "peft", "timm", "torchvision", "pytorch-lightning", "lightning")
HF = "HF Trainer"

CASES = [
    Case("retain_graph", "retain_graph.py", {"leak"}),
    Case("retain_graph_marked", "retain_graph_marked.py", {"leak"}),
    Case("eval_no_inference_mode", "eval_no_inference_mode.py", {"leak"}),
    Case("loss_accumulated", "loss_accumulated.py", {"leak"}),
    Case("spread_leak", "spread_leak.py", {"leak"}, note="twelve lines share the growth"),
    Case("late_leak", "late_leak.py", {"leak"}),
    Case("expandable_leak", "expandable_leak.py", {"leak"}, launchers=NO_ALLOCATOR,
         env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    Case("async_leak", "async_leak.py", {"leak"}, launchers=NO_ALLOCATOR,
         env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    Case("model_twice", "model_twice.py", {"own_allocations"}, count=1),
    Case("too_large", "too_large.py", {"request_exceeds_device"}, count=1),
    Case("batch_finder", "batch_finder.py", {"own_allocations", "request_exceeds_device"},
         kinds={"own_allocations", "request_exceeds_device"}),
    Case("fragmentation_first", "fragmentation_first.py", {"fragmentation"}, count=1),
    Case("two_ooms", "two_ooms.py", {"fragmentation"}, count=2, kinds={"own_allocations", "fragmentation"}),
    Case("other_process", "other_process.py", {"other_processes"}, holder=True),
    Case("threads_oom", "threads_oom.py", {"own_allocations"}, count=1),
    Case("dataloader_dynamic", "dataloader_dynamic.py", {"own_allocations"}),
    Case("inference_dynamic", "inference_dynamic.py", {"own_allocations", "leak"}, truth=True),
    Case("jax_list", "jax_list.py", {"leak"}, launchers=NO_ALLOCATOR,
         env={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
    Case("jax_prealloc", "jax_prealloc.py", {"own_allocations"}, launchers=NO_ALLOCATOR),
    Case("cupy_pool", "cupy_pool.py", {"own_allocations"}, launchers=NO_ALLOCATOR),
    Case("nvcc_static_leak", "static_leak.cu", {"leak"}, launchers=NO_ALLOCATOR, build=["-cudart", "static"]),
    Case("plain_c", "plain_c.cu", {"own_allocations"}, launchers=NO_ALLOCATOR, build=["-cudart", "shared"]),
    # The corpus: each program prints its own count of parameters, gradients and optimizer state
    # (and torch's allocated bytes at the failure), which the dump's kinds are scored against.
    # Plain PyTorch.
    Case("kinds_adam_large", "kinds_adam_large.py", {"own_allocations"}, framework=PLAIN),
    Case("kinds_batch_transformer", "kinds_batch_transformer.py", {"own_allocations"}, framework=PLAIN,
         batch=True, secs=15, bisect_secs=15),
    Case("kinds_grads_never_zeroed", "kinds_grads_never_zeroed.py", {"own_allocations"}, framework=PLAIN, secs=25),
    Case("kinds_hook_keeps", "kinds_hook_keeps.py", {"leak"}, framework=PLAIN),
    # The leak's headline names the list that keeps it (`held in list `history` (...)`).
    Case("kinds_list_keeps", "kinds_list_keeps.py", {"leak"}, framework=PLAIN),
    Case("kinds_logits_loss", "kinds_logits_loss.py", {"own_allocations"}, framework=PLAIN, batch=True,
         bisect_secs=15),
    Case("kinds_model_twice", "kinds_model_twice.py", {"own_allocations"}, framework=PLAIN),
    Case("model_four_times", "model_four_times.py", {"own_allocations"}, framework=PLAIN),
    Case("hparam_search_keeps", "hparam_search_keeps.py", {"leak"}, framework=PLAIN, note="far more than 16 models"),
    # A file beside it asks for CUDA graphs, and it never imports that file: allocator mode stays on.
    Case("sibling_compile", "sibling_compile/prog.py", {"own_allocations"}, framework=PLAIN, batch=True,
         bisect_secs=15),
    Case("eval_autograd_batch", "eval_autograd_batch.py", {"own_allocations"}, framework=PLAIN, batch=True,
         bisect_secs=15),
    Case("checkpoint_too_big", "checkpoint_too_big.py", {"own_allocations"}, framework=PLAIN, batch=True,
         bisect_secs=20),
    Case("gan_two_adams", "gan_two_adams.py", {"own_allocations"}, framework=PLAIN),
    Case("curriculum_batch_growth", "curriculum_batch_growth.py", {"own_allocations"}, framework=PLAIN, batch=True,
         bisect_secs=15),
    # Driven by a framework.
    Case("kinds_hf_trainer", "kinds_hf_trainer.py", {"own_allocations"}, framework=HF, batch=True, secs=20,
         bisect_secs=20),
    Case("hf_trainer_bert_workers", "hf_trainer_bert_workers.py", {"own_allocations"},
         framework="HF Trainer + DataLoader workers", batch=True, secs=20, bisect_secs=15),
    Case("hf_generate_batch", "hf_generate_batch.py", {"own_allocations"}, framework="transformers generate",
         batch=True, secs=20, bisect_secs=30),
    Case("hf_eval_accumulates_logits", "hf_eval_accumulates_logits.py", {"leak", "own_allocations"},
         framework="HF Trainer (evaluate)", secs=30),
    Case("hf_reference_model_twice", "hf_reference_model_twice.py", {"own_allocations"}, framework="transformers",
         secs=30),
    Case("accelerate_adamw_state", "accelerate_adamw_state.py", {"own_allocations"}, framework="accelerate", secs=30),
    Case("accelerate_grad_accum_batch", "accelerate_grad_accum_batch.py", {"own_allocations"},
         framework="accelerate", batch=True, secs=20, bisect_secs=15),
    Case("peft_lora_trainer", "peft_lora_trainer.py", {"own_allocations"}, framework="PEFT + HF Trainer", batch=True,
         secs=20, bisect_secs=25),
    Case("peft_lora_big_base", "peft_lora_big_base.py", {"own_allocations"}, framework="PEFT", secs=35),
    Case("timm_vit_accelerate", "timm_vit_accelerate.py", {"own_allocations"}, framework="timm + accelerate",
         batch=True, secs=20, bisect_secs=10),
    Case("timm_resnet_workers", "timm_resnet_workers.py", {"own_allocations"}, framework="timm + DataLoader workers",
         batch=True, secs=40, bisect_secs=5),
    Case("timm_convnext_inference", "timm_convnext_inference.py", {"own_allocations"}, framework="timm", batch=True,
         secs=20, bisect_secs=35),
    Case("compile_mlp_dynamic", "compile_mlp_dynamic.py", {"own_allocations"}, framework="torch.compile", batch=True,
         secs=45, bisect_secs=15),
    # Allocator mode either stays on (torch.compile without graphs) or is off naming this program.
    Case("compile_graphs_inference", "cudagraphs/compile_graphs_inference.py", {"own_allocations"},
         framework="torch.compile (CUDA graphs)", alloc_mode="either", secs=40),
    Case("lightning_token_mlp", "lightning_token_mlp.py", {"own_allocations"}, framework="Lightning", batch=True,
         secs=25, bisect_secs=15),
    Case("lightning_adam_state", "lightning_adam_state.py", {"own_allocations"}, framework="Lightning", secs=35),
    Case("lightning_transformer_workers", "lightning_transformer_workers.py", {"own_allocations"},
         framework="Lightning + DataLoader workers", batch=True, secs=25, bisect_secs=25),
    Case("dataloader_workers_lengths", "dataloader_workers_lengths.py", {"own_allocations"},
         framework="DataLoader workers", secs=25),
    # kinds_growth_killed.py (growth over time, no steps, SIGKILLed) waits for the growth-by-time
    # verdict: it records its truth for when that exists.
]


def case_names():
    """The cases to run, in order: ZOO_CASES (comma-separated), else the command line's, else
    all; of those, ZOO_SET's (`corpus`: the programs with their own account, `zoo`: the others)
    and ZOO_PIECE's (`k/n`: the k-th of n pieces of about equal expected time). An unknown name
    or setting is a ValueError (a typo would run nothing)."""
    named = [n.strip() for n in os.environ.get("ZOO_CASES", "").split(",") if n.strip()] or sys.argv[2:]
    known = {c.name for c in CASES}
    unknown = [n for n in named if n not in known]
    if unknown:
        raise ValueError(f"no such zoo case: {', '.join(unknown)}")
    which = os.environ.get("ZOO_SET", "").strip() or "all"
    if which not in ("all", "corpus", "zoo"):
        raise ValueError(f"ZOO_SET: {which!r} is none of all, corpus, zoo")
    picked = [c for c in chosen(named) if which == "all" or c.corpus == (which == "corpus")]
    piece = os.environ.get("ZOO_PIECE", "").strip()
    if piece:
        m = re.fullmatch(r"(\d+)/(\d+)", piece)
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            raise ValueError(f"ZOO_PIECE: {piece!r} is not k/n with 1 <= k <= n")
        picked = pieces(picked, int(m.group(2)))[int(m.group(1)) - 1]
    if not picked:
        raise ValueError("no zoo case left to run (ZOO_CASES, ZOO_SET and ZOO_PIECE together chose none)")
    return [c.name for c in picked] if (named or which != "all" or piece) else []


def budget_seconds():
    """ZOO_BUDGET: seconds the whole run may take; a case whose estimate would end past it is not
    started (listed at the end), so a run inside a time limit still scores and writes its tables.
    0 or unset: no limit. Anything else is a ValueError."""
    raw = os.environ.get("ZOO_BUDGET", "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"ZOO_BUDGET: {raw!r} is not a number of seconds")
    return value


def seconds_of(case):
    """A case's expected seconds: each of its runs, and the bare run's bisection."""
    return case.secs * len(launchers_of(case)) + case.bisect_secs


def pieces(cases, n):
    """`cases` cut into n pieces of about equal expected time (the longest case first into the
    piece with the least so far), each in the cases' own order."""
    loads = [[0, []] for _ in range(n)]
    for c in sorted(cases, key=seconds_of, reverse=True):
        least = min(loads, key=lambda p: p[0])
        least[0] += seconds_of(c)
        least[1].append(c)
    order = {c.name: i for i, c in enumerate(cases)}
    return [sorted(p[1], key=lambda c: order[c.name]) for p in loads]


def launcher_filter():
    """The launchers named in ZOO_LAUNCHERS (comma-separated, of preload, run and alloc), or None
    when it is unset or empty. A name that is no launcher is a ValueError (a typo would score
    nothing)."""
    only = [l.strip() for l in os.environ.get("ZOO_LAUNCHERS", "").split(",") if l.strip()]
    unknown = [l for l in only if l not in TORCH[1:]]
    if unknown:
        raise ValueError(f"ZOO_LAUNCHERS: {', '.join(unknown)} is no launcher (one of {', '.join(TORCH[1:])})")
    return set(only) or None


def launchers_of(case):
    """The case's launchers this run uses: `bare` always (the reference for the output), and
    those of launcher_filter(), else all."""
    only = launcher_filter()
    return [l for l in case.launchers if l == "bare" or only is None or l in only]


def chosen(names=()):
    return [c for n in names for c in CASES if c.name == n] if names else CASES


def expected_runs(names=()):
    """(case, launcher) of every scored run for these case names (all cases when none)."""
    return [(c.name, l) for c in chosen(names) for l in launchers_of(c) if l != "bare"]


def expected_seconds(names=()):
    """About how long these cases take one after another: each run's estimate and the bare
    run's bisection."""
    return sum(seconds_of(c) for c in chosen(names))


def run(cmd, env, timeout, cwd=None):
    e = dict(os.environ)
    e.update(env)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as t:
        out = t.stdout.decode(errors="replace") if isinstance(t.stdout, bytes) else (t.stdout or "")
        err = t.stderr.decode(errors="replace") if isinstance(t.stderr, bytes) else (t.stderr or "")
        return 124, out, err + f"\n[timed out after {timeout} s]", time.time() - t0


def expect_lines(path, marker="EXPECT-LINE"):
    """`file:line` of every line marked EXPECT-LINE (any of them may be named); [] when the
    line is not the point (another process holds the GPU)."""
    with open(path) as f:
        return [f"{os.path.basename(path)}:{i}" for i, line in enumerate(f, 1) if marker in line]


def dumps_in(d):
    files = [p for p in glob.glob(os.path.join(d, "oomshim-*.json")) if not os.path.basename(p).startswith("oomshim-torch-")
             and not p.endswith(".report.json")]

    def seq(p):
        m = re.search(r"-(\d+)\.json$", p)
        return int(m.group(1)) if m else 0

    return sorted(files, key=seq)


def summaries(err):
    return [l for l in err.splitlines() if l.startswith("oomshim: CUDA out of memory")]


def dry():
    return os.environ.get("ZOO_DRY") == "1"


def reverdict():
    if os.environ.get("ZOO_REVERDICT") == "1" and not dry():
        raise ValueError("ZOO_REVERDICT=1 judges recorded runs again: it needs ZOO_DRY=1")
    return os.environ.get("ZOO_REVERDICT") == "1"


def report_json(dump_path):
    """What `oomshim report --json` says of the dump; in a dry run the recorded
    `<dump>.report.json` beside it stands for the CLI (not under ZOO_REVERDICT)."""
    recorded = dump_path[:-len(".json")] + ".report.json"
    if dry() and not reverdict() and os.path.exists(recorded):
        text = open(recorded).read()
    else:
        text = run([CLI, "report", "--json", dump_path], {}, 60)[1]
    try:
        return json.loads(text)
    except Exception:
        return {"verdict": {}}


def report_kind(dump_path):
    """The verdict kind `oomshim report --json` gives the dump."""
    return (report_json(dump_path).get("verdict") or {}).get("kind")


def score(case, launcher, bare, result, d, line):
    rc, out, err, secs = result
    row = {"case": case.name, "launcher": launcher, "rc": rc, "secs": round(secs, 1)}
    if case.framework is not None:
        row["framework"] = case.framework
    row["output_unchanged"] = (out == bare[1] and rc == bare[0])
    truth = scoring.kinds_truth(err) if case.corpus else None
    bare_truth = scoring.kinds_truth(bare[2]) if case.corpus else None
    files = dumps_in(d)
    loaded = scoring.load_dumps(files)
    if reverdict():
        for path, x in loaded:
            x["verdict"] = report_json(path)["verdict"]
    stood = scoring.stood(loaded)
    row["dumps"] = len(files)
    row["stood"] = len(stood)
    if case.corpus:
        row["truth"] = truth is not None
        if truth is None:
            row["why"] = "the program printed no account of its failure"
    if not stood:
        row.update(verdict=None, verdict_ok=False, line_ok=False, agree=False, dump_ok=False, stderr=err[-600:])
        if case.corpus:
            row.update(dominant_ok=False, kinds_ok=False)
        if case.batch:
            row["batch"] = {"ok": False, "why": "no dump"}
        row["ok"] = False
        return row
    i = scoring.scored_index(stood, truth) if case.corpus else len(stood) - 1
    final_path, final = stood[i]
    row["dump"] = os.path.basename(final_path)
    row["dump_ok"] = case.count is None or len(stood) == case.count
    if case.corpus:
        # One story per failure: another dump of a request of the same size just before this one
        # (torch's free-the-cache-and-retry, said once as recovered and once as raised). A note,
        # not a promise: an earlier step's request of that size may have recovered on its own.
        row["same_request_dumps"] = scoring.same_request(loaded, final)
    top = (final["verdict"].get("findings") or [{}])[0]
    right = case.final
    if case.truth:
        m = re.search(r"^truth: (\w+)", bare[2], re.M)
        right = {m.group(1)} if m else set()
        row["truth_said"] = m.group(1) if m else None
        if row["truth_said"] == "own_allocations":
            # Not fragmentation by torch's account; the kept cache entries also make it a leak.
            right |= case.final
    row["verdict"] = final["verdict"]["kind"]
    row["verdicts"] = [x["verdict"]["kind"] for _, x in stood]
    row["verdict_ok"] = row["verdict"] in right and (case.kinds is None or set(row["verdicts"]) <= case.kinds)
    headline = top.get("headline", "")
    row["headline"] = headline[:300]
    row["line"] = line
    # Named in the headline (the first line a user reads), the whole of it (the row keeps only its
    # start): None when no line is expected.
    row["line_ok"] = any(l in headline for l in line) if line else None
    # stderr: one summary per stood dump, in order; the one of the scored dump says its top finding.
    lines = summaries(err)
    said = lines[i] if len(lines) == len(stood) else (lines[-1] if lines else "")
    row["stderr_line"] = said[:300]
    if reverdict():
        # The verdict is the report's already, and stderr the recording build's: not scored.
        row["report_kind"] = row["verdict"]
        row["agree"] = None
    else:
        judged = report_kind(final_path)
        row["report_kind"] = judged
        row["agree"] = bool(said) and said.endswith(f"{top.get('kind')}: {top.get('headline')}") and judged == row["verdict"]
    row["resolution"] = (final.get("failed_request") or {}).get("resolution")
    g = final.get("growth") or {}
    row["steps"] = g.get("steps")
    if case.corpus:
        score_kinds(row, final, final_path, d, truth, bare_truth)
    if case.batch:
        bt = scoring.batch_truth(bare[2]) or scoring.batch_truth(err)
        row["batch"] = scoring.score_batch(scoring.batch_claim(final), bt)
    if case.alloc_mode is not None and launcher == "alloc":
        # Allocator mode was on when the dump's free blocks are the allocator's own.
        on = (final.get("free_blocks") or {}).get("source") == "oomshim-allocator"
        row["alloc_mode"] = on
        off = scoring.ALLOCATOR_OFF.search(err)
        row["alloc_off_line"] = off.group(0)[:300] if off else None
        if case.alloc_mode == "either":
            marked = expect_lines(os.path.join(HERE, case.program), "COMPILE-LINE")
            row["alloc_off_line_ok"] = any(m in off.group(0) for m in marked) if off and marked else None
        else:
            row["alloc_mode_ok"] = on == case.alloc_mode
    row["ok"] = run_ok(row)
    if not row["ok"]:
        row["broken"] = scoring.promises_broken(row)
    return row


def score_kinds(row, dump, dump_path, d, truth, bare_truth):
    """The corpus's columns: the dump's kinds against the program's own account."""
    if truth is None:
        row.update(dominant_ok=False, kinds_ok=False)
        return
    k = scoring.kinds_of(dump) or scoring.sidecar_kinds(d, dump_path)
    want = scoring.truth_dominant(truth, bare_truth)
    row["truth_dominant"] = want
    if not k:
        row.update(dominant_ok=False, kinds_ok=False, why="no kinds in the dump")
        return
    row["kinds_cmp"] = scoring.compare_kinds(k, truth)
    row["kinds_ok"] = all(v[2] for v in row["kinds_cmp"].values())
    row["dominant"] = scoring.dominant(k)
    row["dominant_ok"] = row["dominant"] == want
    row["kinds_complete"] = k.get("complete", True)
    row["phase"] = k.get("phase")
    row["batch_seen"] = k.get("batch")


def bare_row(case, result):
    rc, out, err, secs = result
    row = {"case": case.name, "launcher": "bare", "rc": rc, "secs": round(secs, 1),
           "stdout": out[-300:], "stderr_tail": err[-300:]}
    gone = scoring.skipped(out)
    if gone:
        row["skipped"] = gone
    if case.corpus and not gone:
        truth = scoring.kinds_truth(err)
        row["truth"] = truth
        m = (truth or {}).get("measured") or {}
        # The program's label against its own measurement at the failure: a program that does not
        # show what it was built to show is a corpus defect, said here.
        row["label_ok"] = (m.get("dominant") == truth.get("dominant")) if truth and m else None
        if case.batch:
            row["batch_truth"] = scoring.batch_truth(err)
    return row


def recorded(d):
    """A dry run's recorded result in folder d: rc, stdout.txt, stderr.txt, secs."""
    def text(name):
        try:
            return open(os.path.join(d, name), errors="replace").read()
        except OSError:
            return ""
    rc = text("rc").strip()
    return (int(rc) if rc else 0), text("stdout.txt"), text("stderr.txt"), float(text("secs").strip() or 0)


def card():
    """The card the runs use: name, total memory, torch, the date, oomshim's version."""
    if dry():
        try:
            return json.load(open(os.path.join(os.environ["ZOO_DRY_DIR"], "card.json")))
        except (OSError, ValueError, KeyError):
            return {}
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    probe = ("import json, torch; from importlib import metadata\n"
             "def version(p):\n"
             "    try:\n"
             "        return metadata.version(p)\n"
             "    except metadata.PackageNotFoundError:\n"
             "        return None\n"
             "print(json.dumps({'name': torch.cuda.get_device_name(), 'total_bytes': torch.cuda.mem_get_info()[1], "
             "'torch': torch.__version__, 'packages': {p: version(p) for p in "
             + repr(FRAMEWORK_PACKAGES) + "}}))")
    try:
        out.update(json.loads(run([PY, "-c", probe], {}, 120)[1].strip().splitlines()[-1]))
    except (ValueError, IndexError):
        pass
    version = run([CLI, "--version"], {}, 30)[1].strip()
    if version:
        out["oomshim"] = version
    return out


def gpus():
    """The GPUs to spread the cases over (ZOO_GPUS: indices, comma-separated, or `all`), one case
    at a time on each; [None] (the default device, one case at a time) when unset. Every program
    sizes itself from the device it sees, so a case runs the same on any of them."""
    want = os.environ.get("ZOO_GPUS", "").strip()
    if not want:
        return [None]
    if want == "all":
        listed = run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], {}, 60)[1].split()
        return listed or [None]
    found = [g.strip() for g in want.split(",") if g.strip()]
    if not all(g.isdigit() for g in found):
        raise ValueError(f"ZOO_GPUS: {want!r} is not a list of GPU indices (or `all`)")
    return found


def launch(case, launcher, cmd, d, work, gpu=None):
    """One run of the case under a launcher, bounded; its output kept in d."""
    if dry():
        return recorded(d)
    env = dict(case.env, PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if launcher != "bare" and os.environ.get("ZOO_BISECT_ALL") != "1":
        env["ZOO_BISECT"] = "0"
    if launcher == "bare":
        full = cmd
    elif launcher == "preload":
        env.update(LD_PRELOAD=LIB, OOMSHIM_DIR=d)
        full = cmd
    elif launcher == "run":
        full = [CLI, "run", "--lib", LIB, "--dir", d, "--"] + cmd
    else:
        full = [CLI, "run", "--torch-allocator", "--lib", LIB, "--dir", d, "--"] + cmd
    timeout = int(os.environ.get("ZOO_TIMEOUT", "120"))
    if launcher == "bare" or os.environ.get("ZOO_BISECT_ALL") == "1":
        timeout += case.bisect_secs * 2
    holder = None
    if case.holder:
        holder = subprocess.Popen([PY, os.path.join(HERE, "holder.py")], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})))
        # Its "ready" (or its end): a holder that hangs is waited for 120 s at most.
        select.select([holder.stdout], [], [], 120)
    try:
        result = run(full, env, timeout, cwd=work)
    finally:
        if holder:
            holder.kill()
            holder.wait()
    for name, text in (("stdout.txt", result[1]), ("stderr.txt", result[2])):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    return result


EMITTING = threading.Lock()


def emit(rows, log, row):
    with EMITTING:
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(json.dumps({k: v for k, v in row.items() if k not in ("stderr", "stdout", "truth")})[:700], flush=True)


def run_case(case, runs_dir, work, rows, log, gpu=None):
    src = os.path.join(HERE, case.program)
    line = expect_lines(src)
    if case.build and not dry():
        exe = os.path.join(work, case.name)
        b = run(["nvcc", "-O2", "-g", *case.build, "-o", exe, src], {}, 240)
        if b[0] != 0:
            emit(rows, log, {"case": case.name, "launcher": "build", "rc": b[0], "stderr": b[2][-500:], "ok": False})
            return
        cmd = [exe]
    else:
        cmd = [PY, src]
    bare, bare_skipped = None, None
    for launcher in launchers_of(case):
        d = os.path.join(runs_dir, case.name, launcher)
        if bare_skipped:
            emit(rows, log, {"case": case.name, "launcher": launcher, "skipped": bare_skipped, "ok": False,
                             "headline": f"not run: {bare_skipped} missing"})
            continue
        if dry():
            if not os.path.isdir(d):
                continue  # a dry run scores the runs recorded, no others
        else:
            os.makedirs(d, exist_ok=True)
        result = launch(case, launcher, cmd, d, work, gpu)
        if launcher == "bare":
            bare = result
            row = bare_row(case, result)
            bare_skipped = row.get("skipped")
        else:
            row = score(case, launcher, bare, result, d, line)
        emit(rows, log, row)


def text_table(rows):
    scored = [r for r in rows if r.get("launcher") not in ("bare", "build")]
    out = [f"{'case':30} {'launcher':8} {'out':4} {'dump':4} {'verdict':24} {'ok':3} {'dom':4} {'kinds':5} "
           f"{'line':4} {'agree':5} {'batch':18}"]
    for r in scored:
        if r.get("skipped"):
            out.append(f"{r['case']:30} {r['launcher']:8} not run: {r['skipped']} missing")
            continue
        out.append(f"{r['case']:30} {r['launcher']:8} {scoring.yn(r.get('output_unchanged')):4} "
                   f"{scoring.yn(r.get('dump_ok')):4} {str(r.get('verdict')):24} {scoring.yn(r.get('verdict_ok')):3} "
                   f"{scoring.yn(r.get('dominant_ok')):4} {scoring.yn(r.get('kinds_ok')):5} "
                   f"{scoring.yn(r.get('line_ok')):4} {scoring.yn(r.get('agree')):5} {scoring.batch_cell(r):18}")
        if r.get("why"):
            out.append(f"    why: {r['why']}")
    return "\n".join(out)


def main():
    # OUT gets the scored rows; the dumps and stderr of every run go to ZOO_WORK (default
    # OUT/runs), which can be kept apart (the GPU tool returns only files near the top of OUT).
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/zoo"
    try:
        launcher_filter()
        budget_seconds()
        reverdict()
        names = case_names()
        devices = gpus()
    except ValueError as e:
        sys.exit(str(e))
    if dry() and not os.environ.get("ZOO_DRY_DIR"):
        sys.exit("ZOO_DRY=1 needs ZOO_DRY_DIR: the recorded runs (CASE/LAUNCHER/ with stdout.txt, stderr.txt, rc, dumps)")
    os.makedirs(out_dir, exist_ok=True)
    runs_dir = os.environ["ZOO_DRY_DIR"] if dry() else (os.environ.get("ZOO_WORK") or os.path.join(out_dir, "runs"))
    work = os.path.join(out_dir, "work") if dry() else os.path.join(runs_dir, "work")
    os.makedirs(work, exist_ok=True)
    cases = chosen(names)
    # Named cases run in the order named (the ones that matter most first, for a run cut short).
    total = expected_seconds(names) // len(devices)
    print(f"{len(cases)} cases, {len(expected_runs(names))} scored runs on {len(devices)} GPU(s): about {total // 60} min "
          f"{total % 60} s on H100s (each run up to {os.environ.get('ZOO_TIMEOUT', '120')} s). Per case, seconds: "
          + ", ".join(f"{c.name} {seconds_of(c)}" for c in cases), flush=True)
    log = open(os.path.join(out_dir, "zoo.jsonl"), "w")  # this run's rows, never stale ones
    rows = []
    queue = list(cases)
    budget = budget_seconds()
    started = time.time()
    left_out = []

    def worker(gpu):
        while True:
            with EMITTING:
                if not queue:
                    return
                case = queue.pop(0)
                if budget and time.time() - started + seconds_of(case) > budget:
                    left_out.append(case.name)
                    continue
            run_case(case, runs_dir, work, rows, log, gpu)

    threads = [threading.Thread(target=worker, args=(g,)) for g in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The tables in the cases' order, whichever GPU finished first.
    order = {c.name: i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: order.get(r["case"], len(order)))
    print()
    print(text_table(rows))
    info = card()
    table = scoring.markdown(rows, info, {c.name: c.framework or ("PyTorch" if c.corpus else "") for c in CASES})
    with open(os.path.join(out_dir, "zoo.md"), "w") as f:
        f.write(table)
    print()
    print(table)
    json.dump(rows, open(os.path.join(out_dir, "zoo.json"), "w"), indent=1)
    scored = [r for r in rows if r.get("launcher") not in ("bare", "build")]
    labels = [r["case"] for r in rows if r.get("launcher") == "bare" and r.get("label_ok") is False]
    if labels:
        print(f"\ncorpus programs whose failure did not show their declared dominant kind: {labels}")
    if left_out:
        print(f"\nnot run, over ZOO_BUDGET's {budget:.0f} s: {','.join(left_out)}")
    failed = [f"{r['case']} ({r['launcher']})" for r in rows if r.get("launcher") != "bare" and not r.get("ok")]
    print(f"\n{len(failed)} run(s) not as promised: {failed}" if failed else "\nevery run as promised")
    return 1 if failed or not scored else 0


if __name__ == "__main__":
    sys.exit(main())
