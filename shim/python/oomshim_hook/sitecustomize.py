"""oomshim's Python hook, started by Python as `sitecustomize`.

liboomshim.so puts this directory first on PYTHONPATH when it is loaded into a Python program
that has not started yet (plain `LD_PRELOAD=liboomshim.so python train.py`), and `oomshim run`
does the same. Everything the hook does is in the package `_oomshim_hook` beside this file (see
its docstring). This file starts it, takes every oomshim hook directory off the program's
`sys.path` again (the program sees the path it would see without the shim, and no name of ours
but `_oomshim_hook` can be imported), and runs the program's own `sitecustomize`, if one exists
further down the path, as Python would have.
"""


def _oomshim_start():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))

    def is_hook_dir(path):
        """This directory, or another oomshim hook directory ($TMPDIR/oomshim-UID/python-hook-*:
        a CLI and a library of different builds each put their own first). Chaining to another
        hook's copy would chain back to this one until Python's recursion limit stops the
        start-up."""
        if path == here:
            return True
        parent, name = os.path.split(path)
        return name.startswith("python-hook-") and os.path.basename(parent).startswith("oomshim-")

    try:
        import _oomshim_hook

        _oomshim_hook._start(here)
    except Exception as e:  # never into the program's start-up
        try:
            sys.stderr.write(f"oomshim: python hook: not installed ({type(e).__name__}: {e})\n")
        except Exception:
            pass
    try:
        kept = [p for p in sys.path if not is_hook_dir(os.path.abspath(p or "."))]
        if len(kept) != len(sys.path):
            for p in sys.path:
                if p not in kept:
                    sys.path_importer_cache.pop(p, None)
            sys.path[:] = kept
        # The path finder itself: `importlib.util.find_spec` would answer from sys.modules (this
        # file), and importlib.machinery is a module the program may not have imported.
        import _frozen_importlib_external

        spec = _frozen_importlib_external.PathFinder.find_spec("sitecustomize", sys.path)
    except Exception:
        spec = None
    if spec is not None and spec.loader is not None:
        import _frozen_importlib

        # Not caught: site.py reports the user's failure as it does without the shim.
        module = _frozen_importlib.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_oomshim_start()
del _oomshim_start
