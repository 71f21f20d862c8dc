//! The layers of the source tree. The workspace's crates are the layers, lowest first: the dump
//! format (`src/format`, named `dump`), the core (`src/core`), the shim's machinery inside the
//! host program (`src/host`), the preload shim (`src/preload`, the crate `oomshim` that builds
//! liboomshim.so) and the CLI (`src/cli`, which names neither of the two above the core). Cargo refuses an import
//! of a crate that is not a dependency, so this test keeps the dependencies themselves pointing
//! down (each crate's Cargo.toml), keeps the CLI from naming the preload crate it depends on only
//! so that building the CLI builds the shim, and, inside each crate, keeps its top-level modules
//! free of circles and `ffi` imported by nobody, and the files of each crate free of circles
//! too: two files that use each other, directly or around a ring, are one piece of code in two
//! places, and that holds for a folder's `mod.rs` and its own files as for any two (a `mod.rs`
//! that declares files and holds what they use is the same knot; what they share goes in a file
//! of its own). Some arrows must never exist ([`NEVER`]). It reads each file's paths outside
//! comments, visibility restrictions (`pub(in crate::x)`) and `#[cfg(test)]` modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// (directory, the name other crates use for it, its package name, the crates it may name).
const CRATES: &[(&str, &str, &str, &[&str])] = &[
    ("src/format", "dump", "oomshim-format", &[]),
    ("src/core", "oomshim_core", "oomshim-core", &["dump"]),
    (
        "src/host",
        "oomshim_host",
        "oomshim-host",
        &["dump", "oomshim_core"],
    ),
    (
        "src/preload",
        "oomshim",
        "oomshim-preload",
        &["dump", "oomshim_core", "oomshim_host"],
    ),
    // The CLI depends on the preload crate only to build it: its code never names it.
    (
        "src/cli",
        "oomshim_cli",
        "oomshim",
        &["dump", "oomshim_core"],
    ),
];

/// Inside its crate, imported by nobody: the C ABI sits on top of everything in the host program.
const IMPORTED_BY_NOBODY: &[&str] = &["ffi"];

/// Circles between files that are known and not yet broken: (crate dir, the files' module paths,
/// sorted). None is left; any circle fails, and so would an entry here once its circle is gone.
const KNOWN_FILE_CIRCLES: &[(&str, &[&str])] = &[];

/// Arrows between files that must never exist: (crate dir, from: a module path, or every module
/// under one when it ends in `::`, to: the modules it may *not* name, as the same patterns,
/// except those listed, why).
type Never = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
);

/// The preload crate's modules, every one: what `cuda` and `state`, its floor, may never name.
const PRELOAD_MODULES: &[&str] = &[
    "allocator_mode",
    "allocator_mode::",
    "cuda",
    "cuda::",
    "failure",
    "failure::",
    "ffi",
    "ffi::",
    "fork",
    "publish",
    "record",
    "record::",
    "shim",
    "state",
];

/// What the preload crate's failure path may never name: the hooks, the shim and allocator
/// mode above it (what it reads of the shim comes through `failure::recorder`).
const ABOVE_FAILURE: &[&str] = &["ffi", "ffi::", "shim", "allocator_mode", "allocator_mode::"];

/// What the preload crate's recording may never name: all of [`ABOVE_FAILURE`], and the failure
/// path beside it (a failure reads growth only through what the shim puts in its capture).
const ABOVE_RECORD: &[&str] = &[
    "ffi",
    "ffi::",
    "shim",
    "allocator_mode",
    "allocator_mode::",
    "failure",
    "failure::",
];

const FAILURE_WHY: &str = "the failure path is below the hooks, the shim and allocator mode";
const RECORD_WHY: &str = "recording never reads the failure path, nor anything above it";
const CUDA_WHY: &str = "cuda/ is CUDA as the shim calls it: it imports nothing of the shim";
const STATE_WHY: &str = "state.rs is the shim's floor: it imports nothing of the shim";
const ALLOCATOR_WHY: &str =
    "allocator mode is below the hooks and the shim (it gets the shim as a Host)";

/// The arrows that must never exist. `ffi` is named by nobody ([`IMPORTED_BY_NOBODY`], checked
/// between top-level modules, which covers every file).
const NEVER: &[Never] = &[
    ("src/preload", "failure", ABOVE_FAILURE, &[], FAILURE_WHY),
    ("src/preload", "failure::", ABOVE_FAILURE, &[], FAILURE_WHY),
    ("src/preload", "record", ABOVE_RECORD, &[], RECORD_WHY),
    ("src/preload", "record::", ABOVE_RECORD, &[], RECORD_WHY),
    (
        "src/preload",
        "cuda",
        PRELOAD_MODULES,
        &["cuda", "cuda::"],
        CUDA_WHY,
    ),
    (
        "src/preload",
        "cuda::",
        PRELOAD_MODULES,
        &["cuda", "cuda::"],
        CUDA_WHY,
    ),
    ("src/preload", "state", PRELOAD_MODULES, &[], STATE_WHY),
    (
        "src/preload",
        "allocator_mode",
        &["ffi", "ffi::", "shim"],
        &[],
        ALLOCATOR_WHY,
    ),
    (
        "src/preload",
        "allocator_mode::",
        &["ffi", "ffi::", "shim"],
        &[],
        ALLOCATOR_WHY,
    ),
    (
        "src/core",
        "verdict::words::",
        &["verdict", "verdict::"],
        // What the words read: what the rules found, the numbers gathered for them, the sites'
        // labels and the kinds' names; and each other. `words::kinds` still calls the kinds rules
        // (its wording is being changed elsewhere; it moves to the same rule when that lands).
        &[
            "verdict::words",
            "verdict::words::",
            "verdict::found",
            "verdict::context",
            "verdict::sites",
            "verdict::names",
        ],
        "the verdict's words only format what the rules found: no rule is called from words/",
    ),
];

/// `module` matches `pattern`: the module itself, or, for a pattern ending in `::`, any module
/// under it.
fn matches_module(module: &str, pattern: &str) -> bool {
    match pattern.strip_suffix("::") {
        Some(parent) => module.starts_with(parent) && module[parent.len()..].starts_with("::"),
        None => module == pattern,
    }
}

/// The arrows among `arrows` that [`NEVER`]-style rules `never` forbid, one line each.
fn never_offences(arrows: &[FileArrow], never: &[Never]) -> Vec<String> {
    let mut bad = Vec::new();
    for (dir, from, to, line) in arrows {
        for (ndir, nfrom, nto, allowed, why) in never {
            let hit = dir == ndir
                && matches_module(from, nfrom)
                && nto.iter().any(|p| matches_module(to, p))
                && !allowed.iter().any(|p| matches_module(to, p))
                && !(from == "verdict::words::kinds" && to == "verdict::kinds");
            if hit {
                bad.push(format!("{dir}: {from} -> {to} ({line}): {why}"));
            }
        }
    }
    bad
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

/// The crates a file's code names by their extern names (`dump::…`, `oomshim_core::…`).
fn named_crates(code: &str) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (_, name, _, _) in CRATES {
        let needle = format!("{name}::");
        let mut from = 0;
        while let Some(i) = code[from..].find(&needle) {
            let at = from + i;
            from = at + needle.len();
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$')
            {
                continue; // the tail of a longer path or name (`oomshim_core::` holds no `dump::`)
            }
            let shown = code[at..].lines().next().unwrap_or("").trim().to_string();
            found.insert((name.to_string(), shown));
        }
    }
    found
}

/// Writes `text` at `rel` under `root`, making its directories: the made-up trees the scans'
/// own tests run on.
fn write_in_tree(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
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
    files
}

/// An arrow: (crate dir, from module, to module or crate, file, the line that names it).
type Arrow = (String, String, String, String, String);

/// Every arrow of the tree under `root`: between a crate's top-level modules (`crate::m`, and
/// `super::m` in a top-level module's own file), and from a file to another crate (`to` is
/// then that crate's extern name, prefixed with `extern:`).
fn arrows(root: &Path) -> Vec<Arrow> {
    let mut out = Vec::new();
    for (dir, _, _, _) in CRATES {
        let crate_dir = root.join(dir);
        if !crate_dir.is_dir() {
            continue;
        }
        let files = rust_files(&crate_dir);
        let rel_of = |f: &Path| {
            f.strip_prefix(&crate_dir)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        };
        let module_of = |rel: &str| {
            rel.split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string()
        };
        let roots = ["lib.rs", "main.rs"];
        let known: BTreeSet<String> = files
            .iter()
            .map(|f| rel_of(f))
            .filter(|r| !roots.contains(&r.as_str()))
            .map(|r| module_of(&r))
            .collect();
        for file in &files {
            let rel = rel_of(file);
            let shown_file = format!("{dir}/{rel}");
            let code = strip(&std::fs::read_to_string(file).unwrap());
            let is_root = roots.contains(&rel.as_str());
            let module = if is_root {
                "(root)".to_string()
            } else {
                module_of(&rel)
            };
            for (name, line) in named_crates(&code) {
                out.push((
                    dir.to_string(),
                    module.clone(),
                    format!("extern:{name}"),
                    shown_file.clone(),
                    line,
                ));
            }
            if is_root {
                continue; // declares the modules
            }
            let top_level =
                !rel.contains('/') || rel.matches('/').count() == 1 && rel.ends_with("/mod.rs");
            for (target, line) in named_modules(&code, top_level) {
                if target != module && known.contains(&target) {
                    out.push((
                        dir.to_string(),
                        module.clone(),
                        target,
                        shown_file.clone(),
                        line,
                    ));
                }
            }
        }
    }
    out
}

/// A file's module path in its crate: `verdict/words/mod.rs` and `verdict/words.rs` are
/// `["verdict", "words"]`; the crate root (`lib.rs`, `main.rs`) is `[]`.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") || rel == "lib.rs" || rel == "main.rs" {
        parts.pop();
    }
    parts
}

/// The path that starts at byte `at` of `code`: `a::b::c`, or a `use` tree `a::{b, c::{d, e}}`
/// expanded into one path per leaf (`self` in a group names the group's own path; a glob names
/// the path before it). Returns the paths and where the path ends.
fn path_at(code: &str, mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    loop {
        let name = ident_at(&code[at..]);
        if name.is_empty() {
            break;
        }
        segments.push(name.to_string());
        at += name.len();
        if !code[at..].starts_with("::") {
            break;
        }
        at += 2;
        if code[at..].starts_with('{') {
            at += 1;
            let mut paths = Vec::new();
            loop {
                at +=
                    code[at..].len() - code[at..].trim_start_matches([' ', '\n', '\t', ',']).len();
                if at >= code.len() || code[at..].starts_with('}') {
                    at += 1;
                    break;
                }
                if code[at..].starts_with('*') {
                    at += 1;
                    paths.push(segments.clone());
                    continue;
                }
                let (inner, end) = path_at(code, at);
                if end == at {
                    at += 1; // not a path (a stray character): step over it
                    continue;
                }
                at = end;
                for p in inner {
                    let mut full = segments.clone();
                    full.extend(p.into_iter().filter(|s| s != "self"));
                    paths.push(full);
                }
                // `x as y`: the alias names nothing new here.
                let rest = code[at..].trim_start();
                if let Some(alias) = rest.strip_prefix("as ") {
                    let alias = alias.trim_start();
                    at = code.len() - alias.len() + ident_at(alias).len();
                }
            }
            return (paths, at.min(code.len()));
        }
        if code[at..].starts_with('*') {
            break;
        }
    }
    (vec![segments], at)
}

/// An arrow between two files of a crate: (crate dir, from module path, to module path, the line
/// that names it). Module paths are written `a::b`.
type FileArrow = (String, String, String, String);

/// Every arrow between the files of each crate under `root`: a path in a file's code that names
/// another file's module (`crate::…`, `super::…`, `self::…`, a child module, or a name a `use`
/// bound to a module) points at the file of the longest module its path names. A visibility
/// restriction (`pub(in crate::verdict)`) names no module's content and is no arrow.
fn file_arrows(root: &Path) -> Vec<FileArrow> {
    let mut out = Vec::new();
    for (dir, _, _, _) in CRATES {
        let crate_dir = root.join(dir);
        if !crate_dir.is_dir() {
            continue;
        }
        let files: Vec<(Vec<String>, std::path::PathBuf)> = rust_files(&crate_dir)
            .into_iter()
            .map(|f| {
                let rel = f
                    .strip_prefix(&crate_dir)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                (module_path(&rel), f)
            })
            .collect();
        let known: BTreeSet<&Vec<String>> = files.iter().map(|(m, _)| m).collect();
        for (here, file) in &files {
            let code = strip(&std::fs::read_to_string(file).unwrap());
            // Names that stand for a module here: the children, and what `use` binds to one.
            let mut bound: BTreeMap<String, Vec<String>> = files
                .iter()
                .filter(|(m, _)| m.len() == here.len() + 1 && m.starts_with(here))
                .map(|(m, _)| (m.last().unwrap().clone(), m.clone()))
                .collect();
            let absolute = |p: &[String], bound: &BTreeMap<String, Vec<String>>| {
                let first = p.first()?;
                match first.as_str() {
                    "crate" => Some(p[1..].to_vec()),
                    "super" | "self" => {
                        let mut base = here.clone();
                        let mut rest = p;
                        while let Some(s) = rest.first().filter(|s| *s == "super" || *s == "self") {
                            if s == "super" {
                                base.pop()?;
                            }
                            rest = &rest[1..];
                        }
                        base.extend(rest.iter().cloned());
                        Some(base)
                    }
                    _ => bound.get(first).map(|m| {
                        let mut full = m.clone();
                        full.extend(p[1..].iter().cloned());
                        full
                    }),
                }
            };
            // The starts of paths: an identifier followed by `::`, not the tail of a longer
            // path or name, nor a macro's `$crate`.
            let starts: Vec<usize> = code
                .match_indices("::")
                .filter_map(|(i, _)| {
                    let before = &code[..i];
                    let start = before
                        .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')
                        .len();
                    let prev = before[..start].chars().last();
                    // `pub(in crate::x)`: where an item may be seen from, not a use of `x`.
                    let ahead = before[..start].trim_end();
                    let visibility = ahead.strip_suffix("in").is_some_and(|b| {
                        b.ends_with(|c: char| c.is_whitespace() || c == '(')
                            && b.trim_end().ends_with("pub(")
                    });
                    (start < i
                        && !visibility
                        && !prev.is_some_and(|c| c == ':' || c == '$')
                        && !code[start..].starts_with(|c: char| c.is_ascii_digit()))
                    .then_some(start)
                })
                .collect();
            // Each path once: the names inside a `use` group are not paths of their own.
            let mut paths: Vec<(Vec<String>, bool)> = Vec::new();
            let mut covered = 0;
            for at in starts {
                if at < covered {
                    continue;
                }
                let before = code[..at].trim_end();
                let is_use = before.ends_with("use")
                    && !before[..before.len() - 3]
                        .ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
                let (found, end) = path_at(&code, at);
                covered = end;
                paths.extend(found.into_iter().map(|p| (p, is_use)));
            }
            for (p, is_use) in &paths {
                if !is_use {
                    continue;
                }
                if let Some(m) = absolute(p, &bound).filter(|m| known.contains(m)) {
                    bound.insert(p.last().unwrap().clone(), m);
                }
            }
            for (p, _) in &paths {
                let Some(target) = absolute(p, &bound) else {
                    continue;
                };
                let Some(to) = (0..=target.len())
                    .rev()
                    .map(|n| target[..n].to_vec())
                    .find(|m| known.contains(m))
                else {
                    continue;
                };
                if to == *here {
                    continue;
                }
                let line = p.join("::");
                out.push((dir.to_string(), here.join("::"), to.join("::"), line));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The circles among the files of each crate: every set of two or more files that reach each
/// other (a strongly connected component), as (crate dir, module paths sorted).
fn file_circles(arrows: &[FileArrow]) -> Vec<(String, Vec<String>)> {
    let mut graphs: BTreeMap<&str, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for (dir, from, to, _) in arrows {
        let g = graphs.entry(dir).or_default();
        g.entry(from).or_default().insert(to);
        g.entry(to).or_default();
    }
    let mut circles = Vec::new();
    for (dir, graph) in &graphs {
        // Nodes that reach each other: `start` and those it reaches that reach it back.
        let reach = |start: &str| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![start];
            while let Some(n) = todo.pop() {
                for &next in &graph[n] {
                    if seen.insert(next) {
                        todo.push(next);
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&str, BTreeSet<&str>> =
            graph.keys().map(|&n| (n, reach(n))).collect();
        let mut done: BTreeSet<String> = BTreeSet::new();
        for (&n, from_n) in &reaches {
            if done.contains(n) || !from_n.contains(n) {
                continue;
            }
            let members: Vec<String> = from_n
                .iter()
                .filter(|m| reaches[*m].contains(n))
                .map(|m| m.to_string())
                .collect();
            done.extend(members.iter().cloned());
            circles.push((dir.to_string(), members));
        }
    }
    circles.sort();
    circles
}

/// What is wrong with the circles among files, given the known ones: one line per offence.
fn file_offences(arrows: &[FileArrow], known: &[(&str, &[&str])]) -> Vec<String> {
    let circles = file_circles(arrows);
    let mut bad = Vec::new();
    for (dir, members) in &circles {
        if known
            .iter()
            .any(|(d, m)| d == dir && m.iter().eq(members.iter()))
        {
            continue;
        }
        let witnesses: Vec<String> = arrows
            .iter()
            .filter(|a| &a.0 == dir && members.contains(&a.1) && members.contains(&a.2))
            .map(|a| format!("{} -> {} ({})", a.1, a.2, a.3))
            .collect();
        bad.push(format!(
            "{dir}: circle between files {}: {}",
            members.join(", "),
            witnesses.join("; ")
        ));
    }
    for (dir, members) in known {
        if !circles
            .iter()
            .any(|(d, m)| d == dir && m.iter().eq(members.iter()))
        {
            bad.push(format!(
                "{dir}: the known circle {} is gone or changed: remove it from KNOWN_FILE_CIRCLES",
                members.join(", ")
            ));
        }
    }
    bad
}

/// The package names a crate's Cargo.toml lists under `[dependencies]` that are ours.
fn our_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.starts_with('#') || line.is_empty() {
            continue;
        }
        let key = line.split(['=', '.']).next().unwrap().trim();
        // `dump = { package = "oomshim-format", … }` or `dump.workspace = true`.
        for (_, name, package, _) in CRATES {
            if key == *name || key == *package {
                deps.insert(name.to_string());
            }
        }
    }
    deps
}

/// What is wrong with a set of arrows, one line per offence.
fn offences(arrows: &[Arrow]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut graphs: BTreeMap<&str, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for (dir, from, to, file, line) in arrows {
        let (_, own, _, may) = CRATES.iter().find(|c| c.0 == dir).unwrap();
        if let Some(name) = to.strip_prefix("extern:") {
            if name != *own && !may.contains(&name) {
                bad.push(format!(
                    "{file}: {dir} may not name the crate `{name}`: {line}"
                ));
            }
            continue;
        }
        if IMPORTED_BY_NOBODY.contains(&to.as_str()) {
            bad.push(format!("{file}: `{to}` is imported by nobody, yet: {line}"));
        }
        graphs
            .entry(dir)
            .or_default()
            .entry(from)
            .or_default()
            .insert(to);
    }
    // Circles between a crate's top-level modules: any module that reaches itself.
    for (dir, graph) in &graphs {
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
                                        .find(|a| a.0 == *dir && a.1 == w[0] && a.2 == w[1])
                                        .map(|a| format!("{} ({})", a.3, a.4))
                                })
                                .collect();
                            bad.push(format!(
                                "{dir}: circle {}: {}",
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
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn arrows_point_down_and_close_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = arrows(root);
    // The scan sees the tree's real arrows (a broken scanner finding none would pass anything).
    assert!(
        found
            .iter()
            .any(|a| a.0 == "src/core" && a.1 == "verdict" && a.2 == "extern:dump"),
        "the scan found no verdict -> dump arrow; is it reading the sources?"
    );
    assert!(
        found
            .iter()
            .any(|a| a.0 == "src/preload" && a.1 == "ffi" && a.2 == "shim"),
        "the scan found no ffi -> shim arrow inside the preload crate"
    );
    let bad = offences(&found);
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

#[test]
fn files_inside_a_module_close_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = file_arrows(root);
    // The scan sees the tree's real arrows between files, those of a folder's own file too.
    for (from, to) in [
        ("verdict::words::own_allocations", "verdict::found"),
        ("verdict", "verdict::words::leak"),
    ] {
        assert!(has_file_arrow(&found, from, to), "no {from} -> {to} arrow");
    }
    let bad = file_offences(&found, KNOWN_FILE_CIRCLES);
    assert!(bad.is_empty(), "circles between files:\n{}", bad.join("\n"));
}

#[test]
fn no_arrow_that_must_never_exist_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = file_arrows(root);
    // The rules' own scopes are real: the words read what the rules found; the failure path
    // reads the shim through its recorder, and recording is below it.
    let (from, to) = ("verdict::words::leak", "verdict::found");
    assert!(has_file_arrow(&found, from, to), "no {from} -> {to} arrow");
    for (from, to) in [
        ("failure::capture", "failure::recorder"),
        ("failure::recorder", "record::growth"),
        ("shim", "failure"),
    ] {
        assert!(
            found
                .iter()
                .any(|a| a.0 == "src/preload" && a.1 == from && a.2 == to),
            "no {from} -> {to} arrow"
        );
    }
    let bad = never_offences(&found, NEVER);
    assert!(
        bad.is_empty(),
        "arrows that must never exist:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_never_list_keeps_the_preload_pipeline_one_way() {
    let files = [
        (
            "src/preload/failure/writer.rs",
            "use crate::shim::Shim;\nfn w() { crate::record::growth::freeze(); }\n",
        ),
        (
            "src/preload/record/growth.rs",
            "fn g() { crate::failure::writer::w(); }\n",
        ),
        (
            "src/preload/cuda/real.rs",
            "fn r() { crate::state::now(); }\n",
        ),
        ("src/preload/cuda/context.rs", "use super::real;\n"),
        ("src/preload/state.rs", "fn now() {}\n"),
        (
            "src/preload/shim.rs",
            "fn s() { crate::failure::writer::w(); }\n",
        ),
        (
            "src/preload/allocator_mode/host.rs",
            "fn h() { crate::shim::s(); }\n",
        ),
    ];
    // Downward arrows (failure to record, the shim to failure, cuda to itself) are no offence.
    assert_offences(
        &never_offences_in_tree(&files),
        &[
            "src/preload: allocator_mode::host -> shim (crate::shim::s)",
            "src/preload: cuda::real -> state (crate::state::now)",
            "src/preload: failure::writer -> shim (crate::shim::Shim)",
            "src/preload: record::growth -> failure::writer (crate::failure::writer::w)",
        ],
    );
}

#[test]
fn the_never_list_catches_words_that_call_a_rule() {
    // The words of `leak` call its rule by a path, those of `post_mortem` through a `use`
    // group; both also read what the rules found and name each other, which is allowed.
    let files = [
        (
            "src/core/verdict/mod.rs",
            "mod found;\nmod leak;\nmod words;\nfn judge() { words::leak::finding(); }\n",
        ),
        ("src/core/verdict/found.rs", "pub struct Leak;\n"),
        (
            "src/core/verdict/leak.rs",
            "use super::found::Leak;\npub fn recorded() {}\n",
        ),
        (
            "src/core/verdict/words/leak.rs",
            "use crate::verdict::found::Leak;\nfn finding() { crate::verdict::leak::recorded(); }\n",
        ),
        (
            "src/core/verdict/words/post_mortem.rs",
            "use super::leak;\nuse crate::verdict::{found, leak::recorded};\n",
        ),
        ("src/core/verdict/words/mod.rs", "mod leak;\nmod post_mortem;\n"),
    ];
    // Words naming words, or what the rules found, are no offence.
    assert_offences(
        &never_offences_in_tree(&files),
        &[
            "src/core: verdict::words::leak -> verdict::leak (crate::verdict::leak::recorded)",
            "src/core: verdict::words::post_mortem -> verdict::leak (crate::verdict::leak::recorded)",
        ],
    );
}

/// The [`NEVER`] offences of a made-up tree of `(path, text)` files.
fn never_offences_in_tree(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        write_in_tree(dir.path(), path, text);
    }
    never_offences(&file_arrows(dir.path()), NEVER)
}

/// The core has an arrow from the file of module `from` to that of `to`.
fn has_file_arrow(found: &[FileArrow], from: &str, to: &str) -> bool {
    found
        .iter()
        .any(|a| a.0 == "src/core" && a.1 == from && a.2 == to)
}

/// `bad` holds exactly one offence beginning with each of `want`, and no other.
fn assert_offences(bad: &[String], want: &[&str]) {
    let text = bad.join("\n");
    for w in want {
        assert!(
            bad.iter().any(|b| b.starts_with(w)),
            "no offence {w:?} in:\n{text}"
        );
    }
    assert_eq!(bad.len(), want.len(), "{text}");
}

#[test]
fn the_file_scan_catches_circles_through_aliases_groups_and_rings() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let w = |p: &str, text: &str| write_in_tree(root, p, text);
    // verdict/ (the core, held to the rule): the parent uses its children and they use it, and
    // `snapshot` and `words/snapshot` use each other through an alias bound by `use`: one
    // circle; `words/mod.rs` names its parent only as a visibility, which is no arrow. live/:
    // the parent uses `d` and `d` uses it back, a circle as any two files; `a`, `b`, `c` form a
    // ring through a nested group; `d` names `a` only in a comment and a test module.
    w(
        "src/core/verdict/mod.rs",
        "mod words;\nmod snapshot;\npub const K: u8 = 1;\nfn j() { words::snapshot::say(); snapshot::held(); }\n",
    );
    w(
        "src/core/verdict/snapshot.rs",
        "use super::words;\nfn held() { words::snapshot::say(); }\n",
    );
    w(
        "src/core/verdict/words/mod.rs",
        "pub(in crate::verdict) mod snapshot;\n",
    );
    w(
        "src/core/verdict/words/snapshot.rs",
        "use crate::verdict::{snapshot::Held, K};\nuse super::super::K as J;\n",
    );
    w(
        "src/preload/live/a.rs",
        "use crate::live::{b::{self, f}};\n",
    );
    w("src/preload/live/b.rs", "fn g() { super::c::h(); }\n");
    w(
        "src/preload/live/c.rs",
        "use super::a as alias;\nfn h() { alias::x(); }\n",
    );
    w(
        "src/preload/live/d.rs",
        "// crate::live::a\nfn g() { super::K; }\n#[cfg(test)]\nmod tests {\n    use crate::live::a;\n}\n",
    );
    w(
        "src/preload/live/mod.rs",
        "mod a;\nmod b;\nmod c;\nmod d;\nuse d::e;\npub const K: u8 = 1;\n",
    );
    let arrows = file_arrows(root);
    assert_offences(
        &file_offences(&arrows, &[]),
        &[
            "src/core: circle between files verdict, verdict::snapshot, verdict::words::snapshot",
            "src/preload: circle between files live, live::d",
            "src/preload: circle between files live::a, live::b, live::c",
        ],
    );
    assert!(
        !arrows.iter().any(|a| a.1 == "live::d" && a.2 == "live::a"),
        "{arrows:?}"
    );
    assert!(
        !arrows.iter().any(|a| a.1 == "verdict::words"),
        "{arrows:?}"
    );
    // A known circle passes; a known circle that is gone fails.
    let known: &[(&str, &[&str])] = &[
        ("src/preload", &["live::a", "live::b", "live::c"]),
        ("src/preload", &["live::d", "live::e"]),
    ];
    let text = file_offences(&arrows, known).join("\n");
    assert!(!text.contains("live::a, live::b"), "{text}");
    assert!(
        text.contains("the known circle live::d, live::e is gone"),
        "{text}"
    );
}

#[test]
fn each_crate_depends_only_on_the_crates_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, own, _, may) in CRATES {
        let manifest = if *dir == "src/cli" {
            root.join("Cargo.toml")
        } else {
            root.join(dir).join("Cargo.toml")
        };
        let text = std::fs::read_to_string(&manifest).unwrap();
        let mut deps = our_dependencies(&text);
        deps.remove(*own);
        if *dir == "src/cli" {
            // Built with the CLI, never named by it (the arrow test above checks the naming).
            assert!(
                deps.remove("oomshim"),
                "the CLI no longer builds liboomshim.so with itself"
            );
        }
        let allowed: BTreeSet<String> = may.iter().map(|s| s.to_string()).collect();
        assert!(
            deps.is_subset(&allowed),
            "{}: depends on {:?}; may depend on {:?}",
            manifest.display(),
            deps,
            allowed
        );
    }
}

#[test]
fn the_scan_catches_upward_names_circles_and_ffi_imports() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let w = |p: &str, text: &str| write_in_tree(root, p, text);
    w(
        "src/format/read.rs",
        "// oomshim_cli::report in a comment does not count\nuse oomshim_core::units::clean;\n",
    );
    w(
        "src/core/verdict.rs",
        "use crate::{facts::Relation, alloc};\nuse dump::model::Dump;\n#[cfg(test)]\nmod tests {\n    use oomshim_cli::report;\n}\n",
    );
    w("src/core/facts.rs", "fn f() { crate::verdict::judge(); }\n");
    w("src/preload/live/mod.rs", "use crate::ffi::hooks;\n");
    w("src/preload/ffi/mod.rs", "use crate::live;\n");
    w(
        "src/cli/report.rs",
        "pub use dump::units;\nfn g() { oomshim::live::step(); }\n",
    );
    let bad = offences(&arrows(root));
    let text = bad.join("\n");
    assert!(
        text.contains("src/format/read.rs: src/format may not name the crate `oomshim_core`"),
        "{text}"
    );
    assert!(
        text.contains("src/cli/report.rs: src/cli may not name the crate `oomshim`"),
        "{text}"
    );
    assert!(
        text.contains("src/preload/live/mod.rs: `ffi` is imported by nobody"),
        "{text}"
    );
    assert!(
        text.contains("src/core: circle facts -> verdict -> facts"),
        "{text}"
    );
    assert!(
        !text.contains("oomshim_cli"),
        "comments and test modules count: {text}"
    );
    // cli -> dump and core -> dump point down: no offence.
    assert!(!text.contains("`dump`"), "{text}");
}

#[test]
fn the_manifest_scan_reads_renamed_and_workspace_dependencies() {
    let deps = our_dependencies(
        "[package]\nname = \"x\"\n[dependencies]\ndump.workspace = true\noomshim-core = { path = \"../core\" }\nlibc = \"0.2\"\n[dev-dependencies]\noomshim-preload.workspace = true\n",
    );
    let want: BTreeSet<String> = ["dump", "oomshim_core"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(deps, want);
}
