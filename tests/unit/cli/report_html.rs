//! Unit tests of `oomshim_cli::report::html` (src/cli/report/html.rs).

use super::fixtures::{fixture_names, load_fixture};
use oomshim_cli::report::html::*;
use serde_json::{json, Value};

/// The keys of `part` (an object), each with the value `whole` has for it.
fn assert_within(part: &Value, whole: &Value, what: &str) {
    let part = part
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object"));
    assert!(!part.is_empty(), "{what}: empty");
    for (k, v) in part {
        if k == "stack" || k == "histogram" {
            continue; // interned stacks and compact rows: the page's own encoding
        }
        assert_eq!(Some(v), whole.get(k), "{what}.{k}");
    }
}

/// The page and the JSON report say the same of what both show: the process, the failed
/// request, each device, the free blocks, the recording and the verdict.
#[test]
fn the_page_and_the_json_report_agree_on_what_both_show() {
    let opts = oomshim_cli::report::ReportOptions {
        top: usize::MAX,
        color: false,
    };
    for name in fixture_names() {
        let dump = load_fixture(name);
        let page = html_payload(&dump);
        let report = oomshim_cli::report::json::render_json(&dump, &opts);
        assert_within(&page["process"], &report["header"], name);
        assert_eq!(page["verdict"], report["verdict"], "{name}");
        assert_eq!(
            page["failed_request"].is_null(),
            report["failed_request"].is_null()
        );
        if !page["failed_request"].is_null() {
            assert_within(&page["failed_request"], &report["failed_request"], name);
        }
        let devices = page["devices"].as_array().unwrap();
        assert_eq!(devices.len(), report["devices"].as_array().unwrap().len());
        for (p, r) in devices.iter().zip(report["devices"].as_array().unwrap()) {
            assert_within(p, r, name);
        }
        assert_within(&page["free_blocks"], &report["free_blocks"], name);
        assert_within(&page["recording"], &report["recording"], name);
        assert_eq!(page["pinned_host"], report["pinned_host"], "{name}");
    }
}

#[test]
fn json_is_script_safe_and_round_trips() {
    let v = json!({"f": "</script><script>alert(1)</script> & <!-- \u{2028}"});
    let s = script_safe_json(&v);
    assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'));
    let back: Value = serde_json::from_str(&s).unwrap();
    assert_eq!(back, v);
}

#[test]
fn fixtures_render_with_interned_stacks() {
    for name in fixture_names() {
        let dump = load_fixture(name);
        let p = html_payload(&dump);
        assert_eq!(
            p["holders"].as_array().unwrap().len(),
            dump.largest_holders.len()
        );
        let stacks = p["stacks"].as_array().unwrap().len();
        for h in p["holders"].as_array().unwrap() {
            assert!((h[9].as_u64().unwrap() as usize) < stacks);
        }
        let page = render_html(&dump);
        assert!(page.contains("id=\"oomshim-data\""));
        assert_eq!(page.matches("</script>").count(), 2, "{name}");
    }
}
