//! [`SNAPSHOT`](super::SNAPSHOT): a dump without a failed request (on demand, or an
//! out-of-memory dump that records none): what was held. Its sentences are in
//! `words/snapshot.rs`.

use super::context::top_site;
use super::found::Held;
use dump::model::Dump;

/// What a dump without a failed request holds.
pub(super) fn held(dump: &Dump) -> Held<'_> {
    let tracked: u64 = dump
        .devices
        .iter()
        .map(|d| d.tracked_bytes)
        .fold(0, u64::saturating_add);
    let count: u64 = dump
        .devices
        .iter()
        .map(|d| d.tracked_count)
        .fold(0, u64::saturating_add);
    let holding = dump.devices.iter().filter(|d| d.tracked_bytes > 0).count();
    Held {
        tracked,
        count,
        holding,
        top: top_site(dump),
    }
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{contains_all, oom_dump, GIB, MIB};
    use crate::verdict::{judge, SNAPSHOT};
    use dump::model::*;

    #[test]
    fn snapshot() {
        let mut dump = oom_dump(0, Some(80 * GIB), Some(40 * GIB), 38 * GIB);
        dump.failed_request = None;
        dump.reason = "manual".into();
        dump.pinned_host = PinnedHost {
            bytes: 256 * MIB,
            count: 4,
            peak_bytes: 256 * MIB,
        };
        let v = judge(&dump);
        assert_eq!(v.kind, SNAPSHOT);
        assert!(
            contains_all(
                &v.summary,
                &[
                    "On-demand dump (manual).",
                    "38.00 GiB of tracked device memory in 12 allocations on 1 device.",
                    "forward (model.py:42), holds 19.00 GiB in 5 allocations (50.0% of tracked)"
                ]
            ),
            "{}",
            v.summary
        );
        assert_eq!(v.evidence[0], "device 0: 40.00 GiB of 80.00 GiB in use; 38.00 GiB tracked (95.0% of used) in 12 allocations, peak 38.00 GiB");
        assert!(v
            .evidence
            .iter()
            .any(|e| e.starts_with("pinned host memory: 256.00 MiB in 4 allocations")));

        dump.sites.clear();
        dump.devices.clear();
        dump.reason = "oom".into();
        let v = judge(&dump);
        assert_eq!(v.kind, SNAPSHOT);
        assert!(v.summary.contains("records no failed request"));
        assert!(v.summary.contains("No allocation sites were recorded"));
    }
}
