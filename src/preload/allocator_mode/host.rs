//! What allocator mode asks of the shim it runs in: recording the tensors it hands out, the
//! Python stacks torch's memory history keeps, and the out-of-memory path for a request it
//! cannot serve. The shim implements [`Host`] (`crate::shim::ALLOCATOR_HOST`) and the hooks
//! pass it with each call; allocator mode never names the shim.

use crate::failure::{FrameworkNote, OomEvent};
use oomshim_host::ledger::StackId;
use std::path::PathBuf;

/// The shim, as allocator mode sees it.
pub trait Host: Sync {
    /// A tensor of `bytes` at `addr` was handed out; native stacks only when `native_ok`.
    fn record_tensor(&self, addr: usize, bytes: u64, device: i32, stream: usize, native_ok: bool);
    /// The tensor at `addr` is freed.
    fn forget(&self, addr: usize);
    /// The calling thread's Python stack as a stack id (0: none, or no Python).
    fn python_stack(&self) -> u32;
    /// The packed frames of an interned Python stack; `None` when the shim is off.
    fn python_frames(&self, id: StackId) -> Option<Vec<usize>>;
    /// A request the allocator could not serve, even after emptying its cache: recorded, and its
    /// dump written on this thread with the framework's word from its observers, if any.
    fn out_of_memory(&self, event: OomEvent, framework: Option<FrameworkNote>) -> AllocatorOom;
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
