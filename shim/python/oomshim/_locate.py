"""Where liboomshim.so and the oomshim CLI are, for every way oomshim is installed: the wheel
(the library inside this package, the CLI in the environment's scripts directory), a cargo build
of the repository this package sits in (target/release, or target/release/deps where `cargo run`
leaves the library), or anywhere named by OOMSHIM_LIB.

A checkout is trusted only when it proves to be one (`_checkout_root`): this package's copy in
the Python hook's directory ($TMPDIR/oomshim-UID/python-hook-*/oomshim) sits three levels below
$TMPDIR, where anyone can create `target/release/oomshim`, so a file is never run or loaded from
a directory another user could have created or written."""

import os
import shutil
import stat
import sysconfig

LIB_NAME = "liboomshim.so"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _mine(path, kind):
    """`path` itself (no link followed) is of `kind` (stat.S_ISDIR/S_ISREG), owned by this
    user or root, and writable by neither group nor others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return kind(st.st_mode) and st.st_uid in (os.geteuid(), 0) and not st.st_mode & 0o022


def _checkout_root():
    """The repository this package sits in (shim/python/oomshim -> the root), or None unless it
    proves to be oomshim's checkout: not the Python hook's copy, a Cargo.toml naming oomshim at
    the root, and the root, shim/, shim/python, this directory and that file all the user's (or
    root's) and writable by no one else."""
    if os.path.basename(os.path.dirname(_HERE)).startswith("python-hook-"):
        return None
    root = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))
    dirs = [root, os.path.join(root, "shim"), os.path.join(root, "shim", "python"), _HERE]
    cargo = os.path.join(root, "Cargo.toml")
    if not all(_mine(d, stat.S_ISDIR) for d in dirs) or not _mine(cargo, stat.S_ISREG):
        return None
    try:
        with open(cargo, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    return root if '\nname = "oomshim"\n' in text else None


def _build_outputs(*names):
    """Paths below the checkout's target/release, each only when every directory on the way
    and the file itself are trusted (`_mine`); [] outside a proven checkout."""
    root = _checkout_root()
    if root is None:
        return []
    found = []
    for name in names:
        path = os.path.join(root, "target", "release", name)
        parts = os.path.relpath(os.path.dirname(path), root).split(os.sep)
        dirs = [os.path.join(root, *parts[:i + 1]) for i in range(len(parts))]
        if all(_mine(d, stat.S_ISDIR) for d in dirs) and _mine(path, stat.S_ISREG):
            found.append(path)
    return found


def bundled_library():
    """The liboomshim.so shipped inside this package (by the wheel), or None."""
    path = os.path.join(_HERE, LIB_NAME)
    return path if os.path.isfile(path) else None


# Exported by the shim only: the file mapped where it lies is the shim, whatever it is named.
_SHIM_SYMBOL = "oomshim_torch_alloc"


def _shim_symbol_address():
    """The address of the shim's exported allocator function in the process's global scope
    (LD_PRELOAD, `oomshim run`), or None."""
    try:
        import ctypes

        return ctypes.cast(getattr(ctypes.CDLL(None), _SHIM_SYMBOL), ctypes.c_void_p).value
    except (AttributeError, OSError, ImportError):
        return None


def _opens(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return True
    except OSError:
        return False


def loaded_library():
    """The path of the shim already mapped into this process, if any: the file mapped where its
    exported allocator function lies (`oomshim run --lib` and LD_PRELOAD take a library of any
    name: another copy loaded by name would be a second shim with its own state), else a file
    named liboomshim.so (a copy loaded privately, with RTLD_LOCAL).

    A shim removed or replaced on disk since it was loaded (a rebuild while the program runs) is
    named by its mapping's /proc/self/map_files link, which opens that same file: dlopen then
    returns the copy already loaded. Where this process may not open those links (they need
    CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN), FileNotFoundError says so: loading whatever now
    has that name would be a second shim."""
    address = _shim_symbol_address()
    by_name = None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(None, 5)
                path = fields[5] if len(fields) == 6 else ""
                if not path.startswith("/"):
                    continue
                if address is not None:
                    lo, _, hi = fields[0].partition("-")
                    try:
                        mapped_here = int(lo, 16) <= address < int(hi, 16)
                    except ValueError:
                        mapped_here = False
                    if mapped_here and os.path.isfile(path):
                        return path
                    if mapped_here:
                        link = "/proc/self/map_files/" + fields[0]
                        if _opens(link):
                            return link
                        raise FileNotFoundError(
                            f"the oomshim library loaded in this process ({path}) was removed or "
                            "replaced on disk since, and this process may not open its mapping "
                            f"({link}); loading another copy would make a second shim. Restart "
                            "the program to use the new build.")
                if by_name is None and os.path.basename(path) == LIB_NAME and os.path.exists(path):
                    by_name = path
    except OSError:
        pass
    return by_name


def _newest(paths):
    found = [p for p in paths if os.path.isfile(p)]
    return max(found, key=os.path.getmtime) if found else None


def library_path():
    """liboomshim.so by this rule, first match wins:

    1. the OOMSHIM_LIB environment variable (it must name a file);
    2. the copy already loaded in this process (by `oomshim run` or LD_PRELOAD), so there is only
       ever one copy of the shim's state (`loaded_library`: also when its file was replaced since);
    3. the copy inside this package (the wheel);
    4. the build directory of the repository this package sits in: target/release or
       target/release/deps, the newer of the two; only in a checkout that proves to be one,
       from directories no other user can write (`_checkout_root`).

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
    tried.append("no shim loaded in this process")
    bundled = bundled_library()
    if bundled:
        return bundled
    tried.append(os.path.join(_HERE, LIB_NAME))
    newest = _newest(_build_outputs(LIB_NAME, os.path.join("deps", LIB_NAME)))
    if newest:
        return newest
    tried.append("target/release of a trusted oomshim checkout")
    raise FileNotFoundError(
        "liboomshim.so not found; install the oomshim wheel, or set OOMSHIM_LIB=/path/to/liboomshim.so "
        "(build it with `cargo build --release`). Looked at: " + "; ".join(tried)
    )


def cli_path():
    """The oomshim CLI: the one installed beside this package (the wheel's script), else the
    target/release/oomshim of the checkout this package sits in (only a proven one, see
    `_checkout_root`), else the one on PATH. Raises FileNotFoundError naming every place it
    looked."""
    tried = []
    scripts = sysconfig.get_path("scripts")
    build = _build_outputs("oomshim")
    for candidate in ([os.path.join(scripts, "oomshim")] if scripts else []) + build:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
        tried.append(candidate)
    if not build:
        tried.append("target/release of a trusted oomshim checkout")
    on_path = shutil.which("oomshim")
    if on_path:
        return on_path
    tried.append("oomshim on PATH")
    raise FileNotFoundError("the oomshim CLI was not found; install the oomshim wheel. Looked at: "
                            + "; ".join(tried))
