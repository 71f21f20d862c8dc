//! What the rules found, as data: each rule's outcome complete with the numbers and the choices
//! its sentences need, so that `words/` only formats. The rule files build these; the words read
//! them and call no rule.

use super::sites::Line;
use dump::model::{
    Attribution, DetectedSteps, Growth, GrowthFit, GrowthPoint, GrowthSite, Kinds, Site, Timeline,
};

/// The framework the program uses, so that advice speaks its terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framework {
    Torch,
    Jax,
    Cupy,
    /// Python without a known framework.
    Python,
    /// C, C++ or any program without Python.
    Native,
}

/// The rules' readings of the whole dump that the words of several findings use, made once per
/// verdict.
pub(super) struct Readings<'a> {
    pub(super) framework: Framework,
    /// The process's fitted growth: the dump's own, or fitted from its samples.
    pub(super) growth_fit: Option<GrowthFit>,
    /// Many distinct large request sizes: dynamic shapes.
    pub(super) dynamic_shapes: Option<DynamicShapes>,
    /// `PYTORCH_CUDA_ALLOC_CONF` already enables expandable segments.
    pub(super) expandable_segments: bool,
    /// Steady growth per step that is no leak: the same allocations, larger each step.
    pub(super) growing_shapes: Option<GrowingShapes<'a>>,
    /// Host memory is low.
    pub(super) host_low: Option<HostPressure>,
    /// Torch's live memory by kind at the failure, when the Python hook counted it.
    pub(super) kinds: Option<&'a Kinds>,
    /// Tracked bytes of every device at the capture.
    pub(super) tracked_all: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF` in the dump's configuration snapshot.
    pub(super) alloc_conf: Option<&'a str>,
    /// Steady growth over time that the allocation timeline judges no leak, and why.
    pub(super) not_a_leak: Option<OverTime<'a>>,
}

/// The largest site, its line and how to name it.
pub(super) struct TopSite<'a> {
    pub(super) site: &'a Site,
    /// Its line; `None` when no frame of its stack has a name.
    pub(super) line: Option<Line<'a>>,
    pub(super) label: String,
}

/// Many distinct large request sizes in the recent history.
pub(super) struct DynamicShapes {
    /// Distinct sizes among the large requests.
    pub(super) distinct: u64,
    /// Large requests.
    pub(super) large: u64,
    /// Requests the history looked at.
    pub(super) window: u64,
    /// From which size a request is large.
    pub(super) large_bytes: u64,
}

/// Steady growth per step that is no leak: as many allocations live at the end as at the
/// start, larger each step (inputs of growing shape); or, with `live`, the framework's cache
/// growing for larger steps while its live tensors do not.
pub(super) struct GrowingShapes<'a> {
    pub(super) fit: GrowthFit,
    /// How the steps were found (`growth.steps`).
    pub(super) steps: Option<&'a str>,
    /// The framework's live tensors at the first and last step of `fit` (a fit of the tracked
    /// bytes, which grew without them), when the growth is its cache's.
    pub(super) live: Option<(GrowthPoint, GrowthPoint)>,
}

/// Why host memory counts as low: the host's available memory, or the cgroup's usage.
pub(super) enum HostPressure {
    /// `MemAvailable` below the low share of `MemTotal`.
    Available { available: u64, total: u64 },
    /// The cgroup at the high share of its limit or more.
    Cgroup { usage: u64, limit: u64 },
}

/// What growth over time from the allocation timeline comes to, when it is not a leak.
#[derive(Debug, Clone)]
pub enum NotALeak {
    /// Growing steadily, but in a program that began allocating less than `min_span_ms` ago
    /// (`too_recent`), or over fewer than `min_allocations` allocations: too little to call it
    /// a leak.
    Young {
        too_recent: bool,
        min_span_ms: u64,
        min_allocations: u64,
    },
    /// The growing site is inside a function that loads a model (`function`, from its stack),
    /// or the framework counts the growth as the model's parameters.
    Loading { function: String },
    /// It grew, then its sites stopped allocating `quiet_ms` before the dump.
    Stopped { quiet_ms: u64 },
    /// The tracked bytes did not grow as the live allocations suggest: what was allocated was
    /// freed as fast.
    NotKept,
}

/// Steady growth over time that is judged no leak, and why, with the numbers the words need.
pub struct OverTime<'a> {
    pub growth: &'a Growth,
    pub fit: GrowthFit,
    pub timeline: &'a Timeline,
    /// The growing site with the largest share, when one carries the named share.
    pub top: Option<&'a GrowthSite>,
    pub why: NotALeak,
}

/// The process's growth per step (or per second), when it is a leak.
pub(super) struct LeakFinding<'a> {
    pub(super) growth: &'a Growth,
    pub(super) fit: GrowthFit,
    /// Its largest parts, largest first, each with its share (0–1).
    pub(super) sites: Vec<(&'a GrowthSite, f64)>,
    /// The largest part, when it carries enough of the growth to be named as *the* leak.
    pub(super) named: Option<(&'a GrowthSite, f64)>,
    /// Set when the steps were detected, not marked.
    pub(super) detected: Option<DetectedSteps>,
    /// Bytes grown from the first fitted sample to the failure.
    pub(super) grown: u64,
    /// Judged over time (`growth.unit` `second`): the program marks no steps and repeats no
    /// pattern; rates are per second.
    pub(super) over_time: bool,
    /// How the growth over time was measured, when from the allocation timeline.
    pub(super) timeline: Option<&'a Timeline>,
    /// Torch's records of where the tensors allocated since the growth began were allocated.
    pub(super) records: Option<Recorded<'a>>,
}

/// Torch's records of the growth, and whether they name the leak.
pub(super) struct Recorded<'a> {
    pub(super) attribution: &'a Attribution,
    /// The top line's share of the recorded bytes (0–1).
    pub(super) share: f64,
    /// The records name the leak (their top line), not the shim's top site.
    pub(super) names_it: bool,
    /// No line of the records holds enough of what they recorded to be named: the growth is
    /// spread over lines.
    pub(super) spread: bool,
}

/// A line that holds at least the request by itself, its sites summed.
pub(super) struct NextHolder<'a> {
    pub(super) line: Line<'a>,
    pub(super) bytes: u64,
    pub(super) count: u64,
}

/// What the residual account of this process's own allocations names besides the numbers.
pub(super) struct OwnAllocations<'a> {
    /// The line of the failing call, when the finding names it.
    pub(super) failing_line: Option<Line<'a>>,
    /// That line is torch's own Python code (a thread of the framework's), not the program's.
    pub(super) failing_inside_framework: bool,
    /// The line holding the most after the largest holder and the failing line, when it alone
    /// holds the request.
    pub(super) next_holder: Option<NextHolder<'a>>,
    /// Any line but the failing one (the largest holder included) that alone holds the request.
    pub(super) room: Option<NextHolder<'a>>,
    /// XLA refused the request inside its own pool (the framework's word).
    pub(super) xla_refused: bool,
    /// A JAX program's pool: oomshim sees the pool, not the arrays in it.
    pub(super) xla_pool: bool,
    /// A torch program whose free blocks no source shows, without expandable segments:
    /// fragmentation cannot be seen, only hinted at.
    pub(super) fragmentation_unseen: bool,
}

/// How the program ended, as the kinds tell it apart.
pub(super) enum Death {
    /// SIGKILL while its cgroup counted a new OOM kill: the kernel's OOM killer.
    OomKilled,
    /// Any other signal.
    Signalled(i32),
    /// No signal: it exited.
    Exited,
    /// Neither a signal nor an exit status: it ended without exiting on purpose (its region was
    /// left behind) and its own parent reaped it first (the signal unknown).
    Unseen,
}

/// How a program died that left no dump of its own, with what its words quote.
pub(super) struct Ended {
    pub(super) death: Death,
    /// Whether the cgroup counted a new OOM kill while the program ran; `None` when its
    /// `memory.events` was not read both at the start and after the death.
    pub(super) oom_kill_counted: Option<bool>,
    /// Host memory's growth from the RSS samples: (bytes per unit, unit word).
    pub(super) host_growth: Option<(u64, &'static str)>,
}

/// What a dump without a failed request holds.
pub(super) struct Held<'a> {
    /// Tracked bytes and allocations over every device.
    pub(super) tracked: u64,
    pub(super) count: u64,
    /// Devices holding tracked memory.
    pub(super) holding: usize,
    pub(super) top: Option<TopSite<'a>>,
}

/// Whether running the same job again can succeed ([`Retry::hint`]: one of `retry.rs`'s
/// constants), and why (`W`: [`OomRetryWhy`] or [`DeathRetryWhy`]).
pub(super) struct Retry<W> {
    pub(super) hint: &'static str,
    pub(super) why: W,
}

/// Why an out-of-memory dump's retry hint is what it is, with the numbers its reason quotes.
pub(super) enum OomRetryWhy {
    /// Other processes hold the device; this process's own memory (`own`) and the request fit
    /// the device's `total` alone.
    FitsAlone { own: u64, total: u64 },
    /// Other processes are the top finding, but this process's own memory and the request
    /// exceed the device's `total` even alone.
    ExceedsAlone { own: u64, total: u64 },
    /// The top finding's kind decides (empty: no finding).
    Top(String),
}

/// Why a post-mortem dump's retry hint is what it is: how the program died.
pub(super) enum DeathRetryWhy {
    /// The kernel's OOM killer ended the program at its cgroup's memory limit (`max`).
    AtCgroupLimit { max: u64 },
    /// The OOM killer ended it while its host memory grew `rate` per `unit`.
    HostGrowing { rate: u64, unit: &'static str },
    /// The OOM killer ended it, its cgroup without a limit of its own.
    OomKilledUnlimited,
    /// Its last device allocation had failed, and that failure's verdict (`kind`) gave the
    /// hint.
    LastFailure { kind: Option<String> },
    /// It exited after a failed allocation whose dump was never written.
    ExitedAfterFailure,
    /// Killed from outside, or crashed.
    Killed,
}
