//! Issue 8, reliability and security: fork from a multithreaded program, concurrency at scale,
//! faults while writing a dump (full disk, planted symlinks, a file where the directory should be),
//! dump permissions and shared directories, hostile input to the CLI. See RELIABILITY.md.

use crate::common;

use common::{cli, shim_lib, wait_with_watchdog};
use dump::model::Dump;
use dump::read::read_dump;
use oomshim_cli::testbed;
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

fn has_frame(d: &dump::model::Site, function: &str) -> bool {
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
    // 40 DataLoader-like children, 3 that fill the device, 2 that exec, 20 that meet every lock.
    let args = ["40", "3", "2", "20"];
    // The same forks without the shim first: how long they take on this machine now. A child
    // that deadlocks dies of its alarm (forks_ok below); what the time bound catches is a
    // shim that makes forks slow without deadlocking (a child waiting out a timed lock, say).
    // A fixed 30 s bound failed on a 2-core runner at load 12-18 (38.8 s) where nothing was
    // wrong: the bound is now 30 s or ten times the bare run, whichever is longer.
    // A load spike between the bare run and the shim's (the integration tests run four at a
    // time: 31 s against a 30 s bound was seen with nothing wrong) gets one more try, with the
    // bare time measured again; a shim that makes forks slow is slow both times.
    let bare_time = || {
        let mut bare = client_cmd("rel_fork", &args, &env); // builds liboomshim.so first
        bare.env_remove("LD_PRELOAD");
        let start = Instant::now();
        let o = wait_with_watchdog(bare, Duration::from_secs(120));
        assert!(o.status.success(), "bare: {}\n{}", err(&o), out(&o));
        start.elapsed()
    };
    let mut text = String::new();
    for attempt in 1..=2 {
        let limit = Duration::from_secs(30).max(bare_time() * 10);
        // Each child's alarm too: a filler child, starved by the parent's eleven busy threads on
        // a loaded 2-core runner, once met a fixed 30 s alarm (with 6 test threads at load 11).
        let alarm = limit.as_secs().to_string();
        let mut cmd = client_cmd("rel_fork", &args, &env);
        cmd.env("REL_FORK_ALARM", &alarm);
        let start = Instant::now();
        let o = wait_with_watchdog(cmd, Duration::from_secs(120).max(limit));
        let took = start.elapsed();
        text = out(&o);
        assert!(o.status.success(), "{}\n{text}", err(&o));
        // A child that copied a lock held by one of the parent's threads waits it out and says
        // so (the growth tracker's, before the fork handlers took it, stalled children 30 s and
        // more on a loaded runner): no process here may.
        assert!(
            !err(&o).contains("growth tracker's lock stayed busy"),
            "{}",
            err(&o)
        );
        assert_eq!(value_after(&text, "forks_ok "), 65, "{text}");
        if took < limit {
            break;
        }
        assert!(
            attempt < 2,
            "forks took {took:?} twice over the bound ({limit:?}, ten times the same forks without the shim)"
        );
        eprintln!("forks took {took:?} (bound {limit:?}): measured again");
        for (p, _) in dumps(dir.path()) {
            let _ = std::fs::remove_file(p);
        }
    }
    let text = text;

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
        // Allocated by the child's only thread, whose id is the child's pid (not the id of the
        // parent's forking thread, which a cached thread id would keep).
        let fill_holders: Vec<_> = d
            .largest_holders
            .iter()
            .filter(|h| {
                h.stack
                    .iter()
                    .any(|f| f.function.as_deref() == Some("child_fill"))
            })
            .collect();
        assert!(!fill_holders.is_empty());
        assert!(
            fill_holders.iter().all(|h| h.thread == *pid as u64),
            "{pid}: {fill_holders:?}"
        );
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
    churn_leaves_an_exact_ledger("rel_churn");
}

/// The driver API at scale, mixed with the runtime (`rel_drv_churn.c`): cuMemAlloc,
/// cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemAllocManaged, cuMemAllocHost and VMM
/// (cuMemCreate + reserve + map + release while mapped, freed by unmap + address free) next to
/// cudaMalloc, cudaMallocAsync and cudaMallocHost, with dumps and OOMs from both layers.
#[test]
fn sixteen_threads_through_the_driver_and_the_runtime_leave_an_exact_ledger() {
    churn_leaves_an_exact_ledger("rel_drv_churn");
}

fn churn_leaves_an_exact_ledger(client: &str) {
    let dir = tempfile::tempdir().unwrap();
    let iters = churn_iters();
    let env = [
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_MIN_INTERVAL", "100ms"),
        ("OOMSHIM_SETTLE", "0"),
    ];
    let cmd = client_cmd(client, &[&iters], &env); // builds liboomshim.so first
    let start = Instant::now();
    let o = wait_with_watchdog(cmd, Duration::from_secs(600));
    let took = start.elapsed();
    let text = out(&o);
    assert!(o.status.success(), "{}\n{text}", err(&o));
    eprintln!("{client} {iters}: {took:?}\n{text}");
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
    if client == "rel_drv_churn" {
        // Out-of-memory failures of the driver layer were seen as such too.
        let apis: Vec<&str> = all
            .iter()
            .filter_map(|(_, d)| d.failed_request.as_ref().map(|r| r.api.as_str()))
            .collect();
        assert!(apis.iter().any(|a| a.starts_with("cuMemAlloc")), "{apis:?}");
    }
    assert!(entries(dir.path()).iter().all(|n| n.ends_with(".json")));
}

// ---------------------------------------------------------------------------------------------
// 3. faults while writing a dump

fn uid() -> u32 {
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
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
            // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
            // calls (setrlimit, setsid, ioctl) on values of its own.
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
        common::skip("root (to mount a tmpfs)");
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = mnt.path().to_str().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8k,mode=0755", "oomshim-full", m])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::skip_unless_machine_allows("permission to mount a tmpfs (CAP_SYS_ADMIN)");
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
        common::skip("root (to plant another user's symlink)");
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
    f.set_len(dump::read::MAX_DUMP_BYTES + 1).unwrap();
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

// ---------------------------------------------------------------------------------------------
// 6. randomised differential call sequences

/// SplitMix64: a tiny seeded generator, so a failing sequence is reproduced from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// A request size: mostly small and valid, sometimes zero, odd, large or far too large.
fn seq_size(r: &mut Rng) -> u64 {
    match r.below(12) {
        0 => 0,
        1 => r.pick(&[1, 511, 513, MIB + 1]),
        2 => r.pick(&[64 * MIB, 100 * MIB, 300 * MIB]),
        3 => r.pick(&[1 << 40, 1 << 50, u64::MAX / 2]),
        4..=6 => 512 * (1 + r.below(64)),
        _ => 4096 * (1 + r.below(512)),
    }
}

/// Which pointer a free gets: mostly a slot's (possibly stale: a double free), sometimes an
/// interior, stack, made-up or NULL pointer.
fn seq_which(r: &mut Rng) -> u64 {
    if r.one_in(6) {
        1 + r.below(4)
    } else {
        0
    }
}

/// One random sequence of `len` calls in rel_seq's input language.
fn gen_sequence(seed: u64, len: usize) -> String {
    let mut r = Rng(seed);
    let mut s = String::new();
    let codes = [1u64, 2, 3, 100, 101, 400, 801, 999];
    for _ in 0..len {
        let slot = r.below(16);
        let line = match r.below(40) {
            0..=3 => format!("malloc {slot} {} {}", seq_size(&mut r), r.one_in(20) as u8),
            4 | 5 => format!(
                "async {slot} {} {} {}",
                seq_size(&mut r),
                r.below(3),
                r.below(2)
            ),
            6 => format!(
                "pool {slot} {} {} {}",
                seq_size(&mut r),
                r.one_in(8) as u8,
                r.below(2)
            ),
            7 => format!(
                "managed {slot} {} {}",
                seq_size(&mut r),
                r.pick(&[1, 1, 2, 0, 3])
            ),
            8 => format!(
                "pitch {slot} {} {} {}",
                r.pick(&[0, 1, 100, 1000, 4096, 1u64 << 40]),
                r.pick(&[0, 1, 10, 300, 1 << 20]),
                r.one_in(8) as u8
            ),
            9 => {
                if r.one_in(8) {
                    "3dnull 0 16 16 16".to_string()
                } else {
                    format!(
                        "3d {slot} {} {} {}",
                        r.pick(&[0, 1, 1000, 4096, 1 << 30]),
                        r.pick(&[0, 1, 10, 1 << 10]),
                        r.pick(&[0, 1, 4, 1 << 10])
                    )
                }
            }
            10 => format!(
                "host {slot} {} {}",
                seq_size(&mut r) % (64 * MIB + 1),
                if r.one_in(10) { 9 } else { 0 }
            ),
            11 => format!(
                "hostalloc {slot} {} {} {}",
                seq_size(&mut r) % (64 * MIB + 1),
                if r.one_in(10) { 9 } else { 0 },
                r.pick(&[0, 1, 2, 4, 7, 8])
            ),
            12..=15 => format!("free {slot} {}", seq_which(&mut r)),
            16 => format!("freeasync {slot} {} {}", seq_which(&mut r), r.below(2)),
            17 => format!("freehost {slot} {}", seq_which(&mut r)),
            18 => format!("setdev {}", r.below(4)),
            19 => format!("getdev {}", r.one_in(5) as u8),
            20 => r.pick(&["getlast", "peek", "live"]).to_string(),
            21 => format!("meminfo {}", r.below(3)),
            22 => format!("props {} {}", r.below(4), r.one_in(5) as u8),
            23 => format!("inject {} {}", r.pick(&codes), 1 + r.below(3)),
            24 | 25 => format!(
                "{} {slot} {} {}",
                r.pick(&["cualloc", "cualloc", "gpalloc"]),
                seq_size(&mut r),
                if r.one_in(15) { 9 } else { 0 }
            ),
            26 => format!(
                "{} {slot} {} {} {}",
                r.pick(&["cuasync", "cupool"]),
                seq_size(&mut r),
                if r.one_in(15) { 9 } else { 0 },
                r.one_in(8) as u8
            ),
            27 => format!(
                "cumanaged {slot} {} {} {}",
                seq_size(&mut r),
                if r.one_in(15) { 9 } else { 0 },
                r.pick(&[1, 1, 0, 2])
            ),
            28 => format!(
                "cupitch {slot} {} {} {}",
                r.pick(&[0, 1, 100, 4096]),
                r.pick(&[0, 1, 10, 300]),
                r.one_in(8) as u8
            ),
            29 => format!(
                "{} {slot} {} {} {}",
                r.pick(&["cuhost", "cuhostalloc"]),
                seq_size(&mut r) % (64 * MIB + 1),
                if r.one_in(10) { 9 } else { 0 },
                r.pick(&[0, 1, 0])
            ),
            30 | 31 => format!("cufree {slot} {}", seq_which(&mut r)),
            32 => format!(
                "{} {slot} {}",
                r.pick(&["cufreeasync", "cufreehost"]),
                seq_which(&mut r)
            ),
            33 => format!("cuinject {} {}", r.pick(&codes), 1 + r.below(3)),
            34 => r.pick(&["cumeminfo", "trim"]).to_string(),
            35 => format!(
                "create {} {} {} {}",
                r.below(4),
                r.pick(&[2 * MIB, 4 * MIB, 16 * MIB, 1000, 0, 1 << 40]),
                r.pick(&[0, 0, 1, 2]),
                r.pick(&[0, 0, 0, 8, 9])
            ),
            36 => format!("release {} {}", r.below(4), r.one_in(8) as u8),
            37 => format!(
                "reserve {} {}",
                r.below(4),
                r.pick(&[2 * MIB, 8 * MIB, 32 * MIB, 1000])
            ),
            38 => format!(
                "{} {} {} {} {}",
                r.pick(&["map", "map", "unmap"]),
                r.below(4),
                r.below(4),
                r.below(4),
                1 + r.below(2)
            ),
            _ => format!("addrfree {}", r.below(4)),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

/// rel_seq on `input`, with or without the shim: (stdout, stderr, exit code).
fn run_seq(input: &str, with_shim: bool, dir: &Path) -> (String, String, Option<i32>) {
    run_seq_env(input, with_shim, dir, &[])
}

fn run_seq_env(
    input: &str,
    with_shim: bool,
    dir: &Path,
    extra: &[(&str, &str)],
) -> (String, String, Option<i32>) {
    use std::io::Write;
    let env = [
        ("SIMCUDA_DEVICES", "2"),
        ("SIMCUDA_CAPACITY", "768M"),
        ("SIMCUDA_PINNED_CAPACITY", "96M"),
        ("OOMSHIM_DIR", dir.to_str().unwrap()),
        ("OOMSHIM_SETTLE", "0"),
        ("OOMSHIM_MIN_INTERVAL", "3600s"),
    ];
    let mut cmd = client_cmd("rel_seq", &[], &env);
    cmd.envs(extra.iter().copied());
    cmd.stdin(Stdio::piped());
    if !with_shim {
        cmd.env_remove("LD_PRELOAD");
    }
    let mut child = cmd.spawn().expect("spawn rel_seq");
    let mut stdin = child.stdin.take().unwrap();
    let bytes = input.as_bytes().to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&bytes);
    });
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            panic!("watchdog: rel_seq still running after 60 s (deadlock?)");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    feeder.join().unwrap();
    let o = child.wait_with_output().unwrap();
    (out(&o), err(&o), o.status.code())
}

/// The held totals rel_seq prints: (device 0, device 1, pinned) as (bytes, count).
fn seq_held(text: &str) -> [(u64, u64); 3] {
    let mut held = [(0, 0); 3];
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["held", "device", d, "bytes", b, "count", c] => {
                held[d.parse::<usize>().unwrap()] = (b.parse().unwrap(), c.parse().unwrap())
            }
            ["held", "pinned", "bytes", b, "count", c] => {
                held[2] = (b.parse().unwrap(), c.parse().unwrap())
            }
            _ => {}
        }
    }
    held
}

/// Checks one sequence: output identical with and without the shim, and the shim's ledger at
/// the end equal to what the program still holds. `Err` says what differed.
fn check_sequence(seed: u64, len: usize) -> Result<(), String> {
    let input = gen_sequence(seed, len);
    let dir = tempfile::tempdir().unwrap();
    let (bare, _, bare_rc) = run_seq(&input, false, dir.path());
    // Two out-of-memory dumps per sequence at most, then failures are counted (the cap's own
    // path): a sequence meets up to a dozen failures of distinct sizes, and each dump symbolises
    // the process's stacks afresh (about 25 ms of CPU each, most of this test's time), while the
    // output and the ledger, what is compared, do not depend on how many were written.
    let cap = [("OOMSHIM_MAX_DUMPS", "2")];
    let (shim, shim_err, shim_rc) = run_seq_env(&input, true, dir.path(), &cap);
    if bare != shim || bare_rc != shim_rc {
        let first = bare
            .lines()
            .zip(shim.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("bare: {a}\nshim: {b}"))
            .unwrap_or_else(|| format!("exit {bare_rc:?} vs {shim_rc:?}, or lengths differ"));
        return Err(format!(
            "output differs:\n{first}\nshim stderr:\n{shim_err}"
        ));
    }
    if bare_rc != Some(0) {
        return Err(format!("rel_seq exited {bare_rc:?}"));
    }
    if !shim_err.contains("dump_rc 0") {
        return Err(format!("no end dump: {shim_err}"));
    }
    let end: Vec<Dump> = dumps(dir.path())
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d.reason == "seq-end")
        .collect();
    if end.len() != 1 {
        return Err(format!("{} seq-end dumps", end.len()));
    }
    let d = &end[0];
    let held = seq_held(&shim);
    let dev = |i: i32| {
        d.devices
            .iter()
            .find(|x| x.index == i)
            .map(|x| (x.tracked_bytes, x.tracked_count))
            .unwrap_or((0, 0))
    };
    let ledger = [dev(0), dev(1), (d.pinned_host.bytes, d.pinned_host.count)];
    if ledger != held {
        return Err(format!(
            "ledger (device 0, device 1, pinned) = {ledger:?}, the program holds {held:?}"
        ));
    }
    Ok(())
}

#[test]
fn random_call_sequences_behave_the_same_with_and_without_the_shim() {
    // OOMSHIM_SEQ_SEED reproduces a run; OOMSHIM_SEQ_COUNT and OOMSHIM_SEQ_LEN scale it.
    let base: u64 = std::env::var("OOMSHIM_SEQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let env_num = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let count = env_num("OOMSHIM_SEQ_COUNT", 200) as u64;
    let len = env_num("OOMSHIM_SEQ_LEN", 300);
    eprintln!("random call sequences: base seed {base}, {count} x {len} calls");
    shim_lib();
    let start = Instant::now();
    // Two workers: the machine has two cores and each run is mostly process start-up.
    let failures: Vec<String> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                sc.spawn(move || {
                    let mut bad = Vec::new();
                    let mut i = w;
                    while i < count && bad.is_empty() {
                        let seed = base.wrapping_add(i);
                        if let Err(e) = check_sequence(seed, len) {
                            let keep = std::env::temp_dir().join(format!("rel_seq-{seed}.txt"));
                            let _ = fs::write(&keep, gen_sequence(seed, len));
                            bad.push(format!(
                                "seed {seed} (OOMSHIM_SEQ_SEED={seed} OOMSHIM_SEQ_COUNT=1, \
                                 input kept in {}): {e}",
                                keep.display()
                            ));
                        }
                        i += 2;
                    }
                    bad
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    eprintln!(
        "{count} sequences x {len} calls, each with and without the shim: {:?}",
        start.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---------------------------------------------------------------------------------------------
// 7. re-entrancy and load order

/// Runs `client args` bare and under the shim (with `env`, plus `shim_env` for the shim run),
/// each under a watchdog: stdout and exit status must be the same. Returns the shim run and
/// the dumps it wrote.
fn both_same(
    client: &str,
    args: &[&str],
    env: &[(&str, &str)],
    shim_env: &[(&str, &str)],
) -> (Output, Vec<Dump>) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let run = |with_shim: bool| {
        let mut cmd = client_cmd(client, args, env);
        cmd.env("OOMSHIM_DIR", &d);
        if with_shim {
            for (k, v) in shim_env {
                cmd.env(k, v);
            }
        } else {
            cmd.env_remove("LD_PRELOAD");
        }
        wait_with_watchdog(cmd, Duration::from_secs(60))
    };
    let bare = run(false);
    let shim = run(true);
    assert_eq!(out(&bare), out(&shim), "{client} {args:?}: {}", err(&shim));
    assert_eq!(
        bare.status.code(),
        shim.status.code(),
        "{client} {args:?}: {}",
        err(&shim)
    );
    assert_eq!(
        bare.status.code(),
        Some(0),
        "{}\n{}",
        out(&bare),
        err(&bare)
    );
    // Never a temporary file left behind.
    assert!(
        entries(dir.path()).iter().all(|n| n.ends_with(".json")),
        "{:?}",
        entries(dir.path())
    );
    let all = dumps(dir.path()).into_iter().map(|(_, d)| d).collect();
    (shim, all)
}

/// The one dump with `reason`, its device bytes and count must equal the program's `held_*`.
fn ledger_matches_held(all: &[Dump], reason: &str, text: &str) {
    let end: Vec<&Dump> = all.iter().filter(|d| d.reason == reason).collect();
    assert_eq!(end.len(), 1, "{reason}: {} dumps", end.len());
    let d = end[0];
    let tracked: u64 = d.devices.iter().map(|x| x.tracked_bytes).sum();
    let count: u64 = d.devices.iter().map(|x| x.tracked_count).sum();
    assert_eq!(
        (tracked, count),
        (
            value_after(text, "held_bytes "),
            value_after(text, "held_count ")
        ),
        "{text}"
    );
    if text.contains("pinned_bytes ") {
        assert_eq!(
            (d.pinned_host.bytes, d.pinned_host.count),
            (
                value_after(text, "pinned_bytes "),
                value_after(text, "pinned_count ")
            )
        );
    }
}

#[test]
fn thread_local_destructors_that_free_and_allocate_at_thread_exit() {
    // The pthread_key destructors run after the thread's thread_local destructors (the
    // shim's own among them): hooks must still work, and be recorded, there.
    let (shim, all) = both_same("rel_reenter", &["tls"], &[], &[]);
    ledger_matches_held(&all, "reenter-end", &out(&shim));
    assert_eq!(value_after(&out(&shim), "held_count "), 32);
    assert!(err(&shim).contains("dump_rc 0"), "{}", err(&shim));
}

#[test]
fn an_atexit_handler_that_allocates_after_the_shims_exit_flush() {
    // Registered before the first CUDA call, the program's handler runs after the shim's
    // (the at-exit dump and the flush of the pending OOM dump). Its calls pass through
    // unchanged, and its own OOM (1 TiB, after the 2 TiB one: another request, so never a
    // repeat), after the flush, is written on its own thread (the writer thread may never run
    // again): a dump of its own whatever the interval.
    for min_interval in ["10s", "0"] {
        let (shim, all) = both_same(
            "rel_reenter",
            &["atexit"],
            &[],
            &[
                ("OOMSHIM_AT_EXIT", "1"),
                ("OOMSHIM_MIN_INTERVAL", min_interval),
            ],
        );
        let text = out(&shim);
        assert!(
            text.contains("atexit handler: malloc 0 free 0 oom 2 host 0 freehost 0"),
            "{text}"
        );
        // The OOM before exit was flushed at exit; the exit dump holds the 3 MiB still held.
        let ooms = all.iter().filter(|d| d.reason == "oom").count();
        assert_eq!(ooms, 2, "interval {min_interval}: {}", err(&shim));
        let exit: Vec<&Dump> = all.iter().filter(|d| d.reason == "exit").collect();
        assert_eq!(exit.len(), 1);
        let tracked: u64 = exit[0].devices.iter().map(|x| x.tracked_bytes).sum();
        assert_eq!(tracked, value_after(&text, "held_bytes "));
    }
}

#[test]
fn hooks_from_a_signal_handler_while_the_thread_is_inside_the_shim() {
    let (shim, all) = both_same("rel_reenter", &["signal"], &[], &[]);
    let text = out(&shim);
    assert!(
        text.contains("handler ran: yes, handler results as documented: yes"),
        "{text}"
    );
    ledger_matches_held(&all, "reenter-end", &text);
    eprintln!(
        "{}",
        err(&shim)
            .lines()
            .find(|l| l.contains("handler runs"))
            .unwrap_or("")
    );
}

#[test]
fn the_first_hooked_calls_from_32_threads_at_once_while_the_shim_starts() {
    // The start-up race is probabilistic: several fresh processes.
    for _ in 0..8 {
        let (shim, all) = both_same("rel_reenter", &["initrace"], &[], &[]);
        ledger_matches_held(&all, "reenter-end", &out(&shim));
        let d = all.iter().find(|d| d.reason == "reenter-end").unwrap();
        assert_eq!(d.recording.unknown_frees, 0);
        // 32 racers' first allocations plus one allocate/free pair each.
        assert_eq!(d.recording.total_allocations, 64);
    }
}

#[test]
fn the_shim_loaded_after_cuda_sees_exactly_the_calls_resolved_after_it() {
    let lib = shim_lib();
    let lib = lib.to_str().unwrap();
    let late = |mode: &str| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let run = |shim: bool| {
            let mut cmd = client_cmd("rel_late", &[mode], &[("OOMSHIM_DIR", d)]);
            cmd.env_remove("LD_PRELOAD");
            if shim {
                cmd.env("OOMSHIM_LATE_LIB", lib);
            }
            wait_with_watchdog(cmd, Duration::from_secs(60))
        };
        let (bare, shim) = (run(false), run(true));
        assert_eq!(out(&bare), out(&shim), "{mode}: {}", err(&shim));
        assert_eq!(bare.status.code(), Some(0));
        assert_eq!(shim.status.code(), Some(0), "{}", err(&shim));
        let all = dumps(dir.path());
        assert_eq!(all.len(), 1, "{}", err(&shim));
        (err(&shim), all.into_iter().next().unwrap().1)
    };
    // Runtime opened RTLD_LOCAL, then the shim RTLD_GLOBAL: lookups through the global scope
    // now reach the shim. It sees D (4 MiB) and E (5 MiB), not A, B, C (made before, or
    // through pointers looked up before); A's free is an unknown free; D's free through the
    // old pointer is invisible to it, so D stays in its ledger.
    let (e, d) = late("late-local");
    assert!(e.contains("default_is_shim 1"), "{e}");
    let tracked: u64 = d.devices.iter().map(|x| x.tracked_bytes).sum();
    assert_eq!(tracked, 9 * MIB);
    assert_eq!(d.recording.total_allocations, 2);
    assert_eq!(d.recording.unknown_frees, 1);
    // Runtime opened RTLD_GLOBAL first: it comes first in the global scope, so the shim
    // loaded after it sees nothing at all (and says nothing).
    let (e, d) = late("late-global");
    assert!(e.contains("default_is_shim 0"), "{e}");
    assert_eq!(d.recording.total_allocations, 0);
    assert!(
        e.lines()
            .filter(|l| l.starts_with("oomshim:"))
            .all(|l| l.contains("dump (late-end)")),
        "{e}"
    );
}

#[test]
fn the_runtime_dlclosed_and_reopened_in_a_loop_while_allocating() {
    let (shim, all) = both_same("rel_late", &["reload", "300"], &[], &[]);
    assert!(out(&shim).contains("300 rounds, 300 clean"));
    ledger_matches_held(&all, "late-end", &out(&shim));
    let d = all.iter().find(|d| d.reason == "late-end").unwrap();
    assert_eq!(
        d.recording.total_allocations, 900,
        "every round's calls were seen"
    );
    assert_eq!(d.recording.unknown_frees, 0);
}

// ---------------------------------------------------------------------------------------------
// 8. a panic inside a hook

#[test]
fn an_injected_panic_in_a_hook_switches_the_shim_off_with_one_message() {
    // OOMSHIM_FAULT=panic-in-alloc:3 (a test hook): the shim panics inside the hook of the
    // third successful allocation, after the real call returned.
    let input = "malloc 0 4096\nmalloc 1 8192\ncualloc 2 4096\nmalloc 3 512\nfree 0\n\
                 host 4 4096\nfreehost 4\ncufree 2\nmalloc 5 1099511627776\n\
                 cualloc 6 1099511627776\ninject 2 1\nmalloc 7 4096\ngetlast\n\
                 async 8 4096 1\nfreeasync 8\nlive\n";
    let dir = tempfile::tempdir().unwrap();
    let fault = [("OOMSHIM_FAULT", "panic-in-alloc:3")];
    let (bare, _, bare_rc) = run_seq_env(input, false, dir.path(), &fault);
    let (shim, e, shim_rc) = run_seq_env(input, true, dir.path(), &fault);
    // Results, out-parameters and the exit status are unchanged, later calls included.
    assert_eq!(bare, shim);
    assert_eq!((bare_rc, shim_rc), (Some(0), Some(0)));
    // Exactly one message, and it says what happened.
    let msgs: Vec<&str> = e.lines().filter(|l| l.starts_with("oomshim:")).collect();
    assert_eq!(msgs.len(), 1, "{e}");
    assert!(
        msgs[0].contains("internal error")
            && msgs[0].contains("panic-in-alloc")
            && msgs[0].contains("tracking is off"),
        "{e}"
    );
    // Pass-through from then on: the later OOMs write no dump, and the on-demand dump asked
    // for at the end is refused (-1) without a word.
    assert!(e.contains("dump_rc -1"), "{e}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());

    // Without the switch the same sequence writes its dumps (the test is not vacuous).
    let dir = tempfile::tempdir().unwrap();
    let (plain, e, _) = run_seq_env(input, true, dir.path(), &[]);
    assert_eq!(plain, bare);
    assert!(e.contains("dump_rc 0"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// 9. dump file mode

#[test]
fn oomshim_dump_mode_sets_the_dump_files_permissions_and_refuses_world_writable() {
    let mode_of = |value: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let mut env = vec![("OOMSHIM_DIR", dir.path().to_str().unwrap())];
        if let Some(v) = value {
            env.push(("OOMSHIM_DUMP_MODE", v));
        }
        let (_, shim) = leak_both(&env, None);
        let written = dumps(dir.path());
        assert_eq!(written.len(), 1, "{}", err(&shim));
        let mode = fs::metadata(&written[0].0).unwrap().mode() & 0o7777;
        (mode, err(&shim))
    };
    assert_eq!(mode_of(None).0, 0o600);
    let (mode, e) = mode_of(Some("0640"));
    assert_eq!(mode, 0o640);
    assert!(!e.contains("OOMSHIM_DUMP_MODE"), "{e}");
    // 0660 is applied exactly, whatever the umask (the test's 022 would make it 0640).
    assert_eq!(mode_of(Some("660")).0, 0o660);
    for bad in ["0666", "0777", "rw-r-----", "9"] {
        let (mode, e) = mode_of(Some(bad));
        assert_eq!(mode, 0o600, "{bad}");
        let msgs: Vec<&str> = e
            .lines()
            .filter(|l| l.contains("OOMSHIM_DUMP_MODE"))
            .collect();
        assert_eq!(msgs.len(), 1, "{bad}: {e}");
        assert!(msgs[0].contains("using 0600"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// 10. faults: NVML failing, symbolisation failing, short of host memory

#[test]
fn nvml_present_but_failing_or_hanging_is_said_in_the_dump_and_changes_nothing() {
    let lib = tempfile::tempdir().unwrap();
    common::build_fake_nvml(lib.path());
    let cases = [
        ("init-fails", "0", "NVML is not available"),
        ("init-fails", "1500", "NVML is not available"), // hangs 1.5 s first
        ("no-device", "0", "NVML has no such device"),
        ("list-fails", "0", "NVML could not list processes"),
    ];
    for (mode, delay, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let env = [
            ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
            ("LD_LIBRARY_PATH", lib.path().to_str().unwrap()),
            ("SIMNVML_MODE", mode),
            ("SIMNVML_DELAY_MS", delay),
        ];
        let (_, shim) = leak_both(&env, None);
        let written = dumps(dir.path());
        assert_eq!(written.len(), 1, "{mode}: {}", err(&shim));
        let g = written[0].1.gpu_processes.clone().expect("gpu_processes");
        let why = g.error.unwrap_or_default();
        assert!(why.contains(says), "{mode}: {why}");
        assert!(g.processes.is_empty());
        // One summary, no NVML noise on the program's stderr.
        assert!(
            !err(&shim).to_lowercase().contains("nvml"),
            "{}",
            err(&shim)
        );
    }
}

#[test]
fn symbolisation_failing_still_writes_the_dump_with_raw_addresses() {
    // OOMSHIM_FAULT=symbolize (a test hook): the symboliser panics inside, as a broken object
    // file or a bug in it would make it.
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
        ("OOMSHIM_FAULT", "symbolize"),
    ];
    let (_, shim) = leak_both(&env, None);
    let written = dumps(dir.path());
    assert_eq!(written.len(), 1, "{}", err(&shim));
    let d = &written[0].1;
    assert!(!d.sites.is_empty());
    for s in &d.sites {
        assert!(!s.stack.is_empty());
        for f in &s.stack {
            assert!(f.function.is_none() && f.file.is_none(), "{f:?}");
            assert!(f.address.starts_with("0x"), "{f:?}");
        }
    }
    assert!(!err(&shim).contains("internal error"), "{}", err(&shim));
    let msgs = err(&shim)
        .lines()
        .filter(|l| l.starts_with("oomshim:"))
        .count();
    assert!(msgs >= 1, "the usual summary");
}

#[test]
fn the_program_binary_deleted_while_it_runs_still_gets_a_dump() {
    // The executable (and its debug info) removed after start, as a redeploy would: the
    // symboliser cannot read it; the dump is written all the same, the program unchanged.
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "leak_until_oom",
        "libcudart.so.13",
        "libcuda.so.1",
        "libdrvnext.so",
    ] {
        let from = testbed::artifact_dir().join(name);
        if from.exists() {
            fs::copy(&from, tmp.path().join(name)).unwrap();
        }
    }
    let exe = tmp.path().join("leak_until_oom");
    let dir = tempfile::tempdir().unwrap();
    // A wrapper shell deletes the binary between exec and the first OOM: `exec` replaces the
    // shell, so the running image is the one whose file is gone.
    let script = format!(
        "(sleep 0.05; rm -f {exe}) & exec {exe}",
        exe = exe.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script])
        .env("LD_PRELOAD", shim_lib())
        .env("SIMCUDA_CAPACITY", "1G")
        .env("OOMSHIM_DIR", dir.path())
        .env("OOMSHIM_SETTLE", "0.3s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = wait_with_watchdog(cmd, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(!exe.exists());
    let written = dumps(dir.path());
    assert_eq!(written.len(), 1, "{}", err(&o));
    assert!(!written[0].1.sites.is_empty());
}

#[test]
fn short_of_host_memory_while_dumping_the_program_survives_with_one_message() {
    // RLIMIT_AS (`ulimit -v`) from 12 to 64 MiB: from tight (the shim and the program barely
    // load) to roomy. Rust aborts the process when an allocation fails, so before this was
    // fixed the symboliser's allocations killed the program (exit 134) between 16 and 32 MiB.
    // Now: the same output and status as the bare run at every limit, at most one message
    // about it, and a dump (raw addresses when symbolising did not fit) unless even that did not
    // fit, which the message says.
    let (mut degraded, mut symbolised, mut skipped) = (0, 0, 0);
    for mib in (12u64..=64).step_by(4) {
        let limit = mib << 20;
        let dir = tempfile::tempdir().unwrap();
        let mk = |with_shim: bool| {
            let mut cmd = client_cmd(
                "leak_until_oom",
                &[],
                &[("OOMSHIM_DIR", dir.path().to_str().unwrap())],
            );
            cmd.env("SIMCUDA_CAPACITY", "1G");
            if !with_shim {
                cmd.env_remove("LD_PRELOAD");
            }
            // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
            // calls (setrlimit, setsid, ioctl) on values of its own.
            unsafe {
                cmd.pre_exec(move || {
                    let rl = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_AS, &rl) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            wait_with_watchdog(cmd, Duration::from_secs(60))
        };
        let bare = mk(false);
        if bare.status.code() != Some(0) {
            continue; // too tight for the program itself
        }
        let shim = mk(true);
        let e = err(&shim);
        assert_eq!(shim.status.code(), Some(0), "{mib} MiB: {e}");
        assert_eq!(out(&bare), out(&shim), "{mib} MiB");
        assert!(!e.contains("memory allocation of"), "{mib} MiB: {e}");
        assert!(e.matches("too little host memory").count() <= 1, "{e}");
        assert!(entries(dir.path()).iter().all(|n| n.ends_with(".json")));
        let written = dumps(dir.path());
        if e.contains("no dump written: the process is out of host address space") {
            // Too tight for a dump at all: the one message, nothing half-written.
            assert!(written.is_empty(), "{mib} MiB: {e}");
            skipped += 1;
            continue;
        }
        assert_eq!(written.len(), 1, "{mib} MiB: {e}");
        let named = written[0].1.sites[0]
            .stack
            .iter()
            .any(|f| f.function.is_some());
        if e.contains("too little host memory") {
            assert!(
                !named,
                "{mib} MiB: raw addresses when symbolising was skipped"
            );
            degraded += 1;
        } else {
            assert!(named, "{mib} MiB");
            symbolised += 1;
        }
    }
    assert!(
        degraded > 0 && symbolised > 0,
        "{degraded} degraded, {symbolised} symbolised, {skipped} without a dump"
    );
}
