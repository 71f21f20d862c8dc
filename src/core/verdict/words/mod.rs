//! The verdict's wording: every headline, summary, line of evidence and suggestion, apart from
//! the rules that decide which findings hold (`src/core/verdict/<kind>.rs`). The words read what
//! the rules found (`../found.rs`, `../context.rs`) and call no rule. One file per kind; the
//! sentences that several kinds share are here; the labels of sites are in `../sites.rs`.

pub(super) mod evidence;
pub(super) mod fragmentation;
pub(super) mod framework_cache;
pub(super) mod host_memory;
pub(super) mod kinds;
pub(super) mod leak;
pub(super) mod other_processes;
pub(super) mod own_allocations;
pub(super) mod post_mortem;
pub(super) mod request_exceeds_device;
pub(super) mod retry;
pub(super) mod snapshot;
pub(super) mod untracked_memory;

use super::context::Ctx;
use super::found::Framework;
use super::sites::{short_label, MAX_FUNCTION};
use dump::api;
use dump::model::Finding;
use dump::units::{human_bytes, percent, share, thousands};
use dump::view::{frame_label, named_frames};

pub(in crate::verdict) fn count_word(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// How the growth's steps are called in sentences.
pub(in crate::verdict) fn steps_word(steps: Option<&str>) -> &'static str {
    match steps {
        Some("optimizer") => "optimizer steps",
        Some("forward") => "forward passes",
        Some("detected") => "detected steps",
        _ => "marked steps",
    }
}

/// Phrases about the failure that the words of several kinds use.
impl Ctx<'_> {
    /// The largest site, as a sentence for a summary.
    pub(in crate::verdict) fn top_text(&self, used: Option<u64>) -> String {
        match &self.top {
            Some(top) => {
                let share_text = match used {
                    Some(u) if u > 0 => format!(
                        " ({} of the memory in use)",
                        percent(share(top.site.bytes, u))
                    ),
                    _ => String::new(),
                };
                format!(
                    " The largest allocation site, {}, holds {} in {}{share_text}.",
                    top.label,
                    human_bytes(top.site.bytes),
                    count_word(top.site.count, "allocation", "allocations")
                )
            }
            None => " No allocation sites were recorded.".to_string(),
        }
    }

    /// ` at function (file:line)` of the failing call, the file's base name only (headlines).
    pub(in crate::verdict) fn failing_at_short(&self) -> String {
        named_frames(&self.request.stack)
            .next()
            .filter(|f| !dump::view::is_cuda_api_frame(f))
            .map(|_| format!(" at {}", short_label(&self.request.stack)))
            .unwrap_or_default()
    }

    /// ` at function (file:line)` of the failing call, as the evidence names it (suggestions).
    pub(in crate::verdict) fn failing_at(&self) -> String {
        named_frames(&self.request.stack)
            .next()
            .map(|f| format!(" at {}", frame_label(f, MAX_FUNCTION)))
            .unwrap_or_default()
    }
}

/// A finding without evidence or suggestions yet.
pub(in crate::verdict) fn new_finding(
    kind: &str,
    bytes: u64,
    headline: String,
    summary: String,
) -> Finding {
    Finding {
        kind: kind.to_string(),
        bytes,
        headline,
        summary,
        evidence: Vec::new(),
        suggestions: Vec::new(),
    }
}

/// Under LD_PRELOAD with torch's caching allocator, what a site means (a segment's first
/// allocation) and what torch says holds the segments now.
pub(in crate::verdict) fn segment_note(c: &Ctx) -> String {
    let dump = c.dump;
    let torch_segments = c.readings.framework == Framework::Torch
        && dump.failed_request.as_ref().is_some_and(|r| {
            matches!(
                r.api.as_str(),
                api::CUDA_MALLOC
                    | api::CU_MEM_CREATE
                    | api::CUDA_MALLOC_ASYNC
                    | api::FRAMEWORK_ALLOCATOR
            )
        })
        && dump.free_blocks.source != "oomshim-allocator";
    if !torch_segments {
        return String::new();
    }
    let fb = &dump.free_blocks;
    let held = match (fb.allocated_bytes, fb.reserved_bytes) {
        (Some(a), Some(r)) => format!(
            "; torch reports {} of its {} reserved in live tensors and {} free in its cache",
            human_bytes(a),
            human_bytes(r),
            human_bytes(fb.total_free_bytes.unwrap_or(r.saturating_sub(a)))
        ),
        _ => String::new(),
    };
    format!(
        " Under LD_PRELOAD oomshim sees torch's segments, not its tensors: a site is where torch first allocated a \
         segment, which other tensors may share by now{held}. `oomshim run --torch-allocator` records every tensor."
    )
}

/// The verdict's summary: the top finding's, with whether a retry recovered the failure.
pub(in crate::verdict) fn verdict_summary(c: &Ctx, judged: String) -> String {
    let dev = c.dev;
    match c.request.recovered {
        Some(true) => format!(
            "This failure was recovered by a retry: a later request of at least {} on device {dev} succeeded, so the program \
             did not see this error. {judged}",
            c.req
        ),
        Some(false) => format!("{judged} The retry did not succeed: the program saw this out-of-memory error."),
        None => judged,
    }
}
