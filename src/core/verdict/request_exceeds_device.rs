//! [`REQUEST_EXCEEDS_DEVICE`](super::REQUEST_EXCEEDS_DEVICE): the request alone is larger than
//! the device; nothing else is judged then. Its sentences are in `words/request_exceeds_device.rs`.

use super::context::Ctx;

/// The request is larger than the device's total memory: no freeing makes it fit.
pub(super) fn holds(c: &Ctx) -> bool {
    c.n.total.is_some_and(|total| c.request.bytes > total)
}

#[cfg(test)]
mod tests {
    use crate::facts::gpu_processes::Relation;
    use crate::verdict::tests::{
        cache, check_common, kinds, oom_dump, process, with_processes, GIB,
    };
    use crate::verdict::{judge, REQUEST_EXCEEDS_DEVICE};

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
}
