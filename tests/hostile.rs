//! Issue 14: hostile neighbours, odd file descriptors and broken pipes. Each test reproduces an
//! attack (a planted file or directory, a hostile dump) or an accident (a closed stderr, a dead
//! log reader, a chdir, a full disk) against the CLI or the shim; see RELIABILITY.md section 9.

mod common;

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

use oomshim::dump::read::read_dump;
use std::ffi::CString;

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
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
    let dump: oomshim::dump::model::Dump = read_dump(&fixture("oom_own_allocations.json")).unwrap();
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
        text(&o.stdout).starts_with("1 dump(s)"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn a_torch_side_file_that_links_elsewhere_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let dump: oomshim::dump::model::Dump = read_dump(&fixture("oom_own_allocations.json")).unwrap();
    let good = dir.path().join("oomshim-good.json");
    fs::copy(fixture("oom_own_allocations.json"), &good).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("cache.json");
    let side = json!({
        "schema": "oomshim.torch/1", "pid": dump.process.pid, "host": dump.process.host,
        "device": 0, "request_bytes": 1, "time_unix_ms": dump.time_unix_ms,
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
