//! Shared by the integration tests that run programs under the shim.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// `liboomshim.so` of the profile under test, built (or brought up to date) first: `cargo test`
/// compiles the library only as an rlib for the tests, never the cdylib users preload, so a
/// stale or missing .so would otherwise be tested.
pub fn shim_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_oomshim"));
        let profile_dir = exe.parent().expect("target/<profile>").to_path_buf();
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(name) => name.to_string(),
        };
        let status = Command::new(env!("CARGO"))
            .args(["build", "--lib", "--quiet", "--profile", &profile])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo to build liboomshim.so");
        assert!(status.success(), "building liboomshim.so failed");
        let lib = profile_dir.join("liboomshim.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
    .clone()
}
