//! oomshim's Python hook (shim/python/oomshim_hook) on a Python program's path, whatever
//! launched it. The hook is Python's `sitecustomize`, which starts the package `_oomshim_hook`:
//! it waits for the program to import torch (or jax) and then attaches torch's OOM observer, the
//! step marks and allocator mode; see the package's docstring.
//!
//! `oomshim run` puts the hook's directory first on `PYTHONPATH` for the program. Under plain
//! `LD_PRELOAD=liboomshim.so python train.py` the shim does the same from its load-time
//! constructor ([`prepare_for_python`]), before the interpreter reads its environment: only in a
//! process whose Python is not running yet, only when `OOMSHIM_TORCH_HOOK` is not `0`, and at the
//! cost of one symbol lookup and one `stat` once the files exist. The files are the copies built
//! into this library, written once per content into the user's private oomshim directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The hook, as (path below the hook directory, text): `sitecustomize.py`, which Python runs at
/// start-up, and the one package it imports, `_oomshim_hook`. The package carries its own copies
/// of `oomshim.torch` (allocator mode) and of the code that finds the library, so a program gets
/// no importable name of oomshim's but `_oomshim_hook` (see shim/python/oomshim/torch.py for how a
/// program's own `oomshim.torch` shares the copy's state).
pub const FILES: &[(&str, &str)] = &[
    (
        "sitecustomize.py",
        include_str!("../../shim/python/oomshim_hook/sitecustomize.py"),
    ),
    (
        "_oomshim_hook/__init__.py",
        include_str!("../../shim/python/oomshim_hook/_oomshim_hook/__init__.py"),
    ),
    (
        "_oomshim_hook/kinds.py",
        include_str!("../../shim/python/oomshim_hook/_oomshim_hook/kinds.py"),
    ),
    (
        "_oomshim_hook/allocator.py",
        include_str!("../../shim/python/oomshim/torch.py"),
    ),
    (
        "_oomshim_hook/_locate.py",
        include_str!("../../shim/python/oomshim/_locate.py"),
    ),
];

/// FNV-1a of the files: names the directory, so a changed hook never meets an old copy.
const fn content_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut f = 0;
    while f < FILES.len() {
        let bytes = FILES[f].1.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            h ^= bytes[i] as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        f += 1;
    }
    h
}

const HASH: u64 = content_hash();

/// Name of the marker written last: its presence means every file is complete.
const MARKER: &str = ".complete";

/// True when `OOMSHIM_TORCH_HOOK` switches the hook off.
pub fn disabled_by(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "no" | "false"
        )
    })
}

/// The hook's directory in the user's private oomshim directory, written if it is not complete
/// yet. Returns the directory to put first on `PYTHONPATH`.
pub fn hook_dir() -> Result<PathBuf, String> {
    let base = dump::write::fallback_dir();
    let dir = base.join(format!(
        "python-hook-{}-{HASH:016x}",
        env!("CARGO_PKG_VERSION")
    ));
    // The common case: already written by an earlier run (one stat). The directory's owner is
    // checked on the way in: a planted one is refused.
    if dump::write::prepare_private_dir(&base).is_ok()
        && owned_dir(&dir)
        && dir.join(MARKER).is_file()
    {
        return Ok(dir);
    }
    dump::write::prepare_private_dir(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    dump::write::prepare_private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, text) in FILES {
        write_if_changed(&dir.join(name), text)?;
    }
    write_if_changed(&dir.join(MARKER), "")?;
    Ok(dir)
}

fn owned_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0)
}

/// Writes `text` to `file` atomically unless it already holds exactly that.
fn write_if_changed(file: &Path, text: &str) -> Result<(), String> {
    if std::fs::read_to_string(file).ok().as_deref() == Some(text) {
        return Ok(());
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    dump::write::prepare_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}",
        file.file_name().and_then(|n| n.to_str()).unwrap_or("f"),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|_| std::fs::rename(&tmp, file))
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// `PYTHONPATH` with `dir` first (once: an entry already there is not repeated).
pub fn pythonpath_value(dir: &Path, existing: Option<&std::ffi::OsStr>) -> OsString {
    let mut v = OsString::from(dir.as_os_str());
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        let rest: Vec<&[u8]> = {
            use std::os::unix::ffi::OsStrExt;
            e.as_bytes()
                .split(|&b| b == b':')
                .filter(|p| *p != dir.as_os_str().as_bytes())
                .collect()
        };
        use std::os::unix::ffi::OsStrExt;
        for p in rest {
            v.push(":");
            v.push(std::ffi::OsStr::from_bytes(p));
        }
    }
    v
}

/// Whether a Python interpreter started with these options (argv after argv[0]) never runs the
/// hook: `-S` (no `site`, so no `sitecustomize`), `-E` and `-I` (`PYTHONPATH` ignored). Python's
/// own option syntax: flags may be grouped (`-bIu`), `-W`/`-X` take an argument (attached or the
/// next word), `-c`/`-m`, `-`, `--` or the script's name end the options.
pub fn python_skips_hook(args: &[&[u8]]) -> bool {
    let mut i = 0;
    while i < args.len() {
        let a = args[i];
        if a == b"--check-hash-based-pycs" {
            i += 2;
            continue;
        }
        if a == b"--" || a.len() < 2 || a[0] != b'-' {
            return false;
        }
        if a.starts_with(b"--") {
            i += 1; // --help, --version and the like
            continue;
        }
        for (j, &c) in a[1..].iter().enumerate() {
            match c {
                b'I' | b'E' | b'S' => return true,
                b'c' | b'm' => return false,
                b'W' | b'X' => {
                    if j + 2 == a.len() {
                        i += 1; // the argument is the next word
                    }
                    break;
                }
                _ => {}
            }
        }
        i += 1;
    }
    false
}

/// `argv[0]` names a Python interpreter (`python3`, `/usr/bin/python3.12`, a venv's `python`):
/// only then are the arguments read as Python's options.
fn is_python(argv0: &[u8]) -> bool {
    let base = argv0.rsplit(|&b| b == b'/').next().unwrap_or(argv0);
    base.starts_with(b"python")
}

/// `PYTHONPATH` without a hook directory that `oomshim run` (or a parent) put first, for a
/// process in which the hook will not run: `None` when there is nothing to take off, else the
/// value it had before (`Some(None)`: it was unset or empty).
pub fn without_injected(existing: &[u8], base: &Path) -> Option<Option<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let (first, rest) = match existing.iter().position(|&b| b == b':') {
        Some(i) => (&existing[..i], Some(&existing[i + 1..])),
        None => (existing, None),
    };
    let first = Path::new(std::ffi::OsStr::from_bytes(first));
    let ours = first.parent() == Some(base)
        && first
            .file_name()
            .is_some_and(|n| n.as_bytes().starts_with(b"python-hook-"));
    if !ours {
        return None;
    }
    Some(rest.map(|r| r.to_vec()))
}

/// Called once by the shim's load-time constructor with the process's arguments: in a Python
/// process whose interpreter has not started, puts the hook first on `PYTHONPATH`.
/// `python_not_started`: whether this is such a process (the caller looks up
/// `Py_IsInitialized`). When the hook would not run (switched off, or Python started with
/// `-I`, `-E` or `-S`), nothing is added, and a hook directory `oomshim run` put first is taken
/// off again, so the program and its children see the `PYTHONPATH` they were given. Any failure
/// leaves the environment as it was (the program then runs without torch's insight; `oomshim
/// run` says why in that case).
pub fn prepare_for_python(python_not_started: bool, argv: &[&[u8]]) {
    if !python_not_started {
        return;
    }
    let skipped = argv
        .split_first()
        .is_some_and(|(argv0, args)| is_python(argv0) && python_skips_hook(args));
    if skipped || disabled_by(std::env::var("OOMSHIM_TORCH_HOOK").ok().as_deref()) {
        use std::os::unix::ffi::OsStrExt;
        let Some(existing) = std::env::var_os("PYTHONPATH") else {
            return;
        };
        // At load time, before main: no other thread reads the environment yet.
        match without_injected(existing.as_bytes(), &dump::write::fallback_dir()) {
            None => {}
            Some(Some(rest)) => {
                if let Ok(v) = std::ffi::CString::new(rest) {
                    // SAFETY: NUL-terminated name and value; at load time no other thread
                    // reads or writes the environment yet.
                    unsafe { libc::setenv(c"PYTHONPATH".as_ptr(), v.as_ptr(), 1) };
                }
            }
            // SAFETY: as for `setenv` above.
            Some(None) => unsafe {
                libc::unsetenv(c"PYTHONPATH".as_ptr());
            },
        }
        return;
    }
    let Ok(dir) = hook_dir() else { return };
    let existing = std::env::var_os("PYTHONPATH");
    let first = existing.as_ref().and_then(|e| {
        use std::os::unix::ffi::OsStrExt;
        e.as_bytes()
            .split(|&b| b == b':')
            .next()
            .map(|p| p.to_vec())
    });
    {
        use std::os::unix::ffi::OsStrExt;
        if first.as_deref() == Some(dir.as_os_str().as_bytes()) {
            return; // `oomshim run` (or a parent under the shim) already did it
        }
    }
    let value = pythonpath_value(&dir, existing.as_deref());
    let Ok(c_value) = std::ffi::CString::new({
        use std::os::unix::ffi::OsStrExt;
        value.as_bytes().to_vec()
    }) else {
        return;
    };
    // SAFETY: NUL-terminated name and value; at load time, before main, no other thread
    // reads or writes the environment yet.
    unsafe { libc::setenv(c"PYTHONPATH".as_ptr(), c_value.as_ptr(), 1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pythonpath_puts_the_hook_first_once() {
        let dir = Path::new("/tmp/oomshim-0/python-hook");
        assert_eq!(
            pythonpath_value(dir, None),
            OsString::from("/tmp/oomshim-0/python-hook")
        );
        assert_eq!(
            pythonpath_value(dir, Some("/a:/tmp/oomshim-0/python-hook:/b".as_ref())),
            OsString::from("/tmp/oomshim-0/python-hook:/a:/b")
        );
        assert!(disabled_by(Some(" OFF ")) && disabled_by(Some("0")));
        assert!(!disabled_by(Some("1")) && !disabled_by(None));
    }

    #[test]
    fn python_options_that_keep_the_hook_from_running_are_recognised() {
        let yes =
            |a: &[&str]| python_skips_hook(&a.iter().map(|s| s.as_bytes()).collect::<Vec<_>>());
        assert!(yes(&["-I", "x.py"]) && yes(&["-E", "-c", "pass"]) && yes(&["-S"]));
        assert!(yes(&["-bSu", "x.py"]) && yes(&["-W", "error", "-E", "x.py"]));
        assert!(yes(&["--check-hash-based-pycs", "always", "-I"]));
        assert!(!yes(&["x.py", "-I"]) && !yes(&["-c", "-I"]) && !yes(&["-m", "mod", "-S"]));
        assert!(!yes(&["-WI", "x.py"]) && !yes(&["-X", "S", "x.py"]) && !yes(&["-", "-I"]));
        assert!(!yes(&[]) && !yes(&["-u", "--", "-I"]));
        assert!(is_python(b"/usr/bin/python3.12") && is_python(b"python") && !is_python(b"bash"));
    }

    #[test]
    fn an_injected_hook_directory_is_taken_off_exactly() {
        let base = Path::new("/tmp/oomshim-7");
        let take = |v: &str| without_injected(v.as_bytes(), base);
        assert_eq!(
            take("/tmp/oomshim-7/python-hook-0.1.0-ab::/x"),
            Some(Some(b":/x".to_vec()))
        );
        assert_eq!(take("/tmp/oomshim-7/python-hook-0.1.0-ab"), Some(None));
        assert_eq!(take("/x:/tmp/oomshim-7/python-hook-0.1.0-ab"), None);
        assert_eq!(take("/tmp/other/python-hook-1:/x"), None);
    }

    #[test]
    fn the_hook_directory_is_written_once_and_complete() {
        let dir = hook_dir().unwrap();
        for (name, text) in FILES {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), *text);
        }
        assert!(dir.join(MARKER).is_file());
        assert_eq!(hook_dir().unwrap(), dir, "the same directory again");
    }
}
