//! Python stacks in real interpreters: Python programs call the simulated CUDA runtime through a
//! tiny C library (`libsimcall.so`, compiled here with the system C compiler and linked against
//! the simulated `libcudart.so.13`, so its `cudaMalloc` goes through the PLT and the shim sees
//! it; `ctypes.CDLL(cudart).cudaMalloc` would bypass `LD_PRELOAD`). ctypes releases the GIL
//! around the call, as PyTorch does around an op, so the shim reads the frames of a thread that
//! does not hold the GIL.
//!
//! Every test skips visibly (tests/common `skip`: a failure under `CI`) when `python3` or a C
//! compiler is missing, and fails when no supported version (3.9 to 3.13) is among those found. Versions other than
//! `python3` are found as `python3.X` on `PATH`, under `$PYENV_ROOT/versions` (or
//! `~/.pyenv/versions`), or in `OOMSHIM_TEST_PYTHONS` (colon-separated interpreter paths).

use crate::common;

use common::only_dump;
use dump::model::{Dump, Frame, FrameKind, Holder, StackMerge};
use oomshim_cli::testbed;
use oomshim_host::pystack::MAX_PY_FRAMES;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// liboomshim.so, built up to date first (`cargo test` alone never builds the cdylib).
fn shim_lib() -> PathBuf {
    common::shim_lib()
}

/// libsimcall.so (tests/common): Python's way to the simulated CUDA through the PLT.
fn build_simcall(dir: &Path) -> Option<PathBuf> {
    common::build_simcall(dir)
}

/// A Python interpreter: its executable and (major, minor).
#[derive(Debug, Clone)]
struct Python {
    exe: PathBuf,
    version: (u32, u32),
}

fn probe(exe: &Path) -> Option<Python> {
    let out = Command::new(exe)
        .args([
            "-c",
            "import sys; print(sys.executable); print(sys.version_info[0], sys.version_info[1])",
        ])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let exe = PathBuf::from(lines.next()?.trim());
    let mut v = lines.next()?.split_whitespace();
    let version = (v.next()?.parse().ok()?, v.next()?.parse().ok()?);
    Some(Python { exe, version })
}

/// `python3`, or None (with the reason printed).
fn python3() -> Option<Python> {
    let p = probe(Path::new("python3"));
    if p.is_none() {
        common::skip("python3");
    }
    p
}

/// Every distinct supported interpreter version found (3.9+), one per minor version.
fn all_pythons() -> Vec<Python> {
    let mut candidates: Vec<PathBuf> = vec!["python3".into()];
    for minor in 9..=13 {
        candidates.push(format!("python3.{minor}").into());
    }
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(root) = pyenv {
        if let Ok(rd) = std::fs::read_dir(root.join("versions")) {
            let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            dirs.sort();
            candidates.extend(dirs.into_iter().map(|d| d.join("bin/python3")));
        }
    }
    if let Ok(list) = std::env::var("OOMSHIM_TEST_PYTHONS") {
        candidates.extend(list.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    let mut found: Vec<Python> = Vec::new();
    for c in candidates {
        if let Some(p) = probe(&c) {
            if p.version >= (3, 9) && !found.iter().any(|f| f.version == p.version) {
                found.push(p);
            }
        }
    }
    found.sort_by_key(|p| p.version);
    found
}

/// [`all_pythons`], or None after a visible skip (a failure under `CI`) when none is found.
fn pythons_or_skip() -> Option<Vec<Python>> {
    let pythons = all_pythons();
    if pythons.is_empty() {
        common::skip("python3");
        return None;
    }
    Some(pythons)
}

fn run_python(py: &Python, script: &Path, args: &[&Path], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(&py.exe);
    cmd.arg(script)
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("PYTHONPERFSUPPORT")
        .env("OOMSHIM_SETTLE", "0.2s")
        .env("LD_PRELOAD", shim_lib())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::wait_with_watchdog(cmd, Duration::from_secs(120))
}

/// The line of `script` holding `marker`.
fn line_of(script: &str, marker: &str) -> u32 {
    let hits: Vec<u32> = script
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    assert_eq!(hits.len(), 1, "marker {marker} must be on exactly one line");
    hits[0]
}

fn python_frames(stack: &[Frame]) -> Vec<&Frame> {
    stack
        .iter()
        .filter(|f| f.kind == FrameKind::Python)
        .collect()
}

fn holder(dump: &Dump, bytes: u64) -> &Holder {
    dump.largest_holders
        .iter()
        .find(|h| h.bytes == bytes)
        .unwrap_or_else(|| panic!("no holder of {bytes} bytes in {:#?}", dump.largest_holders))
}

fn describe(stack: &[Frame]) -> String {
    stack
        .iter()
        .map(|f| {
            format!(
                "  [{:?}] {} {}:{}",
                f.kind,
                f.function.as_deref().unwrap_or("?"),
                f.file.as_deref().unwrap_or("?"),
                f.line.map(|l| l.to_string()).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts the innermost Python frame of `h` is `function` at `file_suffix:line`.
fn assert_innermost(h: &Holder, function: &str, file_suffix: &str, line: u32, what: &str) {
    let py = python_frames(&h.stack);
    let top = py
        .first()
        .unwrap_or_else(|| panic!("{what}: no Python frame in\n{}", describe(&h.stack)));
    assert_eq!(
        top.function.as_deref(),
        Some(function),
        "{what}:\n{}",
        describe(&h.stack)
    );
    assert!(
        top.file
            .as_deref()
            .is_some_and(|f| f.ends_with(file_suffix)),
        "{what}: file {:?}\n{}",
        top.file,
        describe(&h.stack)
    );
    assert_eq!(top.line, Some(line), "{what}:\n{}", describe(&h.stack));
}

const SCENARIOS: &str = r#"
import asyncio, ctypes, gc, sys, threading

lib = ctypes.CDLL(sys.argv[1])
lib.simcall_alloc.restype = ctypes.c_void_p
lib.simcall_alloc.argtypes = [ctypes.c_size_t]
lib.simcall_alloc_in_native_thread.restype = ctypes.c_void_p
lib.simcall_alloc_in_native_thread.argtypes = [ctypes.c_size_t]
MIB = 1 << 20
keep = []

def load_weights():
    keep.append(lib.simcall_alloc(100 * MIB))  # L:basic

def train_step():
    load_weights()  # L:caller

def worker():
    keep.append(lib.simcall_alloc(101 * MIB))  # L:thread

def batches():
    for i in range(2):
        yield lib.simcall_alloc((102 + i) * MIB)  # L:generator

async def prefetch():
    await asyncio.sleep(0)
    return lib.simcall_alloc(104 * MIB)  # L:async

def recurse(n):
    if n == 0:
        return lib.simcall_alloc(105 * MIB)  # L:deep
    return recurse(n - 1)

train_step()
t = threading.Thread(target=worker, name="data-worker")
t.start()
t.join()
keep.extend(batches())
keep.append(asyncio.run(prefetch()))
keep.append(recurse(200))
keep.append(lib.simcall_alloc_in_native_thread(107 * MIB))

# From here on, CPython 3.12+: the shim counts code objects created and destroyed (a code
# watcher, as oomshim's hook registers when torch or jax is imported) and knows the code objects
# it checked by their address alone while that count stands. Registered only under the GIL.
released = ctypes.CDLL(None).oomshim_watch_python_code
released.restype = ctypes.c_int
print("watching without the GIL:", released(), file=sys.stderr)
watch = ctypes.PyDLL(None).oomshim_watch_python_code
watch.restype = ctypes.c_int
print("watching:", watch(), file=sys.stderr)
# A function whose code object is freed before the dump, replaced by many new ones.
src = "def doomed_function():\n    pad = 1\n    return lib.simcall_alloc(106 * MIB)\n"
ns = {"lib": lib, "MIB": MIB}
exec(compile(src, "doomed_module.py", "exec"), ns)
keep.append(ns["doomed_function"]())
doomed_code = id(ns["doomed_function"].__code__)
del ns
gc.collect()
# Same-shaped functions: CPython's allocator tends to put one at the freed code's address.
fresh = []
for i in range(3000):
    fns = {"lib": lib, "MIB": MIB}
    exec(compile("def replacement_%d():\n    pad = 1\n    return lib.simcall_alloc(108 * MIB)\n" % i,
                 "replacement.py", "exec"), fns)
    fresh.append(fns["replacement_%d" % i])
reused = [f for f in fresh if id(f.__code__) == doomed_code]
print("code address reused:", bool(reused), file=sys.stderr)
# The new code (at the old address when reused) allocates too: the shim sees it.
keep.append((reused or fresh)[0]())

assert lib.simcall_dump(b"pystack") == 0
print("ok")
"#;

fn run_scenarios(py: &Python, lib: &Path, dir: &Path) -> Dump {
    let script = dir.join("scenarios.py");
    std::fs::write(&script, SCENARIOS).unwrap();
    let dumps = dir.join("dumps");
    let out = run_python(
        py,
        &script,
        &[lib],
        &[("OOMSHIM_DIR", dumps.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(l) = stderr
        .lines()
        .find(|l| l.starts_with("code address reused"))
    {
        eprintln!("python {:?}: {l}", py.version);
    }
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "python {:?} failed: {:?}\n{stderr}",
        py.version,
        out.status
    );
    // A code watcher counts on 3.12 and 3.13 only, and only registered under the GIL.
    let watches = py.version >= (3, 12);
    assert!(
        stderr.contains("watching without the GIL: 0"),
        "python {:?}:\n{stderr}",
        py.version
    );
    assert!(
        stderr.contains(&format!("watching: {}", u8::from(watches))),
        "python {:?}:\n{stderr}",
        py.version
    );
    only_dump(&dumps)
}

fn check_scenarios(py: &Python, dump: &Dump) {
    let s = SCENARIOS;
    let v = format!("python {}.{}", py.version.0, py.version.1);
    let want_python = format!("CPython {}.{}", py.version.0, py.version.1);
    assert_eq!(dump.recording.stacks, "all");
    assert_eq!(
        dump.recording.python.as_deref(),
        Some(want_python.as_str()),
        "{v}"
    );

    // Function and exact line of the allocating statement, its caller, and native frames that
    // reach the allocation (the C library's function innermost).
    let h = holder(dump, 100 * MIB);
    assert_innermost(h, "load_weights", "scenarios.py", line_of(s, "L:basic"), &v);
    let py_frames = python_frames(&h.stack);
    assert_eq!(py_frames[1].function.as_deref(), Some("train_step"), "{v}");
    assert_eq!(py_frames[1].line, Some(line_of(s, "L:caller")), "{v}");
    assert_eq!(
        py_frames.last().unwrap().function.as_deref(),
        Some("<module>"),
        "{v}"
    );
    assert_eq!(
        h.stack.first().and_then(|f| f.function.as_deref()),
        Some("simcall_alloc"),
        "{v}: innermost native frame\n{}",
        describe(&h.stack)
    );
    assert_eq!(
        h.stack_merge,
        Some(StackMerge::EvalFrames),
        "{v}\n{}",
        describe(&h.stack)
    );
    assert!(
        !h.stack
            .iter()
            .any(|f| f.function.as_deref() == Some("_PyEval_EvalFrameDefault")),
        "{v}: eval frames are replaced by Python frames\n{}",
        describe(&h.stack)
    );

    // A Python thread.
    let h = holder(dump, 101 * MIB);
    assert_innermost(h, "worker", "scenarios.py", line_of(s, "L:thread"), &v);
    assert!(h.thread_name.is_some(), "{v}: thread name");

    // A generator (both allocations, each at the yield line) and a coroutine.
    for mib in [102, 103] {
        let h = holder(dump, mib * MIB);
        assert_innermost(h, "batches", "scenarios.py", line_of(s, "L:generator"), &v);
    }
    let h = holder(dump, 104 * MIB);
    assert_innermost(h, "prefetch", "scenarios.py", line_of(s, "L:async"), &v);

    // Deep recursion: bounded, innermost frames kept.
    let h = holder(dump, 105 * MIB);
    assert_innermost(h, "recurse", "scenarios.py", line_of(s, "L:deep"), &v);
    let n = python_frames(&h.stack).len();
    assert!((100..=MAX_PY_FRAMES).contains(&n), "{v}: {n} Python frames");

    // A code object freed and replaced before the dump keeps its own names and line.
    let h = holder(dump, 106 * MIB);
    assert_innermost(h, "doomed_function", "doomed_module.py", 3, &v);
    let names: Vec<&str> = h
        .stack
        .iter()
        .filter_map(|f| f.function.as_deref())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("replacement_")),
        "{v}: a new code object's name on an old allocation:\n{}",
        describe(&h.stack)
    );
    // ... and the new code object, at the same address or not, is named as itself.
    let h = holder(dump, 108 * MIB);
    let top = python_frames(&h.stack)[0];
    assert!(
        top.function
            .as_deref()
            .is_some_and(|f| f.starts_with("replacement_"))
            && top.file.as_deref() == Some("replacement.py")
            && top.line == Some(3),
        "{v}:\n{}",
        describe(&h.stack)
    );

    // A thread without Python: native stack and its name, no Python frames.
    let h = holder(dump, 107 * MIB);
    assert!(
        python_frames(&h.stack).is_empty(),
        "{v}\n{}",
        describe(&h.stack)
    );
    assert_eq!(h.stack_merge, None);
    assert_eq!(h.thread_name.as_deref(), Some("autograd_0"), "{v}");
    assert!(
        h.stack
            .iter()
            .any(|f| f.function.as_deref() == Some("native_thread_main")),
        "{v}\n{}",
        describe(&h.stack)
    );
}

#[test]
fn python_frames_name_the_allocating_function_and_line() {
    let Some(py) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_simcall(dir.path()) else {
        return;
    };
    let dump = run_scenarios(&py, &lib, dir.path());
    check_scenarios(&py, &dump);

    // Reports and the verdict name sites by their innermost Python frame.
    let text =
        oomshim_cli::report::render_terminal(&dump, &oomshim_cli::report::ReportOptions::default());
    assert!(text.contains("load_weights ("), "report:\n{text}");
}

#[test]
fn every_supported_python_version_found_is_read() {
    let Some(pythons) = pythons_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_simcall(dir.path()) else {
        return;
    };
    let mut checked = Vec::new();
    for py in &pythons {
        if py.version > (3, 13) {
            eprintln!(
                "python {:?}: not supported by oomshim's reader, skipped",
                py.version
            );
            continue;
        }
        eprintln!("checking python {:?} at {}", py.version, py.exe.display());
        let sub = dir
            .path()
            .join(format!("py{}{}", py.version.0, py.version.1));
        std::fs::create_dir_all(&sub).unwrap();
        let dump = run_scenarios(py, &lib, &sub);
        check_scenarios(py, &dump);
        checked.push(py.version);
    }
    assert!(
        !checked.is_empty(),
        "no supported Python (3.9 to 3.13) among those found: {:?}",
        pythons.iter().map(|p| p.version).collect::<Vec<_>>()
    );
    eprintln!("python versions checked: {checked:?}");
}

const OOM_SCRIPT: &str = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.simcall_alloc.restype = ctypes.c_void_p
lib.simcall_alloc.argtypes = [ctypes.c_size_t]
held = []

def grow_cache():
    while True:
        p = lib.simcall_alloc(256 << 20)  # L:oom
        if not p:
            return
        held.append(p)

grow_cache()
print("ok")
"#;

#[test]
fn oom_summary_and_modes_name_the_python_line() {
    let Some(py) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_simcall(dir.path()) else {
        return;
    };
    let script = dir.path().join("oom.py");
    std::fs::write(&script, OOM_SCRIPT).unwrap();
    let line = line_of(OOM_SCRIPT, "L:oom");
    for mode in ["all", "python", "native"] {
        let dumps = dir.path().join(format!("dumps-{mode}"));
        let out = run_python(
            &py,
            &script,
            &[&lib],
            &[
                ("OOMSHIM_DIR", dumps.to_str().unwrap()),
                ("OOMSHIM_STACKS", mode),
                ("SIMCUDA_CAPACITY", "2GiB"),
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode}: {stderr}");
        let dump = only_dump(&dumps);
        let req = dump.failed_request.as_ref().expect("an OOM dump");
        let h = &dump.largest_holders[0];
        assert_eq!(dump.recording.stacks, mode);
        if mode == "native" {
            assert!(
                python_frames(&h.stack).is_empty(),
                "native mode records no Python frames"
            );
            assert!(python_frames(&req.stack).is_empty());
            assert_eq!(dump.recording.python, None);
            continue;
        }
        for (what, stack) in [("holder", &h.stack), ("failed request", &req.stack)] {
            let top = python_frames(stack);
            assert_eq!(
                top.first().and_then(|f| f.function.as_deref()),
                Some("grow_cache"),
                "{mode} {what}"
            );
            assert_eq!(
                top.first().and_then(|f| f.line),
                Some(line),
                "{mode} {what}"
            );
        }
        let summary = format!("at grow_cache (oom.py:{line})");
        assert!(
            stderr.contains(&summary),
            "{mode}: stderr lacks {summary:?}:\n{stderr}"
        );
        if mode == "python" {
            assert_eq!(h.stack_merge, Some(StackMerge::PythonOnly));
            assert!(h.stack.iter().all(|f| f.kind == FrameKind::Python));
        } else {
            assert_eq!(h.stack_merge, Some(StackMerge::EvalFrames));
        }
    }
}

const COST_SCRIPT: &str = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.simcall_pairs_ns.restype = ctypes.c_double
lib.simcall_pairs_ns.argtypes = [ctypes.c_long, ctypes.c_size_t]

def nest(depth):
    if depth == 0:
        lib.simcall_pairs_ns(20000, 512)  # warm-up
        best = min(lib.simcall_pairs_ns(200000, 512) for _ in range(5))
        print("%.1f" % best)
        return
    nest(depth - 1)

nest(int(sys.argv[2]))
"#;

/// Measures what Python stacks cost per cudaMalloc+cudaFree pair: the pairs run in C (no
/// Python between them) below `depth` Python frames, under each `OOMSHIM_STACKS` mode. Run with
/// `cargo test --release --test all pystack:: -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_python_capture_cost() {
    let Some(py) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_simcall(dir.path()) else {
        return;
    };
    let script = dir.path().join("cost.py");
    std::fs::write(&script, COST_SCRIPT).unwrap();
    for depth in ["10", "50"] {
        for mode in ["off", "native", "python", "all"] {
            let depth_arg = PathBuf::from(depth);
            let out = run_python(
                &py,
                &script,
                &[&lib, &depth_arg],
                &[
                    ("OOMSHIM_STACKS", mode),
                    ("OOMSHIM_DIR", dir.path().join("d").to_str().unwrap()),
                ],
            );
            let ns = String::from_utf8_lossy(&out.stdout).trim().to_string();
            eprintln!(
                "python {:?}, {depth} Python frames, OOMSHIM_STACKS={mode}: {ns} ns per pair",
                py.version
            );
        }
    }
}

const STATE_THREAD: &str = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.simcall_alloc.restype = ctypes.c_void_p
lib.simcall_alloc.argtypes = [ctypes.c_size_t]
lib.simcall_free.argtypes = [ctypes.c_void_p]
lib.simcall_pairs_in_python_state_thread.argtypes = [ctypes.c_long, ctypes.c_size_t]
def allocate_here():
    lib.simcall_free(lib.simcall_alloc(1 << 20))
allocate_here()  # a walk with frames on this thread proves the layout
assert lib.simcall_pairs_in_python_state_thread(int(sys.argv[2]), 1 << 20) == 0
print("ok")
"#;

/// `process_vm_readv` calls the process made, counted by strace (`-c`).
fn kernel_copies(py: &Python, script: &Path, simcall: &Path, pairs: u32, dir: &Path) -> u64 {
    let summary = dir.join(format!("strace-{pairs}.txt"));
    let out = Command::new("strace")
        .args(["-f", "-qq", "-c", "-e", "trace=process_vm_readv", "-o"])
        .arg(&summary)
        .arg("-E")
        .arg(format!("LD_PRELOAD={}", shim_lib().display()))
        .arg(&py.exe)
        .arg(script)
        .arg(simcall)
        .arg(pairs.to_string())
        .env_remove("LD_PRELOAD")
        .env("OOMSHIM_STACKS", "python")
        .env("OOMSHIM_SETTLE", "0")
        .env("OOMSHIM_DIR", dir)
        .stdin(Stdio::null())
        .output()
        .expect("run strace");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "python {:?} under strace: {:?}\n{}",
        py.version,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&summary).unwrap();
    // "% time  seconds  usecs/call  calls  [errors]  syscall": the fourth column.
    text.lines()
        .find(|l| l.trim_end().ends_with("process_vm_readv"))
        .map_or(0, |l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
}

/// Torch's autograd threads have a Python thread state and no Python frame while they allocate.
/// Their walks read nothing but the thread state, and read it directly once a thread with frames
/// proved the layout: not through the kernel (`process_vm_readv`, about 0.5 us a call) at every
/// allocation, as they did when only a walk that found a frame validated a thread. 1,000 more
/// allocations from such a thread may add a handful of kernel copies, not 1,000.
#[test]
fn a_thread_with_python_state_and_no_frame_reads_its_state_directly() {
    if !common::require("strace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(simcall) = build_simcall(dir.path()) else {
        return;
    };
    let script = dir.path().join("state_thread.py");
    std::fs::write(&script, STATE_THREAD).unwrap();
    let Some(pythons) = pythons_or_skip() else {
        return;
    };
    for py in pythons {
        let few = kernel_copies(&py, &script, &simcall, 100, dir.path());
        let many = kernel_copies(&py, &script, &simcall, 1100, dir.path());
        // Each thread's first walk goes through the kernel: none counted means nothing was
        // walked (or strace's summary was not read), and the comparison below would prove nothing.
        assert!(
            few > 0,
            "python {:?}: no kernel copy counted: no Python stack was walked",
            py.version
        );
        assert!(
            many.saturating_sub(few) < 20,
            "python {:?}: {few} kernel copies with 100 allocations from the frameless thread, \
             {many} with 1,100",
            py.version
        );
    }
}

/// A process without Python under the default `all`: native stacks as before, no Python keys.
#[test]
fn a_process_without_python_is_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(testbed::client("leak_until_oom"))
        .env_remove("LD_PRELOAD")
        .env_remove("OOMSHIM_STACKS")
        .env("LD_PRELOAD", shim_lib())
        .env("OOMSHIM_SETTLE", "0")
        .env("SIMCUDA_CAPACITY", "2G")
        .env("OOMSHIM_DIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run leak_until_oom");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = only_dump(dir.path());
    assert_eq!(dump.recording.stacks, "all");
    assert_eq!(dump.recording.python, None);
    assert_eq!(dump.recording.python_merge, None);
    for h in &dump.largest_holders {
        assert!(python_frames(&h.stack).is_empty());
        assert_eq!(h.stack_merge, None);
        assert!(
            h.stack.iter().any(|f| f.function.is_some()),
            "native frames still named"
        );
    }
    let text = std::fs::read_to_string(
        std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    for key in [
        "\"kind\": \"python\"",
        "\"kind\": \"native\"",
        "\"stack_merge\"",
        "\"python_merge\"",
        "\"python\":",
    ] {
        assert!(!text.contains(key), "{key} in a dump without Python");
    }
}

/// Prints, for every code object of a varied module, its line table and the line CPython gives
/// each bytecode offset (`co_lines()`, or `dis.findlinestarts` on 3.9).
const LINE_TABLE_DUMP: &str = r#"
import dis, json, sys
body = ["def f(a, b):", "    total = 0"]
for i in range(40):
    body.append("    for x in range(%d):" % i)
    body.append("        if x % 3 == 0 and a:")
    body.append("            total += (x *")
    body.append("                      b)")
    body.append("        else:")
    body.append("            total -= 1")
    body += [""] * (i * 9)  # gaps of up to 351 lines
body.append("    return [y for y in range(total) if y]")
body.append("class K:")
body.append("    def m(self):")
body.append("        return (lambda q: q +")
body.append("                1)(2)")
code = compile("\n".join(body) + "\n", "gen.py", "exec")
def walk(c):
    yield c
    for k in c.co_consts:
        if hasattr(k, "co_code"):
            yield from walk(k)
out = []
for c in walk(code):
    n = len(c.co_code)
    if sys.version_info >= (3, 10):
        table = c.co_linetable
        lines = [None] * n
        for start, end, line in c.co_lines():
            for o in range(start, min(end, n)):
                lines[o] = line
    else:
        table = c.co_lnotab
        starts = list(dis.findlinestarts(c))
        lines = []
        for o in range(n):
            cur = c.co_firstlineno
            for s, l in starts:
                if s <= o:
                    cur = l
            lines.append(cur)
    out.append({"name": c.co_name, "table": table.hex(), "first": c.co_firstlineno,
                "lines": [[o, lines[o]] for o in range(0, n, 2)]})
print(json.dumps(out))
"#;

#[test]
fn line_tables_decode_like_cpython() {
    use oomshim_host::pystack::{line_for, LineFormat};
    let Some(pythons) = pythons_or_skip() else {
        return;
    };
    let supported: Vec<&Python> = pythons.iter().filter(|p| p.version <= (3, 13)).collect();
    assert!(
        !supported.is_empty(),
        "no supported Python (3.9 to 3.13) among those found: {:?}",
        pythons.iter().map(|p| p.version).collect::<Vec<_>>()
    );
    for py in supported {
        let format = match py.version.1 {
            9 => LineFormat::Lnotab,
            10 => LineFormat::Linetable310,
            _ => LineFormat::Locations,
        };
        let out = Command::new(&py.exe)
            .args(["-c", LINE_TABLE_DUMP])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let codes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut checked = 0;
        for c in codes.as_array().unwrap() {
            let hex = c["table"].as_str().unwrap();
            let table: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let first = c["first"].as_i64().unwrap() as i32;
            for pair in c["lines"].as_array().unwrap() {
                let offset = pair[0].as_u64().unwrap() as u32;
                // Line 0 (3.11+ module `RESUME`) is no line: reported as none.
                let want = pair[1].as_u64().map(|l| l as u32).filter(|&l| l > 0);
                let got = line_for(format, &table, first, offset);
                assert_eq!(
                    got, want,
                    "python {:?}, {} offset {offset}",
                    py.version, c["name"]
                );
                checked += 1;
            }
        }
        eprintln!("python {:?}: {checked} offsets checked", py.version);
        assert!(checked > 500);
    }
}

/// The hook registers the shim's code watcher when the program imports torch, on CPython 3.12
/// and 3.13 (where code watchers exist), and nowhere else; not before the import.
#[test]
fn the_hook_registers_the_code_watcher_when_torch_is_imported_on_3_12_and_later() {
    let Some(pythons) = pythons_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A stand-in torch: the hook attaches to whatever module the program imports as torch (its
    // later steps fail on this one and say so once; the watcher comes first).
    std::fs::create_dir_all(dir.path().join("torch")).unwrap();
    std::fs::write(dir.path().join("torch/__init__.py"), "").unwrap();
    let script = dir.path().join("watch.py");
    std::fs::write(
        &script,
        r#"
import sys

def watcher():
    # The hook module's flag (it is not importable by name: it chains the program's own
    # sitecustomize under that name).
    return [m.__dict__["_code_watcher"] for m in list(sys.modules.values())
            if "_code_watcher" in getattr(m, "__dict__", {})]

print("before", watcher())
import torch
print("after", watcher())
"#,
    )
    .unwrap();
    let fake = dir.path().to_str().unwrap();
    for py in pythons.iter().filter(|p| p.version <= (3, 13)) {
        let out = run_python(py, &script, &[], &[("PYTHONPATH", fake)]);
        let text = String::from_utf8_lossy(&out.stdout);
        let watches = if py.version >= (3, 12) {
            "True"
        } else {
            "False"
        };
        assert!(
            text.contains("before [False]") && text.contains(&format!("after [{watches}]")),
            "python {:?}: {text}\n{}",
            py.version,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
