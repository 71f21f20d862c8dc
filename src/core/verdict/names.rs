//! The kinds of finding, by the names a dump carries in `verdict.kind` and `findings[].kind`:
//! the out-of-memory kinds (ranked in `mod.rs`), the snapshot's, and the post-mortem kinds.
//! Every file of the verdict names a kind through here.

pub const REQUEST_EXCEEDS_DEVICE: &str = "request_exceeds_device";
pub const FRAGMENTATION: &str = "fragmentation";
pub const FRAMEWORK_CACHE: &str = "framework_cache";
pub const OTHER_PROCESSES: &str = "other_processes";
pub const UNTRACKED_MEMORY: &str = "untracked_memory";
pub const OWN_ALLOCATIONS: &str = "own_allocations";
pub const LEAK: &str = "leak";
pub const HOST_MEMORY: &str = "host_memory";
pub const SNAPSHOT: &str = "snapshot";

/// Killed by the kernel's OOM killer: SIGKILL while the cgroup's `memory.events` counted a new
/// `oom_kill`. Host memory, not device memory, ran out.
pub const HOST_OOM_KILL: &str = "host_oom_kill";
/// Ended by a signal other than the OOM killer's: SIGKILL or SIGTERM from outside (a scheduler
/// over its limit, `timeout`, a person), or a crash (SIGSEGV, SIGABRT, SIGBUS).
pub const KILLED_BY_SIGNAL: &str = "killed_by_signal";
/// Exited non-zero right after a failed device allocation whose dump was never written.
pub const EXITED_AFTER_FAILURE: &str = "exited_after_failure";
