# pythonpath: own_modules
"""A program whose own modules are named like the files of oomshim's hook (`kinds`, `oomshim`,
`allocator`, `_locate`) and has its own sitecustomize: it imports its own, and its sitecustomize
runs once."""
import os
import sys

import torch  # noqa: F401 (the hook attaches here)
import kinds
import oomshim
import allocator
import _locate

print(kinds.KINDS, oomshim.MINE, allocator.NAME, _locate.NAME)
print("own sitecustomize ran", os.environ.get("OWN_SITECUSTOMIZE_RUNS"), "times")
print("sitecustomize is the program's", getattr(sys.modules.get("sitecustomize"), "__file__", "").endswith("own_modules/sitecustomize.py"))
