//! The CLI as a user meets it: where it finds its library, and what its help teaches.

use crate::common;

use std::process::Command;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs a command whose program this process just wrote ([`cli_copy`]). Another test thread may
/// fork while the copy's descriptor is open, and its child holds that descriptor until it execs:
/// running the copy then fails with ETXTBSY ("Text file busy") for that moment. Retried, as
/// the kernel offers nothing better.
fn output_of_copy(cmd: &mut Command) -> std::process::Output {
    let mut tries = 0;
    loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 200 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
}

/// A copy of the CLI in a fresh directory, as `cargo run` or an install leaves it.
fn cli_copy(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join("oomshim");
    std::fs::copy(env!("CARGO_BIN_EXE_oomshim"), &exe).unwrap();
    exe
}

#[test]
fn without_a_library_the_error_names_every_place_tried() {
    let t = tempfile::tempdir().unwrap();
    let exe = cli_copy(&t.path().join("bin"));
    let out = output_of_copy(
        Command::new(&exe)
            .args(["demo", "--dir"])
            .arg(t.path().join("dumps"))
            .env_remove("OOMSHIM_LIB"),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    for place in [
        "OOMSHIM_LIB (unset)".to_string(),
        t.path().join("bin/liboomshim.so").display().to_string(),
        t.path()
            .join("bin/deps/liboomshim.so")
            .display()
            .to_string(),
        "site-packages/oomshim/liboomshim.so".to_string(),
    ] {
        assert!(err.contains(&place), "{place} missing: {err}");
    }
}

#[test]
fn cargo_runs_layout_and_oomshim_lib_both_work() {
    let t = tempfile::tempdir().unwrap();
    let exe = cli_copy(&t.path().join("release"));
    // `cargo run` leaves the cdylib only in deps/.
    let deps = t.path().join("release/deps");
    std::fs::create_dir_all(&deps).unwrap();
    std::fs::copy(common::shim_lib(), deps.join("liboomshim.so")).unwrap();
    let out = output_of_copy(
        Command::new(&exe)
            .args(["demo", "--dir"])
            .arg(t.path().join("dumps"))
            .env_remove("OOMSHIM_LIB"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("leak"));

    // OOMSHIM_LIB names the library for a CLI that has none beside it; a wrong one is an error.
    let bare = cli_copy(&t.path().join("elsewhere"));
    let out = output_of_copy(
        Command::new(&bare)
            .args(["demo", "--dir"])
            .arg(t.path().join("dumps2"))
            .env("OOMSHIM_LIB", common::shim_lib()),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output_of_copy(
        Command::new(&bare)
            .arg("demo")
            .env("OOMSHIM_LIB", t.path().join("missing.so")),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("does not name a file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_env_lists_every_setting_with_its_default() {
    for args in [&["help", "env"][..], &["env"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        for s in oomshim_core::config::SETTINGS {
            assert!(
                text.contains(&format!("{}  (default: {})", s.name, s.default)),
                "{args:?}: {} missing",
                s.name
            );
        }
    }
    // The run help points there.
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("oomshim help env"));
}

#[test]
fn report_of_a_directory_reports_its_newest_dump() {
    let t = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let old = t.path().join("oomshim-host-1-1.json");
    let new = t.path().join("oomshim-host-2-1.json");
    std::fs::copy(fixtures.join("oom_untracked.json"), &old).unwrap();
    std::fs::copy(fixtures.join("oom_fragmentation.json"), &new).unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // torch's side file is newer still, and not a dump.
    std::fs::write(t.path().join("oomshim-torch-host-2-1.json"), "{}").unwrap();
    let report = |p: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(["report", "--json"])
            .arg(p)
            .output()
            .unwrap()
    };
    let out = report(t.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let of_dir: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let of_file: serde_json::Value = serde_json::from_slice(&report(&new).stdout).unwrap();
    assert_eq!(of_dir, of_file);
    assert!(
        stderr(&out).contains(&new.display().to_string()),
        "{}",
        stderr(&out)
    );

    let empty = tempfile::tempdir().unwrap();
    let out = report(empty.path());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "oomshim: error: no oomshim dumps (oomshim-*.json) in {}",
            empty.path().display()
        )
    );
}

/// Issue 27: `oomshim` alone asks for nothing wrong: it prints the help (with the examples) on
/// stdout and exits 0; a report of zero holders is refused by the argument parser, not rendered.
#[test]
fn oomshim_alone_prints_help_and_top_zero_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Usage: oomshim"), "{text}");
    assert!(text.contains("oomshim demo"), "{text}");
    for args in [
        &["report", "x.json", "--top", "0"][..],
        &["diff", "a.json", "b.json", "--top", "0"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains("--top"), "{args:?}: {}", stderr(&out));
    }
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn set_age(path: &std::path::Path, secs: u64) {
    let t = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

fn oomshim(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .args(args)
        .output()
        .unwrap()
}

/// Issue 27: every command that takes a dump takes a directory (report, diff, export), and
/// reads its newest *readable* dump: a newer broken one (cut short by a full disk) is skipped
/// and named on stderr, as `merge` lists it under "Not read", instead of failing the command.
#[test]
fn a_directory_stands_for_its_newest_readable_dump_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let good = t.path().join("oomshim-host-1-1.json");
    std::fs::copy(fixture("oom_fragmentation.json"), &good).unwrap();
    set_age(&good, 3600);
    let broken = t.path().join("oomshim-host-2-1.json");
    let text = std::fs::read_to_string(fixture("oom_untracked.json")).unwrap();
    std::fs::write(&broken, &text[..text.len() / 2]).unwrap();
    let dir = t.path().as_os_str();

    let out = oomshim(&["report".as_ref(), "--json".as_ref(), dir]);
    assert!(out.status.success(), "{}", stderr(&out));
    let of_file = oomshim(&["report".as_ref(), "--json".as_ref(), good.as_os_str()]);
    assert_eq!(out.stdout, of_file.stdout);
    let err = stderr(&out);
    assert!(
        err.contains("skipped a broken dump") && err.contains(&broken.display().to_string()),
        "{err}"
    );
    assert!(
        err.contains(&format!("newest readable dump in {}", t.path().display()))
            && err.contains(&good.display().to_string()),
        "{err}"
    );

    // diff: two directories (or a directory and a file).
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("oom_untracked.json"),
        other.path().join("oomshim-h-3-1.json"),
    )
    .unwrap();
    let out = oomshim(&["diff".as_ref(), dir, other.path().as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Devices (tracked bytes)"));
    assert!(
        stderr(&out).contains("skipped a broken dump"),
        "{}",
        stderr(&out)
    );

    // export: both formats.
    let out = oomshim(&["export".as_ref(), dir, "--folded".as_ref(), "-".as_ref()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let of_file = oomshim(&[
        "export".as_ref(),
        good.as_os_str(),
        "--folded".as_ref(),
        "-".as_ref(),
    ]);
    assert_eq!(out.stdout, of_file.stdout);
    assert!(!out.stdout.is_empty());
    let pickle = t.path().join("x.pickle");
    let out = oomshim(&[
        "export".as_ref(),
        dir,
        "--memory-viz".as_ref(),
        pickle.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(pickle.is_file());

    // Nothing readable: one error naming how many were broken and the newest's problem.
    std::fs::remove_file(&good).unwrap();
    let out = oomshim(&["report".as_ref(), dir]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no readable oomshim dump in")
            && err.contains("1 dump unreadable")
            && err.contains(&broken.display().to_string()),
        "{err}"
    );
}

/// Issue 27: `export` without a format says which formats there are, both of them.
#[test]
fn export_without_a_format_names_both_formats() {
    let out = oomshim(&["export".as_ref(), fixture("snapshot.json").as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("--memory-viz") && err.contains("--folded"),
        "{err}"
    );
}

/// A region file of a process that is gone: this process's pid with a start time it never had.
fn gone_region(live: &std::path::Path) -> std::path::PathBuf {
    let p = live.join(format!("{}-1.live", std::process::id()));
    std::fs::write(&p, b"").unwrap();
    p
}

/// Issue 27: `top --prune` removes the regions that processes which died left behind (once
/// they have been idle for the grace period `oomshim run` needs to read them), and only those.
#[test]
fn top_prune_removes_the_regions_of_gone_processes_only() {
    let live = tempfile::tempdir().unwrap();
    let old = gone_region(live.path());
    set_age(&old, 60);
    let fresh = live.path().join(format!("{}-2.live", std::process::id()));
    std::fs::write(&fresh, b"").unwrap();
    let not_a_region = live.path().join("notes.txt");
    std::fs::write(&not_a_region, b"keep").unwrap();
    let top = |prune: bool| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "top".as_ref(),
            "--once".as_ref(),
            "--dir".as_ref(),
            live.path().as_os_str(),
        ];
        if prune {
            args.push("--prune".as_ref());
        }
        oomshim(&args)
    };
    let out = top(false);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("--prune removes it"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(old.exists(), "no pruning unless asked");
    let out = top(true);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "pruned the region of gone pid {}",
            std::process::id()
        )),
        "{text}"
    );
    assert!(!old.exists(), "{text}");
    assert!(
        fresh.exists(),
        "a region written within the grace period stays: {text}"
    );
    assert!(not_a_region.exists());
}

/// A pseudo-terminal for a child's standard streams: (master, slave path).
fn pty() -> (std::fs::File, std::path::PathBuf) {
    use std::os::fd::FromRawFd;
    // SAFETY: the pty calls take the master descriptor just opened (checked); `ptsname_r`
    // writes a NUL-terminated name into the local buffer of the length given, read as a C
    // string after its success; the master is then owned by the File alone.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        (std::fs::File::from_raw_fd(m), path.into())
    }
}

/// Reads what the child wrote to the terminal until `want` appears (or 20 s pass).
fn read_until(master: &mut std::fs::File, want: &str) -> String {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let mut fds = libc::pollfd {
            fd: master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `poll` of one local `pollfd`, count 1.
        if unsafe { libc::poll(&mut fds, 1, 200) } > 0 {
            let mut buf = [0u8; 4096];
            match master.read(&mut buf) {
                Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        if String::from_utf8_lossy(&seen).contains(want) {
            break;
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

fn wait_for(child: &mut std::process::Child, secs: u64) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Whether the terminal has line editing and echo on, as a shell leaves it.
fn cooked(slave: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: `termios` is plain data, for which all zeroes is a valid value.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `tcgetattr` writes only the local `termios`.
    assert_eq!(unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut t) }, 0);
    t.c_lflag & (libc::ICANON | libc::ECHO) == (libc::ICANON | libc::ECHO)
}

/// Issue 27: the live `top` shows its keys and quits on `q` (not only Ctrl-C), leaving the
/// terminal as it found it; a SIGTERM leaves it restored too.
#[test]
fn top_shows_its_keys_quits_on_q_and_restores_the_terminal() {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    let live = tempfile::tempdir().unwrap();
    for how in ["q", "TERM"] {
        let (mut master, slave_path) = pty();
        let slave = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&slave_path)
            .unwrap();
        assert!(cooked(&slave));
        let mut child = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(["top", "--dir"])
            .arg(live.path())
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap())
            .spawn()
            .unwrap();
        let shown = read_until(&mut master, "q quit");
        assert!(shown.contains("keys: q quit"), "{how}: {shown}");
        assert!(
            !cooked(&slave),
            "{how}: keys are read one at a time while it runs"
        );
        if how == "q" {
            master.write_all(b"q").unwrap();
        } else {
            // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let status = wait_for(&mut child, 10).unwrap_or_else(|| panic!("{how}: did not quit"));
        match how {
            "q" => assert_eq!(status.code(), Some(0), "{status:?}"),
            _ => assert_eq!(
                (status.code(), status.signal()),
                (Some(128 + libc::SIGTERM), None),
                "{status:?}"
            ),
        }
        assert!(cooked(&slave), "{how}: the terminal is restored");
    }
}
