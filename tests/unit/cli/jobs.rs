//! Unit tests of `oomshim_cli::jobs` (src/cli/jobs.rs).

use oomshim_cli::jobs::targets_of_environ;
use std::path::Path;

#[test]
fn the_environment_a_process_started_with_names_its_files() {
    let raw = b"PATH=/bin\0TORCHELASTIC_ERROR_FILE=/logs/1/error.json\0OOMSHIM_TERMINATION_LOG=/t/log\0X=a=b\0\0";
    let t = targets_of_environ(raw);
    assert_eq!(
        t.error_file.as_deref(),
        Some(Path::new("/logs/1/error.json"))
    );
    assert_eq!(t.termination_log.as_deref(), Some(Path::new("/t/log")));
    // Its own settings count, not oomshim run's.
    let t = targets_of_environ(b"TORCHELASTIC_ERROR_FILE=/e\0OOMSHIM_TORCHELASTIC=0\0");
    assert_eq!(t.error_file, None);
    assert_eq!(
        targets_of_environ(b"garbage without equals").error_file,
        None
    );
    // The first of a variable set twice, as getenv (the process's own shim) sees it.
    let t = targets_of_environ(b"TORCHELASTIC_ERROR_FILE=/a\0TORCHELASTIC_ERROR_FILE=/b\0");
    assert_eq!(t.error_file.as_deref(), Some(Path::new("/a")));
}
