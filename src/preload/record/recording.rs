//! What the shim records, switchable at run time (`oomshim_set_recording`, Python's
//! `oomshim.set_recording`): benchmarks alternate modes in blocks inside one process, so a ratio
//! is measured against the same process, caches and core rather than across processes whose
//! spread is larger than the effect.
//!
//! Switching is safe at any moment: the ledger stays exact for everything it holds, whatever
//! mode an allocation was made in and whatever mode it is freed in. Frees always remove their
//! pointer from the ledger (one shard lookup, even in pass-through), so an allocation recorded in
//! one mode and freed in another leaves it; an allocation made in pass-through was never in it,
//! and its free is counted as passed through rather than as an unknown free.

use oomshim_core::config::StackMode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// One recording mode. The numbers are the C API's (`oomshim_set_recording`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Recording {
    /// Hooks forward and record nothing: no ledger entry, no stack, no failure dump.
    PassThrough = 0,
    /// Sizes, APIs, devices and totals, no stacks (`OOMSHIM_STACKS=off`).
    Totals = 1,
    /// Native stacks only (`OOMSHIM_STACKS=native`).
    NativeStacks = 2,
    /// Native and Python stacks (`OOMSHIM_STACKS=all`, the default).
    AllStacks = 3,
    /// Python stacks only (`OOMSHIM_STACKS=python`).
    PythonStacks = 4,
}

impl Recording {
    pub fn from_code(code: i32) -> Option<Recording> {
        Some(match code {
            0 => Recording::PassThrough,
            1 => Recording::Totals,
            2 => Recording::NativeStacks,
            3 => Recording::AllStacks,
            4 => Recording::PythonStacks,
            _ => return None,
        })
    }

    pub fn from_stacks(mode: StackMode) -> Recording {
        match mode {
            StackMode::Off => Recording::Totals,
            StackMode::Native => Recording::NativeStacks,
            StackMode::Python => Recording::PythonStacks,
            StackMode::All => Recording::AllStacks,
        }
    }

    /// The stacks this mode captures; `None` for pass-through (nothing is recorded at all).
    pub fn stacks(self) -> Option<StackMode> {
        match self {
            Recording::PassThrough => None,
            Recording::Totals => Some(StackMode::Off),
            Recording::NativeStacks => Some(StackMode::Native),
            Recording::AllStacks => Some(StackMode::All),
            Recording::PythonStacks => Some(StackMode::Python),
        }
    }

    /// The name the Python package and the README use.
    pub fn name(self) -> &'static str {
        match self {
            Recording::PassThrough => "pass-through",
            Recording::Totals => "totals",
            Recording::NativeStacks => "native",
            Recording::AllStacks => "all",
            Recording::PythonStacks => "python",
        }
    }
}

/// The current mode, or [`UNSET`] before the shim started (the start sets it from
/// `OOMSHIM_STACKS`).
static CURRENT: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;
/// Set once a program chose a mode itself: allocator mode then captures native stacks of
/// tensors when the mode says so (by default it unwinds libtorch only when `OOMSHIM_STACKS`
/// asks for native stacks explicitly).
static CHOSEN: AtomicBool = AtomicBool::new(false);

/// Sets the starting mode, unless a program already chose one.
pub(crate) fn start(mode: Recording) {
    let _ = CURRENT.compare_exchange(UNSET, mode as u8, Ordering::Relaxed, Ordering::Relaxed);
}

/// The current mode: one relaxed load.
#[inline]
pub fn current() -> Recording {
    Recording::from_code(CURRENT.load(Ordering::Relaxed) as i32).unwrap_or(Recording::AllStacks)
}

/// Switches to `mode` and returns the mode before. Stacks that need preparing (the module list
/// for native stacks, the interpreter lookup for Python ones) are prepared here, on the calling
/// thread, not inside a later allocation.
pub fn set(mode: Recording) -> Recording {
    if let Some(stacks) = mode.stacks() {
        if stacks.native() {
            oomshim_host::stacks::refresh_modules();
        }
        if stacks.python() {
            oomshim_host::pystack::init();
        }
    }
    CHOSEN.store(true, Ordering::Relaxed);
    Recording::from_code(CURRENT.swap(mode as u8, Ordering::Relaxed) as i32)
        .unwrap_or(Recording::AllStacks)
}

/// True once a program chose the mode itself ([`set`]).
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_names_and_stack_modes_agree() {
        for code in 0..5 {
            let r = Recording::from_code(code).unwrap();
            assert_eq!(r as i32, code);
            if let Some(s) = r.stacks() {
                assert_eq!(Recording::from_stacks(s), r);
            }
        }
        assert_eq!(Recording::from_code(5), None);
        assert_eq!(Recording::from_code(-1), None);
        assert_eq!(Recording::PassThrough.stacks(), None);
        let names: Vec<_> = (0..5)
            .map(|c| Recording::from_code(c).unwrap().name())
            .collect();
        assert_eq!(names, ["pass-through", "totals", "native", "all", "python"]);
    }
}
