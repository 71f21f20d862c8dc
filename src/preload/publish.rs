//! The writing side, inside the shimmed process: creates the process's region at its first
//! device allocation (on the publisher thread, never on a hooked call: the hook only rings the
//! doorbell), publishes the ledger's summary then, again whenever the tracked bytes moved by more
//! than [`Settings::change`] since the last publish (at most every [`MIN_CHANGE_GAP`]), about once
//! an interval otherwise and right after a failure, and removes the region at a normal exit.
//! Nothing here runs on the allocation path: the ledger's watch (`Ledger::watch`) compares the
//! device's bytes with two marks and rings `sys::doorbell` when one is crossed; the thread reads
//! the ledger's existing summaries, as an on-demand dump does, and the hooks never wait for it
//! or for any reader.
//!
//! A program that never allocates device memory has no region: `oomshim run` writes no
//! post-mortem of it.

use dump::model::Dump;
use oomshim_core::flight::layout::RegionWriter;
use oomshim_core::flight::{
    LiveFailure, LiveKinds, LiveSummary, RssSample, LIVE_SCHEMA, RSS_SAMPLES,
};
use oomshim_host::sys::fn_ptr::FnPtr;
use std::ffi::c_int;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Holders and sites kept in a published summary.
pub const TOP: usize = 20;
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// `OOMSHIM_LIVE_CHANGE`'s default and range.
pub const DEFAULT_CHANGE: u64 = 64 << 20;
pub const MIN_CHANGE: u64 = 1 << 20;
pub const MAX_CHANGE: u64 = 1 << 40;
/// Publishes for a change (or a failure) come at most this often: a program that allocates
/// gigabytes a second gets ten summaries a second, not one per allocation.
pub const MIN_CHANGE_GAP: Duration = Duration::from_millis(100);
/// The publisher spends at most 1/BUDGET_FACTOR of one core over time: it earns that share of
/// the time that passes as publishing time, up to [`BUDGET_BURST`], spends the CPU time each
/// publish takes, and waits out a debt (at `BUDGET_FACTOR` times its length) before the next.
const BUDGET_FACTOR: u32 = 50;
/// Publishing time saved up at most (and at start): a start-up spike is followed closely (the
/// first publishes symbolise new stacks and read debug information, and cost more), while a
/// program that changes all the time still pays no more than its share.
const BUDGET_BURST: Duration = Duration::from_millis(200);

/// `OOMSHIM_LIVE`, `OOMSHIM_LIVE_DIR`, `OOMSHIM_LIVE_INTERVAL`, `OOMSHIM_LIVE_CHANGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    pub dir: PathBuf,
    pub interval: Duration,
    /// Tracked bytes that move this far from the last publish trigger the next; `None`: only
    /// the interval does (after the first publish at the first allocation).
    pub change: Option<u64>,
    /// `OOMSHIM_SUPERVISOR` (src/core/flight): the `oomshim run` whose tree this process is in.
    pub supervisor: Option<String>,
    /// Where this process's answer goes when it dies, for the supervisor's post-mortem (from the
    /// process's settings, which the shim has read already: none here).
    pub targets: oomshim_core::jobfiles::Targets,
}

/// The settings from `lookup`, with a warning for each malformed value (its default applies).
pub fn settings_from(lookup: impl Fn(&str) -> Option<String>) -> (Settings, Vec<String>) {
    let mut warnings = Vec::new();
    let enabled = match lookup("OOMSHIM_LIVE").as_deref().map(str::trim) {
        None | Some("") | Some("1") => true,
        Some("0") => false,
        Some(other) => {
            warnings.push(format!(
                "OOMSHIM_LIVE={}: expected 0 or 1; using 1",
                dump::units::clean(other)
            ));
            true
        }
    };
    let interval = match lookup("OOMSHIM_LIVE_INTERVAL") {
        None => DEFAULT_INTERVAL,
        Some(v) => match oomshim_core::config::parse_duration(&v) {
            Some(d) if (MIN_INTERVAL..=MAX_INTERVAL).contains(&d) => d,
            _ => {
                warnings.push(format!(
                    "OOMSHIM_LIVE_INTERVAL={}: expected a duration from 100ms to 60s; using 1s",
                    dump::units::clean(&v)
                ));
                DEFAULT_INTERVAL
            }
        },
    };
    let change = match lookup("OOMSHIM_LIVE_CHANGE") {
        None => Some(DEFAULT_CHANGE),
        Some(v) => match oomshim_core::config::parse_bytes(&v) {
            Some(0) => None,
            Some(b) if (MIN_CHANGE..=MAX_CHANGE).contains(&b) => Some(b),
            _ => {
                warnings.push(format!(
                    "OOMSHIM_LIVE_CHANGE={}: expected 0 or a size from 1M to 1T; using 64M",
                    dump::units::clean(&v)
                ));
                Some(DEFAULT_CHANGE)
            }
        },
    };
    let dir = oomshim_core::flight::live_dir_from(lookup("OOMSHIM_LIVE_DIR").map(Into::into));
    // Only ever written by `oomshim run`; anything else is not a token and is left out.
    let supervisor = lookup(oomshim_core::flight::SUPERVISOR_ENV).filter(|v| {
        v.len() <= 64 && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'-')
    });
    (
        Settings {
            enabled,
            dir,
            interval,
            change,
            supervisor,
            targets: Default::default(),
        },
        warnings,
    )
}

/// The last device allocation failure, with the pid that noted it (a forked child inherits the
/// memory, not the failure).
static LAST_FAILURE: Mutex<Option<(u32, LiveFailure)>> = Mutex::new(None);
/// Torch's memory by kind, as the Python hook last counted it (`oomshim_framework_kinds`).
static LIVE_KINDS: Mutex<Option<LiveKinds>> = Mutex::new(None);

/// The Python hook counted torch's memory by kind (at an optimizer step, seldom): the next
/// publish carries it.
pub fn note_kinds(kinds: LiveKinds) {
    *LIVE_KINDS.lock().unwrap_or_else(|e| e.into_inner()) = Some(kinds);
}
/// The region this process creates: its path, as a C string made once (for [`remove_at_exit`],
/// which may run in a signal handler or a vfork child and must not allocate), and the pid that
/// creates it. Set before the file is created, so that an exit while it is being created
/// removes it too.
static REGION: OnceLock<(std::ffi::CString, u32)> = OnceLock::new();
/// Set by the first [`remove_at_exit`]: the process is ending on purpose; no region is created
/// or published from then on.
static REMOVED: AtomicBool = AtomicBool::new(false);
/// Set by the publisher while it creates the region: [`remove_at_exit`] waits for it, so that a
/// region created while the process exits is removed all the same (the two are ordered by
/// sequentially consistent accesses of `REMOVED` and this: one of them sees the other's).
static CREATING: AtomicBool = AtomicBool::new(false);
/// The C library's `_exit` (0: not looked up yet), for the shim's own `_exit`
/// (src/preload/ffi/process_exit.rs); looked up when the region is created.
static REAL_EXIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A device allocation failed (the cold out-of-memory path): noted for the next publish, which
/// comes at once. The same failure again (same device, size and API: a repeat, which gets no
/// dump of its own within `OOMSHIM_MIN_INTERVAL`) keeps the dump and verdict of the one before,
/// so a program failing in a loop shows its answer rather than a failure without one.
pub fn note_failure(device: i32, bytes: u64, api: &str, mem_info: Option<(u64, u64)>) {
    let Some(mut last) = failure_slot() else {
        return;
    };
    let me = std::process::id();
    let (kept_dump, headline, kind, retry) = match last.take() {
        Some((pid, f)) if pid == me && f.device == device && f.bytes == bytes && f.api == api => {
            (f.dump, f.headline, f.kind, f.retry)
        }
        _ => (None, None, None, None),
    };
    *last = Some((
        me,
        LiveFailure {
            unix_ms: dump::time::unix_ms(std::time::SystemTime::now()),
            device,
            bytes,
            api: api.to_string(),
            free_bytes: mem_info.map(|m| m.0),
            total_bytes: mem_info.map(|m| m.1),
            dump: kept_dump,
            headline,
            kind,
            retry,
        },
    ));
    drop(last);
    wake();
}

/// The last failure's slot, when this process may note one. Before its region exists (a first
/// allocation that failed creates it) a failure is noted all the same, or a program that runs
/// out at once would never show it; but then this may be a child forked before its parent had a
/// region, by a thread that held the lock at that moment: never wait for it. Not in a child of a
/// process that had a region: its publisher thread did not survive the fork.
fn failure_slot() -> Option<std::sync::MutexGuard<'static, Option<(u32, LiveFailure)>>> {
    match REGION.get() {
        Some((_, pid)) if *pid == std::process::id() => {
            Some(LAST_FAILURE.lock().unwrap_or_else(|e| e.into_inner()))
        }
        Some(_) => None,
        None => match LAST_FAILURE.try_lock() {
            Ok(last) => Some(last),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        },
    }
}

/// An out-of-memory dump was written for the last failure.
pub fn note_dump(dump: &Dump, path: &std::path::Path) {
    let Some(req) = dump.failed_request.as_ref() else {
        return;
    };
    let Some(mut last) = failure_slot() else {
        return;
    };
    let me = std::process::id();
    if last.as_ref().is_none_or(|(pid, _)| *pid != me) {
        *last = Some((
            me,
            LiveFailure {
                unix_ms: dump.time_unix_ms,
                device: req.device,
                bytes: req.bytes,
                api: req.api.clone(),
                free_bytes: None,
                total_bytes: None,
                dump: None,
                headline: None,
                kind: None,
                retry: None,
            },
        ));
    }
    let headline = dump.verdict.headline().to_string();
    let Some((_, entry)) = last.as_mut() else {
        return;
    };
    entry.dump = Some(path.display().to_string());
    entry.headline = Some(headline);
    entry.kind = Some(dump.verdict.kind.clone());
    entry.retry = dump.verdict.retry.as_ref().map(|r| r.hint.clone());
    drop(last);
    wake();
}

/// Why this process cannot keep a region safely, if so: a file-size limit below the region's
/// size (writing past it raises SIGXFSZ, which kills the program), or an address-space limit
/// (the out-of-memory dump needs that room more than the live summary does).
fn refused_by_limits() -> Option<&'static str> {
    let limit = |res| {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-parameter.
        (unsafe { libc::getrlimit(res, &mut rl) } == 0).then_some(rl.rlim_cur)
    };
    if limit(libc::RLIMIT_FSIZE)
        .is_some_and(|l| l != libc::RLIM_INFINITY && l < oomshim_core::flight::layout::REGION_BYTES)
    {
        return Some("RLIMIT_FSIZE is below the region's size");
    }
    if limit(libc::RLIMIT_AS).is_some_and(|l| l != libc::RLIM_INFINITY) {
        return Some("RLIMIT_AS is set");
    }
    None
}

fn wake() {
    oomshim_host::sys::doorbell::ring();
}

/// What the publisher asks of the shim's state.
#[derive(Clone, Copy)]
pub struct Source {
    /// The ledger's summary (a dump with reason `live`, run inside the shim's guard).
    pub live_dump: fn() -> Option<Dump>,
    /// Arms the ledger's watch (`Ledger::watch`): `Some(bytes)` rings the doorbell when the
    /// tracked bytes move that far from now; `None` disarms it.
    pub watch: fn(Option<u64>),
    /// Arms the watch for the first device allocation (`Ledger::watch_first`).
    pub watch_first: fn(),
    /// Registers [`remove_at_exit`] to run at exit.
    pub on_start: fn(),
}

/// Starts the publisher thread, on the thread of the first hooked call: the exit handler is
/// registered and the first allocation is watched before that call goes on.
pub fn start(settings: Settings, source: Source) {
    if !settings.enabled {
        return;
    }
    if let Some(why) = refused_by_limits() {
        tracing::debug!(why, "no live summary");
        return;
    }
    (source.on_start)();
    (source.watch_first)();
    let spawned = std::thread::Builder::new()
        .name("oomshim-live".into())
        .spawn(move || run(settings, source));
    if spawned.is_err() {
        (source.watch)(None);
        oomshim_host::say!("oomshim: the live summary is off: cannot start its thread");
    }
}

/// CPU time the calling thread has used, `None` where the clock cannot be read.
fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    (unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0)
        .then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// When the publisher looks next: a change or a failure is published at `change_at` at the
/// earliest, and the state is republished at `interval_at` regardless.
struct Schedule {
    change_at: Instant,
    interval_at: Instant,
}

/// The publisher's time budget (see [`BUDGET_FACTOR`]): publishing time earned, less spent.
struct Budget {
    /// Negative: a debt to wait out.
    credit_ns: i128,
    since: Instant,
}

impl Budget {
    fn new() -> Budget {
        Budget {
            credit_ns: BUDGET_BURST.as_nanos() as i128,
            since: Instant::now(),
        }
    }

    /// A publish that took `spent` ended at `end`: how long the next must wait at least.
    fn spend(&mut self, spent: Duration, end: Instant) -> Duration {
        let earned = end.saturating_duration_since(self.since).as_nanos() as i128
            / i128::from(BUDGET_FACTOR);
        self.since = end;
        self.credit_ns = (self.credit_ns + earned).min(BUDGET_BURST.as_nanos() as i128)
            - spent.as_nanos() as i128;
        Duration::from_nanos(
            (-self.credit_ns)
                .max(0)
                .saturating_mul(i128::from(BUDGET_FACTOR))
                .min(u64::MAX as i128) as u64,
        )
    }
}

impl Schedule {
    /// After a publish that ended at `end`, the next to wait at least `debt`.
    fn after(end: Instant, debt: Duration, settings: &Settings) -> Schedule {
        Schedule {
            change_at: end + MIN_CHANGE_GAP.max(debt),
            interval_at: end + settings.interval.max(debt),
        }
    }

    /// Sleeps until the next publish is due: the interval, or a ring (rate-limited).
    fn wait(&self) {
        loop {
            let now = Instant::now();
            if now >= self.interval_at {
                return;
            }
            if oomshim_host::sys::doorbell::wait(Some(self.interval_at - now)) {
                let now = Instant::now();
                if now < self.change_at {
                    // Rings meanwhile are taken by this publish: it reads the state then.
                    std::thread::sleep(self.change_at - now);
                    let _ = oomshim_host::sys::doorbell::wait(Some(Duration::ZERO));
                }
                return;
            }
        }
    }
}

fn run(settings: Settings, source: Source) {
    // Signals are the program's: a process-directed one must never land on this thread (a
    // handler of the program's would run here, with this thread's locks held).
    // SAFETY: a zeroed sigset_t filled by sigfillset; this thread's own mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    descriptors_of_its_own();
    let Some(id) = oomshim_core::flight::RegionId::of_this_process() else {
        (source.watch)(None);
        oomshim_host::say!(
            "oomshim: the live summary is off: /proc/self cannot say which process this is"
        );
        return;
    };
    // No region before the first device allocation (or failure): a program that never uses
    // CUDA has none, and `oomshim run` writes no post-mortem of it.
    while !oomshim_host::sys::doorbell::wait(None) {}
    let Some((mut writer, path, ino)) = create_region(&settings.dir, &id) else {
        (source.watch)(None);
        return;
    };
    // Resolved here, on this thread: `_exit` may later run where a lookup is not safe.
    // SAFETY: RTLD_NEXT is always a valid handle.
    let real_exit = unsafe { oomshim_host::sys::real_dlsym_not_ours(libc::RTLD_NEXT, c"_exit") };
    REAL_EXIT.store(real_exit, Ordering::Release);
    oomshim_host::stacks::cache_on_this_thread();
    let mut rss: Vec<RssSample> = Vec::new();
    let mut said = false;
    let mut budget = Budget::new();
    loop {
        if REMOVED.load(Ordering::SeqCst) {
            return;
        }
        let began = Instant::now();
        let began_cpu = thread_cpu_time().unwrap_or_default();
        // Armed before the state is read: a change while it is published rings for the next.
        (source.watch)(settings.change);
        if let Err(e) = publish_once(
            &mut writer,
            &path,
            ino,
            &id,
            &settings,
            &mut rss,
            source.live_dump,
        ) {
            if REMOVED.load(Ordering::SeqCst) {
                return;
            }
            if !said {
                said = true;
                oomshim_host::say!(
                    "oomshim: the live summary could not be updated ({e}); the program continues"
                );
            }
        }
        let spent = began.elapsed();
        // The budget is charged what the publish cost the machine's cores (this thread's CPU
        // time), not the wall time: on a loaded machine a publish waits for a core, and charging
        // the wait would starve the summaries (a start-up spike never published before a kill).
        let cost = thread_cpu_time().map_or(spent, |now| now.saturating_sub(began_cpu));
        tracing::debug!(?spent, ?cost, "live summary published");
        let end = Instant::now();
        Schedule::after(end, budget.spend(cost, end), &settings).wait();
    }
}

/// Gives this thread a descriptor table of its own, holding none of the program's descriptors:
/// the region and the files a publish reads (`/proc`, debug information) are opened
/// there, so a descriptor of the publisher's never takes a number the program is about to get.
/// The program owns its table, and may close fd 2 and open a log that must become fd 2 right
/// after its first allocation, while the publisher creates the region. The copy of the program's
/// descriptors is closed at once, stderr's too: a file the program closes is closed, and its
/// reader sees the end. The shim's messages from this thread borrow the program's fd 2 for each
/// write (`say::on_a_table_of_its_own`). Where `unshare` is
/// refused (a seccomp filter) the table stays shared, as it was; each publish still holds a
/// descriptor only while it runs.
fn descriptors_of_its_own() {
    // SAFETY: unshare(CLONE_FILES) changes this thread's own descriptor table only.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return;
    }
    // SAFETY: closes descriptors of this thread's private copy of the table only; the
    // program's own are untouched.
    unsafe {
        for fd in 0..3 {
            libc::close(fd);
        }
        oomshim_host::sys::say::on_a_table_of_its_own();
        // 0, 1 and 2 are taken by /dev/null, so that no file this thread opens gets one of
        // them: a write to "stderr" here (a panic's message) must land nowhere, not in the
        // region.
        for _ in 0..3 {
            libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        }
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            // Before Linux 5.9: every number up to the limit.
            let mut rl = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
            for fd in 3..(rl.rlim_cur.min(1 << 20) as libc::c_int) {
                libc::close(fd);
            }
        }
    }
}

/// Creates this process's region in `dir` (said once and `None` when it cannot), ordered with
/// [`remove_at_exit`] so that a process exiting meanwhile leaves none; a region that cannot be
/// initialised (a full `/dev/shm`) is removed at once. Then expires what others left behind.
fn create_region(
    dir: &std::path::Path,
    id: &oomshim_core::flight::RegionId,
) -> Option<(RegionWriter, PathBuf, (u64, u64))> {
    let path = dir.join(id.file_name());
    let c_path = {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?
    };
    if REGION.set((c_path, id.pid)).is_err() {
        return None; // made once per process
    }
    CREATING.store(true, Ordering::SeqCst);
    if REMOVED.load(Ordering::SeqCst) {
        CREATING.store(false, Ordering::SeqCst);
        return None;
    }
    let created = create(dir, &path, id);
    if created.is_err() {
        // Never a region that cannot be read: not even an empty file.
        let _ = std::fs::remove_file(&path);
    }
    CREATING.store(false, Ordering::SeqCst);
    match created {
        Ok((mut writer, ino)) => {
            writer.release_file(); // each publish opens the region anew
            oomshim_core::flight::expire::expire_stale(dir, id);
            Some((writer, path, ino))
        }
        Err(e) => {
            oomshim_host::say!(
                "oomshim: the live summary is off: cannot create it in {} ({e}); post-mortem dumps and `oomshim top` will not see this process",
                dump::units::clean_path(dir)
            );
            None
        }
    }
}

fn create(
    dir: &std::path::Path,
    path: &std::path::Path,
    id: &oomshim_core::flight::RegionId,
) -> std::io::Result<(RegionWriter, (u64, u64))> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    dump::write::prepare_private_dir(dir)?;
    // The readers trust only a directory of this user that no one else can write
    // (`flight::read::check_live_dir`): a region elsewhere would be published for nobody.
    if let Err(why) = oomshim_core::flight::read::check_live_dir(dir) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            why,
        ));
    }
    // The same namespace, pid and start time: this process before an exec; its region is stale.
    let _ = std::fs::remove_file(path);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let file = oomshim_host::own_fd::high_file(file);
    let meta = file.metadata()?;
    // SAFETY: geteuid cannot fail.
    let writer = RegionWriter::init(file, id, unsafe { libc::geteuid() })?;
    Ok((writer, (meta.dev(), meta.ino())))
}

#[allow(clippy::too_many_arguments)]
fn publish_once(
    writer: &mut RegionWriter,
    path: &std::path::Path,
    ino: (u64, u64),
    id: &oomshim_core::flight::RegionId,
    settings: &Settings,
    rss: &mut Vec<RssSample>,
    live_dump: fn() -> Option<Dump>,
) -> std::io::Result<()> {
    let Some(mut dump) = live_dump() else {
        return Ok(()); // the shim is off or has no room: nothing new to say
    };
    dump.largest_holders.truncate(TOP);
    dump.sites.truncate(TOP);
    let now = dump::time::unix_ms(std::time::SystemTime::now());
    let step = dump
        .growth
        .as_ref()
        .filter(|g| g.unit == "step")
        .map(|g| g.current);
    if let Some(bytes) = dump.host.as_ref().and_then(|h| h.rss_bytes) {
        if rss.len() == RSS_SAMPLES {
            rss.remove(0);
        }
        rss.push(RssSample {
            unix_ms: now,
            step,
            bytes,
        });
    }
    let pid = id.pid;
    let mut summary = LiveSummary {
        schema: LIVE_SCHEMA.to_string(),
        pid,
        pid_ns: Some(id.pid_ns),
        start_ticks: id.start_ticks,
        generation: 0, // set below, once known
        published_unix_ms: now,
        interval_ms: settings.interval.as_millis() as u64,
        rss: rss.clone(),
        last_failure: LAST_FAILURE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(noted_by, _)| *noted_by == pid)
            .map(|(_, failure)| failure.clone()),
        supervisor: settings.supervisor.clone(),
        error_file: settings.targets.error_file.clone(),
        termination_log: settings.targets.termination_log.clone(),
        dump,
        kinds: LIVE_KINDS.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    };
    // Reopened by path each time, and only if it is still the file created.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let file = oomshim_host::own_fd::high_file(file);
    let meta = file.metadata()?;
    if (meta.dev(), meta.ino()) != ino {
        return Err(std::io::Error::other("the region file was replaced"));
    }
    writer.use_file(file);
    let published = write_summary(writer, &mut summary);
    writer.release_file();
    published
}

/// Serialises `summary` (smaller if it does not fit a slot) and publishes it through the file
/// the writer holds for this publish.
fn write_summary(writer: &mut RegionWriter, summary: &mut LiveSummary) -> std::io::Result<()> {
    summary.generation = writer.generation() + 1;
    let mut bytes = serde_json::to_vec(&*summary).map_err(std::io::Error::other)?;
    if bytes.len() as u64 > oomshim_core::flight::layout::SLOT_BYTES {
        // Huge stacks or names: keep the totals, growth and sites, drop the holders first.
        summary.dump.largest_holders.clear();
        summary.dump.sites.truncate(5);
        bytes = serde_json::to_vec(&*summary).map_err(std::io::Error::other)?;
    }
    writer.publish(&bytes)?;
    Ok(())
}

/// How long an exit waits for a region being created, at most (creating one is a few system
/// calls; a stalled file system must not hold the program's exit).
const EXIT_WAITS_FOR_CREATION: Duration = Duration::from_millis(500);

/// At every deliberate end the region goes (a region left behind means the process did not
/// end on purpose): `exit` (the handler registered when the publisher started), and `_exit` /
/// `_Exit` (the shim's own, src/preload/ffi/process_exit.rs), which Python's `os._exit`, forked
/// workers and programs that skip their teardown call. A region being created meanwhile is waited
/// for and removed too. Only the process that created it removes it: a forked child ending does
/// not. Async-signal-safe: atomics, `getpid`, `nanosleep` and an `unlink` of a path made before
/// the region was created.
pub fn remove_at_exit() {
    if let Some((_, pid)) = REGION.get() {
        // SAFETY: getpid cannot fail.
        if *pid != unsafe { libc::getpid() } as u32 {
            return; // a forked child: the region is its parent's
        }
    }
    if REMOVED.swap(true, Ordering::SeqCst) {
        return;
    }
    let mut waited = Duration::ZERO;
    while CREATING.load(Ordering::SeqCst) && waited < EXIT_WAITS_FOR_CREATION {
        let nap = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        // SAFETY: a valid timespec; an early wake by a signal only shortens the nap.
        unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
        waited += Duration::from_millis(1);
    }
    if let Some((c_path, pid)) = REGION.get() {
        // SAFETY: getpid cannot fail.
        if *pid == unsafe { libc::getpid() } as u32 {
            // SAFETY: a NUL-terminated path made before the region was created.
            unsafe { libc::unlink(c_path.as_ptr()) };
        }
    }
}

/// The C library's `_exit` when it was looked up (at the region's creation; the shim's `_exit`
/// must not look anything up itself), else `None`.
pub fn real_exit() -> Option<unsafe extern "C" fn(c_int) -> !> {
    // SAFETY: 0 or the address of the C library's `void _exit(int)`, which stays loaded.
    unsafe { FnPtr::from_addr(REAL_EXIT.load(Ordering::Acquire)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_a_burst_then_two_percent_of_a_core() {
        let mut b = Budget::new();
        let t0 = b.since;
        // Start-up: ten publishes of 10 ms, 100 ms apart, come without waiting (the burst).
        let mut t = t0;
        for _ in 0..10 {
            t += Duration::from_millis(100);
            assert_eq!(b.spend(Duration::from_millis(10), t), Duration::ZERO);
        }
        // Steadily 10 ms a publish: the burst is spent, and each now waits about 50 × its cost.
        let mut waits = Vec::new();
        for _ in 0..20 {
            let wait = b.spend(Duration::from_millis(10), t);
            waits.push(wait);
            t += wait.max(Duration::from_millis(100));
        }
        let last = *waits.last().unwrap();
        assert!(
            (Duration::from_millis(400)..=Duration::from_millis(600)).contains(&last),
            "{waits:?}"
        );
        // Over the whole run: at most 2% of the time, plus the burst.
        let spent = Duration::from_millis(10) * 30;
        assert!(
            spent <= (t - t0) / 50 + BUDGET_BURST,
            "{:?} over {:?}",
            spent,
            t - t0
        );
    }

    #[test]
    fn settings_default_and_warn_on_nonsense() {
        let (s, w) = settings_from(|_| None);
        assert!(s.enabled && w.is_empty());
        assert_eq!(s.interval, DEFAULT_INTERVAL);
        let (s, w) = settings_from(|k| match k {
            "OOMSHIM_LIVE" => Some("yes".into()),
            "OOMSHIM_LIVE_INTERVAL" => Some("5ms".into()),
            "OOMSHIM_LIVE_DIR" => Some("/somewhere".into()),
            _ => None,
        });
        assert!(s.enabled);
        assert_eq!(s.interval, DEFAULT_INTERVAL);
        assert_eq!(s.dir, PathBuf::from("/somewhere"));
        assert_eq!(w.len(), 2, "{w:?}");
        let (s, _) = settings_from(|k| (k == "OOMSHIM_LIVE").then(|| "0".into()));
        assert!(!s.enabled);
    }
}
