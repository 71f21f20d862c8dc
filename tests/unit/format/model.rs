//! Unit tests of `dump::model` (src/format/model.rs).

use dump::model::{Finding, Verdict};

#[test]
fn a_verdicts_headline_is_its_top_findings_else_its_summary() {
    let mut v = Verdict {
        kind: "own_allocations".into(),
        summary: "The summary.".into(),
        ..Verdict::default()
    };
    assert_eq!(v.headline(), "The summary.");
    for headline in ["first", "second"] {
        v.findings.push(Finding {
            headline: headline.into(),
            ..Finding::default()
        });
    }
    assert_eq!(v.headline(), "first");
}
