"""The installed wheel, as a PyTorch user gets it: run with the Python of a fresh venv that has
only the wheel installed (.ci/run does), from any directory:

    VENV/bin/python tests/wheel/test_installed.py

SIM_CUDART names the simulated libcudart.so.13 that cargo's build produced (the allocator test
allocates through it); without it that test is skipped. Standard library only. Every step has a
timeout, so a hang fails the run instead of blocking it."""

import ctypes
import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

TIMEOUT = 120
SCRIPTS = sysconfig.get_path("scripts")
PURELIB = sysconfig.get_path("purelib")


def run(cmd, env=None, cwd=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("OOMSHIM_") and k != "LD_PRELOAD"}
    e.update(env or {})
    return subprocess.run(cmd, env=e, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)


def dumps_in(d):
    return sorted(p for p in glob.glob(os.path.join(d, "oomshim-*.json"))
                  if not os.path.basename(p).startswith("oomshim-torch-"))


# A stand-in for torch's pluggable-allocator API (the real one is checked on the GPU machine):
# it opens the library by path and looks the two functions up by name, as torch does.
FAKE_TORCH = r'''
import ctypes, os
__version__ = "0.0-fake"
_cudart = ctypes.CDLL(os.environ["SIM_CUDART"], mode=ctypes.RTLD_GLOBAL)
_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_current = None

class _Raw:
    def __init__(self): self.hooks = {}
    def set_init_fn(self, p): self.hooks["init"] = p
    def set_reset_fn(self, p): self.hooks["reset"] = p

class _Pluggable:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        self.path = path
        lib = ctypes.CDLL(path)
        self.alloc = _ALLOC(ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value)
        self.free = _FREE(ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value)
        self._allocator = _Raw()
    def allocator(self): return self._allocator

class _C:
    pass

class cuda:
    class memory:
        CUDAPluggableAllocator = _Pluggable
        @staticmethod
        def change_current_allocator(a):
            global _current
            _current = a
    @staticmethod
    def is_initialized(): return False
    @staticmethod
    def current_device(): return 0

def _empty(nbytes):
    return _current.alloc(nbytes, 0, None)
'''


class Installed(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="oomshim-wheel-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_the_cli_is_on_path_and_says_the_wheels_version(self):
        cli = shutil.which("oomshim", path=SCRIPTS)
        self.assertIsNotNone(cli, f"no oomshim in {SCRIPTS}")
        version = importlib.metadata.version("oomshim")
        out = run([cli, "--version"])
        self.assertEqual(out.stdout.strip(), f"oomshim {version}", out.stderr)
        out = run([sys.executable, "-m", "oomshim", "--version"])
        self.assertEqual(out.stdout.strip(), f"oomshim {version}", out.stderr)

    def test_the_library_ships_inside_the_package_stripped(self):
        import oomshim.torch

        lib = os.path.join(PURELIB, "oomshim", "liboomshim.so")
        self.assertTrue(os.path.isfile(lib), lib)
        # As built the library is ~30 MB of debug info; the wheel carries it stripped.
        self.assertLess(os.path.getsize(lib), 12 << 20)
        self.assertLess(os.path.getsize(shutil.which("oomshim", path=SCRIPTS)), 12 << 20)
        # Nothing loaded, no OOMSHIM_LIB: oomshim.torch finds the bundled copy.
        os.environ.pop("OOMSHIM_LIB", None)
        self.assertEqual(oomshim.torch.library_path(), lib)
        # The hook is the library's own copy, written out where it runs: the wheel installs no
        # package of it, which every program in the environment could import.
        self.assertFalse(os.path.exists(os.path.join(PURELIB, "oomshim_hook")))
        self.assertFalse(os.path.exists(os.path.join(PURELIB, "_oomshim_hook")))

    def test_the_demo_runs_from_the_installed_cli(self):
        out = run([shutil.which("oomshim", path=SCRIPTS), "demo"], cwd=self.tmp)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        self.assertIn("leak", out.stdout)
        # The snapshot at step 20 and the out-of-memory dump: an installed wheel writes both.
        self.assertEqual(len(dumps_in(os.path.join(self.tmp, "oomshim-dumps"))), 2)

    def test_python_m_oomshim_run_preloads_the_bundled_library(self):
        program = "import oomshim; print(oomshim.loaded(), oomshim.dump('from-wheel'))"
        dumps = os.path.join(self.tmp, "dumps")
        # PATH without the venv: `python -m oomshim` must not depend on it.
        out = run([sys.executable, "-m", "oomshim", "run", "--dir", dumps, "--",
                   sys.executable, "-c", program], env={"PATH": "/usr/bin:/bin"})
        self.assertEqual(out.stdout.strip(), "True True", out.stderr[-2000:])
        files = dumps_in(dumps)
        self.assertEqual(len(files), 1, files)
        with open(files[0]) as f:
            self.assertEqual(json.load(f)["reason"], "from-wheel")

    def test_allocator_mode_uses_the_bundled_library(self):
        sim = os.environ.get("SIM_CUDART")
        if not sim:
            self.skipTest("SIM_CUDART not set")
        fake = os.path.join(self.tmp, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write(FAKE_TORCH)
        program = (
            "import torch, oomshim.torch as ot\n"
            "ot.enable()\n"
            "p = torch._empty(5 << 20)\n"
            "assert p, 'allocation failed'\n"
            "print(torch._current.path, ot.memory_allocated(), ot.fragmentation()['source'])\n"
        )
        out = run([sys.executable, "-c", program],
                  env={"PYTHONPATH": fake, "SIM_CUDART": sim, "OOMSHIM_DIR": self.tmp})
        lib = os.path.join(PURELIB, "oomshim", "liboomshim.so")
        self.assertEqual(out.stdout.split(), [lib, str(5 << 20), "oomshim-allocator"], out.stderr[-2000:])


if __name__ == "__main__":
    # Run from outside the checkout, so `import oomshim` can only be the installed copy.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if os.environ.get("SIM_CUDART"):
        os.environ["SIM_CUDART"] = os.path.abspath(os.environ["SIM_CUDART"])
    os.chdir(tempfile.gettempdir())
    unittest.main(verbosity=2)
