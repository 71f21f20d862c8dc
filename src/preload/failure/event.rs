//! What reaches the out-of-memory path from outside (the hook's event, a framework's word) and
//! how a request ends ([`Resolution`]): the dump's assembly (`assemble`, `gather`) reads these
//! too, and depends on nothing else of the tracker.

use dump::model::{FrameworkOom, FreeBlocks};
use oomshim_host::ledger::Api;

/// What the hook saw when an allocation failed, and what only the failing thread could ask.
pub struct OomEvent {
    pub api: Api,
    pub bytes: u64,
    pub device: i32,
    pub error_code: i32,
    pub stream: usize,
    /// The device's answers (free/total, name, pools, …), gathered on the failing thread right
    /// after the failure; they travel with the request to its dump.
    pub context: crate::cuda::context::FailureContext,
}

/// How a request's outcome became known (the dump's `failed_request.resolution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    RetrySucceeded,
    FrameworkRaised,
    NextRequestFailed,
    SettleExpired,
    ProcessExit,
    Allocator,
    /// Written before anything was known (`OOMSHIM_SETTLE=0`, or a provisional dump).
    Unknown,
}

impl Resolution {
    pub fn word(self) -> &'static str {
        match self {
            Resolution::RetrySucceeded => "retry_succeeded",
            Resolution::FrameworkRaised => "framework_raised",
            Resolution::NextRequestFailed => "next_request_failed",
            Resolution::SettleExpired => "settle_expired",
            Resolution::ProcessExit => "process_exit",
            Resolution::Allocator => "allocator",
            Resolution::Unknown => "unknown",
        }
    }

    /// The dump's `recovered`.
    pub fn recovered(self) -> Option<bool> {
        match self {
            Resolution::RetrySucceeded => Some(true),
            Resolution::Unknown => None,
            _ => Some(false),
        }
    }
}

/// What a framework told the shim about an out-of-memory failure it raised (through the Python
/// hook): its account for the dump and its cache's free blocks.
#[derive(Debug, Clone, Default)]
pub struct FrameworkNote {
    pub device: i32,
    pub account: FrameworkOom,
    pub free_blocks: Option<FreeBlocks>,
    /// The per-process cap torch enforced (`set_per_process_memory_fraction`), if any.
    pub memory_cap: Option<dump::model::MemoryCap>,
}
