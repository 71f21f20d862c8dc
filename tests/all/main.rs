//! Every integration test in one binary: one link of the whole workspace instead of
//! one per file. Each file of tests/ stays where it is and is a module here, so its tests are named
//! `FILE::test`: `cargo test --release --test all shim::` runs tests/shim.rs, and
//! `cargo test --release --test all -- torch_package:: torch_hook::` two files. tests/common is
//! shared by all of them (`use crate::common;` at the top of a file; a file that still says
//! `mod common;` gets its own copy, which works too). A new file needs its line below:
//! `every_test_file_is_in_the_binary` fails until it has one.

#[path = "../common/mod.rs"]
mod common;

/// Every process a test starts publishes its live summary into this run's own directory unless
/// the test names another: never into the user's `/dev/shm/oomshim-UID`, where the regions of
/// the programs tests kill on purpose would pile up (and `oomshim top` would show them). Set
/// before `main`, while the process has one thread; the directory goes when the run ends.
#[used]
#[link_section = ".init_array"]
static OWN_LIVE_DIR: extern "C" fn() = own_live_dir;

extern "C" fn own_live_dir() {
    if std::env::var_os("OOMSHIM_LIVE_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("oomshim-tests-live-{}", std::process::id()));
    std::env::set_var("OOMSHIM_LIVE_DIR", &dir);
    extern "C" fn remove_own_live_dir() {
        if let Some(dir) = std::env::var_os("OOMSHIM_LIVE_DIR") {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    // SAFETY: registers a function that only removes a directory.
    unsafe { libc::atexit(remove_own_live_dir) };
}

#[path = "../build_graph.rs"]
mod build_graph;
#[path = "../cli.rs"]
mod cli;
#[path = "../cli_exports.rs"]
mod cli_exports;
#[path = "../docs.rs"]
mod docs;
#[path = "../driver.rs"]
mod driver;
#[path = "../exporter.rs"]
mod exporter;
#[path = "../flight.rs"]
mod flight;
#[path = "../fuzz_reports.rs"]
mod fuzz_reports;
#[path = "../gpu_scripts.rs"]
mod gpu_scripts;
#[path = "../hostile.rs"]
mod hostile;
#[path = "../html.rs"]
mod html;
#[path = "../jobs.rs"]
mod jobs;
#[path = "../launcher.rs"]
mod launcher;
#[path = "../layers.rs"]
mod layers;
#[path = "../memory_viz.rs"]
mod memory_viz;
#[path = "../oom_patterns.rs"]
mod oom_patterns;
#[path = "../pystack.rs"]
mod pystack;
#[path = "../ranks.rs"]
mod ranks;
#[path = "../real_torch.rs"]
mod real_torch;
#[path = "../real_torch_kinds.rs"]
mod real_torch_kinds;
#[path = "../recording.rs"]
mod recording;
#[path = "../reliability.rs"]
mod reliability;
#[path = "../shim.rs"]
mod shim;
#[path = "../torch_alloc.rs"]
mod torch_alloc;
#[path = "../torch_hook.rs"]
mod torch_hook;
#[path = "../torch_kinds.rs"]
mod torch_kinds;
#[path = "../torch_package.rs"]
mod torch_package;
#[path = "../verdicts.rs"]
mod verdicts;
#[path = "../words.rs"]
mod words;

// Unit tests of library crates whose API is public, here rather than in a harness of their own.
#[path = "../unit/cli/mod.rs"]
mod unit_cli;
#[path = "../unit/format/mod.rs"]
mod unit_format;

/// Cargo builds only this binary (`autotests = false`): a file of tests/ that no line above names
/// would silently never run.
#[test]
fn every_test_file_is_in_the_binary() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(tests.join("all/main.rs")).expect("tests/all/main.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&tests).expect("tests/") {
        let path = entry.expect("tests/ entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs")
            && !main.contains(&format!("#[path = \"../{name}\"]"))
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{missing:?} not in tests/all/main.rs: add `#[path = \"../NAME.rs\"] mod NAME;`"
    );
    // The crates' unit tests under tests/unit/CRATE/: each file is a module of that mod.rs.
    let mut crates = 0;
    for dir in std::fs::read_dir(tests.join("unit")).expect("tests/unit/") {
        let dir = dir.expect("tests/unit entry").path();
        let krate = dir.file_name().unwrap().to_string_lossy().into_owned();
        let rel = format!("../unit/{krate}/mod.rs");
        assert!(
            main.contains(&format!("#[path = \"{rel}\"]")),
            "{rel} not in tests/all/main.rs"
        );
        let listed = std::fs::read_to_string(dir.join("mod.rs")).expect("mod.rs");
        for entry in std::fs::read_dir(&dir).expect("unit dir") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            if let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "mod") {
                if !listed.contains(&format!("mod {module};")) {
                    missing.push(format!("tests/unit/{krate}/{name}"));
                }
            }
        }
        crates += 1;
    }
    assert!(crates >= 2, "tests/unit/ has {crates} crates' tests");
    assert!(
        missing.is_empty(),
        "{missing:?} not in their tests/unit/CRATE/mod.rs"
    );
}
