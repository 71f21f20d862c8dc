//! Allocator mode's side of the dump path. When oomshim is PyTorch's allocator
//! (src/ffi/torch_alloc.rs) it knows every free block, so dumps carry the exact free-block state
//! (`free_blocks.source = "oomshim-allocator"`) instead of "unavailable"; and an allocation it
//! cannot serve is final (the cache was already emptied and the request retried), so its dump is
//! written at once, on the failing thread, and its path goes into the exception the program sees.

use super::assemble;
use super::oom::{self, OomEvent};
use crate::dump::model::FreeBlocks;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Asked for the free-block state of a device when a dump is assembled.
pub type FreeBlocksSource = fn(i32) -> Option<FreeBlocks>;

static SOURCE: OnceLock<FreeBlocksSource> = OnceLock::new();

/// Registers the allocator as the source of free-block state (once; later calls are ignored).
pub fn set_free_blocks_source(source: FreeBlocksSource) {
    let _ = SOURCE.set(source);
}

/// The allocator's free-block state of `device`, when allocator mode is on.
pub(crate) fn free_blocks(device: Option<i32>) -> Option<FreeBlocks> {
    let source = SOURCE.get()?;
    source(device.unwrap_or(0))
}

/// The last allocator-mode dump per device: failures within `OOMSHIM_MIN_INTERVAL` of it (a
/// program that catches the error and retries smaller, say) name that dump instead of writing
/// one each.
struct LastDump {
    device: i32,
    at: Instant,
    path: Option<PathBuf>,
}

static LAST: Mutex<Vec<LastDump>> = Mutex::new(Vec::new());

/// What became of an allocator-mode out-of-memory failure.
#[derive(Default)]
pub struct AllocatorOom {
    /// The dump that explains it (written now, or the burst's earlier one); None when none
    /// could be written.
    pub path: Option<PathBuf>,
    /// The verdict's kind and summary, when a dump was assembled now.
    pub verdict: Option<(String, String)>,
}

/// An allocation the allocator could not serve, even after emptying its cache: records the
/// failure and writes its dump on this thread.
pub fn oom_now(event: OomEvent) -> AllocatorOom {
    let Some(s) = super::shim() else {
        return AllocatorOom::default();
    };
    s.oom_failures.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    {
        let last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = last.iter().find(|l| l.device == event.device) {
            if now.duration_since(l.at) < s.config.min_interval {
                return AllocatorOom {
                    path: l.path.clone(),
                    verdict: None,
                };
            }
        }
    }
    if !super::room_for_dump(s) {
        return AllocatorOom::default();
    }
    let capture = oom::failure_capture(s, &event, s.capture_stacks());
    // The failure is final (torch's retry already happened inside the allocator): the burst
    // is one failure that stood.
    let burst = assemble::BurstInfo {
        failures: 1,
        recovered: Some(false),
        last: oom::last_failure(s, &event, capture.time),
    };
    let dump = assemble::assemble(s, "oom", &capture, Some(burst));
    let written = oom::write(s, &dump);
    oom::print_summary(&dump, &written);
    let path = written.ok().map(|w| w.path);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    last.retain(|l| l.device != event.device);
    last.push(LastDump {
        device: event.device,
        at: now,
        path: path.clone(),
    });
    AllocatorOom {
        path,
        verdict: Some((dump.verdict.kind.clone(), dump.verdict.summary.clone())),
    }
}
