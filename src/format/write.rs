//! Writing dump files: unique names per host, pid, rank and sequence; atomic (temporary file,
//! fsync, then a rename that never replaces an existing file); a fallback to a private
//! directory under the temp dir when the configured one cannot be written.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Identity that makes dump names unique across the hosts and ranks of a job.
#[derive(Debug, Clone)]
pub struct DumpName {
    pub host: String,
    pub pid: u32,
    pub rank: Option<u32>,
}

impl DumpName {
    /// `oomshim-HOST-PID[-rRANK]-SEQ.json`
    pub fn file_name(&self, seq: u32) -> String {
        let host = sanitize(&self.host);
        match self.rank {
            Some(r) => format!("oomshim-{host}-{}-r{r}-{seq}.json", self.pid),
            None => format!("oomshim-{host}-{}-{seq}.json", self.pid),
        }
    }
}

fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if out.is_empty() {
        "host".to_string()
    } else {
        out
    }
}

/// Where a dump landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub path: PathBuf,
    /// Set when the configured directory could not be used: why, in one line.
    pub fell_back: Option<String>,
}

#[derive(Debug)]
pub struct WriteError {
    pub message: String,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

static NEXT_SEQ: AtomicU32 = AtomicU32::new(1);

/// The sequence number the next dump this process writes tries first (names taken are skipped
/// upward from it).
pub fn next_sequence() -> u32 {
    NEXT_SEQ.load(Ordering::Relaxed)
}

/// Default permission bits of a dump file: readable and writable by its owner only.
pub const DEFAULT_DUMP_MODE: u32 = 0o600;

/// Permission bits of the dump files this process writes (`OOMSHIM_DUMP_MODE`, default 0600).
static FILE_MODE: AtomicU32 = AtomicU32::new(DEFAULT_DUMP_MODE);

/// Sets the permission bits of later dump files (from the configuration, at shim start). The
/// world-writable bit and anything beyond 0777 are dropped whatever the caller says.
pub fn set_file_mode(mode: u32) {
    FILE_MODE.store(mode & 0o775, Ordering::Relaxed);
}

/// The permission bits dump files get.
pub fn file_mode() -> u32 {
    FILE_MODE.load(Ordering::Relaxed)
}

/// Writes `bytes` as a new dump in `dir`, or in the per-user fallback directory if `dir` fails.
pub fn write_dump(dir: &Path, name: &DumpName, bytes: &[u8]) -> Result<Written, WriteError> {
    write_dump_with_mode(dir, name, bytes, file_mode())
}

/// [`write_dump`] with explicit permission bits (the world-writable bit is always dropped).
pub fn write_dump_with_mode(
    dir: &Path,
    name: &DumpName,
    bytes: &[u8],
    mode: u32,
) -> Result<Written, WriteError> {
    let mode = mode & 0o775;
    match write_in(dir, name, bytes, mode) {
        Ok(path) => Ok(Written {
            path,
            fell_back: None,
        }),
        Err(first) => {
            let fallback = fallback_dir();
            let why = format!("cannot write to {}: {first}", crate::units::clean_path(dir));
            match prepare_private_dir(&fallback)
                .and_then(|_| write_in(&fallback, name, bytes, mode))
            {
                Ok(path) => Ok(Written {
                    path,
                    fell_back: Some(why),
                }),
                Err(second) => Err(WriteError {
                    message: format!(
                        "{why}; fallback {} failed too: {second}",
                        crate::units::clean_path(&fallback)
                    ),
                }),
            }
        }
    }
}

/// `$TMPDIR/oomshim-UID` (or `/tmp/oomshim-UID`): private to the user, since the temp dir is shared.
pub fn fallback_dir() -> PathBuf {
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let uid = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("oomshim-{uid}"))
}

pub fn prepare_private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Refuse a directory someone else planted (or a symlink to one).
    let meta = fs::symlink_metadata(dir)?;
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    if !meta.is_dir() || meta.uid() != unsafe { libc::geteuid() } {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "exists but is not a directory owned by this user",
        ));
    }
    Ok(())
}

/// The directory a dump really goes to, opened (`O_DIRECTORY`) so that everything after the
/// checks happens relative to the descriptor and a path swapped meanwhile cannot redirect it.
///
/// - A symlink at `dir` is followed only when it belongs to this user (or root): one planted
///   by another user in a shared directory is refused.
/// - A directory others can write to (mode `o+w`, such as `/tmp`) is shared: the dump goes to
///   its per-user subdirectory `oomshim-UID`, created 0700 and checked to be ours.
fn open_target_dir(dir: &Path) -> io::Result<(std::fs::File, PathBuf)> {
    fs::create_dir_all(dir)?;
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let link = fs::symlink_metadata(dir)?;
    if link.file_type().is_symlink() && link.uid() != euid && link.uid() != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "is a symlink owned by another user (not followed)",
        ));
    }
    let open = |p: &Path, nofollow: bool| {
        OpenOptions::new()
            .read(true)
            .custom_flags(
                libc::O_DIRECTORY | libc::O_CLOEXEC | if nofollow { libc::O_NOFOLLOW } else { 0 },
            )
            .open(p)
    };
    let fd = open(dir, false)?;
    let meta = fd.metadata()?;
    if meta.mode() & 0o002 == 0 {
        return Ok((fd, dir.to_path_buf()));
    }
    // Shared (world-writable): never write into it directly.
    let private = dir.join(format!("oomshim-{euid}"));
    prepare_private_dir(&private)?;
    let fd = open(&private, true)?;
    let meta = fd.metadata()?;
    if meta.uid() != euid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of this user",
                crate::units::clean_path(&private)
            ),
        ));
    }
    Ok((fd, private))
}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Temporary dump files are `.oomshim-HOST-PID-N-SUFFIX.tmp`: the host and pid tell whether the
/// process that wrote one is gone (see [`remove_stale_temps`]).
fn temp_name(host: &str, pid: u32) -> String {
    format!(
        ".oomshim-{}-{pid}-{}-{}.tmp",
        sanitize(host),
        NEXT_SEQ.load(Ordering::Relaxed),
        unique_suffix()
    )
}

/// A temporary file of another host is removed only when it is older than this: its writer
/// cannot be asked whether it is alive.
const STALE_FOREIGN_TEMP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the temporary dump files in `dir` that no live writer will finish: those of processes
/// of this host that no longer exist (a process killed while writing its dump), and those of
/// other hosts older than [`STALE_FOREIGN_TEMP`]. Only names this module writes are touched.
/// (Public for its test in tests/unit/format: the dump writer calls it on every write.)
#[doc(hidden)]
pub fn remove_stale_temps(dfd: libc::c_int, dir: &Path, host: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    let host = sanitize(host);
    for entry in entries.flatten().take(100_000) {
        let file = entry.file_name();
        let Some(name) = file.to_str() else { continue };
        let Some(rest) = name
            .strip_prefix(".oomshim-")
            .and_then(|r| r.strip_suffix(".tmp"))
        else {
            continue;
        };
        // HOST-PID-N-SUFFIX; the host may contain dashes: take the numbers from the right.
        let parts: Vec<&str> = rest.rsplitn(4, '-').collect();
        if parts.len() != 4 || !parts[..3].iter().all(|p| p.parse::<u64>().is_ok()) {
            continue;
        }
        let (pid, their_host) = (parts[2].parse::<u32>().unwrap_or(0), parts[3]);
        let stale = if their_host == host {
            pid != me && pid != 0 && !process_exists(pid)
        } else {
            entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_FOREIGN_TEMP)
        };
        if stale {
            if let Ok(c) = c_name(name) {
                // SAFETY: a NUL-terminated name relative to the open directory `dfd`; only a file
                // this code created (or one it checked is a stale temporary) is removed.
                unsafe { libc::unlinkat(dfd, c.as_ptr(), 0) };
            }
        }
    }
}

fn process_exists(pid: u32) -> bool {
    // SAFETY: `kill` passes integers only; signal 0 only asks whether the pid exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Replaces the dump at `path`, written earlier by this process (a provisional dump whose
/// outcome is now known), with `bytes`: readers see the old file or the new one, never a mix.
pub fn rewrite_dump(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let fail = |e: io::Error| WriteError {
        message: format!("cannot rewrite {}: {e}", crate::units::clean_path(path)),
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| fail(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let dir_fd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(fail)?;
    let dfd = dir_fd.as_raw_fd();
    let host = hostname().unwrap_or_else(|| "host".to_string());
    let c_tmp = c_name(&temp_name(&host, std::process::id())).map_err(fail)?;
    write_temp(dfd, &c_tmp, bytes, file_mode() & 0o775).map_err(fail)?;
    let c_to = c_name(file).map_err(fail)?;
    // SAFETY: NUL-terminated names relative to the open directory `dfd`.
    if unsafe { libc::renameat(dfd, c_tmp.as_ptr(), dfd, c_to.as_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: a NUL-terminated name relative to the open directory `dfd`; only a file
        // this code created (or one it checked is a stale temporary) is removed.
        unsafe { libc::unlinkat(dfd, c_tmp.as_ptr(), 0) };
        return Err(fail(e));
    }
    Ok(())
}

/// This machine's host name (a dump's `process.host`, a temporary file's name), `None` when the
/// system will not say.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `gethostname` writes at most `buf.len()` bytes into the local buffer.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn write_in(dir: &Path, name: &DumpName, bytes: &[u8], mode: u32) -> io::Result<PathBuf> {
    let (dir_fd, dir) = open_target_dir(dir)?;
    let dfd = dir_fd.as_raw_fd();
    remove_stale_temps(dfd, &dir, &name.host);
    let c_tmp = c_name(&temp_name(&name.host, name.pid))?;
    // SAFETY: a NUL-terminated name relative to the open directory `dfd`; only a file
    // this code created (or one it checked is a stale temporary) is removed.
    let remove_tmp = || unsafe {
        libc::unlinkat(dfd, c_tmp.as_ptr(), 0);
    };
    write_temp(dfd, &c_tmp, bytes, mode)?;
    // Claim the next free name without ever replacing a file.
    for _ in 0..10_000 {
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        let file_name = name.file_name(seq);
        let c_to = c_name(&file_name)?;
        match rename_noreplace(dfd, &c_tmp, &c_to) {
            Ok(()) => return Ok(dir.join(file_name)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                remove_tmp();
                return Err(e);
            }
        }
    }
    remove_tmp();
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free dump name",
    ))
}

/// Creates `name` in the directory `dfd` as a new file (`O_CREAT|O_EXCL|O_NOFOLLOW`: never an
/// existing file, never through a planted symlink), writes `bytes`, fsyncs it and sets exactly
/// `mode`. On any failure the file is removed again, so a full disk or `RLIMIT_FSIZE` leaves
/// nothing behind. Shared by dumps and by every file the CLI writes.
fn write_temp(dfd: libc::c_int, name: &CString, bytes: &[u8], mode: u32) -> io::Result<()> {
    // SAFETY: a NUL-terminated name relative to the open directory `dfd`; the mode is
    // the variadic unsigned int `openat` reads with O_CREAT.
    let fd = unsafe {
        libc::openat(
            dfd,
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            // Never wider than 0600 while it is being written, whatever was asked.
            (mode & 0o600) as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened here and nothing else owns it: the File alone closes it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    // A full disk or RLIMIT_FSIZE must fail this write, not kill the process: SIGXFSZ is held
    // off on this thread meanwhile (and the one the write raised consumed), so the write
    // returns EFBIG.
    let result = crate::signals::with_signal_held(libc::SIGXFSZ, || {
        file.write_all(bytes).and_then(|_| file.sync_all())
    })
    // Exactly the asked bits, whatever the umask took away (never more, never less).
    .and_then(|_| {
        // SAFETY: `fchmod` of a descriptor the File holds open; integers only.
        if unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    });
    drop(file);
    if result.is_err() {
        // SAFETY: a NUL-terminated name relative to the open directory `dfd`; only a file
        // this code created (or one it checked is a stale temporary) is removed.
        unsafe { libc::unlinkat(dfd, name.as_ptr(), 0) };
    }
    result
}

/// Writes `bytes` to `target` atomically: a new temporary file with a random name in the
/// target's directory (created `O_CREAT|O_EXCL|O_NOFOLLOW`, so a symlink or file planted at any
/// name is never followed or reused), fsynced, given exactly `mode` (the world-writable bit is
/// dropped), then renamed over `target`. A symlink at `target` itself is replaced, not
/// followed. On failure nothing is left behind and `target` is untouched. Used for every file
/// the CLI writes (HTML reports, memory-viz pickles, the Python hook).
pub fn write_file_atomically(target: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the output path names no file")
    })?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir_fd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let dfd = dir_fd.as_raw_fd();
    let c_to = CString::new(name.as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // The temporary name: hidden, recognisably ours, unguessable, and short enough for any
    // file system whatever the target's name.
    let mut tmp = b".".to_vec();
    tmp.extend(name.as_encoded_bytes().iter().take(200));
    tmp.extend(format!(".oomshim-{:016x}.tmp", random_u64()).bytes());
    let c_tmp = CString::new(tmp).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    write_temp(dfd, &c_tmp, bytes, mode & 0o775)?;
    // SAFETY: NUL-terminated names relative to the open directory `dfd`.
    if unsafe { libc::renameat(dfd, c_tmp.as_ptr(), dfd, c_to.as_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: a NUL-terminated name relative to the open directory `dfd`; only a file
        // this code created (or one it checked is a stale temporary) is removed.
        unsafe { libc::unlinkat(dfd, c_tmp.as_ptr(), 0) };
        return Err(e);
    }
    Ok(())
}

/// 64 random bits from the kernel (`getrandom`), or, should that fail, from the clock, a
/// counter and the pid: only ever a name, whose creation is `O_EXCL` anyway.
fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: `getrandom` writes at most 8 bytes into `v`, a local u64.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, libc::GRND_NONBLOCK) };
    if n == 8 {
        v
    } else {
        unique_suffix() ^ ((std::process::id() as u64) << 40)
    }
}

fn unique_suffix() -> u64 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    ((COUNTER.fetch_add(1, Ordering::Relaxed) as u64) << 32) | nanos as u64
}

/// `renameat2(RENAME_NOREPLACE)` inside one directory, or `linkat` + `unlinkat` where the file
/// system lacks it.
fn rename_noreplace(dfd: libc::c_int, from: &CString, to: &CString) -> io::Result<()> {
    let rc =
        // SAFETY: NUL-terminated names relative to the open directory `dfd`.
        unsafe { libc::renameat2(dfd, from.as_ptr(), dfd, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => {
            // SAFETY: NUL-terminated names relative to the open directory `dfd`.
            if unsafe { libc::linkat(dfd, from.as_ptr(), dfd, to.as_ptr(), 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a NUL-terminated name relative to the open directory `dfd`; only a file
            // this code created (or one it checked is a stale temporary) is removed.
            unsafe { libc::unlinkat(dfd, from.as_ptr(), 0) };
            Ok(())
        }
        _ => Err(err),
    }
}
