//! The shim's `fork` handlers, registered once at start ([`register`]). The forking thread
//! holds every lock of the shim's across `fork` (see `oomshim_host::sys::fork`), taken in this
//! order:
//!
//! 1. the growth tracker's step detector, then 2. its histories (`growth`: a sample holds the
//!    histories while it reads the Python code table and the stack tables' shards);
//! 3. the VMM state (`vmm`);
//! 4. the thread-name cache, then 5. the device-name cache (`context`);
//! 6. the Python code table (`oomshim_host::pystack`);
//! 7. the unwinder's module snapshot, with this thread marked busy meanwhile
//!    (`oomshim_host::stacks`);
//! 8. the OOM tracker's state (`oom`);
//! 9. the native stack table's shards, 10. the Python stack table's shards, then 11. the
//!    ledger's shards;
//!
//! and let go of in the reverse order, in the parent and in the child. No path of the shim's
//! holds one of these while it waits for another, so every holder finishes and lets go; and
//! since two forking threads take them in this same order, neither can hold a lock the other
//! has taken first. The child starts afresh where a lock guarded what only the parent's other
//! threads knew: the OOM tracker forgets the parent's requests, and this (the child's only)
//! thread's cached id, which is the parent thread's, is read again.

use std::panic::catch_unwind;
use std::sync::{MutexGuard, OnceLock};

/// The shim's own locks (1, 2 and 8 to 11), as the shim takes and lets go of them: it knows its
/// state, these handlers only the order. Each does nothing before the shim's state exists.
pub struct StateLocks {
    /// Whether the shim's state exists (it may come into being on any thread at any time).
    pub started: fn() -> bool,
    /// Locks 1 and 2, and letting go of them.
    pub hold_growth: fn(),
    pub release_growth: fn(),
    /// Locks 8 to 11, and letting go of them (in the child: with what only the parent's other
    /// threads knew forgotten).
    pub hold_state: fn(),
    pub release_state: fn(bool),
}

static STATE_LOCKS: OnceLock<StateLocks> = OnceLock::new();

/// Registers the handlers below (once per process; later calls do nothing).
pub(crate) fn register(locks: StateLocks) {
    let _ = STATE_LOCKS.set(locks);
    oomshim_host::sys::register_fork_handlers(prepare, parent, child);
}

fn prepare() {
    if let Some(l) = STATE_LOCKS.get() {
        (l.hold_growth)();
    }
    // A panic in the leaves' part still lets the shim's state be locked.
    let _ = catch_unwind(hold_leaf_locks);
    hold_state_locks();
}

fn parent() {
    release_state_locks(false);
    let _ = catch_unwind(release_leaf_locks);
    release_growth_locks();
}

fn child() {
    release_state_locks(true);
    let _ = catch_unwind(|| {
        let _ = crate::state::TID.try_with(|t| t.set(0));
        release_leaf_locks();
    });
    release_growth_locks();
}

/// Locks 1 and 2. Only what this thread's `prepare` took is let go (the state may have come into
/// being meanwhile), so no note of holding them is needed.
fn release_growth_locks() {
    if let Some(l) = STATE_LOCKS.get() {
        (l.release_growth)();
    }
}

oomshim_host::fork_held! {
    static THREAD_NAMES_HELD: MutexGuard<'static, Vec<(u64, String)>>;
}

/// Locks 3 to 7, which live outside the shim's state.
fn hold_leaf_locks() {
    crate::record::vmm::fork_prepare();
    THREAD_NAMES_HELD.hold(
        crate::state::THREAD_NAMES
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    crate::cuda::context::fork_prepare();
    oomshim_host::pystack::fork_prepare();
    oomshim_host::stacks::fork_prepare();
}

fn release_leaf_locks() {
    oomshim_host::stacks::fork_release();
    oomshim_host::pystack::fork_release();
    crate::cuda::context::fork_release();
    THREAD_NAMES_HELD.release();
    crate::record::vmm::fork_release();
}

std::thread_local! {
    /// Whether this thread's `prepare` took locks 8 to 11. The state may come into being on
    /// another thread between `prepare` and `parent`/`child`; its locks were never taken then,
    /// and forcing them open would unlock what nobody holds.
    static STATE_HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Locks 8 to 11, the shim's state (none before it exists).
fn hold_state_locks() {
    let Some(l) = STATE_LOCKS.get().filter(|l| (l.started)()) else {
        return;
    };
    if STATE_HELD.try_with(|h| h.set(true)).is_err() {
        return; // no note of holding them could be kept: take none
    }
    (l.hold_state)();
}

fn release_state_locks(child: bool) {
    if !STATE_HELD.try_with(|h| h.replace(false)).unwrap_or(false) {
        return;
    }
    if let Some(l) = STATE_LOCKS.get() {
        (l.release_state)(child);
    }
}
