//! [`FRAGMENTATION`](super::FRAGMENTATION): the cache has the request free in total but in no
//! block that large; dynamic shapes as its cause. Its sentences are in `words/fragmentation.rs`.

use super::context::{alloc_conf, Cache};
use super::found::DynamicShapes;
use dump::model::Dump;

/// Smallest free share of what the framework's cache reserves for [`FRAGMENTATION`](super::FRAGMENTATION): when less
/// than a tenth of the cache is free, even a perfectly compacted cache would be full again within
/// a step or two; the cache ran out (a leak, or a working set too large), it did not fragment.
pub const FRAGMENTATION_MIN_RESERVED_SHARE: f64 = 0.1;
/// Distinct large request sizes (see `request_sizes`) from which shapes count as dynamic: a
/// steady training loop repeats a handful of sizes; variable-length batches make dozens.
pub const DYNAMIC_MIN_DISTINCT_LARGE: u64 = 16;
/// ... and the share of large requests with a size of their own: a long steady run repeats its
/// sizes many times (a low share), even when it has many tensors of different sizes.
pub const DYNAMIC_MIN_DISTINCT_SHARE: f64 = 0.25;

/// The cache shows at least the request free, at least [`FRAGMENTATION_MIN_RESERVED_SHARE`] of
/// what it reserves, but no free block as large as the request.
pub(super) fn holds(k: &Cache, request: u64) -> bool {
    k.total_free >= request
        && k.largest < request
        && k.reserved
            .is_none_or(|r| k.total_free as f64 >= FRAGMENTATION_MIN_RESERVED_SHARE * r as f64)
}

/// True when `PYTORCH_CUDA_ALLOC_CONF` already enables expandable segments.
pub(super) fn expandable_segments_on(dump: &Dump) -> bool {
    alloc_conf(dump).is_some_and(|c| {
        let c: String = c.chars().filter(|ch| !ch.is_whitespace()).collect();
        c.to_ascii_lowercase().contains("expandable_segments:true")
    })
}

/// Many distinct large request sizes in the recent history: dynamic shapes (see
/// [`DYNAMIC_MIN_DISTINCT_LARGE`]).
pub(super) fn dynamic_shapes(dump: &Dump) -> Option<DynamicShapes> {
    let r = dump.request_sizes.as_ref()?;
    (r.distinct_large >= DYNAMIC_MIN_DISTINCT_LARGE
        && r.large > 0
        && r.distinct_large as f64 >= DYNAMIC_MIN_DISTINCT_SHARE * r.large as f64)
        .then_some(DynamicShapes {
            distinct: r.distinct_large,
            large: r.large,
            window: r.window,
            large_bytes: r.large_bytes,
        })
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{
        cache, check_common, oom_dump, sizes, torch_fragmented_free_blocks, GIB,
    };
    use crate::verdict::{judge, FRAGMENTATION, OWN_ALLOCATIONS};
    use dump::model::*;

    #[test]
    fn fragmentation_suggestion_respects_alloc_conf() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        d.free_blocks = torch_fragmented_free_blocks();
        let v = judge(&d);
        assert_eq!(v.kind, FRAGMENTATION);
        assert!(v
            .suggestions
            .iter()
            .any(|s| s.contains("expandable_segments:True")));
        let mut conf = ConfigSnapshot::default();
        conf.env.insert(
            "PYTORCH_CUDA_ALLOC_CONF".into(),
            "max_split_size_mb:128, expandable_segments: True".into(),
        );
        d.config = Some(conf);
        let v = judge(&d);
        assert_eq!(v.kind, FRAGMENTATION);
        assert!(
            !v.suggestions
                .iter()
                .any(|s| s.contains("expandable_segments")),
            "{:?}",
            v.suggestions
        );
        assert!(v
            .evidence
            .iter()
            .any(|e| e.contains("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128")));
    }

    #[test]
    fn dynamic_shapes_thresholds() {
        // (distinct large sizes, large requests, named?)
        let cases = [
            (16, 64, true),
            (15, 60, false), // too few distinct sizes
            (16, 65, false), // too few of the large requests have a size of their own
            (300, 400, true),
        ];
        for (distinct, large, named) in cases {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
            d.free_blocks = cache("torch-snapshot", 8 * GIB, GIB, None);
            d.request_sizes = Some(sizes(distinct, large));
            let v = judge(&d);
            check_common(&v);
            assert_eq!(v.kind, FRAGMENTATION);
            let f = &v.findings[0];
            assert_eq!(
                f.suggestions
                    .first()
                    .is_some_and(|s| s.starts_with("Pad or bucket")),
                named,
                "{distinct}/{large}: {:?}",
                f.suggestions
            );
            assert_eq!(f.summary.contains("dynamic shapes"), named);
            assert_eq!(
                f.evidence.iter().any(|e| e.starts_with(&format!(
                    "dynamic shapes: {distinct} distinct sizes among the {large} requests of at least 1.00 MiB"
                ))),
                named
            );
            if !named {
                // Shapes are known to be steady: no bucketing advice at all.
                assert!(
                    !v.suggestions.iter().any(|s| s.contains("bucket")),
                    "{:?}",
                    v.suggestions
                );
            }
        }
        // Without free blocks, dynamic shapes join the "possibly fragmentation" hint.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(4 * GIB), 70 * GIB);
        d.request_sizes = Some(sizes(40, 80));
        let v = judge(&d);
        assert_eq!(v.kind, OWN_ALLOCATIONS);
        assert!(v
            .suggestions
            .iter()
            .any(|s| s.starts_with("Possibly fragmentation")
                && s.contains("dynamic shapes: 40 distinct sizes")));
        assert!(v.suggestions.iter().any(|s| s.starts_with("Pad or bucket")));
    }
}
