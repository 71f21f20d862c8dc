//! `oomshim run` as the program's parent, invisible to job control: it starts the program as its
//! child, stays out of the way of the terminal and of signals, ends as the program ended, and,
//! when the program (or an orphaned descendant) died without a dump of its last state, writes a
//! post-mortem dump from its live region (src/core/flight).
//!
//! What the program sees is what it would see run bare (README, "oomshim run"):
//! - **Same process group and session.** No `setpgid`, no `setsid`, no `tcsetpgrp`: terminal
//!   signals (Ctrl-C, Ctrl-Z), terminal reads, `kill %1`, `kill -STOP -PGID` and `timeout`'s
//!   group kill reach the program and its own children directly. oomshim leaves SIGTSTP,
//!   SIGTTIN and SIGTTOU at their start-up disposition, so Ctrl-Z stops it with its group and
//!   `bg`/`fg` continue both. It never mirrors a stop of the program.
//! - **Dispositions and mask exactly as at start.** Recorded by [`record_start_state`] before
//!   Rust's runtime ignores SIGPIPE, restored in the child before `exec`: a signal ignored at
//!   start stays ignored (nohup's SIGHUP), the mask is the launcher's mask at start. SIGCHLD
//!   inherited as ignored is reset to its default here only, so `waitpid` works.
//! - **Signals sent to oomshim alone are passed on once** (every catchable one, real-time ones
//!   included), while those the program got too are not: see [`Rule`].
//! - **Exit status exactly**: the program's code; killed by a signal, oomshim kills itself with
//!   the same signal, with the core-dumped flag when the program dumped core ([`die_by`]).
//! - **No descriptor of the program kept**: after the spawn, oomshim's stdin and stdout become
//!   /dev/null; stderr is kept for the post-mortem lines, written with errors ignored.
//! - **The whole tree is watched**: oomshim is a child subreaper, reaps orphaned descendants
//!   and writes one post-mortem per process that died by a signal with a live region. When the
//!   direct child ends, it reaps what has died and ends at once.
//!
//! `oomshim run --exec` replaces oomshim with the program instead (no post-mortem).

use super::run::{command, RunError, RunOptions};
use oomshim_core::flight;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// The signal state at start, before Rust's runtime changes it

static RECORDED: AtomicBool = AtomicBool::new(false);
/// Bit `s - 1` set: signal `s` was ignored at start.
static IGNORED_AT_START: AtomicU64 = AtomicU64::new(0);
/// Bit `s - 1` set: signal `s` was blocked at start.
static MASK_AT_START: AtomicU64 = AtomicU64::new(0);

/// Signals 1 to 64 (Linux has no more).
const MAX_SIGNAL: i32 = 64;

pub fn bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

/// Notes which signals are ignored and blocked now. Called from the binary's `.init_array`
/// (src/cli/main.rs), before Rust's runtime sets SIGPIPE to ignored: the program must start
/// with the caller's disposition, not Rust's. Async-signal-safe, allocates nothing.
pub extern "C" fn record_start_state() {
    let (ignored, mask) = current_state();
    IGNORED_AT_START.store(ignored, Ordering::Relaxed);
    MASK_AT_START.store(mask, Ordering::Relaxed);
    RECORDED.store(true, Ordering::Release);
}

fn current_state() -> (u64, u64) {
    let mut ignored = 0u64;
    let mut mask = 0u64;
    // SAFETY: zeroed `sigset_t` and `sigaction` are valid out-parameters; nothing is changed.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
        for sig in 1..=MAX_SIGNAL {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
            {
                ignored |= bit(sig);
            }
            if libc::sigismember(&set, sig) == 1 {
                mask |= bit(sig);
            }
        }
    }
    (ignored, mask)
}

/// (ignored, blocked) at start: as recorded before `main`, else as now.
fn start_state() -> (u64, u64) {
    if RECORDED.load(Ordering::Acquire) {
        (
            IGNORED_AT_START.load(Ordering::Relaxed),
            MASK_AT_START.load(Ordering::Relaxed),
        )
    } else {
        current_state()
    }
}

fn sigset_of(bits: u64) -> libc::sigset_t {
    // SAFETY: a zeroed `sigset_t`, initialised by `sigemptyset` before `sigaddset`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in 1..=MAX_SIGNAL {
            if bits & bit(sig) != 0 {
                libc::sigaddset(&mut set, sig); // glibc's own (32, 33) are refused: fine
            }
        }
        set
    }
}

/// The signals oomshim takes in (through a signalfd) to reap or to pass on: every signal but
/// those it cannot catch (KILL, STOP), the terminal's stop signals (left at their default so
/// oomshim stops with its group), those ignored at start (they stay ignored, as in the program)
/// and glibc's internal ones.
pub fn caught_signals(ignored: u64) -> u64 {
    let mut bits = 0u64;
    let rtmin = libc::SIGRTMIN();
    for sig in 1..=MAX_SIGNAL {
        let never = [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ];
        if never.contains(&sig) || (sig > 31 && sig < rtmin) {
            continue;
        }
        if sig != libc::SIGCHLD && ignored & bit(sig) != 0 {
            continue;
        }
        bits |= bit(sig);
    }
    bits
}

// ---------------------------------------------------------------------------------------------
// Which signals are passed on

/// How long a signal that reached oomshim waits for the sentinel's word before it is passed on.
const SETTLE: Duration = Duration::from_millis(50);

/// How long past [`SETTLE`] a signal keeps waiting while the sentinel still holds it pending or
/// is running (a loaded machine that has not scheduled it yet): passing it on then would make a
/// group's signal reach the program twice.
const SETTLE_LOADED: Duration = Duration::from_secs(2);

/// How often a signal that outlived [`SETTLE`] looks at the sentinel again.
const RECHECK: Duration = Duration::from_millis(5);

/// Whether the sentinel may still write a word for `sig`: the signal is pending in it (queued,
/// not yet taken by `sigwaitinfo`: a stopped or unscheduled sentinel), or it is running (between
/// taking a signal and writing its word). Asleep with nothing pending, it has said all it got.
fn sentinel_may_still_say(sentinel: i32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{sentinel}/status")) else {
        return false;
    };
    let bit = 1u64 << (sig - 1);
    status.lines().any(|l| {
        let (key, value) = l.split_once(':').unwrap_or((l, ""));
        let value = value.trim();
        match key {
            "SigPnd" | "ShdPnd" => u64::from_str_radix(value, 16).is_ok_and(|m| m & bit != 0),
            "State" => value.starts_with('R'),
            _ => false,
        }
    })
}

/// What to do with one signal oomshim received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Not the program's: the terminal's (si_code SI_KERNEL: Ctrl-C, Ctrl-\, hangup, window
    /// size, sent to the whole foreground group), the kernel's for oomshim itself, oomshim's own
    /// (SIGPIPE of a write to a closed stderr), or sent by the program or one of its
    /// descendants (bare, it would have gone to the program's parent or to its own group).
    Drop,
    /// Passed on unless the sentinel saw it too within [`SETTLE`]: the sentinel is a process
    /// of oomshim's in the same group, which no one signals by its pid, so a signal it also
    /// got was sent to the group, the cgroup or every matching process, and the program got
    /// it too.
    UnlessSentinelSawIt,
}

/// The rule for a signal with this `si_code` and sender. `is_descendant` tells whether a pid
/// is the program or one of its descendants.
pub fn rule(
    sig: i32,
    code: i32,
    sender: i32,
    me: i32,
    is_descendant: impl Fn(i32) -> bool,
) -> Rule {
    if code == libc::SI_KERNEL {
        // An interval timer armed before `exec` is inherited by oomshim, not the program:
        // its SIGALRM is the program's. Every other SI_KERNEL signal is the terminal's or
        // about oomshim itself (its own CPU or file limits).
        return if sig == libc::SIGALRM {
            Rule::UnlessSentinelSawIt
        } else {
            Rule::Drop
        };
    }
    if sender == me || (sender > 0 && is_descendant(sender)) {
        return Rule::Drop;
    }
    Rule::UnlessSentinelSawIt
}

/// `/proc/PID/stat`'s ppid, read past the command name (which may hold anything).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` descends from this process (walking parents; orphans come to oomshim, the
/// subreaper). The sentinel counts as not: it never signals.
fn descends_from_me(pid: i32, me: i32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        match parent_of(p) {
            Some(pp) if pp == me => return true,
            Some(pp) if pp > 1 => p = pp,
            _ => return false,
        }
    }
    false
}

// ---------------------------------------------------------------------------------------------
// The sentinel

/// Forks the sentinel: a process of oomshim's own process group that blocks every signal,
/// waits for them with `sigwaitinfo` and writes the number and sender of each (except the
/// terminal's and oomshim's) to `fd`. It holds no other descriptor, and dies with oomshim (PDEATHSIG).
/// Returns its pid.
fn start_sentinel(fd: libc::c_int, me: i32) -> Option<i32> {
    // SAFETY: fork; the child below makes async-signal-safe calls only.
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        return (pid > 0).then_some(pid);
    }
    // The child: async-signal-safe calls only, nothing allocated.
    // SAFETY: the forked child: async-signal-safe calls on its own mask, name and descriptors.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != me {
            libc::_exit(0);
        }
        libc::prctl(libc::PR_SET_NAME, c"oomshim-signals".as_ptr());
        // No descriptor of the program's: only `fd` stays open.
        for other in 0..fd {
            libc::close(other);
        }
        if libc::syscall(libc::SYS_close_range, fd as u32 + 1, u32::MAX, 0) != 0 {
            for other in fd + 1..1024 {
                libc::close(other);
            }
        }
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigwaitinfo(&all, &mut info);
            if sig <= 0 {
                continue;
            }
            if info.si_code == libc::SI_KERNEL || info.si_pid() == me {
                continue;
            }
            let word = [sig, info.si_pid()];
            if libc::write(fd, word.as_ptr().cast(), 8) != 8 {
                libc::_exit(0); // oomshim is gone
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running the program

fn now_ms() -> u64 {
    dump::time::unix_ms(std::time::SystemTime::now())
}

/// One line on stderr; a write error (a closed pipe, a full disk) is ignored, never a panic.
fn say(line: &str) {
    let mut s = String::with_capacity(line.len() + 1);
    s.push_str(line);
    s.push('\n');
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// A process oomshim is watching, with what a post-mortem needs of it.
struct Watched {
    pid: i32,
    start_ticks: Option<u64>,
    /// Where its answer goes when it dies (its error file, the termination message), read
    /// from its environment while it ran.
    targets: oomshim_core::jobfiles::Targets,
}

impl Watched {
    /// The region this process would have in `live_dir`: named in oomshim's own pid namespace,
    /// where its children and the orphans it reaps are.
    fn region(&self, live_dir: &Path) -> Option<PathBuf> {
        let id = flight::RegionId {
            pid_ns: flight::own_pid_ns()?,
            pid: self.pid as u32,
            start_ticks: self.start_ticks?,
        };
        Some(live_dir.join(id.file_name()))
    }
}

/// Runs the program to its end. Returns the exit code to end with; a program killed by a signal
/// makes oomshim kill itself with it (this returns only if that failed).
pub fn supervise(opts: &RunOptions) -> Result<i32, RunError> {
    let mut cmd = command(opts)?;
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    // Names this run's tree in every region its processes publish (src/core/flight).
    let token = format!(
        "{me}-{}",
        flight::start_ticks_of(me as u32).unwrap_or_default()
    );
    cmd.env(flight::SUPERVISOR_ENV, &token);
    let (ignored, mask) = start_state();
    let caught = caught_signals(ignored);
    let live_dir = absolute(&flight::live_dir());
    let dump_dir = dump_dir(opts);
    let chld_ignored = ignored & bit(libc::SIGCHLD) != 0;
    // SAFETY: the `pre_exec` closure runs in the forked child and makes async-signal-safe calls
    // only (`signal`, `sigprocmask`, `prctl`, `getppid`, `_exit`), allocating nothing; `signal`
    // and `prctl` below change oomshim's own process.
    unsafe {
        // Restored in the child exactly as at start: Rust's runtime set SIGPIPE to ignored and
        // `Command` resets it and the mask before running this.
        cmd.pre_exec(move || {
            for sig in 1..=MAX_SIGNAL {
                if ignored & bit(sig) != 0 {
                    libc::signal(sig, libc::SIG_IGN);
                }
            }
            let start_mask = sigset_of(mask);
            libc::sigprocmask(libc::SIG_SETMASK, &start_mask, std::ptr::null_mut());
            // A SIGKILL of oomshim alone (`kill -9 $!`) ends the program, as it would bare.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != me {
                libc::_exit(137); // oomshim died before the program started
            }
            Ok(())
        });
        // waitpid must work: SIGCHLD inherited as ignored would reap children automatically.
        if chld_ignored {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        }
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
    // Held from now on, and read through a signalfd: one sent the moment the program runs is
    // passed on once its pid is known, never lost or fatal to oomshim.
    let caught_set = sigset_of(caught);
    // SAFETY: a set built by `sigset_of`.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &caught_set, std::ptr::null_mut()) };
    // SAFETY: as above; the descriptor is closed when the program ends.
    let sfd = unsafe { libc::signalfd(-1, &caught_set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    let mut pipe = [-1; 2];
    // SAFETY: a two-element array, as `pipe2` requires.
    let sentinel = if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
        let s = start_sentinel(pipe[1], me);
        // SAFETY: descriptors `pipe2` just returned.
        unsafe {
            libc::close(pipe[1]);
            libc::fcntl(pipe[0], libc::F_SETFL, libc::O_NONBLOCK);
        }
        if s.is_none() {
            // SAFETY: the read end, unused without a sentinel.
            unsafe { libc::close(pipe[0]) };
            pipe[0] = -1;
        }
        s
    } else {
        None
    };

    let spawned = cmd.spawn();
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            end_sentinel(sentinel);
            return Err(super::run::launch_error(&opts.command[0], e));
        }
    };
    let pid = child.id() as i32;
    let started_unix_ms = now_ms();
    drop(child); // waited for below, by pid
    release_stdin_and_stdout();
    let main = Watched {
        pid,
        start_ticks: flight::start_ticks_of(pid as u32),
        targets: super::jobs::targets_of_pid(pid),
    };
    let cgroup = flight::postmortem::cgroup_of(pid as u32, &flight::postmortem::cgroup_root());
    let oom_kill_before = cgroup.as_ref().and_then(flight::postmortem::oom_kills);
    let pm = PostMortems {
        live_dir,
        dump_dir,
        cgroup,
        oom_kill_before,
        mode: dump_mode(),
        main_pid: pid,
        started_unix_ms,
        command: opts
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        written: std::cell::RefCell::new(Vec::new()),
    };

    let mut tree = Tree::new(token.clone());
    let status = watch(&main, sentinel, sfd, pipe[0], me, &pm, &mut tree);
    // What of the tree died with the program (a wrapper's workers) and was reaped by another.
    tree.scan(&pm, main.pid, me);
    end_sentinel(sentinel);
    // SAFETY: descriptors this function opened, each closed once here.
    unsafe {
        libc::close(sfd);
        if pipe[0] >= 0 {
            libc::close(pipe[0]);
        }
    }
    let signal = libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status));
    let core = libc::WIFSIGNALED(status) && libc::WCOREDUMP(status);
    let failed = signal.is_some() || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0;
    if opts.exit_code && failed {
        if let Some(code) =
            super::jobs::exit_code_for_run(&pm.dump_dir, &token, &pm.written.borrow())
        {
            return Ok(code);
        }
    }
    match signal {
        Some(sig) => Err(die_by(sig, core, caught)),
        None => Ok(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            1
        }),
    }
}

/// Where post-mortems come from and go to.
struct PostMortems {
    live_dir: PathBuf,
    dump_dir: PathBuf,
    cgroup: Option<(PathBuf, bool)>,
    oom_kill_before: Option<u64>,
    mode: u32,
    /// The program oomshim started, when, and its command: a post-mortem of it is written even
    /// when it was SIGKILLed before its first live summary.
    main_pid: i32,
    started_unix_ms: u64,
    command: Vec<String>,
    /// The post-mortems written in this run (`--exit-code` reads their retry hints).
    written: std::cell::RefCell<Vec<dump::model::Dump>>,
}

impl PostMortems {
    /// The post-mortem of one process that ended with `status`, when it left its region. A
    /// process without one never allocated device memory (the shim creates the region at the
    /// first allocation): nothing of it is about GPU memory, and no dump is written.
    fn after(&self, w: &Watched, status: libc::c_int) {
        let death = flight::postmortem::Death::from_status(status, now_ms(), None);
        if let Some(region) = w.region(&self.live_dir).filter(|r| r.exists()) {
            post_mortem(self, w, &region, &death);
            let _ = std::fs::remove_file(&region);
        }
    }

    /// The post-mortem of a process SIGKILLed after its first device allocation but before its
    /// first publish finished (the OOM killer, a scheduler over its limit): what is known. Other
    /// early ends say something of their own (a crash its message, an exit its status), and a
    /// program stopped at once with Ctrl-C or SIGTERM needs no dump.
    fn unpublished(&self, w: &Watched, death: &flight::postmortem::Death) {
        if death.signal != Some(libc::SIGKILL) {
            return;
        }
        let ranks = oomshim_core::facts::ranks::current();
        let process = dump::model::ProcessInfo {
            pid: w.pid as u32,
            host: dump::write::hostname().unwrap_or_else(|| "unknown".to_string()),
            command_line: if w.pid == self.main_pid {
                self.command.clone()
            } else {
                Vec::new()
            },
            rank: ranks.rank,
            local_rank: ranks.local_rank,
            world_size: ranks.world_size,
            launcher: ranks.launcher.map(str::to_string),
            job_id: ranks.job_id,
            kubernetes: oomshim_core::facts::kubernetes::current(),
        };
        let host = flight::postmortem::host_now(self.cgroup.as_ref(), self.oom_kill_before);
        let dump = flight::postmortem::unpublished(process, self.started_unix_ms, death, host);
        write_post_mortem(self, w, &dump);
    }
}

/// The processes of this run's tree that published a region (their summary carries this run's
/// token, src/core/flight `supervisor`), for the deaths `waitpid` never shows oomshim: a
/// descendant whose own parent (`bash -c`, torchrun, a multiprocessing pool) reaps it. A pidfd
/// per member wakes oomshim the moment one ends, so its status is usually read while it is a
/// zombie; when its parent reaped it first, a region left behind still says it did not end on
/// purpose (`exit`, `_exit` and `_Exit` remove it), and the post-mortem says the signal is
/// unknown.
struct Tree {
    token: String,
    /// Regions seen, by whose they are → the member when it is this tree's.
    seen: std::collections::HashMap<flight::RegionId, Option<Member>>,
    next_scan: Instant,
}

struct Member {
    pid: i32,
    start_ticks: u64,
    /// Its parent when last seen running.
    parent: Option<u32>,
    pidfd: Option<std::os::fd::OwnedFd>,
    targets: oomshim_core::jobfiles::Targets,
}

/// How often the live directory is looked at for new members (a member's end wakes oomshim
/// through its pidfd at once).
const SCAN_EVERY: Duration = Duration::from_millis(500);

impl Tree {
    fn new(token: String) -> Tree {
        Tree {
            token,
            seen: std::collections::HashMap::new(),
            next_scan: Instant::now(),
        }
    }

    /// The pidfds to wait on.
    fn pidfds(&self) -> Vec<libc::c_int> {
        use std::os::fd::AsRawFd;
        self.seen
            .values()
            .flatten()
            .filter_map(|m| m.pidfd.as_ref().map(|f| f.as_raw_fd()))
            .collect()
    }

    /// Finds new members and writes the post-mortem of each that ended without oomshim reaping
    /// it. `main` and oomshim's own children are left to `reap`, which sees their status.
    fn scan(&mut self, pm: &PostMortems, main: i32, me: i32) {
        self.next_scan = Instant::now() + SCAN_EVERY;
        // The regions `top` and the exporter would trust: a private directory, private files.
        let regions = flight::read::list_regions(&pm.live_dir);
        for r in &regions {
            let key = r.id;
            if !self.seen.contains_key(&key) {
                let member = match flight::read::read_region(&r.path) {
                    Err(flight::read::ReadError::Empty) => continue, // not published yet
                    Ok(snap) if snap.summary.supervisor.as_deref() == Some(&self.token) => {
                        let pid = r.pid as i32;
                        // What the member published of its own settings; else (an older
                        // writer) its environment, read while it runs: a zombie's is gone.
                        let published = oomshim_core::jobfiles::Targets {
                            error_file: snap.summary.error_file.clone(),
                            termination_log: snap.summary.termination_log.clone(),
                        };
                        Some(Member {
                            pid,
                            start_ticks: r.start_ticks,
                            parent: None,
                            targets: if published.is_empty() {
                                super::jobs::targets_of_pid(pid)
                            } else {
                                published
                            },
                            // The program's own end comes through `reap`.
                            pidfd: (pid != main).then(|| pidfd_open(pid)).flatten(),
                        })
                    }
                    _ => None,
                };
                self.seen.insert(key, member);
            }
            let Some(Some(m)) = self.seen.get_mut(&key) else {
                continue;
            };
            // The program's end comes through `reap`; a member of another pid namespace (the
            // program made one) cannot be looked up by its pid from here.
            if m.pid == main || r.liveness == flight::Liveness::OtherNamespace {
                continue;
            }
            let death = match flight::process_now(r.pid, r.start_ticks) {
                flight::ProcessNow::Running { parent } => {
                    m.parent = Some(parent);
                    continue;
                }
                flight::ProcessNow::Ended { parent, .. } if parent as i32 == me => continue,
                flight::ProcessNow::Ended { status, parent } => {
                    flight::postmortem::Death::from_status(status, now_ms(), Some(parent))
                }
                flight::ProcessNow::Gone => flight::postmortem::Death {
                    signal: None,
                    core_dumped: false,
                    exit_code: None,
                    unix_ms: now_ms(),
                    reaped_by: m.parent.filter(|&p| p as i32 != me),
                },
            };
            let w = Watched {
                pid: m.pid,
                start_ticks: Some(m.start_ticks),
                targets: m.targets.clone(),
            };
            post_mortem(pm, &w, &r.path, &death);
            let _ = std::fs::remove_file(&r.path);
            self.seen.insert(key, None);
        }
        self.seen
            .retain(|id, _| regions.iter().any(|r| r.id == *id));
    }
}

fn pidfd_open(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // Close-on-exec by definition; `None` on kernels before 5.3 (then the scan alone finds ends).
    // SAFETY: `pidfd_open` takes a pid and flags; it returns -1 on failure.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor `pidfd_open` just returned, owned by nothing else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits for the program to end, passing signals on and reaping orphans meanwhile. Returns
/// the program's wait status.
fn watch(
    main: &Watched,
    sentinel: Option<i32>,
    sfd: libc::c_int,
    sentinel_fd: libc::c_int,
    me: i32,
    pm: &PostMortems,
    tree: &mut Tree,
) -> libc::c_int {
    // Signals received and not yet passed on, and what the sentinel saw lately: (signal,
    // sender, when). A sender that signalled the sentinel too within SETTLE signalled more than
    // oomshim's pid (the group, the cgroup): all its sendings of that signal then are one, and
    // the program got it (timeout sends to the pid, then to the group).
    // Waiting: (signal, sender, when received, when to look again).
    let mut waiting: Vec<(i32, i32, Instant, Instant)> = Vec::new();
    let mut seen: Vec<(i32, i32, Instant)> = Vec::new();
    let mut sentinel_alive = sentinel.is_some();
    loop {
        if let Some(status) = reap(main, sentinel, &mut sentinel_alive, pm) {
            return status;
        }
        // Pass on what waited long enough; forget the sentinel's words that matched nothing.
        let now = Instant::now();
        waiting.retain_mut(|(sig, _, at, next)| {
            if now < *next && sentinel_alive {
                return true;
            }
            let still = sentinel_alive
                && now < *at + SETTLE_LOADED
                && sentinel.is_some_and(|s| sentinel_may_still_say(s, *sig));
            if still {
                *next = now + RECHECK;
                return true;
            }
            // SAFETY: a signal to the program's pid.
            unsafe { libc::kill(main.pid, *sig) };
            false
        });
        seen.retain(|&(_, _, at)| now < at + 2 * SETTLE);
        if now >= tree.next_scan {
            tree.scan(pm, main.pid, me);
        }
        let timeout = waiting
            .iter()
            .map(|&(_, _, _, next)| next.saturating_duration_since(now))
            .chain(std::iter::once(
                tree.next_scan.saturating_duration_since(now),
            ))
            .min()
            .map(|d| d.as_millis() as i32 + 1)
            .unwrap_or(-1);
        if sfd < 0 {
            // No signalfd (should not happen): wait for the program alone, passing nothing on.
            let mut status = 0;
            // SAFETY: a valid out-parameter.
            let r = unsafe { libc::waitpid(main.pid, &mut status, 0) };
            if r == main.pid {
                pm.after(main, status);
                return status;
            }
            continue;
        }
        // A negative descriptor is skipped by poll: the sentinel's when there is none.
        let mut fds: Vec<libc::pollfd> = [sfd, sentinel_fd]
            .into_iter()
            .chain(tree.pidfds())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds.len()` initialised `pollfd`s in a live vector.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if r < 0 {
            continue; // EINTR: the stop signals are the only ones not held
        }
        if fds[2..].iter().any(|f| f.revents != 0) {
            // A member ended: read its status now, while it may still be a zombie.
            tree.scan(pm, main.pid, me);
        }
        if sentinel_fd >= 0 && fds[1].revents != 0 {
            let mut word = [0i32; 2];
            // SAFETY: an 8-byte buffer.
            while unsafe { libc::read(sentinel_fd, word.as_mut_ptr().cast(), 8) } == 8 {
                let [sig, sender] = word;
                // Sent to more than oomshim: the program got it too.
                waiting.retain(|&(s, p, _, _)| (s, p) != (sig, sender));
                seen.push((sig, sender, Instant::now()));
            }
        }
        if fds[0].revents != 0 {
            loop {
                // SAFETY: all zeroes is a valid `signalfd_siginfo`.
                let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
                let size = std::mem::size_of::<libc::signalfd_siginfo>();
                // SAFETY: `info` holds `size` bytes.
                let got = unsafe { libc::read(sfd, (&raw mut info).cast(), size) };
                if got != size as isize {
                    break;
                }
                let sig = info.ssi_signo as i32;
                if sig == libc::SIGCHLD {
                    continue; // reaped at the top of the loop
                }
                let sender = info.ssi_pid as i32;
                match rule(sig, info.ssi_code, sender, me, |p| {
                    Some(p) != sentinel && descends_from_me(p, me)
                }) {
                    Rule::Drop => {}
                    Rule::UnlessSentinelSawIt => {
                        if !seen.iter().any(|&(s, p, _)| (s, p) == (sig, sender)) {
                            let at = Instant::now();
                            waiting.push((sig, sender, at, at + SETTLE));
                        }
                    }
                }
            }
        }
    }
}

/// Reaps every child that has ended: orphaned descendants get their post-mortem, the sentinel
/// is noted gone, and the program's own end is returned (after its post-mortem).
fn reap(
    main: &Watched,
    sentinel: Option<i32>,
    sentinel_alive: &mut bool,
    pm: &PostMortems,
) -> Option<libc::c_int> {
    let mut ended = None;
    loop {
        // Looked at before it is reaped: its start time names its region.
        // SAFETY: all zeroes is a valid `siginfo_t`.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-parameter; `WNOWAIT` leaves the child to be reaped below.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: `info` is zeroed, then filled by `waitid`.
        let pid = unsafe { info.si_pid() };
        if r != 0 || pid == 0 {
            break;
        }
        let start_ticks = if pid == main.pid {
            main.start_ticks
        } else {
            flight::start_ticks_of(pid as u32)
        };
        let mut status = 0;
        // SAFETY: a valid out-parameter.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
            break;
        }
        if Some(pid) == sentinel {
            *sentinel_alive = false;
        } else if pid == main.pid {
            ended = Some(status);
        } else if libc::WIFSIGNALED(status) {
            // An orphan: its environment is gone with it, and so is where its answer would go.
            let targets = Default::default();
            pm.after(
                &Watched {
                    pid,
                    start_ticks,
                    targets,
                },
                status,
            );
        }
    }
    if let Some(status) = ended {
        pm.after(main, status);
    }
    ended
}

fn end_sentinel(sentinel: Option<i32>) {
    if let Some(pid) = sentinel {
        // SAFETY: the sentinel, oomshim's own child, not reaped before.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
}

/// stdin and stdout become /dev/null: oomshim holds no end of the program's pipes (a writer
/// into the program's stdin gets EPIPE once the program closes it, a reader of its stdout sees
/// the end when the program's side closes). stderr is kept for the post-mortem lines.
fn release_stdin_and_stdout() {
    // SAFETY: a NUL-terminated path; descriptors 0 and 1 are oomshim's own.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if null > 1 {
                libc::close(null);
            }
        }
    }
}

/// Ends oomshim by the program's signal, so its parent sees the wait status it would have seen
/// without oomshim, the core-dumped flag included. A core flag needs a core: when the program
/// dumped one, oomshim dumps its own too, in a fresh private directory
/// (`$TMPDIR/oomshim-UID/core-XXXXXX`) so it never replaces the program's `core` in the working
/// directory (with a `|` core_pattern it goes to the handler, which sees two crashes). When
/// the program did not, RLIMIT_CORE 1 stops any core of oomshim (0 would not stop a `|` handler).
fn die_by(sig: libc::c_int, core: bool, caught: u64) -> RunError {
    let limit = |cur| libc::rlimit {
        rlim_cur: cur,
        rlim_max: cur,
    };
    // SAFETY: valid `rlimit` and `sigset_t` arguments; every call changes oomshim's own process,
    // which ends by the signal raised last.
    unsafe {
        let mut rl = limit(0);
        libc::getrlimit(libc::RLIMIT_CORE, &mut rl);
        let scratch = core.then(core_scratch_dir).flatten();
        match scratch {
            Some(dir) if std::env::set_current_dir(&dir).is_ok() => {
                if rl.rlim_cur < rl.rlim_max {
                    rl.rlim_cur = rl.rlim_max;
                    libc::setrlimit(libc::RLIMIT_CORE, &rl);
                }
            }
            _ => {
                let one = libc::rlimit {
                    rlim_cur: 1,
                    rlim_max: rl.rlim_max,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &one);
            }
        }
        libc::signal(sig, libc::SIG_DFL);
        // Nothing else may arrive first and be mistaken for the program's end.
        let others = sigset_of(caught & !bit(sig));
        libc::sigprocmask(libc::SIG_BLOCK, &others, std::ptr::null_mut());
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

/// A fresh directory of oomshim's for its own core file.
fn core_scratch_dir() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let parent = dump::write::fallback_dir();
    std::fs::create_dir_all(&parent).ok()?;
    let mut template = parent.join("core-XXXXXX").as_os_str().as_bytes().to_vec();
    template.push(0);
    // SAFETY: a NUL-terminated template in a live buffer, which `mkdtemp` rewrites in place.
    let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    template.pop();
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&template)))
}

fn absolute(p: &Path) -> PathBuf {
    oomshim_core::config::resolve_dir(p, std::env::current_dir().ok().as_deref())
}

/// The directory the program's shim wrote dumps to: `--dir`, else `OOMSHIM_DIR`, else
/// `oomshim-dumps`, relative to where the program started (here).
fn dump_dir(opts: &RunOptions) -> PathBuf {
    let dir = opts
        .dir
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("OOMSHIM_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(oomshim_core::config::DEFAULT_DIR));
    absolute(&dir)
}

/// `OOMSHIM_DUMP_MODE` as the shim reads it (the same parser, `config::Config`): the
/// post-mortem gets the permission bits the program's own dumps get.
pub fn dump_mode() -> u32 {
    let (cfg, _) = oomshim_core::config::Config::from_lookup(|k| {
        (k == "OOMSHIM_DUMP_MODE")
            .then(|| std::env::var(k).ok())
            .flatten()
    });
    cfg.dump_mode
}

fn post_mortem(pm: &PostMortems, w: &Watched, region: &Path, death: &flight::postmortem::Death) {
    let snapshot = match flight::read::read_region(region) {
        Ok(s) => s,
        // Died before its first publish: what is known.
        Err(flight::read::ReadError::Empty) => return pm.unpublished(w, death),
        Err(e) => {
            if death.signal.is_some() {
                say(&format!(
                    "oomshim: no post-mortem dump: the program's live summary {e}"
                ));
            }
            return;
        }
    };
    if !flight::postmortem::needed(death, &snapshot) {
        return;
    }
    let host = flight::postmortem::host_now(pm.cgroup.as_ref(), pm.oom_kill_before);
    let dump = flight::postmortem::build(&snapshot, death, host);
    write_post_mortem(pm, w, &dump);
}

/// Writes a post-mortem dump and says so on stderr, with its headline; the process's torchelastic
/// error file goes first (src/cli/jobs.rs: the race with torchrun's agent), its termination
/// message after.
fn write_post_mortem(pm: &PostMortems, w: &Watched, dump: &dump::model::Dump) {
    let headline = dump.verdict.headline();
    let retry = dump
        .verdict
        .retry
        .as_ref()
        .map(|r| format!("; retry: {}", r.hint))
        .unwrap_or_default();
    let bytes = match serde_json::to_vec_pretty(dump) {
        Ok(b) => b,
        Err(e) => {
            say(&format!("oomshim: no post-mortem dump: {e}"));
            return;
        }
    };
    let name = dump::write::DumpName {
        host: dump.process.host.clone(),
        pid: dump.process.pid,
        rank: dump.process.rank,
    };
    let clean = dump::units::clean;
    let planned = super::jobs::planned_path(&pm.dump_dir, &name);
    let reaped = || match w.start_ticks {
        Some(ticks) => flight::process_now(w.pid as u32, ticks) == flight::ProcessNow::Gone,
        None => false,
    };
    super::jobs::error_file_after_death(dump, &planned, &w.targets, reaped, say);
    let written = dump::write::write_dump_with_mode(&pm.dump_dir, &name, &bytes, pm.mode);
    pm.written.borrow_mut().push(dump.clone());
    match &written {
        Ok(w) => {
            say(&format!(
                "oomshim: post-mortem (reconstructed): {}",
                clean(headline)
            ));
            say(&format!(
                "oomshim:   dump: {}  (details: oomshim report {}){retry}",
                w.path.display(),
                w.path.display()
            ));
        }
        Err(e) => say(&format!(
            "oomshim: post-mortem (reconstructed): {}; no dump written: {e}{retry}",
            clean(headline)
        )),
    }
    let path = written.as_ref().ok().map(|w| w.path.as_path());
    super::jobs::termination_after_death(dump, path, &w.targets, say);
}
