//! Sites whose growth is attributed together: those whose stacks a dump names by the same frame
//! (native stacks that differ only inside the framework or the CUDA runtime are one site). Shared
//! by the step histories' analysis (`analyse.rs`) and the timeline's (`timeline.rs`).

use super::model::{SiteKey, StackPair};
use dump::model::Frame;

/// A site's samples: (x, live bytes), x a step, a second or a millisecond.
type Series = Vec<(u64, u64)>;

/// A site to group: its key, a representative stack pair, its samples.
pub(super) type SiteSeries = (SiteKey, StackPair, Series);

/// Sites whose growth is attributed together: those with the same name.
pub(super) struct Group {
    pub(super) key: SiteKey,
    /// The sites in it.
    pub(super) members: Vec<SiteKey>,
    /// The member with the most bytes at the end names the group.
    pub(super) stack: Vec<Frame>,
    pub(super) series: Vec<(u64, u64)>,
}

/// Groups sites by the frame that names them (native stacks that differ only inside the
/// framework or the CUDA runtime are one site); sites without a named frame stay apart. Each
/// group's series is the sum of its members' samples at each x.
pub(super) fn group(sites: Vec<SiteSeries>, frames: Vec<Vec<Frame>>) -> Vec<Group> {
    let mut groups: Vec<(Option<String>, Group, u64)> = Vec::new();
    for ((key, _, series), stack) in sites.into_iter().zip(frames) {
        let label = dump::view::named_frames(&stack)
            .next()
            .map(|f| format!("{}|{}", key.word(), dump::view::frame_label(f, usize::MAX)));
        let last = series.last().map_or(0, |p| p.1);
        let found = label
            .as_ref()
            .and_then(|l| groups.iter().position(|g| g.0.as_deref() == Some(l)));
        match found {
            Some(i) => {
                let g = &mut groups[i];
                g.1.members.push(key);
                g.1.series = add_series(&g.1.series, &series);
                if last > g.2 {
                    g.1.stack = stack;
                    g.2 = last;
                }
            }
            None => groups.push((
                label,
                Group {
                    key,
                    members: vec![key],
                    stack,
                    series,
                },
                last,
            )),
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

/// The pointwise sum of two series sampled at the same xs (a series that starts later counts
/// 0 before its first sample).
fn add_series(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: std::collections::BTreeMap<u64, u64> = a.iter().copied().collect();
    for &(x, y) in b {
        *out.entry(x).or_insert(0) += y;
    }
    out.into_iter().collect()
}
