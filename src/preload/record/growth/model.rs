//! What growth is about: where step boundaries come from ([`StepSource`]), what a site is
//! ([`SiteKey`]), the framework's own count at a mark ([`FrameworkLive`]), and the bounds on what
//! is kept and reported.

use oomshim_host::ledger::StackId;

/// Sites whose history is kept per source (the most live bytes at each sample, plus those
/// already kept while they still hold more than the smallest newcomer); the rest count in the
/// process's total only.
pub const MAX_SITES: usize = 128;
/// Samples kept per site (and of the process's total).
pub const RING: usize = 64;
/// Width of a time bucket when no step is marked or detected.
pub const BUCKET_NS: u64 = 1_000_000_000;
/// Samples a marked history needs before its growth counts as steady for `Tracker::growing`:
/// more than a fit needs, so warm-up steps (optimizer state, caches filling) do not count.
pub const SUSPECT_MIN_SAMPLES: usize = 6;
/// Growing sites reported in a dump, largest growth first.
pub const MAX_REPORTED: usize = 10;
/// A sample walks every live allocation. At a detected step one is taken only when at least
/// (live allocations at the last sample − [`SAMPLE_FREE_LIVE`]) / this allocations happened
/// since, so samples cost at most this many ledger-entry visits per allocation on average
/// (beyond a walk of [`SAMPLE_FREE_LIVE`] entries per step), however short the steps.
pub const SAMPLE_MAX_VISITS_PER_ALLOC: u64 = 4;
/// Live allocations walked at every detected step regardless of the step's length: a walk of a
/// thousand entries takes microseconds, no more than one `cudaMalloc`.
pub const SAMPLE_FREE_LIVE: u64 = 1024;
/// The framework's own count of its live tensors at a mark (torch's `memory_stats()`, from the
/// Python hook): their bytes, and how many there are when it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameworkLive {
    pub bytes: u64,
    pub allocations: Option<u64>,
}

impl FrameworkLive {
    /// `allocations`: `u64::MAX` when the framework did not say. Zero allocations holding bytes
    /// is not a count either: torch's cudaMallocAsync backend reports bytes only, its counts
    /// stay 0.
    pub fn new(bytes: u64, allocations: u64) -> FrameworkLive {
        let known = allocations != u64::MAX && (allocations > 0 || bytes == 0);
        FrameworkLive {
            bytes,
            allocations: known.then_some(allocations),
        }
    }
}

/// Who marked a step boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSource {
    /// The program itself (`oomshim_step()`).
    Program = 0,
    /// A `torch.optim` optimizer step (oomshim's Python hook).
    Optimizer = 1,
    /// A forward pass of the program's outermost module (oomshim's Python hook).
    Forward = 2,
}

impl StepSource {
    pub fn from_code(code: i32) -> Option<StepSource> {
        match code {
            0 => Some(StepSource::Program),
            1 => Some(StepSource::Optimizer),
            2 => Some(StepSource::Forward),
            _ => None,
        }
    }

    /// The dump's `growth.steps` word.
    pub fn word(self) -> &'static str {
        match self {
            StepSource::Program => "marked",
            StepSource::Optimizer => "optimizer",
            StepSource::Forward => "forward",
        }
    }
}

/// What growth is attributed to (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteKey {
    /// The program's own Python line: (code id, line).
    PyLine(u32, u32),
    /// A Python stack without a frame of the program's own code.
    PyStack(StackId),
    /// Allocations without Python frames in a process that runs Python.
    NoPython,
    /// A native stack (a process without Python, or Python stacks off).
    Native(StackId),
}

impl SiteKey {
    /// The dump's `grouped_by` word.
    pub fn word(self) -> &'static str {
        match self {
            SiteKey::PyLine(..) => "python_line",
            SiteKey::PyStack(_) => "python_stack",
            SiteKey::NoPython => "no_python",
            SiteKey::Native(_) => "native",
        }
    }
}

/// Turns an allocation's (native, Python) stack pair into the site its growth counts for.
/// Called on cold paths only, with no ledger lock held.
pub trait SiteKeyer {
    fn key(&self, native: StackId, python: StackId) -> SiteKey;
}

/// Any `Fn(native, python) -> SiteKey` is a keyer (tests use closures).
impl<F: Fn(StackId, StackId) -> SiteKey> SiteKeyer for F {
    fn key(&self, native: StackId, python: StackId) -> SiteKey {
        self(native, python)
    }
}

/// A stack pair: what names a site in a dump.
pub type StackPair = (StackId, StackId);
