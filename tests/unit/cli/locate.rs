//! Unit tests of `oomshim_cli::locate` (src/cli/locate.rs).

use oomshim_cli::locate::*;
use std::fs;
use std::path::Path;

fn touch(p: &Path) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, b"").unwrap();
}

#[test]
fn explicit_library_must_exist() {
    let err = find_library_from(
        Some(Path::new("/nonexistent/liboomshim.so")),
        None,
        Path::new("/x/oomshim"),
    )
    .unwrap_err();
    assert!(err.contains("/nonexistent/liboomshim.so"), "{err}");
}

#[test]
fn oomshim_lib_wins_over_the_copies_beside_and_must_exist() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("release/oomshim");
    touch(&t.path().join("release/liboomshim.so"));
    let mine = t.path().join("mine.so");
    touch(&mine);
    let got = find_library_from(None, Some(mine.clone().into()), &exe).unwrap();
    assert_eq!(got, fs::canonicalize(&mine).unwrap());
    let err = find_library_from(None, Some("/nope/liboomshim.so".into()), &exe).unwrap_err();
    assert_eq!(err, "OOMSHIM_LIB=/nope/liboomshim.so does not name a file");
}

#[test]
fn cargo_run_layout_finds_the_newer_of_beside_and_deps() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("release/oomshim");
    let deps = t.path().join("release/deps/liboomshim.so");
    touch(&deps);
    // `cargo run`: only deps/ has the library.
    assert_eq!(find_library_from(None, None, &exe).unwrap(), deps);
    // An older copy beside the binary (an earlier `cargo build`) must not shadow it.
    let beside = t.path().join("release/liboomshim.so");
    touch(&beside);
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(&beside)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(find_library_from(None, None, &exe).unwrap(), deps);
    fs::File::options()
        .write(true)
        .open(&deps)
        .unwrap()
        .set_modified(old - std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(find_library_from(None, None, &exe).unwrap(), beside);
}

#[test]
fn a_wheel_install_finds_the_library_in_the_python_package() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("venv/bin/oomshim");
    let lib = t
        .path()
        .join("venv/lib/python3.12/site-packages/oomshim/liboomshim.so");
    touch(&lib);
    assert_eq!(find_library_from(None, None, &exe).unwrap(), lib);
}

/// Issue 25 item 29: versions compare by number, not as strings ("3.9" > "3.12" as text).
#[test]
fn several_pythons_in_one_prefix_the_highest_version_wins() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("venv/bin/oomshim");
    let copy = |v: &str| {
        t.path()
            .join(format!("venv/lib/{v}/site-packages/oomshim/liboomshim.so"))
    };
    for v in ["python3.9", "python3.12", "python3.10", "python3.8"] {
        touch(&copy(v));
    }
    assert_eq!(
        find_library_from(None, None, &exe).unwrap(),
        copy("python3.12")
    );
    touch(&copy("python3.13t"));
    assert_eq!(
        find_library_from(None, None, &exe).unwrap(),
        copy("python3.13t")
    );
    assert_eq!(python_version("python3.12"), (3, 12));
    assert_eq!(python_version("python3"), (3, 0));
    assert_eq!(python_version("python3.x"), (3, 0));
}

#[test]
fn the_error_names_every_place_tried() {
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("bin/oomshim");
    let err = find_library_from(None, None, &exe).unwrap_err();
    for place in [
        "OOMSHIM_LIB (unset)".to_string(),
        t.path().join("bin/liboomshim.so").display().to_string(),
        t.path()
            .join("bin/deps/liboomshim.so")
            .display()
            .to_string(),
        t.path()
            .join("lib/python3.*/site-packages/oomshim/liboomshim.so")
            .display()
            .to_string(),
        "--lib PATH".to_string(),
    ] {
        assert!(err.contains(&place), "{place} missing from: {err}");
    }
    assert_eq!(err.lines().count(), 1, "{err}");
}
