//! Instructions the shim adds to a cudaMalloc + cudaFree pair, counted with valgrind
//! (cachegrind), so the figure is the same on any machine and under any load, unlike time
//! (the goal is at most 1,200 at 32 frames with all stacks). Also the host memory the
//! shim holds per live allocation (resident set, bare against shim, 1,000,000 live) and the
//! peak while a dump runs, also as slopes between 100,000 and 1,000,000 live (what grows with
//! the number of allocations, apart from what a dump costs once).
//!
//! The client, `benches/hook_pairs.c`, is built here with gcc `-O2`, once without frame pointers
//! (as PyTorch's wheels and most C are) and once with them, linked against the simulated
//! runtime that build.rs makes. Each thread's first allocation is made from `main` (a shallow
//! frame), then N pairs from a stack of exactly 4, 32 or 128 return addresses. Each figure is
//! `((shim at N2) - (shim at N1) - ((bare at N2) - (bare at N1))) / (N2 - N1)`: start-up, the
//! shim's first call and the first walk cancel out; what is left is the steady per-pair cost.
//!
//! Python stacks: the instructions recording the Python stack adds to a pair made from Python
//! (`benches/py_pairs.py` through `benches/py_pairs.c`, with 4 and 32 Python frames), the shim
//! with `OOMSHIM_STACKS=python` against `off`, with and without the code watcher (CPython 3.12+:
//! known code objects are not checked again while none is created or destroyed). Needs a
//! `python3.12`/`python3.13` (or a `python3` that is one); said and skipped otherwise.
//!
//! `cargo bench -p oomshim-benches --bench hook_instructions` (or `scripts/count-hook-instructions`, which builds
//! liboomshim.so first). `OOMSHIM_BENCH_LIB=PATH` counts another build of the library beside
//! this one (a baseline), `OOMSHIM_BENCH_SKIP_MEMORY=1` leaves out the memory figures. Without
//! valgrind or gcc it says so and exits 0, but fails when `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Command;

const PAIRS_FEW: u64 = 1_000;
const PAIRS_MANY: u64 = 3_000;
const FRAMES: [u32; 3] = [4, 32, 128];
const GOAL_INSTRUCTIONS: f64 = 1_200.0;
const LIVE: u64 = 1_000_000;
const GOAL_BYTES: f64 = 64.0;

fn profile_dir() -> PathBuf {
    // target/<profile>/deps/hook_instructions-HASH -> target/<profile>
    let exe = std::env::current_exe().expect("own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The newest simulated runtime's directory built by build.rs for this profile.
fn sim_dir() -> PathBuf {
    let build = profile_dir().join("build");
    std::fs::read_dir(&build)
        .expect("target/<profile>/build")
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("out/sim"))
        .filter(|p| p.join("libcudart.so.13").is_file())
        .max_by_key(|p| {
            std::fs::metadata(p.join("libcudart.so.13"))
                .and_then(|m| m.modified())
                .ok()
        })
        .expect("the simulated libcudart.so.13 (cargo build --release first)")
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the client into `dir`, with or without frame pointers.
fn build_client(dir: &Path, frame_pointers: bool) -> PathBuf {
    let (name, frames) = if frame_pointers {
        ("hook_pairs-fp", "-fno-omit-frame-pointer")
    } else {
        ("hook_pairs", "-fomit-frame-pointer")
    };
    gcc_against_sim("hook_pairs.c", &dir.join(name), &["-g", frames, "-ldl"])
}

/// Compiles `benches/SOURCE` with gcc `-O2` and then `flags` into `out`, linked against the simulated
/// runtime (its headers, its libcudart, an rpath to it).
fn gcc_against_sim(source: &str, out: &Path, flags: &[&str]) -> PathBuf {
    // The benches package sits in benches/ of the repository.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository");
    let sim = sim_dir();
    let status = Command::new("gcc")
        .arg("-O2")
        .arg("-I")
        .arg(root.join("tests/sim"))
        .arg("-o")
        .arg(out)
        .arg(root.join("benches").join(source))
        .arg(format!("-L{}", sim.display()))
        .arg("-l:libcudart.so.13")
        .arg(format!("-Wl,-rpath,{}", sim.display()))
        // Last: libraries among them (-ldl) come after the objects that need them.
        .args(flags)
        .status()
        .expect("gcc");
    assert!(status.success(), "building {source} failed");
    out.to_path_buf()
}

/// Instructions the client executed (valgrind's `I refs`), with `shim` preloaded if given.
fn count(client: &Path, shim: Option<&Path>, frames: u32, pairs: u64, dir: &Path) -> u64 {
    let mut cmd = cachegrind();
    cmd.arg(client)
        .args(["pairs", &frames.to_string(), &pairs.to_string()]);
    settings(&mut cmd, shim, frames, dir);
    instructions_of(cmd, &client.display().to_string())
}

/// valgrind counting instructions only: the program and its arguments go after.
fn cachegrind() -> Command {
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
    ]);
    cmd
}

/// Runs `cmd` (from [`cachegrind`]): the instructions `what` executed.
fn instructions_of(mut cmd: Command, what: &str) -> u64 {
    let out = cmd.output().expect("valgrind");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed under valgrind: {err}");
    err.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("I   refs:")?;
            rest.trim().replace(',', "").parse().ok()
        })
        .unwrap_or_else(|| panic!("no instruction count in valgrind's output: {err}"))
}

/// The shim's settings for a run: all stacks (the default), a depth that holds the whole stack,
/// dumps in `dir`, no flight recorder (its publisher thread runs on a timer: not per pair).
fn settings(cmd: &mut Command, shim: Option<&Path>, frames: u32, dir: &Path) {
    cmd.env_remove("LD_PRELOAD")
        .env("OOMSHIM_DIR", dir)
        .env("OOMSHIM_LIVE", "0")
        .env("OOMSHIM_STACKS", "all")
        .env("OOMSHIM_DEPTH", frames.max(64).to_string());
    if let Some(shim) = shim {
        cmd.env("LD_PRELOAD", shim);
    }
}

struct Row {
    frames: u32,
    frame_pointers: bool,
    bare: f64,
    added: f64,
}

fn instructions(libs: &[(String, PathBuf)], dir: &Path) {
    let clients = [
        (false, build_client(dir, false)),
        (true, build_client(dir, true)),
    ];
    for (name, lib) in libs {
        let mut rows = Vec::new();
        for (fp, client) in &clients {
            for frames in FRAMES {
                let per_pair = |shim: Option<&Path>| {
                    let few = count(client, shim, frames, PAIRS_FEW, dir);
                    let many = count(client, shim, frames, PAIRS_MANY, dir);
                    (many as f64 - few as f64) / (PAIRS_MANY - PAIRS_FEW) as f64
                };
                let bare = per_pair(None);
                let shim = per_pair(Some(lib));
                rows.push(Row {
                    frames,
                    frame_pointers: *fp,
                    bare,
                    added: shim - bare,
                });
            }
        }
        println!("\ninstructions added per cudaMalloc+cudaFree pair (512 B), all stacks, {name}");
        println!("  frames  client built         bare pair   added by the shim   goal 1,200");
        for r in &rows {
            let client = if r.frame_pointers {
                "-O2, frame pointers"
            } else {
                "-O2, no frame ptrs "
            };
            let verdict = if r.frames != 32 {
                String::new()
            } else if r.added <= GOAL_INSTRUCTIONS {
                "met".to_string()
            } else {
                format!("missed by {:.0}", r.added - GOAL_INSTRUCTIONS)
            };
            println!(
                "  {:>6}  {client}  {:>9.0}   {:>17.0}   {verdict}",
                r.frames, r.bare, r.added
            );
        }
    }
}

/// A CPython 3.12 or 3.13 (code watchers) on PATH or among pyenv's versions, as its real
/// executable (valgrind cannot follow a launcher script such as pyenv's); None without one.
fn python_with_code_watchers() -> Option<(PathBuf, String)> {
    let mut candidates: Vec<PathBuf> = ["python3.13", "python3.12", "python3"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(Ok(versions)) = pyenv.map(|root| std::fs::read_dir(root.join("versions"))) {
        let mut dirs: Vec<PathBuf> = versions.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        dirs.sort();
        candidates.extend(dirs.into_iter().rev().map(|d| d.join("bin/python3")));
    }
    candidates.iter().find_map(|name| {
        let out = Command::new(name)
            .args([
                "-c",
                "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])",
            ])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut lines = text.lines();
        let (exe, version) = (lines.next()?, lines.next()?);
        let minor: u32 = version.strip_prefix("3.")?.parse().ok()?;
        (out.status.success() && (12..=13).contains(&minor))
            .then(|| (PathBuf::from(exe), version.to_string()))
    })
}

/// libpy_pairs.so in `dir`, linked against the simulated runtime.
fn build_py_pairs(dir: &Path) -> PathBuf {
    gcc_against_sim(
        "py_pairs.c",
        &dir.join("libpy_pairs.so"),
        &["-shared", "-fPIC"],
    )
}

fn python_stacks(libs: &[(String, PathBuf)], dir: &Path) {
    let Some((python, version)) = python_with_code_watchers() else {
        let msg = "hook_instructions: Python stacks SKIPPED: no python3.12 or python3.13 found";
        if ci() {
            panic!("{msg}; CI must have one");
        }
        println!("\n{msg}");
        return;
    };
    let pairs_lib = build_py_pairs(dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py_pairs.py");
    for (name, lib) in libs {
        let count = |stacks: &str, depth: u32, watch: bool, pairs: u64| {
            let mut cmd = cachegrind();
            cmd.arg(&python).arg(&script).arg(&pairs_lib).args([
                pairs.to_string(),
                depth.to_string(),
                if watch { "watch" } else { "nowatch" }.to_string(),
            ]);
            settings(&mut cmd, Some(lib), 64, dir);
            // A fixed hash seed: string hashing is randomised per process otherwise, and the
            // interpreter's own instruction count moves with it.
            cmd.env("OOMSHIM_STACKS", stacks).env("PYTHONHASHSEED", "0");
            instructions_of(cmd, "py_pairs.py")
        };
        let per_pair = |stacks: &str, depth: u32, watch: bool| {
            let few = count(stacks, depth, watch, PAIRS_FEW);
            let many = count(stacks, depth, watch, PAIRS_MANY);
            (many as f64 - few as f64) / (PAIRS_MANY - PAIRS_FEW) as f64
        };
        println!(
            "\ninstructions the Python stack adds per allocation (OOMSHIM_STACKS=python against off), CPython {version}, {name}"
        );
        println!("  Python frames   each code checked every time   code watcher (known codes by address)");
        for depth in [2, 30] {
            let added = |watch| per_pair("python", depth, watch) - per_pair("off", depth, watch);
            let (every, watched) = (added(false), added(true));
            println!(
                "  {:>13}   {every:>28.0}   {watched:>10.0} ({:.2}x fewer)",
                depth + 2,
                every / watched.max(1.0)
            );
        }
    }
}

/// (VmRSS, VmHWM) lines the client printed, in KiB.
fn memory_lines(out: &[u8]) -> Vec<(u64, u64)> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["rss-kib", rss, "hwm-kib", hwm] => Some((rss.parse().ok()?, hwm.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

fn memory(libs: &[(String, PathBuf)], dir: &Path) {
    let client = build_client(dir, false);
    let run = |shim: Option<&Path>, live: u64| {
        let mut cmd = Command::new(&client);
        cmd.args(["live", &live.to_string(), "dump"]);
        settings(&mut cmd, shim, 64, dir);
        let out = cmd.output().expect("the client");
        assert!(
            out.status.success(),
            "hook_pairs live failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = memory_lines(&out.stdout);
        assert!(lines.len() == 2, "hook_pairs live printed {lines:?}");
        lines
    };
    // A tenth as many too: what grows with the number of live allocations (the slope) apart
    // from what a dump costs once whatever their number (symbolisation: ~16 MB).
    let few = LIVE / 10;
    let (bare, bare_few) = (run(None, LIVE), run(None, few));
    for (name, lib) in libs {
        let (shim, shim_few) = (run(Some(lib), LIVE), run(Some(lib), few));
        let per = |shim_kib: u64, bare_kib: u64| {
            (shim_kib as f64 - bare_kib as f64) * 1024.0 / LIVE as f64
        };
        let held = per(shim[0].0, bare[0].0);
        let peak = per(shim[1].1, bare[1].1);
        let slope = |a: u64, b: u64| (a as f64 - b as f64) * 1024.0 / (LIVE - few) as f64;
        let held_slope = slope(shim[0].0, shim_few[0].0) - slope(bare[0].0, bare_few[0].0);
        let peak_slope = slope(shim[1].1, shim_few[1].1) - slope(bare[1].1, bare_few[1].1);
        let fixed_mib = ((shim[1].1 as f64 - shim[0].0 as f64)
            - (bare[1].1 as f64 - bare[0].0 as f64))
            / 1024.0;
        let verdict = if held <= GOAL_BYTES {
            "met".to_string()
        } else {
            format!("missed by {:.0} B", held - GOAL_BYTES)
        };
        println!("\nhost memory per live allocation, {LIVE} live (VmRSS, shim minus bare), {name}");
        println!("  held: {held:.1} B (goal 64: {verdict})");
        println!(
            "  peak while a dump runs (VmHWM): {peak:.1} B, {:.2}x the held figure (goal at most 1.25x)",
            peak / held.max(1.0)
        );
        println!(
            "  per added live allocation ({few} -> {LIVE}): held {held_slope:.1} B, peak {peak_slope:.1} B ({:.2}x); the dump's own peak above held: {fixed_mib:.1} MiB",
            peak_slope / held_slope.max(1.0)
        );
    }
}

fn main() {
    for tool in ["valgrind", "gcc"] {
        if !have(tool) {
            let msg = format!("hook_instructions: SKIPPED: {tool} is missing");
            if ci() {
                panic!("{msg}; CI must have it");
            }
            println!("{msg}");
            return;
        }
    }
    let dir =
        std::env::temp_dir().join(format!("oomshim-hook-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let mut libs = vec![(
        "this build".to_string(),
        profile_dir().join("liboomshim.so"),
    )];
    if let Some(other) = std::env::var_os("OOMSHIM_BENCH_LIB") {
        libs.push((
            format!("OOMSHIM_BENCH_LIB={}", Path::new(&other).display()),
            PathBuf::from(other),
        ));
    }
    for (_, lib) in &libs {
        assert!(
            lib.is_file(),
            "{} is missing (cargo build --release)",
            lib.display()
        );
    }
    instructions(&libs, &dir);
    python_stacks(&libs, &dir);
    if std::env::var_os("OOMSHIM_BENCH_SKIP_MEMORY").is_none() {
        memory(&libs, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
