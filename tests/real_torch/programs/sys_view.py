"""What the program sees of its interpreter after importing torch: sys.path, the modules it can
import and has imported (oomshim's one package `_oomshim_hook` aside, which is the hook), its
environment's PYTHONPATH, the interpreter's hooks, its threads."""
import gc
import os
import sys
import threading
import warnings

import torch

here = os.getcwd()


def short(p):
    return p.replace(here, "<cwd>")


print("path", [short(p) for p in sys.path])
print("PYTHONPATH", os.environ.get("PYTHONPATH", "").replace(here, "<cwd>"))
names = sorted(m for m in sys.modules if not m.startswith("_oomshim_hook") and m != "sitecustomize")
print("modules", len(names), [m for m in names if "oomshim" in m or m in ("kinds", "allocator", "_locate")])
print("torch from", short(os.path.dirname(torch.__file__)).endswith("site-packages/torch"))
print("excepthook default", sys.excepthook is sys.__excepthook__, threading.excepthook is threading.__excepthook__)
print("gc callbacks", len(gc.callbacks), "gc enabled", gc.isenabled(), "thresholds", gc.get_threshold())
print("threads", sorted(t.name for t in threading.enumerate()))
print("warning filters", len(warnings.filters))
print("recursion limit", sys.getrecursionlimit(), "switch interval", sys.getswitchinterval())
print("profile/trace", sys.getprofile(), sys.gettrace())
from torch.nn.modules import module as m
print("global module hooks", len(m._global_forward_pre_hooks), len(m._global_forward_hooks),
      len(m._global_backward_hooks), len(m._global_backward_pre_hooks))
print("imported oomshim", "oomshim" in sys.modules)
try:
    import oomshim  # noqa: F401
    print("import oomshim: yes")
except ImportError:
    print("import oomshim: no")
try:
    import kinds  # noqa: F401
    print("import kinds: yes")
except ImportError:
    print("import kinds: no")
