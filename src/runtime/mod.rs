//! The shim's live state and the work behind each hook: start-up (lazily, on the first hooked
//! call, never at load time), recording into the ledger, the out-of-memory path ([`oom`]) and
//! turning a captured state into a dump ([`assemble`]). Called only from [`crate::ffi`], always
//! inside its guard, never holding a lock across a call into CUDA.

mod assemble;
mod oom;

pub use oom::OomEvent;

use crate::config::{Config, StackMode, DEFAULT_DEPTH, MAX_DEPTH};
use crate::ledger::{Allocation, Api, Ledger, StackId, StackTable};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct Shim {
    pub config: Config,
    ledger: Ledger,
    stacks: StackTable,
    start_ns: u64,
    oom: oom::OomTracker,
    oom_failures: AtomicU64,
    pinned_failures: AtomicU64,
}

static SHIM: OnceLock<Shim> = OnceLock::new();
static DISABLED: AtomicBool = AtomicBool::new(false);

/// True once the shim switched itself to pass-through.
pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// Switches the shim to pass-through for the rest of the process, saying why once.
pub fn disable(why: &str) {
    if !DISABLED.swap(true, Ordering::Relaxed) {
        eprintln!("oomshim: {why}; tracking is off from here on, the program continues unchanged");
    }
}

/// Says once per function that a real CUDA function could not be found.
pub fn report_missing(name: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "oomshim: the real {name} was not found in this process (is the CUDA runtime loaded?); \
             calls to it return cudaErrorInitializationError"
        );
    }
}

fn shim() -> Option<&'static Shim> {
    if disabled() {
        return None;
    }
    Some(SHIM.get_or_init(Shim::start))
}

impl Shim {
    fn start() -> Shim {
        let (config, warnings) = Config::from_lookup(|k| std::env::var(k).ok());
        for w in &warnings {
            eprintln!("oomshim: {w}");
        }
        if let Some(filter) = &config.log {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
        // This std is private to liboomshim.so, so the hook only silences the shim's own
        // panics: they are reported once by `disable` instead of as a backtrace in the host.
        std::panic::set_hook(Box::new(|_| {}));
        if config.stacks == StackMode::Native {
            // Learn the loaded objects now, once, rather than inside a later allocation.
            crate::stacks::refresh_modules();
        }
        tracing::debug!(?config, "oomshim started");
        Shim {
            config,
            ledger: Ledger::new(),
            stacks: StackTable::new(),
            start_ns: coarse_monotonic_ns(),
            oom: oom::OomTracker::new(),
            oom_failures: AtomicU64::new(0),
            pinned_failures: AtomicU64::new(0),
        }
    }

    /// Nanoseconds since start on the coarse monotonic clock: a few ns to read instead of
    /// ~20, and its millisecond resolution is plenty for allocation ages.
    fn now_ns(&self) -> u64 {
        coarse_monotonic_ns().saturating_sub(self.start_ns)
    }

    fn capture_stack(&self) -> StackId {
        if self.config.stacks == StackMode::Off {
            return StackId::EMPTY;
        }
        // The buffer is zeroed on every call: keep it no larger than the usual depth needs.
        let depth = self.config.depth;
        if depth <= DEFAULT_DEPTH {
            let mut frames = [0usize; DEFAULT_DEPTH];
            let n = crate::stacks::capture(&mut frames[..depth], true);
            self.stacks.intern(&frames[..n])
        } else {
            let mut frames = [0usize; MAX_DEPTH];
            let n = crate::stacks::capture(&mut frames[..depth], true);
            self.stacks.intern(&frames[..n])
        }
    }
}

fn coarse_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn thread_id() -> u64 {
    thread_local! {
        static TID: u64 = unsafe { libc::syscall(libc::SYS_gettid) as u64 };
    }
    TID.try_with(|t| *t)
        .unwrap_or_else(|_| unsafe { libc::syscall(libc::SYS_gettid) as u64 })
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A successful allocation of `bytes` at `addr`.
pub fn record_alloc(api: Api, addr: usize, bytes: u64, device: i32, stream: usize) {
    let Some(s) = shim() else { return };
    let alloc = Allocation {
        bytes,
        api,
        device,
        stream,
        thread: thread_id(),
        time_ns: s.now_ns(),
        seq: s.ledger.next_seq(),
        stack: s.capture_stack(),
    };
    s.ledger.record_alloc(addr, alloc);
    if !api.is_pinned_host() {
        s.oom.note_success(device, bytes);
    }
}

/// Removes a live allocation before it is freed; unknown pointers are counted.
pub fn take(addr: usize) -> Option<Allocation> {
    shim()?.ledger.take(addr)
}

/// Puts back an allocation whose free failed.
pub fn reinstate(addr: usize, alloc: Allocation) {
    if let Some(s) = shim() {
        s.ledger.reinstate(addr, alloc);
    }
}

/// A device allocation failed with cudaErrorMemoryAllocation.
pub fn record_oom(event: OomEvent) {
    let Some(s) = shim() else { return };
    s.oom_failures.fetch_add(1, Ordering::Relaxed);
    let stack = s.capture_stack();
    s.oom.on_failure(s, event, stack);
}

/// Pinned host memory ran out: host memory, not a device OOM; counted and passed through.
pub fn record_pinned_failure(api: Api, bytes: u64) {
    let Some(s) = shim() else { return };
    if s.pinned_failures.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!(
            "oomshim: {} of {} of page-locked host memory failed (host memory, not device memory)",
            api.name(),
            crate::report::units::human_bytes(bytes)
        );
    }
}

/// The device name, asked of the runtime once per device.
pub fn cached_device_name(device: i32, ask: fn(i32) -> Option<String>) -> Option<String> {
    static NAMES: Mutex<Vec<(i32, Option<String>)>> = Mutex::new(Vec::new());
    if let Some((_, n)) = NAMES.lock().ok()?.iter().find(|(d, _)| *d == device) {
        return n.clone();
    }
    // Asked without the lock held: this calls into CUDA.
    let name = ask(device);
    NAMES.lock().ok()?.push((device, name.clone()));
    name
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

/// Writes an on-demand dump on the calling thread. True when a dump file was written.
pub fn dump_now(
    reason: &str,
    device: Option<i32>,
    mem_info: Option<(u64, u64)>,
    name: Option<String>,
) -> bool {
    let Some(s) = shim() else { return false };
    let capture = assemble::Capture {
        snapshot: s.ledger.snapshot(),
        time: SystemTime::now(),
        now_ns: s.now_ns(),
        failing: None,
        device,
        mem_info,
        device_name: name,
    };
    let dump = assemble::assemble(s, reason, &capture, None);
    match oom::write(s, &dump) {
        Ok(w) => {
            eprintln!("oomshim: dump ({reason}) written: {}", w.path.display());
            true
        }
        Err(e) => {
            eprintln!("oomshim: could not write the dump ({reason}): {e}");
            false
        }
    }
}

/// Called at process exit: lets a dump that waits to learn whether its failure was recovered
/// be written now.
pub fn flush_at_exit() {
    if let Some(s) = SHIM.get() {
        s.oom.flush(std::time::Duration::from_secs(30));
    }
}
