"""The PEP 517 backend of `pip install .` (pyproject.toml: build-backend): maturin's, with one step
before it. maturin packages the one binary it builds, the `oomshim` CLI; liboomshim.so is a
workspace crate's cdylib, so this backend first runs the cargo build the CLI shares with `cargo run`
and `cargo test` (`cargo build --release`: the same features, so an existing build of the clone is
reused and maturin's own cargo call then compiles nothing new), stages the library without its
debug info where pyproject.toml's `include` takes it (shim/python/oomshim/liboomshim.so), lets
maturin build the wheel, and removes the staged copy again (from a checkout, oomshim._locate would
otherwise prefer it to the fresh build in target/).

Honours CARGO (the cargo to run) and CARGO_TARGET_DIR (through cargo itself). Needs binutils'
`strip`, which every C toolchain that can build the tests' simulated CUDA has.

pip shows a backend's output only with -v or on failure, and a first build takes minutes: so
while cargo builds, a line of progress every few seconds (crates compiled of about how many, the
time, what it compiles now) goes to the terminal pip runs in (/dev/tty), and cargo's own output
to stderr as always (pip -v shows it)."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import maturin
from maturin import *  # noqa: F401,F403 (every other hook is maturin's own)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGED = os.path.join(ROOT, "shim", "python", "oomshim", "liboomshim.so")


def _run(cmd):
    # stdout to stderr: a PEP 517 frontend may read the hook's stdout, and maturin's is its answer.
    print("oomshim build: " + " ".join(cmd), file=sys.stderr, flush=True)
    result = subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr)
    if result.returncode != 0:
        raise SystemExit(f"oomshim build: `{' '.join(cmd)}` failed with exit status {result.returncode}")


# Seconds between two progress lines on the terminal.
PROGRESS_EVERY = 5


def _terminal():
    """The terminal pip runs in, for progress lines it does not capture; None without one."""
    try:
        return open("/dev/tty", "w", encoding="utf-8", errors="replace")
    except OSError:
        return None


def _crates_to_build(cargo):
    """About how many crates `cargo build --release` compiles from nothing: the packages of the
    default members' graph without dev-dependencies (from Cargo.lock; nothing is fetched)."""
    try:
        out = subprocess.run([cargo, "tree", "-e", "no-dev", "--prefix", "none", "-f", "{p}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {line.replace(" (*)", "").strip() for line in out.stdout.splitlines() if line.strip()}
    return len(names) or None


def _crates(n):
    return f"{n} crate" if n == 1 else f"{n} crates"


def _minutes(seconds):
    return f"{int(seconds // 60)} m {int(seconds % 60):02d} s" if seconds >= 60 else f"{int(seconds)} s"


def _cargo_build(cargo):
    """`cargo build --release`, its output passed to stderr line by line, and a progress line
    on the terminal every PROGRESS_EVERY seconds while it runs (also while cargo is silent: the
    last crates, the shim and the CLI, take minutes with nothing to say)."""
    import threading

    cmd = [cargo, "build", "--release"]
    print("oomshim build: " + " ".join(cmd), file=sys.stderr, flush=True)
    tty = _terminal()
    total = _crates_to_build(cargo) if tty else None
    start = time.monotonic()
    state = {"compiled": 0, "current": ""}

    def say(text):
        if tty:
            tty.write(f"oomshim build: {text}\n")
            tty.flush()

    def forward(stream):
        # cargo's own lines go to stderr as they come (pip -v shows them); "Compiling NAME"
        # counts a crate.
        for line in stream:
            sys.stderr.write(line)
            words = line.split()
            if len(words) >= 2 and words[0] == "Compiling":
                state["compiled"] += 1
                state["current"] = words[1]

    say("compiling oomshim with cargo (a first build takes minutes; `pip install -v .` shows cargo's own output)")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sys.stderr, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    reader = threading.Thread(target=forward, args=(proc.stderr,), daemon=True)
    reader.start()
    while True:
        try:
            status = proc.wait(timeout=PROGRESS_EVERY)
            break
        except subprocess.TimeoutExpired:
            pass
        if state["compiled"]:
            of = f" of about {total}" if total else ""
            say(f"{_crates(state['compiled'])}{of} compiled, {_minutes(time.monotonic() - start)} "
                f"(now {state['current']})")
    reader.join(timeout=10)
    if status != 0:
        if tty:
            tty.close()
        raise SystemExit(f"oomshim build: `{' '.join(cmd)}` failed with exit status {status}")
    if tty:
        say(f"cargo build done in {_minutes(time.monotonic() - start)} ({_crates(state['compiled'])} "
            "compiled); packaging the wheel")
        tty.close()


def rust_version():
    """The oldest Rust the workspace builds with: Cargo.toml's `rust-version`, the one place it
    is written (the README quotes it; tests/docs.rs checks both)."""
    with open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("rust-version = "):
                return line.split("=", 1)[1].strip().strip('"')
    return "(see Cargo.toml)"


def built_library():
    """Builds what `cargo run --release` builds (the CLI and liboomshim.so, every workspace crate
    with the same features) and returns the library's path under cargo's target directory."""
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which(cargo) is None:
        raise SystemExit(
            f"oomshim build: cargo was not found; building oomshim needs Rust {rust_version()} or "
            "newer (rustup.rs) and a C and a C++ compiler")
    _cargo_build(cargo)
    meta = subprocess.run([cargo, "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT,
                          stdout=subprocess.PIPE, check=True)
    lib = os.path.join(json.loads(meta.stdout)["target_directory"], "release", "liboomshim.so")
    if not os.path.isfile(lib):
        raise SystemExit(f"oomshim build: cargo build --release left no {lib}")
    return lib


@contextlib.contextmanager
def staged_library():
    """liboomshim.so, without its debug info, at STAGED while the block runs."""
    lib = built_library()
    strip = shutil.which("strip")
    if strip is None:
        raise SystemExit("oomshim build: binutils' strip was not found (it drops the library's "
                         "30 MB of debug info)")
    try:
        _run([strip, "--strip-debug", "-o", STAGED, lib])
        yield STAGED
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(STAGED)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with staged_library():
        return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


if __name__ == "__main__":
    # scripts/build-wheel: `python3 scripts/pep517/oomshim_build.py COMMAND...` runs COMMAND (its
    # `maturin build`) with the library staged, and exits with its status.
    with staged_library():
        sys.exit(subprocess.run(sys.argv[1:], cwd=ROOT).returncode)
