//! The documentation cannot drift from the code: every relative link and anchor of README.md and
//! docs/ resolves; every `OOMSHIM_*` name the documents mention is read by the code, and every
//! setting the code reads is in docs/configuration.md; every subcommand and flag of `--help` is
//! in the user guide's command reference and nothing there is missing from `--help`; the outputs
//! pasted into the documents are the demo's (scripts/doc-outputs); and a number that appears in
//! more than one place (the Rust version, measured build times) is one number.

use crate::common;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page of docs/, as (path relative to the root, text).
fn documents() -> Vec<(String, String)> {
    let mut paths = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    paths.extend(pages);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root().join(&p)).unwrap();
            (p, text)
        })
        .collect()
}

/// The text outside fenced code blocks, line by line (code is quoted output, not links).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A line without its inline code spans (`` `a](b)` `` is not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if !in_code {
            out.push(c);
        } else {
            out.push(' ');
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped, spaces
/// as `-`; a repeated heading gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The `(target)` of every Markdown link and image on a line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let docs = documents();
    let anchors_of: BTreeMap<PathBuf, BTreeSet<String>> = docs
        .iter()
        .map(|(p, t)| (root().join(p), anchors(t)))
        .collect();
    let mut broken = Vec::new();
    for (path, text) in &docs {
        let dir = root().join(path).parent().unwrap().to_path_buf();
        for (n, line) in prose_lines(text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, fragment) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if file.is_empty() {
                    root().join(path)
                } else {
                    normalise(&dir.join(file))
                };
                if !file.exists() {
                    broken.push(format!("{path}:{n}: {target}: no such file"));
                    continue;
                }
                if let Some(fragment) = fragment {
                    match anchors_of.get(&file) {
                        Some(a) if a.contains(fragment) => {}
                        Some(_) => broken.push(format!("{path}:{n}: {target}: no such heading")),
                        None => {
                            broken.push(format!("{path}:{n}: {target}: anchor into a non-document"))
                        }
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn the_link_checker_finds_what_it_must() {
    // The checker itself: an anchor with punctuation, a repeated heading, a link in code.
    let a = anchors(
        "# The report JSON: `oomshim.report/1`\n## Notes\n## Notes\n```\n# not a heading\n```\n",
    );
    assert!(a.contains("the-report-json-oomshimreport1"), "{a:?}");
    assert!(a.contains("notes") && a.contains("notes-1"), "{a:?}");
    assert!(!a.contains("not-a-heading"), "{a:?}");
    assert_eq!(
        link_targets("see [x](a.md#b) and `[y](c.md)` and ![i](d.png)"),
        ["a.md#b", "d.png"]
    );
}

use oomshim_core::config::setting_names_in as setting_names;

/// Every `OOMSHIM_` name in the code (sources, scripts, tests, CI), Markdown left out.
fn names_in_code() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack: Vec<PathBuf> = [
        "src", "shim", "tests", "benches", "scripts", ".ci", "build.rs",
    ]
    .iter()
    .map(|p| root().join(p))
    .collect();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for e in std::fs::read_dir(&path).unwrap() {
                stack.push(e.unwrap().path());
            }
            continue;
        }
        if path.extension().is_some_and(|e| e == "md") || path.ends_with("tests/docs.rs") {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(&path) {
            out.extend(setting_names(&text));
        }
    }
    out
}

#[test]
fn every_setting_is_documented_and_every_documented_name_is_read() {
    let configuration = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let settings: BTreeSet<&str> = oomshim_core::config::SETTINGS
        .iter()
        .map(|s| s.name)
        .collect();
    // Every setting has its row in the configuration page (src/core/config.rs keeps the rows
    // equal to SETTINGS, and SETTINGS equal to what the code reads).
    let missing: Vec<&&str> = settings
        .iter()
        .filter(|s| !configuration.contains(&format!("| `{s}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "settings without a row in docs/configuration.md: {missing:?}"
    );
    // Every name the documents mention is a setting, or a name the tests, benches or scripts
    // read (OOMSHIM_TEST_*, OOMSHIM_BENCH_*, OOMSHIM_GPU_*): nothing documented is unread.
    let read = names_in_code();
    let mut unread = Vec::new();
    for (path, text) in documents() {
        for name in setting_names(&text) {
            if !settings.contains(name.as_str()) && !read.contains(&name) {
                unread.push(format!("{path}: {name}"));
            }
        }
    }
    assert!(
        unread.is_empty(),
        "documented but read by no code:\n{}",
        unread.join("\n")
    );
    // And a setting is documented as one only in the configuration page's table: a name that
    // is neither a setting nor read by the code was caught above; one that the code reads but
    // that is no setting must not be in the table.
    for name in setting_names(&configuration) {
        if configuration.contains(&format!("| `{name}` |")) {
            assert!(
                settings.contains(name.as_str()),
                "{name} has a row but is no setting"
            );
        }
    }
}

/// `oomshim ARGS --help` as text.
fn help(args: &[&str]) -> String {
    let out = common::cli().args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "oomshim {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `oomshim --help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let text = help(&[]);
    let mut out = Vec::new();
    let mut in_commands = false;
    for line in text.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap_or("");
            if name != "help" && !name.is_empty() {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// The long flags a subcommand's `--help` lists under Options (without `--help`/`--version`).
fn flags(sub: &str) -> BTreeSet<String> {
    let text = help(&[sub]);
    let mut out = BTreeSet::new();
    let mut in_options = false;
    for line in text.lines() {
        if line.starts_with("Options:") {
            in_options = true;
            continue;
        }
        if in_options {
            if !line.starts_with(' ') && !line.is_empty() {
                break;
            }
            let item = line
                .trim_start()
                .trim_start_matches("-h, ")
                .trim_start_matches("-V, ");
            if let Some(flag) = item.strip_prefix("--") {
                let flag: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if flag != "help" && flag != "version" {
                    out.insert(format!("--{flag}"));
                }
            }
        }
    }
    out
}

/// The user guide's command reference: `### \`oomshim SUB\`` headings and the text below each.
fn command_reference() -> BTreeMap<String, String> {
    let guide = std::fs::read_to_string(root().join("docs/user-guide.md")).unwrap();
    let start = guide
        .find("\n## Command reference\n")
        .expect("docs/user-guide.md has a section \"Command reference\"");
    let section = &guide[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut out = BTreeMap::new();
    for part in section[..end].split("\n### ").skip(1) {
        let (heading, body) = part.split_once('\n').unwrap_or((part, ""));
        let Some(name) = heading
            .trim()
            .strip_prefix("`oomshim ")
            .and_then(|h| h.split([' ', '`']).next())
        else {
            continue;
        };
        out.insert(name.to_string(), body.to_string());
    }
    out
}

/// The flags a reference entry documents: its bullet items that start with one,
/// `` - `--flag VALUE`: what it does ``.
fn documented_flags(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("- `--"))
        .map(|rest| {
            let flag: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            format!("--{flag}")
        })
        .collect()
}

#[test]
fn every_subcommand_and_flag_of_the_help_is_in_the_command_reference() {
    let reference = command_reference();
    let subs = subcommands();
    assert!(subs.len() >= 8, "parsed too few subcommands: {subs:?}");
    let mut problems = Vec::new();
    for sub in &subs {
        let Some(body) = reference.get(sub) else {
            problems.push(format!(
                "oomshim {sub}: no `### \\`oomshim {sub}\\`` in the reference"
            ));
            continue;
        };
        let in_help = flags(sub);
        let documented = documented_flags(body);
        for f in in_help.difference(&documented) {
            problems.push(format!(
                "oomshim {sub} {f}: in --help, not in the reference"
            ));
        }
        for f in documented.difference(&in_help) {
            problems.push(format!(
                "oomshim {sub} {f}: in the reference, not in --help"
            ));
        }
    }
    for sub in reference.keys() {
        if !subs.contains(sub) {
            problems.push(format!("oomshim {sub}: in the reference, not a subcommand"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_pasted_outputs_are_the_demos() {
    if !common::require("python3") {
        return;
    }
    let out = std::process::Command::new("python3")
        .arg(root().join("scripts/doc-outputs"))
        .arg("--check")
        .arg("--oomshim")
        .arg(env!("CARGO_BIN_EXE_oomshim"))
        .env("OOMSHIM_LIB", common::shim_lib())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/doc-outputs --check: the outputs pasted into the documents are not the demo's \
         (run scripts/doc-outputs to paste them again):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The workspace's `rust-version` in Cargo.toml.
fn rust_version() -> String {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("Cargo.toml has rust-version")
        .to_string()
}

/// Every `<!-- number:NAME -->VALUE<!-- /number -->` in a text, as (NAME, VALUE, byte range);
/// a marker left open has the value `(no end marker)`, which no source equals.
fn numbers(text: &str) -> Vec<(String, String, std::ops::Range<usize>)> {
    const OPEN: &str = "<!-- number:";
    const CLOSE: &str = "<!-- /number -->";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(OPEN) {
        let start = at + i;
        let after = start + OPEN.len();
        let (Some(name_len), Some(value_at)) = (
            text[after..].find(" -->"),
            text[after..].find(" -->").map(|n| after + n + " -->".len()),
        ) else {
            out.push((String::new(), "(no end marker)".into(), start..text.len()));
            break;
        };
        let name = text[after..after + name_len].to_string();
        match text[value_at..].find(CLOSE) {
            Some(n) => {
                let end = value_at + n + CLOSE.len();
                out.push((name, text[value_at..value_at + n].to_string(), start..end));
                at = end;
            }
            None => {
                out.push((name, "(no end marker)".into(), start..text.len()));
                break;
            }
        }
    }
    out
}

/// Places where a Rust version is written in `text` (outside the number markers): `1.NN` within
/// a few words after `Rust`, `cargo` or `rustc`.
fn loose_rust_versions(text: &str, marked: &[std::ops::Range<usize>]) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices("1.") {
        let digits = bytes[i + 2..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits != 2 || (i > 0 && (bytes[i - 1].is_ascii_digit() || bytes[i - 1] == b'.')) {
            continue;
        }
        if marked.iter().any(|r| r.contains(&i)) {
            continue;
        }
        let before = &text[text[..i].char_indices().rev().nth(30).map_or(0, |(j, _)| j)..i];
        if ["Rust", "cargo", "rustc"]
            .iter()
            .any(|w| before.contains(w))
        {
            out.push(text[i..i + 4].to_string());
        }
    }
    out
}

#[test]
fn numbers_that_appear_twice_come_from_one_place() {
    let rust = rust_version();
    let mut values: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut problems = Vec::new();
    for (path, text) in documents() {
        let marked = numbers(&text);
        for (name, value, _) in &marked {
            values
                .entry(name.clone())
                .or_default()
                .push((path.clone(), value.clone()));
        }
        let ranges: Vec<_> = marked.iter().map(|(_, _, r)| r.clone()).collect();
        for loose in loose_rust_versions(&text, &ranges) {
            problems.push(format!(
                "{path}: Rust version {loose} written without <!-- number:rust-version -->"
            ));
        }
    }
    for (name, places) in &values {
        let source = if name == "rust-version" {
            rust.clone()
        } else {
            // A measured figure's one place is the performance page.
            match places.iter().find(|(p, _)| p == "docs/performance.md") {
                Some((_, v)) => v.clone(),
                None => {
                    problems.push(format!(
                        "{name}: not in docs/performance.md, where figures are measured"
                    ));
                    continue;
                }
            }
        };
        for (path, value) in places {
            if *value != source {
                problems.push(format!(
                    "{path}: {name} is {value}, its source says {source}"
                ));
            }
        }
    }
    // The build backend reads the version from Cargo.toml instead of writing it again.
    let backend = std::fs::read_to_string(root().join("scripts/pep517/oomshim_build.py")).unwrap();
    for loose in loose_rust_versions(&backend, &[]) {
        problems.push(format!(
            "scripts/pep517/oomshim_build.py: Rust version {loose} written out (read Cargo.toml)"
        ));
    }
    assert!(
        values.contains_key("rust-version"),
        "the README states the Rust version with <!-- number:rust-version -->"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_number_checker_finds_loose_copies() {
    let text = "needs Rust 1.88 or newer; <!-- number:rust-version -->1.92<!-- /number -->, cargo 1.92+, 11.0";
    let marked = numbers(text);
    assert_eq!(marked.len(), 1);
    assert_eq!(marked[0].1, "1.92");
    let ranges: Vec<_> = marked.iter().map(|(_, _, r)| r.clone()).collect();
    assert_eq!(loose_rust_versions(text, &ranges), ["1.88", "1.92"]);
    let open = numbers("a <!-- number:x -->3 s and no end");
    assert_eq!(open[0].1, "(no end marker)");
}
