//! Unit tests of `oomshim_cli::report::diff` (src/cli/report/diff.rs).

use dump::model::Site;
use dump::model::{Dump, Frame};
use dump::read::parse_dump;
use oomshim_cli::report::diff::*;
use std::path::Path;

fn fixture() -> Dump {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom_own_allocations.json");
    parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
}

fn frame(function: &str, line: u32, address: &str) -> Frame {
    Frame {
        address: address.into(),
        function: Some(function.into()),
        file: Some("/src/train.c".into()),
        line: Some(line),
        ..Frame::default()
    }
}

#[test]
fn sites_match_by_symbols_not_addresses_and_growth_comes_first() {
    let mut a = fixture();
    let mut b = fixture();
    a.sites = vec![
        Site {
            bytes: 100,
            count: 1,
            stack: vec![frame("leak", 10, "0x1000")],
        },
        Site {
            bytes: 500,
            count: 5,
            stack: vec![frame("steady", 20, "0x2000")],
        },
        Site {
            bytes: 80,
            count: 2,
            stack: vec![frame("shrinks", 30, "0x3000")],
        },
    ];
    // Same functions at other addresses (another run), one new site.
    b.sites = vec![
        Site {
            bytes: 900,
            count: 9,
            stack: vec![frame("leak", 10, "0x7000")],
        },
        Site {
            bytes: 500,
            count: 5,
            stack: vec![frame("steady", 20, "0x8000")],
        },
        Site {
            bytes: 20,
            count: 1,
            stack: vec![frame("shrinks", 30, "0x9000")],
        },
        Site {
            bytes: 50,
            count: 1,
            stack: vec![frame("new_site", 40, "0xa000")],
        },
    ];
    let d = diff(&a, &b);
    assert_eq!(d.sites.len(), 4, "{:?}", d.sites);
    assert!(d.sites[0].label.starts_with("leak"));
    assert_eq!(d.sites[0].delta(), 800);
    assert_eq!((d.sites[0].before_count, d.sites[0].after_count), (1, 9));
    assert!(d.sites[1].label.starts_with("new_site"));
    assert!(d.sites[3].label.starts_with("shrinks"));
    assert_eq!(d.sites[3].delta(), -60);
    assert!(d.warning.is_none());
    let text = render_diff(&d, 10);
    assert!(text.contains("+800 B") && text.contains("-60 B"), "{text}");
    assert!(
        !text.contains("steady"),
        "unchanged sites are not listed: {text}"
    );
    let j = diff_json(&d, 2);
    assert_eq!(j["sites"].as_array().unwrap().len(), 2);
    assert_eq!(j["sites"][0]["delta_bytes"], 800);
}

#[test]
fn different_programs_are_flagged() {
    let a = fixture();
    let mut b = fixture();
    b.process.command_line = vec!["other".into()];
    assert!(diff(&a, &b)
        .warning
        .unwrap()
        .contains("different command lines"));
}
