"""Compares the memory by kind in each zoo dump (`framework.kinds`, issue 23) with the truth the
program computed itself (`oomshim-kinds-truth: {json}` on its stderr, printed by
_zoo.kinds_truth after it caught the OutOfMemoryError), and prints a table.

    python3 tests/gpu/zoo/check_kinds.py RUNS [--json OUT.jsonl]

RUNS is run_zoo.py's run folder (OUT/runs, or ZOO_WORK): RUNS/<case>/<launcher>/ holds the
dumps and stderr.txt of each run. Only cases whose stderr has a truth line are checked (the
`kinds_*` programs). Per run: parameters, gradients and optimizer state each within 5% of the
program's count (or within 64 MiB, for counts near zero), the dominant kind the one the program
declares, and the verdict's headline and first advice, for the closing note. Exit status 1 when a
checked run fails.
"""
import glob
import json
import os
import sys

TOLERANCE = 0.05
SLACK = 64 << 20
KINDS = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes")

# A run's dumps in the order they were written, as the zoo lists them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_zoo import dumps_in  # noqa: E402


def truth_of(d):
    try:
        text = open(os.path.join(d, "stderr.txt"), errors="replace").read()
    except OSError:
        return None
    found = None
    for line in text.splitlines():
        if line.startswith("oomshim-kinds-truth: "):
            try:
                found = json.loads(line.split(": ", 1)[1])
            except ValueError:
                pass
    return found


def close(got, want):
    return abs(got - want) <= max(TOLERANCE * want, SLACK)


def dominant(k):
    pairs = [("parameters", k.get("parameters_bytes", 0)), ("gradients", k.get("gradients_bytes", 0)),
             ("optimizer_state", k.get("optimizer_state_bytes", 0)), ("activations", k.get("activations_bytes") or 0)]
    best = max(pairs, key=lambda p: p[1])
    return best[0] if best[1] > 0 else None


def gib(n):
    return f"{n / (1 << 30):.2f}" if isinstance(n, (int, float)) else "-"


def check(d, case, launcher):
    truth = truth_of(d)
    if truth is None:
        return None
    if launcher == "bare":
        return None  # no shim, no dump: the bare run gives the zoo its reference output only
    row = {"case": case, "launcher": launcher, "truth": truth}
    stood, dump_paths = [], []
    for f in dumps_in(d):
        try:
            dump = json.load(open(f))
        except Exception:
            continue
        req = dump.get("failed_request")
        if req and req.get("recovered") is not True:
            stood.append(dump)
            dump_paths.append(f)
    if "dominant" not in truth:
        # A program that does not die of an OOM (growth killed): only the post-mortem's verdict.
        pm = [json.load(open(f)) for f in dumps_in(d)]
        last = pm[-1] if pm else {}
        row.update(ok=None, verdict=(last.get("verdict") or {}).get("kind"),
                   headline=((last.get("verdict") or {}).get("findings") or [{}])[0].get("headline", "")[:200])
        return row
    if not stood:
        row.update(ok=False, why="no dump of a failure that stood")
        return row
    dump = stood[-1]
    k = (dump.get("framework") or {}).get("kinds")
    top = (dump["verdict"].get("findings") or [{}])[0]
    row["verdict"] = dump["verdict"]["kind"]
    row["headline"] = top.get("headline", "")[:240]
    row["advice"] = (dump["verdict"].get("suggestions") or [""])[0][:240]
    if not k:
        # Dumps of builds before the allocator's observer call: the kinds beside the dump
        # (oomshim-torch-HOST-PID-<dump>.kinds.json), which `report` merges.
        name = os.path.basename(dump_paths[-1])
        for side in glob.glob(os.path.join(d, "oomshim-torch-*.kinds.json")):
            try:
                s = json.load(open(side))
            except Exception:
                continue
            if s.get("dump") == name:
                k = s.get("kinds")
                row["kinds_from"] = os.path.basename(side)
    if not k:
        row.update(ok=False, why="no kinds in the dump or beside it")
        return row
    row["kinds"] = {x: k.get(x) for x in KINDS + ("activations_bytes", "cache_bytes")}
    # The stderr line says what the dump's headline says (the kinds reached the dump before it was
    # judged, in every launcher, allocator mode included).
    try:
        err = open(os.path.join(d, "stderr.txt"), errors="replace").read()
    except OSError:
        err = ""
    row["stderr_has_headline"] = bool(top.get("headline")) and top["headline"][:120] in err
    row["phase"] = k.get("phase")
    row["module"] = (k.get("module") or {}).get("path")
    row["batch"] = k.get("batch")
    bad = [x for x in KINDS if not close(k.get(x) or 0, truth.get(x, 0))]
    row["dominant"] = dominant(k)
    ok_dominant = row["dominant"] == truth["dominant"]
    row["ok"] = not bad and ok_dominant
    if bad or not ok_dominant:
        row["why"] = ", ".join([f"{x} {gib(k.get(x))} vs {gib(truth.get(x))} GiB" for x in bad]
                               + ([] if ok_dominant else [f"dominant {row['dominant']} vs {truth['dominant']}"]))
    return row


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = sys.argv[1]
    out = None
    if "--json" in sys.argv:
        out = open(sys.argv[sys.argv.index("--json") + 1], "w")
    rows = []
    for case in sorted(os.listdir(runs)):
        cdir = os.path.join(runs, case)
        if not os.path.isdir(cdir) or case == "work":
            continue
        for launcher in sorted(os.listdir(cdir)):
            d = os.path.join(cdir, launcher)
            if os.path.isdir(d):
                r = check(d, case, launcher)
                if r:
                    rows.append(r)
                    if out:
                        out.write(json.dumps(r) + "\n")
    print(f"{'case':28} {'launcher':8} {'ok':4} {'params':>7} {'grads':>7} {'optim':>7} {'activ':>7}   "
          f"{'truth p/g/o (GiB)':20} {'dominant':16} phase/module/batch")
    failed = 0
    for r in rows:
        k = r.get("kinds") or {}
        t = r["truth"]
        ok = {True: "yes", False: "NO", None: "-"}[r.get("ok")]
        failed += r.get("ok") is False
        print(f"{r['case']:28} {r['launcher']:8} {ok:4} {gib(k.get('parameters_bytes')):>7} "
              f"{gib(k.get('gradients_bytes')):>7} {gib(k.get('optimizer_state_bytes')):>7} "
              f"{gib(k.get('activations_bytes')):>7}   "
              f"{gib(t.get('parameters_bytes')) + '/' + gib(t.get('gradients_bytes')) + '/' + gib(t.get('optimizer_state_bytes')):20} "
              f"{str(r.get('dominant')):16} {r.get('phase')}/{r.get('module')}/{r.get('batch')}")
        if r.get("why"):
            print(f"    why: {r['why']}")
        if r.get("headline"):
            on_stderr = {True: "", False: " [NOT on stderr]", None: ""}[r.get("stderr_has_headline")]
            print(f"    headline{on_stderr}: {r['headline']}")
        if r.get("advice"):
            print(f"    advice: {r['advice']}")
    print(f"\n{len(rows)} runs checked, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
