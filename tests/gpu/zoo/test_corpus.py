"""The corpus's own logic, on this machine (no GPU; torch on the CPU):

    python3 tests/gpu/zoo/test_corpus.py

The bisection and the truth counts of _zoo.py, the scoring of scoring.py (the largest batch in
the verdict's words, checked against the Rust sentence that says it), a dry run of run_zoo.py on
recorded runs (ZOO_DRY=1) down to its markdown table, and the rules every corpus program keeps
(its account, its lines, its sizes from the device, no file beside the others that turns
allocator mode off)."""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
_argv, sys.argv = sys.argv, sys.argv[:1]
import torch  # noqa: E402

import _zoo  # noqa: E402
import run_zoo  # noqa: E402
import scoring  # noqa: E402

sys.argv = _argv
GiB = 1 << 30


class Bisection(unittest.TestCase):
    def fits_below(self, largest, calls):
        def fits(b):
            calls.append(b)
            return b <= largest
        return fits

    def test_finds_the_largest_batch_within_its_probes(self):
        calls = []
        r = _zoo.bisect(self.fits_below(37, calls), 100, warm=1, probes=8)
        self.assertEqual((r["largest_fitting_batch"], r["smallest_failing_batch"], r["exact"]), (37, 38, True))
        self.assertLessEqual(len(calls), 8)
        self.assertEqual(calls[0], 1, "the warm probe comes first")

    def test_a_bracket_when_the_probes_run_out(self):
        r = _zoo.bisect(self.fits_below(700, []), 4000, warm=1, probes=4)
        self.assertLessEqual(r["largest_fitting_batch"], 700)
        self.assertGreater(r["smallest_failing_batch"], 700)
        self.assertFalse(r["exact"])
        self.assertEqual(r["probes"], 4)

    def test_nothing_fits(self):
        r = _zoo.bisect(self.fits_below(0, []), 64, warm=1)
        self.assertEqual((r["largest_fitting_batch"], r["smallest_failing_batch"]), (0, 1))

    def test_a_warm_probe_that_is_known_to_fit_narrows_the_range(self):
        calls = []
        r = _zoo.bisect(self.fits_below(1500, calls), 2048, warm=1024, probes=8)
        self.assertEqual(calls[0], 1024)
        self.assertTrue(all(c > 1024 for c in calls[1:]))
        self.assertLessEqual(r["smallest_failing_batch"] - r["largest_fitting_batch"], 8)

    def test_out_of_time_stops_it(self):
        calls = []
        _zoo.bisect(self.fits_below(10, calls), 1000, warm=None, out_of_time=lambda: len(calls) >= 2)
        self.assertEqual(len(calls), 2)


class Probe(unittest.TestCase):
    def test_out_of_memory_is_no_fit_and_everything_is_freed(self):
        resets = []

        def step(b):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        self.assertFalse(_zoo.probe(step, 8, reset=lambda: resets.append(1)))
        self.assertEqual(len(resets), 2, "reset before and after the probe")

    def test_a_library_that_could_not_get_its_workspace_is_no_fit(self):
        def step(b):
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

        self.assertFalse(_zoo.probe(step, 8))

    def test_another_error_is_raised(self):
        def step(b):
            raise ValueError("a bug in the program")

        with self.assertRaises(ValueError):
            _zoo.probe(step, 8)

    def test_batch_truth_prints_one_line_on_stderr_and_nothing_on_stdout(self):
        def step(b):
            print("a framework's progress line")
            if b > 20:
                raise torch.OutOfMemoryError("no")

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            r = _zoo.batch_truth(step, 64)
        self.assertEqual(out.getvalue(), "", "the probes' output goes to stderr: stdout stays as without them")
        self.assertEqual(r["largest_fitting_batch"], 20)
        self.assertEqual(scoring.batch_truth(err.getvalue())["largest_fitting_batch"], 20)

    def test_bisection_is_off_under_the_launchers(self):
        os.environ["ZOO_BISECT"] = "0"
        try:
            self.assertIsNone(_zoo.batch_truth(lambda b: None, 64))
        finally:
            del os.environ["ZOO_BISECT"]

    def test_a_probe_that_breaks_is_said_in_the_record(self):
        def step(b):
            raise KeyError("labels")

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            r = _zoo.batch_truth(step, 64)
        self.assertIn("KeyError", r["error"])
        self.assertIsNone(r["largest_fitting_batch"])

    def test_too_large_doubles_a_batch_that_fit_and_names_the_one_that_failed(self):
        def step(b):
            if b >= 40:
                raise torch.OutOfMemoryError("no")

        with contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(torch.OutOfMemoryError) as e:
                _zoo.too_large(step, 10)
        self.assertEqual(e.exception.batch, 40)
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            _zoo.too_large(lambda b: None, 10, tries=2)


class Truth(unittest.TestCase):
    def test_storages_are_counted_once_and_wrappers_are_looked_through(self):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))
        model[1].weight = model[0].weight  # tied: one storage
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(4, 64)).sum().backward()
        opt.step()

        class Wrapped:  # accelerate's AcceleratedOptimizer keeps the torch one as `.optimizer`
            def __init__(self, o):
                self.optimizer = o

        k = _zoo.count_kinds([model, model], [Wrapped(opt)], on_device=lambda t: True)
        w = 64 * 64 * 4
        # Two moments, and Adam's step count (a 4-byte tensor, on the CPU unless fused or capturable).
        self.assertEqual(k, {"parameters_bytes": w, "gradients_bytes": w, "optimizer_state_bytes": 2 * w + 4})
        self.assertEqual(_zoo.count_kinds([model], [opt])["parameters_bytes"], 0, "only CUDA tensors count")

    def test_activations_are_what_torch_allocated_beyond_the_three(self):
        kinds = {"parameters_bytes": 10 * GiB, "gradients_bytes": 10 * GiB, "optimizer_state_bytes": 0}
        t = _zoo.truth_record("p", "activations", kinds, {"allocated_bytes": 45 * GiB, "request_bytes": GiB},
                              os.path.join(HERE, "kinds_logits_loss.py"))
        self.assertEqual(t["measured"]["activations_bytes"], 25 * GiB)
        self.assertEqual(t["measured"]["dominant"], "activations")
        self.assertEqual(t["expect_lines"], run_zoo.expect_lines(os.path.join(HERE, "kinds_logits_loss.py")))
        self.assertNotIn("measured", _zoo.truth_record("p", "activations", kinds, {}), "allocator mode: no observer")

    def test_the_observer_is_attached_when_cuda_starts_and_only_to_torch(self):
        """torch's allocator drops an observer attached before its lazy init; in allocator mode
        the attach function is oomshim's, whose figures are the ones judged: not used."""
        queued, attached = [], []
        lazy, attach = torch.cuda._lazy_call, torch._C._cuda_attach_out_of_memory_observer
        try:
            torch.cuda._lazy_call = queued.append
            _zoo._watch_failures()
            self.assertEqual(queued, [_zoo._attach])

            def torch_attach(fn):
                attached.append(fn)
            torch_attach.__module__ = "torch._C"
            torch._C._cuda_attach_out_of_memory_observer = torch_attach
            _zoo._attach()
            self.assertEqual(attached, [_zoo._observer])

            def oomshim_attach(fn):
                attached.append(fn)
            oomshim_attach.__module__ = "oomshim.torch"
            torch._C._cuda_attach_out_of_memory_observer = oomshim_attach
            _zoo._attach()
            self.assertEqual(len(attached), 1)
        finally:
            torch.cuda._lazy_call, torch._C._cuda_attach_out_of_memory_observer = lazy, attach

    def test_the_dominant_kind_breaks_ties_as_oomshim_does(self):
        self.assertEqual(_zoo.dominant_of({"parameters_bytes": 5, "gradients_bytes": 5}), "parameters")
        self.assertIsNone(_zoo.dominant_of({}))
        self.assertEqual(scoring.dominant({"parameters_bytes": 5, "activations_bytes": 6}), "activations")


def rust_sentence():
    """The advice sentence with the largest batch, as src/core/verdict/words/kinds.rs writes it,
    with its string continuations joined."""
    with open(os.path.join(ROOT, "src/core/verdict/words/kinds.rs")) as f:
        return re.sub(r"\\\n\s*", "", f.read())


class BatchClaim(unittest.TestCase):
    def test_the_rust_sentences_are_the_ones_parsed(self):
        src = rust_sentence()
        self.assertIn("at this rate at most {} would have fit", src)
        self.assertIn("for the whole pass{}, so {} would have fit", src)
        self.assertIn("per sample, so {} would have fit", src)
        self.assertIn('format!("a batch of about {}", thousands(fits))', src)
        self.assertIn('format!("a batch of {}", thousands(fits))', src)
        self.assertIn("not even one sample of this batch of {b} would fit", src)
        for fits, expected in (("a batch of 1,234", 1234), ("a batch of about 75", 75)):
            said = f"The batch of 4,096 needs ... at this rate at most {fits} would have fit, fewer since ..."
            self.assertEqual(scoring.batch_claim({"verdict": {"suggestions": ["other", said]}}), expected)
        whole = "... about 2.62 GiB per sample for the whole pass and the backward's gradients, so a batch of about 29 would have fit: ..."
        self.assertEqual(scoring.batch_claim({"verdict": {"suggestions": [whole]}}), 29)
        zero = "At 16.00 MiB per sample not even one sample of this batch of 64 would fit: ..."
        self.assertEqual(scoring.batch_claim({"verdict": {"suggestions": [zero]}}), 0)
        self.assertIsNone(scoring.batch_claim({"verdict": {"suggestions": ["lower the batch"]}}))

    def test_never_above_and_at_least_ninety_percent(self):
        exact = {"largest_fitting_batch": 100, "smallest_failing_batch": 101, "failed_batch": 400}
        self.assertTrue(scoring.score_batch(100, exact)["ok"])
        self.assertTrue(scoring.score_batch(90, exact)["ok"])
        self.assertFalse(scoring.score_batch(101, exact)["ok"], "a batch that failed")
        self.assertFalse(scoring.score_batch(89, exact)["ok"])
        self.assertFalse(scoring.score_batch(None, exact)["ok"], "no claim is a miss")
        wide = {"largest_fitting_batch": 90, "smallest_failing_batch": 120, "failed_batch": 400}
        self.assertIsNone(scoring.score_batch(85, wide)["ok"], "the real one may be 119")
        self.assertIsNone(scoring.score_batch(100, wide)["ok"], "the real one may be 90")
        self.assertIsNone(scoring.score_batch(50, None)["ok"])


def dump(kind, headline, kinds=None, t=1000, recovered=False, suggestions=(), source="unavailable"):
    d = {"schema": "oomshim.dump/1", "reason": "oom", "time_unix_ms": t,
         "failed_request": {"bytes": GiB, "recovered": recovered, "last_failure": {"time_unix_ms": t}},
         "verdict": {"kind": kind, "summary": "", "suggestions": list(suggestions),
                     "findings": [{"kind": kind, "headline": headline}]},
         "free_blocks": {"source": source}}
    if kinds:
        d["framework"] = {"kinds": kinds}
    return d


class Selection(unittest.TestCase):
    def test_the_dump_scored_is_the_failure_the_truth_describes(self):
        stood = [("a", dump("own_allocations", "x", t=100)), ("b", dump("own_allocations", "y", t=200)),
                 ("c", dump("own_allocations", "probe", t=900))]
        self.assertEqual(scoring.scored_index(stood, {"caught_unix_ms": 500}), 1)
        self.assertEqual(scoring.scored_index(stood, None), 2)
        self.assertEqual(scoring.scored_index(stood, {"caught_unix_ms": 50}), 0)

    def test_one_request_said_twice_is_counted_and_an_earlier_one_is_not(self):
        raised = dump("own_allocations", "x", t=5000)
        twice = [("a", dump("own_allocations", "x", t=4998, recovered=True)), ("b", raised)]
        self.assertEqual(scoring.same_request(twice, raised), 2)
        earlier = [("a", dump("own_allocations", "x", t=1000, recovered=True)), ("b", raised)]
        self.assertEqual(scoring.same_request(earlier, raised), 1)
        other = dump("own_allocations", "x", t=4999)
        other["failed_request"]["bytes"] = 2 * GiB
        self.assertEqual(scoring.same_request([("a", other), ("b", raised)], raised), 1)

    def test_recovered_failures_did_not_stand(self):
        loaded = [("a", dump("own_allocations", "x", recovered=True)), ("b", dump("own_allocations", "y"))]
        self.assertEqual([p for p, _ in scoring.stood(loaded)], ["b"])

    def test_the_first_truth_line_is_the_failure_s(self):
        err = "noise\noomshim-kinds-truth: {\"program\": \"a\"}\noomshim-kinds-truth: {\"program\": \"probe\"}\n"
        self.assertEqual(scoring.kinds_truth(err)["program"], "a")
        self.assertIsNone(scoring.kinds_truth("oomshim-kinds-truth: {broken"))


def write_run(root, case, launcher, stdout, stderr, rc=0, dumps=(), reports=()):
    d = os.path.join(root, case, launcher)
    os.makedirs(d, exist_ok=True)
    for name, text in (("stdout.txt", stdout), ("stderr.txt", stderr), ("rc", str(rc)), ("secs", "3.5")):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    for i, (dmp, report_kind) in enumerate(zip(dumps, reports), 1):
        with open(os.path.join(d, f"oomshim-host-42-{i}.json"), "w") as f:
            json.dump(dmp, f)
        with open(os.path.join(d, f"oomshim-host-42-{i}.report.json"), "w") as f:
            json.dump({"verdict": {"kind": report_kind}}, f)


def summary_line(d):
    top = d["verdict"]["findings"][0]
    return f"oomshim: CUDA out of memory on device 0 — {top['kind']}: {top['headline']}\n"


class DryRun(unittest.TestCase):
    """run_zoo.py end to end on recorded runs: a corpus case right under one launcher and wrong
    under the others, a case whose package is missing, a zoo case without an account."""

    def setUp(self):
        self.runs = tempfile.mkdtemp(prefix="zoo-dry-runs-")
        self.out = tempfile.mkdtemp(prefix="zoo-dry-out-")
        P, A = 2 * GiB, 60 * GiB
        truth = {"program": "kinds_logits_loss", "dominant": "activations", "parameters_bytes": P,
                 "gradients_bytes": 0, "optimizer_state_bytes": 0, "caught_unix_ms": 5000,
                 "measured": {"allocated_at_failure_bytes": P + A, "activations_bytes": A, "dominant": "activations"}}
        truth_line = "oomshim-kinds-truth: " + json.dumps(truth) + "\n"
        batch = "oomshim-batch-truth: " + json.dumps({"largest_fitting_batch": 17, "failed_batch": 63,
                                                      "smallest_failing_batch": 18, "probes": 7}) + "\n"
        out = "training at batch 63\nout of memory in the loss\n"
        line = run_zoo.expect_lines(os.path.join(HERE, "kinds_logits_loss.py"))[0]
        advice = "The batch of 63 needs ... at this rate at most a batch of 17 would have fit, fewer since ..."
        write_run(self.runs, "kinds_logits_loss", "bare", out, "warning\n" + truth_line + batch)
        right = dump("own_allocations", f"activations and other live tensors fill device 0 at {line}",
                     {"parameters_bytes": P, "gradients_bytes": 0, "optimizer_state_bytes": 0,
                      "activations_bytes": A + (1 << 20)}, t=4000, suggestions=[advice])
        write_run(self.runs, "kinds_logits_loss", "preload", out, summary_line(right) + truth_line,
                  dumps=[right], reports=["own_allocations"])
        # `run`: the weights counted as activations, the batch claimed above the real one.
        wrong = dump("own_allocations", f"activations fill device 0 at {line}",
                     {"parameters_bytes": P // 4, "gradients_bytes": 0, "optimizer_state_bytes": 0,
                      "activations_bytes": A}, t=4000,
                     suggestions=[advice.replace("a batch of 17", "a batch of about 20")])
        write_run(self.runs, "kinds_logits_loss", "run", out, summary_line(wrong) + truth_line,
                  dumps=[wrong], reports=["own_allocations"])
        # `alloc`: the output changed, and allocator mode was off.
        write_run(self.runs, "kinds_logits_loss", "alloc", out + "extra\n",
                  "oomshim: allocator mode is off for this process, torch keeps its own allocator: x\n"
                  + summary_line(right) + truth_line.replace('"measured"', '"unmeasured"'),
                  dumps=[right], reports=["own_allocations"])
        write_run(self.runs, "peft_lora_trainer", "bare", "[INFO] skipped: peft missing\n", "")
        big = dump("request_exceeds_device", "one request of 312 GiB is larger than device 0 at too_large.py:6")
        write_run(self.runs, "too_large", "bare", "allocating\n", "Traceback\n", rc=1)
        write_run(self.runs, "too_large", "preload", "allocating\n", summary_line(big) + "Traceback\n", rc=1,
                  dumps=[big], reports=["request_exceeds_device"])
        with open(os.path.join(self.runs, "card.json"), "w") as f:
            json.dump({"name": "NVIDIA H100 80GB HBM3", "total_bytes": 85 * 10 ** 9, "torch": "2.11.0+cu130",
                       "date": "2026-12-05", "oomshim": "oomshim 0.1.0",
                       "packages": {"transformers": "5.17.0", "peft": None}}, f)
        env = dict(os.environ, ZOO_DRY="1", ZOO_DRY_DIR=self.runs,
                   ZOO_CASES="kinds_logits_loss,peft_lora_trainer,too_large", ZOO_LAUNCHERS="",
                   ZOO_GPUS="0,1,2")  # three cases at once: the tables still follow the cases' order
        self.p = subprocess.run([sys.executable, os.path.join(HERE, "run_zoo.py"), self.out], env=env,
                                capture_output=True, text=True, timeout=120)
        with open(os.path.join(self.out, "zoo.jsonl")) as f:
            self.rows = {(r["case"], r["launcher"]): r for r in map(json.loads, f)}
        with open(os.path.join(self.out, "zoo.json")) as f:
            self.ordered = [r["case"] for r in json.load(f)]

    def test_reverdict_judges_each_recorded_dump_by_the_cli_at_hand(self):
        # A CLI whose report calls every dump a leak: the rows take its verdict, and stderr (the
        # recording build's) is not scored.
        cli = os.path.join(self.runs, "stub-oomshim")
        with open(cli, "w") as f:
            f.write("#!" + sys.executable + "\nimport json\nprint(json.dumps({'verdict': {'kind': 'leak', "
                    "'summary': '', 'findings': [{'kind': 'leak', 'headline': 'x grows'}], 'suggestions': []}}))\n")
        os.chmod(cli, 0o755)
        out = tempfile.mkdtemp(prefix="zoo-reverdict-out-")
        env = dict(os.environ, ZOO_DRY="1", ZOO_REVERDICT="1", ZOO_DRY_DIR=self.runs, ZOO_CASES="kinds_logits_loss",
                   ZOO_LAUNCHERS="", OOMSHIM_GPU_CLI=cli)
        p = subprocess.run([sys.executable, os.path.join(HERE, "run_zoo.py"), out], env=env,
                           capture_output=True, text=True, timeout=120)
        with open(os.path.join(out, "zoo.jsonl")) as f:
            rows = {(r["case"], r["launcher"]): r for r in map(json.loads, f)}
        r = rows[("kinds_logits_loss", "preload")]
        self.assertEqual((r["verdict"], r["report_kind"]), ("leak", "leak"), p.stderr)
        self.assertFalse(r["verdict_ok"])
        self.assertIsNone(r["agree"])
        self.assertEqual(self.rows[("kinds_logits_loss", "preload")]["verdict"], "own_allocations")
        # Only recorded runs can be judged again.
        env.pop("ZOO_DRY")
        p = subprocess.run([sys.executable, os.path.join(HERE, "run_zoo.py"), out], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ZOO_REVERDICT=1 judges recorded runs again: it needs ZOO_DRY=1", p.stderr)

    def test_a_run_right_in_every_column(self):
        r = self.rows[("kinds_logits_loss", "preload")]
        for key in ("output_unchanged", "verdict_ok", "dominant_ok", "kinds_ok", "line_ok", "agree", "ok"):
            self.assertIs(r[key], True, key)
        self.assertEqual(r["same_request_dumps"], 1)
        self.assertEqual(r["batch"], {"claim": 17, "real": 17, "failing": 18, "ok": True})
        self.assertIn("activations_bytes", r["kinds_cmp"], "measured in this run: compared")

    def test_each_wrong_column_is_caught(self):
        r = self.rows[("kinds_logits_loss", "run")]
        self.assertFalse(r["kinds_ok"])
        self.assertFalse(r["kinds_cmp"]["parameters_bytes"][2])
        self.assertTrue(r["dominant_ok"])
        self.assertFalse(r["batch"]["ok"])
        self.assertIn("above the real largest", r["batch"]["why"])
        self.assertFalse(r["ok"])
        self.assertEqual(r["broken"], ["parameters 0.50 vs 2.00 GiB",
                                       "batch: 20 is above the real largest (17; 18 failed)"])
        a = self.rows[("kinds_logits_loss", "alloc")]
        self.assertFalse(a["output_unchanged"])
        self.assertIs(a["alloc_mode"], False)
        self.assertFalse(a["alloc_mode_ok"])
        self.assertNotIn("activations_bytes", a["kinds_cmp"], "not measured in that run: not compared")
        self.assertTrue(a["dominant_ok"], "the bare run's measured dominant kind stands in")

    def test_cases_spread_over_gpus_are_tabled_in_order(self):
        self.assertEqual(self.ordered, sorted(self.ordered, key=["kinds_logits_loss", "peft_lora_trainer",
                                                                  "too_large"].index))
        self.assertIn("on 3 GPU(s)", self.p.stdout.splitlines()[0])

    def test_gpus_are_indices_or_all(self):
        for value, want in (("", [None]), ("0, 3", ["0", "3"])):
            os.environ["ZOO_GPUS"] = value
            self.assertEqual(run_zoo.gpus(), want)
        os.environ["ZOO_GPUS"] = "first"
        with self.assertRaises(ValueError):
            run_zoo.gpus()
        del os.environ["ZOO_GPUS"]

    def test_pieces_cover_the_set_once_and_about_evenly(self):
        old = {k: os.environ.get(k) for k in ("ZOO_SET", "ZOO_PIECE", "ZOO_CASES")}
        try:
            os.environ.pop("ZOO_CASES", None)
            os.environ["ZOO_SET"] = "corpus"
            corpus = run_zoo.case_names()
            self.assertEqual(len(corpus), len([c for c in run_zoo.CASES if c.corpus]))
            got = []
            for k in range(1, 5):
                os.environ["ZOO_PIECE"] = f"{k}/4"
                got.append(run_zoo.case_names())
            self.assertEqual(sorted(sum(got, [])), sorted(corpus))
            times = [run_zoo.expected_seconds(p) for p in got]
            self.assertLess(max(times) - min(times), max(run_zoo.seconds_of(c) for c in run_zoo.chosen(corpus)))
            for bad in ("5/4", "0/4", "half"):
                os.environ["ZOO_PIECE"] = bad
                with self.assertRaises(ValueError):
                    run_zoo.case_names()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_a_budget_leaves_out_what_would_end_past_it_and_still_tables(self):
        out = tempfile.mkdtemp(prefix="zoo-dry-budget-")
        # A dry run takes no time: the budget lets in the shorter case alone.
        short, long = sorted(("kinds_logits_loss", "too_large"), key=lambda n: run_zoo.seconds_of(run_zoo.chosen([n])[0]))
        first = run_zoo.seconds_of(run_zoo.chosen([short])[0])
        self.assertLess(first, run_zoo.seconds_of(run_zoo.chosen([long])[0]))
        env = dict(os.environ, ZOO_DRY="1", ZOO_DRY_DIR=self.runs, ZOO_LAUNCHERS="",
                   ZOO_CASES=f"{long},{short}", ZOO_BUDGET=str(first + 1))
        p = subprocess.run([sys.executable, os.path.join(HERE, "run_zoo.py"), out], env=env,
                           capture_output=True, text=True, timeout=120)
        with open(os.path.join(out, "zoo.jsonl")) as f:
            cases = {json.loads(line)["case"] for line in f}
        self.assertEqual(cases, {short})
        self.assertIn(f"not run, over ZOO_BUDGET's {first + 1} s: {long}", p.stdout)
        self.assertTrue(os.path.exists(os.path.join(out, "zoo.md")))
        for bad in ("soon", "-5"):
            env["ZOO_BUDGET"] = bad
            p = subprocess.run([sys.executable, os.path.join(HERE, "run_zoo.py"), out], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("ZOO_BUDGET", p.stderr)

    def test_a_missing_package_is_not_run_never_passed(self):
        for launcher in ("preload", "run", "alloc"):
            r = self.rows[("peft_lora_trainer", launcher)]
            self.assertEqual(r["skipped"], "peft")
            self.assertFalse(r["ok"])
        self.assertEqual(self.rows[("peft_lora_trainer", "bare")]["skipped"], "peft")

    def test_a_zoo_case_without_an_account_keeps_its_columns(self):
        r = self.rows[("too_large", "preload")]
        self.assertTrue(r["ok"], r)
        self.assertNotIn("dominant_ok", r)

    def test_the_markdown_table(self):
        with open(os.path.join(self.out, "zoo.md")) as f:
            md = f.read()
        self.assertIn("OOM corpus on NVIDIA H100 80GB HBM3 (79.16 GiB), torch 2.11.0+cu130, 2026-12-05; oomshim 0.1.0. "
                      "Packages: transformers 5.17.0, peft missing.", md)
        self.assertRegex(md, r"\| preload \| 2 \| 1 \| 2/2 \| 2/2 \| 1/1 \| 1/1 \| 2/2 \| 1/1 \| 2/2 \|")
        self.assertRegex(md, r"\| run \| 1 \| 1 \| 1/1 \| 1/1 \| 1/1 \| 0/1 \| 1/1 \| 0/1 \| 0/1 \|")
        self.assertIn("| kinds_logits_loss | PyTorch | run | Y | own_allocations Y | activations / activations Y | "
                      "p 0.50/2.00 ✗", md)
        self.assertRegex(md, r"\| kinds_logits_loss \| PyTorch \| alloc \| N \|.*\| allocator mode off \|")
        self.assertIn("| peft_lora_trainer | PEFT + HF Trainer | alloc | not run: peft missing |", md)
        self.assertEqual(self.p.returncode, 1, self.p.stdout + self.p.stderr)
        self.assertIn("about", self.p.stdout.splitlines()[0], "the expected time first")


class Corpus(unittest.TestCase):
    """What every corpus program promises, read from its source."""

    def cases(self):
        return [c for c in run_zoo.CASES if c.corpus]

    def test_thirty_programs_at_least_half_driven_by_a_framework(self):
        self.assertGreaterEqual(len(self.cases()), 30)
        framed = [c for c in self.cases() if c.framework]
        self.assertGreaterEqual(2 * len(framed), len(self.cases()))

    def test_each_program_compiles_prints_its_account_and_marks_its_line(self):
        for c in self.cases():
            path = os.path.join(HERE, c.program)
            with open(path) as f:
                src = f.read()
            compile(src, path, "exec")
            self.assertRegex(src, rf'(kinds_truth\(|lightning_trainer\(pl, )"{c.name}"', c.name)
            self.assertTrue(run_zoo.expect_lines(path), c.name)
            bisects = "batch_truth(" in src or "fail_then_bisect(" in src
            self.assertEqual(bisects, c.batch, f"{c.name}: bisects exactly when its batch is scored")
            # Sized from the device: no program has a size of its own in GiB.
            self.assertRegex(src, r"total_bytes\(\)|mem_get_info", c.name)
            self.assertNotRegex(src, r"\d+\s*\*\s*GiB|<<\s*30\)", c.name)

    def test_a_framework_is_asked_for_before_it_is_imported(self):
        framework = re.compile(r"^(?:import|from) (?:transformers|timm|peft|accelerate|lightning|pytorch_lightning)\b"
                               r"|import_module\(", re.M)
        for c in self.cases():
            with open(os.path.join(HERE, c.program)) as f:
                src = f.read()
            first = framework.search(src)
            if first:
                self.assertIn("require(", src[:first.start()], c.name)

    def test_require_says_skipped_and_exits_0(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as e:
            _zoo.require("json", "no_such_package_here|nor_this_one")
        self.assertEqual(e.exception.code, 0)
        self.assertEqual(scoring.skipped(out.getvalue()), "nor_this_one")
        self.assertEqual(_zoo.require("json|nothing"), ["json"])

    def test_no_file_beside_the_programs_turns_allocator_mode_off(self):
        """The hook reads the sources beside a program for features a pluggable allocator cannot
        serve: one such file here would switch allocator mode off for every program. Those live
        in folders of their own (sibling_compile/, cudagraphs/)."""
        sys.path.insert(0, os.path.join(ROOT, "shim/python"))
        try:
            from oomshim.torch import unservable_uses
        except ImportError:
            unservable_uses = None
        finally:
            sys.path.pop(0)
        graphs = "reduce" + "-overhead"
        patterns = [graphs, "max-" + "autotune", "cuda" + "graph_trees", "Mem" + "Pool", "cudnn." + "benchmark"]
        for name in sorted(os.listdir(HERE)):
            path = os.path.join(HERE, name)
            if os.path.isfile(path) and name.endswith((".py", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")):
                with open(path) as f:
                    text = f.read()
                for p in patterns:
                    self.assertNotIn(p, text, name)
        if unservable_uses is not None:
            self.assertEqual(unservable_uses([os.path.join(HERE, "kinds_adam_large.py")]), [])
        with open(os.path.join(HERE, "sibling_compile", "other.py")) as f:
            self.assertIn(graphs, f.read(), "the sibling the program never imports asks for CUDA graphs")
        with open(os.path.join(HERE, "sibling_compile", "prog.py")) as f:
            self.assertNotRegex(f.read(), r"import other|from other", "and the program never imports it")


if __name__ == "__main__":
    unittest.main()
