//! What the shim keeps about the process outside its recorded state, below everything that
//! uses it: the coarse clock, the calling thread's kernel id and the names of threads seen
//! allocating, the working directory noted at load time, and whether there is room for a dump.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub fn coarse_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes only the `timespec` it is given, a valid local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

thread_local! {
    /// The calling thread's kernel id, read once (0: not yet), with [`NAMED`] set once its name
    /// was noted (one thread-local for both, read once per allocation). A forked child's only
    /// thread gets a new id: the child's `fork` handler clears it.
    pub static TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// In [`TID`]: the thread's name was noted ([`allocating_thread_id`]).
const NAMED: u64 = 1 << 63;

pub fn thread_id() -> u64 {
    let cached = TID.try_with(|t| t.get()).unwrap_or(0) & !NAMED;
    if cached != 0 {
        return cached;
    }
    // SAFETY: `gettid` takes no argument and touches no memory.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) as u64 };
    let _ = TID.try_with(|t| t.set(tid));
    tid
}

/// [`thread_id`] of a thread that allocates: its name is noted at its first allocation.
#[inline]
pub fn allocating_thread_id() -> u64 {
    let cached = TID.try_with(|t| t.get()).unwrap_or(NAMED);
    if cached & NAMED != 0 && cached != NAMED {
        return cached & !NAMED;
    }
    first_allocation_of_thread()
}

#[cold]
#[inline(never)]
fn first_allocation_of_thread() -> u64 {
    let tid = thread_id();
    if TID.try_with(|t| t.set(tid | NAMED)).is_ok() {
        note_thread_name(tid);
    }
    tid
}

/// Names of threads seen allocating, from `/proc/self/task/TID/comm` at their first allocation:
/// the name a dump shows for a thread that has exited by then.
pub static THREAD_NAMES: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());

/// Reads the calling thread's name, at its first allocation.
fn note_thread_name(tid: u64) {
    if let Some(name) = read_thread_name(tid) {
        let mut names = THREAD_NAMES.lock().unwrap_or_else(|e| e.into_inner());
        names.retain(|(t, _)| *t != tid);
        names.push((tid, name));
    }
}

fn read_thread_name(tid: u64) -> Option<String> {
    let raw = std::fs::read(format!("/proc/self/task/{tid}/comm")).ok()?;
    let name = String::from_utf8_lossy(&raw)
        .trim_end_matches('\n')
        .to_string();
    (!name.is_empty()).then_some(name)
}

/// A thread's name for a dump: read now when the thread is alive, else as first seen.
pub fn thread_name(tid: u64) -> Option<String> {
    read_thread_name(tid).or_else(|| {
        THREAD_NAMES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(t, _)| *t == tid)
            .map(|(_, n)| n.clone())
    })
}

/// True when the process has the address space a dump needs (about 4 MiB, plus 1 KiB per live
/// allocation, plus twice the environment, which the configuration snapshot copies; measured
/// with RLIMIT_AS in tests/reliability.rs): Rust aborts on a failed allocation, so a process out
/// of host memory gets one message instead of a dump, never an abort. Says so once.
pub fn room_for_dump(live_allocations: u64) -> bool {
    let live = live_allocations as usize;
    let need = (4usize << 20)
        .saturating_add(live.saturating_mul(1024))
        .saturating_add(environment_bytes().saturating_mul(2));
    if oomshim_host::stacks::address_space_headroom(need) {
        return true;
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        oomshim_host::say!(
            "oomshim: no dump written: the process is out of host address space ({} needed); the program continues",
            dump::units::human_bytes(need as u64)
        );
    }
    false
}

/// The bytes of the process's environment strings, counted without allocating.
fn environment_bytes() -> usize {
    extern "C" {
        static environ: *const *const libc::c_char;
    }
    let mut total = 0usize;
    // SAFETY: environ is a NULL-terminated array of C strings; it is read, never kept. Another
    // thread's setenv may replace it meanwhile: the count is an estimate either way.
    unsafe {
        let mut p = environ;
        while !p.is_null() && !(*p).is_null() {
            total = total.saturating_add(libc::strlen(*p) + 1);
            p = p.add(1);
        }
    }
    total
}

/// The working directory when the shim was loaded ([`note_start_dir`]), in a static buffer:
/// noted from the load-time constructor, where nothing should be allocated.
struct StartDir {
    len: std::sync::atomic::AtomicUsize,
    buf: std::cell::UnsafeCell<[u8; START_DIR_MAX]>,
}
/// `PATH_MAX`: a longer working directory is not noted (the one at start-up is used then).
const START_DIR_MAX: usize = 4096;
// Safety: `buf` is written once, by `note_start_dir`, before `len` is published (Release);
// readers read it only after seeing a non-zero `len` (Acquire), and never write it.
unsafe impl Sync for StartDir {}
static START_DIR: StartDir = StartDir {
    len: std::sync::atomic::AtomicUsize::new(0),
    buf: std::cell::UnsafeCell::new([0; START_DIR_MAX]),
};

/// Notes the working directory (`getcwd` into the static buffer). Called once, from the
/// shim's load-time constructor (in `ffi`), when a preloaded shim sees the directory the
/// program was started in.
pub fn note_start_dir() {
    use std::sync::atomic::Ordering;
    if START_DIR.len.load(Ordering::Acquire) != 0 {
        return;
    }
    let buf = START_DIR.buf.get().cast::<libc::c_char>();
    // SAFETY: `buf` is START_DIR_MAX writable bytes, written by no one else: `len` is still 0,
    // so no reader looks at it, and this runs once, from the load-time constructor.
    if unsafe { libc::getcwd(buf, START_DIR_MAX) }.is_null() {
        return; // deleted, unreachable or too long: the directory at start-up is used then
    }
    // SAFETY: a successful `getcwd` left a NUL-terminated path inside `buf`.
    let len = unsafe { libc::strlen(buf) };
    START_DIR.len.store(len, Ordering::Release);
}

/// The working directory the shim noted when it was loaded.
pub fn start_dir() -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let len = START_DIR.len.load(Ordering::Acquire);
    if len == 0 {
        return None;
    }
    // SAFETY: a non-zero `len` (Acquire) means the buffer was written before it was published
    // and is never written again (see `StartDir`'s `Sync`).
    let all: &[u8; START_DIR_MAX] = unsafe { &*START_DIR.buf.get() };
    let bytes = &all[..len];
    Some(std::ffi::OsStr::from_bytes(bytes).into())
}
