//! Unit tests of `oomshim_cli::run` (src/cli/run.rs).

use oomshim_cli::run::*;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// `oomshim demo`'s launcher: a child killed before its exit handler ran leaves no region.
#[test]
fn a_killed_childs_region_is_removed_once_it_is_reaped() {
    let live = tempfile::tempdir().unwrap();
    // The child plays a shimmed process killed outright: it creates its region (named by
    // its pid namespace, pid and start time, as the shim names it) and SIGKILLs itself.
    let script = r#"t=$(cut -d' ' -f22 /proc/$$/stat); ns=$(stat -L -c %i /proc/$$/ns/pid); : > "$OOMSHIM_LIVE_DIR/$ns-$$-$t.live"; kill -9 $$"#;
    let command = [
        OsString::from("sh"),
        OsString::from("-c"),
        OsString::from(script),
    ];
    let (pid, code) = spawn_and_wait(&RunOptions {
        lib: PathBuf::new(), // nothing preloaded: the child fakes its region itself
        torch_hook: false,
        dir: None,
        command: &command,
        exit_code: false,
        extra_env: vec![(
            OsString::from("OOMSHIM_LIVE_DIR"),
            live.path().as_os_str().to_owned(),
        )],
    })
    .unwrap();
    assert_eq!(code, 128 + libc::SIGKILL);
    assert!(pid > 0);
    let left: Vec<_> = std::fs::read_dir(live.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn preload_puts_the_shim_first_and_keeps_the_rest() {
    let lib = Path::new("/opt/oomshim/liboomshim.so");
    assert_eq!(
        preload_value(lib, None),
        OsString::from("/opt/oomshim/liboomshim.so")
    );
    assert_eq!(
        preload_value(lib, Some(OsStr::new("/usr/lib/libjemalloc.so other.so"))),
        OsString::from("/opt/oomshim/liboomshim.so:/usr/lib/libjemalloc.so:other.so")
    );
    assert_eq!(
        preload_value(lib, Some(OsStr::new("/opt/oomshim/liboomshim.so"))),
        OsString::from("/opt/oomshim/liboomshim.so"),
        "never preloaded twice"
    );
    assert_eq!(
        preload_value(lib, Some(OsStr::new(""))),
        OsString::from("/opt/oomshim/liboomshim.so")
    );
}

#[test]
fn exit_codes_follow_the_shell() {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(exit_code(std::process::ExitStatus::from_raw(3 << 8)), 3);
    assert_eq!(exit_code(std::process::ExitStatus::from_raw(9)), 128 + 9);
}

#[test]
fn explicit_library_must_exist() {
    let err = find_library(Some(Path::new("/nonexistent/liboomshim.so"))).unwrap_err();
    assert!(err.contains("/nonexistent/liboomshim.so"), "{err}");
}

#[test]
fn library_paths_ld_so_would_split_are_refused() {
    assert!(check_preloadable(Path::new("/opt/oomshim/liboomshim.so")).is_ok());
    for bad in ["/opt/my libs/liboomshim.so", "/opt/a:b/liboomshim.so"] {
        let e = check_preloadable(Path::new(bad)).unwrap_err();
        assert!(
            e.contains("spaces and colons") && e.contains("--lib"),
            "{e}"
        );
    }
}
