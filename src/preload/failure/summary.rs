//! The out-of-memory path's stderr lines: the summary of each dump (the failure and the
//! verdict's headline, then where the dump is), and what is said once at exit.

use dump::model::Dump;
use dump::units::{human_bytes, thousands};
use dump::write::{WriteError, Written};
use oomshim_host::ledger::Api;

pub(super) fn print_summary(dump: &Dump, written: &Result<Written, WriteError>) {
    if let Some(text) = summary_lines(dump, written) {
        oomshim_host::sys::say::say(&text);
    }
}

/// The stderr summary of an out-of-memory dump: one quiet line when a retry recovered it, else
/// two: the failure and the top finding in plain words with its key numbers, then where the
/// dump is and how to read it, and the verdict's retry hint. `None` for a dump without a failed request.
pub(super) fn summary_lines(dump: &Dump, written: &Result<Written, WriteError>) -> Option<String> {
    let req = dump.failed_request.as_ref()?;
    let where_ = match written {
        Ok(w) => format!("dump: {}", dump::units::clean_path(&w.path)),
        Err(e) => format!("no dump written: {e}"),
    };
    if req.recovered == Some(true) {
        return Some(format!(
            "oomshim: {} of {} on device {} failed, then its retry succeeded (recovered); {where_}",
            req.api,
            human_bytes(req.bytes),
            req.device
        ));
    }
    let mut notes = Vec::new();
    if req.failures_in_burst > 1 {
        notes.push(format!(
            "{} failures with its retries",
            thousands(req.failures_in_burst.into())
        ));
    }
    if dump
        .framework
        .as_ref()
        .is_some_and(|f| f.raised && f.name == "torch")
    {
        notes.push("torch raised OutOfMemoryError".to_string());
    }
    if req.recovered_before > 0 {
        notes.push(recovered_before_note(req.recovered_before));
    }
    let r = &dump.recording;
    if r.repeated_failures + r.suppressed_dumps > 0 {
        notes.push(format!(
            "{} earlier failures without a dump",
            thousands(r.repeated_failures + r.suppressed_dumps)
        ));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!("; {}", notes.join("; "))
    };
    // The verdict's own headline after its top finding's kind (a verdict without findings is
    // named by its kind).
    let finding = match dump.verdict.findings.first() {
        Some(top) => format!("{}: {}", top.kind, dump.verdict.headline()),
        None => dump.verdict.kind.clone(),
    };
    let what = if req.api == Api::FrameworkAllocator.name() {
        let of = if req.bytes > 0 {
            format!(" of {}", human_bytes(req.bytes))
        } else {
            // The framework's message did not say how much.
            String::new()
        };
        format!(
            "{}{of} refused{notes}",
            dump.framework
                .as_ref()
                .map_or("the framework's allocator", |f| match f.name.as_str() {
                    "torch" => "torch's caching allocator",
                    "xla" => "XLA's allocator",
                    _ => "the framework's allocator",
                }),
        )
    } else {
        format!("{} of {} failed{notes}", req.api, human_bytes(req.bytes))
    };
    let mut out = format!(
        "oomshim: CUDA out of memory on device {} ({what}): {finding}\n",
        req.device,
    );
    out.push_str(&format!("oomshim:   {where_}"));
    if let Ok(w) = written {
        out.push_str(&format!(
            "  (details: oomshim report {})",
            dump::units::clean_path(&w.path)
        ));
    }
    // For a scheduler's restart policy, and for the reader deciding whether to resubmit.
    if let Some(r) = &dump.verdict.retry {
        out.push_str(&format!("; retry: {}", r.hint));
    }
    Some(out)
}

/// The requests on the device that recovered just before this failure (told in its story).
fn recovered_before_note(n: u32) -> String {
    if n == 1 {
        "1 earlier request recovered just before".to_string()
    } else {
        format!(
            "{} earlier requests recovered just before",
            thousands(n.into())
        )
    }
}

/// Said once at exit: the failures after the last dump that got none of their own, and the
/// recovered failures only counted.
pub(super) fn say_without_dumps(repeats: u64, suppressed: u64, recovered: u64) {
    if repeats > 0 || suppressed > 0 {
        say(&without_dump_line(repeats, suppressed));
    }
    if recovered > 0 {
        say(&format!(
            "{} more out-of-memory failures were recovered by their retry (counted, no dump each: only the first gets one)",
            thousands(recovered)
        ));
    }
}

fn without_dump_line(repeats: u64, suppressed: u64) -> String {
    let mut parts = Vec::new();
    if repeats > 0 {
        parts.push(format!(
            "{} repeated an earlier dumped failure within OOMSHIM_MIN_INTERVAL",
            thousands(repeats)
        ));
    }
    if suppressed > 0 {
        parts.push(format!(
            "{} came over the OOMSHIM_MAX_DUMPS cap",
            thousands(suppressed)
        ));
    }
    format!(
        "{} out-of-memory failures after the last dump got no dump of their own: {}",
        thousands(repeats + suppressed),
        parts.join("; ")
    )
}

pub(super) fn say(text: &str) {
    oomshim_host::sys::say::say(&format!("oomshim: {text}"));
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use dump::fixtures::oom_dump;
    use dump::model::FrameworkOom;

    const GIB: u64 = 1 << 30;

    fn written() -> Result<Written, WriteError> {
        Ok(Written {
            path: "/tmp/d/oomshim-h-1-1.json".into(),
            fell_back: None,
        })
    }

    #[test]
    fn two_lines_name_the_top_finding_and_the_dump() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().failures_in_burst = 3;
        d.verdict = oomshim_core::verdict::judge(&d);
        let text = summary_lines(&d, &written()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        // The top finding as the verdict words it (its wording is tested with the verdict).
        let top = &d.verdict.findings[0];
        assert_eq!(top.kind, "own_allocations");
        assert_eq!(
            lines[0],
            format!(
                "oomshim: CUDA out of memory on device 0 (cudaMalloc of 2.00 GiB failed; 3 failures with its retries): \
                 own_allocations: {}",
                top.headline
            )
        );
        assert_eq!(
            lines[1],
            "oomshim:   dump: /tmp/d/oomshim-h-1-1.json  (details: oomshim report /tmp/d/oomshim-h-1-1.json); \
             retry: after_change"
        );
        // No dump written: still two lines, saying why.
        let err = Err(WriteError {
            message: "disk full".into(),
        });
        let text = summary_lines(&d, &err).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(
            text.ends_with("oomshim:   no dump written: disk full; retry: after_change"),
            "{text}"
        );
        // torch's word and failures without a dump are said.
        d.framework = Some(FrameworkOom {
            name: "torch".into(),
            raised: true,
            ..Default::default()
        });
        d.recording.repeated_failures = 2;
        let text = summary_lines(&d, &written()).unwrap();
        assert!(
            text.starts_with(
                "oomshim: CUDA out of memory on device 0 (cudaMalloc of 2.00 GiB failed; 3 failures with its retries; \
                 torch raised OutOfMemoryError; 2 earlier failures without a dump): own_allocations"
            ),
            "{text}"
        );
        // Requests that recovered just before it are part of its story.
        d.failed_request.as_mut().unwrap().recovered_before = 1;
        let text = summary_lines(&d, &written()).unwrap();
        assert!(
            text.contains(
                "torch raised OutOfMemoryError; 1 earlier request recovered just before; 2 earlier"
            ),
            "{text}"
        );
        d.failed_request.as_mut().unwrap().recovered_before = 1200;
        let text = summary_lines(&d, &written()).unwrap();
        assert!(
            text.contains("; 1,200 earlier requests recovered just before;"),
            "{text}"
        );
    }

    #[test]
    fn a_recovered_failure_is_one_quiet_line() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().recovered = Some(true);
        d.verdict = oomshim_core::verdict::judge(&d);
        let text = summary_lines(&d, &written()).unwrap();
        assert_eq!(
            text,
            "oomshim: cudaMalloc of 2.00 GiB on device 0 failed, then its retry succeeded (recovered); \
             dump: /tmp/d/oomshim-h-1-1.json"
        );
        d.failed_request = None;
        assert!(summary_lines(&d, &written()).is_none());
    }

    #[test]
    fn failures_without_a_dump_are_said_in_one_line() {
        assert_eq!(
            without_dump_line(3, 0),
            "3 out-of-memory failures after the last dump got no dump of their own: 3 repeated an earlier \
             dumped failure within OOMSHIM_MIN_INTERVAL"
        );
        assert!(without_dump_line(1, 5).contains("5 came over the OOMSHIM_MAX_DUMPS cap"));
    }
}
