//! The sentences a user reads (the verdict's and each finding's headline, summary, evidence and
//! suggestions, the retry's reason) are single-spaced in every report: a format string whose
//! line continuation kept the next line's indentation reads as a hole in the sentence, on the
//! stderr line, in the JSON and on the page. The dumps: the suite's fixtures, the demo's, and two
//! shapes no fixture has, each a leak whose words are written apart (growth over time, and a
//! forward hook of the program that keeps its outputs).

use crate::common;

use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// What `oomshim ARGS...` printed; fails unless it succeeded.
fn cli_output<I: AsRef<OsStr>>(args: impl IntoIterator<Item = I>) -> String {
    common::succeeded(&common::cli().args(args).output().unwrap())
}

/// `tests/fixtures/oom_leak_steps.json` changed by `edit`, written into `dir` as `name`.
fn edited_leak(dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom_leak_steps.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(base).unwrap()).unwrap();
    edit(&mut v);
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    path
}

/// The lines of a text report that are wrapped sentences: the first screen's from `Verdict:` to
/// its end (the verdict, the change; not the device's chart and legend above) and the `Why:`
/// section's, their indentation and list marks taken off.
fn prose_lines(text: &str) -> Vec<&str> {
    let first = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .skip_while(|l| !l.starts_with("Verdict:"));
    let why = text
        .lines()
        .skip_while(|l| !l.starts_with("Why:"))
        .take_while(|l| !l.trim().is_empty());
    first
        .chain(why)
        .map(|l| l.trim_start().trim_start_matches("- "))
        .collect()
}

#[test]
fn every_sentence_of_every_report_is_single_spaced() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut dumps: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".json") && !name.contains(".report.")
        })
        .collect();
    dumps.sort();
    let demo = dir.path().join("demo");
    cli_output([OsStr::new("demo"), OsStr::new("--dir"), demo.as_os_str()]);
    let demo_dumps = common::dump_files(&demo);
    assert!(!demo_dumps.is_empty(), "the demo wrote no dump");
    dumps.extend(demo_dumps);
    // A leak judged over time (a program that marks no steps): the summary says how the growth
    // was fitted from the allocations' own timestamps.
    dumps.push(edited_leak(dir.path(), "over_time.json", |v| {
        let g = &mut v["growth"];
        g["unit"] = json!("second");
        g["steps"] = json!("timeline");
        g["sites"][0]["share"] = json!(1.0);
        g["timeline"] = json!({"age_ms": 2700, "span_ms": 2700, "allocations": 90,
            "freed": 0, "freed_all": 0, "quiet_ms": 20});
    }));
    // A leak per step kept by the program's own forward hook: a suggestion says what to store
    // instead.
    dumps.push(edited_leak(dir.path(), "forward_hook.json", |v| {
        v["framework"] = json!({"name": "torch", "raised": true, "kinds": {"forward_hooks": [
            {"function": "keep", "file": "train.py", "line": 12, "module": "fc"}]}});
    }));
    for path in &dumps {
        let what = path.display().to_string();
        let json = cli_output([OsStr::new("report"), OsStr::new("--json"), path.as_os_str()]);
        let report: Value = serde_json::from_str(&json).unwrap();
        common::assert_single_spaced(&report, &what);
        let text = cli_output([OsStr::new("report"), path.as_os_str()]);
        let prose = prose_lines(&text);
        assert!(prose.len() >= 2, "{what}: no verdict and why in\n{text}");
        let holes: Vec<&str> = prose
            .into_iter()
            .filter(|l| l.trim_end().contains("  "))
            .collect();
        assert!(holes.is_empty(), "{what}: {holes:#?}\n{text}");
    }
    // The two edited dumps reached the words they were made for.
    let words = |name: &str| {
        let path = dir.path().join(name);
        cli_output([OsStr::new("report"), OsStr::new("--json"), path.as_os_str()])
    };
    assert!(words("over_time.json").contains("fitted from the live allocations' own timestamps"));
    assert!(words("forward_hook.json").contains("runs on every forward pass"));
}
