//! `oomshim run` as the program's parent: it starts the program as its child, passes every
//! signal on once, mirrors how the program ended, and, when the program died without a dump of
//! its last state (killed by a signal, or exited non-zero right after a failed device
//! allocation whose dump was never written), writes a post-mortem dump from the program's live
//! region (src/core/flight).
//!
//! Signals: the child runs in a process group of its own, which is made the terminal's
//! foreground group when oomshim's was (as a shell does for a job), so Ctrl-C, Ctrl-Z and
//! terminal reads reach the program alone, once. Signals sent to oomshim's pid or to its
//! process group (`kill PID`, `kill -TERM -PGID` from `timeout` or a scheduler) reach only
//! oomshim, which sends each on to the child once. A kill of oomshim itself by SIGKILL takes the
//! child with it (`PR_SET_PDEATHSIG`), as a group kill would have. The exit status is the
//! program's own; a program killed by a signal leaves oomshim killed by the same signal.
//! `oomshim run --exec` replaces oomshim with the program instead (no post-mortem).

use super::run::{command, RunError, RunOptions};
use oomshim_core::flight;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};

static CHILD: AtomicI32 = AtomicI32::new(0);

/// Signals passed on to the child. SIGCHLD, SIGSTOP, SIGKILL, SIGCONT (handled with job
/// control) and the terminal's own stop signals are not.
const FORWARDED: &[libc::c_int] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGPWR,
    libc::SIGWINCH,
    libc::SIGXCPU,
];

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        unsafe { libc::kill(pid, sig) }; // async-signal-safe
    }
}

fn now_ms() -> u64 {
    dump::time::unix_ms(std::time::SystemTime::now())
}

/// Runs the program to its end. Returns the exit code to end with; a program killed by a signal
/// makes oomshim kill itself with it (this returns only if that failed).
pub fn supervise(opts: &RunOptions) -> Result<i32, RunError> {
    let mut cmd = command(opts)?;
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(137); // oomshim died before the program started
            }
            Ok(())
        });
    }
    let tty_fg = unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() };
    // The handlers are in place, and the signals held, before the program starts: one sent
    // the moment it runs is passed on once its pid is known, never lost or fatal to oomshim.
    // (The child starts with an empty mask; exec resets caught signals to their default.)
    let mut forwarded: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut forwarded);
        for &s in FORWARDED {
            libc::sigaddset(&mut forwarded, s);
            libc::signal(s, forward as *const () as libc::sighandler_t);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &forwarded, std::ptr::null_mut());
    }
    let spawned = cmd.spawn();
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &forwarded, std::ptr::null_mut()) };
            return Err(super::run::launch_error(&opts.command[0], e));
        }
    };
    let pid = child.id() as i32;
    CHILD.store(pid, Ordering::Relaxed);
    unsafe {
        libc::setpgid(pid, pid); // also here: whichever runs first
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::signal(libc::SIGTTIN, libc::SIG_IGN);
        libc::signal(libc::SIGTSTP, libc::SIG_IGN);
        if tty_fg {
            libc::tcsetpgrp(0, pid);
        }
        libc::sigprocmask(libc::SIG_UNBLOCK, &forwarded, std::ptr::null_mut());
    }
    let start_ticks = flight::start_ticks_of(pid as u32);
    let cgroup = flight::postmortem::cgroup_of(pid as u32, &flight::postmortem::cgroup_root());
    let oom_kill_before = cgroup.as_ref().and_then(flight::postmortem::oom_kills);

    let status = wait_with_job_control(pid, tty_fg);
    if tty_fg {
        unsafe { libc::tcsetpgrp(0, libc::getpgrp()) };
    }
    let death = flight::postmortem::Death {
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        core_dumped: libc::WIFSIGNALED(status) && libc::WCOREDUMP(status),
        exit_code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        unix_ms: now_ms(),
    };
    if let Some(ticks) = start_ticks {
        let region = flight::live_dir().join(flight::region_name(pid as u32, ticks));
        if region.exists() {
            post_mortem(opts, &region, &death, cgroup.as_ref(), oom_kill_before);
            let _ = std::fs::remove_file(&region);
        }
    }
    match death.signal {
        Some(sig) => Err(die_by(sig)),
        None => Ok(death.exit_code.unwrap_or(1)),
    }
}

/// Waits for the child to end; when it stops (Ctrl-Z), oomshim stops too, and passes the
/// continue on when it is continued.
fn wait_with_job_control(pid: i32, tty_fg: bool) -> libc::c_int {
    loop {
        let mut status = 0;
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return status;
        }
        if libc::WIFSTOPPED(status) {
            unsafe {
                if tty_fg {
                    libc::tcsetpgrp(0, libc::getpgrp());
                }
                libc::raise(libc::SIGSTOP);
                // Continued (`fg`, `bg`, SIGCONT): the job goes on.
                if tty_fg {
                    libc::tcsetpgrp(0, pid);
                }
                libc::kill(-pid, libc::SIGCONT);
            }
            continue;
        }
        return status;
    }
}

/// Ends oomshim by the program's signal, so its parent sees what it would have seen without
/// oomshim (no core file of oomshim's own).
fn die_by(sig: libc::c_int) -> RunError {
    unsafe {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
    }
    RunError {
        message: String::new(),
        code: 128 + sig,
    }
}

/// The directory the program's shim wrote dumps to: `--dir`, else `OOMSHIM_DIR`, else
/// `oomshim-dumps`, relative to where the program started (here).
fn dump_dir(opts: &RunOptions) -> PathBuf {
    let dir = opts
        .dir
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("OOMSHIM_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(oomshim_core::config::DEFAULT_DIR));
    oomshim_core::config::resolve_dir(&dir, std::env::current_dir().ok().as_deref())
}

fn post_mortem(
    opts: &RunOptions,
    region: &std::path::Path,
    death: &flight::postmortem::Death,
    cgroup: Option<&(PathBuf, bool)>,
    oom_kill_before: Option<u64>,
) {
    let snapshot = match flight::read::read_region(region) {
        Ok(s) => s,
        Err(flight::read::ReadError::Empty) => return, // died before its first publish
        Err(e) => {
            if death.signal.is_some() {
                eprintln!("oomshim: no post-mortem dump: the program's live summary {e}");
            }
            return;
        }
    };
    if !flight::postmortem::needed(death, &snapshot) {
        return;
    }
    let host = flight::postmortem::host_now(cgroup, oom_kill_before);
    let dump = flight::postmortem::build(&snapshot, death, host);
    let headline = dump
        .verdict
        .findings
        .first()
        .map(|f| f.headline.clone())
        .unwrap_or_else(|| dump.verdict.summary.clone());
    let bytes = match serde_json::to_vec_pretty(&dump) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("oomshim: no post-mortem dump: {e}");
            return;
        }
    };
    let name = dump::write::DumpName {
        host: dump.process.host.clone(),
        pid: dump.process.pid,
        rank: dump.process.rank,
    };
    let clean = crate::report::units::clean;
    match dump::write::write_dump_with_mode(
        &dump_dir(opts),
        &name,
        &bytes,
        dump::write::file_mode(),
    ) {
        Ok(w) => {
            eprintln!("oomshim: post-mortem (reconstructed): {}", clean(&headline));
            eprintln!(
                "oomshim:   dump: {}  (details: oomshim report {})",
                w.path.display(),
                w.path.display()
            );
        }
        Err(e) => eprintln!(
            "oomshim: post-mortem (reconstructed): {}; no dump written: {e}",
            clean(&headline)
        ),
    }
}
