//! The boundary between the host program and the shim's own code: the per-thread re-entry flag,
//! the panic guard and the process-wide off switch. Below the hooks (the `ffi` module) and the
//! live state (the `runtime` module), which both run their work through it.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the shim has switched itself to pass-through (an internal error, a missing real
/// function): every hook then calls straight through.
static DISABLED: AtomicBool = AtomicBool::new(false);

/// True once the shim is pass-through for the rest of the process.
pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// Switches the shim to pass-through for the rest of the process, saying why once.
pub fn disable(why: &str) {
    if !DISABLED.swap(true, Ordering::Relaxed) {
        crate::say!(
            "oomshim: {why}; tracking is off from here on, the program continues unchanged"
        );
    }
}

thread_local! {
    /// True while this thread is inside a hook: a hooked call made from inside another (a
    /// runtime function calling a hooked driver function, the symboliser, a dump) passes
    /// straight through, so one allocation is recorded once.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread entered the shim and is the outermost hook. Dropping it leaves.
/// Holds the thread's flag, found once on entry (a thread-local lookup is a call into the
/// loader in a shared library); the flag has no destructor, so it lives as long as the thread,
/// and the guard, being neither Send nor Sync, never leaves it.
pub struct Guard(*const Cell<bool>);

impl Guard {
    /// `None` when the shim is off or this thread is already inside it.
    pub fn enter() -> Option<Guard> {
        if disabled() {
            return None;
        }
        // try_with: during thread teardown the slot may be gone; then stay out of the way.
        let flag = IN_HOOK
            .try_with(|c| {
                if c.get() {
                    None
                } else {
                    c.set(true);
                    Some(c as *const Cell<bool>)
                }
            })
            .ok()
            .flatten();
        // Not `then_some(Guard(..))`: that builds a Guard even when not entered, and its drop
        // would clear the outer hook's flag.
        flag.map(Guard)
    }

    /// Runs shim code; a panic in it turns the shim into pass-through for the rest of the
    /// process (with one message) instead of unwinding into C.
    #[inline]
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        contain(f, |what| format!("internal error ({what})"))
    }
}

/// The shim's one panic boundary: runs `f`; a panic in it switches the shim to pass-through for
/// the rest of the process, saying `why(panic message)` once, and never unwinds into C. Callers
/// that hold no [`Guard`] (allocator mode's entry points run their work whether or not they are
/// the outermost hook) use it directly.
/// Inlined into each hook (no call of its own on the allocation path); the panic's handling is
/// out of line.
#[inline]
pub fn contain<R>(f: impl FnOnce() -> R, why: impl FnOnce(&str) -> String) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            disable(&why(&panic_message(payload)));
            None
        }
    }
}

/// The message of a caught panic.
#[cold]
#[inline(never)]
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: the flag of this thread (see `Guard`), which outlives every guard on it.
        unsafe { (*self.0).set(false) };
    }
}

/// Runs shim work from a thread of the shim's own (a trigger thread, an exit handler) inside the
/// guard, so anything it calls that is hooked passes straight through. `None` when refused.
pub fn guarded<R>(f: impl FnOnce() -> R) -> Option<R> {
    let guard = Guard::enter()?;
    guard.run(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One guard per thread: a second entry on the same thread is refused until the first
    /// guard is dropped, while another thread enters on its own flag meanwhile.
    #[test]
    fn a_thread_enters_once_until_its_guard_is_dropped() {
        let outer = Guard::enter().expect("the first entry");
        assert!(Guard::enter().is_none(), "re-entry on the same thread");
        let other = std::thread::spawn(|| {
            let g = Guard::enter();
            let again = Guard::enter().is_none();
            (g.is_some(), again)
        })
        .join()
        .unwrap();
        assert_eq!(other, (true, true));
        assert!(Guard::enter().is_none(), "still inside");
        drop(outer);
        let second = Guard::enter().expect("entry after leaving");
        assert_eq!(second.run(|| 7), Some(7));
        drop(second);
        assert!(guarded(|| ()).is_some());
    }
}
