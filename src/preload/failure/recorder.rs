//! What the out-of-memory path reads of the recording shim, and nothing more. The shim
//! (`crate::shim`) implements [`Recorder`] and hands itself over with each failure and each
//! on-demand dump; the path never names the shim, and reads growth only through it.

use crate::record::growth::{Frozen, StackPair};
use dump::model::{Frame, Growth, RequestSizes};
use oomshim_core::config::Config;
use oomshim_host::ledger::{Snapshot, StackId};

/// The shim's recorded state as a failure's capture, assembly and writing read it.
pub trait Recorder: Sync {
    /// The settings read at start.
    fn config(&self) -> &Config;
    /// The ledger's live allocations now, its largest `OOMSHIM_TOP` sites in full.
    fn snapshot(&self) -> Snapshot;
    /// Nanoseconds since the shim started (its coarse clock).
    fn now_ns(&self) -> u64;
    /// The bytes the ledger holds live on `device`.
    fn device_bytes(&self, device: i32) -> u64;
    /// Live allocations now (what a dump's size grows with).
    fn live_count(&self) -> u64;
    /// Device out-of-memory failures recorded so far.
    fn oom_failures(&self) -> u64;
    /// The growth history as it is now, copied for a failure's dump.
    fn frozen_growth(&self) -> Option<Frozen>;
    /// The growth for a dump assembled now, its sites named by `name`.
    fn growth_now(
        &self,
        free_bytes: Option<u64>,
        name: &mut dyn FnMut(&[StackPair]) -> Vec<Vec<Frame>>,
    ) -> Option<Growth>;
    /// The request-size summary for a dump.
    fn request_sizes(&self) -> Option<RequestSizes>;
    /// The frames of an interned native stack.
    fn native_frames(&self, id: StackId) -> Vec<usize>;
    /// The packed `(code id, offset)` frames of an interned Python stack.
    fn python_frames(&self, id: StackId) -> Vec<usize>;
    /// A failure was seen: the process's exit will flush the dumps still settling and leave the
    /// job its answer (registered once; later calls do nothing).
    fn watch_exit(&self);
}
