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
        String::from_utf8_lossy(&out.stdout).contains("--prune removes them"),
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

/// A directory holding two dumps of the fixtures, the newer one `oom_leak_steps`, as
/// `DIR/oomshim-dumps/`; returns DIR and the two dumps (older, newer).
fn dumps_here() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dumps = t.path().join("oomshim-dumps");
    std::fs::create_dir(&dumps).unwrap();
    let older = dumps.join("oomshim-host-7-1.json");
    let newer = dumps.join("oomshim-host-7-2.json");
    std::fs::copy(fixture("oom_untracked.json"), &older).unwrap();
    std::fs::copy(fixture("oom_leak_steps.json"), &newer).unwrap();
    set_age(&older, 3600);
    (t, older, newer)
}

fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .args(args)
        .current_dir(dir)
        .env_remove("OOMSHIM_DIR")
        .output()
        .unwrap()
}

/// Everything writes to ./oomshim-dumps, so `report` and `diff` read it when no dump is
/// named, and `report .` (the directory the program ran in) finds it too.
#[test]
fn report_and_diff_read_oomshim_dumps_when_no_dump_is_named() {
    let (t, older, newer) = dumps_here();
    let expected = run_in(t.path(), &["report", "--json", newer.to_str().unwrap()]);
    assert!(expected.status.success(), "{}", stderr(&expected));
    for args in [&["report", "--json"][..], &["report", "--json", "."][..]] {
        let out = run_in(t.path(), args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(out.stdout, expected.stdout, "{args:?}");
    }
    // diff: none named, or the directory alone, compares its two newest, older first.
    let expected = run_in(
        t.path(),
        &[
            "diff",
            "--json",
            older.to_str().unwrap(),
            newer.to_str().unwrap(),
        ],
    );
    assert!(expected.status.success(), "{}", stderr(&expected));
    for args in [
        &["diff", "--json"][..],
        &["diff", "--json", "oomshim-dumps"][..],
    ] {
        let out = run_in(t.path(), args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(out.stdout, expected.stdout, "{args:?}");
        assert!(
            stderr(&out).contains("comparing the two newest dumps"),
            "{}",
            stderr(&out)
        );
    }
    // Nowhere to look: a sentence, not a usage error.
    let empty = tempfile::tempdir().unwrap();
    let out = run_in(empty.path(), &["report"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        "oomshim: error: no dump named and no oomshim-dumps here: name a dump file or a directory of dumps"
    );
}

/// A dump compared with itself shows nothing: refused with a sentence that says what to do.
#[test]
fn diff_of_a_dump_with_itself_is_refused() {
    let (t, _, newer) = dumps_here();
    for args in [
        &["diff", "oomshim-dumps", "oomshim-dumps"][..],
        &[
            "diff",
            newer.to_str().unwrap(),
            "oomshim-dumps/oomshim-host-7-2.json",
        ][..],
    ] {
        let out = run_in(t.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("are the same dump") && err.contains("name two dumps"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
    let out = run_in(t.path(), &["diff", newer.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("diff compares two dumps"),
        "{}",
        stderr(&out)
    );
}

/// `-` is stdout for every output flag: no file named `-` appears.
#[test]
fn a_dash_means_stdout_for_every_output_flag() {
    let (t, _, newer) = dumps_here();
    let dump = newer.to_str().unwrap();
    let out = run_in(t.path(), &["report", dump, "--html", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        out.stdout.starts_with(b"<!DOCTYPE html>"),
        "{}",
        stderr(&out)
    );
    let out = run_in(t.path(), &["export", dump, "--memory-viz", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        out.stdout.first(),
        Some(&0x80),
        "a pickle (protocol opcode) on stdout"
    );
    let out = run_in(t.path(), &["export", dump, "--folded", "-"]);
    assert!(
        out.status.success() && !out.stdout.is_empty(),
        "{}",
        stderr(&out)
    );
    let out = run_in(
        t.path(),
        &["export", dump, "--folded", "-", "--memory-viz", "-"],
    );
    assert_eq!(out.status.code(), Some(2), "two outputs on one stdout");
    assert!(!t.path().join("-").exists(), "a file named -");
}

/// The demo reports its dump wherever the shim put it: a directory it cannot write sends the
/// dumps to the private fallback of $TMPDIR, and the demo says so and reports them.
#[test]
fn the_demo_reports_its_dump_wherever_the_shim_put_it() {
    let t = tempfile::tempdir().unwrap();
    let tmp = t.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // /proc refuses new directories even to root.
    let out = common::cli()
        .args(["demo", "--dir", "/proc/oomshim-unwritable"])
        .env("TMPDIR", &tmp)
        .current_dir(t.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let fallback = tmp.join(format!("oomshim-{}", unsafe { libc::geteuid() }));
    assert!(
        err.contains(&format!(
            "could not write to /proc/oomshim-unwritable and put its dumps in {}",
            fallback.display()
        )),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Verdict: leak"),
        "{err}"
    );
    assert_eq!(common::dump_files(&fallback).len(), 2);
}

/// `--lib` is checked before the program starts: a file that is not oomshim's shim is refused
/// in one line with status 125, and the program never runs.
#[test]
fn run_checks_its_library_before_the_program_starts() {
    let t = tempfile::tempdir().unwrap();
    let notes = t.path().join("notjson.txt");
    std::fs::write(&notes, "not a library\n").unwrap();
    let marker = t.path().join("ran");
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_file());
    let mut cases = vec![
        (notes.clone(), "not a shared library (no ELF header)"),
        // A position-independent executable is an ELF shared object too.
        (std::path::PathBuf::from("/bin/true"), "not oomshim's shim"),
    ];
    if let Some(libm) = libm {
        cases.push((libm, "not oomshim's shim (it does not export oomshim_dump"));
    }
    for (lib, why) in cases {
        let out = common::cli()
            .arg("run")
            .arg("--lib")
            .arg(&lib)
            .args(["--", "sh", "-c"])
            .arg(format!("touch {}", marker.display()))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(125),
            "{}: {}",
            lib.display(),
            stderr(&out)
        );
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(why) && err.contains("--lib"),
            "{}: {err}",
            lib.display()
        );
        assert!(!marker.exists(), "the program ran with {}", lib.display());
    }
    // The shim itself passes.
    let out = common::cli()
        .arg("run")
        .arg("--lib")
        .arg(common::shim_lib())
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}", marker.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(marker.exists());
}

/// Numeric flags say their range in words, not `1..18446744073709551615`.
#[test]
fn numeric_flags_say_their_range_in_words() {
    for (args, range) in [
        (
            &["report", "x.json", "--top", "0"][..],
            "a whole number from 1 to 100,000",
        ),
        (
            &["diff", "--top", "100001"][..],
            "a whole number from 1 to 100,000",
        ),
        (
            &["report", "--width", "20"][..],
            "a whole number from 60 to 400",
        ),
        (
            &["merge", "d", "--clock-skew-ms", "3600001"][..],
            "a whole number from 0 to 3,600,000",
        ),
        (
            &["report", "--top", "ten"][..],
            "ten is not a whole number from 1 to 100,000",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(range), "{args:?}: {err}");
        assert!(!err.contains("18446744073709551615"), "{args:?}: {err}");
    }
}

/// Each option's help says its default once (clap's `[default: …]` or the text, never both),
/// and the help promises only what each launcher gives: free blocks need PyTorch.
#[test]
fn help_shows_each_default_once_and_promises_what_is_true() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for sub in [
        "run", "report", "diff", "export", "merge", "top", "exporter", "demo",
    ] {
        let text = help(&[sub]);
        // One option's help runs from its `--flag` line to the next option.
        let options = text.split("\n  -").skip(1);
        for option in options {
            let option = option.split("\n\n").next().unwrap_or(option);
            let n = option.to_lowercase().matches("default").count();
            assert!(n <= 1, "oomshim {sub}: a default said twice in {option:?}");
        }
    }
    let root = help(&[]);
    let flat = root.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("With PyTorch it adds torch's free blocks"),
        "{root}"
    );
    assert!(
        !flat.contains("the allocation sites, the free blocks"),
        "{root}"
    );
}

/// Reports show stack files from the program's source root; the JSON keeps them absolute.
#[test]
fn reports_show_paths_from_the_source_root_and_json_keeps_them_whole() {
    let t = tempfile::tempdir().unwrap();
    let out = common::cli()
        .arg("demo")
        .current_dir(t.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = run_in(t.path(), &["report"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("forward_layer (demo_train.c:76)"), "{text}");
    assert!(!text.contains("tests/clients/demo_train.c"), "{text}");
    let json = run_in(t.path(), &["report", "--json"]);
    let json = String::from_utf8_lossy(&json.stdout).into_owned();
    let absolute = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients/demo_train.c")
        .display()
        .to_string();
    assert!(json.contains(&absolute), "the JSON keeps {absolute}");
}
