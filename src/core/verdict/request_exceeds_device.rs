//! [`REQUEST_EXCEEDS_DEVICE`](super::REQUEST_EXCEEDS_DEVICE): the request alone is larger than
//! the device; nothing else is judged then. Its sentences are in `words/request_exceeds_device.rs`.

use super::context::Ctx;

/// The request is larger than the device's total memory: no freeing makes it fit.
pub(super) fn holds(c: &Ctx) -> bool {
    c.n.total.is_some_and(|total| c.request.bytes > total)
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{
        cache, check_common, kinds, oom_dump, process, with_processes, GIB,
    };
    use crate::verdict::{judge, REQUEST_EXCEEDS_DEVICE};
    use dump::model::Relation;

    #[test]
    fn a_request_larger_than_the_device_is_the_only_finding() {
        let mut d = oom_dump(100 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        with_processes(&mut d, vec![process(1, 9 * GIB, Relation::OtherUser)]);
        d.free_blocks = cache("torch-snapshot", 8 * GIB, GIB, None);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [REQUEST_EXCEEDS_DEVICE]);
        assert_eq!(v.findings[0].bytes, 100 * GIB);
        assert_eq!(
            v.findings[0].headline,
            "a single request of 100.00 GiB is larger than device 0 (80.00 GiB in total)"
        );
    }

    fn capped(d: &mut dump::model::Dump) {
        // The dump judged against the cap (its total) names it and the device's own size.
        d.devices[0].memory_cap = Some(dump::model::MemoryCap {
            bytes: 2 * GIB,
            fraction: 0.25,
            device_total_bytes: 8 * GIB,
            set_by: "set_per_process_memory_fraction".into(),
        });
    }

    #[test]
    fn a_request_larger_than_a_fraction_cap_names_the_cap_not_the_device() {
        let mut d = oom_dump(3 * GIB, Some(2 * GIB), Some(2 * GIB), 0);
        capped(&mut d);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [REQUEST_EXCEEDS_DEVICE]);
        let f = &v.findings[0];
        assert_eq!(
            f.headline,
            "a single request of 3.00 GiB is larger than the 2.00 GiB cap set by \
             set_per_process_memory_fraction(0.25) of device 0's 8.00 GiB"
        );
        assert!(f.summary.contains("may use only 2.00 GiB"), "{}", f.summary);
        assert!(
            f.suggestions[0].starts_with("Raise the cap"),
            "{:?}",
            f.suggestions
        );
        assert!(
            v.evidence
                .iter()
                .any(|e| e.starts_with("the 2.00 GiB cap set by")),
            "{:?}",
            v.evidence
        );
    }

    #[test]
    fn own_allocations_filling_a_fraction_cap_name_the_cap() {
        let mut d = oom_dump(
            512 << 20,
            Some(2 * GIB),
            Some(64 << 20),
            2 * GIB - (64 << 20),
        );
        capped(&mut d);
        let v = judge(&d);
        check_common(&v);
        assert!(
            v.findings[0].headline.starts_with(
                "this process's own allocations fill the 2.00 GiB cap set by \
                 set_per_process_memory_fraction(0.25) of device 0's 8.00 GiB: "
            ),
            "{:?}",
            v.findings[0]
        );
    }
}
