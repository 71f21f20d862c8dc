//! [`UNTRACKED_MEMORY`](super::UNTRACKED_MEMORY): most of the memory in use is not this
//! process's tracked allocations, and other processes do not explain most of the rest. Its
//! sentences are in `words/untracked_memory.rs`.

use super::context::Ctx;

/// Below this share of the memory in use, this process's tracked allocations are not what
/// fills the device ([`UNTRACKED_MEMORY`](super::UNTRACKED_MEMORY)); at or above it they are ([`OWN_ALLOCATIONS`](super::OWN_ALLOCATIONS)).
pub const UNTRACKED_MIN_SHARE: f64 = 0.5;

/// How much of the memory in use this process's tracked allocations leave unexplained.
pub(super) struct Untracked {
    /// Less than [`UNTRACKED_MIN_SHARE`] of the memory in use is tracked (without device
    /// numbers: nothing is tracked).
    pub(super) mostly_untracked: bool,
    /// Untracked bytes less what other processes hold.
    pub(super) unexplained: u64,
    /// Other processes are a finding and explain at least the rest of that share.
    explained_by_others: bool,
}

impl Untracked {
    pub(super) fn of(c: &Ctx, others_found: bool) -> Untracked {
        let (used, tracked, others_bytes) = (c.used, c.tracked, c.others_bytes);
        // Less than half of the memory in use is this process's tracked allocations.
        let mostly_untracked = match used {
            Some(used) => used > 0 && (tracked as f64) < UNTRACKED_MIN_SHARE * used as f64,
            None => tracked == 0,
        };
        let untracked = used.map_or(0, |u| u.saturating_sub(tracked));
        let unexplained = untracked.saturating_sub(others_bytes);
        // ... and other processes do not explain most of the rest (when they are a finding).
        let explained_by_others = others_found
            && used.is_some()
            && unexplained as f64 <= UNTRACKED_MIN_SHARE * untracked as f64;
        Untracked {
            mostly_untracked,
            unexplained,
            explained_by_others,
        }
    }

    /// The untracked memory is a finding of its own.
    pub(super) fn holds(&self) -> bool {
        self.mostly_untracked && !self.explained_by_others
    }
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{check_common, kinds, oom_dump, process, with_processes, GIB, MIB};
    use crate::verdict::{judge, OTHER_PROCESSES, OWN_ALLOCATIONS, UNTRACKED_MEMORY};
    use dump::model::Relation;

    #[test]
    fn untracked_threshold() {
        // 79 GiB in use: tracked at half of it is this process's; just below is untracked.
        let used = 79 * GIB;
        for (tracked, kind) in [
            (used / 2, OWN_ALLOCATIONS),
            (used / 2 - 1, UNTRACKED_MEMORY),
        ] {
            let v = judge(&oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), tracked));
            check_common(&v);
            assert_eq!(kinds(&v), [kind], "{tracked}");
        }
        // Other processes that explain at least half the untracked memory replace it.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 9 * GIB);
        with_processes(&mut d, vec![process(9, 35 * GIB, Relation::OtherUser)]);
        assert_eq!(kinds(&judge(&d)), [OTHER_PROCESSES]);
        with_processes(&mut d, vec![process(9, 35 * GIB - 1, Relation::OtherUser)]);
        let v = judge(&d);
        assert_eq!(kinds(&v), [UNTRACKED_MEMORY, OTHER_PROCESSES], "{v:#?}");
        assert_eq!(v.findings[0].bytes, 35 * GIB + 1);
        assert_eq!(v.findings[1].bytes, 35 * GIB - 1);
    }

    #[test]
    fn small_other_processes_leave_the_untracked_memory_a_finding() {
        // 1 GiB in use on an 80 GiB device: 0.4 GiB tracked, another process holds 0.4 GiB,
        // below the 5% that makes it a finding: the untracked memory is the finding, whole.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(79 * GIB), 400 * MIB);
        with_processes(&mut d, vec![process(3, 400 * MIB, Relation::OtherUser)]);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [UNTRACKED_MEMORY]);
        assert_eq!(v.findings[0].bytes, GIB - 800 * MIB);
    }
}
