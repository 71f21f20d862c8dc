//! Allocator mode's side of the dump path. When oomshim is PyTorch's allocator
//! (src/preload/ffi/torch_alloc.rs) it knows every free block, so dumps carry the exact free-block state
//! (`free_blocks.source = "oomshim-allocator"`) instead of "unavailable"; and an allocation it
//! cannot serve is final (the cache was already emptied and the request retried), so its dump is
//! written at once, on the failing thread, and its path goes into the exception the program sees.
//!
//! The hooks gather the allocator's state themselves, into the [`FailureContext`] of the failure
//! or dump they report. The dumps no hook takes (the shim's own signal, interval, exit and
//! live-summary threads, a framework's word) are gathered here, where the allocator, which lives
//! with the hooks, can only be reached through the source it registered: asked when such a
//! dump's context is gathered, never while a dump is assembled.
//!
//! [`FailureContext`]: super::FailureContext

use super::oom::{self, OomEvent};
use dump::model::FreeBlocks;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

/// Asked for the free-block state of a device when a dump's context is gathered off the hooks.
pub type FreeBlocksSource = fn(i32) -> Option<FreeBlocks>;

static SOURCE: OnceLock<FreeBlocksSource> = OnceLock::new();

/// Registers the allocator as the source of free-block state (once; later calls are ignored).
pub fn set_free_blocks_source(source: FreeBlocksSource) {
    let _ = SOURCE.set(source);
}

/// The allocator's free-block state of `device` (device 0 when none), when allocator mode is on.
pub(crate) fn free_blocks(device: Option<i32>) -> Option<FreeBlocks> {
    let source = SOURCE.get()?;
    source(device.unwrap_or(0))
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
/// failure and writes its dump on this thread (the OOM path shared with preload, src/preload/live/oom.rs),
/// from the context the allocator gathered into `event`.
pub fn oom_now(event: OomEvent) -> AllocatorOom {
    let Some(s) = super::shim() else {
        return AllocatorOom::default();
    };
    s.oom_failures.fetch_add(1, Ordering::Relaxed);
    let stacks = s.capture_stacks();
    match s.oom.on_failure(
        s,
        event,
        stacks,
        super::thread_id(),
        oom::Mode::Now(oom::Resolution::Allocator),
    ) {
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
