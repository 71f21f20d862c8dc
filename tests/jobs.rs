//! The answer reaches the job: real torch's torchrun (`torch.distributed.run`, CPU workers) shows
//! oomshim's headline as its "Root Cause" for a worker that ran out of memory on the simulated
//! device (a C client with `--no-python`, and Python workers with and without `@record`), and
//! for a worker SIGKILLed under `oomshim run`; a worker failing with a plain `ValueError` shows
//! the program's own text only. Kubernetes' termination message, and `oomshim run --exit-code`.

use crate::common;

use common::{cli, run_client, shim_lib};
use dump::model::Dump;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The Python with real torch (`OOMSHIM_TEST_TORCH_PYTHON`, which under CI is a venv of its own,
/// else `python3`): the one that runs torchrun and its Python workers.
fn torch_python() -> String {
    std::env::var("OOMSHIM_TEST_TORCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether a root cause or an error file carries oomshim's words: its `oomshim:` lines or its
/// `"oomshim"` entry. Not the bare name, which a traceback's paths may hold (a venv called
/// `oomshim-ci`).
fn speaks_for_oomshim(text: &str) -> bool {
    text.contains("oomshim:") || text.contains("\"oomshim\"")
}

/// Whether real torch's launcher can run here; skips (and says so) otherwise.
fn torchrun_available() -> bool {
    let ok = Command::new(torch_python())
        .args(["-c", "import torch.distributed.run"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::skip("python3 with torch (torch.distributed.run)");
    }
    ok
}

/// `[oomshim run [flags] --] python3 -m torch.distributed.run --nproc_per_node=N
/// --log-dir LOGS ... PROGRAM`, with `env`, under the watchdog.
fn torchrun(
    shimmed: Option<&[&str]>,
    nproc: u32,
    launcher_args: &[&str],
    program: &[&str],
    env: &[(&str, &str)],
    logs: &Path,
) -> Output {
    let mut cmd = match shimmed {
        Some(flags) => {
            let _ = shim_lib();
            let mut c = cli();
            c.arg("run").args(flags).arg("--");
            c.arg(torch_python());
            c
        }
        None => Command::new(torch_python()),
    };
    cmd.args(["-m", "torch.distributed.run"])
        .arg(format!("--nproc_per_node={nproc}"))
        .arg("--log-dir")
        .arg(logs)
        .args(launcher_args)
        .args(program)
        .env_remove("LD_PRELOAD")
        .env("OOMSHIM_SETTLE", "0.2s")
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::wait_with_watchdog(cmd, Duration::from_secs(180))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// torchrun's "Root Cause (first observed failure)" block, up to its closing rule.
fn root_cause(stderr: &str) -> String {
    let start = stderr
        .find("Root Cause (first observed failure):")
        .unwrap_or_else(|| panic!("no root cause in:\n{stderr}"));
    let rest = &stderr[start..];
    let end = rest.find("\n====").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The error file torchrun gave local rank `rank` (under `--log-dir`).
fn error_file(logs: &Path, rank: u32) -> Option<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![logs.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.ends_with(format!("{rank}/error.json")) {
                found.push(p);
            }
        }
    }
    found.pop()
}

fn oom_dumps(dir: &Path) -> Vec<Dump> {
    common::dumps(dir)
        .into_iter()
        .filter(|d| d.failed_request.is_some() || d.post_mortem.is_some())
        .collect()
}

#[test]
fn a_c_worker_out_of_memory_is_torchruns_root_cause_with_oomshims_headline() {
    if !torchrun_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("dumps");
    let worker = oomshim_cli::testbed::client("rank_worker");
    let worker = worker.to_str().unwrap();
    let env = [
        ("SIM_LEAK_RANK", "1"),
        ("OOMSHIM_DIR", dumps.to_str().unwrap()),
        ("OOMSHIM_TERMINATION_LOG", "off"),
    ];
    // Bare: torchrun knows only the exit code.
    let bare_logs = dir.path().join("bare");
    let bare = torchrun(None, 2, &["--no-python"], &[worker], &env, &bare_logs);
    let bare_cause = root_cause(&text(&bare.stderr));
    assert!(
        bare_cause.contains("rank      : 1 (local_rank: 1)"),
        "{bare_cause}"
    );
    assert!(bare_cause.contains("error_file: <N/A>"), "{bare_cause}");
    assert!(!speaks_for_oomshim(&bare_cause), "{bare_cause}");

    let logs = dir.path().join("logs");
    let o = torchrun(Some(&[]), 2, &["--no-python"], &[worker], &env, &logs);
    assert_eq!(
        o.status.code(),
        bare.status.code(),
        "the launcher's status, unchanged"
    );
    let cause = root_cause(&text(&o.stderr));
    let d = oom_dumps(&dumps);
    assert_eq!(d.len(), 1, "one out-of-memory dump, rank 1's: {d:#?}");
    let d = &d[0];
    assert_eq!(d.process.rank, Some(1));
    assert!(cause.contains("rank      : 1 (local_rank: 1)"), "{cause}");
    assert!(cause.contains("exitcode  : 3"), "{cause}");
    let file = error_file(&logs, 1).expect("rank 1's error file");
    assert!(
        cause.contains(&format!("error_file: {}", file.display())),
        "{cause}"
    );
    // The headline, word for word as the dump has it, the retry hint and the dump.
    assert!(
        cause.contains(&format!(
            "traceback : oomshim: CUDA out of memory on device 0 (cudaMalloc of 256.00 MiB failed): {}: {}",
            d.verdict.kind,
            d.verdict.headline()
        )),
        "{cause}"
    );
    assert!(cause.contains("retry: after_change ("), "{cause}");
    assert!(
        cause.contains("line: train_step (rank_worker.c:"),
        "{cause}"
    );
    let path = common::dump_files(&dumps)[0].clone();
    assert!(
        cause.contains(&format!(
            "dump: {}  (details: oomshim report {})",
            path.display(),
            path.display()
        )),
        "{cause}"
    );
    // Rank 0 ended normally: no error file of oomshim's.
    assert!(error_file(&logs, 0)
        .is_none_or(|f| !speaks_for_oomshim(&std::fs::read_to_string(f).unwrap())));
}

/// What the Python workers allocate with: the simulated driver (`libcuda.so.1`) through the PLT,
/// as a framework's native code would. Not the simulated runtime: real torch brings its own
/// `libcudart.so.13`, and a second library of that name cannot be loaded beside it.
const SIMDRV_C: &str = r#"
#include <stddef.h>
typedef unsigned long long CUdeviceptr;
extern int cuInit(unsigned flags);
extern int cuMemAlloc_v2(CUdeviceptr *p, size_t n);
extern int cuMemFree_v2(CUdeviceptr p);
unsigned long long simdrv_alloc(size_t n) {
    static int ready;
    if (!ready) {
        if (cuInit(0) != 0) return 0;
        ready = 1;
    }
    CUdeviceptr p = 0;
    return cuMemAlloc_v2(&p, n) == 0 ? p : 0;
}
int simdrv_free(unsigned long long p) { return cuMemFree_v2(p); }
"#;

/// A Python worker that allocates 256 MiB at a time on the simulated device until it fails,
/// then raises torch's `OutOfMemoryError` as torch would (`oom`); raises a `ValueError` with no
/// out-of-memory error at all (`value`); or catches its out-of-memory error, frees, allocates
/// again and then fails with a `ValueError` (`survive`). `RECORD=1` decorates its entry point
/// with torchelastic's `@record`.
const WORKER: &str = r#"
import ctypes, os
import torch
from torch.distributed.elastic.multiprocessing.errors import record

sim = ctypes.CDLL(os.environ["SIMDRV"])
sim.simdrv_alloc.restype = ctypes.c_uint64
sim.simdrv_alloc.argtypes = [ctypes.c_size_t]
sim.simdrv_free.argtypes = [ctypes.c_uint64]
MiB = 1 << 20
kept = []

def train():
    while True:
        p = sim.simdrv_alloc(256 * MiB)  # the program's line
        if not p:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB.")
        kept.append(p)

def main():
    mode = os.environ["WORKER_MODE"]
    if mode == "oom":
        train()
    elif mode == "value":
        raise ValueError("bad shape (3, 4)")
    elif mode == "survive":
        try:
            train()
        except torch.OutOfMemoryError:
            for p in kept:
                sim.simdrv_free(p)
            kept.clear()
        kept.append(sim.simdrv_alloc(64 * MiB))  # it goes on: the failure did not end it
        raise ValueError("bad shape after recovering")

if os.environ.get("RECORD") == "1":
    main = record(main)
main()
"#;

struct PyJob {
    dir: tempfile::TempDir,
    script: PathBuf,
    simdrv: PathBuf,
}

fn py_job() -> Option<PyJob> {
    if !torchrun_available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let simdrv = common::build_sim_library(dir.path(), "simdrv", SIMDRV_C, "libcuda.so.1")?;
    let script = dir.path().join("worker.py");
    std::fs::write(&script, WORKER).unwrap();
    Some(PyJob {
        dir,
        script,
        simdrv,
    })
}

impl PyJob {
    /// One Python worker under `oomshim run`; (output, root cause, error file's text, dumps).
    fn run(
        &self,
        name: &str,
        mode: &str,
        record: bool,
    ) -> (Output, String, Option<String>, Vec<Dump>) {
        let logs = self.dir.path().join(format!("{name}-logs"));
        let dumps = self.dir.path().join(format!("{name}-dumps"));
        let env = [
            ("SIMDRV", self.simdrv.to_str().unwrap()),
            ("WORKER_MODE", mode),
            ("RECORD", if record { "1" } else { "0" }),
            ("OOMSHIM_DIR", dumps.to_str().unwrap()),
            ("OOMSHIM_TERMINATION_LOG", "off"),
        ];
        let o = torchrun(
            Some(&[]),
            1,
            &[],
            &[self.script.to_str().unwrap()],
            &env,
            &logs,
        );
        let cause = root_cause(&text(&o.stderr));
        let file = error_file(&logs, 0).map(|f| std::fs::read_to_string(f).unwrap());
        (o, cause, file, oom_dumps(&dumps))
    }
}

#[test]
fn a_python_worker_out_of_memory_without_record_gets_oomshims_error_file() {
    let Some(job) = py_job() else { return };
    let (_, cause, file, dumps) = job.run("plain", "oom", false);
    assert_eq!(dumps.len(), 1, "{cause}");
    let file = file.expect("oomshim wrote the error file torchrun asked for");
    let v: serde_json::Value = serde_json::from_str(&file).unwrap();
    assert_eq!(
        v["message"]["extraInfo"]["oomshim"]["kind"],
        dumps[0].verdict.kind
    );
    assert!(
        cause.contains(&format!(
            "{}: {}",
            dumps[0].verdict.kind,
            dumps[0].verdict.headline()
        )),
        "{cause}"
    );
    assert!(cause.contains("retry: "), "{cause}");
    assert!(cause.contains("\n  line: train (worker.py:15)"), "{cause}");
}

#[test]
fn a_python_worker_out_of_memory_with_record_keeps_its_traceback_and_gets_the_headline_after_it() {
    let Some(job) = py_job() else { return };
    let (_, cause, file, dumps) = job.run("record", "oom", true);
    assert_eq!(dumps.len(), 1, "{cause}");
    // The program's own report first: torch's traceback and its message ...
    let tb = cause
        .find("Traceback (most recent call last)")
        .expect(&cause);
    let own = cause
        .find("OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB.")
        .expect(&cause);
    // ... then oomshim's answer.
    let ours = cause
        .find("oomshim: CUDA out of memory on device 0")
        .expect(&cause);
    assert!(tb < own && own < ours, "{cause}");
    assert!(cause.contains(dumps[0].verdict.headline()), "{cause}");
    let v: serde_json::Value = serde_json::from_str(&file.unwrap()).unwrap();
    let message = v["message"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB.\noomshim: "
        ),
        "{message}"
    );
}

#[test]
fn a_worker_failing_for_another_reason_shows_its_own_text_only() {
    let Some(job) = py_job() else { return };
    // @record wrote the ValueError: left exactly as the program wrote it.
    let (_, cause, file, dumps) = job.run("value", "value", true);
    assert!(dumps.is_empty());
    assert!(cause.contains("ValueError: bad shape (3, 4)"), "{cause}");
    assert!(!speaks_for_oomshim(&cause), "{cause}");
    let v: serde_json::Value = serde_json::from_str(&file.unwrap()).unwrap();
    assert!(v["message"]["extraInfo"].get("oomshim").is_none());
    // An out-of-memory error the program caught and survived (it allocated again), then a
    // ValueError: with @record, the program's text only; without, no error file of oomshim's.
    let (_, cause, file, dumps) = job.run("survive-record", "survive", true);
    assert_eq!(dumps.len(), 1, "the caught failure still has its dump");
    assert!(
        cause.contains("ValueError: bad shape after recovering"),
        "{cause}"
    );
    assert!(!speaks_for_oomshim(&cause), "{cause}");
    assert!(!speaks_for_oomshim(&file.unwrap()));
    let (_, cause, file, _) = job.run("survive-plain", "survive", false);
    assert!(file.is_none(), "{file:?}");
    assert!(cause.contains("error_file: <N/A>"), "{cause}");
}

/// rank 1 of two `flight_leak` workers is SIGKILLed once it published, as the kernel's OOM
/// killer leaves it (a stand-in cgroup's `memory.events` counts the kill): torchrun's root cause
/// is oomshim's post-mortem. The agent reaps a worker at its next poll (`--monitor-interval`,
/// 0.1 s) and reads the error file then; oomshim writes it within a few milliseconds of the
/// death. When it loses that race it says so, and the run is tried once more.
#[test]
fn a_worker_sigkilled_under_oomshim_run_gets_its_post_mortem_as_the_root_cause() {
    worker_sigkilled_after(5);
}

/// Killed at its first publish, before `oomshim run`'s scan (every 0.5 s) has seen it alive: its
/// environment is gone by then, and the error file it names is read from what it published.
#[test]
fn a_worker_killed_before_oomshim_first_saw_it_alive_still_gets_its_error_file() {
    worker_sigkilled_after(1);
}

fn worker_sigkilled_after(publishes: u64) {
    if !torchrun_available() {
        return;
    }
    for attempt in 0..3 {
        let (o, cause, dumps) = sigkilled_worker(publishes);
        let err = text(&o.stderr);
        if err.contains("before oomshim's error file") && attempt < 2 {
            // Lost the race with the agent's poll (likelier on a loaded machine) and said so,
            // with the dump written all the same: once more.
            assert!(
                dumps
                    .iter()
                    .any(|d| d.process.rank == Some(1) && d.post_mortem.is_some()),
                "{err}"
            );
            continue;
        }
        assert!(cause.contains("rank      : 1 (local_rank: 1)"), "{cause}");
        assert!(cause.contains("(SIGKILL)"), "{cause}");
        let pm = dumps
            .iter()
            .find(|d| d.process.rank == Some(1) && d.post_mortem.is_some())
            .unwrap_or_else(|| panic!("rank 1's post-mortem: {err}"));
        assert_eq!(pm.verdict.kind, "host_oom_kill", "{:#?}", pm.verdict);
        assert!(
            cause.contains(&format!(
                "traceback : oomshim: post-mortem (reconstructed): {}",
                pm.verdict.headline()
            )),
            "{cause}"
        );
        assert!(cause.contains("retry: after_change ("), "{cause}");
        // Rank 0, ended by the agent's SIGTERM, leaves no answer of its own.
        assert!(!err.contains("rank 0") || !cause.contains("rank      : 0"));
        return;
    }
}

/// A torchrun job of two `flight_leak` workers under `oomshim run`, rank 1 SIGKILLed (as the
/// kernel's OOM killer would, the stand-in cgroup saying so) once its region has `publishes`.
fn sigkilled_worker(publishes: u64) -> (Output, String, Vec<Dump>) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let dumps = dir.path().join("dumps");
    let logs = dir.path().join("logs");
    // The stand-in cgroup, as tests/flight.rs builds it: the same relative path as ours.
    let fake = dir.path().join("cgroup");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let (cg, v2) = oomshim_core::facts::host::cgroup_dir(&own, &fake).expect("a memory cgroup");
    std::fs::create_dir_all(&cg).unwrap();
    let events = cg.join(if v2 {
        "memory.events"
    } else {
        "memory.oom_control"
    });
    std::fs::write(&events, "oom 0\noom_kill 0\n").unwrap();
    let max = cg.join(if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    });
    std::fs::write(max, "17179869184\n").unwrap();
    let worker = oomshim_cli::testbed::client("flight_leak");
    let _ = shim_lib();
    let mut cmd = cli();
    cmd.args(["run", "--"])
        .arg(torch_python())
        .args([
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            // The agent's poll every 0.5 s (0.1 s by default): the race with oomshim's error file
            // is lost at a fifth of the default's rate, on a machine whose load lengthens it.
            "--monitor-interval=0.5",
        ])
        .arg("--log-dir")
        .arg(&logs)
        .arg("--no-python")
        .arg(&worker)
        .env_remove("LD_PRELOAD")
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("OOMSHIM_DIR", &dumps)
        .env("OOMSHIM_CGROUP_ROOT", &fake)
        .env("OOMSHIM_TERMINATION_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // Rank 1, once its region has a few publishes.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let rank1 = loop {
        let found = oomshim_core::flight::read::list_regions(&live)
            .into_iter()
            .find(|r| {
                std::fs::read(format!("/proc/{}/environ", r.pid))
                    .is_ok_and(|e| e.split(|&b| b == 0).any(|v| v == b"RANK=1"))
                    && oomshim_core::flight::read::read_region(&r.path)
                        .is_ok_and(|s| s.summary.generation >= publishes)
            });
        if let Some(r) = found {
            break r.pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rank 1 never published"
        );
        std::thread::sleep(Duration::from_millis(if publishes > 1 { 50 } else { 2 }));
    };
    std::fs::write(&events, "oom 1\noom_kill 1\n").unwrap();
    // SAFETY: `kill` takes integers only; the target is a worker of the job this test started.
    assert_eq!(unsafe { libc::kill(rank1 as i32, libc::SIGKILL) }, 0);
    let o = child.wait_with_output().unwrap();
    let cause = root_cause(&text(&o.stderr));
    (o, cause, common::dumps(&dumps))
}

#[test]
fn a_termination_message_is_left_by_a_failure_that_ends_the_process_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("termination-log");
    let dumps = dir.path().join("dumps");
    let env = |rank: &'static str| {
        vec![
            ("RANK", rank),
            ("SIM_LEAK_RANK", "1"),
            ("OOMSHIM_TERMINATION_LOG", log.to_str().unwrap()),
            ("OOMSHIM_DIR", dumps.to_str().unwrap()),
        ]
    };
    // A normal exit: nothing, not even an empty file.
    let o = run_client("rank_worker", &[], &env("0"), true);
    assert_eq!(o.status.code(), Some(0));
    assert!(!log.exists());
    // The program's own message first (Kubernetes shows the file as it is).
    std::fs::write(&log, "trainer: giving up\n").unwrap();
    let o = run_client("rank_worker", &[], &env("1"), true);
    assert_eq!(o.status.code(), Some(3));
    let msg = std::fs::read_to_string(&log).unwrap();
    let d = &oom_dumps(&dumps)[0];
    assert!(
        msg.starts_with("trainer: giving up\n\noomshim: CUDA out of memory on device 0"),
        "{msg}"
    );
    assert!(msg.contains(d.verdict.headline()), "{msg}");
    assert!(msg.contains("\nretry: after_change ("), "{msg}");
    assert!(msg.contains("\nline: train_step (rank_worker.c:"), "{msg}");
    let path = common::dump_files(&dumps)[0].clone();
    assert!(
        msg.contains(&format!("\ndump: {}", path.display())),
        "{msg}"
    );
    assert!(msg.len() <= 4096 && msg.ends_with('\n'));
    // Full up to 4096 bytes already: nothing is added.
    std::fs::write(&log, "x".repeat(4080)).unwrap();
    run_client("rank_worker", &[], &env("1"), true);
    assert_eq!(std::fs::read(&log).unwrap().len(), 4080);
    // The default path is used only where it exists (not here): nothing anywhere else.
    let o = run_client(
        "rank_worker",
        &[],
        &[
            ("RANK", "1"),
            ("SIM_LEAK_RANK", "1"),
            ("OOMSHIM_DIR", dumps.to_str().unwrap()),
        ],
        true,
    );
    assert_eq!(o.status.code(), Some(3));
}

/// A process that ends by `_exit` right after its failure (no exit handler runs): the answer
/// prepared at the failure is written with system calls only: the error file (created, as none
/// exists) and the termination message.
#[test]
fn a_raw_exit_after_the_failure_still_leaves_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("termination-log");
    let error = dir.path().join("error.json");
    let dumps = dir.path().join("dumps");
    let o = run_client(
        "rank_worker",
        &[],
        &[
            ("RANK", "1"),
            ("SIM_LEAK_RANK", "1"),
            ("SIM_RAW_EXIT", "1"),
            ("TORCHELASTIC_ERROR_FILE", error.to_str().unwrap()),
            ("OOMSHIM_TERMINATION_LOG", log.to_str().unwrap()),
            ("OOMSHIM_DIR", dumps.to_str().unwrap()),
            // The dump is on disk before the failing call returns (as for a program that aborts
            // at once): its answer is prepared by then.
            ("OOMSHIM_SETTLE", "0"),
        ],
        true,
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let d = &oom_dumps(&dumps)[0];
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&error).unwrap()).unwrap();
    let stack = v["message"]["extraInfo"]["py_callstack"].as_str().unwrap();
    assert!(stack.contains(d.verdict.headline()), "{stack}");
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(
        msg.starts_with("oomshim: CUDA out of memory on device 0"),
        "{msg}"
    );
    assert!(msg.ends_with('\n') && msg.len() <= 4096);
    // Without the raw exit, the same program's normal exit writes the same answer.
    let bare = run_client(
        "rank_worker",
        &[],
        &[("RANK", "1"), ("SIM_LEAK_RANK", "1"), ("SIM_RAW_EXIT", "1")],
        false,
    );
    assert_eq!(
        bare.status.code(),
        Some(3),
        "the program's own status, as bare"
    );
}

/// `oomshim run --exit-code`: 78 for the program's own memory, 75 for another process's, the
/// program's own status when the verdict cannot tell, and without the flag always.
#[test]
fn exit_codes_follow_the_retry_hint_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let run = |flags: &[&str], client: &str, env: &[(&str, &str)]| -> (Option<i32>, String) {
        let d = tempfile::tempdir_in(dir.path()).unwrap();
        let _ = shim_lib();
        let mut cmd = cli();
        cmd.arg("run")
            .args(flags)
            .arg("--")
            .arg(oomshim_cli::testbed::client(client));
        cmd.env_remove("LD_PRELOAD")
            .env("OOMSHIM_DIR", d.path())
            .env("OOMSHIM_SETTLE", "0.2s")
            .env("OOMSHIM_TERMINATION_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let o = common::wait_with_watchdog(cmd, Duration::from_secs(120));
        (o.status.code(), text(&o.stderr))
    };
    let leak = [("RANK", "1"), ("SIM_LEAK_RANK", "1")];
    assert_eq!(run(&[], "rank_worker", &leak).0, Some(3));
    let (code, err) = run(&["--exit-code"], "rank_worker", &leak);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("; retry: after_change"), "{err}");
    // A normal exit stays 0.
    assert_eq!(
        run(&["--exit-code"], "rank_worker", &[("RANK", "0")]).0,
        Some(0)
    );
    // Another process holds 5 GiB of the 8 GiB device (the simulated NVML lists it): elsewhere.
    let lib = tempfile::tempdir().unwrap();
    common::build_fake_nvml(lib.path());
    let mut other = Command::new("sleep").arg("120").spawn().unwrap();
    let processes = format!("{}:{}", other.id(), 5u64 << 30);
    let beside = [
        ("SIMCUDA_CAPACITY", "8G"),
        ("SIMCUDA_OTHER_PROCESS_BYTES", "5G"),
        ("SIMNVML_PROCESSES", processes.as_str()),
        ("LD_LIBRARY_PATH", lib.path().to_str().unwrap()),
    ];
    let beside: Vec<(&str, &str)> = leak.iter().chain(&beside).copied().collect();
    let (code, err) = run(&["--exit-code"], "rank_worker", &beside);
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("; retry: elsewhere"), "{err}");
    // The same memory that NVML cannot attribute (another container's): unknown, the program's
    // own status.
    let unseen = [
        ("RANK", "1"),
        ("SIM_LEAK_RANK", "1"),
        ("SIMCUDA_CAPACITY", "8G"),
        ("SIMCUDA_OTHER_PROCESS_BYTES", "6G"),
    ];
    let (code, err) = run(&["--exit-code"], "rank_worker", &unseen);
    assert!(err.contains("; retry: unknown"), "{err}");
    assert_eq!(code, Some(3), "the program's own status: {err}");
    other.kill().ok();
    other.wait().ok();
}

/// The GPU check of this feature (tests/gpu/check_torchrun_rank.py) parses torchrun's output
/// right: its self-test, here, so a broken parser does not cost a GPU session to find.
#[test]
fn the_gpu_checks_parsing_passes_its_self_test() {
    if !common::require("python3") {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/check_torchrun_rank.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .arg("--self-test")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = common::wait_with_watchdog(cmd, Duration::from_secs(60));
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).starts_with("[PASS] check_torchrun_rank self-test"));
}
