"""Shared by the OOM zoo's Python programs: sizes taken from the device, the skip line for a
missing package, and each program's own account of its memory at the failure (the truth the
zoo scores oomshim's dumps against).

What a corpus program prints, all on stderr (its stdout is the output the zoo compares between
the bare run and each launcher, so nothing here writes there):

- `oomshim-kinds-truth: {json}` (kinds_truth), right after it caught the OutOfMemoryError:
  parameters, gradients and optimizer state summed over their storages, each storage once, only
  CUDA tensors; the dominant kind the program was built to show (`dominant`), and, where torch's
  own OOM observer ran (not in allocator mode), torch's allocated bytes at the failure and the
  kinds measured from them (`measured`: activations are what is allocated beyond the three);
  the lines marked `# EXPECT-LINE` in the program; the time it caught the failure.
- `oomshim-batch-truth: {json}` (batch_truth), for a program whose failure is its batch: the
  largest batch that really fits, found after the failure in the same process by bisection
  (at most ZOO_BISECT_PROBES probes, 8 by default, each with everything freed before and after),
  and the bracket it found: `largest_fitting_batch` fits, `smallest_failing_batch` does not.
- `[INFO] skipped: <package> missing` on stdout (require), exit status 0, when a package the
  program needs is not installed: the zoo counts it as not run.
"""
import contextlib
import gc
import importlib.util
import json
import os
import sys
import time

import torch

GiB = 1 << 30
MiB = 1 << 20

KINDS = ("parameters", "gradients", "optimizer_state", "activations")


def require(*modules):
    """Exit 0 with `[INFO] skipped: NAME missing` unless every module can be imported; a name
    `a|b` is satisfied by either (lightning.pytorch|pytorch_lightning). Returns the names found."""
    found = []
    for alternatives in modules:
        name = next((m for m in alternatives.split("|") if _importable(m)), None)
        if name is None:
            print(f"[INFO] skipped: {alternatives.split('|')[-1]} missing", flush=True)
            sys.exit(0)
        found.append(name)
    return found


def _importable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def device_bytes():
    """(free, total) bytes of the current CUDA device, as cudaMemGetInfo says: what every program
    sizes itself from (an H100 has about 78 GiB, an H200 about 139 GiB)."""
    return torch.cuda.mem_get_info()


def total_bytes():
    return device_bytes()[1]


def load_weights(leave_fraction):
    """One untouched allocation that leaves `leave_fraction` of the device free: the "model"
    that fills most of the GPU, so a leaking program needs only a few steps to run out."""
    free, total = device_bytes()
    return torch.empty(max(free - int(leave_fraction * total), 0), dtype=torch.uint8, device="cuda")


def mark_step():
    # The package from the checkout (oomshim's hook adds no importable name of its own).
    import os
    import sys

    package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shim", "python")
    if package not in sys.path:
        sys.path.insert(0, package)
    try:
        import oomshim
    except ImportError:
        return
    oomshim.step()


def report_truth(request):
    """torch's own account of a failed request, on stderr (the zoo reads it from the run without
    oomshim): `truth: fragmentation` when its cache holds at least the request free, and at
    least a tenth of what it reserves, but no block that large; else `truth: own_allocations`."""
    try:
        snapshot = torch.cuda.memory._snapshot()
    except Exception:
        return
    reserved = free = largest = 0
    for seg in snapshot.get("segments", []):
        reserved += seg.get("total_size", 0)
        for b in seg.get("blocks", []):
            if b.get("state") == "inactive":
                free += b["size"]
                largest = max(largest, b["size"])
    frag = free >= request and largest < request and free >= 0.1 * reserved
    sys.stderr.write(f"truth: {'fragmentation' if frag else 'own_allocations'} "
                     f"(free in cache {free >> 20} MiB, largest {largest >> 20} MiB, reserved {reserved >> 20} MiB)\n")


# torch's word at its last failure: what its OOM observers are told, and torch's allocated bytes
# then (read inside the observer: torch calls observers after it released its allocator's lock,
# before it raises). Not in allocator mode: there torch calls no observer, and the attach
# function is oomshim's own, whose figures are the ones being judged.
_failure = {}
_watching = [True]


def _observer(device, request, device_total, device_free):
    if not _watching:
        return
    try:
        _failure.update(device=int(device), request_bytes=int(request), device_total_bytes=int(device_total),
                        device_free_bytes=int(device_free), allocated_bytes=int(torch.cuda.memory_allocated(device)),
                        unix_ms=int(time.time() * 1000))
    except Exception:
        pass


def _torch_attaches():
    """True when the observer attach function is torch's own (not oomshim's stand-in)."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    return attach is not None and (getattr(attach, "__module__", None) or "").startswith("torch")


def _attach():
    try:
        if _torch_attaches():
            torch._C._cuda_attach_out_of_memory_observer(_observer)
    except Exception:
        pass  # an allocator that refuses observers (cudaMallocAsync): the truth then lacks `measured`


def _watch_failures():
    """Attach the observer when CUDA initialises: torch's allocator keeps the observers of
    devices it has set up, so one attached before that is dropped."""
    try:
        torch.cuda._lazy_call(_attach)
    except Exception:
        pass


_watch_failures()


def _inner_optimizer(o):
    """The torch optimizer inside a framework's wrapper (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer); the object itself when it is one."""
    for _ in range(4):
        if isinstance(o, torch.optim.Optimizer) or o is None:
            return o
        o = getattr(o, "optimizer", None) or getattr(o, "_optimizer", None)
    return o if isinstance(o, torch.optim.Optimizer) else None


def count_kinds(models=(), optimizers=(), on_device=lambda t: t.is_cuda):
    """Parameters, gradients and optimizer state in bytes, each storage counted once (tied
    weights, views), only tensors `on_device` accepts. `models` are modules (a model, or loose
    layers the program holds); `optimizers` may be a framework's wrapper."""
    seen = set()

    def count(t):
        if not isinstance(t, torch.Tensor) or not on_device(t):
            return 0
        s = t.untyped_storage()
        key = (s.device, s.data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return s.nbytes()

    params = list(p for m in models for p in m.parameters())
    out = {"parameters_bytes": sum(count(p) for p in params),
           "gradients_bytes": sum(count(p.grad) for p in params if p.grad is not None)}
    state = 0
    for o in optimizers:
        o = _inner_optimizer(o)
        if o is None:
            continue
        for st in o.state.values():
            for v in (st.values() if isinstance(st, dict) else ()):
                state += count(v)
    out["optimizer_state_bytes"] = state
    return out


def dominant_of(kinds):
    """The kind with the most bytes (`parameters`, `gradients`, `optimizer_state`,
    `activations`), None when all are zero; ties go to the first in that order, as oomshim's."""
    best, most = None, 0
    for k in KINDS:
        v = kinds.get(f"{k}_bytes") or 0
        if v > most:
            best, most = k, v
    return best


def expect_lines(path):
    """`file:line` of the lines marked EXPECT-LINE in `path`."""
    try:
        with open(path) as f:
            return [f"{os.path.basename(path)}:{i}" for i, line in enumerate(f, 1) if "EXPECT-LINE" in line]
    except OSError:
        return []


def truth_record(name, dominant, kinds, failure=None, program=None):
    """The truth line's content (kinds_truth without the printing): pure, for the CPU tests."""
    truth = {"program": name, "dominant": dominant, **kinds, "caught_unix_ms": int(time.time() * 1000)}
    if program:
        truth["expect_lines"] = expect_lines(program)
    if failure and "allocated_bytes" in failure:
        measured = dict(kinds)
        named = sum(kinds.values())
        measured["activations_bytes"] = max(failure["allocated_bytes"] - named, 0)
        truth["measured"] = {"allocated_at_failure_bytes": failure["allocated_bytes"],
                             "request_bytes": failure.get("request_bytes"),
                             "failure_unix_ms": failure.get("unix_ms"),
                             "activations_bytes": measured["activations_bytes"],
                             "dominant": dominant_of(measured)}
    return truth


def kinds_truth(name, dominant, models=(), optimizers=()):
    """Print the program's own count of its memory by kind at the failure, on stderr as one line
    `oomshim-kinds-truth: {json}` (see the module's docstring). Call it in the handler of the
    OutOfMemoryError: parameters, gradients and optimizer state are what they were at the
    failure; the failed step's activations are gone by then, which is why torch's allocated
    bytes are read in the OOM observer, at the failure itself. `dominant` is the kind the program
    was built to show; `measured.dominant` says whether it did. Once per process: the account is
    of the program's first failure (a framework's hook may call it again at a probe's)."""
    if not _watching:
        return None
    _watching.clear()  # later failures (the bisection's probes) are not this one
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    program = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    truth = truth_record(name, dominant, count_kinds(models, optimizers), dict(_failure), program)
    truth["torch_allocated_bytes"] = _allocated()
    sys.stderr.write("oomshim-kinds-truth: " + json.dumps(truth) + "\n")
    sys.stderr.flush()
    return truth


def _allocated():
    try:
        return torch.cuda.memory_allocated()
    except Exception:
        return None  # allocator mode: torch keeps no statistics for a pluggable allocator


def too_large(step, batch, tries=4):
    """Run the program's step at a batch meant to be too large for this device, doubling it
    while it fits (a size guess that fell short on a larger device), so that the program still
    ends in the failure it is about. The OutOfMemoryError propagates with the batch it happened
    at as `.batch`; after `tries` steps that fit, the program exits with a message (mis-sized).

    Bisect only after the handler of that error has finished: while it runs, the traceback keeps
    the failed step's frames, and with them its tensors, alive."""
    for _ in range(tries):
        try:
            step(batch)
        except torch.OutOfMemoryError as e:
            e.batch = batch
            raise
        sys.stderr.write(f"[zoo] batch {batch} fit: trying {2 * batch}\n")
        batch *= 2
    sys.exit(f"[zoo] batch {batch // 2} still fit after {tries} tries: the program is sized for a smaller device")


def fail_then_bisect(step, batch, truth, reset=None, warm=None, said="out of memory", probe=None):
    """The shape of a corpus program whose failure is its batch: its step at a batch too large
    (too_large); in the handler of the OutOfMemoryError, `said` on stdout and the program's
    account (`truth()`, its kinds_truth call); after the handler, the bisection (batch_truth) of
    `probe`, else of the same step. Returns the batch that failed."""
    failed = None
    try:
        too_large(step, batch)
    except torch.OutOfMemoryError as e:
        failed = e.batch
        print(said, flush=True)
        truth()
    if failed:
        batch_truth(probe or step, failed, reset=reset, warm=warm)
    return failed


def wide_mlp(d=2048, h=16384, blocks=4):
    """The plain programs' model: `blocks` of Linear(d, h), GELU, Linear(h, d), bfloat16, on the
    device; about 70 KiB of activations a row and block in training (d=2048, h=16384)."""
    import torch.nn as nn

    model = nn.Sequential(*[nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)) for _ in range(blocks)])
    return model.cuda().to(torch.bfloat16)


def lightning_trainer(pl, name, dominant, precision="bf16-mixed", max_steps=1):
    """A Lightning Trainer on the GPU that logs, checkpoints and summarises nothing, with the
    callback that prints the program's account at an OutOfMemoryError (lightning_truth)."""
    return pl.Trainer(accelerator="gpu", devices=1, max_steps=max_steps, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[lightning_truth(pl, name, dominant)])


def lightning_truth(pl, name, dominant):
    """A Lightning callback that prints the program's account when fit fails of an
    OutOfMemoryError: in on_exception, before Lightning's teardown moves the model and the
    optimizer state to the CPU."""

    class Truth(pl.Callback):
        def on_exception(self, trainer, module, exception):
            if isinstance(exception, torch.OutOfMemoryError):
                kinds_truth(name, dominant, [module], trainer.optimizers)
                # The teardown copies the model and the optimizer state to host memory: on a
                # 139 GiB card that is more than the host's 128 GiB, and the run hangs swapping or
                # is killed. Once counted, the gradients and the optimizer state are not needed.
                for opt in trainer.optimizers:
                    opt.state.clear()
                module.zero_grad(set_to_none=True)

    return Truth()


class Tokens(torch.utils.data.Dataset):
    """Random token sequences of `seq`, made when asked for (seeded by index, so a worker process
    makes the same as the main one): a language model's examples (`labels` are the ids) or, with
    `classes`, a classifier's (with an attention mask). 2^20 of them: more than any batch here,
    and few enough for the Trainer's random sampler, which draws a permutation of them all."""

    def __init__(self, seq, vocab, classes=None):
        self.seq, self.vocab, self.classes = seq, vocab, classes

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        if self.classes is None:
            return {"input_ids": ids, "labels": ids}
        return {"input_ids": ids, "attention_mask": torch.ones(self.seq, dtype=torch.long),
                "labels": torch.tensor(i % self.classes)}


def hf_trainer(model, dataset, batch, workers=0):
    """A Hugging Face Trainer of one step at `batch`, bf16, that logs, saves and reports nothing."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, max_steps=1, bf16=True,
                             report_to=[], save_strategy="no", logging_steps=1000, dataloader_num_workers=workers,
                             disable_tqdm=True, remove_unused_columns=False)
    return Trainer(model=model, args=args, train_dataset=dataset)


class Fresh:
    """A step that makes a fresh framework object for each batch (a Trainer, with an optimizer
    of its own whose state a failed probe must not leave behind) and runs it: `run` is the
    program's own line. The latest is kept for the program's account; `forget` drops it."""

    def __init__(self, make, run, model):
        self.make, self.run, self.model, self.latest = make, run, model, None

    def __call__(self, batch):
        self.latest = self.make(batch)
        self.run(self.latest)

    def forget(self):
        self.latest = None
        self.model.zero_grad(set_to_none=True)


def llama(hidden, intermediate, layers, dtype, heads=None, positions=1024):
    """A Llama-style causal language model from its config (no download), built on the device in
    `dtype` (built elsewhere, it would first take float32 room on the device or minutes on the
    CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = heads or hidden // 128
    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, vocab_size=32000,
                         max_position_embeddings=positions)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(before)


def llama_layer_bytes(hidden, intermediate, dtype_bytes):
    """One Llama layer's weights: attention's four projections and the MLP's three."""
    return (4 * hidden * hidden + 3 * hidden * intermediate) * dtype_bytes


def bisect(fits, failed, warm=None, probes=8, out_of_time=lambda: False):
    """The largest batch `fits(batch)` accepts below `failed` (known not to fit), by bisection:
    at most `probes` calls, the first one at `warm` when given (a small batch that creates what a
    steady-state step holds, such as the optimizer's state, before the larger ones are judged).
    Returns the bracket found: `largest_fitting_batch` (0 when not even the smallest tried fit),
    `smallest_failing_batch`, and `exact` when nothing lies between them."""
    lo, hi, n = 0, failed, 0
    if warm and 0 < warm < failed:
        n += 1
        if fits(warm):
            lo = warm
        else:
            hi = warm
    while hi - lo > 1 and n < probes and not out_of_time():
        mid = (lo + hi) // 2
        n += 1
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return {"largest_fitting_batch": lo, "failed_batch": failed, "smallest_failing_batch": hi,
            "probes": n, "exact": hi - lo <= 1}


def free_all(reset=None):
    """Everything the last step left: the program's own reset (gradients, a framework's state),
    the garbage collector, torch's cache."""
    if reset is not None:
        reset()
    gc.collect()
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:
        pass


def _runs_out(e):
    """An error that says the step did not fit: torch's OutOfMemoryError, or a library's failed
    workspace allocation (cuBLAS, cuDNN) that torch reports as a RuntimeError."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "ALLOC_FAILED" in text)


def probe(step, batch, reset=None):
    """True when `step(batch)` runs without running out of memory; everything is freed before
    and after. Any other error propagates."""
    free_all(reset)
    try:
        step(batch)
        fits = True
    except Exception as e:  # noqa: BLE001 - decided by _runs_out; the rest is raised again
        if not _runs_out(e):
            raise
        fits = False
    free_all(reset)
    return fits


def batch_truth(step, failed, reset=None, warm=None):
    """After the failure at batch `failed`: find the largest batch `step(batch)` runs with, in
    this process, and print `oomshim-batch-truth: {json}` on stderr. `step` is the program's own
    step at another batch size; `reset` frees what a failed step leaves (gradients, a framework's
    state); `warm`, a batch run first where the step's optimizer keeps state (Adam's moments,
    momentum), so that every larger probe is judged with that state in place, as a real step
    after the first would be. Bounded: ZOO_BISECT_PROBES probes (8), ZOO_BISECT_SECONDS seconds (60). ZOO_BISECT=0
    skips it (the zoo bisects in the bare run only unless ZOO_BISECT_ALL=1). What the probes print
    goes to stderr, so the program's stdout is the same with or without them."""
    if os.environ.get("ZOO_BISECT", "1") == "0":
        return None
    probes = int(os.environ.get("ZOO_BISECT_PROBES", "8"))
    deadline = time.monotonic() + float(os.environ.get("ZOO_BISECT_SECONDS", "60"))
    start = time.monotonic()
    error = None
    with contextlib.redirect_stdout(sys.stderr):
        try:
            result = bisect(lambda b: probe(step, b, reset), failed, warm=warm, probes=probes,
                            out_of_time=lambda: time.monotonic() > deadline)
        except Exception as e:  # noqa: BLE001 - a probe that failed otherwise: said in the record
            error = f"{type(e).__name__}: {str(e)[:300]}"
            result = {"largest_fitting_batch": None, "failed_batch": failed}
    result["seconds"] = round(time.monotonic() - start, 1)
    if error:
        result["error"] = error
    sys.stderr.write("oomshim-batch-truth: " + json.dumps(result) + "\n")
    sys.stderr.flush()
    return result
