//! The framework's out-of-memory observers, run for an allocator-mode failure before its dump
//! is written, and the word the framework gives from inside them (held for that dump).

use crate::failure::FrameworkNote;
use std::cell::RefCell;

thread_local! {
    /// Set while this thread runs the framework's out-of-memory observers for a failure of
    /// allocator mode: the framework's word about it, once given, is kept here for its dump.
    static OBSERVING: RefCell<Option<Option<FrameworkNote>>> = const { RefCell::new(None) };
}

/// Runs the framework's out-of-memory observers (`run`) for a failure on this thread, before its
/// dump is written, and returns the word the framework gave from inside them
/// ([`hold`]: oomshim's Python hook counts the memory by kind there), if any. Not re-entered: an
/// allocation that fails inside the observers gets its dump without them.
pub fn observe(run: impl FnOnce()) -> Option<FrameworkNote> {
    let entered = OBSERVING
        .try_with(|o| {
            let mut o = o.borrow_mut();
            if o.is_some() {
                return false;
            }
            *o = Some(None);
            true
        })
        .unwrap_or(false);
    if !entered {
        return None;
    }
    run();
    OBSERVING
        .try_with(|o| o.borrow_mut().take().flatten())
        .ok()
        .flatten()
}

/// The framework's word about an out-of-memory error (`oomshim_framework_oom`), given from
/// inside [`observe`] on this thread: kept for the dump written next, which it then joins, as
/// under preload the word joins the failure's dump. Its cache summary is left out: the
/// allocator's own free blocks are exact. Returns the note back when this thread observes no
/// failure (`None`: held).
pub(crate) fn hold(mut note: FrameworkNote) -> Option<FrameworkNote> {
    let held = OBSERVING
        .try_with(|o| match &mut *o.borrow_mut() {
            Some(slot) => {
                note.free_blocks = None;
                *slot = Some(std::mem::take(&mut note));
                true
            }
            None => false,
        })
        .unwrap_or(false);
    (!held).then_some(note)
}
