//! The retry hint: whether running the same job again can succeed, for a scheduler's restart
//! policy (Kubernetes' `podFailurePolicy`, a job runner's retry rule). "Another process held the
//! GPU" (retry on a free device) and "the batch is too big" (retrying is futile) are one event
//! to a restart policy that sees only "CUDA out of memory"; the verdict tells them apart.
//!
//! The hint follows the verdict's kinds:
//!
//! | verdict | hint | why |
//! | --- | --- | --- |
//! | `other_processes` (any rank), when this process's own memory and the request fit the device | `elsewhere` | the same program fits on a free device |
//! | `other_processes` on top, when they do not fit even alone | `after_change` | a free device of this size runs out too |
//! | `request_exceeds_device` | `after_change` | no device of this size holds the request |
//! | `leak`, `fragmentation`, `framework_cache`, `own_allocations` | `after_change` | the program's own memory: the same configuration fills it again |
//! | `untracked_memory` | `unknown` | memory no hooked API allocated: the CUDA context, libraries, or a process not visible from here (another container) |
//! | `host_memory` | `unknown` | host memory is shared with the host's other processes |
//! | `host_oom_kill` under a cgroup memory limit, or with host memory growing per step | `after_change` | the job reaches its own limit again |
//! | `host_oom_kill` otherwise, `killed_by_signal`, `exited_after_failure` | `unknown` (or, for a process whose last device allocation had failed, that failure's own hint) | the death says nothing about a retry |
//!
//! A per-process cap (torch's `set_per_process_memory_fraction`) is never `elsewhere`: a free
//! device gives the program the same cap.
//!
//! This file decides the hint and the case that gives it; `words/retry.rs` says the reason.

use super::context::Ctx;
use super::found::{Death, DeathRetryWhy, Ended, OomRetryWhy, Retry};
use super::names::{
    FRAGMENTATION, FRAMEWORK_CACHE, LEAK, OTHER_PROCESSES, OWN_ALLOCATIONS, REQUEST_EXCEEDS_DEVICE,
};
use dump::model::{Finding, PostMortem};

/// The memory was someone else's: the same program fits on a free device.
pub const ELSEWHERE: &str = "elsewhere";
/// The program's own memory: a retry of the same configuration fails again.
pub const AFTER_CHANGE: &str = "after_change";
/// The dump cannot tell.
pub const UNKNOWN: &str = "unknown";

/// `oomshim run --exit-code`: the exit status for a failure with [`ELSEWHERE`] (EX_TEMPFAIL of
/// sysexits.h: "try again later").
pub const EXIT_ELSEWHERE: i32 = 75;
/// The same for [`AFTER_CHANGE`] (EX_CONFIG: "a configuration error").
pub const EXIT_AFTER_CHANGE: i32 = 78;

/// The exit status `oomshim run --exit-code` ends with for a hint; `None` for [`UNKNOWN`] (the
/// program's own status stays).
pub fn exit_code(hint: &str) -> Option<i32> {
    match hint {
        ELSEWHERE => Some(EXIT_ELSEWHERE),
        AFTER_CHANGE => Some(EXIT_AFTER_CHANGE),
        _ => None,
    }
}

/// The hint of an out-of-memory dump from its ranked findings (top first), and why.
pub(super) fn of_oom(c: &Ctx, findings: &[Finding]) -> Retry<OomRetryWhy> {
    let others = findings.iter().any(|f| f.kind == OTHER_PROCESSES);
    if others && c.cap.is_none() {
        if let Some(total) = c.n.total {
            // This process's own share of the used memory: what NVML's other processes do not hold.
            let own = c
                .used
                .map_or(c.tracked, |u| u.saturating_sub(c.others_bytes));
            let need = own.saturating_add(c.request.bytes);
            if need <= total {
                return Retry {
                    hint: ELSEWHERE,
                    why: OomRetryWhy::FitsAlone { own, total },
                };
            }
            if findings.first().is_some_and(|f| f.kind == OTHER_PROCESSES) {
                return Retry {
                    hint: AFTER_CHANGE,
                    why: OomRetryWhy::ExceedsAlone { own, total },
                };
            }
        }
    }
    let top = findings.first().map_or("", |f| f.kind.as_str());
    let hint = match top {
        REQUEST_EXCEEDS_DEVICE
        | LEAK
        | FRAGMENTATION
        | FRAMEWORK_CACHE
        | OWN_ALLOCATIONS
        | OTHER_PROCESSES => AFTER_CHANGE,
        _ => UNKNOWN,
    };
    Retry {
        hint,
        why: OomRetryWhy::Top(top.to_string()),
    }
}

/// The hint of a post-mortem dump, and why: how the program died decides.
pub(super) fn of_post_mortem(pm: &PostMortem, ended: &Ended) -> Retry<DeathRetryWhy> {
    if matches!(ended.death, Death::OomKilled) {
        if let Some(max) = pm.host.memory_max {
            return Retry {
                hint: AFTER_CHANGE,
                why: DeathRetryWhy::AtCgroupLimit { max },
            };
        }
        if let Some((rate, unit)) = ended.host_growth {
            return Retry {
                hint: AFTER_CHANGE,
                why: DeathRetryWhy::HostGrowing { rate, unit },
            };
        }
        return Retry {
            hint: UNKNOWN,
            why: DeathRetryWhy::OomKilledUnlimited,
        };
    }
    if let Some(f) = &pm.last_failure {
        if let Some(h) = f
            .retry
            .as_deref()
            .filter(|h| [ELSEWHERE, AFTER_CHANGE].contains(h))
        {
            return Retry {
                hint: if h == ELSEWHERE {
                    ELSEWHERE
                } else {
                    AFTER_CHANGE
                },
                why: DeathRetryWhy::LastFailure {
                    kind: f.kind.clone(),
                },
            };
        }
    }
    Retry {
        hint: UNKNOWN,
        why: match ended.death {
            Death::Exited => DeathRetryWhy::ExitedAfterFailure,
            _ => DeathRetryWhy::Killed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::tests::{oom_dump, process, with_processes, GIB, MIB};
    use crate::verdict::{judge, judge_post_mortem, UNTRACKED_MEMORY};
    use dump::model::{
        Dump, FreeBlocks, GpuProcesses, HostKill, LiveFailure, MemoryCap, PostMortem, Relation,
        RetryHint,
    };

    fn retry(d: &Dump) -> RetryHint {
        judge(d).retry.expect("every failure has a hint")
    }

    fn beside(mut d: Dump, others: Vec<dump::model::GpuProcess>) -> Dump {
        with_processes(&mut d, others);
        d
    }

    #[test]
    fn another_process_holding_the_device_is_elsewhere_when_the_program_fits_alone() {
        // 80 GiB device: another user's 60 GiB, this process's 15 GiB, a 10 GiB request.
        let d = beside(
            oom_dump(10 * GIB, Some(80 * GIB), Some(5 * GIB), 15 * GIB),
            vec![process(9, 60 * GIB, Relation::OtherUser)],
        );
        let r = retry(&d);
        assert_eq!(r.hint, ELSEWHERE, "{r:?}");
        assert!(
            r.reason
                .contains("other processes hold 60.00 GiB of device 0")
                && r.reason
                    .contains("own 15.00 GiB and the 10.00 GiB request fit its 80.00 GiB"),
            "{}",
            r.reason
        );
        // Not on top (this process holds more than the other), but it still fits alone.
        let d = beside(
            oom_dump(8 * GIB, Some(80 * GIB), Some(GIB), 60 * GIB),
            vec![process(9, 15 * GIB, Relation::OtherUser)],
        );
        let v = judge(&d);
        assert_ne!(v.kind, OTHER_PROCESSES);
        assert_eq!(v.retry.unwrap().hint, ELSEWHERE);
    }

    #[test]
    fn a_program_that_does_not_fit_alone_is_after_change_even_beside_another_process() {
        // 80 GiB device: another 20 GiB, this process 58 GiB, a 30 GiB request: 88 > 80.
        let d = beside(
            oom_dump(30 * GIB, Some(80 * GIB), Some(2 * GIB), 58 * GIB),
            vec![process(9, 20 * GIB, Relation::OtherUser)],
        );
        let r = retry(&d);
        assert_eq!(r.hint, AFTER_CHANGE, "{r:?}");
        // A per-process cap is the program's own setting: a free device gives the same cap.
        let mut d = beside(
            oom_dump(GIB, Some(20 * GIB), Some(GIB), 4 * GIB),
            vec![process(9, 15 * GIB, Relation::OtherUser)],
        );
        d.devices[0].memory_cap = Some(MemoryCap {
            bytes: 20 * GIB,
            fraction: 0.25,
            device_total_bytes: 80 * GIB,
            set_by: "set_per_process_memory_fraction".into(),
        });
        assert_ne!(retry(&d).hint, ELSEWHERE);
    }

    #[test]
    fn the_programs_own_memory_is_after_change() {
        // own_allocations: this process holds the device.
        let d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        let v = judge(&d);
        assert_eq!(v.kind, OWN_ALLOCATIONS);
        assert_eq!(v.retry.unwrap().hint, AFTER_CHANGE);
        // request_exceeds_device.
        let d = oom_dump(100 * GIB, Some(80 * GIB), Some(70 * GIB), 10 * GIB);
        let v = judge(&d);
        assert_eq!(v.kind, REQUEST_EXCEEDS_DEVICE);
        let r = v.retry.unwrap();
        assert_eq!(r.hint, AFTER_CHANGE);
        assert!(r.reason.contains("no device of this size"), "{}", r.reason);
        // fragmentation: torch's cache holds 20 GiB free in blocks of 1 GiB at most.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 50 * GIB);
        d.free_blocks = FreeBlocks {
            source: "torch-snapshot".into(),
            total_free_bytes: Some(20 * GIB),
            largest_free_bytes: Some(GIB),
            reserved_bytes: Some(70 * GIB),
            ..Default::default()
        };
        let v = judge(&d);
        assert_eq!(v.kind, FRAGMENTATION, "{:?}", v.findings);
        assert_eq!(v.retry.unwrap().hint, AFTER_CHANGE);
    }

    #[test]
    fn memory_nobody_tracked_is_unknown() {
        let d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 100 * MIB);
        let v = judge(&d);
        assert_eq!(v.kind, UNTRACKED_MEMORY, "{:?}", v.findings);
        let r = v.retry.unwrap();
        assert_eq!(r.hint, UNKNOWN);
        // NVML could not say (a container): still unknown, never elsewhere.
        let mut d = d;
        d.gpu_processes = Some(GpuProcesses {
            device: 0,
            matched_by: "index".into(),
            processes: vec![],
            error: Some("NVML is not available".into()),
        });
        assert_eq!(retry(&d).hint, UNKNOWN);
    }

    #[test]
    fn a_dump_without_a_failure_has_no_hint() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request = None;
        d.reason = "manual".into();
        assert_eq!(judge(&d).retry, None);
    }

    fn post_mortem(signal: Option<i32>, before: u64, after: u64, max: Option<u64>) -> Dump {
        let mut d = oom_dump(0, None, None, GIB);
        d.failed_request = None;
        d.reason = "post_mortem".into();
        d.post_mortem = Some(PostMortem {
            reconstructed: true,
            signal,
            signal_name: signal.map(|_| "SIGKILL".into()),
            core_dumped: false,
            exit_code: if signal.is_none() { Some(1) } else { None },
            died_unix_ms: 2_000,
            published_unix_ms: 1_500,
            generation: 3,
            from_previous: false,
            rss: vec![],
            last_failure: None,
            host: HostKill {
                cgroup: Some("/job".into()),
                oom_kill_before: Some(before),
                oom_kill_after: Some(after),
                memory_max: max,
                ..Default::default()
            },
            reaped_by: None,
            started_unix_ms: None,
        });
        d
    }

    #[test]
    fn a_post_mortem_is_after_change_only_at_its_own_limit() {
        let d = post_mortem(Some(libc::SIGKILL), 0, 1, Some(8 * GIB));
        let v = judge_post_mortem(&d);
        assert_eq!(v.kind, crate::verdict::HOST_OOM_KILL);
        let r = v.retry.unwrap();
        assert_eq!(r.hint, AFTER_CHANGE);
        assert!(r.reason.contains("8.00 GiB"), "{}", r.reason);
        // The host's OOM killer without a limit of its own: the host's memory is shared.
        assert_eq!(
            judge_post_mortem(&post_mortem(Some(libc::SIGKILL), 0, 1, None))
                .retry
                .unwrap()
                .hint,
            UNKNOWN
        );
        // SIGKILL from outside: unknown ...
        let d = post_mortem(Some(libc::SIGKILL), 0, 0, Some(8 * GIB));
        assert_eq!(judge_post_mortem(&d).retry.unwrap().hint, UNKNOWN);
        // ... unless its last device allocation had failed with a hint of its own.
        let mut d = d;
        d.post_mortem.as_mut().unwrap().last_failure = Some(LiveFailure {
            unix_ms: 1_400,
            device: 0,
            bytes: GIB,
            api: "cudaMalloc".into(),
            free_bytes: None,
            total_bytes: None,
            dump: Some("/d/x.json".into()),
            headline: Some("leak: …".into()),
            kind: Some("leak".into()),
            retry: Some(AFTER_CHANGE.into()),
        });
        let r = judge_post_mortem(&d).retry.unwrap();
        assert_eq!(r.hint, AFTER_CHANGE);
        assert!(r.reason.contains("(leak)"), "{}", r.reason);
        // An exit after a failure without a dump.
        assert_eq!(
            judge_post_mortem(&post_mortem(None, 0, 0, None))
                .retry
                .unwrap()
                .hint,
            UNKNOWN
        );
    }

    #[test]
    fn the_exit_codes_are_distinct_and_unknown_keeps_the_programs_own() {
        assert_eq!(exit_code(ELSEWHERE), Some(75));
        assert_eq!(exit_code(AFTER_CHANGE), Some(78));
        assert_eq!(exit_code(UNKNOWN), None);
        assert_eq!(exit_code("bogus"), None);
    }
}
