//! Findings from a dump: whose memory filled the device, in plain words, with the numbers that
//! show it, and what to change. Pure functions of the dump; table-tested.
//!
//! An out-of-memory dump (one with a `failed_request`) gets every finding that holds, ranked by
//! the bytes each explains (ties in the order below); the verdict's `kind`, `summary` and
//! `suggestions` are the top finding's (the suggestions of the others follow, without repeats):
//! - [`REQUEST_EXCEEDS_DEVICE`] (bytes: the request): the request alone is larger than the
//!   device's total memory. Nothing else is judged then: no freeing makes it fit.
//! - [`OTHER_PROCESSES`] (bytes: what they hold): processes other than this one that NVML lists
//!   on the device hold at least [`OTHER_PROCESSES_MIN_SHARE`] of its memory.
//! - [`LEAK`] (bytes: what the process grew by over the fitted steps, up to the failure): the
//!   process's tracked bytes grow with the steps (marked by the program, by the Python hook's
//!   optimizer and forward-pass marks, or detected): at least [`LEAK_MIN_BYTES_PER_STEP`] a step,
//!   R² ≥ 0.9 over at least 4 steps ending at the newest sample, and still that high at the
//!   failure. The growth is then *named* by site (the program's own line), each with its share.
//!   Detected steps count only when at least [`DETECTED_MIN_FREEING_SHARE`] of the sampled
//!   intervals freed memory (a loop that only allocates, like loading weights, repeats too).
//! - [`FRAGMENTATION`] (bytes: free in the cache): a free-block source (torch's snapshot or
//!   oomshim's allocator) shows at least the request free in total, and at least
//!   [`FRAGMENTATION_MIN_RESERVED_SHARE`] of what the cache reserves, but no block that large.
//!   Many distinct large request sizes ([`DYNAMIC_MIN_DISTINCT_LARGE`]) name dynamic shapes as
//!   the cause, with bucketing as the fix.
//! - [`FRAMEWORK_CACHE`] (bytes: reserved but unallocated): not fragmented, and the cache's
//!   releasable free bytes are at least [`FRAMEWORK_CACHE_MIN_REQUEST_SHARE`] of the request
//!   and, with the device's free bytes, enough for it.
//! - [`UNTRACKED_MEMORY`] (bytes: untracked less what other processes explain): less than
//!   [`UNTRACKED_MIN_SHARE`] of the memory in use is this process's tracked allocations (or,
//!   without device numbers, it tracked nothing), and other processes explain less than that
//!   share of the rest.
//! - [`OWN_ALLOCATIONS`] (bytes: tracked): the residual account, when this process's tracked
//!   allocations are most of the memory in use and no more specific account of them (leak,
//!   fragmentation, framework cache) holds.
//! - [`HOST_MEMORY`]: the only finding when the failed request was for page-locked host memory;
//!   otherwise low host memory (below [`HOST_MIN_AVAILABLE_SHARE`] available, or a cgroup at
//!   [`CGROUP_MAX_USAGE_SHARE`] of its limit) is a finding with this process's pinned bytes.
//!
//! Every failure's verdict carries a retry hint (`retry.rs`: `elsewhere`, `after_change`,
//! `unknown`, derived from the kinds above).
//!
//! A dump without a failed request gets [`SNAPSHOT`]; a post-mortem dump (`oomshim run` rebuilt
//! it after its program died) is judged by [`judge_post_mortem`] (how it died:
//! src/core/verdict/post_mortem.rs).
//!
//! This folder, as a one-way pipeline (rules → data → words):
//! - this file holds the entry points and the order in which the rules are tried, and is the
//!   only caller of `words/`; it also makes the rules' readings of the whole dump
//!   ([`found::Readings`]: the framework, the growth's fit, dynamic shapes, low host memory, …);
//! - each kind has a file of its own (`leak.rs`, `fragmentation.rs`, ...) that decides whether
//!   its finding holds and finds everything its sentences need, with its thresholds and its
//!   tests; `context.rs` gathers the numbers every rule reads; `sites.rs` says which line a site
//!   is (what the rules compare) and how it is named; `names.rs` names the kinds;
//! - `found.rs` is what the rules found, as data;
//! - `words/` turns it into headlines, sentences, evidence and advice, one file per kind: it
//!   reads `found.rs`, `context.rs`, `sites.rs` and `names.rs`, and calls no rule (tests/layers.rs
//!   keeps it so; `words/kinds.rs` still calls the kinds rules).
//!
//! `tests.rs` holds the fixtures the tests share and the tests across kinds.

use context::{cache, Ctx};
use dump::model::{Dump, FailedRequest, Finding, Verdict};
use found::Readings;

mod context;
mod found;
mod fragmentation;
mod framework;
mod framework_cache;
mod host_memory;
mod kinds;
mod leak;
mod names;
mod other_processes;
mod own_allocations;
mod post_mortem;
mod request_exceeds_device;
pub mod retry;
mod sites;
mod snapshot;
#[cfg(test)]
pub(crate) mod tests;
mod untracked_memory;
mod words;

pub use found::{NotALeak, OverTime};
pub use fragmentation::{
    DYNAMIC_MIN_DISTINCT_LARGE, DYNAMIC_MIN_DISTINCT_SHARE, FRAGMENTATION_MIN_RESERVED_SHARE,
};
pub use framework_cache::FRAMEWORK_CACHE_MIN_REQUEST_SHARE;
pub use host_memory::{CGROUP_MAX_USAGE_SHARE, HOST_MIN_AVAILABLE_SHARE};
pub use leak::{
    timeline_judgement, DETECTED_MIN_FREEING_SHARE, LEAK_MIN_BYTES_PER_STEP, LEAK_NAMED_SHARE,
    TIMELINE_MAX_QUIET_MS, TIMELINE_MIN_ALLOCATIONS, TIMELINE_MIN_KEPT_SHARE, TIMELINE_MIN_SPAN_MS,
    TIMELINE_QUIET_GAPS,
};
pub use names::{
    EXITED_AFTER_FAILURE, FRAGMENTATION, FRAMEWORK_CACHE, HOST_MEMORY, HOST_OOM_KILL,
    KILLED_BY_SIGNAL, LEAK, OTHER_PROCESSES, OWN_ALLOCATIONS, REQUEST_EXCEEDS_DEVICE, SNAPSHOT,
    UNTRACKED_MEMORY,
};
pub use other_processes::OTHER_PROCESSES_MIN_SHARE;
pub use post_mortem::{host_growth, HOST_GROWTH_MIN_BYTES};
pub use sites::short_label;
pub use untracked_memory::UNTRACKED_MIN_SHARE;

/// Judges a dump. Uses everything in it except its own `verdict` field. Deterministic.
pub fn judge(dump: &Dump) -> Verdict {
    if dump.post_mortem.is_some() {
        return judge_post_mortem(dump); // how the program died comes first
    }
    match &dump.failed_request {
        Some(request) => judge_oom(dump, request),
        None => words::snapshot::verdict(dump, snapshot::held(dump), &readings(dump)),
    }
}

/// The rules' readings of the whole dump that the words of several findings use.
fn readings(dump: &Dump) -> Readings<'_> {
    Readings {
        framework: framework::framework(dump),
        growth_fit: dump.growth.as_ref().and_then(leak::growth_fit),
        dynamic_shapes: fragmentation::dynamic_shapes(dump),
        expandable_segments: fragmentation::expandable_segments_on(dump),
        growing_shapes: leak::growing_shapes(dump),
        host_low: host_memory::host_pressure(dump),
        kinds: kinds::kinds_of(dump),
        tracked_all: context::tracked_all(dump),
        alloc_conf: context::alloc_conf(dump),
        not_a_leak: leak::timeline_judgement(dump).and_then(Result::err),
    }
}

/// The verdict of a post-mortem dump: how the program died first, then the device memory's own
/// finding (a leak growing step after step, named by its line) when the last published state
/// shows one. Dumps without a `post_mortem` section are judged by [`judge`].
pub fn judge_post_mortem(dump: &Dump) -> Verdict {
    let Some(pm) = &dump.post_mortem else {
        return judge(dump);
    };
    let readings = readings(dump);
    let ended = post_mortem::ended(pm);
    let leak = leak::leak_finding(dump).map(|l| {
        words::post_mortem::leak_by_records(&l).unwrap_or_else(|| words::post_mortem::leak(&l))
    });
    let mut death = words::post_mortem::death_finding(dump, pm, &ended, &readings, leak.is_some());
    if let Some(l) = &leak {
        words::post_mortem::add_leak(&mut death, l);
    }
    death.evidence.push(words::post_mortem::reconstructed(pm));
    let retry = words::retry::of_post_mortem(&retry::of_post_mortem(pm, &ended));
    let mut findings = vec![death];
    findings.extend(leak);
    let top = findings[0].clone();
    let mut suggestions = top.suggestions.clone();
    for f in &findings[1..] {
        for s in &f.suggestions {
            if !suggestions.contains(s) {
                suggestions.push(s.clone());
            }
        }
    }
    Verdict {
        kind: top.kind.clone(),
        summary: top.summary.clone(),
        evidence: top.evidence.clone(),
        suggestions,
        findings,
        retry: Some(retry),
    }
}

/// The findings of an out-of-memory dump, the rules tried in the order of the module's list: a
/// failed page-locked host request, or a request larger than the device, stands alone; else
/// every finding that holds, then low host memory; ranked by the bytes each explains.
fn judge_oom(dump: &Dump, request: &FailedRequest) -> Verdict {
    let c = Ctx::of(dump, request, readings(dump));
    let mut findings = findings(&c);
    if let Some(low) = &c.readings.host_low {
        if !findings.iter().any(|f| f.kind == HOST_MEMORY) {
            findings.push(words::host_memory::host_low(dump, low));
        }
    }
    rank(&mut findings);

    let summary = words::verdict_summary(&c, findings[0].summary.clone());
    let mut suggestions: Vec<String> = Vec::new();
    for f in &findings {
        for s in &f.suggestions {
            if !suggestions.contains(s) {
                suggestions.push(s.clone());
            }
        }
    }
    let retry = words::retry::of_oom(&c, &retry::of_oom(&c, &findings));
    let mut evidence = words::evidence::general_evidence(&c);
    if let Some(o) = &c.readings.not_a_leak {
        evidence.push(words::leak::not_a_leak(o));
    }
    Verdict {
        kind: findings[0].kind.clone(),
        summary,
        evidence,
        suggestions,
        findings,
        retry: Some(retry),
    }
}

/// The device's findings of an out-of-memory dump, in the order the rules are tried: a failed
/// page-locked host request, or a request larger than the device, stands alone; else every
/// finding that holds.
fn findings(c: &Ctx) -> Vec<Finding> {
    let (dump, request) = (c.dump, c.request);
    let mut findings = Vec::new();
    if host_memory::is_pinned_api(&request.api) {
        findings.push(words::host_memory::pinned_request_failed(c));
        return findings;
    }
    if request_exceeds_device::holds(c) {
        findings.push(words::request_exceeds_device::finding(c));
        return findings;
    }
    let cache = cache(dump);
    let fragmented = cache
        .as_ref()
        .is_some_and(|k| fragmentation::holds(k, request.bytes));
    if fragmented {
        findings.push(words::fragmentation::finding(
            c,
            cache.as_ref().expect("fragmented"),
        ));
    } else if let Some(k) = cache.as_ref().filter(|k| framework_cache::holds(c, k)) {
        findings.push(words::framework_cache::finding(c, k));
    }
    let others_found = other_processes::holds(c);
    if others_found {
        findings.push(words::other_processes::finding(c));
    }
    let untracked = untracked_memory::Untracked::of(c, others_found);
    if untracked.holds() {
        findings.push(words::untracked_memory::finding(c, untracked.unexplained));
    }
    let leak = leak::leak_finding(dump);
    if let Some(l) = &leak {
        findings.push(words::leak::finding(c, l));
    }
    let specific =
        leak.is_some() || fragmented || findings.iter().any(|f| f.kind == FRAMEWORK_CACHE);
    if own_allocations::holds(untracked.mostly_untracked, specific, !findings.is_empty()) {
        let own = own_allocations::find(c);
        findings.push(words::own_allocations::finding(c, &own, cache.as_ref()));
    }
    findings
}

/// The growth of the process in one line, as the verdict judges it (`oomshim top`): `leak: …`
/// when it is one, else what the growth over time is (`growing: …`, `loading: …`); `None`
/// without growth to speak of.
pub fn growth_line(dump: &Dump) -> Option<String> {
    if let Some(l) = leak::leak_finding(dump) {
        let f = if dump.post_mortem.is_some() || dump.failed_request.is_none() {
            words::post_mortem::leak(&l)
        } else {
            return dump
                .verdict
                .findings
                .iter()
                .find(|f| f.kind == LEAK)
                .map(|f| f.headline.clone());
        };
        return Some(f.headline);
    }
    match leak::timeline_judgement(dump) {
        Some(Err(o)) => Some(words::leak::not_a_leak(&o)),
        _ => None,
    }
}

/// The order among findings that explain equal bytes.
fn priority(kind: &str) -> usize {
    [
        REQUEST_EXCEEDS_DEVICE,
        OTHER_PROCESSES,
        LEAK,
        FRAGMENTATION,
        FRAMEWORK_CACHE,
        UNTRACKED_MEMORY,
        OWN_ALLOCATIONS,
        HOST_MEMORY,
    ]
    .iter()
    .position(|k| *k == kind)
    .unwrap_or(usize::MAX)
}

/// Findings ranked by bytes explained (largest first), ties by [`priority`].
pub fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(priority(&a.kind).cmp(&priority(&b.kind)))
    });
}
