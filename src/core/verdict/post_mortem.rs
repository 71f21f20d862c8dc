//! Post-mortem verdicts: how a program died that left no dump of its own, judged from a dump
//! that `oomshim run` rebuilt from the program's last published state; kinds of their own,
//! apart from the out-of-memory kinds.
//!
//! This file decides how the program died; `words/post_mortem.rs` says it; `judge_post_mortem`
//! (`mod.rs`) puts the two together.

use super::found::{Death, Ended};
use dump::model::{HostKill, PostMortem};

/// Host memory growth per step (or per second) below which the RSS samples are not called
/// growth: allocator noise and caches.
pub const HOST_GROWTH_MIN_BYTES: u64 = 1 << 20;

/// Host memory's growth from the RSS samples: (bytes per unit, unit word), per step when the
/// samples carry steps that advanced, else per second.
pub fn host_growth(pm: &PostMortem) -> Option<(u64, &'static str)> {
    let first = pm.rss.first()?;
    let stepped: Vec<(u64, u64)> = pm
        .rss
        .iter()
        .filter_map(|s| Some((s.step?, s.bytes)))
        .collect();
    let by_step = stepped.len() >= dump::fit::MIN_SAMPLES && stepped.last()?.0 > stepped.first()?.0;
    let (points, unit): (Vec<(u64, u64)>, &str) = if by_step {
        (stepped, "step")
    } else {
        (
            pm.rss
                .iter()
                .map(|s| (s.unix_ms.saturating_sub(first.unix_ms) / 1000, s.bytes))
                .collect(),
            "second",
        )
    };
    let fit = dump::fit::line(&points)?;
    let slope = fit.slope.max(0.0) as u64;
    (slope >= HOST_GROWTH_MIN_BYTES).then_some((slope, unit))
}

/// Whether the cgroup counted a new OOM kill while the program ran; `None` when its
/// `memory.events` was not read both at the start and after the death.
fn oom_kill_counted(h: &HostKill) -> Option<bool> {
    match (h.oom_kill_before, h.oom_kill_after) {
        (Some(b), Some(a)) => Some(a > b),
        _ => None,
    }
}

/// How the program ended, with what its words quote: the cgroup's OOM kills and the growth of
/// its host memory. The kinds: [`Death::OomKilled`] is [`HOST_OOM_KILL`](super::HOST_OOM_KILL),
/// [`Death::Exited`] [`EXITED_AFTER_FAILURE`](super::EXITED_AFTER_FAILURE), any other
/// [`KILLED_BY_SIGNAL`](super::KILLED_BY_SIGNAL).
pub(super) fn ended(pm: &PostMortem) -> Ended {
    Ended {
        death: how_it_ended(pm),
        oom_kill_counted: oom_kill_counted(&pm.host),
        host_growth: host_growth(pm),
    }
}

/// How the program ended: a SIGKILL is the OOM killer's only when the cgroup counted it.
fn how_it_ended(pm: &PostMortem) -> Death {
    match (pm.signal, oom_kill_counted(&pm.host)) {
        (Some(libc::SIGKILL), Some(true)) => Death::OomKilled,
        (Some(sig), _) => Death::Signalled(sig),
        // Its cgroup counted an OOM kill while it ran: the OOM killer's SIGKILL, though unseen.
        (None, Some(true)) if pm.exit_code.is_none() => Death::OomKilled,
        (None, _) if pm.exit_code.is_none() => Death::Unseen,
        (None, _) => Death::Exited,
    }
}
