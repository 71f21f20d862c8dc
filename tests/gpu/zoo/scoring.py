"""How the zoo scores a run: pure functions from what a run left (its stdout, stderr, dumps and
the report of its dump) to a row, and from rows to the tables. No GPU, no torch: run_zoo.py and
check_kinds.py use them on real runs, test_corpus.py on recorded ones.

A corpus program prints its own account at the failure (tests/gpu/zoo/_zoo.py): the kinds line
`oomshim-kinds-truth: {json}` and, for a program whose failure is its batch, the batch line
`oomshim-batch-truth: {json}`. Each run is scored on:

- output unchanged: stdout and exit status as in the bare run;
- verdict right: the dump's verdict is one the case allows;
- dominant kind right: the largest of the dump's kinds is the program's dominant kind (as
  measured at the failure where torch's observer ran, else as the program declares it);
- each kind within 5%: parameters, gradients and optimizer state, and activations where the
  same run measured them, each within 5% of the program's count (or 64 MiB, for small counts);
- line named: a line marked `# EXPECT-LINE` is in the headline;
- largest batch: the batch the verdict says would have fit, never above the real largest batch
  (found by bisection in the bare run) and at least 90% of it.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from standalone import load_dumps  # noqa: E402,F401 (the dumps as every GPU check reads them)

TOLERANCE = 0.05
SLACK = 64 << 20
KINDS = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes")
BATCH_FLOOR = 0.9

KINDS_TRUTH = "oomshim-kinds-truth: "
BATCH_TRUTH = "oomshim-batch-truth: "
SKIPPED = re.compile(r"^\[INFO\] skipped: (.+?) missing$", re.M)
ALLOCATOR_OFF = re.compile(r"^oomshim: allocator mode is off for this process.*$", re.M)


def truth_line(text, prefix):
    """The first line of `text` that starts with `prefix`, parsed; None when there is none or it
    is not JSON. The first: a program's failure comes before anything its bisection prints."""
    for line in (text or "").splitlines():
        if line.startswith(prefix):
            try:
                return json.loads(line[len(prefix):])
            except ValueError:
                return None
    return None


def kinds_truth(stderr):
    return truth_line(stderr, KINDS_TRUTH)


def batch_truth(stderr):
    return truth_line(stderr, BATCH_TRUTH)


def skipped(stdout):
    """The package a program said it lacks (`[INFO] skipped: NAME missing`), else None."""
    m = SKIPPED.search(stdout or "")
    return m.group(1) if m else None


def close(got, want):
    return abs((got or 0) - (want or 0)) <= max(TOLERANCE * (want or 0), SLACK)


def dominant(kinds):
    """The largest of the four kinds in a dump's `framework.kinds` or a truth record (ties: the
    first, as oomshim orders them); None when nothing was counted."""
    pairs = [("parameters", kinds.get("parameters_bytes") or 0), ("gradients", kinds.get("gradients_bytes") or 0),
             ("optimizer_state", kinds.get("optimizer_state_bytes") or 0),
             ("activations", kinds.get("activations_bytes") or 0)]
    best = max(pairs, key=lambda p: p[1])
    return best[0] if best[1] > 0 else None


def gib(n):
    return f"{n / (1 << 30):.2f}" if isinstance(n, (int, float)) else "-"


def failure_ms(dump):
    """When the dump's failure happened (its burst's last failure), else when it was captured."""
    req = dump.get("failed_request") or {}
    last = req.get("last_failure") or {}
    return last.get("time_unix_ms") or dump.get("time_unix_ms")


def stood(dumps):
    """(path, dump) of the failures that stood (torch raised; not recovered), in order."""
    return [(p, d) for p, d in dumps if (d.get("failed_request") or {}).get("recovered") is not True
            and d.get("failed_request")]


def scored_index(stood_dumps, truth):
    """Which stood dump a run is scored on: with a truth, the last one that failed before the
    program caught its failure (later ones are its bisection's probes, when it bisects); else
    the last one."""
    if not stood_dumps:
        return None
    caught = (truth or {}).get("caught_unix_ms")
    if caught is None:
        return len(stood_dumps) - 1
    before = [i for i, (_, d) in enumerate(stood_dumps) if (failure_ms(d) or 0) <= caught]
    return before[-1] if before else 0


SAME_REQUEST_MS = 1000


def same_request(loaded, dump):
    """How many dumps (recovered ones included) are of the scored failure's request: the same
    size on the same device, failed within SAME_REQUEST_MS before it. 1 when the failure told
    one story."""
    req = dump.get("failed_request") or {}
    at = failure_ms(dump) or 0
    return sum(1 for _, d in loaded
               if (d.get("failed_request") or {}).get("bytes") == req.get("bytes")
               and (d.get("failed_request") or {}).get("device") == req.get("device")
               and 0 <= at - (failure_ms(d) or 0) <= SAME_REQUEST_MS)


def kinds_of(dump):
    return (dump.get("framework") or {}).get("kinds")


def truth_dominant(truth, reference=None):
    """The program's dominant kind: measured at the failure in this run, else in the reference
    (bare) run, else as the program declares it."""
    for t in (truth, reference):
        m = (t or {}).get("measured") or {}
        if m.get("dominant"):
            return m["dominant"]
    return (truth or {}).get("dominant")


def compare_kinds(k, truth):
    """Each kind of the dump (`framework.kinds`) against the program's count: a dict of
    kind -> [dump bytes, truth bytes, within]; activations only where this run measured them."""
    out = {}
    for x in KINDS:
        out[x] = [k.get(x) or 0, truth.get(x) or 0, close(k.get(x), truth.get(x))]
    act = ((truth.get("measured") or {}).get("activations_bytes"))
    if act is not None:
        out["activations_bytes"] = [k.get("activations_bytes") or 0, act, close(k.get("activations_bytes"), act)]
    return out


BATCH_CLAIMS = (
    (re.compile(r"(?:at most|so) a batch of (?:about )?([\d,]+) would have fit"), lambda m: int(m.group(1).replace(",", ""))),
    (re.compile(r"not even one sample of this batch of [\d,]+ would fit"), lambda m: 0),
)


def batch_claim(dump):
    """The largest batch that would have fit, as the verdict's advice says it (oomshim states it
    in words only: src/core/verdict/words/kinds.rs); None when it says none."""
    verdict = dump.get("verdict") or {}
    for text in list(verdict.get("suggestions") or []) + [verdict.get("summary") or ""]:
        for pattern, value in BATCH_CLAIMS:
            m = pattern.search(text)
            if m:
                return value(m)
    return None


def score_batch(claim, truth):
    """The claim against the bisection's bracket [largest fitting L, smallest failing H):
    True when it is at most L and at least 90% of H - 1 (right whatever the real largest in the
    bracket is); False when it is at least H (above a batch that failed) or below 90% of L, or
    missing; None (unsure) when the bracket is too wide to tell."""
    if not truth or truth.get("largest_fitting_batch") is None:
        return {"claim": claim, "ok": None, "why": "no bisection result"}
    lo = truth["largest_fitting_batch"]
    hi = truth.get("smallest_failing_batch") or truth.get("failed_batch")
    row = {"claim": claim, "real": lo, "failing": hi}
    if claim is None:
        row.update(ok=False, why="the verdict states no largest batch")
    elif hi is not None and claim >= hi:
        row.update(ok=False, why=f"{claim} is above the real largest ({lo}; {hi} failed)")
    elif claim < BATCH_FLOOR * lo:
        row.update(ok=False, why=f"{claim} is below 90% of the real largest ({lo})")
    elif claim <= lo and (hi is None or claim >= BATCH_FLOOR * (hi - 1)):
        row.update(ok=True)
    else:
        row.update(ok=None, why=f"the bisection's bracket [{lo}, {hi}) is too wide to judge {claim}")
    return row


def run_ok(row):
    """What a scored row promises: output unchanged, the dumps, the verdict, the EXPECT-LINE line
    named where one is marked, stderr saying what the dump and the report say; for a corpus
    program also the dominant kind, each kind within 5% and the largest batch (where scored);
    allocator mode as the case expects. A promise that does not apply is None."""
    return bool(row.get("output_unchanged") and row.get("dump_ok") and row.get("verdict_ok")
                and row.get("line_ok") is not False and row.get("agree") is not False
                and row.get("dominant_ok") is not False and row.get("kinds_ok") is not False
                and (row.get("batch") or {}).get("ok") is not False and row.get("alloc_mode_ok") is not False
                and row.get("alloc_off_line_ok") is not False)


def yn(v):
    return {True: "Y", False: "N"}.get(v, "-")


def count(rows, key, get=None):
    """(right, judged) over rows where the promise applies."""
    get = get or (lambda r: r.get(key))
    judged = [get(r) for r in rows if get(r) is not None]
    return sum(1 for v in judged if v), len(judged)


COLUMNS = (
    ("output unchanged", "output_unchanged", None),
    ("verdict right", "verdict_ok", None),
    ("dominant kind right", "dominant_ok", None),
    ("each kind within 5%", "kinds_ok", None),
    ("line named", "line_ok", None),
    ("largest batch: ≤ real, ≥ 90%", "batch", lambda r: (r.get("batch") or {}).get("ok")),
    ("all promises", "ok", None),
)


def summary(rows):
    """Per launcher: how many programs ran, were not run (a package missing) and each column's
    count right of judged."""
    by = {}
    for r in rows:
        if r.get("launcher") in ("bare", "build"):
            continue
        by.setdefault(r["launcher"], []).append(r)
    out = {}
    for launcher, rs in by.items():
        ran = [r for r in rs if not r.get("skipped")]
        out[launcher] = {"runs": len(ran), "not_run": len(rs) - len(ran),
                         "columns": {title: count(ran, key, get) for title, key, get in COLUMNS}}
        unsure = [r for r in ran if r.get("batch") and r["batch"].get("ok") is None and r["batch"].get("real") is not None]
        out[launcher]["batch_unsure"] = len(unsure)
    return out


def kinds_cell(r):
    cmp_ = r.get("kinds_cmp") or {}
    if not cmp_:
        return "-"
    short = {"parameters_bytes": "p", "gradients_bytes": "g", "optimizer_state_bytes": "o", "activations_bytes": "a"}
    return " ".join(f"{short[k]} {gib(v[0])}/{gib(v[1])}{'' if v[2] else ' ✗'}" for k, v in cmp_.items())


def batch_cell(r):
    """`claim vs real` and the judgement; the real one a range where the bisection left one."""
    b = r.get("batch")
    if not b:
        return "-"
    claim = "none" if b.get("claim") is None else str(b["claim"])
    real, failing = b.get("real"), b.get("failing")
    if real is None:
        said = "?"
    elif failing and failing - 1 > real:
        said = f"{real}–{failing - 1}"
    else:
        said = str(real)
    return f"{claim} vs {said} {yn(b.get('ok')) if b.get('ok') is not None else '?'}"


BROKEN = (
    ("dump_ok", "no dump, or not as many as the case has failures"),
    ("agree", "stderr's line is not the dump's headline and report"),
    ("alloc_mode_ok", "allocator mode off"),
    ("alloc_off_line_ok", "allocator mode off without naming the program's line"),
)


def broken(row):
    """The promises outside the table's columns that a row broke, in words."""
    said = [words for key, words in BROKEN if row.get(key) is False]
    if (row.get("same_request_dumps") or 0) > 1:
        said.append(f"note: {row['same_request_dumps']} dumps for one request (recovered, then raised?)")
    return said


def promises_broken(row):
    """Every promise a scored row broke, in words (for a failed row's detail line)."""
    out = []
    if row.get("output_unchanged") is False:
        out.append("output changed")
    if row.get("verdict_ok") is False:
        out.append(f"verdict {row.get('verdict')}")
    if row.get("dominant_ok") is False:
        out.append(f"dominant {row.get('dominant')} vs {row.get('truth_dominant')}")
    for kind, (got, want, within) in (row.get("kinds_cmp") or {}).items():
        if not within:
            out.append(f"{kind[:-len('_bytes')]} {gib(got)} vs {gib(want)} GiB")
    if row.get("kinds_ok") is False and not row.get("kinds_cmp"):
        out.append(row.get("why") or "no kinds")
    if row.get("line_ok") is False:
        out.append(f"line not named (want {', '.join(row.get('line') or [])})")
    if (row.get("batch") or {}).get("ok") is False:
        out.append(f"batch: {row['batch'].get('why')}")
    return out + broken(row)


def markdown(rows, card, cases=None):
    """The table for docs/: a header with the card, its memory and the date; per launcher the
    counts of each column; then a row per program and launcher. `cases` maps a case name to its
    framework label."""
    cases = cases or {}
    packages = ", ".join(f"{p} {v or 'missing'}" for p, v in (card.get("packages") or {}).items())
    lines = [f"OOM corpus on {card.get('name', '?')} ({gib(card.get('total_bytes'))} GiB), "
             f"torch {card.get('torch', '?')}, {card.get('date', '?')}; {card.get('oomshim', 'oomshim ?')}."
             + (f" Packages: {packages}." if packages else ""), ""]
    s = summary(rows)
    head = ["launcher", "programs run", "not run"] + [t for t, _, _ in COLUMNS]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for launcher, v in s.items():
        cells = [launcher, str(v["runs"]), str(v["not_run"])]
        for title, _, _ in COLUMNS:
            right, judged = v["columns"][title]
            cell = f"{right}/{judged}" if judged else "-"
            if title.startswith("largest batch") and v["batch_unsure"]:
                cell += f" ({v['batch_unsure']} unsure)"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Kinds: GiB in the dump / the program's own count (p parameters, g gradients, o optimizer state, "
              "a activations where measured); batch: oomshim's largest batch vs the real one (a range where the "
              "bisection left one).", ""]
    head = ["program", "framework", "launcher", "output", "verdict", "dominant (dump / truth)", "kinds", "line", "batch",
            "other promises broken, notes"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        if r.get("launcher") in ("bare", "build"):
            continue
        if r.get("skipped"):
            lines.append(f"| {r['case']} | {cases.get(r['case'], '')} | {r['launcher']} | not run: {r['skipped']} missing "
                         "| | | | | | |")
            continue
        dom = "-" if r.get("dominant_ok") is None else f"{r.get('dominant')} / {r.get('truth_dominant')} {yn(r['dominant_ok'])}"
        lines.append(" | ".join([
            f"| {r['case']}", cases.get(r["case"], ""), r["launcher"], yn(r.get("output_unchanged")),
            f"{r.get('verdict')} {yn(r.get('verdict_ok'))}", dom, kinds_cell(r), yn(r.get("line_ok")),
            batch_cell(r), ", ".join(broken(r)) + " |"]))
    return "\n".join(lines) + "\n"


def sidecar_kinds(d, dump_path):
    """Kinds the Python hook wrote beside a dump (oomshim-torch-HOST-PID-<dump>.kinds.json) by
    builds before the allocator's observer call, which `report` merges."""
    import glob

    name = os.path.basename(dump_path)
    for side in glob.glob(os.path.join(d, "oomshim-torch-*.kinds.json")):
        try:
            with open(side) as f:
                s = json.load(f)
        except (OSError, ValueError):
            continue
        if s.get("dump") == name:
            return s.get("kinds")
    return None
