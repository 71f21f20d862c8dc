//! The shim's live state and the work behind each hook: start-up (lazily, on the first hooked
//! call, never at load time), recording into the ledger, the out-of-memory path ([`oom`]) and
//! turning a captured state into a dump ([`assemble`], a pure function of what [`gather`] reads
//! for it). Called only from the hooks (the `ffi` module), always inside their guard, never
//! holding a lock across a call into CUDA.

use crate::allocator_mode;
use crate::failure::{self, assemble, gather};
use crate::fork;
use crate::record::{growth, recording, vmm};
use crate::state::{allocating_thread_id, coarse_monotonic_ns, start_dir, thread_id};

pub use crate::cuda::context::FailureContext;
use crate::cuda::context::Moment;
use crate::cuda::queries::Layer;
pub use crate::failure::{FrameworkNote, OomEvent};
pub use crate::record::growth::{FrameworkLive, StepSource};
pub use crate::record::recording::Recording;

use oomshim_core::config::{Config, StackMode};
use oomshim_host::ledger::{Allocation, Api, Ledger, StackId, StackTable};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The shim's state in this process. Its fields are read here, in this file, only: the children
/// (the OOM path, gather, fork, history, allocator mode) ask through the methods below.
pub struct Shim {
    config: Config,
    ledger: Ledger,
    stacks: StackTable,
    /// Python stacks: packed `(code id, offset)` frames, interned like native ones.
    py_stacks: StackTable,
    start_ns: u64,
    oom: failure::OomTracker,
    oom_failures: AtomicU64,
    pinned_failures: AtomicU64,
    /// Live bytes per site over steps or time buckets (src/preload/record/growth).
    growth: growth::Tracker,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

// The off switch lives with the guard, below the hooks and this module.
pub use oomshim_host::sys::{disable, disabled};

pub(crate) fn shim() -> Option<&'static Shim> {
    if disabled() {
        return None;
    }
    let s = SHIM.get_or_init(Shim::start);
    static TRIGGERS: std::sync::Once = std::sync::Once::new();
    // After the state exists (the trigger threads use it); one atomic load on later calls.
    TRIGGERS.call_once(|| start_triggers(s));
    Some(s)
}

/// The opt-in on-demand dumps: a signal (`OOMSHIM_SIGNAL`), a period (`OOMSHIM_INTERVAL`) and
/// the program's exit (`OOMSHIM_AT_EXIT`). These dumps ask CUDA nothing (no device free/total):
/// from a thread of the shim's own, asking could create a CUDA context.
pub(crate) fn start_triggers(s: &'static Shim) {
    if let Some(signo) = s.config.dump_signal {
        // The handler posts a semaphore (no descriptor the program could close or reuse,
        // see `sys::wait_for_dump_signal`); this thread writes the dump.
        let spawned = oomshim_host::sys::dump_signal_init()
            && std::thread::Builder::new()
                .name("oomshim-signal".into())
                .spawn(|| loop {
                    oomshim_host::sys::wait_for_dump_signal();
                    oomshim_host::sys::guarded(|| {
                        dump_now("signal", context_without_cuda(None, None))
                    });
                })
                .is_ok();
        match spawned.then(|| oomshim_host::sys::install_dump_signal(signo)) {
            Some(Ok(())) => tracing::debug!(signo, "dump signal installed"),
            Some(Err(e)) => {
                oomshim_host::say!("oomshim: OOMSHIM_SIGNAL: cannot install the handler ({e})")
            }
            None => oomshim_host::say!("oomshim: OOMSHIM_SIGNAL: cannot start the dump thread"),
        }
    }
    if let Some(every) = s.config.interval {
        let spawned = std::thread::Builder::new()
            .name("oomshim-interval".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                oomshim_host::sys::guarded(|| {
                    dump_now("interval", context_without_cuda(None, None))
                });
            });
        if spawned.is_err() {
            oomshim_host::say!("oomshim: OOMSHIM_INTERVAL: cannot start the dump thread");
        }
    }
    if s.config.at_exit {
        oomshim_host::sys::register_exit_dump(at_exit_dump);
    }
    // The flight recorder (src/core/flight): its own settings, read once here like the others.
    let (mut live, warnings) = crate::publish::settings_from(|k| std::env::var(k).ok());
    // Once, now, as the dump directory: a relative OOMSHIM_LIVE_DIR is relative to where the
    // program started, not to where it is when the publisher thread creates the region.
    let base = start_dir().or_else(|| std::env::current_dir().ok());
    live.dir = oomshim_core::config::resolve_dir(&live.dir, base.as_deref());
    live.targets = oomshim_core::jobfiles::Targets::of(&s.config, |k| std::env::var(k).ok());
    for w in &warnings {
        oomshim_host::say!("oomshim: {w}");
    }
    crate::publish::start(
        live,
        crate::publish::Source {
            live_dump,
            watch: |threshold| {
                if let Some(s) = SHIM.get() {
                    s.ledger.watch(threshold);
                }
            },
            watch_first: || {
                if let Some(s) = SHIM.get() {
                    s.ledger.watch_first();
                }
            },
            on_start: || oomshim_host::sys::register_live_cleanup(crate::publish::remove_at_exit),
        },
    );
}

/// The ledger's summary for the live region (src/core/flight): an on-demand dump's content, with
/// reason `live`, asked of nothing but the ledger and /proc (no CUDA, no NVML), taken inside
/// the guard on the publisher's thread.
pub(crate) fn live_dump() -> Option<dump::model::Dump> {
    oomshim_host::sys::guarded(|| {
        let s = SHIM.get()?;
        if disabled() {
            return None;
        }
        failure::on_demand::live(s, context_without_cuda(None, None))
    })
    .flatten()
}

/// `OOMSHIM_AT_EXIT`: what is still live when the program ends (a leak report).
pub fn at_exit_dump() {
    if SHIM.get().is_some() {
        oomshim_host::sys::guarded(|| dump_now("exit", context_without_cuda(None, None)));
    }
}

impl Shim {
    pub(crate) fn start() -> Shim {
        let (mut config, warnings) = Config::from_lookup(|k| std::env::var(k).ok());
        for w in &warnings {
            oomshim_host::say!("oomshim: {w}");
        }
        // Once, now: a relative directory is relative to where the program started (noted
        // when the shim was loaded), whatever it chdirs to later; messages name it absolutely.
        let base = start_dir().or_else(|| std::env::current_dir().ok());
        config.dir = oomshim_core::config::resolve_dir(&config.dir, base.as_deref());
        dump::write::set_file_mode(config.dump_mode);
        let _ = oomshim_host::sys::fault(); // the test hook is read once, now
        if let Some(filter) = &config.log {
            // `Targets` ("debug", "oomshim=trace,warn"), not `EnvFilter`: the same
            // directives a user writes here, without a regex engine to compile into the library.
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            match filter.parse::<tracing_subscriber::filter::Targets>() {
                Ok(targets) => {
                    // Everything reaches `targets` (the builder alone would stop at INFO).
                    let _ = tracing_subscriber::fmt()
                        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
                        .with_writer(std::io::stderr)
                        .finish()
                        .with(targets)
                        .try_init();
                }
                Err(e) => oomshim_host::say!(
                    "oomshim: OOMSHIM_LOG={filter:?} is not a filter ({e}): the shim's own diagnostics stay off"
                ),
            }
        }
        // This std is private to liboomshim.so, so the hook only silences the shim's own
        // panics: they are reported once by `disable` instead of as a backtrace in the host.
        std::panic::set_hook(Box::new(|_| {}));
        if config.stacks.native() {
            // Learn the loaded objects now, once, rather than inside a later allocation.
            oomshim_host::stacks::refresh_modules();
        }
        if config.stacks.python() {
            // One dlsym lookup; a process without Python pays nothing more.
            oomshim_host::pystack::init();
        }
        recording::start(Recording::from_stacks(config.stacks));
        tracing::debug!(?config, "oomshim started");
        Shim::empty(config)
    }

    /// A state with nothing recorded yet, under `config`.
    pub(crate) fn empty(config: Config) -> Shim {
        // At shim start, once: from here on a `fork` cannot copy a lock of the shim's own into
        // the child while another thread holds it.
        fork::register(fork::StateLocks {
            started: || Shim::started().is_some(),
            hold_growth: || {
                if let Some(s) = Shim::started() {
                    s.hold_growth_for_fork();
                }
            },
            release_growth: || {
                if let Some(s) = Shim::started() {
                    s.release_growth_after_fork();
                }
            },
            hold_state: || {
                if let Some(s) = Shim::started() {
                    s.hold_state_for_fork();
                }
            },
            release_state: |child| {
                if let Some(s) = Shim::started() {
                    s.release_state_after_fork(child);
                }
            },
        });
        Shim {
            config,
            ledger: Ledger::new(),
            stacks: StackTable::new(),
            py_stacks: StackTable::new(),
            start_ns: coarse_monotonic_ns(),
            oom: failure::OomTracker::new(),
            oom_failures: AtomicU64::new(0),
            pinned_failures: AtomicU64::new(0),
            growth: growth::Tracker::new(),
        }
    }

    /// Nanoseconds since start on the coarse monotonic clock: a few ns to read instead of
    /// ~20, and its millisecond resolution is plenty for allocation ages.
    pub(crate) fn now_ns(&self) -> u64 {
        coarse_monotonic_ns().saturating_sub(self.start_ns)
    }

    /// The native and the Python stack of the calling thread, as the recording mode says.
    pub(crate) fn capture_stacks(&self) -> (StackId, StackId) {
        self.capture_stacks_in(recording::current().stacks().unwrap_or(StackMode::Off))
    }

    pub(crate) fn capture_stacks_in(&self, stacks: StackMode) -> (StackId, StackId) {
        let native = if stacks.native() {
            self.capture_stack()
        } else {
            StackId::EMPTY
        };
        let python = if stacks.python() {
            self.capture_py_stack()
        } else {
            StackId::EMPTY
        };
        (native, python)
    }

    pub(crate) fn capture_py_stack(&self) -> StackId {
        if !oomshim_host::pystack::active() {
            return StackId::EMPTY; // no Python in this process: nothing more to pay
        }
        let table = &self.py_stacks;
        StackId(oomshim_host::pystack::capture_interned(
            table.tag(),
            |frames| table.intern(frames).0,
        ))
    }

    /// The state, if the shim started; never starts it (the `fork` handlers, the exit flush).
    pub(crate) fn started() -> Option<&'static Shim> {
        SHIM.get()
    }

    /// Allocations recorded since start (an atomic load: safe where only async-signal-safe
    /// calls are).
    pub(crate) fn total_allocations(&self) -> u64 {
        self.ledger.total_allocations()
    }

    /// The ledger's live allocations now, its largest `OOMSHIM_TOP` sites in full.
    pub(crate) fn snapshot(&self) -> oomshim_host::ledger::Snapshot {
        self.ledger.snapshot(self.config.top)
    }

    /// The bytes the ledger holds live on `device`.
    pub(crate) fn device_bytes(&self, device: i32) -> u64 {
        self.ledger.device_bytes(device)
    }

    /// Device out-of-memory failures recorded so far.
    pub(crate) fn oom_failures(&self) -> u64 {
        self.oom_failures.load(Ordering::Relaxed)
    }

    /// The growth history as it is now, copied for a failure's dump (see `growth::Tracker::freeze`).
    pub(crate) fn frozen_growth(&self) -> Option<growth::Frozen> {
        self.growth.freeze(&self.ledger, self, self.now_ns())
    }

    /// The growth for a dump assembled now (see `growth::Tracker::analyse`).
    pub(crate) fn growth_now(
        &self,
        free_bytes: Option<u64>,
        name: impl FnMut(&[growth::StackPair]) -> Vec<Vec<dump::model::Frame>>,
    ) -> Option<dump::model::Growth> {
        self.growth
            .analyse(free_bytes, &self.ledger, self, self.now_ns(), name)
    }

    /// The request-size summary for a dump.
    pub(crate) fn request_sizes(&self) -> Option<dump::model::RequestSizes> {
        self.growth.request_sizes()
    }

    /// The frames of an interned native stack.
    pub(crate) fn native_frames(&self, id: StackId) -> Vec<usize> {
        self.stacks.frames(id)
    }

    /// The packed `(code id, offset)` frames of an interned Python stack.
    pub(crate) fn python_frames(&self, id: StackId) -> Vec<usize> {
        self.py_stacks.frames(id)
    }

    /// A device out-of-memory failure on the calling thread, counted by the caller: its stacks
    /// are captured here and the OOM path ([`oom`]) takes it, dumped as `mode` says.
    pub(crate) fn oom_failure(
        &'static self,
        event: OomEvent,
        mode: failure::Mode,
        framework: Option<FrameworkNote>,
    ) -> failure::Handled {
        let stacks = self.capture_stacks();
        self.oom
            .on_failure(self, event, stacks, thread_id(), mode, framework)
    }

    /// Counts a device out-of-memory failure (the dump's `oom_failures`).
    pub(crate) fn count_oom_failure(&self) {
        self.oom_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// `fork` prepare: locks 1 and 2 of `fork`'s order, the growth tracker's.
    pub(crate) fn hold_growth_for_fork(&'static self) {
        self.growth.hold_for_fork();
    }

    /// `fork` parent and child: lets go of locks 1 and 2.
    pub(crate) fn release_growth_after_fork(&self) {
        self.growth.release_after_fork();
    }

    /// `fork` prepare: locks 8 to 11 of `fork`'s order, in that order: the OOM tracker's, the
    /// native and the Python stack tables' shards, the ledger's shards.
    pub(crate) fn hold_state_for_fork(&'static self) {
        self.oom.hold_for_fork();
        self.stacks.before_fork();
        self.py_stacks.before_fork();
        self.ledger.before_fork();
    }

    /// `fork` parent and child: lets go of locks 11 to 8; in the child, the OOM tracker forgets
    /// the parent's requests, and the ledger watches for no publisher (none runs in a child).
    pub(crate) fn release_state_after_fork(&self, child: bool) {
        self.ledger.after_fork();
        if child {
            self.ledger.watch(None);
        }
        self.py_stacks.after_fork();
        self.stacks.after_fork();
        self.oom.release_after_fork(child);
    }

    /// The calling thread's stack, interned; the id of this thread's previous stack is reused
    /// without hashing when the stack is unchanged (see `stacks::capture_interned`).
    pub(crate) fn capture_stack(&self) -> StackId {
        let table = &self.stacks;
        StackId(oomshim_host::stacks::capture_interned(
            self.config.depth,
            true,
            table.tag(),
            |f| table.intern(f).0,
        ))
    }
}

/// A successful allocation of `bytes` at `addr`.
pub fn record_alloc(api: Api, addr: usize, bytes: u64, device: i32, stream: usize) {
    record_alloc_with(api, addr, bytes, device, stream, true);
}

/// [`record_alloc`], with native stacks only when `native_ok` (allocator mode records tensors
/// with their Python stack alone unless OOMSHIM_STACKS asks for more: unwinding libtorch on
/// every tensor would cost more than the allocation itself).
pub fn record_alloc_with(
    api: Api,
    addr: usize,
    bytes: u64,
    device: i32,
    stream: usize,
    native_ok: bool,
) {
    let Some(s) = shim() else { return };
    let Some(stacks) = recording::current().stacks() else {
        s.ledger.note_untracked(); // pass-through: nothing recorded
        return;
    };
    let (stack, py_stack) = if native_ok || recording::chosen() {
        s.capture_stacks_in(stacks)
    } else {
        let py = if stacks.python() {
            s.capture_py_stack()
        } else {
            StackId::EMPTY
        };
        (StackId::EMPTY, py)
    };
    let thread = allocating_thread_id();
    let alloc = Allocation {
        bytes,
        api,
        device,
        stream,
        thread,
        time_ns: s.now_ns(),
        seq: s.ledger.next_seq(),
        stack,
        py_stack,
    };
    s.ledger.record_alloc(addr, alloc);
    if !api.is_pinned_host() {
        // One relaxed load unless a failed request waits for its retry.
        s.oom.note_success(thread, bytes);
    }
    // A few relaxed loads and one store: the request size, the step detector's anchor, the time
    // bucket; samples (cold) at detected steps or once per time bucket (src/preload/record/growth).
    s.growth.on_alloc(&s.ledger, s, &alloc);
}

/// Switches what the shim records from now on (see [`recording`]), starting the shim first so
/// that the mode it starts in never overwrites the choice. The mode before; `None` when the shim
/// is off.
pub fn set_recording(mode: Recording) -> Option<Recording> {
    shim()?;
    Some(recording::set(mode))
}

/// The recording mode now; `None` when the shim is off.
pub fn current_recording() -> Option<Recording> {
    shim()?;
    Some(recording::current())
}

/// A step boundary (`oomshim_step()`, or the Python hook's optimizer and forward-pass marks):
/// samples live bytes per site; `framework_live` is the framework's own count of its live
/// tensors then, when the mark carries it. Returns the number of marks of that source so far (1 for the
/// first), 0 when the shim is off.
pub fn step(source: StepSource, framework_live: Option<FrameworkLive>) -> u64 {
    match shim() {
        Some(s) => s.growth.step(&s.ledger, s, source, framework_live),
        None => 0,
    }
}

/// True when the process has grown steadily with `source`'s steps so far (the verdict's leak
/// threshold per step): the Python hook then asks torch to record where new tensors come from.
pub fn growing(source: StepSource) -> bool {
    match shim() {
        Some(s) => s
            .growth
            .growing(source, oomshim_core::verdict::LEAK_MIN_BYTES_PER_STEP),
        None => false,
    }
}

/// The process exits (`exit`, its status): the dumps still settling are written first, so the
/// answer a failure leaves for the job is the newest failure's.
fn job_files_at_exit(status: i32) {
    flush_at_exit();
    failure::job::at_exit(status, Shim::started().map_or(0, |s| s.total_allocations()));
}

impl failure::recorder::Recorder for Shim {
    fn config(&self) -> &Config {
        &self.config
    }

    fn snapshot(&self) -> oomshim_host::ledger::Snapshot {
        Shim::snapshot(self)
    }

    fn now_ns(&self) -> u64 {
        Shim::now_ns(self)
    }

    fn device_bytes(&self, device: i32) -> u64 {
        Shim::device_bytes(self, device)
    }

    fn live_count(&self) -> u64 {
        self.ledger.live_count()
    }

    fn oom_failures(&self) -> u64 {
        Shim::oom_failures(self)
    }

    fn frozen_growth(&self) -> Option<growth::Frozen> {
        Shim::frozen_growth(self)
    }

    fn growth_now(
        &self,
        free_bytes: Option<u64>,
        name: &mut dyn FnMut(&[growth::StackPair]) -> Vec<Vec<dump::model::Frame>>,
    ) -> Option<dump::model::Growth> {
        Shim::growth_now(self, free_bytes, name)
    }

    fn request_sizes(&self) -> Option<dump::model::RequestSizes> {
        Shim::request_sizes(self)
    }

    fn native_frames(&self, id: StackId) -> Vec<usize> {
        Shim::native_frames(self, id)
    }

    fn python_frames(&self, id: StackId) -> Vec<usize> {
        Shim::python_frames(self, id)
    }

    fn watch_exit(&self) {
        // Whatever becomes of the failure, the exit says what got no dump; and, should it end
        // the process, what it leaves for the job (registered after the flush, so it runs
        // first and flushes itself).
        oomshim_host::sys::flush_dumps_at_exit(flush_at_exit);
        oomshim_host::sys::register_exit_with_status(job_files_at_exit);
    }
}

/// The shim as allocator mode sees it (see `allocator_mode::host::Host`): the hooks pass it with
/// each call of torch's allocator.
pub struct AllocatorHost;

/// What the allocator hooks pass.
pub static ALLOCATOR_HOST: AllocatorHost = AllocatorHost;

impl allocator_mode::host::Host for AllocatorHost {
    fn record_tensor(&self, addr: usize, bytes: u64, device: i32, stream: usize, native_ok: bool) {
        record_alloc_with(Api::TorchAlloc, addr, bytes, device, stream, native_ok);
    }

    fn forget(&self, addr: usize) {
        let _ = take(addr);
    }

    fn python_stack(&self) -> u32 {
        shim().map_or(0, |s| s.capture_py_stack().0)
    }

    fn python_frames(&self, id: StackId) -> Option<Vec<usize>> {
        shim().map(|s| s.python_frames(id))
    }

    /// Records the failure and writes its dump on this thread (the OOM path shared with
    /// preload), from the context the allocator gathered into `event`, with the framework's
    /// word from its observers when there is one.
    fn out_of_memory(
        &self,
        event: OomEvent,
        framework: Option<FrameworkNote>,
    ) -> allocator_mode::AllocatorOom {
        use allocator_mode::AllocatorOom;
        // Pass-through (switched off by the program, or after a failure of the shim's own)
        // writes no dump, as under preload: the allocator still raises its error with torch's
        // words.
        let mode = failure::Mode::Now(failure::Resolution::Allocator);
        match record_oom(event, mode, framework) {
            Some(failure::Handled::Written { path, verdict }) => AllocatorOom {
                path,
                verdict: Some(verdict),
            },
            Some(failure::Handled::Repeat(path)) => AllocatorOom {
                path,
                verdict: None,
            },
            _ => AllocatorOom::default(),
        }
    }
}

impl growth::SiteKeyer for Shim {
    /// The program's own Python line when the stack has one; all Python-less allocations of a
    /// Python process together; else the native stack (grouped by name at dump time).
    fn key(&self, native: StackId, python: StackId) -> growth::SiteKey {
        if python != StackId::EMPTY {
            let frames = self.py_stacks.frames(python);
            return match oomshim_host::pystack::user_line(&frames) {
                Some((code, line)) => growth::SiteKey::PyLine(code, line),
                None => growth::SiteKey::PyStack(python),
            };
        }
        let python_recorded = recording::current().stacks().is_some_and(StackMode::python);
        if python_recorded && oomshim_host::pystack::active() {
            return growth::SiteKey::NoPython;
        }
        growth::SiteKey::Native(native)
    }
}

/// A framework hook is attached in this process (oomshim's Python hook registered torch's OOM
/// observer): failures wait for its word instead of writing a provisional dump.
pub fn framework_attached() {
    if let Some(s) = shim() {
        s.oom.set_hooked();
    }
}

/// What a framework's word about an out-of-memory error came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameworkWord {
    /// It is in the dump that explains the failure.
    Included = 0,
    /// The dump was final before it arrived (`OOMSHIM_SETTLE=0`).
    TooLate = 1,
    /// The failure repeats an earlier dumped one.
    Repeat = 2,
    /// Given from inside allocator mode's observers: it joins the dump written when they return
    /// (no path yet).
    Held = 3,
}

/// The most bytes of JSON a framework's word (`framework_oom`, `framework_kinds`) may have.
pub const MAX_FRAMEWORK_WORD_BYTES: usize = failure::framework::MAX_REPORT_BYTES;

/// A framework raised its out-of-memory error on the calling thread (torch's OOM observer via
/// the Python hook), said as its JSON `report`; the device's (free, total) in it is as the
/// framework saw them. Returns the dump that explains it, when there is one, and what became of
/// the word; None for JSON that is not such a word, or when the shim is off.
pub fn framework_oom(report: &[u8]) -> Option<(std::path::PathBuf, FrameworkWord)> {
    let (note, mem_info) = failure::framework::parse(report)?;
    let s = shim()?;
    let Some(note) = allocator_mode::hold(note) else {
        return Some((std::path::PathBuf::new(), FrameworkWord::Held));
    };
    let stacks = s.capture_stacks();
    match s
        .oom
        .on_framework_oom(s, note, thread_id(), stacks, |device| {
            context_without_cuda(Some(device), mem_info)
        }) {
        failure::Handled::Written { path, .. } => path.map(|p| (p, FrameworkWord::Included)),
        failure::Handled::Explained { path, included } => path.map(|p| {
            (
                p,
                if included {
                    FrameworkWord::Included
                } else {
                    FrameworkWord::TooLate
                },
            )
        }),
        failure::Handled::Repeat(path) => path.map(|p| (p, FrameworkWord::Repeat)),
        _ => None,
    }
}

/// The framework's memory by kind now (`{"device": N, "kinds": {...}}`, with torch's
/// `"attribution"` while its history is on), for the live region: `oomshim top`, the exporter
/// and a post-mortem read it there. None for JSON that is not such an account.
pub fn framework_kinds(account: &[u8]) -> Option<()> {
    let (device, kinds, attribution) = failure::framework::parse_live_kinds(account)?;
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    crate::publish::note_kinds(oomshim_core::flight::LiveKinds {
        unix_ms,
        device,
        kinds,
        attribution,
    });
    Some(())
}

/// Whether the framework's word about the out-of-memory error it raises now on this thread
/// would go into a dump (see `OomTracker::framework_word_wanted`); None when the shim is off.
pub fn framework_oom_wanted(device: i32, bytes: u64) -> Option<bool> {
    let s = shim()?;
    Some(s.oom.framework_word_wanted(s, thread_id(), device, bytes))
}

/// Removes a live allocation before it is freed; unknown pointers are counted.
pub fn take(addr: usize) -> Option<oomshim_host::ledger::Taken> {
    shim()?.ledger.take(addr)
}

/// Puts back an allocation whose free failed.
pub fn reinstate(addr: usize, taken: oomshim_host::ledger::Taken) {
    if let Some(s) = shim() {
        s.ledger.reinstate(addr, taken);
    }
}

/// Whether a device out-of-memory failure now would be recorded: the shim runs and is not in
/// pass-through. The hooks ask before they gather a failure's context ([`record_oom`] drops it
/// otherwise), so that pass-through asks CUDA nothing about the failure.
pub fn records_failures() -> bool {
    shim().is_some() && recording::current() != Recording::PassThrough
}

/// `OOMSHIM_FAULT=panic-in-alloc[:N]` (a test hook, see RELIABILITY.md section 7): a panic in
/// the hook path of the Nth successful allocation, caught by the hook's guard like any other.
pub(crate) fn inject_alloc_fault() {
    if let oomshim_core::config::Fault::PanicInAlloc(n) = oomshim_host::sys::fault() {
        static SEEN: AtomicU64 = AtomicU64::new(0);
        if SEEN.fetch_add(1, Ordering::Relaxed) + 1 == n {
            panic!("injected fault, OOMSHIM_FAULT=panic-in-alloc:{n}");
        }
    }
}

/// An allocation call of either layer returned `rc` (called inside the hook's guard). Inlined
/// into the hook: the hot path of every allocation.
#[inline]
pub fn on_alloc(layer: &Layer, api: Api, rc: i32, addr: usize, bytes: u64, stream: usize) {
    use oomshim_host::sys::cuda_error;
    if rc == cuda_error::SUCCESS {
        if addr != 0 {
            inject_alloc_fault();
            if recording::current() == Recording::PassThrough {
                // Nothing is recorded: not even the device is asked.
                record_alloc(api, addr, bytes, -1, stream);
                return;
            }
            let device = if api.is_pinned_host() {
                -1
            } else {
                (layer.current_device)()
            };
            if api.has_stream() {
                crate::cuda::pools::note(device, None);
            }
            record_alloc(api, addr, bytes, device, stream);
        }
    } else if rc == cuda_error::MEMORY_ALLOCATION {
        if api.is_pinned_host() {
            record_pinned_failure(api, bytes);
        } else if records_failures() {
            // (Not even the device is asked in pass-through.)
            on_oom(layer, api, bytes, (layer.current_device)(), rc, stream);
        }
    }
}

/// A device allocation failed for lack of memory: asks `layer` about the device on the failing
/// thread (the one place that may ask CUDA safely) and hands the failure on with all it learnt.
/// Asks nothing when the failure would be dropped (pass-through, the shim off).
pub fn on_oom(layer: &Layer, api: Api, bytes: u64, device: i32, rc: i32, stream: usize) {
    if !records_failures() {
        return;
    }
    let context = FailureContext {
        vmm: vmm::summary(),
        free_blocks: allocator_mode::free_blocks_if_active(device),
        ..crate::cuda::context::gather(layer, Some(device), Moment::Failure)
    };
    let event = OomEvent {
        api,
        bytes,
        device,
        error_code: rc,
        stream,
        context,
    };
    record_oom(event, failure::Mode::Settle, None);
}

/// `oomshim_dump(reason)`: a dump now, about the caller's current device when the process
/// allocated there (asking about another could create a context), with what CUDA tells of it
/// on this thread. True when a dump file was written.
pub fn dump_on_demand(reason: &str) -> bool {
    let layer = crate::cuda::queries::present_layer();
    let device = device_for_on_demand_dump(layer.current_device);
    let context = FailureContext {
        vmm: vmm::summary(),
        free_blocks: allocator_mode::free_blocks_if_active(device.unwrap_or(0)),
        ..crate::cuda::context::gather(layer, device, Moment::OnDemand)
    };
    dump_now(reason, context)
}

/// The context of a dump taken where CUDA must not be asked (the shim's own signal, interval,
/// exit and live-summary threads, which could create a context; a framework's word, which
/// carries its own numbers): what the process learnt before, and in allocator mode the
/// allocator's free blocks.
pub(crate) fn context_without_cuda(
    device: Option<i32>,
    mem_info: Option<(u64, u64)>,
) -> FailureContext {
    FailureContext {
        free_blocks: allocator_mode::free_blocks(device),
        ..FailureContext::learnt_before(device, mem_info)
    }
}

/// A device allocation failed for lack of memory (under preload, or in allocator mode): counted,
/// shown in the live region before its dump is done, and handed to the failure path, which
/// writes its dump as `mode` says. `None` when nothing is recorded (the shim off, pass-through).
pub(crate) fn record_oom(
    event: OomEvent,
    mode: failure::Mode,
    framework: Option<FrameworkNote>,
) -> Option<failure::Handled> {
    let s = shim()?;
    if recording::current() == Recording::PassThrough {
        return None;
    }
    s.count_oom_failure();
    crate::publish::note_failure(
        event.device,
        event.bytes,
        event.api.name(),
        event.context.mem_info,
    );
    Some(s.oom_failure(event, mode, framework))
}

/// Pinned host memory ran out: host memory, not a device OOM; counted and passed through.
pub fn record_pinned_failure(api: Api, bytes: u64) {
    let Some(s) = shim() else { return };
    if s.pinned_failures.fetch_add(1, Ordering::Relaxed) == 0 {
        oomshim_host::say!(
            "oomshim: {} of {} of page-locked host memory failed (host memory, not device memory)",
            api.name(),
            dump::units::human_bytes(bytes)
        );
    }
}

/// The device an on-demand dump may ask about: the caller's current device, but only when the
/// process already allocated on it (asking CUDA about an untouched device would create a
/// context there, costing memory).
pub fn device_for_on_demand_dump(current: fn() -> i32) -> Option<i32> {
    let s = shim()?;
    if s.ledger.total_allocations() == 0 {
        return None; // CUDA may not even be loaded: ask it nothing.
    }
    let d = current();
    (s.ledger.device_peak_bytes(d) > 0).then_some(d)
}

/// Longest dump reason kept, in characters: a label, not a log.
pub const MAX_REASON_CHARS: usize = 200;

/// The reason a program passed to `oomshim_dump`, as the dump records it and stderr echoes it:
/// at most [`MAX_REASON_CHARS`] characters (only the first bytes of a huge one are even
/// looked at), invalid UTF-8 replaced and control characters shown escaped, so a reason can
/// neither flood stderr nor drive the terminal.
pub fn dump_reason(raw: &[u8]) -> String {
    let head = &raw[..raw.len().min(MAX_REASON_CHARS * 4)];
    let text = String::from_utf8_lossy(head);
    let mut out: String = dump::units::clean(&text)
        .chars()
        .take(MAX_REASON_CHARS)
        .collect();
    if out.len() < raw.len() && out.chars().count() == MAX_REASON_CHARS {
        out.push('…');
    }
    out
}

/// Writes an on-demand dump on the calling thread, about what `context` gathered there. True
/// when a dump file was written.
pub fn dump_now(reason: &str, context: FailureContext) -> bool {
    match shim() {
        Some(s) => failure::on_demand::write(s, reason, context),
        None => false,
    }
}

/// The process ends by `_exit`/`_Exit` with `status`: a failure that ended it leaves its answer
/// for the job (async-signal-safe: see `failure::job`).
pub fn job_files_at_raw_exit(status: i32) {
    failure::job::at_raw_exit(status, Shim::started().map_or(0, |s| s.total_allocations()));
}

/// Called at process exit: lets a dump that waits to learn whether its failure was recovered
/// be written now.
pub fn flush_at_exit() {
    if let Some(s) = Shim::started() {
        s.oom.flush(Some(s), std::time::Duration::from_secs(30));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_reasons_are_bounded_and_clean() {
        assert_eq!(dump_reason(b"before-eval"), "before-eval");
        assert_eq!(dump_reason(b"a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(dump_reason(b"\xff ok"), "\u{fffd} ok");
        let huge = dump_reason(&vec![b'r'; 10_000_000]);
        assert_eq!(huge.chars().count(), MAX_REASON_CHARS + 1);
        assert!(huge.ends_with('…'));
        assert!(!dump_reason(&vec![0x07; 5000]).chars().any(char::is_control));
    }
}

// ---------- driver API and VMM glue (called by the hooks of src/preload/ffi/driver.rs; the state is vmm.rs) ----------

pub use vmm::{
    address_free_begin as vmm_address_free_begin, handle_key as vmm_handle_key,
    mapped as vmm_mapped, reserved as vmm_reserved, summary as vmm_summary, totals as vmm_totals,
    VmmTotals, VmmUndo,
};

/// A successful `cuMemCreate`: its physical memory joins the ledger.
pub fn vmm_created(handle: u64, bytes: u64, device: i32, host: bool) {
    vmm::created(handle, bytes, device, host, |api, key, bytes, device| {
        record_alloc(api, key, bytes, device, 0)
    });
}

/// Before `cuMemRelease(handle)`.
pub fn vmm_release_begin(handle: u64) -> Option<VmmUndo> {
    vmm::release_begin(handle, take)
}

/// Before `cuMemUnmap(va, size)`.
pub fn vmm_unmap_begin(va: u64, size: u64) -> Option<VmmUndo> {
    vmm::unmap_begin(va, size, take)
}

/// The real VMM call failed: what its `vmm_*_begin` removed comes back.
pub fn vmm_undo(u: VmmUndo) {
    vmm::undo(u, reinstate);
}

/// Support for benchmarks (`benches/dump.rs`): a shim state built directly, without hooks or a
/// device, and the dump an out-of-memory failure would write for it. Not part of the API.
#[doc(hidden)]
pub mod bench_support {
    use super::*;

    /// A shim holding `allocations` live device allocations over `stacks` distinct native
    /// stacks (each `frames` return addresses from `pool`, varied per stack so every stack is
    /// distinct but every address stays inside the pool's functions).
    pub struct Synthetic(Shim);

    pub fn synthetic(allocations: usize, stacks: usize, pool: &[usize], top: usize) -> Synthetic {
        let config = Config {
            top,
            ..Config::default()
        };
        let s = Shim::empty(config);
        s.oom_failures.store(1, Ordering::Relaxed);
        let ids: Vec<StackId> = (0..stacks)
            .map(|i| {
                let mut frames: Vec<usize> = pool.to_vec();
                let n = frames.len();
                // Three mixed offsets (< 128 bytes each) make 10^6 distinct stacks.
                frames[0] += i % 97;
                frames[1 % n] += (i / 97) % 103;
                frames[2 % n] += (i / (97 * 103)) % 101;
                // The other frames vary too, as in real programs (~2,000 distinct addresses).
                for (k, f) in frames.iter_mut().enumerate().skip(3) {
                    *f += (i.wrapping_mul(2_654_435_761) >> (k % 24)) % 64;
                }
                s.stacks.intern(&frames)
            })
            .collect();
        for i in 0..allocations {
            let alloc = Allocation {
                bytes: 512 + (i as u64 % 4096) * 1024,
                api: Api::CudaMalloc,
                device: 0,
                stream: 0,
                thread: 1,
                time_ns: 0,
                seq: s.ledger.next_seq(),
                stack: ids[i % ids.len().max(1)],
                py_stack: StackId::EMPTY,
            };
            s.ledger.record_alloc(0x7f00_0000_0000 + i * 4096, alloc);
        }
        Synthetic(s)
    }

    impl Synthetic {
        /// Snapshot, assemble (symbolise, sites, verdict) and serialise an OOM dump, as the
        /// writer does; returns the JSON bytes.
        pub fn dump_json(&self) -> Vec<u8> {
            let s = &self.0;
            let context = FailureContext {
                device: Some(0),
                mem_info: Some((0, 80 << 30)),
                device_name: Some("bench".into()),
                ..FailureContext::learnt_before(Some(0), None)
            };
            let failing = assemble::Failing {
                api: Api::CudaMalloc,
                bytes: 1 << 30,
                device: 0,
                error_code: 2,
                stack: StackId::EMPTY,
                py_stack: StackId::EMPTY,
            };
            let capture = failure::capture::take(s, Some(failing), context);
            let facts = assemble::Facts::read(capture.context.device);
            let dump = gather::assemble_now(s, "oom", &capture, None, None, facts);
            serde_json::to_vec_pretty(&dump).expect("a dump serialises")
        }
    }
}
