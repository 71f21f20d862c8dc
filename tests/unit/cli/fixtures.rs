//! Test fixtures under `tests/fixtures/` and golden-file comparison for the report tests.
//! `OOMSHIM_BLESS=1` rewrites the expected files instead of comparing.

use std::path::PathBuf;

use dump::model::Dump;
use dump::read::read_dump;

/// Dumps under `tests/fixtures/<name>.json` that have golden reports.
pub fn fixture_names() -> &'static [&'static str] {
    &[
        "oom_own_allocations",
        "oom_untracked",
        "oom_request_exceeds_device",
        "oom_fragmentation",
        "snapshot",
        "minimal_unavailable",
    ]
}

pub fn fixture_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file)
}

pub fn load_fixture(name: &str) -> Dump {
    let path = fixture_path(&format!("{name}.json"));
    read_dump(&path).unwrap_or_else(|e| panic!("fixture: {e}"))
}

/// Compares `actual` with the expected file `tests/fixtures/<file>`; with `OOMSHIM_BLESS=1`
/// writes `actual` there instead.
pub fn check_golden(file: &str, actual: &str) {
    let path = fixture_path(file);
    if std::env::var_os("OOMSHIM_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with OOMSHIM_BLESS=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the rendered output at line {}:\n  expected: {:?}\n  actual:   {:?}\n\
             --- actual output ---\n{actual}\n(run with OOMSHIM_BLESS=1 to accept)",
            path.display(),
            first + 1,
            expected.lines().nth(first).unwrap_or("<end>"),
            actual.lines().nth(first).unwrap_or("<end>"),
        );
    }
}
