//! `oomshim demo`: the whole job on a machine without a GPU. A bundled training-loop client
//! with a classic leak runs against the bundled simulated CUDA device under the shim until it
//! runs out of memory; the dump it leaves is then reported. The client also asks for a snapshot
//! at an early step ([`SNAPSHOT_STEP`]), so `oomshim diff` has two states of one run to compare.

use super::run::{spawn_and_wait, RunOptions};
use crate::testbed::{DEMO_CLIENT, SIM_CUDART_SO};
use dump::units::clean_path;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Capacity of the simulated device the demo runs on.
pub const DEMO_CAPACITY: &str = "8G";

/// The step after which the demo client writes its snapshot (tests/clients/demo_train.c).
pub const SNAPSHOT_STEP: u32 = 20;

/// Holders and sites the demo's dumps list (`OOMSHIM_TOP`): more than the client ever has live
/// (about 70 allocations), so the dumps hold every live allocation and a memory_viz export of
/// them has no "not in the dump" remainder. The default, 20, would leave most of the demo's
/// activations out of the holders.
pub const DEMO_TOP: &str = "1000";

pub struct DemoOutcome {
    pub client_exit: i32,
    /// The out-of-memory dump.
    pub dump: PathBuf,
    /// The snapshot written at [`SNAPSHOT_STEP`], when the client got that far.
    pub snapshot: Option<PathBuf>,
}

/// Unpacks the client and runtime into a private temporary directory, runs the client under
/// the shim with dumps going to `dump_dir`, and returns the dump it wrote.
pub fn run_demo(lib: PathBuf, dump_dir: &Path) -> Result<DemoOutcome, String> {
    let work = private_work_dir(&std::env::temp_dir())?;
    // The simulated runtime loads the driver (libcuda.so.1) from its own directory: the
    // directory must hold exactly what the demo put there, hence a fresh private one.
    let runtime = work.path().join(crate::testbed::SIM_CUDART_NAME);
    let client = work.path().join(crate::testbed::DEMO_CLIENT_NAME);
    create_new_file(&runtime, SIM_CUDART_SO, 0o600)?;
    create_new_file(&client, DEMO_CLIENT, 0o700)?;

    // A directory that cannot be made is the shim's to handle: it writes where it can (a
    // private directory of $TMPDIR) and says so; the demo then finds the dumps there.
    let _ = fs::create_dir_all(dump_dir);
    let command = [client.clone().into_os_string()];
    let (pid, client_exit) = spawn_and_wait(&RunOptions {
        lib,
        torch_hook: false,
        dir: Some(dump_dir),
        command: &command,
        exit_code: false,
        extra_env: vec![
            (
                OsString::from("SIMCUDA_CAPACITY"),
                OsString::from(DEMO_CAPACITY),
            ),
            // The demo process exits right after its OOM; no need to wait for a retry.
            (OsString::from("OOMSHIM_SETTLE"), OsString::from("0.2s")),
            (OsString::from("OOMSHIM_TOP"), OsString::from(DEMO_TOP)),
        ],
    })
    .map_err(|e| e.message)?;
    let places = dump_places(dump_dir);
    let mut dumps = places
        .iter()
        .map(|dir| dumps_of(dir, pid))
        .find(|found| !found.is_empty())
        .unwrap_or_default();
    let dump = dumps.pop().ok_or_else(|| {
        format!(
            "the demo client (pid {pid}) left no dump in {}",
            places
                .iter()
                .map(|p| clean_path(p))
                .collect::<Vec<_>>()
                .join(" or ")
        )
    })?;
    Ok(DemoOutcome {
        client_exit,
        dump,
        snapshot: dumps.pop(),
    })
}

/// Where the shim may have put the dumps it was told to write into `dir`: there, its private
/// `oomshim-UID` subdirectory (a world-writable `dir`), or the per-user fallback directory of
/// `$TMPDIR` (a `dir` it cannot write).
pub fn dump_places(dir: &Path) -> Vec<PathBuf> {
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    let uid = unsafe { libc::geteuid() };
    vec![
        dir.to_path_buf(),
        dir.join(format!("oomshim-{uid}")),
        dump::write::fallback_dir(),
    ]
}

/// The dumps in `dir` written by process `pid`, oldest first (by modification time, then name).
fn dumps_of(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let marker = format!("-{pid}-");
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("oomshim-")
                    && !n.starts_with("oomshim-torch-")
                    && n.ends_with(".json")
                    && n.contains(&marker)
            })
        })
        .map(|p| (fs::metadata(&p).and_then(|m| m.modified()).ok(), p))
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// A directory of the demo's own, removed with everything in it when dropped.
pub struct WorkDir(PathBuf);

impl WorkDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A new directory `PARENT/oomshim-demo-XXXXXX` from `mkdtemp`: a random name, created 0700
/// by this call (never one that existed before, whoever made it), so nothing another user
/// planted in a shared temporary directory can end up in it.
pub fn private_work_dir(parent: &Path) -> Result<WorkDir, String> {
    let mut template = parent
        .join("oomshim-demo-XXXXXX")
        .into_os_string()
        .into_vec();
    template.push(0);
    // SAFETY: `template` is a NUL-terminated, writable buffer; `mkdtemp` rewrites its XXXXXX
    // in place and returns it or NULL.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "cannot create a private directory in {}: {e}",
            clean_path(parent)
        ));
    }
    template.pop();
    Ok(WorkDir(PathBuf::from(std::ffi::OsString::from_vec(
        template,
    ))))
}

/// Creates `path` as a new file (`O_EXCL|O_NOFOLLOW`) holding `bytes`, with `mode`.
fn create_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| format!("cannot write {}: {e}", clean_path(path)))
}
