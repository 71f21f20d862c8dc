//! What a tracker remembers, and taking one sample of it: a walk of the ledger's live
//! allocations (under its shard locks, as a snapshot does) into per-site sums, then the sites
//! named with no ledger lock held and the rings pushed. Cold path only; who calls it when is
//! `steps.rs`'s job.

use super::model::{
    SiteKey, SiteKeyer, StackPair, MAX_SITES, RING, SAMPLE_FREE_LIVE, SAMPLE_MAX_VISITS_PER_ALLOC,
};
use oomshim_host::ledger::Ledger;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// Site names remembered per stack (a cache in front of Python-stack resolution); cleared when
/// full.
const MAX_KEY_CACHE: usize = 1 << 16;

/// Allocations to wait after a detected-step sample that found `live` allocations.
pub(super) fn sample_spacing(live: u64) -> u64 {
    (live.saturating_sub(SAMPLE_FREE_LIVE) / SAMPLE_MAX_VISITS_PER_ALLOC).max(1)
}

pub(super) struct SiteHistory {
    /// A representative stack pair, for naming the site in a dump.
    pub(super) stack: StackPair,
    pub(super) samples: VecDeque<(u64, u64)>,
}

/// Samples of one source.
#[derive(Default)]
pub(super) struct History {
    pub(super) samples: u64,
    pub(super) sites: FxHashMap<SiteKey, SiteHistory>,
    /// (x, tracked device bytes of the process) per sample.
    pub(super) totals: VecDeque<(u64, u64)>,
    /// (x, live bytes as the framework counts them) per marked sample, when the mark carried
    /// them (torch's `memory_allocated()`, from the Python hook): under preload the tracked bytes
    /// are torch's segments, cache included; these are its tensors.
    pub(super) framework_live: VecDeque<(u64, u64)>,
    /// (x, live device allocations) per sample, beside `totals`, and the framework's count of
    /// its live tensors beside `framework_live` when the mark carried it: a leak accumulates
    /// allocations; inputs of growing shape grow the bytes of as many allocations as before.
    pub(super) counts: VecDeque<(u64, u64)>,
    pub(super) framework_counts: VecDeque<(u64, u64)>,
    /// Live allocations (all kinds) at the last sample, and the allocation sequence number then.
    pub(super) live: u64,
    pub(super) sample_seq: u64,
    /// Intervals between samples, and those in which something was freed.
    pub(super) intervals: u64,
    pub(super) freeing_intervals: u64,
}

/// What the unmarked history holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum AutoMode {
    #[default]
    Time,
    Detected,
}

#[derive(Default)]
pub(super) struct Histories {
    /// Per [`StepSource`].
    pub(super) marked: [History; 3],
    /// Time buckets or detected steps, while nothing is marked.
    pub(super) auto: History,
    pub(super) auto_mode: AutoMode,
    /// Site of each stack pair seen (by Python stack when there is one).
    pub(super) keys: FxHashMap<StackPair, SiteKey>,
    /// Shim clock of the first time-bucket sample: the first device allocation (the bucket
    /// check is due at once).
    pub(super) first_ns: Option<u64>,
}

pub(super) fn push_ring(ring: &mut VecDeque<(u64, u64)>, point: (u64, u64)) {
    if ring.len() == RING {
        ring.pop_front();
    }
    ring.push_back(point);
}

/// Takes a sample at `x` (a step or a second); `seq` is the allocation sequence number now.
pub(super) fn sample(
    h: &mut History,
    keys: &mut FxHashMap<StackPair, SiteKey>,
    ledger: &Ledger,
    keyer: &dyn SiteKeyer,
    x: u64,
    seq: u64,
) {
    // First the ledger's sums per recorded context, into plain sums by stack pair; naming the
    // pairs takes other locks (stack tables, the Python code table), so it comes after.
    let mut by_pair: FxHashMap<StackPair, u64> = FxHashMap::default();
    let mut total = 0u64;
    let mut live = 0u64;
    let mut device_live = 0u64;
    ledger.for_each_live_sum(|s| {
        live += s.count;
        if s.api.is_pinned_host() {
            return;
        }
        device_live += s.count;
        total += s.bytes;
        *by_pair.entry((s.stack, s.py_stack)).or_insert(0) += s.bytes;
    });
    if keys.len() > MAX_KEY_CACHE {
        keys.clear();
    }
    let mut by_site: FxHashMap<SiteKey, (u64, StackPair)> = FxHashMap::default();
    for (pair, bytes) in by_pair {
        let key = *keys
            .entry(pair)
            .or_insert_with(|| keyer.key(pair.0, pair.1));
        let e = by_site.entry(key).or_insert((0, pair));
        e.0 += bytes;
    }
    if h.samples > 0 {
        // Something was freed since the last sample when fewer are live than were live then
        // plus those allocated since.
        h.intervals += 1;
        let allocated = seq.saturating_sub(h.sample_seq);
        if live < h.live.saturating_add(allocated) {
            h.freeing_intervals += 1;
        }
    }
    h.live = live;
    h.sample_seq = seq;
    h.samples += 1;
    push_ring(&mut h.totals, (x, total));
    push_ring(&mut h.counts, (x, device_live));
    // Sites already kept get a sample (0 when they hold nothing now).
    for (key, site) in h.sites.iter_mut() {
        let bytes = by_site.get(key).map_or(0, |e| e.0);
        push_ring(&mut site.samples, (x, bytes));
    }
    // Newcomers, largest first, while there is room or they outweigh the smallest kept site.
    let mut new: Vec<(SiteKey, u64, StackPair)> = by_site
        .into_iter()
        .filter(|(k, _)| !h.sites.contains_key(k))
        .map(|(k, (b, s))| (k, b, s))
        .collect();
    new.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (key, bytes, stack) in new {
        if h.sites.len() >= MAX_SITES {
            let smallest = h
                .sites
                .iter()
                .map(|(k, s)| (s.samples.back().map_or(0, |p| p.1), *k))
                .min();
            match smallest {
                Some((b, k)) if b < bytes => {
                    h.sites.remove(&k);
                }
                _ => break,
            }
        }
        let mut samples = VecDeque::with_capacity(RING);
        samples.push_back((x, bytes));
        h.sites.insert(key, SiteHistory { stack, samples });
    }
}
