"""Where liboomshim.so and the oomshim CLI are, for every way oomshim is installed: the wheel
(the library inside this package, the CLI in the environment's scripts directory), a cargo build
of the repository this package sits in (target/release, or target/release/deps where `cargo run`
leaves the library), or anywhere named by OOMSHIM_LIB."""

import os
import shutil
import sysconfig

LIB_NAME = "liboomshim.so"
_HERE = os.path.dirname(os.path.abspath(__file__))
# shim/python/oomshim -> the repository root, when this package is used from a checkout.
_REPO = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))


def bundled_library():
    """The liboomshim.so shipped inside this package (by the wheel), or None."""
    path = os.path.join(_HERE, LIB_NAME)
    return path if os.path.isfile(path) else None


def loaded_library():
    """The path of a liboomshim.so already mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(None, 5)
                path = fields[5] if len(fields) == 6 else ""
                if os.path.basename(path) == LIB_NAME and os.path.exists(path):
                    return path
    except OSError:
        pass
    return None


def _newest(paths):
    found = [p for p in paths if os.path.isfile(p)]
    return max(found, key=os.path.getmtime) if found else None


def library_path():
    """liboomshim.so by this rule, first match wins:

    1. the OOMSHIM_LIB environment variable (it must name a file);
    2. the copy already loaded in this process (by `oomshim run` or LD_PRELOAD), so there is only
       ever one copy of the shim's state;
    3. the copy inside this package (the wheel);
    4. the build directory of the repository this package sits in: target/release or
       target/release/deps, the newer of the two.

    Raises FileNotFoundError naming every place it looked."""
    explicit = os.environ.get("OOMSHIM_LIB")
    if explicit:
        if os.path.isfile(explicit):
            return os.path.abspath(explicit)
        raise FileNotFoundError(f"OOMSHIM_LIB={explicit} does not name a file")
    tried = ["OOMSHIM_LIB (unset)"]
    loaded = loaded_library()
    if loaded:
        return loaded
    tried.append("no liboomshim.so loaded in this process")
    bundled = bundled_library()
    if bundled:
        return bundled
    tried.append(os.path.join(_HERE, LIB_NAME))
    build = [os.path.join(_REPO, "target", "release", LIB_NAME),
             os.path.join(_REPO, "target", "release", "deps", LIB_NAME)]
    newest = _newest(build)
    if newest:
        return newest
    tried.extend(build)
    raise FileNotFoundError(
        "liboomshim.so not found; install the oomshim wheel, or set OOMSHIM_LIB=/path/to/liboomshim.so "
        "(build it with `cargo build --release`). Looked at: " + "; ".join(tried)
    )


def cli_path():
    """The oomshim CLI: the one installed beside this package (the wheel's script), else the one
    on PATH, else this repository's target/release/oomshim. Raises FileNotFoundError naming every
    place it looked."""
    tried = []
    scripts = sysconfig.get_path("scripts")
    for candidate in (os.path.join(scripts, "oomshim") if scripts else None,
                      os.path.join(_REPO, "target", "release", "oomshim")):
        if candidate is None:
            continue
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
        tried.append(candidate)
    on_path = shutil.which("oomshim")
    if on_path:
        return on_path
    tried.append("oomshim on PATH")
    raise FileNotFoundError("the oomshim CLI was not found; install the oomshim wheel. Looked at: "
                            + "; ".join(tried))
