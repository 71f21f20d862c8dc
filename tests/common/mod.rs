//! Shared by the integration tests that run programs under the shim.

#![allow(dead_code, reason = "each test binary uses its own subset")]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The one policy for a test that needs what a machine may lack (a tool on `PATH`, root, a kernel
/// feature): call [`skip`] (or [`require`]) and return.
///
/// - On a developer machine the test stops there and says so with a line
///   `SKIPPED: <test> needs <what>`, written to the process's stderr handle directly: `cargo test`
///   captures only `print!`/`eprint!`, so this line shows in the run's output without
///   `--nocapture`. libtest has no way to mark a test ignored once it runs, so it still counts as
///   passed; the line is the visible part.
/// - With `CI` set (`.ci/run` sets it and installs every tool the tests use) a missing tool is a
///   broken install: the test fails. Only what `.ci/run` itself could not install and said so
///   (`OOMSHIM_TEST_MAY_LACK`, comma-separated names) is skipped there too.
///
/// [`skip_unless_machine_allows`] is the other kind: what no install step can provide (a writable
/// cgroup, permission to mount). Those skip visibly everywhere, CI included.
pub fn skip(what: &str) {
    let test = current_test();
    let allowed = std::env::var("OOMSHIM_TEST_MAY_LACK")
        .is_ok_and(|list| list.split(',').any(|n| !n.is_empty() && n.trim() == what));
    if in_ci() && !allowed {
        panic!(
            "{test} needs {what}, which is missing; CI must have it (.ci/run installs every tool \
             the tests use; OOMSHIM_TEST_MAY_LACK names the ones it could not)"
        );
    }
    say_skipped(&test, what);
}

/// A skip that no install step can prevent (a machine's privileges or kernel): visible, and
/// allowed under `CI` too. See [`skip`].
pub fn skip_unless_machine_allows(what: &str) {
    say_skipped(&current_test(), what);
}

/// True when `tool` can be run from `PATH` (or is an executable path); otherwise [`skip`]s with
/// its name and returns false, so a test reads `if !common::require("nm") { return; }`.
pub fn require(tool: &str) -> bool {
    if on_path(tool) {
        true
    } else {
        skip(tool);
        false
    }
}

/// Whether `tool` is an executable file on `PATH` (or, with a `/`, at that path).
pub fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if tool.contains('/') {
        return executable(std::path::Path::new(tool));
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(tool))))
}

/// Whether the tests run under CI (`CI` set to anything but empty, `0` or `false`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// libtest names each test's thread after the test.
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("a test")
        .to_string()
}

fn say_skipped(test: &str, what: &str) {
    use std::io::Write;
    // The handle, not eprintln!: libtest's capture would hide the line of a passing test.
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED: {test} needs {what}");
}

/// `liboomshim.so` of the profile under test, built (or brought up to date) first: `cargo test`
/// compiles the library only as an rlib for the tests, never the cdylib users preload, so a
/// stale or missing .so would otherwise be tested.
pub fn shim_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_oomshim"));
        let profile_dir = exe.parent().expect("target/<profile>").to_path_buf();
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(name) => name.to_string(),
        };
        // The CLI's package is selected too: cargo then resolves the features `cargo run` and
        // `cargo test` do and reuses their build (the library's package alone resolves serde's
        // derive without clap's `syn/full`: a second build of serde and of every crate above it,
        // minutes of a 2-core machine).
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "oomshim",
                "-p",
                "oomshim-preload",
                "--lib",
                "--quiet",
                "--profile",
                &profile,
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo to build liboomshim.so");
        assert!(status.success(), "building liboomshim.so failed");
        let lib = profile_dir.join("liboomshim.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
    .clone()
}

/// Runs `cmd` to completion under a watchdog: a hang (a deadlock in the shim, say) fails the test
/// instead of blocking the suite. The program's end is waited for, not polled (a poll every 20 ms
/// cost each of the suite's hundreds of programs 10 ms on average), and its pipes are
/// read while it runs, so a program that writes more than a pipe holds cannot stall on them.
pub fn wait_with_watchdog(mut cmd: Command, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = cmd.spawn().expect("spawn client");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    // The watchdog kills only a child not yet reaped (`done` is sent once it has ended, before
    // it is reaped below), so the pid cannot belong to another process by then.
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(limit) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            // SAFETY: kill(2) with a pid and a signal number; the child is not reaped yet (see
            // above), so the pid is still its own.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return true;
        }
        false
    });
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    // Waits for the end without reaping it (WNOWAIT).
    loop {
        // SAFETY: siginfo_t is plain integers and unions of them: all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid(2) with a valid out-parameter that lives across the call.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    let _ = done.send(());
    let fired = watchdog.join().unwrap();
    let status = child.wait().unwrap();
    assert!(
        !fired,
        "watchdog: {:?} still running after {limit:?} (deadlock?)",
        cmd.get_program()
    );
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Runs a simulated-CUDA test client (with or without the shim) under the watchdog, with a short
/// settle window so OOM dumps are written promptly.
pub fn run_client(name: &str, args: &[&str], env: &[(&str, &str)], with_shim: bool) -> Output {
    let mut cmd = Command::new(oomshim_cli::testbed::client(name));
    cmd.args(args)
        .env_remove("LD_PRELOAD")
        .env("OOMSHIM_SETTLE", "0.2s")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if with_shim {
        cmd.env("LD_PRELOAD", shim_lib());
    }
    wait_with_watchdog(cmd, Duration::from_secs(120))
}

/// The simulated NVML (tests/sim/nvml_sim.c) built as `libnvidia-ml.so.1` in `dir`: built at
/// test time, not by build.rs, so only the tests that put it on `LD_LIBRARY_PATH` see an NVML.
pub fn build_fake_nvml(dir: &std::path::Path) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sim/nvml_sim.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(cc)
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
        ])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(&src)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "building the simulated NVML failed");
}

/// A tiny C library for Python test programs (`libsimcall.so`), linked against the simulated
/// `libcudart.so.13` so its `cudaMalloc` goes through the PLT and the shim sees it
/// (`ctypes.CDLL(cudart).cudaMalloc` would bypass `LD_PRELOAD`). ctypes releases the GIL around
/// the call, as PyTorch does around an op.
const SIMCALL_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <time.h>

extern int cudaMalloc(void **p, size_t n);
extern int cudaFree(void *p);

void *simcall_alloc(size_t n) {
    void *p = 0;
    if (cudaMalloc(&p, n) != 0) return 0;
    return p;
}

int simcall_free(void *p) { return cudaFree(p); }

int simcall_dump(const char *reason) {
    int (*f)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    return f ? f(reason) : -2;
}

/* A thread with no Python state, named like a torch autograd thread. */
struct job { size_t n; void *p; };
static void *native_thread_main(void *arg) {
    struct job *j = arg;
    pthread_setname_np(pthread_self(), "autograd_0");
    j->p = simcall_alloc(j->n);
    return 0;
}
void *simcall_alloc_in_native_thread(size_t n) {
    pthread_t t;
    struct job j = { n, 0 };
    if (pthread_create(&t, 0, native_thread_main, &j) != 0) return 0;
    pthread_join(t, 0);
    return j.p;
}

/* n cudaMalloc + cudaFree pairs of `bytes` from a new thread that has a Python thread state and
   no Python frame while it allocates, as torch's autograd threads do (the state made by
   PyGILState_Ensure, then the GIL released). 0 when done; -1 without the Python C API in the
   process. Call it through ctypes.CDLL, which releases the caller's GIL. */
struct state_job { long n; size_t bytes; int rc; };
static void *python_state_thread_main(void *arg) {
    struct state_job *j = arg;
    int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void (*release)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
    void *(*save)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    void (*restore)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
    if (!ensure || !release || !save || !restore) { j->rc = -1; return 0; }
    int gil = ensure();
    void *state = save();
    for (long i = 0; i < j->n; i++) {
        void *p = 0;
        if (cudaMalloc(&p, j->bytes) == 0) cudaFree(p);
    }
    restore(state);
    release(gil);
    j->rc = 0;
    return 0;
}
int simcall_pairs_in_python_state_thread(long n, size_t bytes) {
    pthread_t t;
    struct state_job j = { n, bytes, -1 };
    if (pthread_create(&t, 0, python_state_thread_main, &j) != 0) return -1;
    pthread_join(t, 0);
    return j.rc;
}

/* Mean nanoseconds of one cudaMalloc + cudaFree pair, n pairs. */
double simcall_pairs_ns(long n, size_t bytes) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        void *p = 0;
        if (cudaMalloc(&p, bytes) == 0) cudaFree(p);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
}
"#;

/// Builds libsimcall.so into `dir`; None without a C compiler (after [`skip`]).
pub fn build_simcall(dir: &std::path::Path) -> Option<PathBuf> {
    build_sim_library(dir, "simcall", SIMCALL_C, "libcudart.so.13")
}

/// Builds `lib{name}.so` from the C `source` into `dir`, linked to the simulated `runtime`
/// (`libcudart.so.13` or `libcuda.so.1`) of the testbed; None without a C compiler (after
/// [`skip`]).
pub fn build_sim_library(
    dir: &std::path::Path,
    name: &str,
    source: &str,
    runtime: &str,
) -> Option<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let lib = dir.join(format!("lib{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args([
            "-O2",
            "-g",
            "-fno-optimize-sibling-calls",
            "-shared",
            "-fPIC",
            "-o",
        ])
        .arg(&lib)
        .arg(&src)
        .arg("-L")
        .arg(oomshim_cli::testbed::artifact_dir())
        .arg(format!("-l:{runtime}"))
        .arg(format!(
            "-Wl,-rpath,{}",
            oomshim_cli::testbed::artifact_dir().display()
        ))
        .args(["-ldl", "-lpthread"])
        .output();
    match out {
        Ok(o) if o.status.success() => Some(lib),
        Ok(o) => panic!(
            "compiling lib{name}.so failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            skip(&format!("a C compiler ({cc}: {e})"));
            None
        }
    }
}

/// torch's global step hooks, as a stand-in package's submodules (`torch.optim.optimizer`,
/// `torch.nn.modules.module`): they keep the hooks registered, like torch's, so a test program
/// can run "optimizer steps" and "forward passes" (`torch.optim.optimizer._fake_step()`,
/// `torch.nn.modules.module.Module`) and oomshim's Python hook marks them.
pub fn write_fake_torch_step_hooks(torch_dir: &std::path::Path) {
    let files: &[(&str, &str)] = &[
        ("optim/__init__.py", "from . import optimizer\n"),
        (
            "optim/optimizer.py",
            r#"
_post_hooks = []

def register_optimizer_step_post_hook(hook):
    _post_hooks.append(hook)

def _fake_step(optimizer=None):
    for h in list(_post_hooks):
        h(optimizer, (), {})
"#,
        ),
        ("nn/__init__.py", "from . import modules\n"),
        ("nn/modules/__init__.py", "from . import module\n"),
        (
            "nn/modules/module.py",
            r#"
_pre = {}
_post = {}
_next = [0]

class _Handle:
    def __init__(self, table, key):
        self.table, self.key = table, key
    def remove(self):
        self.table.pop(self.key, None)

def register_module_forward_pre_hook(hook):
    _next[0] += 1
    _pre[_next[0]] = hook
    return _Handle(_pre, _next[0])

def register_module_forward_hook(hook, *, always_call=False):
    _next[0] += 1
    _post[_next[0]] = hook
    return _Handle(_post, _next[0])

class Module:
    """Calls its children's forward inside its own, running global and own hooks as torch's
    Module.__call__ does."""
    def __init__(self, children=(), params=1):
        self.children = list(children)
        self._params = [object()] * params
        self._hooks = []
    def parameters(self):
        return iter(self._params)
    def register_forward_hook(self, hook):
        self._hooks.append(hook)
    def forward(self, x):
        for c in self.children:
            x = c(x)
        return x
    def __call__(self, x):
        for h in list(_pre.values()):
            h(self, (x,))
        out = self.forward(x)
        for h in list(_post.values()):
            h(self, (x,), out)
        for h in self._hooks:
            h(self, (x,), out)
        return out
"#,
        ),
    ];
    for (name, text) in files {
        let path = torch_dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

/// Where the Python-package tests (tests/torch_package.rs, tests/torch_hook.rs) get Python, the
/// CLI, the `oomshim` package and the library: this repository (`python3`, the CLI cargo built,
/// `shim/python` on `PYTHONPATH`, the cargo-built library), or with `OOMSHIM_TEST_VENV=DIR` the
/// wheel installed in that venv (its `bin/python`, its `bin/oomshim`, the installed package and
/// its bundled library; `.ci/run` runs them both ways).
pub struct PythonSide {
    pub python: PathBuf,
    pub cli: PathBuf,
    /// The package's directory for `PYTHONPATH`; None when it is installed.
    pub package: Option<PathBuf>,
    /// The library the package uses: the wheel's bundled copy, or the cargo-built one.
    pub lib: PathBuf,
    pub installed: bool,
}

pub fn python_side() -> &'static PythonSide {
    static SIDE: OnceLock<PythonSide> = OnceLock::new();
    SIDE.get_or_init(|| match std::env::var_os("OOMSHIM_TEST_VENV") {
        Some(venv) => {
            let venv = PathBuf::from(venv);
            let python = venv.join("bin/python");
            let out = Command::new(&python)
                .args([
                    "-c",
                    "import oomshim._locate as l; print(l.bundled_library() or '')",
                ])
                .current_dir(std::env::temp_dir())
                .env_remove("PYTHONPATH")
                .output()
                .expect("run the venv's python");
            let lib = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            assert!(
                lib.is_file(),
                "OOMSHIM_TEST_VENV={}: no bundled liboomshim.so ({})",
                venv.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            PythonSide {
                python,
                cli: venv.join("bin/oomshim"),
                package: None,
                lib,
                installed: true,
            }
        }
        None => PythonSide {
            python: PathBuf::from("python3"),
            cli: PathBuf::from(env!("CARGO_BIN_EXE_oomshim")),
            package: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shim/python")),
            lib: shim_lib(),
            installed: false,
        },
    })
}

impl PythonSide {
    /// `PYTHONPATH` with the package (when not installed) first, then `extra`.
    pub fn pythonpath(&self, extra: &[&std::path::Path]) -> std::ffi::OsString {
        let dirs: Vec<PathBuf> = self
            .package
            .iter()
            .cloned()
            .chain(extra.iter().map(|p| p.to_path_buf()))
            .collect();
        std::env::join_paths(dirs).expect("PYTHONPATH")
    }
}

/// Waits until a region in `live` has published a summary of marked step `step` or later (up to
/// 60 s, then fails): what a test reads afterwards holds the program's state at that step, on a
/// loaded runner as on an idle one, where a fixed sleep would only usually be long enough.
pub fn wait_for_published_step(live: &std::path::Path, step: u64) {
    use oomshim_core::flight::read::{list_regions, read_region};
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = list_regions(live)
            .iter()
            .filter_map(|r| read_region(&r.path).ok())
            .filter_map(|s| s.summary.dump.growth.filter(|g| g.unit == "step"))
            .map(|g| g.current)
            .max();
        if seen.is_some_and(|s| s >= step) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no summary of step {step} published in {} within 60 s (newest: {seen:?})",
            live.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until process `pid` is stopped (state `T` in /proc/PID/stat) after a SIGSTOP, which
/// the kernel delivers asynchronously (up to 60 s, then fails).
pub fn wait_until_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name's closing parenthesis.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("T") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} not stopped within 60 s (state {state:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A process a test started, killed and reaped however the test ends (a failed assertion
/// included): a program that runs until it is killed never outlives its test.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The CLI under test, with `liboomshim.so` built first (for `run` and `demo`) and without an
/// inherited `LD_PRELOAD` (a test sets one on the command when it means to).
pub fn cli() -> Command {
    shim_lib();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oomshim"));
    cmd.env_remove("LD_PRELOAD");
    cmd
}

/// The shim's dumps in `dir` (`*.json`, not the Python hook's `oomshim-torch-*` side files), in
/// the order they were written: by the sequence number that ends the name (`oomshim-HOST-PID-SEQ`),
/// then by name. None when `dir` does not exist.
pub fn dump_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "json")
                        && !p
                            .file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("oomshim-torch-"))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort_by_key(|p| {
        let seq = p
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.rsplit('-').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        (seq, p.clone())
    });
    files
}

/// Every dump in `dir`, parsed, in the order they were written ([`dump_files`]).
pub fn dumps(dir: &std::path::Path) -> Vec<dump::model::Dump> {
    dump_files(dir)
        .iter()
        .map(|p| dump::read::read_dump(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

/// The one dump in `dir`, parsed; fails unless there is exactly one.
pub fn only_dump(dir: &std::path::Path) -> dump::model::Dump {
    let files = dump_files(dir);
    assert_eq!(
        files.len(),
        1,
        "expected exactly one dump in {}: {files:?}",
        dir.display()
    );
    dump::read::read_dump(&files[0]).unwrap_or_else(|e| panic!("{}: {e}", files[0].display()))
}

/// The verdict `oomshim report --json` gives the dump file: (kind, top finding's headline).
pub fn report_verdict(path: &std::path::Path) -> (String, String) {
    let out = cli().args(["report", "--json"]).arg(path).output().unwrap();
    let (report, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_single_spaced(&v, &path.display().to_string());
    let kind = v["verdict"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The headline of the top finding as judged now (recorded_verdict keeps the stored one).
    let headline = v["verdict"]["findings"][0]["headline"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            v["recorded_verdict"]["findings"][0]["headline"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
    (kind, headline)
}

/// stderr's line for `dump` says its top finding, and `oomshim report` judges it the same.
pub fn agree(line: &str, path: &std::path::Path, dump: &dump::model::Dump) {
    let top = &dump.verdict.findings[0];
    assert!(
        line.ends_with(&format!("{}: {}", top.kind, top.headline)),
        "stderr says\n  {line}\nthe dump says\n  {}: {}",
        top.kind,
        top.headline
    );
    let (kind, headline) = report_verdict(path);
    assert_eq!(kind, dump.verdict.kind, "report vs dump");
    if !headline.is_empty() {
        assert_eq!(headline, top.headline, "report vs dump");
    }
}

/// The keys whose strings are sentences a user reads: the verdict's and each finding's
/// headline, summary, evidence and suggestions, the retry's reason.
const SENTENCE_KEYS: [&str; 5] = ["headline", "summary", "evidence", "suggestions", "reason"];

/// The sentences in `v` (a dump or `oomshim report --json`, anywhere under a key of
/// [`SENTENCE_KEYS`]) with a run of two or more spaces inside them: a format string whose line
/// continuation kept the next line's indentation reads as a hole in the sentence.
pub fn stray_spaces(v: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, sentence: bool, found: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    walk(x, sentence || SENTENCE_KEYS.contains(&k.as_str()), found);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, sentence, found)),
            serde_json::Value::String(s) if sentence && s.trim().contains("  ") => {
                found.push(s.clone())
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(v, false, &mut found);
    found
}

/// Fails, naming `what`, when a sentence of `v` has a run of spaces inside ([`stray_spaces`]).
pub fn assert_single_spaced(v: &serde_json::Value, what: &str) {
    let found = stray_spaces(v);
    assert!(
        found.is_empty(),
        "{what}: sentences with a run of spaces inside: {found:#?}"
    );
}

/// The Python with real torch for the tests that run it (`OOMSHIM_TEST_TORCH_PYTHON`, else
/// `python3`); None, after [`skip`], when it has none.
pub fn torch_python() -> Option<String> {
    let python = std::env::var("OOMSHIM_TEST_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        skip("torch");
        return None;
    }
    Some(python)
}

/// The stdout of a program that must have succeeded; fails, with both its outputs, unless it did.
pub fn succeeded(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
