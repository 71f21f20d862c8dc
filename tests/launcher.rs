//! `oomshim run` as invisible to job control as the program run bare:
//! each scenario runs the same command bare and under `oomshim run --` and compares what the
//! user and the caller see. Terminal scenarios drive an interactive `bash --norc --noprofile -i`
//! in a pty, as a user at a terminal would (Ctrl-Z, `bg`, `fg`, `jobs`, `kill %1`, `echo $?`).
//! Every wait is bounded: a hang fails the test with the transcript, never blocks the suite.

use crate::common;

use common::{shim_lib, wait_until_stopped};
use oomshim_cli::testbed;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn oomshim() -> PathBuf {
    shim_lib();
    PathBuf::from(env!("CARGO_BIN_EXE_oomshim"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A tool the test needs, or a visible skip (a failure under CI).
fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{tool} is needed by this test (CI is set)"
        );
        eprintln!("SKIPPED: {tool} is not installed");
    }
    found
}

// ---------------------------------------------------------------------------------------------
// An interactive bash in a pty

struct Shell {
    master: fs::File,
    out: Arc<Mutex<Vec<u8>>>,
    pos: usize,
    child: Child,
    _dir: tempfile::TempDir,
}

const WAIT: Duration = Duration::from_secs(20);

impl Shell {
    fn start() -> Shell {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, mut s) = (-1, -1);
        let ws = libc::winsize {
            ws_row: 40,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let rc =
            // SAFETY: `openpty` writes the two descriptors into locals; the name and termios are NULL
            // and the window size a local.
            unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
        assert_eq!(rc, 0, "openpty");
        // SAFETY: a descriptor `openpty` just opened, owned by this File alone.
        let master = unsafe { fs::File::from_raw_fd(m) };
        // SAFETY: a descriptor `openpty` just opened, owned by this OwnedFd alone.
        let slave = unsafe { OwnedFd::from_raw_fd(s) };
        let mut cmd = Command::new("bash");
        cmd.args(["--norc", "--noprofile", "-i"])
            .current_dir(dir.path())
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .env("INPUTRC", "/dev/null")
            .env("HOME", dir.path())
            .env("OOMSHIM_LIVE_DIR", dir.path().join("live"))
            .env("OOMSHIM_DIR", dir.path().join("dumps"))
            .env_remove("LD_PRELOAD")
            .env_remove("HISTFILE")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
        // calls (setrlimit, setsid, ioctl) on values of its own.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("bash");
        let out = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink.lock().unwrap().extend_from_slice(&buf[..n]),
                }
            }
        });
        let mut sh = Shell {
            master,
            out,
            pos: 0,
            child,
            _dir: dir,
        };
        sh.line("set +o history; set -b; bind 'set enable-bracketed-paste off' 2>/dev/null; echo RE\"ADY\"");
        sh.expect("READY");
        sh
    }

    fn send(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    fn line(&mut self, l: &str) {
        self.send(format!("{l}\n").as_bytes());
    }

    fn transcript(&self) -> String {
        text(&self.out.lock().unwrap())
    }

    /// Waits until `pat` appears after what was already matched; returns the text up to and
    /// including it. Panics with the transcript after [`WAIT`].
    fn expect(&mut self, pat: &str) -> String {
        self.try_expect(pat, WAIT)
            .unwrap_or_else(|| panic!("{pat:?} never came; transcript:\n{}", self.transcript()))
    }

    fn try_expect(&mut self, pat: &str, limit: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            {
                let out = self.out.lock().unwrap();
                let t = text(&out[self.pos..]);
                if let Some(i) = t.find(pat) {
                    let upto = t[..i + pat.len()].to_string();
                    self.pos += upto.len();
                    return Some(upto);
                }
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `$?` of the last foreground command, through a marker the echoed input cannot match.
    fn status(&mut self) -> i32 {
        self.line("echo \"ST\"\"ATUS=$?.\"");
        self.expect("STATUS=");
        let rest = self.expect(".");
        rest.trim_end_matches('.').trim().parse().unwrap()
    }

    /// The shell is still there and answers.
    fn alive(&mut self) -> bool {
        self.line("echo \"AL\"\"IVE\"");
        self.try_expect("ALIVE", Duration::from_secs(10)).is_some()
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The whole session: bash, the jobs, oomshim and what it ran.
        let sid = self.child.id() as i32;
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(-sid, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command prefix: bare, or under `oomshim run --`.
fn prefixes() -> [(String, &'static str); 2] {
    [
        (String::new(), "bare"),
        (format!("{} run -- ", oomshim().display()), "oomshim run"),
    ]
}

// ---------------------------------------------------------------------------------------------
// Terminal and job control (items 5, 7, 9)

/// Ctrl-Z stops the job, `bg` continues it in the background, `fg` brings it back and it reads
/// the terminal; the shell survives and `$?` is the program's.
#[test]
fn ctrl_z_then_bg_then_fg_behaves_as_bare() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        sh.line(&format!(
            "{p}sh -c 'echo st\"arted\"; sleep 1; echo sl\"ept\"; read x; echo \"got=$x\"; exit 3'"
        ));
        sh.expect("started");
        std::thread::sleep(Duration::from_millis(200));
        sh.send(&[0x1a]); // Ctrl-Z
        sh.expect("Stopped");
        assert_eq!(sh.status(), 148, "{what}: {}", sh.transcript());
        sh.line("bg");
        sh.expect("slept");
        // Its read of the terminal from the background stops it (SIGTTIN), as bare.
        sh.expect("Stopped");
        assert!(sh.alive(), "{what}: the shell died\n{}", sh.transcript());
        sh.line("fg");
        std::thread::sleep(Duration::from_millis(300));
        sh.line("hello");
        sh.expect("got=hello");
        assert_eq!(sh.status(), 3, "{what}: {}", sh.transcript());
        assert!(sh.alive(), "{what}: the shell died\n{}", sh.transcript());
    }
}

/// `PROG &` then `fg`: the program gets the terminal and reads it (item 7).
#[test]
fn a_background_job_brought_to_the_foreground_reads_the_terminal() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        sh.line(&format!("{p}sh -c 'sleep 0.5; read x; echo \"got=$x\"' &"));
        sh.expect("[1]");
        sh.line("fg");
        std::thread::sleep(Duration::from_millis(1200));
        sh.line("typed");
        assert!(
            sh.try_expect("got=typed", Duration::from_secs(10))
                .is_some(),
            "{what}: {}",
            sh.transcript()
        );
        assert_eq!(sh.status(), 0, "{what}");
    }
}

/// A program that reads the terminal at once, typed ahead: never stopped (item 9, the
/// start-up race of a process group of its own), five times.
#[test]
fn a_program_that_reads_the_terminal_at_once_is_never_stopped() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        for i in 0..5 {
            sh.line(&format!("{p}sh -c 'read x; echo \"got=$x\"'"));
            sh.line(&format!("ahead{i}"));
            let got = sh.try_expect(&format!("got=ahead{i}"), Duration::from_secs(10));
            assert!(got.is_some(), "{what}, run {i}: {}", sh.transcript());
            assert!(
                !sh.transcript().contains("Stopped"),
                "{what}: {}",
                sh.transcript()
            );
        }
    }
}

/// `PROG | reader-of-the-terminal` (as `less` reads keys from /dev/tty): the reader is not
/// stopped (item 6); and a program whose stdin is redirected still reads /dev/tty (item 8).
#[test]
fn terminal_readers_in_a_pipeline_and_with_stdin_redirected_are_not_stopped() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        sh.line(&format!(
            "{p}sh -c 'echo lines' | sh -c 'cat >/dev/null; read k </dev/tty; echo \"key=$k\"'"
        ));
        std::thread::sleep(Duration::from_millis(500));
        sh.line("q");
        assert!(
            sh.try_expect("key=q", Duration::from_secs(10)).is_some(),
            "{what}: {}",
            sh.transcript()
        );
        assert_eq!(sh.status(), 0, "{what}");
        sh.line(&format!(
            "{p}sh -c 'read pw </dev/tty; echo \"pw=$pw\"' </dev/null"
        ));
        std::thread::sleep(Duration::from_millis(500));
        sh.line("secret");
        assert!(
            sh.try_expect("pw=secret", Duration::from_secs(10))
                .is_some(),
            "{what}: {}",
            sh.transcript()
        );
        assert_eq!(sh.status(), 0, "{what}");
        assert!(
            !sh.transcript().contains("Stopped"),
            "{what}: {}",
            sh.transcript()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Signals (items 2, 3, 4, 10)

/// Signals ignored by the caller (`trap ''`: nohup's SIGHUP, SIGINT of a background job,
/// SIGPIPE) stay ignored in the program, and its mask is the caller's: the program's
/// `SigIgn`/`SigBlk` are the same bare and under oomshim (item 2); and it survives a hangup.
#[test]
fn ignored_signals_and_the_mask_reach_the_program_as_bare() {
    let mut seen = Vec::new();
    for (p, what) in prefixes() {
        let script = format!(
            "trap '' HUP INT PIPE; {p}grep -E 'Sig(Ign|Blk)' /proc/self/status; \
             {p}sh -c 'kill -HUP $$; echo survived'"
        );
        let o = Command::new("bash")
            .args(["-c", &script])
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        let out = text(&o.stdout);
        assert!(
            out.contains("survived"),
            "{what}: {out} {}",
            text(&o.stderr)
        );
        seen.push(out);
    }
    assert_eq!(seen[0], seen[1], "bare, then under oomshim run");
}

/// Started with SIGCHLD ignored, every exit status still comes through (item 1).
#[test]
fn sigchld_ignored_at_start_keeps_the_exit_status() {
    let helper = testbed::client("launcher_helper");
    for (code, sig) in [("exit 7", None), ("kill -TERM $$", Some(libc::SIGTERM))] {
        let o = Command::new(&helper)
            .args(["ignchld"])
            .arg(oomshim())
            .args(["run", "--", "sh", "-c", code])
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        match sig {
            None => assert_eq!(o.status.code(), Some(7), "{}", text(&o.stderr)),
            Some(s) => assert_eq!(o.status.signal(), Some(s), "{}", text(&o.stderr)),
        }
    }
}

/// `kill -TERM -PGID` of the job reaches the program's own children too (item 3): the
/// grandchild is gone, and `$?` is 143 as bare.
#[test]
fn a_group_kill_of_the_job_reaches_a_grandchild() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        sh.line(&format!(
            "{p}sh -c 'sleep 60 & echo \"g\"\"c=$!.\"; wait' &"
        ));
        sh.expect("gc=");
        let gc: i32 = sh.expect(".").trim_end_matches('.').trim().parse().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        sh.line("kill -TERM -- -$!; wait $!");
        assert_eq!(sh.status(), 143, "{what}: {}", sh.transcript());
        std::thread::sleep(Duration::from_millis(300));
        // Gone, or a zombie waiting for a parent that does not reap (PID 1 of a container).
        let alive = fs::read_to_string(format!("/proc/{gc}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        });
        assert!(
            !alive,
            "{what}: the grandchild {gc} survived the group kill"
        );
    }
}

/// SIGSTOP to the program alone, then SIGCONT to it alone: it goes on and ends, and whoever
/// waits gets its status (item 4: oomshim stayed stopped for good).
#[test]
fn stop_and_continue_of_the_program_alone_do_not_stop_the_launcher_for_good() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        sh.line(&format!(
            "{p}sh -c 'echo \"p\"\"id=$$.\"; sleep 1; echo af\"\"ter; exit 4' &"
        ));
        sh.expect("pid=");
        let pid: i32 = sh.expect(".").trim_end_matches('.').trim().parse().unwrap();
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        sh.expect("after");
        // bash may not have seen the continue yet (`wait` of a job it thinks stopped: 147).
        sh.line(
            "r=147; while [ $r = 147 ]; do wait $! 2>/dev/null; r=$?; [ $r = 147 ] && sleep 0.1; done; (exit $r)",
        );
        assert_eq!(sh.status(), 4, "{what}: {}", sh.transcript());
        assert!(
            sh.transcript().contains("after"),
            "{what}: {}",
            sh.transcript()
        );
    }
}

/// A real-time signal sent to the job's pid reaches the program once and kills nothing
/// (item 10; `OOMSHIM_SIGNAL` accepts one to ask for a dump).
#[test]
fn a_real_time_signal_to_the_launcher_reaches_the_program_once() {
    if !have("bash") {
        return;
    }
    for (p, what) in prefixes() {
        let mut sh = Shell::start();
        sh.line(&format!(
            "{p}bash -c 'trap \"echo got-\"\"rt\" RTMIN+3; echo rea\"\"dy; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1; done; echo e\"\"nd' &"
        ));
        sh.expect("ready");
        sh.line("kill -RTMIN+3 $!; wait $!");
        assert_eq!(sh.status(), 0, "{what}: {}", sh.transcript());
        let t = sh.transcript();
        assert_eq!(t.matches("got-rt").count(), 1, "{what}: {t}");
        assert!(t.contains("end\r\n"), "{what}: {t}");
    }
}

/// `count_signals` under `oomshim run` in its own group, signalled by pid or by group: once.
/// `oomshim run` of the signal-counting client in its own process group, once the client said
/// it is ready: the launcher and the client's stdout.
fn start_counter() -> (std::process::Child, std::process::ChildStdout) {
    let mut cmd = Command::new(oomshim());
    cmd.args(["run", "--"])
        .arg(testbed::client("count_signals"))
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf).unwrap();
    (child, out)
}

/// What the counting client saw (`term N int M`), after a clean exit.
fn counts(mut child: std::process::Child, mut out: std::process::ChildStdout) -> String {
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    rest.trim().to_string()
}

fn counted(by_group: bool, sig: i32) -> String {
    let (child, out) = start_counter();
    let target = child.id() as i32;
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(if by_group { -target } else { target }, sig) };
    counts(child, out)
}

/// The pid of `oomshim run`'s sentinel (its child named `oomshim-signals`).
fn sentinel_of(launcher: i32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(close) = stat.rfind(')') else {
                continue;
            };
            let comm = &stat[stat.find('(').unwrap() + 1..close];
            let ppid: i32 = stat[close + 1..]
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse()
                .unwrap();
            if ppid == launcher && comm == "oomshim-signals" {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "no sentinel under {launcher}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A loaded machine that does not schedule the sentinel for a while (here: the sentinel
/// stopped for 300 ms, far past the 50 ms oomshim waits for its word): a signal to the group
/// still reaches the program once, not twice (oomshim sees it pending in the sentinel and
/// waits), and a signal to oomshim's pid alone is still passed on.
#[test]
fn a_group_signal_reaches_the_program_once_while_the_sentinel_is_slow() {
    for by_group in [true, false] {
        let (child, out) = start_counter();
        let launcher = child.id() as i32;
        let sentinel = sentinel_of(launcher);
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(sentinel, libc::SIGSTOP) };
        // Stopped before the signal is sent (not while it takes one): the signal then waits,
        // pending, in the stopped sentinel, as in one the machine has not scheduled yet.
        wait_until_stopped(sentinel as u32);
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(if by_group { -launcher } else { launcher }, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(sentinel, libc::SIGCONT) };
        let rest = counts(child, out);
        assert_eq!(
            rest,
            "term 1 int 0",
            "sent to the {}",
            if by_group { "group" } else { "pid" }
        );
    }
}

#[test]
fn signals_by_pid_and_by_group_reach_the_program_exactly_once() {
    for _ in 0..3 {
        assert_eq!(counted(false, libc::SIGTERM), "term 1 int 0");
        assert_eq!(counted(true, libc::SIGTERM), "term 1 int 0");
        assert_eq!(counted(true, libc::SIGINT), "term 0 int 1");
    }
}

// ---------------------------------------------------------------------------------------------
// Exit status, descriptors and stderr (items 11, 12, 13)

/// A program that dumps core: the caller's wait status has the core flag, as bare (item 11).
#[test]
fn the_core_dumped_flag_reaches_the_caller() {
    let helper = testbed::client("launcher_helper");
    let mut seen = Vec::new();
    for (p, what) in prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(&helper);
        cmd.arg("waitcore");
        if !p.is_empty() {
            cmd.arg(oomshim()).args(["run", "--"]);
        }
        cmd.args(["sh", "-c", "kill -SEGV $$"])
            .current_dir(dir.path())
            .env_remove("LD_PRELOAD");
        // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
        // calls (setrlimit, setsid, ioctl) on values of its own.
        unsafe {
            cmd.pre_exec(|| {
                let rl = libc::rlimit {
                    rlim_cur: libc::RLIM_INFINITY,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &rl);
                Ok(())
            });
        }
        let o = cmd.output().unwrap();
        let out = text(&o.stdout);
        assert!(
            out.starts_with("signal 11"),
            "{what}: {out} {}",
            text(&o.stderr)
        );
        seen.push(out);
    }
    if seen[0].contains("core 0") {
        eprintln!("NOTE: no core is dumped here (core_pattern), so only the signal is compared");
    }
    assert_eq!(seen[0], seen[1], "bare, then under oomshim run");
}

/// The program closes its stdin: the writer at the other end gets EPIPE at once, not when
/// the program ends (item 12: oomshim kept its copy of stdin).
#[test]
fn a_writer_into_the_programs_stdin_gets_epipe_once_the_program_closes_it() {
    for (p, what) in prefixes() {
        let mut cmd = if p.is_empty() {
            Command::new("sh")
        } else {
            let mut c = Command::new(oomshim());
            c.args(["run", "--", "sh"]);
            c
        };
        cmd.args(["-c", "exec 0<&-; sleep 4"])
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let start = Instant::now();
        let chunk = [b'y'; 4096];
        let mut w = &stdin;
        let epipe = loop {
            match w.write(&chunk) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break true,
                Err(_) | Ok(0) => break false,
                Ok(_) => {}
            }
            if start.elapsed() > Duration::from_secs(3) {
                break false;
            }
        };
        let elapsed = start.elapsed();
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            epipe && elapsed < Duration::from_secs(3),
            "{what}: no EPIPE within 3 s ({elapsed:?})"
        );
    }
}

/// `oomshim run -- PROG 2>&1 | head -c0`: a SIGKILLed program is reported as killed by
/// SIGKILL (137), not as a crash of oomshim (101) when its post-mortem line meets the closed
/// pipe (item 13).
#[test]
fn a_closed_stderr_pipe_never_turns_a_sigkill_into_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let mut cmd = Command::new(oomshim());
    cmd.args(["run", "--dir"])
        .arg(dir.path().join("dumps"))
        .arg("--")
        .arg(testbed::client("flight_leak"))
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("SIMCUDA_CAPACITY", "64G")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stderr.take()); // the reader is gone
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf).unwrap();
    common::wait_for_published_step(&live, 41);
    let regions = oomshim_core::flight::read::list_regions(&live);
    assert_eq!(regions.len(), 1, "{regions:?}");
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(regions[0].pid as i32, libc::SIGKILL) };
    let st = wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
}

fn wait_bounded(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("watchdog: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// The whole tree, the live directory and the dump mode (items 14, 19, 20)

fn dumps_in(dir: &Path) -> Vec<(PathBuf, dump::model::Dump)> {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .map(|p| {
                    let d = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
                    (p, d)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Under a wrapper (`bash -c` that started it in the background and moved on), a SIGKILLed
/// grandchild gets its post-mortem and leaves no region (item 14).
#[test]
fn a_sigkilled_grandchild_under_a_wrapper_gets_a_post_mortem() {
    let t = start_tree("sh -c '{client} > {ready} &'; sleep 30");
    let gc = t.ready_grandchild();
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(gc as i32, libc::SIGKILL) };
    let (found, err, t) = t.dumps_within(Duration::from_secs(20));
    assert_eq!(found.len(), 1, "no post-mortem of the grandchild: {err}");
    let d = &found[0].1;
    assert_eq!(d.reason, "post_mortem");
    assert_eq!(d.process.pid, gc);
    assert_eq!(d.post_mortem.as_ref().unwrap().signal, Some(libc::SIGKILL));
    assert!(oomshim_core::flight::read::list_regions(&t.live).is_empty());
}

/// `oomshim run --dir DUMPS -- bash -c SCRIPT` with its own live directory, in a group of its
/// own (the test kills the group at the end); `{client}` and `{ready}` in SCRIPT are replaced.
struct Tree {
    child: Child,
    pgid: i32,
    live: PathBuf,
    dumps: PathBuf,
    ready: PathBuf,
    _dir: tempfile::TempDir,
}

fn start_tree(script: &str) -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let dumps = dir.path().join("dumps");
    let ready = dir.path().join("ready");
    let script = script
        .replace(
            "{client}",
            &testbed::client("flight_leak").display().to_string(),
        )
        .replace("{ready}", &ready.display().to_string());
    let mut cmd = Command::new(oomshim());
    cmd.args(["run", "--dir"])
        .arg(&dumps)
        .args(["--", "bash", "-c", &script])
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("SIMCUDA_CAPACITY", "64G")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().unwrap();
    let pgid = child.id() as i32;
    Tree {
        child,
        pgid,
        live,
        dumps,
        ready,
        _dir: dir,
    }
}

impl Tree {
    /// The grandchild's pid, once it printed "ready" and published a region.
    fn ready_grandchild(&self) -> u32 {
        let start = Instant::now();
        while !fs::read_to_string(&self.ready).is_ok_and(|t| t.contains("ready")) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "flight_leak never got ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        common::wait_for_published_step(&self.live, 41);
        let regions = oomshim_core::flight::read::list_regions(&self.live);
        assert_eq!(regions.len(), 1, "{regions:?}");
        regions[0].pid
    }

    /// The dumps written within `limit` (as soon as there is one), then the group is killed:
    /// (dumps, oomshim's stderr).
    fn dumps_within(
        mut self,
        limit: Duration,
    ) -> (Vec<(PathBuf, dump::model::Dump)>, String, Self) {
        let start = Instant::now();
        let found = loop {
            let d = dumps_in(&self.dumps);
            if !d.is_empty() || start.elapsed() > limit {
                break d;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        let _ = wait_bounded(&mut self.child, Duration::from_secs(30));
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (found, err, self)
    }
}

/// A grandchild whose own parent reaps it (torchrun's workers, `bash -c 'prog & wait'`, a
/// Python launcher's `Popen`): the SIGKILL never reaches oomshim's `waitpid`, yet it gets its
/// post-mortem, with the signal read while it was a zombie and the parent that reaped it, and
/// its region is gone (item 14).
#[test]
fn a_sigkilled_grandchild_its_living_parent_reaps_gets_a_post_mortem() {
    if !have("python3") {
        return;
    }
    // A parent that reaps late: the grandchild is a zombie for seconds.
    let t = start_tree(
        "python3 -c 'import subprocess, sys, time\n\
         p = subprocess.Popen([sys.argv[1]], stdout=open(sys.argv[2], \"w\"))\n\
         print(p.pid, file=sys.stderr)\n\
         while p.poll() is None: time.sleep(3)\n\
         time.sleep(30)' {client} {ready}; true",
    );
    let gc = t.ready_grandchild();
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(gc as i32, libc::SIGKILL) };
    let (found, err, t) = t.dumps_within(Duration::from_secs(20));
    assert_eq!(found.len(), 1, "no post-mortem of the grandchild: {err}");
    let d = &found[0].1;
    assert_eq!(d.reason, "post_mortem");
    assert_eq!(d.process.pid, gc);
    let pm = d.post_mortem.as_ref().unwrap();
    assert_eq!(pm.signal, Some(libc::SIGKILL), "{pm:?}");
    assert!(pm.reaped_by.is_some(), "{pm:?}");
    let top = &d.verdict.findings[0].headline;
    assert!(top.contains("killed by SIGKILL from outside"), "{top}");
    assert!(top.contains("leak: keep_activations"), "{top}");
    assert!(
        err.contains(&format!("oomshim: post-mortem (reconstructed): {top}")),
        "{err}"
    );
    assert!(oomshim_core::flight::read::list_regions(&t.live).is_empty());
}

/// A parent that reaps at once (`bash`'s `wait`): the status may be gone before oomshim reads
/// it; the post-mortem is written all the same, saying what is and is not known.
#[test]
fn a_sigkilled_grandchild_reaped_at_once_still_gets_a_post_mortem() {
    let t = start_tree("{client} > {ready} & wait $!; sleep 30");
    let gc = t.ready_grandchild();
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    unsafe { libc::kill(gc as i32, libc::SIGKILL) };
    let (found, err, t) = t.dumps_within(Duration::from_secs(20));
    assert_eq!(found.len(), 1, "no post-mortem of the grandchild: {err}");
    let d = &found[0].1;
    assert_eq!(d.process.pid, gc);
    let pm = d.post_mortem.as_ref().unwrap();
    assert_eq!(pm.exit_code, None, "{pm:?}");
    let top = &d.verdict.findings[0].headline;
    match pm.signal {
        Some(sig) => assert_eq!(sig, libc::SIGKILL, "{pm:?}"),
        None => {
            assert!(top.contains("which one is not known"), "{top}");
            assert!(d
                .verdict
                .evidence
                .iter()
                .any(|e| e.contains("ran no exit handler")));
        }
    }
    assert_eq!(d.verdict.kind, oomshim_core::verdict::KILLED_BY_SIGNAL);
    assert!(top.contains("leak: keep_activations"), "{top}");
    assert!(oomshim_core::flight::read::list_regions(&t.live).is_empty());
}

/// A grandchild that ends on purpose without exit handlers (`_exit`, as Python's `os._exit`
/// and forked workers do) is not taken for a killed one: no post-mortem, no region left.
#[test]
fn a_grandchild_ending_by_underscore_exit_gets_no_post_mortem() {
    let t = start_tree("{client} _exit > {ready}; echo done >> {ready}; sleep 30");
    let start = Instant::now();
    while !fs::read_to_string(&t.ready).is_ok_and(|t| t.contains("done")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "flight_leak _exit never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two scans of the live directory after its end.
    let (found, err, t) = t.dumps_within(Duration::from_millis(1500));
    assert!(
        found.is_empty(),
        "a post-mortem of a deliberate _exit: {found:?} {err}"
    );
    assert!(!err.contains("post-mortem"), "{err}");
    assert!(oomshim_core::flight::read::list_regions(&t.live).is_empty());
}

/// A relative `OOMSHIM_LIVE_DIR` is where the program started, not where it moved to before
/// its first CUDA call: the post-mortem is written, the region is not left behind (item 19).
/// Its permission bits follow `OOMSHIM_DUMP_MODE` as the program's own dumps do (item 20).
#[test]
fn a_relative_live_dir_and_the_dump_mode_are_honoured_by_the_post_mortem() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    for via_run in [true, false] {
        let dumps = dir.path().join(format!("dumps-{via_run}"));
        let live = format!("live-{via_run}");
        let leak = testbed::client("flight_leak");
        let mut cmd = if via_run {
            // A wrapper that moves before the program starts: oomshim run passes the directory
            // on absolute.
            let mut c = Command::new(oomshim());
            c.args(["run", "--dir"]).arg(&dumps).args([
                "--",
                "sh",
                "-c",
                &format!("cd {} && exec {}", elsewhere.display(), leak.display()),
            ]);
            c
        } else {
            // The shim alone (plain LD_PRELOAD), in a program that moves before its first
            // CUDA call: the shim resolves the directory where it was loaded.
            let mut c = Command::new("env");
            c.arg(format!("LD_PRELOAD={}", shim_lib().display()))
                .arg(&leak)
                .args(["chdir", elsewhere.to_str().unwrap()]);
            c
        };
        cmd.current_dir(dir.path())
            .env("OOMSHIM_LIVE_DIR", &live)
            .env("OOMSHIM_LIVE_INTERVAL", "100ms")
            .env("OOMSHIM_DUMP_MODE", "0640")
            .env("SIMCUDA_CAPACITY", "64G")
            .env_remove("LD_PRELOAD")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut buf = [0u8; 6];
        out.read_exact(&mut buf).unwrap();
        // Published since "ready" (a loaded runner may lag behind the program).
        common::wait_for_published_step(&dir.path().join(&live), 41);
        let regions = oomshim_core::flight::read::list_regions(&dir.path().join(&live));
        assert_eq!(
            regions.len(),
            1,
            "via run {via_run}: the region is not under the start directory: {regions:?}, elsewhere: {:?}",
            fs::read_dir(&elsewhere).map(|d| d.count())
        );
        assert!(!elsewhere.join(&live).exists(), "via run {via_run}");
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(regions[0].pid as i32, libc::SIGKILL) };
        let st = wait_bounded(&mut child, Duration::from_secs(60));
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        if via_run {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            let found = dumps_in(&dumps);
            assert_eq!(found.len(), 1, "{err}");
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&found[0].0).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o640, "the post-mortem's mode");
            assert!(oomshim_core::flight::read::list_regions(&dir.path().join(&live)).is_empty());
        }
    }
}
