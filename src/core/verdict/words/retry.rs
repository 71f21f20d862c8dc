//! The words of the retry hint: why running the same job again can succeed, or cannot, as the
//! reason a scheduler's log shows beside the hint.

use crate::verdict::context::Ctx;
use crate::verdict::found::{DeathRetryWhy, OomRetryWhy, Retry};
use crate::verdict::names::{
    FRAGMENTATION, FRAMEWORK_CACHE, HOST_MEMORY, LEAK, OTHER_PROCESSES, OWN_ALLOCATIONS,
    REQUEST_EXCEEDS_DEVICE, UNTRACKED_MEMORY,
};
use dump::model::RetryHint;
use dump::units::human_bytes;

fn hint(hint: &str, reason: String) -> RetryHint {
    RetryHint {
        hint: hint.to_string(),
        reason,
    }
}

/// The retry hint of an out-of-memory dump, with its reason.
pub(in crate::verdict) fn of_oom(c: &Ctx, r: &Retry<OomRetryWhy>) -> RetryHint {
    let reason = match &r.why {
        OomRetryWhy::FitsAlone { own, total } => format!(
            "other processes hold {} of {}; this process's own {} and the {} request \
             fit its {} alone: the same job fits on a free device",
            human_bytes(c.others_bytes),
            c.place(),
            human_bytes(*own),
            c.req,
            human_bytes(*total)
        ),
        OomRetryWhy::ExceedsAlone { own, total } => format!(
            "even alone on {}, this process's own {} and the {} request exceed its {}: \
             a free device of this size runs out too",
            c.place(),
            human_bytes(*own),
            c.req,
            human_bytes(*total)
        ),
        OomRetryWhy::Top(kind) => by_top_finding(c, kind),
    };
    hint(r.hint, reason)
}

/// Why the top finding's kind decides the hint.
fn by_top_finding(c: &Ctx, kind: &str) -> String {
    match kind {
        REQUEST_EXCEEDS_DEVICE => format!(
            "the {} request alone is larger than {}: no device of this size holds it",
            c.req,
            c.place()
        ),
        LEAK => {
            "the process's own memory grows step after step: the same configuration runs out again"
                .into()
        }
        FRAGMENTATION => {
            "the program's own cache is fragmented: the same configuration fragments it again \
             until the allocator setting the advice names is changed"
                .into()
        }
        FRAMEWORK_CACHE => {
            "the framework's cache of this program holds the memory: the same configuration fills \
             it again"
                .into()
        }
        OWN_ALLOCATIONS | OTHER_PROCESSES => format!(
            "this process's own allocations fill {}: the same configuration fails again; the \
             advice says what to change",
            c.place()
        ),
        UNTRACKED_MEMORY => {
            "memory that no hooked API allocated fills the device (the CUDA context, libraries' \
             own, or a process not visible from here, such as another container's): whether a \
             retry fits is not known"
                .into()
        }
        HOST_MEMORY => "host memory, shared with the host's other processes, ran short".into(),
        _ => "the verdict names no cause a retry depends on".into(),
    }
}

/// The retry hint of a post-mortem dump, with its reason.
pub(in crate::verdict) fn of_post_mortem(r: &Retry<DeathRetryWhy>) -> RetryHint {
    let reason = match &r.why {
        DeathRetryWhy::AtCgroupLimit { max } => format!(
            "the kernel's OOM killer ended it at its cgroup's memory limit ({}): the same \
             job reaches that limit again",
            human_bytes(*max)
        ),
        DeathRetryWhy::HostGrowing { rate, unit } => format!(
            "its host memory grew {} per {unit} until the kernel's OOM killer ended it: \
             the same job grows the same way",
            human_bytes(*rate)
        ),
        DeathRetryWhy::OomKilledUnlimited => {
            "the kernel's OOM killer ended it with no memory limit of its own cgroup: host \
             memory is shared with the host's other processes"
                .into()
        }
        DeathRetryWhy::LastFailure { kind } => format!(
            "its last device allocation had failed, and that failure's verdict ({}) says {}",
            kind.as_deref().unwrap_or("unknown"),
            r.hint
        ),
        DeathRetryWhy::ExitedAfterFailure => {
            "it exited after a failed allocation whose dump was never written".into()
        }
        DeathRetryWhy::Killed => {
            "it was killed from outside or crashed: how it died says nothing about a retry".into()
        }
    };
    hint(r.hint, reason)
}
