"""`python -m oomshim ARGS`: the oomshim CLI (`python -m oomshim run -- python train.py`), with the
library shipped in this package, so it works wherever the wheel is installed, PATH or not."""

import os
import sys

from . import _locate


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cli = _locate.cli_path()
    except FileNotFoundError as e:
        sys.stderr.write(f"oomshim: error: {e}\n")
        return 127
    env = dict(os.environ)
    bundled = _locate.bundled_library()
    if bundled and not env.get("OOMSHIM_LIB"):
        # The CLI finds the wheel's library on its own from its scripts directory; naming it
        # keeps that true for installs whose scripts live elsewhere (pip --target, --prefix).
        env["OOMSHIM_LIB"] = bundled
    os.execve(cli, [cli] + list(argv), env)


if __name__ == "__main__":
    sys.exit(main())
