//! Unit tests of `oomshim_cli::report::model` (src/cli/report/model.rs).

use super::fixtures::{fixture_names, load_fixture};
use dump::model::{Growth, Verdict};
use oomshim_cli::report::model::*;

#[test]
fn the_model_judges_with_the_current_rules_and_every_reporter_shows_that_verdict() {
    // What each fixture is a case of, by the current rules.
    let expected = [
        ("oom_own_allocations", "own_allocations"),
        ("oom_untracked", "untracked_memory"),
        ("oom_request_exceeds_device", "request_exceeds_device"),
        ("oom_fragmentation", "fragmentation"),
        ("snapshot", "snapshot"),
        ("minimal_unavailable", "untracked_memory"),
    ];
    assert_eq!(expected.len(), fixture_names().len());
    let opts = oomshim_cli::report::ReportOptions {
        top: 5,
        color: false,
    };
    for (name, kind) in expected {
        let mut dump = load_fixture(name);
        // As an older shim would have written it: its rules said something else.
        dump.verdict = Verdict {
            kind: "stale_rules".into(),
            summary: "what an older shim concluded".into(),
            ..Verdict::default()
        };
        let m = ReportModel::new(&dump);
        assert_eq!(m.verdict.kind, kind, "{name}");
        let json = oomshim_cli::report::json::render(&m, &opts);
        assert_eq!(json["verdict"]["kind"], kind, "{name}");
        assert_eq!(json["recorded_verdict"]["kind"], "stale_rules", "{name}");
        let payload = oomshim_cli::report::html::payload(&m);
        assert_eq!(payload["verdict"]["kind"], kind, "{name}");
        let text = oomshim_cli::report::terminal::render(&m, &opts);
        assert!(
            text.contains(&format!("Verdict: {kind}")),
            "{name}:\n{text}"
        );
        assert!(!text.contains("what an older shim concluded"), "{name}");
        assert!(
            text.contains("(the shim recorded verdict stale_rules"),
            "{name}:\n{text}"
        );
    }
}

#[test]
fn the_model_ranks_holders_and_sites_largest_first() {
    for name in fixture_names() {
        let dump = load_fixture(name);
        let m = ReportModel::new(&dump);
        assert_eq!(m.holders.len(), dump.largest_holders.len());
        assert!(m.holders.windows(2).all(|w| w[0].bytes >= w[1].bytes));
        assert_eq!(m.sites.len(), dump.sites.len());
        assert!(m
            .sites
            .windows(2)
            .all(|w| w[0].site.bytes >= w[1].site.bytes));
        assert_eq!(
            matches!(m.occasion, Occasion::OutOfMemory(_)),
            dump.failed_request.is_some()
        );
        assert_eq!(
            m.free_blocks.available,
            dump.free_blocks.source != "unavailable"
        );
    }
}

#[test]
fn growth_is_drawn_against_the_failing_device_else_the_largest() {
    let mut dump = load_fixture("oom_own_allocations");
    dump.growth = Some(Growth::default());
    let mut second = dump.devices[0].clone();
    second.index = 7;
    second.total_bytes = Some(u64::MAX);
    dump.devices.push(second);
    let failing = dump.devices[0].total_bytes;
    assert_eq!(
        ReportModel::new(&dump).growth.unwrap().capacity_bytes,
        failing
    );
    dump.failed_request = None;
    assert_eq!(
        ReportModel::new(&dump).growth.unwrap().capacity_bytes,
        Some(u64::MAX)
    );
}

#[test]
fn recovery_words() {
    assert_eq!(Recovery::from_recovered(Some(true)).word(), "recovered");
    assert_eq!(Recovery::from_recovered(Some(false)).word(), "stood");
    assert_eq!(Recovery::from_recovered(None).word(), "unknown");
}
