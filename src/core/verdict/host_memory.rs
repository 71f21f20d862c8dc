//! [`HOST_MEMORY`](super::HOST_MEMORY): a failed page-locked host request, or host memory low
//! besides the device's failure. Its sentences are in `words/host_memory.rs`.

use super::found::HostPressure;
use dump::api;
use dump::model::Dump;

/// Host memory is low when `MemAvailable` is below this share of `MemTotal`.
pub const HOST_MIN_AVAILABLE_SHARE: f64 = 0.05;
/// ... or when the cgroup's usage is at least this share of its limit.
pub const CGROUP_MAX_USAGE_SHARE: f64 = 0.95;

/// Host memory is low, when it is (the host's numbers first, then the cgroup's): `MemAvailable`
/// below [`HOST_MIN_AVAILABLE_SHARE`] of `MemTotal`, or the cgroup at
/// [`CGROUP_MAX_USAGE_SHARE`] of its limit or more.
pub(super) fn host_pressure(dump: &Dump) -> Option<HostPressure> {
    let h = dump.host.as_ref()?;
    if let (Some(avail), Some(total)) = (h.available_bytes, h.total_bytes) {
        if total > 0 && (avail as f64) < HOST_MIN_AVAILABLE_SHARE * total as f64 {
            return Some(HostPressure::Available {
                available: avail,
                total,
            });
        }
    }
    if let (Some(usage), Some(limit)) = (h.cgroup_usage_bytes, h.cgroup_limit_bytes) {
        if limit > 0 && usage as f64 >= CGROUP_MAX_USAGE_SHARE * limit as f64 {
            return Some(HostPressure::Cgroup { usage, limit });
        }
    }
    None
}

/// The failed request was for page-locked host memory.
pub(super) fn is_pinned_api(api: &str) -> bool {
    matches!(
        api,
        api::CUDA_MALLOC_HOST
            | api::CUDA_HOST_ALLOC
            | api::CU_MEM_ALLOC_HOST
            | api::CU_MEM_HOST_ALLOC
    )
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{check_common, kinds, oom_dump, GIB, MIB};
    use crate::verdict::{judge, HOST_MEMORY, OWN_ALLOCATIONS};
    use dump::model::HostMemory;
    use dump::model::*;

    #[test]
    fn host_memory_table() {
        let host = |total, avail, limit, usage| HostMemory {
            total_bytes: total,
            available_bytes: avail,
            cgroup_limit_bytes: limit,
            cgroup_usage_bytes: usage,
            rss_bytes: None,
        };
        // (host, low?)
        let cases = [
            (host(Some(100 * GIB), Some(4 * GIB), None, None), true),
            (host(Some(100 * GIB), Some(5 * GIB), None, None), false),
            (
                host(
                    Some(100 * GIB),
                    Some(50 * GIB),
                    Some(10 * GIB),
                    Some(9_500 * MIB),
                ),
                false,
            ),
            (
                host(
                    Some(100 * GIB),
                    Some(50 * GIB),
                    Some(10 * GIB),
                    Some(9_800 * MIB),
                ),
                true,
            ),
            (host(None, None, None, None), false),
        ];
        for (h, low) in cases {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
            d.host = Some(h.clone());
            let v = judge(&d);
            assert_eq!(
                v.kind, OWN_ALLOCATIONS,
                "a device verdict is not overridden"
            );
            assert_eq!(
                v.evidence
                    .iter()
                    .any(|e| e.starts_with("host memory is low")),
                low,
                "{h:?}"
            );
            assert_eq!(
                v.suggestions
                    .iter()
                    .any(|s| s.contains("DataLoader workers")),
                low
            );
        }
        let mut d = oom_dump(GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().api = "cudaMallocHost".into();
        assert_eq!(judge(&d).kind, HOST_MEMORY);
    }

    #[test]
    fn host_memory_findings() {
        // MemAvailable (1 GiB) below the 3 GiB this process pinned: a host finding after the
        // device's, with the pinned bytes.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        d.pinned_host = PinnedHost {
            bytes: 3 * GIB,
            count: 6,
            peak_bytes: 3 * GIB,
        };
        d.host = Some(HostMemory {
            total_bytes: Some(64 * GIB),
            available_bytes: Some(GIB),
            ..Default::default()
        });
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [OWN_ALLOCATIONS, HOST_MEMORY]);
        assert_eq!(v.findings[1].bytes, 3 * GIB);
        assert_eq!(
            v.findings[1].headline,
            "host memory is low: 1.00 GiB available of 64.00 GiB (1.6%)"
        );
        // A cgroup at its limit, and a failed pinned request: the host finding alone.
        d.host = Some(HostMemory {
            total_bytes: Some(64 * GIB),
            available_bytes: Some(40 * GIB),
            cgroup_limit_bytes: Some(8 * GIB),
            cgroup_usage_bytes: Some(8 * GIB),
            rss_bytes: None,
        });
        d.failed_request.as_mut().unwrap().api = "cudaHostAlloc".into();
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [HOST_MEMORY]);
        assert_eq!(v.findings[0].bytes, 3 * GIB);
        assert!(v.findings[0]
            .evidence
            .iter()
            .any(|e| e.contains("the cgroup uses 8.00 GiB of its 8.00 GiB limit")));
    }
}
