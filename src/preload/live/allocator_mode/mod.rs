//! Allocator mode: the caching allocator torch calls through its pluggable-allocator entry points
//! (src/preload/ffi/torch_alloc.rs, which keeps only the C side: argument conversion, the panic
//! boundary, the observer call and the C++ exception) and its side of the dump path: the
//! allocator and what each call does with it ([`allocator`]), the CUDA runtime it gets its
//! memory from, as functions the hooks pass in ([`source`]), its configuration ([`config`]), the
//! graph captures it allocated for ([`captures`]), its free blocks as a dump shows them
//! ([`free_blocks`]) and what a failure tells the program ([`message`]).
//!
//! When oomshim is PyTorch's allocator it knows every free block, so dumps carry the exact free-block state
//! (`free_blocks.source = "oomshim-allocator"`) instead of "unavailable"; and an allocation it
//! cannot serve is final (the cache was already emptied and the request retried), so its dump is
//! written at once, on the failing thread, and its path goes into the exception the program sees.
//!
//! The hooks gather the allocator's state themselves, into the [`FailureContext`] of the failure
//! or dump they report. The dumps no hook takes (the shim's own signal, interval, exit and
//! live-summary threads, a framework's word) read it here ([`free_blocks`](fn@free_blocks)):
//! asked when such a dump's context is gathered, never while a dump is assembled.
//!
//! [`FailureContext`]: super::FailureContext

mod allocator;
mod captures;
mod config;
mod free_blocks;
mod message;
mod source;

pub use allocator::{
    alloc, allocator, free, free_blocks_if_active, free_blocks_json, history_json,
    memory_stats_json, out_of_memory, pass_through_alloc, pass_through_free, record_history,
    segments_json, set_memory_fraction, Failure,
};
pub use message::{c_message, judged_mem_info, MESSAGE_BYTES};
pub use source::{mem_info_on, Call, CudaRuntime};

use super::oom::{self, FrameworkNote, OomEvent};
use dump::model::FreeBlocks;
use std::cell::RefCell;
use std::path::PathBuf;

/// What an allocator-mode failure on `device` knows, gathered on the failing thread: free/total
/// as asked for the exception's message, the allocator's exact free blocks, and what the process
/// learnt before (the UUID, the CUDA versions); the allocator asks CUDA nothing more.
pub fn failure_context(
    device: i32,
    mem_info: Option<(u64, u64)>,
    free_blocks: Option<FreeBlocks>,
) -> super::FailureContext {
    super::FailureContext {
        free_blocks,
        ..super::FailureContext::learnt_before(Some(device), mem_info)
    }
}

/// The allocator's free-block state of `device` (device 0 when none), when allocator mode is on.
pub(crate) fn free_blocks(device: Option<i32>) -> Option<FreeBlocks> {
    free_blocks_if_active(device.unwrap_or(0))
}

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

/// What became of an allocator-mode out-of-memory failure.
#[derive(Default)]
pub struct AllocatorOom {
    /// The dump that explains it (written now, or an earlier one of the same failure); None when
    /// none could be written.
    pub path: Option<PathBuf>,
    /// The verdict's kind and summary, when a dump was assembled now.
    pub verdict: Option<(String, String)>,
}

/// An allocation the allocator could not serve, even after emptying its cache: records the
/// failure and writes its dump on this thread (the OOM path shared with preload, src/preload/live/oom/),
/// from the context the allocator gathered into `event`, with the framework's word from its
/// observers ([`observe`]) when there is one.
pub fn oom_now(event: OomEvent, framework: Option<FrameworkNote>) -> AllocatorOom {
    // Pass-through (switched off by the program, or after a failure of the shim's own) writes
    // no dump, as under preload: the allocator still raises its error with torch's words.
    if !super::records_failures() {
        return AllocatorOom::default();
    }
    let Some(s) = super::shim() else {
        return AllocatorOom::default();
    };
    s.count_oom_failure();
    // As under preload (`record_oom`): the live region shows the failure before its dump is done.
    crate::publish::note_failure(
        event.device,
        event.bytes,
        event.api.name(),
        event.context.mem_info,
    );
    match s.oom_failure(event, oom::Mode::Now(oom::Resolution::Allocator), framework) {
        oom::Handled::Written { path, verdict } => AllocatorOom {
            path,
            verdict: Some(verdict),
        },
        oom::Handled::Repeat(path) => AllocatorOom {
            path,
            verdict: None,
        },
        _ => AllocatorOom::default(),
    }
}
