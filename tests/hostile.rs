//! Issue 14: hostile neighbours, odd file descriptors and broken pipes. Each test reproduces an
//! attack (a planted file or directory, a hostile dump) or an accident (a closed stderr, a dead
//! log reader, a chdir, a full disk) against the CLI or the shim; see RELIABILITY.md section 9.

use crate::common;

use common::shim_lib;
use serde_json::json;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The CLI, with liboomshim.so built next to it (where `run` and `demo` look for it).
fn cli() -> Command {
    shim_lib();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oomshim"));
    cmd.env_remove("LD_PRELOAD")
        .env_remove("OOMSHIM_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `cmd` to completion under a watchdog, reading its output meanwhile (a child that writes
/// more than a pipe holds would otherwise block forever): a hang fails the test.
fn wait_with_watchdog(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd.spawn().expect("spawn");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("watchdog: {cmd:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Runs the CLI with `args` under a 60 s watchdog (a hang fails the test).
fn oomshim(args: &[&str]) -> Output {
    let mut cmd = cli();
    cmd.args(args);
    wait_with_watchdog(cmd, Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

// ---------------------------------------------------------------------------------------------
// 4. readers: FIFOs, devices, links to them

use dump::read::read_dump;
use std::ffi::CString;

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path in the test's own directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn fifos_devices_and_links_to_them_are_refused_at_once_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("oomshim-x-1-1.json");
    mkfifo(&fifo);
    for args in [
        vec!["report", fifo.to_str().unwrap()],
        vec!["report", "/dev/zero"],
        vec!["diff", fifo.to_str().unwrap(), "/dev/zero"],
        vec!["export", "/dev/zero", "--memory-viz", "/dev/null"],
    ] {
        let mut cmd = cli(); // builds liboomshim.so first, outside the timing
        cmd.args(&args);
        let start = Instant::now();
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            start.elapsed()
        );
    }

    // A torch side file next to a good dump: a FIFO, then a link to /dev/zero. The report must
    // come out at once and without it.
    let dump: dump::model::Dump = read_dump(&fixture("oom_own_allocations.json")).unwrap();
    let good = dir.path().join("oomshim-good.json");
    fs::copy(fixture("oom_own_allocations.json"), &good).unwrap();
    let side = dir.path().join(format!(
        "oomshim-torch-{}-{}-1.json",
        dump.process.host, dump.process.pid
    ));
    mkfifo(&side);
    let side2 = dir.path().join(format!(
        "oomshim-torch-{}-{}-2.json",
        dump.process.host, dump.process.pid
    ));
    std::os::unix::fs::symlink("/dev/zero", &side2).unwrap();
    for args in [
        vec!["report", good.to_str().unwrap()],
        vec!["report", good.to_str().unwrap(), "--json"],
    ] {
        let mut cmd = cli();
        cmd.args(&args);
        let start = Instant::now();
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        assert!(!text(&o.stdout).contains("PyTorch's cache"));
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    // merge of the directory: the FIFO and the links are not dumps, the good one is read.
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.json")).unwrap();
    let o = oomshim(&["merge", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with("1 dump\n"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn a_torch_side_file_that_links_elsewhere_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let dump: dump::model::Dump = read_dump(&fixture("oom_own_allocations.json")).unwrap();
    let good = dir.path().join("oomshim-good.json");
    fs::copy(fixture("oom_own_allocations.json"), &good).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("cache.json");
    let side = json!({
        "schema": "oomshim.torch/1", "pid": dump.process.pid, "host": dump.process.host,
        "device": 0, "request_bytes": dump.failed_request.as_ref().unwrap().bytes,
        "time_unix_ms": dump.time_unix_ms,
        "alloc_conf": "planted-elsewhere",
        "cache": {"segments": 1, "reserved_bytes": 1, "allocated_bytes": 0, "total_free_bytes": 1,
                  "largest_free_bytes": 1, "inactive_split_bytes": 0, "histogram": []}
    });
    fs::write(&target, serde_json::to_vec(&side).unwrap()).unwrap();
    let name = format!(
        "oomshim-torch-{}-{}-1.json",
        dump.process.host, dump.process.pid
    );
    std::os::unix::fs::symlink(&target, dir.path().join(&name)).unwrap();
    let o = oomshim(&["report", good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!text(&o.stdout).contains("planted-elsewhere"));
    // The same file, really there, is merged.
    fs::remove_file(dir.path().join(&name)).unwrap();
    fs::copy(&target, dir.path().join(&name)).unwrap();
    let o = oomshim(&["report", good.to_str().unwrap()]);
    assert!(
        text(&o.stdout).contains("planted-elsewhere"),
        "{}",
        text(&o.stdout)
    );
}

// ---------------------------------------------------------------------------------------------
// 3. output files: planted symlinks and permission bits

use std::os::unix::fs::{MetadataExt, PermissionsExt};

#[test]
fn export_never_writes_through_a_symlink_planted_at_its_temporary_name() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let out = dir.path().join("snap.pickle");
    // The old temporary name was OUT.tmp-PID (out.with_extension): plant it for many pids.
    let last: u32 = fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1);
    for pid in last + 1..last + 3000 {
        std::os::unix::fs::symlink(&victim, dir.path().join(format!("snap.tmp-{pid}"))).unwrap();
    }
    let o = oomshim(&[
        "export",
        fixture("oom_own_allocations.json").to_str().unwrap(),
        "--memory-viz",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        fs::read(&victim).unwrap() == b"precious",
        "written through a planted symlink"
    );
    let meta = fs::symlink_metadata(&out).unwrap();
    assert!(meta.file_type().is_file(), "the output is a regular file");
    // Every planted link is still a link to the victim; nothing else was left behind.
    let extra: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "victim" && n != "snap.pickle" && !n.starts_with("snap.tmp-"))
        .collect();
    assert!(extra.is_empty(), "{extra:?}");
}

#[test]
fn html_reports_and_pickles_inherit_the_dumps_permission_bits() {
    let dir = tempfile::tempdir().unwrap();
    // The usual umask would make a fresh file 0644: it must not decide.
    let dump = dir.path().join("dump.json");
    for (dump_mode, want) in [
        (0o600, 0o600),
        (0o640, 0o640),
        (0o644, 0o644),
        (0o400, 0o600),
    ] {
        fs::copy(fixture("oom_own_allocations.json"), &dump).unwrap();
        fs::set_permissions(&dump, fs::Permissions::from_mode(dump_mode)).unwrap();
        let html = dir.path().join("r.html");
        let pickle = dir.path().join("s.pickle");
        let o = oomshim(&[
            "report",
            dump.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let o = oomshim(&[
            "export",
            dump.to_str().unwrap(),
            "--memory-viz",
            pickle.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        for out in [&html, &pickle] {
            let mode = fs::metadata(out).unwrap().mode() & 0o7777;
            assert_eq!(
                mode,
                want,
                "{} from a {dump_mode:o} dump is {mode:o}",
                out.display()
            );
        }
        fs::set_permissions(&dump, fs::Permissions::from_mode(0o600)).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// 15. RLIMIT_FSIZE

use std::os::unix::process::CommandExt;

#[test]
fn rlimit_fsize_fails_html_and_export_cleanly_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    let dump = fixture("oom_own_allocations.json");
    for args in [
        vec![
            "report".to_string(),
            dump.display().to_string(),
            "--html".into(),
            out.join("r.html").display().to_string(),
        ],
        vec![
            "export".to_string(),
            dump.display().to_string(),
            "--memory-viz".into(),
            out.join("s.pickle").display().to_string(),
        ],
    ] {
        let mut cmd = cli();
        cmd.args(&args);
        // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
        // calls (setrlimit, setsid, ioctl) on values of its own.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 1000,
                    rlim_max: 1000,
                };
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                Ok(())
            });
        }
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {:?} {err}", o.status);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("File too large"), "{err}");
        let left: Vec<_> = fs::read_dir(&out).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 12. allocations sized by a dump's values

use serde_json::Value;

fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&fs::read(fixture(name)).unwrap()).unwrap()
}

#[test]
fn a_device_index_of_i32_max_costs_no_huge_allocation_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = fixture_json("oom_own_allocations.json");
    for d in v["devices"].as_array_mut().unwrap() {
        d["index"] = json!(i32::MAX);
    }
    v["failed_request"]["device"] = json!(i32::MAX);
    for h in v["largest_holders"].as_array_mut().unwrap() {
        h["device"] = json!(i32::MAX);
    }
    let dump = dir.path().join("big-index.json");
    fs::write(&dump, serde_json::to_vec(&v).unwrap()).unwrap();
    let d = dump.to_str().unwrap();
    // diff refuses a dump compared with itself: a copy is the other one.
    let copy = dir.path().join("big-index-2.json");
    fs::copy(&dump, &copy).unwrap();
    let c = copy.to_str().unwrap();
    let out = dir.path().join("o");
    let o = out.to_str().unwrap();
    for args in [
        vec!["export", d, "--memory-viz", o],
        vec!["report", d],
        vec!["report", d, "--json"],
        vec!["report", d, "--html", o],
        vec!["diff", d, c],
        vec!["merge", dir.path().to_str().unwrap()],
    ] {
        let o = oomshim(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
    }
}

// ---------------------------------------------------------------------------------------------
// 13. terminal escapes from dumps and file names

use dump::read::parse_dump;
use oomshim_cli::testbed;

/// A compiled test client run under the shim, with `cwd` and extra environment.
fn client(name: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(testbed::client(name));
    cmd.args(args)
        .env_remove("OOMSHIM_DIR")
        .env("OOMSHIM_SETTLE", "0.2s")
        .env("LD_PRELOAD", shim_lib())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Escape sequences, control characters and C1 controls (U+009B is CSI for many terminals).
const HOSTILE: &str = "\x1b]0;pwned\x07\x1b[2J\u{9b}31m\r\x08\x7f\t\nZ";

/// True for any character a terminal may interpret, other than the newline ending a line.
fn is_terminal_control(c: char) -> bool {
    c != '\n' && c.is_control()
}

fn assert_no_terminal_controls(what: &str, bytes: &[u8]) {
    let s = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    if let Some((i, c)) = s.char_indices().find(|&(_, c)| is_terminal_control(c)) {
        let from = s[..i].rfind('\n').map_or(0, |n| n + 1);
        panic!(
            "{what}: control character {c:?} reaches the terminal, in the line {:?}",
            &s[from..(i + 40).min(s.len())]
        );
    }
}

/// Every string of `v` with the hostile payload appended, where the dump still parses with it
/// (strings that are enum-like keep their values).
fn poison_strings(v: &mut Value) {
    fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::String(_) => out.push(at),
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    pointers(x, format!("{at}/{i}"), out);
                }
            }
            Value::Object(o) => {
                for (k, x) in o {
                    pointers(
                        x,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    );
                }
            }
            _ => {}
        }
    }
    let mut all = Vec::new();
    pointers(v, String::new(), &mut all);
    for p in all {
        if p == "/schema" {
            continue;
        }
        let old = v.pointer(&p).cloned().unwrap();
        let new = format!("{}{HOSTILE}", old.as_str().unwrap());
        *v.pointer_mut(&p).unwrap() = Value::String(new);
        let bytes = serde_json::to_vec(v).unwrap();
        if parse_dump(&bytes, Path::new("x")).is_err() {
            *v.pointer_mut(&p).unwrap() = old;
        }
    }
}

/// A real dump from the shim (growth, config, host memory, verdict findings), with NVML's
/// process table and the free-block state filled in, every string poisoned.
fn hostile_dump(dir: &Path) -> Value {
    let dumps = dir.join("src");
    let o = wait_with_watchdog(
        client(
            "steps_leak",
            &[],
            &[
                ("SIMCUDA_CAPACITY", "1G"),
                ("OOMSHIM_DIR", dumps.to_str().unwrap()),
                ("OOMSHIM_SETTLE", "0"),
            ],
        ),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let path = json_files(&dumps).into_iter().next().expect("a dump");
    let mut v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    v["gpu_processes"] = json!({
        "device": 0, "matched_by": "index",
        "processes": [{"pid": 7, "name": "other", "used_bytes": 1024, "relation": "other_user"}],
    });
    v["process"]["command_line"] = json!(["python", "train.py"]);
    v["config"]["env"]["PYTORCH_CUDA_ALLOC_CONF"] = json!("expandable_segments:False");
    poison_strings(&mut v);
    v
}

#[test]
fn no_terminal_control_reaches_stdout_or_stderr_from_any_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let v = hostile_dump(dir.path());
    let host = v["process"]["host"].as_str().unwrap().to_string();
    let pid = v["process"]["pid"].as_u64().unwrap();
    assert!(host.contains('\x1b'), "the host name was poisoned");
    let jobs = dir.path().join(format!("job{HOSTILE}"));
    fs::create_dir(&jobs).unwrap();
    // Two ranks, so merge prints its balance lines (with the host names in them).
    let a = jobs.join(format!("oomshim-{HOSTILE}-a.json"));
    fs::write(&a, serde_json::to_vec(&v).unwrap()).unwrap();
    let mut w = v.clone();
    w["process"]["pid"] = json!(pid + 1);
    w["process"]["rank"] = json!(1);
    w["reason"] = json!("snapshot");
    for d in w["devices"].as_array_mut().unwrap() {
        d["peak_tracked_bytes"] = json!(1);
    }
    let b = jobs.join("b.json");
    fs::write(&b, serde_json::to_vec(&w).unwrap()).unwrap();
    // A broken dump and a torch side file of the first process, both hostile too.
    fs::write(
        jobs.join(format!("broken{HOSTILE}.json")),
        br#"{"schema": "oomshim.dump/1", "reason""#,
    )
    .unwrap();
    let side = json!({
        "schema": "oomshim.torch/1", "pid": pid, "host": host, "device": 0, "request_bytes": 1,
        "time_unix_ms": v["time_unix_ms"], "alloc_conf": format!("expandable{HOSTILE}"),
        "snapshot_file": format!("snap{HOSTILE}.pickle"), "torch_version": format!("2.11{HOSTILE}"),
        "cache": {"segments": 1, "reserved_bytes": 1, "allocated_bytes": 0, "total_free_bytes": 1,
                  "largest_free_bytes": 1, "inactive_split_bytes": 0, "histogram": []}
    });
    fs::write(
        jobs.join(format!("oomshim-torch-{host}-{pid}-1.json")),
        serde_json::to_vec(&side).unwrap(),
    )
    .unwrap();
    let missing = jobs.join(format!("missing{HOSTILE}.json"));
    let html = jobs.join(format!("r{HOSTILE}.html"));
    let pickle = jobs.join(format!("s{HOSTILE}.pickle"));
    let (a, b, j) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        jobs.to_str().unwrap(),
    );
    let (m, h, p) = (
        missing.to_str().unwrap(),
        html.to_str().unwrap(),
        pickle.to_str().unwrap(),
    );
    let nodir = format!("{j}/no{HOSTILE}dir/r.html");
    let runs: Vec<Vec<&str>> = vec![
        vec!["report", a],
        vec!["report", a, "--top", "100"],
        vec!["report", a, "--html", h],
        vec!["report", m],
        vec!["report", j],
        vec!["diff", a, b],
        vec!["diff", b, a],
        vec!["diff", a, m],
        vec!["export", a, "--memory-viz", p],
        vec!["export", m, "--memory-viz", p],
        vec!["merge", j],
        vec!["merge", m],
        vec!["report", a, "--html", &nodir],
        vec!["run", "--", m],
    ];
    for args in &runs {
        let o = oomshim(args);
        let code = o.status.code();
        assert!(
            matches!(code, Some(0..=2) | Some(125..=127)),
            "{args:?}: {code:?}"
        );
        assert_no_terminal_controls(&format!("{args:?} stdout"), &o.stdout);
        assert_no_terminal_controls(&format!("{args:?} stderr"), &o.stderr);
        if code != Some(0) {
            assert_eq!(text(&o.stderr).lines().count(), 1, "{args:?}: one line");
        }
    }
    // The hostile strings were printed (escaped), not dropped: the test is not vacuous.
    let o = oomshim(&["report", a]);
    assert!(text(&o.stdout).contains("\\u{1b}"), "{}", text(&o.stdout));
    let o = oomshim(&["merge", j]);
    assert!(text(&o.stdout).contains("Balance"), "{}", text(&o.stdout));
}

// ---------------------------------------------------------------------------------------------
// 14. stdout errors

use std::os::fd::{FromRawFd, OwnedFd};

/// A pipe whose read end is already closed.
fn dead_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: `pipe2` writes two descriptors into the two-slot array.
    let piped = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(piped, 0);
    // SAFETY: both ends are this function's own: the read end is closed once, the write end
    // owned by the returned OwnedFd alone.
    unsafe {
        libc::close(fds[0]);
        OwnedFd::from_raw_fd(fds[1])
    }
}

#[test]
fn a_closed_pipe_or_a_full_disk_on_stdout_ends_cleanly_never_with_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    fs::copy(
        fixture("oom_own_allocations.json"),
        dir.path().join("a.json"),
    )
    .unwrap();
    let dump = dir.path().join("a.json");
    let d = dump.to_str().unwrap();
    // diff refuses a dump compared with itself: a copy is the other one.
    let copy = dir.path().join("b.json");
    fs::copy(&dump, &copy).unwrap();
    let c = copy.to_str().unwrap();
    let j = dir.path().to_str().unwrap();
    for args in [
        vec!["report", d],
        vec!["report", d, "--json"],
        vec!["diff", d, c],
        vec!["merge", j],
        vec!["merge", j, "--json"],
    ] {
        // `| head -1` that has gone: a broken pipe ends quietly with status 0.
        let mut cmd = cli();
        cmd.args(&args).stdout(Stdio::from(dead_pipe()));
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        assert_eq!(text(&o.stderr), "", "{args:?}");
        // `> /dev/full`: one line naming the problem, exit 1.
        let mut cmd = cli();
        cmd.args(&args).stdout(
            fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        );
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("stdout") && err.contains("No space left on device"),
            "{err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The GPU process table of a dump is paged

#[test]
fn a_gpu_process_table_of_5000_rows_shows_the_largest_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = fixture_json("oom_own_allocations.json");
    let processes: Vec<Value> = (0..5000u64)
        .map(|i| {
            json!({"pid": 10_000 + i, "name": format!("p{i}"), "used_bytes": (5000 - i) << 20,
                   "relation": if i == 4321 { "this" } else { "other_user" }})
        })
        .collect();
    v["gpu_processes"] = json!({"device": 0, "matched_by": "index", "processes": processes});
    let dump = dir.path().join("d.json");
    fs::write(&dump, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = oomshim(&["report", dump.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    // Table rows: "  PID  BYTES  NAME  RELATION" (the verdict names a few processes too).
    let table_rows = |out: &str| {
        out.lines()
            .filter(|l| {
                l.trim_start().starts_with(|c: char| c.is_ascii_digit())
                    && l.ends_with("another user's")
            })
            .count()
    };
    let rows = table_rows(&out);
    assert!((1..=20).contains(&rows), "{rows} rows:\n{out}");
    assert!(out.contains("this process"), "this process is always shown");
    assert!(out.contains("more processes"), "{out}");
    let o = oomshim(&["report", dump.to_str().unwrap(), "--top", "3"]);
    let out = text(&o.stdout);
    assert_eq!(table_rows(&out), 3, "{out}");
    assert!(out.contains("4,996 more processes"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// 8 and 9. oomshim run: signals, library paths, exit codes

use std::io::Write;

/// `oomshim run -- count_signals`, started in its own process group; returns it with its stdout
/// after "ready".
fn run_counter() -> (std::process::Child, std::process::ChildStdout) {
    let mut cmd = cli();
    cmd.args(["run", "--"])
        .arg(testbed::client("count_signals"))
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    (child, out)
}

fn counts_after(child: std::process::Child, mut out: std::process::ChildStdout) -> String {
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    rest.trim().to_string()
}

#[test]
fn oomshim_run_delivers_a_signal_sent_to_its_process_group_exactly_once() {
    let (child, out) = run_counter();
    // As `timeout`, schedulers and `kill -TERM -PGID` send it: to the whole group.
    assert_eq!(
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) },
        0
    );
    assert_eq!(counts_after(child, out), "term 1 int 0");
}

#[test]
fn oomshim_run_delivers_a_signal_sent_to_its_pid_exactly_once() {
    let (child, out) = run_counter();
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(counts_after(child, out), "term 1 int 0");
}

#[test]
fn ctrl_c_on_the_terminal_reaches_the_program_under_oomshim_run_exactly_once() {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: `openpty` writes the two descriptors into locals; the rest are NULL.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: a descriptor `openpty` just opened, owned by this File alone.
    let master = unsafe { fs::File::from_raw_fd(master) };
    // SAFETY: a descriptor `openpty` just opened, owned by this OwnedFd alone.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    let mut cmd = cli();
    cmd.args(["run", "--"])
        .arg(testbed::client("count_signals"))
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
    // calls (setrlimit, setsid, ioctl) on values of its own.
    unsafe {
        // A session of its own with the pty as controlling terminal: a terminal's foreground job.
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(slave);
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    let mut reader = master.try_clone().unwrap();
    while !text(&got).contains("ready") {
        let n = reader.read(&mut buf).unwrap();
        assert!(n > 0, "{}", text(&got));
        got.extend_from_slice(&buf[..n]);
    }
    (&master).write_all(&[0x03]).unwrap(); // Ctrl-C
    while !text(&got).contains("term ") {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let status = child.wait().unwrap();
    let out = text(&got);
    assert!(out.contains("term 0 int 1"), "{out:?} ({status:?})");
}

#[test]
fn oomshim_run_refuses_a_library_path_ld_so_would_split() {
    for name in ["with space", "with:colon"] {
        let dir = tempfile::tempdir().unwrap();
        let libdir = dir.path().join(name);
        fs::create_dir(&libdir).unwrap();
        let lib = libdir.join("liboomshim.so");
        fs::copy(shim_lib(), &lib).unwrap();
        let dumps = dir.path().join("dumps");
        let mut cmd = cli();
        cmd.args(["run", "--lib"])
            .arg(&lib)
            .arg("--dir")
            .arg(&dumps)
            .arg("--")
            .arg(testbed::client("leak_until_oom"))
            .env("SIMCUDA_CAPACITY", "1G");
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("LD_PRELOAD") && err.contains("spaces and colons"),
            "{err}"
        );
        assert!(o.stdout.is_empty(), "the program did not run untracked");
    }
}

#[test]
fn oomshim_run_exits_126_for_a_program_that_cannot_run_and_127_for_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable.sh");
    fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let o = oomshim(&["run", "--", script.to_str().unwrap()]);
    // Root may execute a file without x bits only when some x bit is set: none is, so 126 too.
    assert_eq!(o.status.code(), Some(126), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("not-executable.sh"));
    let o = oomshim(&["run", "--", dir.path().to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(126),
        "a directory: {}",
        text(&o.stderr)
    );
    let o = oomshim(&["run", "--", "no-such-program-oomshim-test"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o.stderr));
    assert_eq!(text(&o.stderr).lines().count(), 1);
}

// ---------------------------------------------------------------------------------------------
// 1. demo: a planted work directory

/// A shared library whose constructor leaves `marker` behind: what an attacker would plant as
/// `libcuda.so.1` where the demo's simulated runtime looks for it ($ORIGIN).
fn build_planted_library(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("planted.c");
    fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{\n  \
             FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }}\n}}\n",
            marker.display()
        ),
    )
    .unwrap();
    let lib = dir.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success(), "building the planted library");
    lib
}

#[test]
fn demo_never_runs_code_from_a_work_directory_planted_in_tmpdir() {
    let base = tempfile::tempdir().unwrap();
    let tmpdir = base.path().join("tmp");
    fs::create_dir(&tmpdir).unwrap();
    let marker = base.path().join("planted-code-ran");
    let lib = build_planted_library(base.path(), &marker);
    // The demo's old work directory was $TMPDIR/oomshim-demo-PID: plant one for each of the
    // next few thousand pids (hard links of the library, so this costs nothing).
    let last: u32 = fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1);
    let max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    let mut planted = 0;
    for pid in (last + 1..last + 3000).map(|p| 300 + (p - 300) % (max - 300)) {
        let d = tmpdir.join(format!("oomshim-demo-{pid}"));
        if fs::create_dir(&d).is_ok() && fs::hard_link(&lib, d.join("libcuda.so.1")).is_ok() {
            planted += 1;
        }
    }
    assert!(planted > 2000);
    let cwd = base.path().join("cwd");
    fs::create_dir(&cwd).unwrap();
    let mut cmd = cli();
    cmd.arg("demo").env("TMPDIR", &tmpdir).current_dir(&cwd);
    let o = wait_with_watchdog(cmd, Duration::from_secs(120));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !marker.exists(),
        "the demo ran a library planted in $TMPDIR/oomshim-demo-PID"
    );
    // Its own work directory was fresh and is gone: only the planted ones are left.
    let left: Vec<String> = fs::read_dir(&tmpdir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            !n.strip_prefix("oomshim-demo-")
                .is_some_and(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

// ---------------------------------------------------------------------------------------------
// 5 and 6. the shim's stderr: a file that took over fd 2, a pipe nobody reads

#[test]
fn the_shim_never_writes_into_a_file_that_took_over_fd_2() {
    for mode in ["closed-stderr", "closed-stderr-early"] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("program.log");
        let o = wait_with_watchdog(
            client(
                "hostile_host",
                &[mode, file.to_str().unwrap()],
                &[
                    ("SIMCUDA_CAPACITY", "1G"),
                    ("OOMSHIM_DIR", dir.path().join("d").to_str().unwrap()),
                ],
            ),
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "{mode}: {:?}", o.status);
        assert!(text(&o.stdout).contains("dump 0"), "{}", text(&o.stdout));
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "program line\n",
            "{mode}: the shim wrote into the program's file"
        );
    }
}

#[test]
fn the_oom_summary_never_lands_in_a_file_that_took_over_fd_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("program.log");
    let o = wait_with_watchdog(
        client(
            "hostile_host",
            &["closed-stderr", file.to_str().unwrap(), "oom"],
            &[
                ("SIMCUDA_CAPACITY", "1G"),
                ("OOMSHIM_DIR", dir.path().join("d").to_str().unwrap()),
                ("OOMSHIM_SETTLE", "0"),
            ],
        ),
        Duration::from_secs(60),
    );
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("oom 2"));
    assert_eq!(fs::read_to_string(&file).unwrap(), "program line\n");
}

fn run_with_dead_stderr(mode: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = client(
        "hostile_host",
        &[mode],
        &[
            ("SIMCUDA_CAPACITY", "1G"),
            ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
            ("OOMSHIM_SETTLE", "0"),
        ],
    );
    cmd.stderr(Stdio::from(dead_pipe()));
    wait_with_watchdog(cmd, Duration::from_secs(60))
}

#[test]
fn a_stderr_pipe_whose_reader_is_gone_never_kills_the_program() {
    let o = run_with_dead_stderr("dump");
    assert_eq!(o.status.code(), Some(0), "killed: {:?}", o.status);
    assert_eq!(text(&o.stdout), "dump 0\ndone\n");
}

#[test]
fn a_stderr_pipe_whose_reader_is_gone_never_kills_the_program_at_an_oom() {
    let o = run_with_dead_stderr("oom");
    assert_eq!(o.status.code(), Some(0), "killed: {:?}", o.status);
    assert_eq!(text(&o.stdout), "oom 2\ndone\n");
}

// ---------------------------------------------------------------------------------------------
// A 10 MB reason for oomshim_dump

#[test]
fn a_huge_hostile_dump_reason_is_bounded_and_sanitised() {
    let dir = tempfile::tempdir().unwrap();
    let o = wait_with_watchdog(
        client(
            "hostile_host",
            &["reason", "10000000"],
            &[("OOMSHIM_DIR", dir.path().to_str().unwrap())],
        ),
        Duration::from_secs(60),
    );
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("dump 0"));
    assert!(o.stderr.len() < 4096, "{} bytes on stderr", o.stderr.len());
    assert_no_terminal_controls("stderr", &o.stderr);
    let dumps = json_files(dir.path());
    assert_eq!(dumps.len(), 1);
    let d = read_dump(&dumps[0]).unwrap();
    assert!(d.reason.len() <= 1024, "{} bytes of reason", d.reason.len());
    assert!(!d.reason.chars().any(char::is_control), "{:?}", d.reason);
}

// ---------------------------------------------------------------------------------------------
// 7. OOMSHIM_SIGNAL after the program closed and reused descriptors

#[test]
fn the_dump_signal_never_writes_into_a_file_that_reused_a_shim_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("program-file");
    let dumps = dir.path().join("dumps");
    let o = wait_with_watchdog(
        client(
            "hostile_host",
            &["closefrom", prefix.to_str().unwrap()],
            &[
                ("OOMSHIM_SIGNAL", "USR2"),
                ("OOMSHIM_DIR", dumps.to_str().unwrap()),
            ],
        ),
        Duration::from_secs(60),
    );
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    let sizes: Vec<&str> = out.lines().filter(|l| l.starts_with("file ")).collect();
    assert!(sizes.len() >= 4, "{out}");
    for l in &sizes {
        assert!(
            l.ends_with(" size 0"),
            "the shim wrote into the program's file: {out}"
        );
    }
    // And the signal still asked for its dump.
    let signal_dumps = json_files(&dumps)
        .iter()
        .filter(|p| read_dump(p).is_ok_and(|d| d.reason == "signal"))
        .count();
    assert_eq!(signal_dumps, 1, "{out}{}", text(&o.stderr));
}

// ---------------------------------------------------------------------------------------------
// 10. the dump directory after a chdir

#[test]
fn a_relative_dump_dir_is_where_the_program_started_not_where_it_chdired_to() {
    for (mode, dir_setting) in [
        ("chdir", None),
        ("chdir-early", None),
        ("chdir", Some("rel-dumps")),
        ("chdir-early", Some("rel-dumps")),
    ] {
        let base = tempfile::tempdir().unwrap();
        let start = base.path().join("start");
        let elsewhere = base.path().join("elsewhere");
        fs::create_dir(&start).unwrap();
        fs::create_dir(&elsewhere).unwrap();
        let mut env = vec![("SIMCUDA_CAPACITY", "1G")];
        if let Some(d) = dir_setting {
            env.push(("OOMSHIM_DIR", d));
        }
        let mut cmd = client("hostile_host", &[mode, elsewhere.to_str().unwrap()], &env);
        cmd.current_dir(&start);
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        assert!(o.status.success(), "{}", text(&o.stderr));
        let name = dir_setting.unwrap_or("oomshim-dumps");
        let want = start.join(name);
        let got = json_files(&want);
        assert_eq!(got.len(), 1, "{mode} {dir_setting:?}: {}", text(&o.stderr));
        assert!(
            fs::read_dir(&elsewhere).unwrap().next().is_none(),
            "{mode}: dumps went to the directory the program moved to"
        );
        // stderr names the dump by its absolute path.
        assert!(
            text(&o.stderr).contains(&got[0].display().to_string()),
            "{}",
            text(&o.stderr)
        );
    }
}
