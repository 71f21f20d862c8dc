//! The flight recorder: the live region each shimmed process publishes, the
//! post-mortem dump `oomshim run` writes when its program is killed outright, and
//! `oomshim top`, all on the simulated device.

use crate::common;

use common::cli;
use dump::model::Dump;
use oomshim_cli::testbed;
use oomshim_core::flight::layout::RegionWriter;
use oomshim_core::flight::read::{read_region, ReadError};
use oomshim_core::flight::{region_name, start_ticks_of, LiveSummary, LIVE_SCHEMA};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Run {
    child: Child,
    live: PathBuf,
    dumps: PathBuf,
    _dir: tempfile::TempDir,
}

/// `oomshim run -- CLIENT ARGS` with its own live and dump directories and `env`, once the
/// program printed "ready".
fn start_run(client: &str, args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let dumps = dir.path().join("dumps");
    let mut cmd = cli();
    cmd.args(["run", "--dir"])
        .arg(&dumps)
        .arg("--")
        .arg(testbed::client(client))
        .args(args)
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("SIMCUDA_CAPACITY", "64G")
        .env_remove("LD_PRELOAD")
        .stderr(Stdio::piped());
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run {
        child: spawn_ready(&mut cmd),
        live,
        dumps,
        _dir: dir,
    }
}

/// Spawns `cmd` with its stdout piped and waits for the program's "ready" line.
fn spawn_ready(cmd: &mut Command) -> Child {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut buf = [0u8; 6];
    child.stdout.as_mut().unwrap().read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    child
}

/// `oomshim run -- flight_leak ARGS` with its own live and dump directories, once the program
/// printed "ready" (40 leaking steps) and published since.
fn start_leak(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut with = vec![("OOMSHIM_LIVE_INTERVAL", "100ms")];
    with.extend_from_slice(env);
    let run = start_run("flight_leak", args, &with, &[]);
    // A few publishes after step 40 (one every 100 ms, a step every 20 ms): a summary of step 60.
    common::wait_for_published_step(&run.live, 60);
    run
}

/// The program's pid: the one region in the live directory.
fn program_pid(live: &Path) -> u32 {
    let regions = oomshim_core::flight::read::list_regions(live);
    assert_eq!(regions.len(), 1, "{regions:?}");
    assert!(regions[0].alive);
    regions[0].pid
}

fn finish(run: Run) -> (Output, Vec<(PathBuf, Dump)>, Run) {
    let start = Instant::now();
    let mut child = run.child;
    while child.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "oomshim run hangs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let dumps = fs::read_dir(&run.dumps)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .map(|p| {
                    let dump: Dump = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
                    (p, dump)
                })
                .collect()
        })
        .unwrap_or_default();
    let rest = Run {
        child: Command::new("true").spawn().unwrap(),
        ..run
    };
    (out, dumps, rest)
}

#[test]
fn a_leaking_program_killed_by_sigkill_leaves_a_post_mortem_naming_the_leak_and_the_signal() {
    let run = start_leak(&[], &[]);
    let pid = program_pid(&run.live);
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let (out, dumps, run) = finish(run);
    // oomshim ends as its program did.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL)
    );
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    let (path, dump) = &dumps[0];
    assert_eq!(dump.reason, "post_mortem");
    assert_eq!(dump.schema, dump::model::SCHEMA);
    let pm = dump.post_mortem.as_ref().expect("post_mortem section");
    assert!(pm.reconstructed);
    assert_eq!(pm.signal, Some(libc::SIGKILL));
    assert_eq!(pm.signal_name.as_deref(), Some("SIGKILL"));
    assert_eq!(dump.process.pid, pid);
    let v = &dump.verdict;
    assert_eq!(v.kind, oomshim_core::verdict::KILLED_BY_SIGNAL, "{v:#?}");
    let top = &v.findings[0].headline;
    assert!(top.contains("killed by SIGKILL from outside"), "{top}");
    assert!(top.contains("no device allocation had failed"), "{top}");
    assert!(top.contains("leak: keep_activations"), "{top}");
    assert!(v.findings.iter().any(|f| f.kind == "leak"
        && f.headline.contains("keep_activations")
        && f.headline.contains("8.00 MiB every step")));
    // The device memory is what the program last published: its 8 MiB a step at its line.
    let tracked = dump.devices[0].tracked_bytes;
    assert!(tracked >= 40 * (8 << 20), "{tracked}");
    assert!(dump.sites[0]
        .stack
        .iter()
        .any(|f| f.function.as_deref() == Some("keep_activations")));
    // stderr says what the dump says, word for word, and where it is.
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("oomshim: post-mortem (reconstructed): {top}")),
        "{err}"
    );
    assert!(err.contains(&path.display().to_string()), "{err}");
    // ... and so does the report, which shows it as reconstructed.
    let report = cli().arg("report").arg(path).output().unwrap();
    let report = text(&report.stdout);
    assert!(
        report.starts_with("Post-mortem dump, reconstructed by oomshim run"),
        "{report}"
    );
    assert!(report.contains("killed by SIGKILL"), "{report}");
    assert!(report.contains("Verdict: killed_by_signal"), "{report}");
    // The dead program's region is gone, and no temporary file is left.
    assert!(oomshim_core::flight::read::list_regions(&run.live).is_empty());
    for e in fs::read_dir(&run.dumps).unwrap() {
        let name = e.unwrap().file_name();
        assert!(!name.to_string_lossy().ends_with(".tmp"), "{name:?}");
    }
}

#[test]
fn a_host_memory_kill_is_named_from_the_cgroups_memory_events() {
    // A recorded memory.events in a stand-in cgroup filesystem (the same relative path as this
    // process's cgroup, which the program inherits): its oom_kill count rises as the program
    // dies by SIGKILL, as the kernel's OOM killer leaves it.
    let fake = tempfile::tempdir().unwrap();
    let own = fs::read_to_string("/proc/self/cgroup").unwrap();
    let (dir, v2) =
        oomshim_core::facts::host::cgroup_dir(&own, fake.path()).expect("a memory cgroup");
    fs::create_dir_all(&dir).unwrap();
    let events = dir.join(if v2 {
        "memory.events"
    } else {
        "memory.oom_control"
    });
    fs::write(&events, "oom 0\noom_kill 0\n").unwrap();
    fs::write(
        dir.join(if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }),
        "1073741824\n",
    )
    .unwrap();
    let root = fake.path().to_str().unwrap().to_string();
    let run = start_leak(&["host"], &[("OOMSHIM_CGROUP_ROOT", &root)]);
    let pid = program_pid(&run.live);
    fs::write(&events, "oom 1\noom_kill 1\n").unwrap();
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let (out, dumps, _run) = finish(run);
    assert_eq!(dumps.len(), 1, "{}", text(&out.stderr));
    let dump = &dumps[0].1;
    let v = &dump.verdict;
    assert_eq!(v.kind, oomshim_core::verdict::HOST_OOM_KILL, "{v:#?}");
    let top = &v.findings[0].headline;
    assert!(
        top.starts_with("killed by the kernel's OOM killer (SIGKILL): host memory grew"),
        "{top}"
    );
    assert!(top.contains("per step"), "{top}");
    let pm = dump.post_mortem.as_ref().unwrap();
    assert_eq!(
        (pm.host.oom_kill_before, pm.host.oom_kill_after),
        (Some(0), Some(1))
    );
    assert_eq!(pm.host.memory_max, Some(1 << 30));
    // 4 MiB of host memory a step: the fitted growth says so (within the noise of the heap).
    let (rate, unit) = oomshim_core::verdict::host_growth(pm).expect("host growth");
    assert_eq!(unit, "step");
    assert!((3 << 20..6 << 20).contains(&rate), "{rate}");
}

#[test]
fn a_host_memory_kill_in_a_memory_limited_cgroup() {
    // Needs a writable cgroup v2 hierarchy with the memory controller (a VM or a privileged
    // container); elsewhere this says so and checks nothing.
    let root = Path::new("/sys/fs/cgroup");
    let cg = root.join(format!("oomshim-test-{}", std::process::id()));
    let usable = root.join("cgroup.controllers").is_file()
        && fs::read_to_string(root.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
        && fs::create_dir(&cg).is_ok();
    if !usable {
        common::skip_unless_machine_allows(
            "a writable cgroup v2 with the memory controller (the recorded memory.events test covers the verdict)",
        );
        return;
    }
    let _ = fs::write(cg.join("memory.swap.max"), "0");
    fs::write(cg.join("memory.max"), "300M").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let dumps = dir.path().join("dumps");
    let mut cmd = cli();
    let procs = cg.join("cgroup.procs");
    cmd.args(["run", "--dir"])
        .arg(&dumps)
        .arg("--")
        .arg(testbed::client("flight_leak"))
        .arg("host")
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("SIMCUDA_CAPACITY", "64G")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the hook runs in the forked child before exec and writes one file, which
    // allocates: usable there with glibc, whose fork takes malloc's locks in the parent and
    // re-initialises them in the child, so no lock of another thread is left held.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            fs::write(&procs, std::process::id().to_string())?;
            Ok(())
        });
    }
    let out = common::wait_with_watchdog(cmd, Duration::from_secs(120));
    let found: Vec<Dump> = fs::read_dir(&dumps)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| serde_json::from_slice(&fs::read(e.path()).unwrap()).unwrap())
        .collect();
    let _ = fs::remove_dir(&cg);
    assert_eq!(found.len(), 1, "{}", text(&out.stderr));
    assert_eq!(found[0].verdict.kind, oomshim_core::verdict::HOST_OOM_KILL);
}

#[test]
fn top_once_shows_a_running_programs_growing_site() {
    let run = start_leak(&[], &[]);
    let pid = program_pid(&run.live);
    let out = cli()
        .args(["top", "--once", "--pid", &pid.to_string(), "--dir"])
        .arg(&run.live)
        .output()
        .unwrap();
    let frame = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(frame.contains(&format!("pid {pid}  running")), "{frame}");
    assert!(frame.contains("flight_leak"), "{frame}");
    assert!(
        frame.contains("growing: keep_activations (flight_leak.c:22) +8.00 MiB per step"),
        "{frame}"
    );
    assert!(frame.contains("site: "), "{frame}");
    assert!(frame.contains("/s)"), "steps per second: {frame}");
    // A pid with no region is said so, plainly.
    let none = cli()
        .args(["top", "--once", "--pid", "1", "--dir"])
        .arg(&run.live)
        .output()
        .unwrap();
    assert!(text(&none.stdout).contains("no oomshim process with pid 1"));
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let (out, dumps, _run) = finish(run);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGTERM)
    );
    // SIGTERM from outside is a death without a dump of its own too.
    assert_eq!(dumps.len(), 1);
    assert!(dumps[0].1.verdict.findings[0]
        .headline
        .starts_with("ended by SIGTERM from outside"));
}

/// `oomshim run -- grow_only ARGS` with its own live and dump directories, once the program
/// printed "ready".
fn start_grow(args: &[&str], env: &[(&str, &str)]) -> Run {
    start_run("grow_only", args, env, &["OOMSHIM_LIVE_INTERVAL"])
}

/// A program that only allocates (no marks, no repeating step) and is SIGKILLed: its post-mortem
/// judges the growth over time, per second, and names the line, as an OOM's would.
#[test]
fn a_program_that_only_allocates_killed_by_sigkill_gets_a_leak_over_time() {
    // "ready" after 50 chunks (5 s of growth); the summary keeps up with each 48 MiB (below
    // OOMSHIM_LIVE_CHANGE's 64 MiB, the interval republishes).
    let run = start_grow(&["killme"], &[("OOMSHIM_LIVE_INTERVAL", "100ms")]);
    std::thread::sleep(Duration::from_millis(300));
    let pid = program_pid(&run.live);
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let (out, dumps, _run) = finish(run);
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    let (_, dump) = &dumps[0];
    let v = &dump.verdict;
    assert_eq!(v.kind, oomshim_core::verdict::KILLED_BY_SIGNAL, "{v:#?}");
    let top = &v.findings[0].headline;
    assert!(
        top.contains("device memory was growing: leak: grow_forever (grow_only.c:")
            && top.contains(" every second (steadily over its last "),
        "{top}"
    );
    let leak = v
        .findings
        .iter()
        .find(|f| f.kind == "leak")
        .expect("a leak finding");
    assert!(
        leak.summary.contains("growing steadily over time"),
        "{}",
        leak.summary
    );
    assert!(
        text(&out.stderr).contains(top.as_str()),
        "{}",
        text(&out.stderr)
    );
}

/// `oomshim run -- flight_growth MODE` with its own live and dump directories (the live
/// summary on its defaults: the first allocation and changes publish), once the program printed
/// "ready".
fn start_growth(mode: &str) -> Run {
    start_run(
        "flight_growth",
        &[mode],
        &[],
        &["OOMSHIM_LIVE_INTERVAL", "OOMSHIM_LIVE_CHANGE"],
    )
}

/// `run`'s flight_growth SIGKILLed `after` it said "ready", and what `oomshim run` then did:
/// (the program's pid, oomshim run's output, the dumps).
fn killed_after(run: Run, after: Duration) -> (i32, Output, Vec<(PathBuf, Dump)>) {
    std::thread::sleep(after);
    let pid = child_named(&run, "flight_growth");
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let (out, dumps, _run) = finish(run);
    (pid, out, dumps)
}

/// The program `oomshim run` started (its child named `comm`, not oomshim's sentinel).
fn child_named(run: &Run, comm: &str) -> i32 {
    let run_pid = run.child.id();
    fs::read_to_string(format!("/proc/{run_pid}/task/{run_pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|p: &i32| {
            fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .expect("oomshim run's child")
}

/// A program that spikes at start-up (20 × 32 MiB in 0.4 s) and is SIGKILLed 0.2 s later, long
/// before a first interval: its first allocation created its region and published, and each
/// change of more than `OOMSHIM_LIVE_CHANGE` since republished, so the post-mortem names the
/// site and the 640 MiB. The interval is a minute here, so only those publishes can show the
/// 640 MiB. The change is 16 MiB, under one allocation: with the default 64 MiB the last state
/// published is only promised within 64 MiB of the end (a loaded machine's publisher may arm its
/// mark at 600 MiB), and the exact 640 MiB asserted below would be luck. On a machine too loaded
/// for the publisher to keep up within 0.2 s the kill waits for its publish (at most 20 s).
#[test]
fn a_program_killed_in_its_first_second_gets_a_post_mortem_of_its_allocations() {
    let run = start_run(
        "flight_growth",
        &["spike"],
        &[
            ("OOMSHIM_LIVE_INTERVAL", "60s"),
            ("OOMSHIM_LIVE_CHANGE", "16M"),
        ],
        &[],
    );
    std::thread::sleep(Duration::from_millis(200));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !oomshim_core::flight::read::list_regions(&run.live)
        .iter()
        .filter_map(|r| read_region(&r.path).ok())
        .any(|s| s.summary.dump.devices.first().map(|d| d.tracked_bytes) == Some(640 << 20))
    {
        assert!(
            Instant::now() < deadline,
            "the spike's end was never published"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (pid, out, dumps) = killed_after(run, Duration::ZERO);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL)
    );
    assert_eq!(dumps.len(), 1, "{dumps:?} {}", text(&out.stderr));
    let (_, dump) = &dumps[0];
    assert_eq!(dump.reason, "post_mortem");
    assert_eq!(dump.process.pid, pid as u32);
    let pm = dump.post_mortem.as_ref().unwrap();
    assert!(pm.generation >= 1, "published before it died");
    assert_eq!(dump.devices[0].tracked_bytes, 640 << 20);
    let top = &dump.verdict.findings[0].headline;
    assert!(
        top.starts_with("killed by SIGKILL from outside")
            && top.contains("(640.00 MiB tracked, peak 640.00 MiB)")
            && top.contains("grow_cache (flight_growth.c:"),
        "{top}"
    );
    // Young growth is said with its numbers, never called a leak.
    assert!(
        top.contains("growing: grow_cache (flight_growth.c:"),
        "{top}"
    );
    assert!(top.contains("too little to call it a leak"), "{top}");
    assert!(!dump.verdict.findings.iter().any(|f| f.kind == "leak"));
    assert!(
        text(&out.stderr).contains(&format!("oomshim: post-mortem (reconstructed): {top}")),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 40: a service loop that marks no steps and frees nothing (8 MiB a request, 30 ms
/// apart), SIGKILLed after 3 s: the post-mortem judges its growth over time from the live
/// allocations' own times, a leak at its line, in bytes per second.
#[test]
fn pure_growth_without_steps_killed_after_three_seconds_is_a_leak_per_second() {
    let (_, out, dumps) = killed_after(start_growth("slow"), Duration::from_secs(3));
    assert_eq!(dumps.len(), 1, "{}", text(&out.stderr));
    let v = &dumps[0].1.verdict;
    let leak = v
        .findings
        .iter()
        .find(|f| f.kind == "leak")
        .unwrap_or_else(|| panic!("no leak finding: {v:#?}"));
    assert!(
        leak.headline
            .starts_with("leak: session_cache (flight_growth.c:")
            && leak
                .headline
                .contains(" every second (steadily over its last "),
        "{}",
        leak.headline
    );
    // About 8 MiB / 30 ms (a loaded machine stretches the naps: less, never more).
    let g = dumps[0].1.growth.as_ref().unwrap();
    assert_eq!(g.steps.as_deref(), Some("timeline"));
    let rate = g.sites[0].bytes_per_step;
    assert!((100 << 20..=300 << 20).contains(&rate), "{rate}");
    assert!(v.findings[0]
        .headline
        .contains("device memory was growing: leak: session_cache"));
}

/// Issue 40: a program that never touches CUDA (a shell script) has no region, and a SIGKILL
/// under `oomshim run` writes no post-mortem about GPU memory.
#[test]
fn a_program_that_never_used_cuda_gets_no_post_mortem() {
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("dumps");
    for program in [
        vec!["sh", "-c", "sleep 0.5; kill -9 $$"],
        vec![
            testbed::client("flight_growth").to_str().unwrap(),
            "nothing",
        ],
    ] {
        let mut cmd = cli();
        cmd.args(["run", "--dir"])
            .arg(&dumps)
            .arg("--")
            .args(&program)
            .env("OOMSHIM_LIVE_DIR", dir.path().join("live"))
            .env_remove("LD_PRELOAD")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        if program[0] != "sh" {
            std::thread::sleep(Duration::from_millis(500));
            let run = Run {
                child,
                live: dir.path().join("live"),
                dumps: dumps.clone(),
                _dir: tempfile::tempdir().unwrap(),
            };
            let pid = child_named(&run, "flight_growth");
            // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let (out, _, _) = finish(run);
            assert!(
                !text(&out.stderr).contains("post-mortem"),
                "{}",
                text(&out.stderr)
            );
        } else {
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&out.status),
                Some(libc::SIGKILL)
            );
            assert!(
                !text(&out.stderr).contains("post-mortem"),
                "{}",
                text(&out.stderr)
            );
        }
        assert!(
            !dumps.exists() || fs::read_dir(&dumps).unwrap().next().is_none(),
            "{program:?} got a dump"
        );
        assert!(oomshim_core::flight::read::list_regions(&dir.path().join("live")).is_empty());
    }
}

/// Issue 40: programs that hit an out-of-memory error and then exit normally under plain
/// `LD_PRELOAD` leave no region (the failure used to wake the publisher in the middle of the
/// exit, which created the region and never removed it).
#[test]
fn programs_that_exit_after_an_oom_under_preload_leave_no_region() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    for client in [
        "leak_until_oom",
        "steps_leak",
        "grow_only",
        "retry_after_oom",
    ] {
        let mut cmd = Command::new(testbed::client(client));
        cmd.env("LD_PRELOAD", common::shim_lib())
            .env("OOMSHIM_DIR", dir.path().join("dumps"))
            .env("OOMSHIM_LIVE_DIR", &live)
            .env("SIMCUDA_CAPACITY", "2G")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = common::wait_with_watchdog(cmd, Duration::from_secs(60));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{client}: {}",
            text(&out.stderr)
        );
        let left: Vec<_> = fs::read_dir(&live)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{client} left {left:?}");
    }
}

/// Issue 40: a live directory on a full or tiny tmpfs (`/dev/shm` out of room) loses no
/// program and leaves no region: one that cannot be initialised is removed at once, one whose
/// publishes fail is removed at exit.
#[test]
fn a_full_or_tiny_tmpfs_live_dir_leaves_no_region() {
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        common::skip("root (to mount a tmpfs)");
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = mnt.path().to_str().unwrap().to_string();
    let ok = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=64k,mode=0700",
            "oomshim-live",
            &m,
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::skip_unless_machine_allows("permission to mount a tmpfs (CAP_SYS_ADMIN)");
        return;
    }
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(m.clone());
    let live = mnt.path().join("live");
    let run = |what: &str| {
        let mut cmd = Command::new(testbed::client("steps_leak"));
        cmd.env("LD_PRELOAD", common::shim_lib())
            .env("OOMSHIM_DIR", mnt.path().join("no-dumps-here"))
            .env("OOMSHIM_LIVE_DIR", &live)
            .env("OOMSHIM_SETTLE", "0")
            .env("SIMCUDA_CAPACITY", "2G")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = common::wait_with_watchdog(cmd, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out.stderr));
        let left: Vec<String> = fs::read_dir(&live)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".live"))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{what}: left {left:?}");
        text(&out.stderr)
    };
    // 64 KiB: the header fits, the summaries do not.
    let said = run("a tiny tmpfs");
    assert!(
        said.matches("live summary").count() <= 1,
        "said once: {said}"
    );
    // Full: not even the header fits.
    private_dir(&live);
    let filler = live.join("filler");
    let mut f = fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    let said = run("a full tmpfs");
    assert!(said.contains("the live summary is off"), "{said}");
}

/// Issue 40: two programs in pid namespaces of their own (containers sharing `/dev/shm`), each
/// pid 1 there, share one live directory: each keeps its own region, and `top` in the parent
/// namespace shows both, in another pid namespace, neither as gone.
#[test]
fn programs_in_other_pid_namespaces_keep_their_own_regions_and_are_never_gone() {
    if !common::on_path("unshare") {
        common::skip_unless_machine_allows("unshare (util-linux)");
        return;
    }
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !probe {
        common::skip_unless_machine_allows("unshare --pid (root, or user namespaces)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let mut children = Vec::new();
    for _ in 0..2 {
        // `--kill-child`: the program dies with unshare, which dies with the test.
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child"])
            .arg(testbed::client("flight_growth"))
            .arg("slow")
            .env("LD_PRELOAD", common::shim_lib())
            .env("OOMSHIM_DIR", dir.path().join("dumps"))
            .env("OOMSHIM_LIVE_DIR", &live)
            .env("SIMCUDA_CAPACITY", "64G")
            .stderr(Stdio::null());
        children.push(common::KillOnDrop(spawn_ready(&mut cmd)));
    }
    // Both published (the first allocation does).
    let deadline = Instant::now() + Duration::from_secs(30);
    let regions = loop {
        let regions = oomshim_core::flight::read::list_regions(&live);
        let read = regions
            .iter()
            .filter(|r| read_region(&r.path).is_ok())
            .count();
        if read == 2 || Instant::now() > deadline {
            break regions;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(regions.len(), 2, "{regions:?}");
    assert!(regions.iter().all(|r| r.pid == 1), "{regions:?}");
    assert_ne!(regions[0].id, regions[1].id);
    assert!(regions
        .iter()
        .all(|r| r.liveness == oomshim_core::flight::Liveness::OtherNamespace && r.alive));
    let frame = top_once(&live, &[]);
    assert!(
        frame.starts_with("oomshim top — 2 processes (regions"),
        "{frame}"
    );
    assert_eq!(
        frame.matches("in another pid namespace").count(),
        2,
        "{frame}"
    );
    assert!(!frame.contains("gone"), "{frame}");
    // `--prune` never takes a region whose writer cannot be judged from here.
    let pruned = top_once(&live, &["--prune"]);
    assert!(!pruned.contains("pruned"), "{pruned}");
    assert_eq!(oomshim_core::flight::read::list_regions(&live).len(), 2);
    drop(children);
}

#[test]
fn a_program_that_exits_normally_leaves_no_region_and_no_post_mortem() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let dumps = dir.path().join("dumps");
    let mut cmd = cli();
    cmd.args(["run", "--dir"])
        .arg(&dumps)
        .arg("--")
        .arg(testbed::client("steps_leak"))
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("OOMSHIM_SETTLE", "0")
        .env("SIMCUDA_CAPACITY", "2G");
    let out = common::wait_with_watchdog(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let reasons: Vec<String> = fs::read_dir(&dumps)
        .unwrap()
        .map(|e| {
            let d: Dump = serde_json::from_slice(&fs::read(e.unwrap().path()).unwrap()).unwrap();
            d.reason
        })
        .collect();
    assert_eq!(reasons, ["oom"], "its own dump, no post-mortem");
    assert!(oomshim_core::flight::read::list_regions(&live).is_empty());
    assert!(!text(&out.stderr).contains("post-mortem"));
}

/// `dir` created as the shim creates a live directory: this user's, mode 0700 (whatever the
/// umask).
fn private_dir(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir).unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
}

/// The id of a region of process `pid` of this pid namespace.
fn id_of(pid: u32, start_ticks: u64) -> oomshim_core::flight::RegionId {
    oomshim_core::flight::RegionId {
        pid_ns: oomshim_core::flight::own_pid_ns().unwrap(),
        pid,
        start_ticks,
    }
}

/// An empty region of process `id` in `dir` (created as the shim creates its directory), and
/// its writer.
fn new_region(dir: &Path, id: oomshim_core::flight::RegionId) -> (PathBuf, RegionWriter) {
    private_dir(dir);
    let path = dir.join(id.file_name());
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let w = RegionWriter::init(file, &id, unsafe { libc::geteuid() }).unwrap();
    (path, w)
}

/// A region of this test process (so it counts as running), holding `dump` as its summary.
fn region_with(dir: &Path, dump: &Dump) -> (PathBuf, RegionWriter, Vec<u8>) {
    let pid = std::process::id();
    let ticks = start_ticks_of(pid).unwrap();
    let (path, w) = new_region(dir, id_of(pid, ticks));
    let summary = LiveSummary {
        schema: LIVE_SCHEMA.into(),
        pid,
        pid_ns: Some(id_of(pid, ticks).pid_ns),
        start_ticks: ticks,
        generation: 1,
        published_unix_ms: 0,
        interval_ms: 1000,
        rss: vec![],
        last_failure: None,
        supervisor: None,
        error_file: None,
        termination_log: None,
        dump: dump.clone(),
        kinds: None,
    };
    (path, w, serde_json::to_vec(&summary).unwrap())
}

/// `oomshim top --once ARGS --dir LIVE`'s frame (it exits 0).
fn top_once(live: &Path, args: &[&str]) -> String {
    let out = cli()
        .args(["top", "--once"])
        .args(args)
        .arg("--dir")
        .arg(live)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// A live directory (`DIR/live`) holding this process's region with the fixture published.
fn published_own_region() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut w, payload) = region_with(&dir.path().join("live"), &fixture_dump());
    w.publish(&payload).unwrap();
    (dir, path)
}

fn fixture_dump() -> Dump {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom_leak_steps.json");
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

/// Flips one byte of the newest payload in the region file.
fn damage_newest(path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut h = vec![0u8; 4096];
    f.read_exact_at(&mut h, 0).unwrap();
    let latest = u64::from_le_bytes(h[40..48].try_into().unwrap());
    let off = oomshim_core::flight::layout::slot_payload_offset(latest % 2) + 10;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0x55], off).unwrap();
}

#[test]
fn a_region_torn_mid_update_is_rejected_and_the_previous_publish_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let (path, mut w, payload) = region_with(&live, &fixture_dump());
    assert_eq!(read_region(&path).unwrap_err(), ReadError::Empty);
    w.publish(&payload).unwrap();
    // A writer killed mid-update leaves the next slot half-written: the newest complete
    // publish is still read, whole.
    w.publish_torn(&payload).unwrap();
    let s = read_region(&path).unwrap();
    assert!(!s.from_previous);
    assert_eq!(s.summary.dump, fixture_dump());
    // A damaged newest publish: the one before it is read, and said to be.
    w.publish(&payload).unwrap();
    damage_newest(&path);
    let s = read_region(&path).unwrap();
    assert!(s.from_previous);
    // Both damaged: rejected, in words, and `top` says so without failing.
    w.publish(&payload).unwrap();
    damage_newest(&path);
    w.publish_torn(&payload).unwrap();
    let err = read_region(&path).unwrap_err();
    assert!(matches!(err, ReadError::Torn(_)), "{err:?}");
    assert!(err.to_string().contains("torn and was rejected"), "{err}");
    let out = cli()
        .args(["top", "--once", "--dir"])
        .arg(&live)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let frame = text(&out.stdout);
    assert!(
        frame.contains("the region is torn and was rejected"),
        "{frame}"
    );
}

#[test]
fn hostile_regions_get_a_clear_message_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    private_dir(&live);
    let pid = std::process::id();
    let ticks = start_ticks_of(pid).unwrap();
    // Pids above any pid_max: processes that surely do not run (pid + 1 may be a thread of
    // this very test binary, started in the same clock tick).
    let gone = 4_000_000_000u32;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x1b[2J not a region".to_vec()),
        ("short", b"OOMSHLI?x".to_vec()),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let p = live.join(region_name(gone + 1 + i as u32, ticks));
        fs::write(&p, bytes).unwrap();
        let e = read_region(&p).unwrap_err();
        assert!(matches!(e, ReadError::Invalid(_)), "{what}: {e:?}");
    }
    // A header claiming a payload far beyond its slot, and a payload of another schema.
    let (path, mut w, _) = region_with(&live, &fixture_dump());
    w.publish(br#"{"schema":"evil/9"}"#).unwrap();
    let e = read_region(&path).unwrap_err();
    assert!(e.to_string().contains("torn and was rejected"), "{e}");
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        let slot = oomshim_core::flight::layout::slot_desc_offset(1);
        f.write_all_at(&u64::MAX.to_le_bytes(), slot + 8).unwrap();
    }
    assert!(read_region(&path).is_err());
    // A file larger than any region is refused unread.
    let big = live.join(region_name(gone + 9, ticks));
    let f = fs::File::create(&big).unwrap();
    f.set_len(oomshim_core::flight::layout::REGION_BYTES + 1)
        .unwrap();
    assert!(matches!(read_region(&big), Err(ReadError::Invalid(_))));
    let out = cli()
        .args(["top", "--once", "--dir"])
        .arg(&live)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let frame = text(&out.stdout);
    assert!(
        !frame.contains('\x1b'),
        "no terminal escapes pass: {frame:?}"
    );
    // The three invalid regions name processes that are gone: folded into one line, each said
    // in full when asked for by its pid.
    assert!(
        frame.contains("3 gone processes left their regions behind"),
        "{frame}"
    );
    let mut said = 0;
    for p in [gone + 1, gone + 2, gone + 9] {
        let out = cli()
            .args(["top", "--once", "--pid", &p.to_string(), "--dir"])
            .arg(&live)
            .output()
            .unwrap();
        let one = text(&out.stdout);
        assert!(!one.contains('\x1b'), "{one:?}");
        said += one.matches("not a valid oomshim live region").count();
    }
    assert_eq!(said, 3);
}

/// The exporter's exposition for `live` (`oomshim exporter --once`), and its stderr.
fn exposition(live: &Path) -> (String, String) {
    let out = cli()
        .args(["exporter", "--once", "--dir"])
        .arg(live)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

/// The value of an exposition line that starts with `series`.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Issue 25 items 17 and 18: another local user can create `/dev/shm/oomshim-UID` before its
/// owner does, or the owner's may be writable by others; a region's header may name another
/// user. None of it is read (`oomshim run`'s post-mortem reads through `read_region` too), and
/// `top` and the exporter say what they ignored.
#[test]
fn a_live_directory_or_region_that_is_not_the_users_is_not_read() {
    use oomshim_core::flight::read::{check_live_dir, scan};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let (path, mut w, payload) = region_with(&live, &fixture_dump());
    w.publish(&payload).unwrap();
    assert!(read_region(&path).is_ok(), "this user's own region is read");

    // The directory writable by others (0777): nothing in it is read.
    fs::set_permissions(&live, fs::Permissions::from_mode(0o777)).unwrap();
    let why = check_live_dir(&live).unwrap_err();
    assert!(why.contains("writable by others"), "{why}");
    let listing = scan(&live);
    assert!(listing.regions.is_empty(), "{listing:?}");
    assert_eq!(listing.ignored.len(), 1, "said once: {listing:?}");
    assert!(matches!(read_region(&path), Err(ReadError::Foreign(_))));
    let out = cli()
        .args(["top", "--once", "--dir"])
        .arg(&live)
        .output()
        .unwrap();
    let frame = text(&out.stdout);
    assert!(frame.contains("0 processes"), "{frame}");
    assert_eq!(frame.matches("writable by others").count(), 1, "{frame}");
    let (metrics, stderr) = exposition(&live);
    assert!(!metrics.contains("hw_gpu_memory_usage_bytes"), "{metrics}");
    assert_eq!(
        sample(&metrics, "oomshim_exporter_regions{state=\"foreign\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, "oomshim_exporter_region_errors_total"),
        Some(0.0)
    );
    assert_eq!(stderr.matches("writable by others").count(), 1, "{stderr}");
    fs::set_permissions(&live, fs::Permissions::from_mode(0o700)).unwrap();

    // A region whose header names another user: refused, whoever owns the file.
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let me = unsafe { libc::geteuid() };
    let pid = std::process::id();
    let ticks = start_ticks_of(pid).unwrap();
    let forged = live.join(region_name(pid + 1, ticks));
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&forged)
        .unwrap();
    fs::set_permissions(&forged, fs::Permissions::from_mode(0o600)).unwrap();
    let mut fw = RegionWriter::init(file, &id_of(pid + 1, ticks), me.wrapping_add(1)).unwrap();
    fw.publish(&payload).unwrap();
    let e = read_region(&forged).unwrap_err();
    assert!(matches!(e, ReadError::Foreign(_)), "{e:?}");
    assert!(e.to_string().contains("header names uid"), "{e}");
    let (metrics, _) = exposition(&live);
    assert_eq!(
        sample(&metrics, "oomshim_exporter_regions{state=\"foreign\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "oomshim_exporter_regions{state=\"read\"}"),
        Some(1.0),
        "{metrics}"
    );
    fs::remove_file(&forged).unwrap();

    // A region file of this user that others can write: ignored.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
    assert!(matches!(read_region(&path), Err(ReadError::Foreign(_))));
    assert!(scan(&live).regions.is_empty());
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();

    // Owned by another user (only root can make such files here).
    if me == 0 {
        let other = 4_000_321;
        std::os::unix::fs::lchown(&path, Some(other), None).unwrap();
        assert!(matches!(read_region(&path), Err(ReadError::Foreign(_))));
        assert!(scan(&live).regions.is_empty());
        std::os::unix::fs::lchown(&path, Some(me), None).unwrap();
        std::os::unix::fs::lchown(&live, Some(other), None).unwrap();
        let why = check_live_dir(&live).unwrap_err();
        assert!(why.contains("belongs to uid 4000321"), "{why}");
        assert!(matches!(read_region(&path), Err(ReadError::Foreign(_))));
        std::os::unix::fs::lchown(&live, Some(me), None).unwrap();
    } else {
        eprintln!("SKIPPED (part): files of another owner need root to create");
    }
    assert!(
        read_region(&path).is_ok(),
        "readable again once it is private"
    );
}

/// Issue 25 item 26: a region whose slot claims a full payload with a bad checksum used to be
/// re-read and slept on 8 times per read, so 50 of them made every scrape take seconds. Now a
/// region that sits still is read once, and not again until its header changes.
#[test]
fn a_region_that_stays_torn_costs_one_read_not_eight_per_scrape() {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    private_dir(&live);
    let pid = std::process::id();
    let ticks = start_ticks_of(pid).unwrap();
    let layout_slot = oomshim_core::flight::layout::SLOT_BYTES;
    let mut paths = Vec::new();
    for i in 0..12u32 {
        let p = live.join(region_name(pid + 1 + i, ticks));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        let mut w =
            // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
            RegionWriter::init(file, &id_of(pid + 1 + i, ticks), unsafe { libc::geteuid() }).unwrap();
        w.publish(b"{}").unwrap();
        w.publish(b"{}").unwrap();
        // Both slots claim a full payload whose checksum fails; the file is sparse.
        let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        for slot in 0..2 {
            let desc = oomshim_core::flight::layout::slot_desc_offset(slot);
            f.write_all_at(&layout_slot.to_le_bytes(), desc + 8)
                .unwrap();
        }
        f.set_len(oomshim_core::flight::layout::REGION_BYTES)
            .unwrap();
        paths.push(p);
    }
    let pass = || {
        let t = Instant::now();
        for p in &paths {
            let e = read_region(p).unwrap_err();
            assert!(matches!(e, ReadError::Torn(_)), "{e:?}");
        }
        t.elapsed()
    };
    let first = pass();
    let (second, third) = (pass(), pass());
    // Eight reads of 8 MiB and eight sleeps per region before: about 3 s for these twelve.
    assert!(
        second < Duration::from_millis(300) && third < Duration::from_millis(300),
        "first {first:?}, then {second:?} and {third:?}"
    );
    // What a scrape reports is unchanged: torn, counted.
    let (metrics, _) = exposition(&live);
    assert_eq!(
        sample(&metrics, "oomshim_exporter_regions{state=\"torn\"}"),
        Some(12.0),
        "{metrics}"
    );
}

/// Issue 25 item 27: a region not initialised yet (its process is starting) and one removed
/// between listing and reading (its process exited) are ordinary states, not region errors.
#[test]
fn starting_and_exiting_processes_are_not_region_errors() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    private_dir(&live);
    let pid = std::process::id();
    let ticks = start_ticks_of(pid).unwrap();
    // Created, header not written yet; and only the header's first bytes written.
    for (i, bytes) in [&b""[..], &b"OOMSH"[..]].iter().enumerate() {
        let p = live.join(region_name(pid + 1 + i as u32, ticks));
        fs::write(&p, bytes).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_region(&p).unwrap_err(), ReadError::Empty);
    }
    // Listed, then gone.
    let gone = live.join(region_name(pid + 7, ticks));
    assert_eq!(read_region(&gone).unwrap_err(), ReadError::Gone);
    let (metrics, stderr) = exposition(&live);
    assert_eq!(
        sample(&metrics, "oomshim_exporter_regions{state=\"empty\"}"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "oomshim_exporter_region_errors_total"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "oomshim_exporter_regions{state=\"invalid\"}"),
        Some(0.0),
        "{metrics}"
    );
    assert!(stderr.is_empty(), "{stderr}");
}

/// A program that closes every descriptor it did not open and reuses the numbers (with a limit
/// too low for the shim to move its own descriptors high) keeps writing to its own file while
/// the live summary goes on publishing: the publisher holds no descriptor between publishes, so
/// it never closes a number the program has since reused.
#[test]
fn a_program_reusing_descriptor_numbers_keeps_its_own_files_while_the_summary_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own.log");
    for launcher in ["preload", "run"] {
        let mut cmd = if launcher == "preload" {
            let mut c = Command::new(testbed::client("fd_reuse"));
            c.env("LD_PRELOAD", common::shim_lib())
                .env("OOMSHIM_DIR", dir.path().join("dumps"));
            c
        } else {
            let mut c = cli();
            c.args(["run", "--dir"])
                .arg(dir.path().join("dumps"))
                .arg("--")
                .arg(testbed::client("fd_reuse"))
                .env_remove("LD_PRELOAD");
            c
        };
        cmd.arg(&own)
            .env("OOMSHIM_LIVE_DIR", dir.path().join("live"))
            .env("OOMSHIM_LIVE_INTERVAL", "100ms")
            .env("SIMCUDA_CAPACITY", "1G");
        let out = common::wait_with_watchdog(
            {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
                cmd
            },
            Duration::from_secs(60),
        );
        assert!(
            out.status.success() && text(&out.stdout).contains("wrote 75 of 75 lines"),
            "{launcher}: stdout {} stderr {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let written = fs::read_to_string(&own).unwrap();
        assert_eq!(written.lines().count(), 75, "{launcher}: {written}");
        assert!(
            written.lines().all(|l| l.starts_with("line ")),
            "{launcher}: the shim's bytes in the program's file"
        );
    }
}

/// Issue 40: every path in the shim's messages is escaped as the CLI's are: a newline in
/// `OOMSHIM_DIR` (a directory name may hold one) cannot split the `dump:` line into a second,
/// forged `oomshim:` line, nor an escape sequence drive the terminal.
#[test]
fn a_newline_in_the_dump_directory_cannot_split_the_shims_dump_line() {
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("dumps\noomshim: forged line \x1b[2J");
    let mut cmd = Command::new(testbed::client("leak_until_oom"));
    cmd.env("LD_PRELOAD", common::shim_lib())
        .env("OOMSHIM_DIR", &dumps)
        .env("OOMSHIM_LIVE_DIR", dir.path().join("live"))
        .env("OOMSHIM_SETTLE", "0")
        .env("SIMCUDA_CAPACITY", "1G")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let out = common::wait_with_watchdog(cmd, Duration::from_secs(60));
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err:?}");
    assert!(
        lines[0].starts_with("oomshim: CUDA out of memory"),
        "{err:?}"
    );
    assert!(
        lines[1].starts_with("oomshim:   dump: ")
            && lines[1].contains("dumps\\noomshim: forged line \\u{1b}[2J/"),
        "{err:?}"
    );
    assert!(!err.contains('\x1b'), "{err:?}");
    // The dump is where the line says, under the name with its newline.
    assert_eq!(common::dump_files(&dumps).len(), 1);
}

/// A region file of process `id` in `live`, published once, last written `age` ago.
fn aged_region(live: &Path, id: oomshim_core::flight::RegionId, age: Duration) -> PathBuf {
    let (path, mut w) = new_region(live, id);
    w.publish(b"{}").unwrap();
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() - age).unwrap();
    path
}

/// Issue 40: regions of dead processes do not pile up in shared memory: one nobody wrote for
/// an hour (gone, or of another pid namespace) is removed when the next shimmed process creates
/// its own region there; a running process's region is never removed, whatever its age, and a
/// recent one of a gone process is left for `oomshim run` or `top`.
#[test]
fn stale_regions_expire_when_a_process_creates_its_own_and_running_ones_never_do() {
    use oomshim_core::flight::{own_pid_ns, RegionId, EXPIRE_AFTER};
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let ns = own_pid_ns().unwrap();
    let me = RegionId::of_this_process().unwrap();
    let old = EXPIRE_AFTER + Duration::from_secs(60);
    let running = aged_region(&live, me, old);
    let gone_old = aged_region(
        &live,
        RegionId {
            start_ticks: me.start_ticks + 1,
            ..me
        },
        old,
    );
    let gone_recent = aged_region(
        &live,
        RegionId {
            start_ticks: me.start_ticks + 2,
            ..me
        },
        Duration::from_secs(5),
    );
    let foreign_old = aged_region(
        &live,
        RegionId {
            pid_ns: ns + 1,
            pid: 1,
            start_ticks: 7,
        },
        old,
    );
    let foreign_recent = aged_region(
        &live,
        RegionId {
            pid_ns: ns + 1,
            pid: 2,
            start_ticks: 7,
        },
        Duration::from_secs(5),
    );
    // A shimmed program that allocates creates its region, sweeps, then publishes.
    let mut cmd = Command::new(testbed::client("flight_growth"));
    cmd.arg("slow")
        .env("LD_PRELOAD", common::shim_lib())
        .env("OOMSHIM_DIR", dir.path().join("dumps"))
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("SIMCUDA_CAPACITY", "64G")
        .stderr(Stdio::null());
    let mut child = spawn_ready(&mut cmd);
    let own = live.join(
        RegionId {
            pid_ns: ns,
            pid: child.id(),
            start_ticks: start_ticks_of(child.id()).unwrap(),
        }
        .file_name(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_region(&own).is_err() {
        assert!(Instant::now() < deadline, "no publish");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    for (path, kept) in [
        (&running, true),
        (&gone_old, false),
        (&gone_recent, true),
        (&foreign_old, false),
        (&foreign_recent, true),
    ] {
        assert_eq!(path.exists(), kept, "{path:?}");
    }
}

/// Issue 40: a region is read only under its own name: a file whose header names another
/// process (a region copied or renamed over another's) is refused, so nothing takes it for
/// the process its name says.
#[test]
fn a_region_whose_header_names_another_process_is_refused() {
    let (dir, path) = published_own_region();
    let live = dir.path().join("live");
    assert!(read_region(&path).is_ok());
    let pid = std::process::id();
    let other = live.join(region_name(pid + 1, start_ticks_of(pid).unwrap()));
    fs::copy(&path, &other).unwrap();
    let e = read_region(&other).unwrap_err();
    assert!(
        e.to_string()
            .contains("its header names another process than its file name"),
        "{e}"
    );
}

/// Issue 40: `top` on a small terminal keeps its header and the running processes: the regions
/// gone processes left fold into one line, and every line fits the width.
#[test]
fn top_lists_running_processes_first_folds_gone_ones_and_fits_the_terminal() {
    use oomshim_core::flight::RegionId;
    let (dir, _) = published_own_region();
    let live = dir.path().join("live");
    let me = RegionId::of_this_process().unwrap();
    for i in 1..=40 {
        aged_region(
            &live,
            RegionId {
                start_ticks: me.start_ticks + i,
                ..me
            },
            Duration::from_secs(1),
        );
    }
    let out = cli()
        .args(["top", "--once", "--dir"])
        .arg(&live)
        .env("COLUMNS", "60")
        .env("LINES", "12")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let frame = text(&out.stdout);
    let lines: Vec<&str> = frame.lines().collect();
    assert!(lines.len() <= 12, "{frame}");
    assert!(lines.iter().all(|l| l.chars().count() <= 60), "{frame}");
    assert!(
        lines[0].starts_with("oomshim top — 1 process, 40 gone"),
        "{frame}"
    );
    assert!(
        lines[2].starts_with(&format!("pid {}  running", me.pid)),
        "{frame}"
    );
    // Unclipped, the gone ones are one line, after the running one.
    let full = cli()
        .args(["top", "--once", "--dir"])
        .arg(&live)
        .env_remove("COLUMNS")
        .env_remove("LINES")
        .output()
        .unwrap();
    let full = text(&full.stdout);
    assert_eq!(
        full.matches("left their regions behind").count(),
        1,
        "{full}"
    );
    assert!(
        full.contains("40 gone processes left their regions behind"),
        "{full}"
    );
    assert!(
        full.find("running").unwrap() < full.find("gone processes").unwrap(),
        "{full}"
    );
    assert!(!full.contains(" gone (its region"), "folded: {full}");
}

/// A program that closes its stderr while it keeps running gives its reader the end of that
/// stream at once, as bare: the live summary's publisher holds no copy of the program's stderr.
#[test]
fn a_program_closing_its_stderr_gives_its_reader_the_end_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(testbed::client("closes_stderr"))
        .env("LD_PRELOAD", common::shim_lib())
        .env("OOMSHIM_DIR", dir.path().join("dumps"))
        .env("OOMSHIM_LIVE_DIR", dir.path().join("live"))
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("SIMCUDA_CAPACITY", "1G")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut line = [0u8; 7];
    stdout.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"closed\n");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stderr.read_to_end(&mut rest);
        let _ = tx.send(rest);
    });
    let ended = rx.recv_timeout(Duration::from_millis(1500));
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        ended.is_ok(),
        "stderr did not end when the program closed it (the program runs 3 s more)"
    );
    assert!(still_running, "the program ended before the check");
}

/// A model moved onto an H100 (6 layers, 19.71 GiB through `Module.to`), SIGKILLed a second
/// after the load: its post-mortem (the dump `oomshim run` wrote there, stacks trimmed) must
/// name the program's line and call it a load, not the anonymous "process" that "stopped".
#[test]
fn a_model_load_killed_after_it_is_named_a_load_at_the_programs_line() {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/post_mortem_model_load.json");
    let dump: Dump = serde_json::from_slice(&fs::read(p).unwrap()).unwrap();
    let verdict = oomshim_core::verdict::judge_post_mortem(&dump);
    let top = &verdict.findings[0].headline;
    assert!(top.starts_with("killed by SIGKILL from outside"), "{top}");
    assert!(
        top.contains("load_model.py:14"),
        "the program's line: {top}"
    );
    assert!(top.contains("a model being loaded, not a leak"), "{top}");
    // Its six allocations fall into one bin of the timeline: no span was measured, and none is
    // said (`over 0.0 s` would read as a load of no time).
    assert!(!top.contains("0.0 s"), "{top}");
    assert!(!verdict.findings.iter().any(|f| f.kind == "leak"));
}
