//! `fork` and the shim's locks. A `fork` copies only the forking thread; a lock another thread
//! held at that moment would stay held forever in the child. So every lock a hook, the writer
//! or a trigger thread takes is taken by the forking thread in the `pthread_atfork` prepare
//! handler and let go in the parent and child handlers ([`register_fork_handlers`]).
//!
//! [`ForkHeld`] (declared with [`fork_held!`]) is where the forking thread keeps a lock's guard
//! meanwhile. Locks that are not `std` guards (the ledger's and the stack tables' spin shards)
//! are kept locked and forced open instead (`Ledger::before_fork`/`after_fork`).
//!
//! Taking them all cannot deadlock because they are always taken in one fixed order, and no
//! path holds one of them while it waits for one taken earlier in that order. The order is the
//! preload's (it alone knows every lock): see `src/preload/fork.rs`.

use std::cell::RefCell;
use std::panic::catch_unwind;
use std::thread::LocalKey;

/// A slot of the forking thread's that keeps one lock's guard from the `fork` prepare handler
/// to the parent's or child's handler (the child's only thread is that same thread, with the
/// same slot). Declared with [`fork_held!`], one per lock; each thread has its own slot, so a
/// guard is only ever let go by the thread that took it.
pub struct ForkHeld<G: 'static> {
    slot: &'static LocalKey<RefCell<Option<G>>>,
}

impl<G: 'static> ForkHeld<G> {
    /// Over a thread-local slot; use [`fork_held!`], which declares the slot too.
    #[doc(hidden)]
    pub const fn new(slot: &'static LocalKey<RefCell<Option<G>>>) -> Self {
        ForkHeld { slot }
    }

    /// Prepare handler: keeps `guard` on this thread until [`Self::take`] or [`Self::release`].
    /// A thread being torn down (its slot gone) lets it go at once.
    pub fn hold(&self, guard: G) {
        let _ = self.slot.try_with(|h| *h.borrow_mut() = Some(guard));
    }

    /// Parent or child handler: the guard this thread holds, if any, for a handler that has
    /// something to do under the lock before letting it go.
    pub fn take(&self) -> Option<G> {
        self.slot.try_with(|h| h.borrow_mut().take()).ok().flatten()
    }

    /// Parent or child handler: lets go of the guard this thread holds, if any.
    pub fn release(&self) {
        drop(self.take());
    }
}

/// Declares a [`ForkHeld`] static (and the thread-local slot behind it) for guards of type
/// `$guard`: `fork_held! { static HELD: MutexGuard<'static, State>; }`.
#[macro_export]
macro_rules! fork_held {
    ($(#[$attr:meta])* $vis:vis static $name:ident: $guard:ty;) => {
        $(#[$attr])*
        $vis static $name: $crate::sys::ForkHeld<$guard> = {
            ::std::thread_local! {
                static SLOT: ::std::cell::RefCell<::std::option::Option<$guard>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
            }
            $crate::sys::ForkHeld::new(&SLOT)
        };
    };
}

/// The shim's `fork` handlers, set once by [`register_fork_handlers`].
struct ForkHandlers {
    prepare: fn(),
    parent: fn(),
    child: fn(),
}
static FORK_HANDLERS: std::sync::OnceLock<ForkHandlers> = std::sync::OnceLock::new();

extern "C" {
    // In glibc this lives in libc_nonshared.a (it passes the caller's __dso_handle), so the
    // libc crate does not declare it; the linker script libc.so pulls it in.
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

unsafe extern "C" fn fork_prepare() {
    if let Some(h) = FORK_HANDLERS.get() {
        let _ = catch_unwind(h.prepare);
    }
}

unsafe extern "C" fn fork_parent() {
    if let Some(h) = FORK_HANDLERS.get() {
        let _ = catch_unwind(h.parent);
    }
}

unsafe extern "C" fn fork_child() {
    if let Some(h) = FORK_HANDLERS.get() {
        let _ = catch_unwind(h.child);
    }
}

/// Registers `pthread_atfork` handlers (once per process, at shim start): `prepare` runs in the
/// forking thread before `fork`, `parent` and `child` after it in each process. They keep the
/// shim's locks from being copied into a child while a thread that does not exist there holds
/// them.
pub fn register_fork_handlers(prepare: fn(), parent: fn(), child: fn()) {
    if FORK_HANDLERS
        .set(ForkHandlers {
            prepare,
            parent,
            child,
        })
        .is_err()
    {
        return;
    }
    // SAFETY: the three handlers are argument-less `extern "C"` functions that catch their
    // handler's panic (nothing unwinds into libc) and live as long as the shim's code.
    let rc = unsafe { pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if rc != 0 {
        tracing::debug!(rc, "pthread_atfork failed");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, MutexGuard};

    static FIRST: Mutex<u32> = Mutex::new(1);
    static SECOND: Mutex<u32> = Mutex::new(2);
    fork_held! {
        static FIRST_HELD: MutexGuard<'static, u32>;
    }
    fork_held! {
        static SECOND_HELD: MutexGuard<'static, u32>;
    }

    #[test]
    fn a_held_guard_keeps_its_lock_until_released_on_the_thread_that_took_it() {
        assert!(FIRST_HELD.take().is_none(), "nothing held yet");
        FIRST_HELD.hold(FIRST.lock().unwrap());
        SECOND_HELD.hold(SECOND.lock().unwrap());
        // Held past the handler that took them; each slot keeps its own lock.
        assert!(FIRST.try_lock().is_err());
        assert!(SECOND.try_lock().is_err());
        // Another thread has slots of its own: nothing of this thread's to let go there.
        std::thread::spawn(|| {
            assert!(FIRST_HELD.take().is_none());
            SECOND_HELD.release();
        })
        .join()
        .unwrap();
        assert!(SECOND.try_lock().is_err());

        SECOND_HELD.release();
        assert!(SECOND.try_lock().is_ok());
        assert!(
            FIRST.try_lock().is_err(),
            "one slot's release leaves the other's lock"
        );
        // A handler may still work under the lock before letting it go.
        let mut g = FIRST_HELD.take().expect("held");
        *g += 1;
        drop(g);
        assert_eq!(*FIRST.try_lock().unwrap(), 2);
        FIRST_HELD.release(); // nothing held: nothing happens
    }
}
