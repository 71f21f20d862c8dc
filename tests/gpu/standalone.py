"""What a GPU check script does when run alone (`python3 tests/gpu/check_X.py OUT_DIR
[--dry-run]`): runs its `main(root, lib, cli, out_dir)` (or, with --dry-run, its
`dry_run(root, out_dir)`, which needs no GPU), prints each row as `[PASS]`, `[FAIL]` or `[INFO]`
(ok None) as it comes and appends it to OUT_DIR/rows.txt. OOMSHIM_GPU_LIB / OOMSHIM_GPU_CLI name
the build, default target/release/... Returns the exit status: 1 when a row failed."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(main, dry_run, default_out):
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    out = args[0] if args else default_out
    os.makedirs(out, exist_ok=True)
    if "--dry-run" in sys.argv:
        results = dry_run(ROOT, out)
    else:
        lib = os.environ.get("OOMSHIM_GPU_LIB") or os.path.join(ROOT, "target/release/liboomshim.so")
        cli = os.environ.get("OOMSHIM_GPU_CLI") or os.path.join(ROOT, "target/release/oomshim")
        results = main(ROOT, lib, cli, out)
    failed = False
    for check, ok, detail in results:
        failed |= ok is False
        line = f"[{'INFO' if ok is None else 'PASS' if ok else 'FAIL'}] {check}: {detail}"
        print(line, flush=True)
        with open(os.path.join(out, "rows.txt"), "a") as f:
            f.write(line + "\n")
    return 1 if failed else 0
