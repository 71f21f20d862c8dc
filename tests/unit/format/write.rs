//! Unit tests of `dump::write` (src/format/write.rs).

use dump::write::*;
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

#[test]
fn stale_temporary_files_of_dead_writers_are_removed_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    // A pid that existed and is gone: a child that has been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let me = std::process::id();
    let names = [
        (format!(".oomshim-gpu-node-7-{dead}-1-1712.tmp"), false), // its writer died
        (format!(".oomshim-gpu-node-7-{me}-2-3434.tmp"), true),    // this process is writing it
        (".oomshim-gpu-node-7-1-3-5656.tmp".to_string(), true),    // pid 1 lives
        (format!(".oomshim-other-host-{dead}-1-1712.tmp"), true),  // another host's, fresh
        (".oomshim-notes.tmp".to_string(), true),                  // not a name this module writes
        (format!("oomshim-gpu-node-7-{dead}-1.json"), true),       // a dump, never touched
    ];
    for (n, _) in &names {
        fs::write(dir.path().join(n), b"x").unwrap();
    }
    let c = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path; the descriptor is closed by this test.
    let dfd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(dfd >= 0);
    remove_stale_temps(dfd, dir.path(), "gpu-node-7");
    // SAFETY: closes a descriptor this code opened and uses no more.
    unsafe { libc::close(dfd) };
    for (n, kept) in &names {
        assert_eq!(dir.path().join(n).exists(), *kept, "{n}");
    }
}

fn name() -> DumpName {
    DumpName {
        host: "gpu-node 7".into(),
        pid: 4242,
        rank: None,
    }
}

#[test]
fn names_carry_host_pid_rank_and_sequence() {
    assert_eq!(name().file_name(1), "oomshim-gpu-node_7-4242-1.json");
    let ranked = DumpName {
        rank: Some(3),
        ..name()
    };
    assert_eq!(ranked.file_name(2), "oomshim-gpu-node_7-4242-r3-2.json");
    assert_eq!(
        DumpName {
            host: "".into(),
            ..name()
        }
        .file_name(1),
        "oomshim-host-4242-1.json"
    );
}

#[test]
fn writes_atomically_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_dump(dir.path(), &name(), b"{\"a\":1}").unwrap();
    let b = write_dump(dir.path(), &name(), b"{\"b\":2}").unwrap();
    assert_ne!(a.path, b.path);
    assert!(a.fell_back.is_none());
    assert_eq!(fs::read(&a.path).unwrap(), b"{\"a\":1}");
    assert_eq!(fs::read(&b.path).unwrap(), b"{\"b\":2}");
    // No temporary files are left behind.
    let names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names
        .iter()
        .all(|n| n.starts_with("oomshim-") && n.ends_with(".json")));
    let mode = fs::metadata(&a.path).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn an_existing_file_with_the_next_name_is_skipped_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let seq = next_sequence();
    for s in seq..seq + 3 {
        fs::write(dir.path().join(name().file_name(s)), b"keep").unwrap();
    }
    let w = write_dump(dir.path(), &name(), b"new").unwrap();
    for s in seq..seq + 3 {
        let p = dir.path().join(name().file_name(s));
        if p != w.path {
            assert_eq!(fs::read(&p).unwrap(), b"keep");
        }
    }
    assert_eq!(fs::read(&w.path).unwrap(), b"new");
}

#[test]
fn unusable_directory_falls_back_to_the_private_temp_dir() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    fs::write(&file, b"x").unwrap();
    let w = write_dump(&file.join("sub"), &name(), b"{}").unwrap();
    assert!(w.path.starts_with(fallback_dir()), "{:?}", w.path);
    assert!(w.fell_back.as_deref().unwrap().contains("not-a-dir"));
    fs::remove_file(&w.path).unwrap();
}

#[test]
fn symlinks_planted_at_the_next_dump_names_are_neither_followed_nor_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let victim = elsewhere.path().join("victim");
    fs::write(&victim, b"keep").unwrap();
    let seq = next_sequence();
    for s in seq..seq + 3 {
        std::os::unix::fs::symlink(&victim, dir.path().join(name().file_name(s))).unwrap();
    }
    let w = write_dump(dir.path(), &name(), b"new").unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    assert!(!fs::symlink_metadata(&w.path)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&w.path).unwrap(), b"new");
    for s in seq..seq + 3 {
        let p = dir.path().join(name().file_name(s));
        if p != w.path {
            assert!(fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        }
    }
}

#[test]
fn the_configured_mode_is_applied_exactly_and_never_world_writable() {
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    // 0660 survives any umask (the usual 022 would have made it 0640): applied exactly.
    let a = write_dump_with_mode(dir.path(), &name(), b"{}", 0o660).unwrap();
    assert_eq!(mode(&a.path), 0o660);
    let b = write_dump_with_mode(dir.path(), &name(), b"{}", 0o400).unwrap();
    assert_eq!(mode(&b.path), 0o400);
    // World-writable is dropped even if asked for here (config.rs refuses it already).
    let c = write_dump_with_mode(dir.path(), &name(), b"{}", 0o666).unwrap();
    assert_eq!(mode(&c.path), 0o664);
    assert_eq!(file_mode(), 0o600, "the default");
}

#[test]
fn a_world_writable_directory_gets_a_private_subdirectory() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let shared = base.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let w = write_dump(&shared, &name(), b"{}").unwrap();
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        w.path.parent().unwrap(),
        shared.join(format!("oomshim-{uid}"))
    );
    assert!(w.fell_back.is_none());
    let meta = fs::metadata(w.path.parent().unwrap()).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700);
    assert_eq!(fs::metadata(&w.path).unwrap().mode() & 0o777, 0o600);
}
