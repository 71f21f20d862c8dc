//! The layers of the source tree, kept by reading each file's `crate::` paths (outside
//! `#[cfg(test)]` modules and comments). Arrows point down or sideways within a layer, never up;
//! no two top-level modules import each other, directly or around a circle; nothing imports the
//! hooks (`ffi`). A re-export at an old path is an arrow like any other, so it may only stand in
//! the upper module (`report` re-exporting `dump::units`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every top-level module and its layer, lowest first. A new module must be placed here.
const LAYERS: &[(&str, &[&str])] = &[
    // Imports nothing of ours.
    ("base", &["signals", "own_fd"]),
    // The dump file: schema, reading, writing, units, the shared views of its contents.
    ("format", &["dump"]),
    // Plain Rust testable without CUDA, and the process plumbing the live shim runs through.
    (
        "core",
        &[
            "sys", "config", "ledger", "alloc", "stacks", "pystack", "facts", "verdict",
        ],
    ),
    // Inside the host program: the hooks and the live state.
    ("live", &["runtime", "ffi", "pyhook", "flight"]),
    // The command line; reporters read dumps only.
    ("cli", &["cli", "report", "testbed", "bin"]),
];

/// Imported by nobody: the C ABI sits on top of everything that runs in the host program.
const IMPORTED_BY_NOBODY: &[&str] = &["ffi"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// The source without comments and without `#[cfg(test)]` items that are braced modules.
fn strip(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let code = match line.find("//") {
            // A `//` inside a string literal ("http://…") cuts the line short: fine here, it can
            // only hide code after the string, never invent a path.
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    let mut result = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        result.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_mod = item.starts_with("mod ")
            || item.starts_with("pub mod ")
            || item.starts_with("pub(crate) mod ");
        let braced = item
            .find('{')
            .zip(item.find(';'))
            .map_or(item.contains('{'), |(b, s)| b < s);
        if is_mod && braced {
            let open = after.find('{').unwrap();
            let mut depth = 0usize;
            let mut end = after.len();
            for (i, c) in after[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    result.push_str(rest);
    result
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a file's code names: `crate::m…`, `use crate::{m, n::…}`, and, in a
/// file that is itself a top-level module, `super::m`. Paths that name no module (a macro at the
/// crate root) are left out by the caller.
fn named_modules(code: &str, file_is_top_level: bool) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    let mut scan = |prefix: &str| {
        let mut from = 0;
        while let Some(i) = code[from..].find(prefix) {
            let at = from + i;
            from = at + prefix.len();
            // `$crate::` is a macro's own path, resolved where the macro is defined.
            if prefix == "crate::" && code[..at].ends_with('$') {
                continue;
            }
            // Not the tail of a longer identifier (`my_crate::`).
            if code[..at]
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            let rest = &code[from..];
            let shown = code[at..].lines().next().unwrap_or("").trim().to_string();
            if let Some(group) = rest.strip_prefix('{') {
                let close = group.find('}').unwrap_or(group.len());
                // Nested groups: the first names of each comma-separated item are what counts.
                for item in group[..close + 1].split(',') {
                    let name = ident_at(item.trim().trim_start_matches('{'));
                    if !name.is_empty() {
                        found.insert((name.to_string(), shown.clone()));
                    }
                }
            } else {
                let name = ident_at(rest);
                if !name.is_empty() {
                    found.insert((name.to_string(), shown));
                }
            }
        }
    };
    scan("crate::");
    if file_is_top_level {
        scan("super::");
    }
    found
}

/// Every cross-module arrow: (from module, to module, file, the line that names it).
fn arrows(src_dir: &Path) -> Vec<(String, String, String, String)> {
    let mut files = Vec::new();
    let mut stack = vec![src_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    let known: BTreeSet<&str> = LAYERS.iter().flat_map(|(_, m)| m.iter().copied()).collect();
    let mut out = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(src_dir)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "lib.rs" {
            continue; // declares the modules; imports none
        }
        let module = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        assert!(
            known.contains(module.as_str()),
            "src/{rel}: module `{module}` is in no layer of tests/layers.rs; place it there"
        );
        let top_level =
            !rel.contains('/') || rel.matches('/').count() == 1 && rel.ends_with("/mod.rs");
        let code = strip(&std::fs::read_to_string(&file).unwrap());
        for (target, line) in named_modules(&code, top_level) {
            if target != module && known.contains(target.as_str()) {
                out.push((module.clone(), target, format!("src/{rel}"), line));
            }
        }
    }
    out
}

/// What is wrong with a set of arrows, one line per offence.
fn offences(arrows: &[(String, String, String, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to, file, line) in arrows {
        if IMPORTED_BY_NOBODY.contains(&to.as_str()) {
            bad.push(format!("{file}: `{to}` is imported by nobody, yet: {line}"));
        }
        let (lf, lt) = (layer_of(from).unwrap(), layer_of(to).unwrap());
        if lt > lf {
            bad.push(format!(
                "{file}: upward arrow {from} ({}) -> {to} ({}): {line}",
                LAYERS[lf].0, LAYERS[lt].0
            ));
        }
        graph.entry(from).or_default().insert(to);
    }
    // Circles between top-level modules: any module that reaches itself.
    for &start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<Vec<&str>> = vec![vec![start]];
        while let Some(path) = todo.pop() {
            let last = *path.last().unwrap();
            for &next in graph.get(last).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.push(start);
                    // Reported once, from its smallest module.
                    if circle.iter().all(|m| *m >= start) {
                        let witnesses: Vec<String> = circle
                            .windows(2)
                            .filter_map(|w| {
                                arrows
                                    .iter()
                                    .find(|a| a.0 == w[0] && a.1 == w[1])
                                    .map(|a| format!("{} ({})", a.2, a.3))
                            })
                            .collect();
                        bad.push(format!(
                            "circle {}: {}",
                            circle.join(" -> "),
                            witnesses.join("; ")
                        ));
                    }
                } else if seen.insert(next) {
                    let mut p = path.clone();
                    p.push(next);
                    todo.push(p);
                }
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn arrows_point_down_and_close_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = arrows(&src);
    // The scan sees the tree's real arrows (a broken scanner finding none would pass anything).
    assert!(
        found.iter().any(|a| a.0 == "verdict" && a.1 == "dump"),
        "the scan found no verdict -> dump arrow; is it reading the sources?"
    );
    let bad = offences(&found);
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

#[test]
fn the_scan_catches_upward_arrows_circles_and_ffi_imports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("dump")).unwrap();
    std::fs::write(
        src.join("dump/read.rs"),
        "// crate::cli in a comment does not count\nuse crate::report::units::clean;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("verdict.rs"),
        "use crate::{dump::model::Dump, facts::Relation, ffi};\n#[cfg(test)]\nmod tests {\n    use crate::cli;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("facts.rs"),
        "fn f() { crate::verdict::judge(); }\n",
    )
    .unwrap();
    std::fs::write(src.join("report.rs"), "pub use crate::dump::units;\n").unwrap();
    let bad = offences(&arrows(src));
    let text = bad.join("\n");
    assert!(
        text.contains("src/dump/read.rs: upward arrow dump (format) -> report (cli)"),
        "{text}"
    );
    assert!(
        text.contains("src/verdict.rs: `ffi` is imported by nobody"),
        "{text}"
    );
    assert!(
        text.contains("src/verdict.rs: upward arrow verdict (core) -> ffi (live)"),
        "{text}"
    );
    assert!(text.contains("circle facts -> verdict -> facts"), "{text}");
    assert!(
        !text.contains("-> cli"),
        "comments and test modules count: {text}"
    );
    // report -> dump is downward: not an offence.
    assert!(!text.contains("src/report.rs: upward"), "{text}");
}
