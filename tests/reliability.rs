//! Issue 8, reliability and security: fork from a multithreaded program, concurrency at scale,
//! faults while writing a dump (full disk, planted symlinks, a file where the directory should be),
//! dump permissions and shared directories, hostile input to the CLI. See RELIABILITY.md.

mod common;

use common::{shim_lib, wait_with_watchdog};
use oomshim::dump::model::Dump;
use oomshim::dump::read::read_dump;
use oomshim::testbed;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn client_cmd(name: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(testbed::client(name));
    cmd.args(args)
        .env_remove("LD_PRELOAD")
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

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn value_after(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .map(|v| v.split_whitespace().next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no `{key}` in output:\n{text}"))
}

/// Every entry of `dir` (names), sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn dumps(dir: &Path) -> Vec<(PathBuf, Dump)> {
    entries(dir)
        .into_iter()
        .filter(|n| n.ends_with(".json"))
        .map(|n| {
            let p = dir.join(&n);
            let d = read_dump(&p).unwrap_or_else(|e| panic!("{n}: {e}"));
            (p, d)
        })
        .collect()
}

fn has_frame(d: &oomshim::dump::model::Site, function: &str) -> bool {
    d.stack
        .iter()
        .any(|f| f.function.as_deref() == Some(function))
}

// ---------------------------------------------------------------------------------------------
// 1. fork

#[test]
fn fork_while_other_threads_allocate_never_deadlocks_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("SIMCUDA_CAPACITY", "2G"),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    let cmd = client_cmd("rel_fork", &["40", "3", "2"], &env); // builds liboomshim.so first
    let start = Instant::now();
    let o = wait_with_watchdog(cmd, Duration::from_secs(120));
    let text = out(&o);
    assert!(o.status.success(), "{}\n{text}", err(&o));
    assert_eq!(value_after(&text, "forks_ok "), 45, "{text}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "forks took {:?}",
        start.elapsed()
    );

    let all = dumps(dir.path());
    // Parent: its own 1 TiB failure. Fillers: one OOM dump each. Exec'd children: one on-demand.
    let fillers: Vec<(u32, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("child_fill "))
        .map(|l| {
            let mut it = l.split_whitespace().map(|x| x.parse::<u64>().unwrap());
            (it.next().unwrap() as u32, it.next().unwrap())
        })
        .collect();
    assert_eq!(fillers.len(), 3, "{text}");
    for (pid, n) in &fillers {
        let mine: Vec<&Dump> = all
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d.process.pid == *pid)
            .collect();
        assert_eq!(mine.len(), 1, "child {pid} wrote {} dumps", mine.len());
        let d = mine[0];
        assert_eq!(d.reason, "oom");
        let req = d.failed_request.as_ref().expect("failed request");
        assert_eq!(req.bytes, 64 * MIB);
        // Exactly the child's own buffers at its own site: no burst, job or lock of the parent's.
        assert_eq!(req.failures_in_burst, 1);
        let site: Vec<_> = d
            .sites
            .iter()
            .filter(|s| has_frame(s, "child_fill"))
            .collect();
        assert_eq!(site.len(), 1, "{:?}", d.sites);
        assert_eq!(site[0].count, *n);
        assert_eq!(site[0].bytes, n * 64 * MIB);
    }
    let execs: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("exec_child "))
        .map(|l| {
            assert!(l.ends_with("dump_rc 0"), "{l}");
            l.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(execs.len(), 2, "{text}");
    for pid in execs {
        let d: Vec<&Dump> = all
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d.process.pid == pid)
            .collect();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].reason, "exec-child");
        let tracked: u64 = d[0].devices.iter().map(|x| x.tracked_bytes).sum();
        assert_eq!(tracked, 6 * MIB, "only the exec'd program's own buffers");
    }
    // No temporary file left anywhere.
    assert!(entries(dir.path()).iter().all(|n| n.ends_with(".json")));
}

// ---------------------------------------------------------------------------------------------
// 2. concurrency at scale

/// Per-thread iterations: `OOMSHIM_REL_ITERS`, else the full 1,000,000 (16 million
/// allocate/free pairs take about 5 s on 2 cores; RELIABILITY.md has the timings).
fn churn_iters() -> String {
    std::env::var("OOMSHIM_REL_ITERS").unwrap_or_else(|_| "1000000".to_string())
}

#[test]
fn sixteen_threads_six_apis_dumps_and_ooms_leave_an_exact_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let iters = churn_iters();
    let env = [
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_MIN_INTERVAL", "100ms"),
        ("OOMSHIM_SETTLE", "0"),
    ];
    let cmd = client_cmd("rel_churn", &[&iters], &env); // builds liboomshim.so first
    let start = Instant::now();
    let o = wait_with_watchdog(cmd, Duration::from_secs(600));
    let took = start.elapsed();
    let text = out(&o);
    assert!(o.status.success(), "{}\n{text}", err(&o));
    eprintln!("rel_churn {iters}: {took:?}\n{text}");
    assert_eq!(value_after(&text, "dump_rc "), 0);
    assert!(value_after(&text, "ooms ") > 0, "{text}");
    let all = dumps(dir.path());
    let end: Vec<&Dump> = all
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d.reason == "churn-end")
        .collect();
    assert_eq!(end.len(), 1);
    let d = end[0];
    let tracked: u64 = d.devices.iter().map(|x| x.tracked_bytes).sum();
    let count: u64 = d.devices.iter().map(|x| x.tracked_count).sum();
    assert_eq!(tracked, value_after(&text, "held_bytes "));
    assert_eq!(count, value_after(&text, "held_count "));
    assert_eq!(d.pinned_host.bytes, value_after(&text, "pinned_bytes "));
    assert_eq!(d.pinned_host.count, value_after(&text, "pinned_count "));
    assert_eq!(d.recording.unknown_frees, 0);
    let n: u64 = iters.parse().unwrap();
    assert!(d.recording.total_allocations >= 16 * n);
    // Every dump written meanwhile parses (on-demand and OOM alike).
    assert!(all.iter().any(|(_, d)| d.reason == "oom"));
    assert!(entries(dir.path()).iter().all(|n| n.ends_with(".json")));
}

// ---------------------------------------------------------------------------------------------
// 3. faults while writing a dump

fn uid() -> u32 {
    unsafe { libc::geteuid() }
}

/// `leak_until_oom` with and without the shim under `rlimit_fsize` (bytes, when set): the
/// program's output and status must be the same.
fn leak_both(env: &[(&str, &str)], rlimit_fsize: Option<u64>) -> (Output, Output) {
    let mk = |with_shim: bool| {
        let mut cmd = client_cmd("leak_until_oom", &[], env);
        cmd.env("SIMCUDA_CAPACITY", "1G");
        if !with_shim {
            cmd.env_remove("LD_PRELOAD");
        }
        if let Some(limit) = rlimit_fsize {
            unsafe {
                cmd.pre_exec(move || {
                    let rl = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        wait_with_watchdog(cmd, Duration::from_secs(120))
    };
    let bare = mk(false);
    let shim = mk(true);
    assert_eq!(out(&bare), out(&shim));
    assert_eq!(bare.status.code(), shim.status.code(), "{}", err(&shim));
    assert_eq!(shim.status.code(), Some(0), "{}", err(&shim));
    (bare, shim)
}

#[test]
fn a_full_disk_by_rlimit_fsize_leaves_no_partial_dump_and_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let env = [
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ];
    // SIGXFSZ's default action kills the process: the shim must hold it off and see EFBIG.
    let (_, shim) = leak_both(&env, Some(2000));
    let e = err(&shim);
    assert_eq!(e.matches("no dump written").count(), 1, "{e}");
    assert!(e.contains("File too large"), "{e}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    let fallback = tmp.path().join(format!("oomshim-{}", uid()));
    assert_eq!(entries(&fallback), Vec::<String>::new());
}

#[test]
fn a_full_tmpfs_leaves_no_partial_dump_and_one_message() {
    if uid() != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = mnt.path().to_str().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8k,mode=0755", "oomshim-full", m])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount<'a>(&'a str);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(m);
    let env = [("OOMSHIM_DIR", m), ("TMPDIR", m)];
    let (_, shim) = leak_both(&env, None);
    let e = err(&shim);
    assert_eq!(e.matches("no dump written").count(), 1, "{e}");
    assert!(e.contains("No space left"), "{e}");
    let fallback = mnt.path().join(format!("oomshim-{}", uid()));
    let mut left = entries(mnt.path());
    left.extend(entries(&fallback));
    assert!(
        left.iter().all(|n| n == &format!("oomshim-{}", uid())),
        "{left:?}"
    );
}

#[test]
fn a_symlink_planted_at_the_dump_directory_by_another_user_is_not_followed() {
    if uid() != 0 {
        eprintln!("skipped: planting another user's symlink needs root");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let shared = base.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = base.path().join("victim");
    fs::create_dir(&victim).unwrap();
    let planted = shared.join("dumps");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let env = [
        ("OOMSHIM_DIR", planted.to_str().unwrap()),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ];
    let (_, shim) = leak_both(&env, None);
    assert_eq!(
        entries(&victim),
        Vec::<String>::new(),
        "the symlink was followed"
    );
    let e = err(&shim);
    assert!(e.contains("symlink owned by another user"), "{e}");
    let fallback = tmp.path().join(format!("oomshim-{}", uid()));
    assert_eq!(dumps(&fallback).len(), 1);
}

#[test]
fn a_file_where_the_dump_directory_should_be_falls_back_with_one_message() {
    let base = tempfile::tempdir().unwrap();
    let file = base.path().join("a-file");
    fs::write(&file, b"keep").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let env = [
        ("OOMSHIM_DIR", file.to_str().unwrap()),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ];
    let (_, shim) = leak_both(&env, None);
    assert_eq!(fs::read(&file).unwrap(), b"keep");
    let e = err(&shim);
    assert_eq!(e.matches("writing dumps to").count(), 1, "{e}");
    let fallback = tmp.path().join(format!("oomshim-{}", uid()));
    assert_eq!(dumps(&fallback).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// 4. security of dumps

#[test]
fn a_shared_sticky_directory_gets_a_private_per_user_subdirectory() {
    let base = tempfile::tempdir().unwrap();
    let shared = base.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let env = [
        ("OOMSHIM_DIR", shared.to_str().unwrap()),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ];
    let (_, shim) = leak_both(&env, None);
    let private = shared.join(format!("oomshim-{}", uid()));
    assert_eq!(entries(&shared), vec![format!("oomshim-{}", uid())]);
    let meta = fs::symlink_metadata(&private).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o777, 0o700);
    assert_eq!(meta.uid(), uid());
    let written = dumps(&private);
    assert_eq!(written.len(), 1, "{}", err(&shim));
    let mode = fs::metadata(&written[0].0).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!err(&shim).contains("instead"), "no fallback message");

    // Another user's directory planted at that name is refused: the dump goes to the fallback.
    if uid() == 0 {
        let base = tempfile::tempdir().unwrap();
        let shared = base.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let planted = shared.join(format!("oomshim-{}", uid()));
        fs::create_dir(&planted).unwrap();
        std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
        let env = [
            ("OOMSHIM_DIR", shared.to_str().unwrap()),
            ("TMPDIR", tmp.path().to_str().unwrap()),
        ];
        let (_, shim) = leak_both(&env, None);
        assert_eq!(entries(&planted), Vec::<String>::new());
        assert!(
            err(&shim).contains("not a directory owned by this user"),
            "{}",
            err(&shim)
        );
        assert_eq!(
            dumps(&tmp.path().join(format!("oomshim-{}", uid()))).len(),
            1
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. hostile input to the CLI

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oomshim"));
    c.env_remove("LD_PRELOAD");
    c
}

/// Every subcommand that reads one dump, given `bad`: exit 2 and one line on stderr naming it.
fn every_reader_rejects(bad: &Path, good: &Path, scratch: &Path) {
    let html = scratch.join("out.html");
    let pickle = scratch.join("out.pickle");
    let runs: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["report".into(), bad.into()],
        vec!["report".into(), bad.into(), "--json".into()],
        vec![
            "report".into(),
            bad.into(),
            "--html".into(),
            html.clone().into(),
        ],
        vec!["diff".into(), bad.into(), good.into()],
        vec!["diff".into(), good.into(), bad.into()],
        vec![
            "export".into(),
            bad.into(),
            "--memory-viz".into(),
            pickle.clone().into(),
        ],
    ];
    for args in runs {
        let mut cmd = cli();
        cmd.args(&args).stdin(Stdio::null());
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let o = wait_with_watchdog(cmd, Duration::from_secs(60));
        let e = err(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
        let name = bad.file_name().unwrap().to_str().unwrap();
        assert!(e.contains(name), "{args:?}: {e}");
        assert!(!html.exists() && !pickle.exists(), "{args:?} left output");
    }
}

#[test]
fn huge_truncated_nested_wrong_typed_and_wrong_schema_files_exit_2_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let dumps_dir = dir.path().join("dumps");
    let env = [("OOMSHIM_DIR", dumps_dir.to_str().unwrap())];
    leak_both(&env, None);
    let good = dumps(&dumps_dir).remove(0).0;
    let text = fs::read_to_string(&good).unwrap();
    let scratch = dir.path().join("scratch");
    fs::create_dir(&scratch).unwrap();

    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty.json", vec![]),
        ("truncated.json", text.as_bytes()[..text.len() / 2].to_vec()),
        ("binary.json", (0..=255u8).cycle().take(4096).collect()),
        (
            "nested.json",
            format!(
                "{{\"schema\":\"oomshim.dump/1\",\"x\":{}{}}}",
                "[".repeat(100_000),
                "]".repeat(100_000)
            )
            .into_bytes(),
        ),
        ("nested-bare.json", "[".repeat(1_000_000).into_bytes()),
        (
            "wrong-schema.json",
            text.replace("oomshim.dump/1", "oomshim.dump/99")
                .into_bytes(),
        ),
        ("no-schema.json", b"{\"reason\": \"oom\"}".to_vec()),
        ("array.json", b"[1, 2, 3]".to_vec()),
        (
            "wrong-type.json",
            text.replacen("\"reason\": \"", "\"reason\": 7, \"x\": \"", 1)
                .into_bytes(),
        ),
        (
            "negative.json",
            text.replacen("\"pid\": ", "\"pid\": -", 1).into_bytes(),
        ),
        ("nul.json", b"{\"schema\":\"oomshim.dump/1\"\0}".to_vec()),
    ];
    // A UTF-8 mess inside strings must not panic either (invalid UTF-8).
    let mut bad_utf8 = text.as_bytes().to_vec();
    if let Some(i) = text.find("leaky_cache_grow") {
        bad_utf8[i] = 0xff;
    }
    cases.push(("bad-utf8.json", bad_utf8));
    for (name, bytes) in &cases {
        let p = dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        every_reader_rejects(&p, &good, &scratch);
    }
    // Over the 1 GiB limit: refused before reading (a sparse file, nothing is really written).
    let huge = dir.path().join("huge.json");
    let f = fs::File::create(&huge).unwrap();
    f.set_len(oomshim::dump::read::MAX_DUMP_BYTES + 1).unwrap();
    every_reader_rejects(&huge, &good, &scratch);
    // A directory and a missing file.
    every_reader_rejects(&scratch, &good, &dir.path().join("s2"));
    every_reader_rejects(&dir.path().join("missing.json"), &good, &scratch);

    // merge: the broken files are listed, the good one is merged, nothing crashes.
    let mixed = dir.path().join("mixed");
    fs::create_dir(&mixed).unwrap();
    fs::copy(&good, mixed.join("good.json")).unwrap();
    for (name, bytes) in &cases {
        fs::write(mixed.join(name), bytes).unwrap();
    }
    let o = cli().arg("merge").arg(&mixed).output().unwrap();
    assert!(o.status.code().is_some(), "merge crashed: {o:?}");
    let all = format!("{}{}", out(&o), err(&o));
    assert!(all.contains("truncated.json"), "{all}");
}
