//! The CLI as a user meets it: where it finds its library, and what its help teaches.

use crate::common;

use std::process::Command;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of the CLI in a fresh directory, as `cargo run` or an install leaves it.
fn cli_copy(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join("oomshim");
    std::fs::copy(env!("CARGO_BIN_EXE_oomshim"), &exe).unwrap();
    exe
}

#[test]
fn without_a_library_the_error_names_every_place_tried() {
    let t = tempfile::tempdir().unwrap();
    let exe = cli_copy(&t.path().join("bin"));
    let out = Command::new(&exe)
        .args(["demo", "--dir"])
        .arg(t.path().join("dumps"))
        .env_remove("OOMSHIM_LIB")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    for place in [
        "OOMSHIM_LIB (unset)".to_string(),
        t.path().join("bin/liboomshim.so").display().to_string(),
        t.path()
            .join("bin/deps/liboomshim.so")
            .display()
            .to_string(),
        "site-packages/oomshim/liboomshim.so".to_string(),
    ] {
        assert!(err.contains(&place), "{place} missing: {err}");
    }
}

#[test]
fn cargo_runs_layout_and_oomshim_lib_both_work() {
    let t = tempfile::tempdir().unwrap();
    let exe = cli_copy(&t.path().join("release"));
    // `cargo run` leaves the cdylib only in deps/.
    let deps = t.path().join("release/deps");
    std::fs::create_dir_all(&deps).unwrap();
    std::fs::copy(common::shim_lib(), deps.join("liboomshim.so")).unwrap();
    let out = Command::new(&exe)
        .args(["demo", "--dir"])
        .arg(t.path().join("dumps"))
        .env_remove("OOMSHIM_LIB")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("leak"));

    // OOMSHIM_LIB names the library for a CLI that has none beside it; a wrong one is an error.
    let bare = cli_copy(&t.path().join("elsewhere"));
    let out = Command::new(&bare)
        .args(["demo", "--dir"])
        .arg(t.path().join("dumps2"))
        .env("OOMSHIM_LIB", common::shim_lib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = Command::new(&bare)
        .arg("demo")
        .env("OOMSHIM_LIB", t.path().join("missing.so"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("does not name a file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_env_lists_every_setting_with_its_default() {
    for args in [&["help", "env"][..], &["env"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        for s in oomshim_core::config::SETTINGS {
            assert!(
                text.contains(&format!("{}  (default: {})", s.name, s.default)),
                "{args:?}: {} missing",
                s.name
            );
        }
    }
    // The run help points there.
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("oomshim help env"));
}

#[test]
fn report_of_a_directory_reports_its_newest_dump() {
    let t = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let old = t.path().join("oomshim-host-1-1.json");
    let new = t.path().join("oomshim-host-2-1.json");
    std::fs::copy(fixtures.join("oom_untracked.json"), &old).unwrap();
    std::fs::copy(fixtures.join("oom_fragmentation.json"), &new).unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // torch's side file is newer still, and not a dump.
    std::fs::write(t.path().join("oomshim-torch-host-2-1.json"), "{}").unwrap();
    let report = |p: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(["report", "--json"])
            .arg(p)
            .output()
            .unwrap()
    };
    let out = report(t.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let of_dir: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let of_file: serde_json::Value = serde_json::from_slice(&report(&new).stdout).unwrap();
    assert_eq!(of_dir, of_file);
    assert!(
        stderr(&out).contains(&new.display().to_string()),
        "{}",
        stderr(&out)
    );

    let empty = tempfile::tempdir().unwrap();
    let out = report(empty.path());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "oomshim: error: no oomshim dumps (oomshim-*.json) in {}",
            empty.path().display()
        )
    );
}

/// Issue 27: `oomshim` alone asks for nothing wrong: it prints the help (with the examples) on
/// stdout and exits 0; a report of zero holders is refused by the argument parser, not rendered.
#[test]
fn oomshim_alone_prints_help_and_top_zero_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Usage: oomshim"), "{text}");
    assert!(text.contains("oomshim demo"), "{text}");
    for args in [
        &["report", "x.json", "--top", "0"][..],
        &["diff", "a.json", "b.json", "--top", "0"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains("--top"), "{args:?}: {}", stderr(&out));
    }
}
