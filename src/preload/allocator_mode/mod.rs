//! Allocator mode: the caching allocator torch calls through its pluggable-allocator entry points
//! (src/preload/ffi/torch_alloc.rs, which keeps only the C side: argument conversion, the panic
//! boundary, the observer call and the C++ exception) and its side of the dump path: the
//! allocator and what each call does with it ([`allocator`]), the CUDA runtime it gets its
//! memory from (the trait in [`source`], the real functions in [`runtime`]), its configuration ([`config`]), the
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

mod allocator;
mod captures;
mod config;
mod free_blocks;
pub mod history;
pub mod host;
mod message;
mod observe;
pub mod runtime;
mod source;

pub(crate) use allocator::free_blocks;
pub use allocator::{
    alloc, allocator, free, free_blocks_if_active, free_blocks_json, history_json,
    memory_stats_json, out_of_memory, pass_through_alloc, pass_through_free, record_history,
    segments_json, set_memory_fraction, Failure,
};
pub use host::AllocatorOom;
pub use message::{c_message, judged_mem_info, MESSAGE_BYTES};
pub(crate) use observe::hold;
pub use observe::observe;
pub use source::{mem_info_on, Call, CudaRuntime};
