//! The dump schema `oomshim.dump/1`: the one definition shared by the shim that writes dumps and
//! every reader (reports, tests). Key names are the public contract; new keys may be added.

use serde::{Deserialize, Serialize};

/// Value of the `schema` key; readers reject anything else.
pub const SCHEMA: &str = "oomshim.dump/1";

/// One dump file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// `"oom"` for an out-of-memory failure, otherwise the reason given to an on-demand dump.
    pub reason: String,
    /// When the state was captured, RFC 3339 in UTC (`2026-11-29T15:43:11.123Z`).
    pub time: String,
    /// The same instant as milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    pub process: ProcessInfo,
    /// The allocation that failed; present for `reason == "oom"` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_request: Option<FailedRequest>,
    /// Every device the process touched, plus the failing one.
    pub devices: Vec<DeviceInfo>,
    /// Page-locked host memory from cudaMallocHost/cudaHostAlloc. Never counted as device memory.
    pub pinned_host: PinnedHost,
    /// Live allocations, largest first, at most `OOMSHIM_TOP` of them.
    pub largest_holders: Vec<Holder>,
    /// Live bytes aggregated by identical allocation stack, largest first.
    pub sites: Vec<Site>,
    pub free_blocks: FreeBlocks,
    pub verdict: Verdict,
    /// Counters about the recording itself.
    pub recording: Recording,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub host: String,
    /// argv as the process received it (from /proc/self/cmdline), unmodified.
    pub command_line: Vec<String>,
    /// `RANK`, `LOCAL_RANK`, `WORLD_SIZE` from the environment, when set (torchrun sets them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRequest {
    /// Bytes as the caller asked for them (before any rounding by CUDA).
    pub bytes: u64,
    /// The hooked function that failed, e.g. `cudaMalloc`.
    pub api: String,
    pub device: i32,
    /// The error code the runtime returned (2 = cudaErrorMemoryAllocation).
    pub error_code: i32,
    /// Allocation stack of the failing call, innermost frame first.
    pub stack: Vec<Frame>,
    /// Failures on this device inside the de-duplication interval that began with this one
    /// (1 = only this one). Frameworks free their caches and retry, so bursts are normal.
    pub failures_in_burst: u32,
    /// `Some(true)`: a later request of at least `bytes` on this device succeeded within the
    /// settle window (the framework's retry worked; the program did not see this failure).
    /// `Some(false)`: none did. `None`: the dump was written before that was known.
    pub recovered: Option<bool>,
    /// State at the last failure of the burst (after the framework freed what it could).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<LastFailure>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastFailure {
    pub bytes: u64,
    pub api: String,
    pub time_unix_ms: u64,
    pub tracked_bytes: u64,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub index: i32,
    #[serde(default)]
    pub name: Option<String>,
    /// From cudaMemGetInfo at capture time; null when it could not be asked safely.
    #[serde(default)]
    pub total_bytes: Option<u64>,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    /// Live device bytes in the ledger, as requested by callers.
    pub tracked_bytes: u64,
    pub tracked_count: u64,
    pub peak_tracked_bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PinnedHost {
    pub bytes: u64,
    pub count: u64,
    pub peak_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub bytes: u64,
    /// Hex, `0x7f...`.
    pub address: String,
    pub api: String,
    pub device: i32,
    /// Hex stream handle; null for APIs without a stream.
    #[serde(default)]
    pub stream: Option<String>,
    /// Kernel thread id of the allocating thread.
    pub thread: u64,
    /// Seconds between the allocation and the capture.
    pub age_s: f64,
    /// Allocation sequence number (1 = first tracked allocation of the process).
    pub seq: u64,
    pub stack: Vec<Frame>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Site {
    pub bytes: u64,
    pub count: u64,
    pub stack: Vec<Frame>,
}

/// One stack frame. Fields are null where the symboliser did not know them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Instruction address in the process, hex.
    pub address: String,
    #[serde(default)]
    pub function: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub line: Option<u32>,
    /// Path of the loaded object that holds the address.
    #[serde(default)]
    pub module: Option<String>,
    /// True for a frame inlined into the next one out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FreeBlocks {
    /// `"unavailable"` when the shim cannot see free blocks (under LD_PRELOAD the framework's
    /// cache hides them); later sources: `"oomshim-allocator"`, `"torch-snapshot"`.
    pub source: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub total_free_bytes: Option<u64>,
    #[serde(default)]
    pub largest_free_bytes: Option<u64>,
    /// 1 - largest_free / total_free.
    #[serde(default)]
    pub fragmentation: Option<f64>,
    #[serde(default)]
    pub histogram: Vec<HistogramBin>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistogramBin {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Machine-readable finding, e.g. `own_allocations`, `untracked_memory`.
    pub kind: String,
    /// One paragraph in plain words.
    pub summary: String,
    pub evidence: Vec<String>,
    pub suggestions: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    /// oomshim version that wrote the dump.
    pub version: String,
    /// `native` or `off`.
    pub stacks: String,
    pub depth: u32,
    /// Frees (and async frees) of pointers the ledger did not know: passed through, counted here.
    pub unknown_frees: u64,
    /// Live allocations in the ledger at capture time (all devices).
    pub live_allocations: u64,
    /// Allocations recorded since start.
    pub total_allocations: u64,
    /// Out-of-memory failures seen since start (all devices, including de-duplicated ones).
    pub oom_failures: u64,
}
