//! The README's two set-up commands share one build: `cargo run --release -- demo`,
//! `cargo test --release` and a plain `cargo build --release` (scripts/build-wheel, `pip install .`)
//! resolve every crate they have in common with the same features. A dev-dependency that turns on
//! a feature of a shared crate (a test-only feature of our own crates too) gives the tests their
//! own build of that crate and of everything above it, and each switch between the two commands
//! then rebuilds the library and the CLI, whose file names carry no hash. `cargo tree` shows the
//! resolution without building anything; scripts/time-build-switch times the real switch.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each package of a `cargo tree` selection (`name vVERSION`, with `(proc-macro)` or its path
/// where cargo prints one) with the feature sets it is built with.
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--prefix",
            "none",
            "--no-dedupe",
            "--format",
            "{p} [{f}]",
        ])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in stdout.lines() {
        let line = line.trim().trim_end_matches(" (*)");
        if line.is_empty() {
            continue;
        }
        let (package, features) = line
            .rsplit_once(" [")
            .unwrap_or_else(|| panic!("unexpected cargo tree line {line:?}"));
        packages
            .entry(package.to_string())
            .or_default()
            .insert(features.trim_end_matches(']').to_string());
    }
    assert!(!packages.is_empty(), "cargo tree {args:?} printed nothing");
    packages
}

/// The workspace's default members (what `cargo test` and `cargo build` select), as `-p` args.
fn default_members() -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata failed");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let ids = meta["workspace_default_members"]
        .as_array()
        .expect("workspace_default_members (cargo 1.71+)");
    let mut args = Vec::new();
    for id in ids {
        let package = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == *id)
            .expect("a default member's package");
        args.push("-p".to_string());
        args.push(package["name"].as_str().unwrap().to_string());
    }
    assert!(args.len() >= 8, "the default members: {args:?}");
    args
}

/// The packages of `other` built with other features than in `base`.
fn differences(
    base: &BTreeMap<String, BTreeSet<String>>,
    other: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    base.iter()
        .filter_map(|(package, features)| match other.get(package) {
            Some(theirs) if theirs != features => {
                Some(format!("{package}: {features:?} vs {theirs:?}"))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn the_demo_the_tests_and_the_wheel_build_every_shared_crate_with_the_same_features() {
    // `cargo run` selects the CLI's package and needs no dev-dependencies.
    let demo = features(&["-p", "oomshim", "--edges", "normal,build"]);
    let members = default_members();
    let members: Vec<&str> = members.iter().map(String::as_str).collect();
    // `cargo test`: every default member, with its dev-dependencies.
    let test = features(&[&members[..], &["--edges", "normal,build,dev"]].concat());
    // `cargo build --release`: every default member, without them.
    let build = features(&[&members[..], &["--edges", "normal,build"]].concat());

    for package in [
        "oomshim",
        "oomshim-preload",
        "oomshim-core",
        "oomshim-host",
        "oomshim-format",
    ] {
        assert!(
            demo.keys().any(|p| p.starts_with(&format!("{package} v"))),
            "{package} missing from the demo's graph: {:?}",
            demo.keys().collect::<Vec<_>>()
        );
    }
    let in_tests = differences(&demo, &test);
    assert!(
        in_tests.is_empty(),
        "`cargo test` builds these crates with other features than `cargo run` (a dev-dependency \
         or a test-only feature turns them on; each switch between the two would rebuild the \
         library and the CLI):\n{}",
        in_tests.join("\n")
    );
    let in_build = differences(&demo, &build);
    assert!(
        in_build.is_empty(),
        "`cargo build --release` builds these crates with other features than `cargo run`:\n{}",
        in_build.join("\n")
    );
}

/// The libraries are built with `doctest = false` (rustdoc's pass over the four of them cost
/// 25 s of CPU in every `cargo test` and found no example): a doc example written later would
/// then never run, silently. This fails first, naming it.
#[test]
fn no_doc_example_goes_untested() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, line) in text.lines().enumerate() {
                    let line = line.trim_start();
                    if (line.starts_with("///") || line.starts_with("//!")) && line.contains("```")
                    {
                        found.push(format!("{}:{}", path.display(), i + 1));
                    }
                }
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    walk(&root.join("src"), &mut found);
    assert!(
        found.is_empty(),
        "doc examples at {found:?}: set `doctest = true` (or remove `doctest = false`) in the \
         [lib] of their crate's Cargo.toml, so that `cargo test` runs them"
    );
    for manifest in [
        "Cargo.toml",
        "src/format/Cargo.toml",
        "src/core/Cargo.toml",
        "src/host/Cargo.toml",
        "src/preload/Cargo.toml",
    ] {
        let text = std::fs::read_to_string(root.join(manifest)).unwrap();
        assert!(
            text.contains("\ndoctest = false"),
            "{manifest}: its [lib] runs rustdoc for no example"
        );
    }
}
