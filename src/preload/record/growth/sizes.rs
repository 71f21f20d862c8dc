//! The distribution of recent device request sizes: dynamic shapes show as many distinct large
//! sizes.

use dump::model::{RequestSizes, SizeBin, SizeCount};
use rustc_hash::FxHashMap;

/// Request sizes kept (the most recent ones), for the dynamic-shape evidence.
pub const SIZE_RING: usize = 4096;
/// A request of at least this many bytes is *large*: dynamic shapes that fragment a cache show
/// as many distinct large sizes (small ones are rounded into a few size classes anyway).
pub const LARGE_REQUEST_BYTES: u64 = 1 << 20;
/// Most frequent sizes listed in a dump.
pub const TOP_SIZES: usize = 10;

/// The distribution of `sizes` (request sizes, 0 excluded by the caller).
pub(crate) fn summarize_sizes(sizes: &[u64]) -> Option<RequestSizes> {
    if sizes.is_empty() {
        return None;
    }
    let mut counts: FxHashMap<u64, u64> = FxHashMap::default();
    for &b in sizes {
        *counts.entry(b).or_insert(0) += 1;
    }
    let mut top: Vec<SizeCount> = counts
        .iter()
        .map(|(&bytes, &count)| SizeCount { bytes, count })
        .collect();
    top.sort_by(|a, b| b.count.cmp(&a.count).then(b.bytes.cmp(&a.bytes)));
    top.truncate(TOP_SIZES);
    let mut bins: std::collections::BTreeMap<u32, SizeBin> = Default::default();
    for (&bytes, &count) in &counts {
        let p = 63 - bytes.leading_zeros();
        let bin = bins.entry(p).or_insert_with(|| SizeBin {
            lo: 1u64 << p,
            hi: if p == 63 { u64::MAX } else { 1u64 << (p + 1) },
            count: 0,
            distinct: 0,
        });
        bin.count += count;
        bin.distinct += 1;
    }
    let large: Vec<(&u64, &u64)> = counts
        .iter()
        .filter(|(&b, _)| b >= LARGE_REQUEST_BYTES)
        .collect();
    Some(RequestSizes {
        window: sizes.len() as u64,
        distinct: counts.len() as u64,
        large: large.iter().map(|(_, &c)| c).sum(),
        distinct_large: large.len() as u64,
        large_bytes: LARGE_REQUEST_BYTES,
        top,
        bins: bins.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_and_exact_cases() {
        let s = summarize_sizes(&[512, 512, 1000, MIB, MIB, 3 * MIB]).unwrap();
        assert_eq!(
            (s.window, s.distinct, s.large, s.distinct_large),
            (6, 4, 3, 2)
        );
        assert_eq!(
            s.bins,
            [
                SizeBin {
                    lo: 512,
                    hi: 1024,
                    count: 3,
                    distinct: 2
                },
                SizeBin {
                    lo: MIB,
                    hi: 2 * MIB,
                    count: 2,
                    distinct: 1
                },
                SizeBin {
                    lo: 2 * MIB,
                    hi: 4 * MIB,
                    count: 1,
                    distinct: 1
                },
            ]
        );
        assert_eq!(
            s.top[0],
            SizeCount {
                bytes: MIB,
                count: 2
            }
        );
        assert_eq!(
            s.top[1],
            SizeCount {
                bytes: 512,
                count: 2
            }
        );
        assert!(summarize_sizes(&[]).is_none());
        assert_eq!(summarize_sizes(&[u64::MAX]).unwrap().bins[0].hi, u64::MAX);
    }
}
