"""Compares the memory by kind in each zoo dump (`framework.kinds`) with the truth the program
computed itself (`oomshim-kinds-truth: {json}` on its stderr, printed by _zoo.kinds_truth after
it caught the OutOfMemoryError), and prints a table.

    python3 tests/gpu/zoo/check_kinds.py RUNS [--json OUT.jsonl]

RUNS is run_zoo.py's run folder (OUT/runs, or ZOO_WORK): RUNS/<case>/<launcher>/ holds the
dumps and stderr.txt of each run. Only runs whose stderr has a truth line are checked (the
corpus). Per run, as run_zoo.py scores it (scoring.py): parameters, gradients and optimizer
state each within 5% of the program's count (or within 64 MiB, for counts near zero),
activations too where the run measured them, and the dominant kind the program's; plus the
verdict's headline and first advice, for the closing note. The dump scored is the one of the
failure the truth describes (not a later probe's). Exit status 1 when a checked run fails.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scoring  # noqa: E402
from run_zoo import dumps_in  # noqa: E402


def read(d, name):
    try:
        with open(os.path.join(d, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def check(d, case, launcher, bare_truth=None):
    err = read(d, "stderr.txt")
    truth = scoring.kinds_truth(err)
    if truth is None or launcher == "bare":
        return None  # no account, or no shim and no dump: the bare run is the output's reference
    row = {"case": case, "launcher": launcher, "truth": truth}
    if "dominant" not in truth:
        # A program that does not die of an OOM (growth killed): only the post-mortem's verdict.
        pm = [x for _, x in scoring.load_dumps(dumps_in(d))]
        last = pm[-1] if pm else {}
        row.update(ok=None, verdict=(last.get("verdict") or {}).get("kind"),
                   headline=((last.get("verdict") or {}).get("findings") or [{}])[0].get("headline", "")[:200])
        return row
    stood = scoring.stood(scoring.load_dumps(dumps_in(d)))
    if not stood:
        row.update(ok=False, why="no dump of a failure that stood")
        return row
    path, dump = stood[scoring.scored_index(stood, truth)]
    top = (dump["verdict"].get("findings") or [{}])[0]
    row["verdict"] = dump["verdict"]["kind"]
    row["headline"] = top.get("headline", "")[:240]
    row["advice"] = (dump["verdict"].get("suggestions") or [""])[0][:240]
    k = scoring.kinds_of(dump)
    if not k:
        k = scoring.sidecar_kinds(d, path)
        row["kinds_from"] = "sidecar" if k else None
    if not k:
        row.update(ok=False, why="no kinds in the dump or beside it")
        return row
    row["kinds"] = {x: k.get(x) for x in scoring.KINDS + ("activations_bytes", "cache_bytes")}
    # The stderr line says what the dump's headline says (the kinds reached the dump before it was
    # judged, in every launcher, allocator mode included).
    row["stderr_has_headline"] = bool(top.get("headline")) and top["headline"][:120] in err
    row["phase"] = k.get("phase")
    row["module"] = (k.get("module") or {}).get("path")
    row["batch"] = k.get("batch")
    cmp_ = scoring.compare_kinds(k, truth)
    want = scoring.truth_dominant(truth, bare_truth)
    row["dominant"] = scoring.dominant(k)
    ok_dominant = row["dominant"] == want
    bad = [x for x, v in cmp_.items() if not v[2]]
    row["ok"] = not bad and ok_dominant
    if not row["ok"]:
        row["why"] = ", ".join([f"{x} {scoring.gib(cmp_[x][0])} vs {scoring.gib(cmp_[x][1])} GiB" for x in bad]
                               + ([] if ok_dominant else [f"dominant {row['dominant']} vs {want}"]))
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
        bare_truth = scoring.kinds_truth(read(os.path.join(cdir, "bare"), "stderr.txt"))
        for launcher in sorted(os.listdir(cdir)):
            d = os.path.join(cdir, launcher)
            if os.path.isdir(d):
                r = check(d, case, launcher, bare_truth)
                if r:
                    rows.append(r)
                    if out:
                        out.write(json.dumps(r) + "\n")
    gib = scoring.gib
    print(f"{'case':30} {'launcher':8} {'ok':4} {'params':>7} {'grads':>7} {'optim':>7} {'activ':>7}   "
          f"{'truth p/g/o (GiB)':20} {'dominant':16} phase/module/batch")
    failed = 0
    for r in rows:
        k = r.get("kinds") or {}
        t = r["truth"]
        ok = {True: "yes", False: "NO", None: "-"}[r.get("ok")]
        failed += r.get("ok") is False
        print(f"{r['case']:30} {r['launcher']:8} {ok:4} {gib(k.get('parameters_bytes')):>7} "
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
