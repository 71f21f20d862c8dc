//! [`FRAMEWORK_CACHE`](super::FRAMEWORK_CACHE): not fragmented, and releasing the framework's
//! cache would make room. Its sentences are in `words/framework_cache.rs`.

use super::context::{Cache, Ctx};

/// Smallest releasable cache, as a share of the request, for [`FRAMEWORK_CACHE`](super::FRAMEWORK_CACHE): a cache that
/// holds half the request or more is a real part of the missing room, not crumbs.
pub const FRAMEWORK_CACHE_MIN_REQUEST_SHARE: f64 = 0.5;

/// The framework's cache holds enough reserved-but-unallocated memory that releasing it would
/// make room (see [`FRAMEWORK_CACHE_MIN_REQUEST_SHARE`]).
pub(super) fn holds(c: &Ctx, k: &Cache) -> bool {
    let request = c.request.bytes;
    k.releasable > 0
        && k.releasable as f64 >= FRAMEWORK_CACHE_MIN_REQUEST_SHARE * request as f64
        && c.n
            .free
            .is_none_or(|free| k.releasable.saturating_add(free) >= request)
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{cache, check_common, kinds, oom_dump, GIB, MIB};
    use crate::verdict::{judge, FRAGMENTATION, FRAMEWORK_CACHE, OWN_ALLOCATIONS};

    #[test]
    fn framework_cache_thresholds() {
        // A 2 GiB request, 1 GiB free on the device, 70 GiB of this process's segments.
        // (source, total free, largest, inactive split, device free, kind of the top finding)
        type Case = (&'static str, u64, u64, Option<u64>, u64, &'static str);
        let cases: Vec<Case> = vec![
            ("torch-snapshot", GIB, 256 * MIB, None, GIB, FRAMEWORK_CACHE),
            (
                "oomshim-allocator",
                GIB,
                256 * MIB,
                Some(0),
                GIB,
                FRAMEWORK_CACHE,
            ),
            // below half the request: crumbs
            (
                "torch-snapshot",
                GIB - 1,
                256 * MIB,
                None,
                2 * GIB,
                OWN_ALLOCATIONS,
            ),
            // releasing it would not make room: 1.5 GiB + 256 MiB < 2 GiB
            (
                "torch-snapshot",
                1536 * MIB,
                256 * MIB,
                None,
                256 * MIB,
                OWN_ALLOCATIONS,
            ),
            // ... exactly enough
            (
                "torch-snapshot",
                1536 * MIB,
                256 * MIB,
                None,
                512 * MIB,
                FRAMEWORK_CACHE,
            ),
            // inactive split bytes are not releasable: 1.5 GiB - 1 GiB < 1 GiB
            (
                "torch-snapshot",
                1536 * MIB,
                256 * MIB,
                Some(GIB),
                GIB,
                OWN_ALLOCATIONS,
            ),
            // more free than the request but split: fragmentation instead
            (
                "torch-snapshot",
                3 * GIB,
                256 * MIB,
                None,
                GIB,
                FRAGMENTATION,
            ),
            (
                "oomshim-allocator",
                3 * GIB,
                256 * MIB,
                None,
                GIB,
                FRAGMENTATION,
            ),
            // the shim cannot see free blocks: neither
            (
                "unavailable",
                3 * GIB,
                256 * MIB,
                None,
                GIB,
                OWN_ALLOCATIONS,
            ),
        ];
        for (source, total, largest, inactive, free, kind) in cases {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(free), 70 * GIB);
            d.free_blocks = cache(source, total, largest, inactive);
            let v = judge(&d);
            check_common(&v);
            assert_eq!(
                kinds(&v),
                [kind],
                "{source} {total} {inactive:?} {free}: {v:#?}"
            );
            let s = v.suggestions.join("\n");
            match kind {
                FRAMEWORK_CACHE => {
                    assert_eq!(v.findings[0].bytes, total);
                    assert!(s.contains("torch.cuda.empty_cache()"), "{s}");
                    assert!(s.contains("garbage_collection_threshold"), "{s}");
                    assert!(!s.contains("expandable_segments"), "{s}");
                }
                FRAGMENTATION => {
                    assert_eq!(v.findings[0].bytes, total);
                    assert!(s.contains("expandable_segments:True"), "{s}");
                }
                _ => {
                    assert!(!s.contains("garbage_collection_threshold"), "{s}");
                    if source != "unavailable" {
                        assert!(v.findings[0]
                            .evidence
                            .iter()
                            .any(|e| e.contains("reserved but unallocated")));
                    }
                }
            }
        }
    }
}
