//! torch's memory history (`torch.cuda.memory._record_memory_history`) kept by the allocator
//! itself, so that `_snapshot()` in allocator mode carries `device_traces` and the frames of each
//! block as torch's own allocator does (c10/cuda/CUDACachingAllocator.cpp, `record_trace`).
//!
//! - Each device keeps its own trace, a ring of at most `max_entries` entries, inside its state
//!   and under its lock, as torch keeps `alloc_buffer`: events of one device are in the order
//!   the allocator made them. While history is off the device has no trace at all (`None`):
//!   the hot path pays one test of that field, and the allocator one relaxed load
//!   ([`super::CachingAllocator::history_context`]) that tells the caller whether to gather a
//!   stack.
//! - Actions and sizes are torch's: `alloc` (the requested size), `free_requested` and
//!   `free_completed` (the requested size; completed later for a block waiting for
//!   `record_stream` events), `segment_alloc` and `segment_free` (the segment's size), `oom`
//!   (the rounded request, and the device's free bytes in place of an address), `snapshot` (the
//!   bytes of active blocks when a snapshot was taken, which torch 2.11 records too).
//! - A context is an opaque stack id of the caller's (0: none). Like torch, a block keeps the
//!   context it was allocated with (its frames in a snapshot), a segment the context of the
//!   allocation that made it, a trace entry its context only when the context level is `alloc`
//!   or `all`, and a free without a context of its own carries its block's.

use std::collections::VecDeque;

/// What a trace entry records (torch's `TraceEntry::Action`, without the expandable-segment
/// map/unmap actions, which this allocator never takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    Oom,
    /// A snapshot was taken (torch records one per `_snapshot()`, after reading the trace): the
    /// bytes of the device's active blocks, no address.
    Snapshot,
}

impl TraceAction {
    /// The action's name in torch's snapshot.
    pub fn torch_name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
        }
    }
}

/// When stacks are kept (torch's `context` option: `None`, "state", "alloc", "all").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RecordContext {
    /// No stacks.
    Never,
    /// Live blocks keep the stack of their allocation.
    State,
    /// And trace entries of allocations carry it.
    Alloc,
    /// And frees carry the stack of the free.
    All,
}

impl RecordContext {
    /// From the level number of the C entry point: 0 never, 1 state, 2 alloc, 3 all.
    pub fn from_level(level: i32) -> Option<RecordContext> {
        Some(match level {
            0 => RecordContext::Never,
            1 => RecordContext::State,
            2 => RecordContext::Alloc,
            3 => RecordContext::All,
            _ => return None,
        })
    }
}

/// History settings while it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryConfig {
    pub context: RecordContext,
    /// Trace entries kept per device, the newest (torch keeps at least 1).
    pub max_entries: usize,
}

/// One event of a device's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: TraceAction,
    /// The block's or segment's address; for `Oom`, the device's free bytes (torch's
    /// `device_free`).
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// The caller's stack id; 0 when none was kept.
    pub context: u32,
}

/// A device's trace while history is on.
#[derive(Debug)]
pub(crate) struct Trace {
    config: HistoryConfig,
    entries: VecDeque<TraceEntry>,
}

impl Trace {
    pub(crate) fn new(config: HistoryConfig) -> Self {
        Trace {
            config: HistoryConfig {
                max_entries: config.max_entries.max(1),
                ..config
            },
            entries: VecDeque::new(),
        }
    }

    /// New settings, keeping the entries (the newest that fit).
    pub(crate) fn reconfigure(&mut self, config: HistoryConfig) {
        self.config = HistoryConfig {
            max_entries: config.max_entries.max(1),
            ..config
        };
        while self.entries.len() > self.config.max_entries {
            self.entries.pop_front();
        }
    }

    pub(crate) fn record(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u64,
        context: u32,
    ) {
        if self.entries.len() >= self.config.max_entries {
            self.entries.pop_front();
        }
        let context = if self.config.context >= RecordContext::Alloc {
            context
        } else {
            0
        };
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: now_us(),
            context,
        });
    }

    /// The context a free's entries carry: the free's own stack at level `all` (when the caller
    /// gathered one), else the block's, as torch's `context ? context : context_when_allocated`.
    pub(crate) fn free_context(&self, free: u32, block: u32) -> u32 {
        if free != 0 && self.config.context == RecordContext::All {
            free
        } else {
            block
        }
    }

    pub(crate) fn entries(&self) -> Vec<TraceEntry> {
        self.entries.iter().copied().collect()
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
