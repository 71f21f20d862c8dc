//! Unit tests of `oomshim_cli::demo` (src/cli/demo.rs).

use oomshim_cli::demo::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

#[test]
fn work_directories_are_fresh_private_and_removed() {
    let parent = std::env::temp_dir();
    let dir = private_work_dir(&parent).unwrap();
    let meta = fs::symlink_metadata(dir.path()).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o777, 0o700);
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    let other = private_work_dir(&parent).unwrap();
    assert_ne!(dir.path(), other.path(), "a new name every time");
    let path = dir.path().to_path_buf();
    drop(dir);
    assert!(!path.exists(), "removed when dropped");
    let err = private_work_dir(Path::new("/nonexistent-oomshim"))
        .err()
        .unwrap();
    assert!(err.contains("/nonexistent-oomshim"), "{err}");
}
