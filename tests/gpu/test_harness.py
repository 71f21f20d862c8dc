"""The GPU harness's own logic on canned inputs, runnable without a GPU (or torch):

    python3 tests/gpu/test_harness.py

run_all.py's merge parsing, zoo scoring and final table, run_zoo.py's promise per run and
check_wheel.py's choice of wheel."""
import json
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "zoo"))
_argv, sys.argv = sys.argv, [sys.argv[0], tempfile.mkdtemp(prefix="oomshim-harness-")]
import run_all  # noqa: E402  (reads OUT from argv at import)
sys.argv = _argv
import run_zoo  # noqa: E402
import check_wheel  # noqa: E402


def merge(first_rank, uncertain=(), oom_ranks=(1,)):
    rows = [{"rank": r, "reason": "oom" if r in oom_ranks else "exit"} for r in (0, 1)]
    first = None if first_rank is None else {
        "process": {"rank": first_rank}, "uncertain_with": [{"rank": r} for r in uncertain]}
    return json.dumps({"report": "oomshim.merge/1", "rows": rows, "first_failure": first})


class Merge(unittest.TestCase):
    def test_the_leaking_rank_first_and_alone(self):
        self.assertTrue(run_all.merge_names_leaking_rank(merge(1), 1)[0])

    def test_rank_1_mentioned_elsewhere_is_not_enough(self):
        self.assertFalse(run_all.merge_names_leaking_rank(merge(0, oom_ranks=(0, 1)), 1)[0])
        self.assertFalse(run_all.merge_names_leaking_rank(merge(1, uncertain=(0,)), 1)[0])
        self.assertFalse(run_all.merge_names_leaking_rank(merge(1, oom_ranks=(0, 1)), 1)[0])
        self.assertFalse(run_all.merge_names_leaking_rank(merge(None), 1)[0])
        self.assertFalse(run_all.merge_names_leaking_rank("rank 1 ran out of memory", 1)[0])


def scored(case, launcher, **kw):
    r = {"case": case, "launcher": launcher, "output_unchanged": True, "dump_ok": True, "verdict_ok": True,
         "line_ok": True, "agree": True}
    r.update(kw)
    r["ok"] = run_zoo.run_ok(r)
    return r


class Zoo(unittest.TestCase):
    def test_a_missed_expect_line_fails_the_run(self):
        self.assertFalse(run_zoo.run_ok(scored("a", "run", line_ok=False)))
        self.assertTrue(run_zoo.run_ok(scored("a", "run", line_ok=None)))  # no line marked

    def test_every_promise_counts(self):
        for k in ("output_unchanged", "dump_ok", "verdict_ok", "agree"):
            self.assertFalse(run_zoo.run_ok(scored("a", "run", **{k: False})), k)

    def test_build_failures_and_missing_runs_fail(self):
        expected = [("a", "preload"), ("a", "run"), ("b", "run"), ("c", "run")]
        written = [{"case": "a", "launcher": "bare"}, scored("a", "preload"), scored("a", "run"),
                   {"case": "b", "launcher": "build", "rc": 1, "stderr": "nvcc: error"}]
        rows = run_all.zoo_rows(written, expected, 1)
        failed = {c for c, ok, _ in rows if not ok}
        self.assertIn("zoo b: build", failed)
        self.assertIn("zoo c (run)", failed)
        self.assertNotIn("zoo b (run)", failed, "a failed build is one row, not one per launcher")
        self.assertIn(("zoo under run: 1 programs", True), [(c, ok) for c, ok, _ in rows])

    def test_a_failed_run_fails_its_launcher(self):
        rows = run_all.zoo_rows([scored("a", "run", line_ok=False)], [("a", "run")], 1)
        self.assertEqual([ok for c, ok, _ in rows], [False, False])

    def test_a_skipped_program_fails_saying_what_is_missing_and_broken_promises_are_named(self):
        skipped = {"case": "a", "launcher": "run", "skipped": "timm", "ok": False}
        broken = dict(scored("b", "run", verdict_ok=False), broken=["verdict right"])
        rows = run_all.zoo_rows([skipped, broken], [("a", "run"), ("b", "run")], 1)
        detail = {c: (ok, d) for c, ok, d in rows}
        self.assertEqual(detail["zoo a (run)"], (False, "not run: timm missing on this machine"))
        self.assertFalse(detail["zoo b (run)"][0])
        self.assertTrue(detail["zoo b (run)"][1].startswith("broken: verdict right; "), detail["zoo b (run)"][1])

    def test_nothing_scored_or_out_of_time_fails(self):
        self.assertFalse(all(ok for _, ok, _ in run_all.zoo_rows([], [], 0)))
        rows = run_all.zoo_rows([scored("a", "run")], [("a", "run")], 124)
        self.assertFalse(all(ok for _, ok, _ in rows))

    def test_expected_runs_follow_the_cases(self):
        runs = run_zoo.expected_runs(["too_large", "plain_c"])
        self.assertEqual(runs, [("too_large", "preload"), ("too_large", "run"), ("too_large", "alloc"),
                                ("plain_c", "preload"), ("plain_c", "run")])
        self.assertEqual(len(run_zoo.expected_runs()),
                         sum(len(c.launchers) - 1 for c in run_zoo.CASES))


class Table(unittest.TestCase):
    def setUp(self):
        run_all.rows.clear()

    def test_figures_are_never_a_pass_and_only_assertions_decide(self):
        run_all.row("a check", True, "fine")
        run_all.figure("a cost", "1.20x", "<= 1.15x", "rounds")
        run_all.info("a fact", "yes")
        table = run_all.final_table()
        self.assertIn("| a cost | 1.20x vs goal <= 1.15x | rounds |", table)
        self.assertIn("| a fact | INFO | yes |", table)
        self.assertIn("1 passed, 0 failed; 1 figures", table)
        self.assertNotIn("| a cost | PASS", table)


class Wheel(unittest.TestCase):
    def test_versions_compare_as_numbers(self):
        k = check_wheel.version_key
        self.assertGreater(k("oomshim-0.10.0-py3-none-linux_x86_64.whl"), k("oomshim-0.9.0-py3-none-linux_x86_64.whl"))
        self.assertGreater(k("oomshim-1.0.0-py3-none-any.whl"), k("oomshim-1.0.0rc1-py3-none-any.whl"))

    def test_the_newest_build_is_picked_not_the_lexicographic_last(self):
        d = tempfile.mkdtemp()
        old = os.path.join(d, "oomshim-0.9.0-py3-none-linux_x86_64.whl")
        new = os.path.join(d, "oomshim-0.10.0-py3-none-linux_x86_64.whl")
        for p in (old, new):
            open(p, "w").close()
        now = time.time()
        os.utime(old, (now - 100, now - 100))
        os.utime(new, (now, now))
        self.assertEqual(sorted([old, new])[-1], old, "the case the lexicographic order gets wrong")
        self.assertEqual(check_wheel.newest_wheel([old, new]), new)
        os.utime(old, (now, now))  # same time: the higher version
        self.assertEqual(check_wheel.newest_wheel([old, new]), new)
        self.assertIsNone(check_wheel.newest_wheel([]))


class ScriptCheck(unittest.TestCase):
    """A standalone check script's lines become rows; silence and timeouts are failures."""

    def script(self, body):
        d = tempfile.mkdtemp(prefix="oomshim-script-check-")
        path = os.path.join(d, "check_fake.py")
        with open(path, "w") as f:
            f.write(body)
        return path

    def rows_of(self, path, timeout=30):
        before = len(run_all.rows)
        run_all.script_check(path, timeout=timeout)
        return run_all.rows[before:]

    def test_each_kind_of_line_is_its_row(self):
        got = self.rows_of(self.script(
            "print('[PASS] a: fine')\nprint('noise')\nprint('[FAIL] b: broke')\n"
            "print('[INFO] c: a fact')\nprint('[FIGURE] d: 1.02x vs goal <= 1.05x; 5 rounds')\n"))
        self.assertEqual([(c, r, a) for c, r, _, a in got], [
            ("check_fake: a", "PASS", True), ("check_fake: b", "FAIL", True),
            ("check_fake: c", "INFO", False), ("check_fake: d", "1.02x vs goal <= 1.05x", False)])
        self.assertEqual(got[3][2], "5 rounds")

    def test_a_script_that_printed_no_row_fails(self):
        got = self.rows_of(self.script("import sys\nprint('Traceback: boom')\nsys.exit(1)\n"))
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0][1], "FAIL")
        self.assertIn("boom", got[0][2])

    def test_a_script_out_of_time_keeps_its_rows_and_fails(self):
        got = self.rows_of(self.script(
            "import time\nprint('[PASS] first: done', flush=True)\ntime.sleep(30)\n"), timeout=2)
        self.assertEqual([r for _, r, _, _ in got], ["PASS", "FAIL"])
        self.assertIn("out of its 2 s budget after 1 rows", got[1][2])


if __name__ == "__main__":
    unittest.main()
