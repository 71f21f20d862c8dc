//! `merge`'s "why this rank": the structural causes that make one rank of a job run out first,
//! named from the ranks' memory by kind side by side and from when each failed. Each rule
//! either applies, naming the rank that differs and by what, or says why it does not.
//!
//! - [`RANK0_FULL_COPY`]: rank 0 holds [`RANK0_PARAMETERS_FACTOR`]× or more the median
//!   parameters of the other ranks: it loaded the full state dict (or the whole model) before
//!   broadcasting or sharding it.
//! - [`PIPELINE_EDGES`]: the ranks above [`EDGE_ACTIVATIONS_FACTOR`]× the median activations
//!   are the first and/or last rank and no other: the first and last pipeline stages hold more
//!   (the embedding's input and the loss's logits).
//! - [`HOT_EXPERT`]: one rank alone holds [`HOT_EXPERT_FACTOR`]× or more the median
//!   activations while its parameters are those of the others (within
//!   [`SAME_PARAMETERS_TOLERANCE`]): its experts get more tokens (mixture-of-experts routing).
//!   Both need the activations of [`EDGE_MIN_RANKS`] ranks (a median of two is their mean).
//! - [`CASCADE`]: the first failure came at least [`CASCADE_MIN_GAP_MS`] before every other,
//!   and the others failed together, within [`CASCADE_SPREAD_MS`] of each other: they waited in
//!   a collective with the first until it timed out. The first failure is the one to fix.
//!
//! Thresholds are the published shapes of these cases with room for noise: a second full copy
//! is 2× (1.5× allows a copy in a smaller dtype), pipeline edges hold 25–30% more (1.2×), a hot
//! expert clearly more (1.5×), and a collective's timeout is seconds to minutes (NCCL's default
//! 10 min) while failures of one cause land within a step of each other.

use dump::units::human_bytes;

pub const RANK0_FULL_COPY: &str = "rank0_full_copy";
pub const PIPELINE_EDGES: &str = "pipeline_edges";
pub const HOT_EXPERT: &str = "hot_expert";
pub const CASCADE: &str = "cascade";

/// Rank 0's parameters against the median of the others' for [`RANK0_FULL_COPY`].
pub const RANK0_PARAMETERS_FACTOR: f64 = 1.5;
/// Activations against the median for a pipeline's edge stages ([`PIPELINE_EDGES`]).
pub const EDGE_ACTIVATIONS_FACTOR: f64 = 1.2;
/// Ranks with kinds that [`PIPELINE_EDGES`] and [`HOT_EXPERT`] need: with two, every rank is
/// an edge, and the median is their mean.
pub const EDGE_MIN_RANKS: usize = 3;
/// Activations against the median for [`HOT_EXPERT`].
pub const HOT_EXPERT_FACTOR: f64 = 1.5;
/// Parameters within this share of the median count as the same shard ([`HOT_EXPERT`]).
pub const SAME_PARAMETERS_TOLERANCE: f64 = 0.1;
/// The least gap between the first failure and the next for [`CASCADE`].
pub const CASCADE_MIN_GAP_MS: u64 = 5_000;
/// The most the later failures of a [`CASCADE`] may spread.
pub const CASCADE_SPREAD_MS: u64 = 5_000;

/// One rule's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Why {
    pub rule: &'static str,
    /// The ranks it names (empty when it does not apply).
    pub ranks: Vec<u32>,
    /// When it applies: the sentence; else why not.
    pub text: String,
    pub applies: bool,
}

impl Why {
    fn yes(rule: &'static str, ranks: Vec<u32>, text: String) -> Why {
        Why {
            rule,
            ranks,
            text,
            applies: true,
        }
    }

    fn no(rule: &'static str, why: impl Into<String>) -> Why {
        Why {
            rule,
            ranks: Vec::new(),
            text: why.into(),
            applies: false,
        }
    }
}

/// One process's memory by kind, as `merge` lists it per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankKinds {
    pub parameters_bytes: u64,
    pub gradients_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub activations_bytes: Option<u64>,
    /// [`dump::view::named_dominant`]: `None` too where the hook's count cannot tell.
    pub dominant: Option<&'static str>,
}

impl RankKinds {
    pub fn of(k: &dump::model::Kinds) -> RankKinds {
        RankKinds {
            parameters_bytes: k.parameters_bytes,
            gradients_bytes: k.gradients_bytes,
            optimizer_state_bytes: k.optimizer_state_bytes,
            activations_bytes: k.activations_bytes,
            dominant: dump::view::named_dominant(k).map(|(name, _)| name),
        }
    }

    /// The kind holding the most (`parameters`, `gradients`, `optimizer_state`, `activations`),
    /// ties to the first; `None` when nothing was counted or a count out of time cannot tell.
    pub fn dominant(&self) -> Option<&'static str> {
        self.dominant
    }
}

/// A process's kinds and its failure, as the rules read them.
#[derive(Debug, Clone, Copy)]
pub struct RankFacts<'a> {
    pub rank: Option<u32>,
    pub host: &'a str,
    pub pid: u32,
    pub kinds: Option<RankKinds>,
    /// When it failed (an out-of-memory dump, or its death in a post-mortem), ms.
    pub failed_ms: Option<u64>,
}

/// The middle value, or the mean of the two middle ones (0 for none).
pub fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    let mid = v.len() / 2;
    if v.is_empty() {
        0
    } else if v.len().is_multiple_of(2) {
        v[mid - 1] / 2 + v[mid] / 2 + (v[mid - 1] % 2 + v[mid] % 2) / 2
    } else {
        v[mid]
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::INFINITY
    } else {
        a as f64 / b as f64
    }
}

/// `ranks 0 and 7`, `rank 3`, `ranks 1, 2 and 5`.
pub fn ranks_words(ranks: &[u32]) -> String {
    match ranks {
        [] => "no rank".into(),
        [one] => format!("rank {one}"),
        [init @ .., last] => format!(
            "ranks {} and {last}",
            init.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Every rule, in order, over one entry per process (its rank's facts).
pub fn why(ranks: &[RankFacts], clock_skew_ms: u64) -> Vec<Why> {
    let ranked: Vec<(u32, RankKinds)> = ranks
        .iter()
        .filter_map(|r| Some((r.rank?, r.kinds?)))
        .collect();
    vec![
        rank0_full_copy(&ranked),
        edges_or_expert(&ranked, true),
        edges_or_expert(&ranked, false),
        cascade(ranks, clock_skew_ms),
    ]
}

fn rank0_full_copy(ranked: &[(u32, RankKinds)]) -> Why {
    if ranked.len() < 2 {
        return Why::no(
            RANK0_FULL_COPY,
            "needs the parameters of rank 0 and another rank (the Python hook's kinds at a failure)",
        );
    }
    let Some((_, zero)) = ranked.iter().find(|(r, _)| *r == 0) else {
        return Why::no(RANK0_FULL_COPY, "rank 0 has no kinds");
    };
    let others = median(
        ranked
            .iter()
            .filter(|(r, _)| *r != 0)
            .map(|(_, k)| k.parameters_bytes)
            .collect(),
    );
    if others == 0 {
        return Why::no(RANK0_FULL_COPY, "the other ranks count no parameters");
    }
    let x = ratio(zero.parameters_bytes, others);
    if x < RANK0_PARAMETERS_FACTOR {
        return Why::no(
            RANK0_FULL_COPY,
            format!(
                "rank 0 holds {x:.1}× the parameters of the others, under {RANK0_PARAMETERS_FACTOR}×"
            ),
        );
    }
    Why::yes(
        RANK0_FULL_COPY,
        vec![0],
        format!(
            "rank 0 holds {x:.1}× the parameters of the others ({} against a median of {}): a full \
             copy before the broadcast; load the state dict on every rank from a shared file, or \
             with FSDP build the model on the meta device and let `sync_module_states` send it",
            human_bytes(zero.parameters_bytes),
            human_bytes(others)
        ),
    )
}

/// [`PIPELINE_EDGES`] (`edges`) or [`HOT_EXPERT`]: the ranks whose activations stand out.
fn edges_or_expert(ranked: &[(u32, RankKinds)], edges: bool) -> Why {
    let rule = if edges { PIPELINE_EDGES } else { HOT_EXPERT };
    let with_acts: Vec<(u32, u64, u64)> = ranked
        .iter()
        .filter_map(|(r, k)| Some((*r, k.activations_bytes?, k.parameters_bytes)))
        .collect();
    let least = EDGE_MIN_RANKS;
    if with_acts.len() < least {
        return Why::no(
            rule,
            format!("needs the activations of {least} ranks or more (the Python hook's kinds)"),
        );
    }
    let med = median(with_acts.iter().map(|x| x.1).collect());
    let med_params = median(with_acts.iter().map(|x| x.2).collect());
    if med == 0 {
        return Why::no(rule, "the median rank counts no activations");
    }
    let first = with_acts.iter().map(|x| x.0).min().expect("some");
    let last = with_acts.iter().map(|x| x.0).max().expect("some");
    let above = |f: f64| -> Vec<(u32, f64)> {
        with_acts
            .iter()
            .filter(|x| ratio(x.1, med) >= f)
            .map(|x| (x.0, ratio(x.1, med)))
            .collect()
    };
    let elevated = above(EDGE_ACTIVATIONS_FACTOR);
    let at_edges = !elevated.is_empty() && elevated.iter().all(|(r, _)| *r == first || *r == last);
    let both_edges = elevated.len() == 2 && at_edges;
    let hot = above(HOT_EXPERT_FACTOR);
    let lone_hot = match hot.as_slice() {
        [(r, _)] if elevated.len() == 1 => {
            let p = with_acts.iter().find(|x| x.0 == *r).expect("listed").2;
            let same = med_params == 0
                || (p as f64 - med_params as f64).abs()
                    <= SAME_PARAMETERS_TOLERANCE * med_params as f64;
            same.then_some(*r)
        }
        _ => None,
    };
    if edges {
        // A lone rank far above is a hot expert, even at an edge; both edges are a pipeline.
        if at_edges && (both_edges || lone_hot.is_none()) {
            let ranks: Vec<u32> = elevated.iter().map(|x| x.0).collect();
            let lo = elevated.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
            let hi = elevated.iter().map(|x| x.1).fold(0.0, f64::max);
            let factor = if (hi - lo) < 0.05 {
                format!("{hi:.1}×")
            } else {
                format!("{lo:.1}–{hi:.1}×")
            };
            let which = match (ranks.contains(&first), ranks.contains(&last)) {
                (true, true) => "first/last pipeline stage",
                (true, false) => "the first pipeline stage",
                _ => "the last pipeline stage",
            };
            return Why::yes(
                rule,
                ranks.clone(),
                format!(
                    "{} hold {factor} the median activations ({which}: the embedding's inputs and \
                     the loss's logits); give those stages fewer layers, or checkpoint their \
                     activations",
                    ranks_words(&ranks)
                ),
            );
        }
        return Why::no(
            rule,
            if elevated.is_empty() {
                format!("no rank holds {EDGE_ACTIVATIONS_FACTOR}× the median activations")
            } else {
                format!(
                    "{} above {EDGE_ACTIVATIONS_FACTOR}× the median activations, not only the first and last rank",
                    ranks_words(&elevated.iter().map(|x| x.0).collect::<Vec<_>>())
                )
            },
        );
    }
    match lone_hot {
        Some(r) if !both_edges => {
            let x = hot[0].1;
            let acts = with_acts.iter().find(|a| a.0 == r).expect("listed").1;
            let edge = if r == first || r == last {
                " (or, if the job is pipelined, its edge stage)"
            } else {
                ""
            };
            Why::yes(
                rule,
                vec![r],
                format!(
                    "rank {r} holds {x:.1}× the median activations ({} against {}) with the \
                     parameters of the others: a hot expert{edge}; the router sends it more tokens \
                     (raise the load-balancing loss, or cap the expert capacity factor)",
                    human_bytes(acts),
                    human_bytes(med)
                ),
            )
        }
        _ => Why::no(
            rule,
            match hot.len() {
                0 => format!("no rank holds {HOT_EXPERT_FACTOR}× the median activations"),
                1 => "the rank above the others differs in its parameters too, or others are raised with it".into(),
                n => format!("{n} ranks hold {HOT_EXPERT_FACTOR}× the median activations, not one"),
            },
        ),
    }
}

fn cascade(ranks: &[RankFacts], clock_skew_ms: u64) -> Why {
    let mut failed: Vec<(&RankFacts, u64)> = ranks
        .iter()
        .filter_map(|r| Some((r, r.failed_ms?)))
        .collect();
    if failed.len() < 2 {
        return Why::no(CASCADE, "needs two failed processes or more");
    }
    failed.sort_by_key(|x| x.1);
    let (first, t0) = failed[0];
    let rest = &failed[1..];
    let gap = rest[0].1 - t0;
    let spread = rest.last().expect("one or more").1 - rest[0].1;
    let other_host = rest.iter().any(|(r, _)| r.host != first.host);
    if other_host && gap < clock_skew_ms {
        return Why::no(
            CASCADE,
            format!("the gap ({gap} ms) is within the clock skew allowed between hosts"),
        );
    }
    if gap < CASCADE_MIN_GAP_MS {
        return Why::no(
            CASCADE,
            format!(
                "the next failure came {:.1} s after the first, under {} s: one cause, not a timeout",
                gap as f64 / 1000.0,
                CASCADE_MIN_GAP_MS / 1000
            ),
        );
    }
    if spread > CASCADE_SPREAD_MS {
        return Why::no(
            CASCADE,
            format!(
                "the later failures spread over {:.1} s: they did not fail together",
                spread as f64 / 1000.0
            ),
        );
    }
    let who = |r: &RankFacts| match r.rank {
        Some(k) => format!("rank {k}"),
        None => format!("pid {}", r.pid),
    };
    let later: Vec<u32> = rest.iter().filter_map(|(r, _)| r.rank).collect();
    let later_words = if later.len() == rest.len() {
        ranks_words(&later)
    } else {
        format!("{} processes", rest.len())
    };
    let mut named = later.clone();
    named.insert(0, first.rank.unwrap_or(u32::MAX));
    named.retain(|r| *r != u32::MAX);
    Why::yes(
        CASCADE,
        named,
        format!(
            "{} failed first; {later_words} failed {:.0} s later, together, after a collective \
             timed out: a cascade; fix {}'s failure, the others waited for it",
            who(first),
            gap as f64 / 1000.0,
            who(first)
        ),
    )
}
