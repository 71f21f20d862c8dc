//! The tracker of failed requests: its state under one lock, what a failure comes to for its
//! caller ([`Handled`]) and how its dump is to be written ([`Mode`]). `mod.rs` takes a failure
//! through it; `writer.rs` writes what it queued.

use super::event::Resolution;
use super::requests::State;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The least a failure waits for the word of an attached framework hook.
pub(super) const HOOKED_SETTLE: Duration = Duration::from_secs(30);
/// How long the framework's thread waits for the dump its word completes.
pub(super) const FRAMEWORK_WAIT: Duration = Duration::from_secs(30);

pub(crate) struct OomTracker {
    /// Requests not yet resolved: read on every allocation, so the lock is taken only when set.
    pub(super) open: AtomicU32,
    /// A framework hook (torch's OOM observer) is attached in this process.
    pub(super) hooked: AtomicBool,
    pub(super) state: Mutex<State>,
    pub(super) changed: Condvar,
}

/// The outcome of an allocation failure for its caller.
pub(crate) enum Handled {
    /// Dump queued for the writer thread.
    Queued,
    /// A retry of an open request.
    Retry,
    /// Written on this thread (allocator mode, `OOMSHIM_SETTLE=0`, a framework's own failure).
    Written {
        path: Option<PathBuf>,
        verdict: (String, String),
    },
    /// A repeat of an earlier dumped failure: its dump.
    Repeat(Option<PathBuf>),
    /// A framework's word about a failure already dumped (or being dumped): the dump, and
    /// whether the word made it into the dump.
    Explained {
        path: Option<PathBuf>,
        included: bool,
    },
    /// Over `OOMSHIM_MAX_DUMPS` (or no room for a dump): no dump.
    NoDump,
}

/// How the failing path wants the dump written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Preload: by the writer thread once the outcome is known.
    Settle,
    /// Now, on this thread, with this resolution.
    Now(Resolution),
}

impl OomTracker {
    pub(crate) fn new() -> Self {
        OomTracker {
            open: AtomicU32::new(0),
            hooked: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A framework hook (torch's OOM observer) is attached: failures wait for its word.
    pub(crate) fn set_hooked(&self) {
        self.hooked.store(true, Ordering::Relaxed);
    }
}

oomshim_host::fork_held! {
    /// The OOM tracker's lock, held by the forking thread across `fork` (see `crate::fork`).
    static FORK_HELD: MutexGuard<'static, State>;
}

impl OomTracker {
    /// `fork` prepare handler: takes the tracker's lock (the ledger's and the stack tables' are
    /// taken after it, see `super::fork`).
    pub(crate) fn hold_for_fork(&'static self) {
        FORK_HELD.hold(self.lock());
    }

    /// `fork` parent and child handler: lets go of it; in the child, with the parent's requests
    /// forgotten.
    pub(crate) fn release_after_fork(&self, child: bool) {
        let Some(mut state) = FORK_HELD.take() else {
            return;
        };
        if child {
            // The child has no writer thread and none of the parent's requests: start afresh. The
            // parent's are leaked, not dropped (they may hold what a vanished thread was using).
            std::mem::forget(std::mem::take(&mut *state));
            self.open.store(0, Ordering::Relaxed);
        }
        drop(state);
    }
}
