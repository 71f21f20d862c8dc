//! `oomshim demo`: the whole job on a machine without a GPU. A bundled training-loop client
//! with a classic leak runs against the bundled simulated CUDA device under the shim until it
//! runs out of memory; the dump it leaves is then reported.

use super::run::{spawn_and_wait, RunOptions};
use crate::testbed::{DEMO_CLIENT, SIM_CUDART_SO};
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Capacity of the simulated device the demo runs on.
pub const DEMO_CAPACITY: &str = "8G";

pub struct DemoOutcome {
    pub client_exit: i32,
    pub dump: PathBuf,
}

/// Unpacks the client and runtime into a private temporary directory, runs the client under
/// the shim with dumps going to `dump_dir`, and returns the dump it wrote.
pub fn run_demo(lib: PathBuf, dump_dir: &Path) -> Result<DemoOutcome, String> {
    let work = std::env::temp_dir().join(format!("oomshim-demo-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(work.clone());
    fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let runtime = work.join("libcudart.so.13");
    let client = work.join("demo_train");
    fs::write(&runtime, SIM_CUDART_SO)
        .map_err(|e| format!("cannot write {}: {e}", runtime.display()))?;
    fs::write(&client, DEMO_CLIENT)
        .map_err(|e| format!("cannot write {}: {e}", client.display()))?;
    fs::set_permissions(&client, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;

    fs::create_dir_all(dump_dir)
        .map_err(|e| format!("cannot create {}: {e}", dump_dir.display()))?;
    let command = [client.clone().into_os_string()];
    let (pid, client_exit) = spawn_and_wait(&RunOptions {
        lib,
        torch_hook: false,
        dir: Some(dump_dir),
        command: &command,
        extra_env: vec![
            (
                OsString::from("SIMCUDA_CAPACITY"),
                OsString::from(DEMO_CAPACITY),
            ),
            // The demo process exits right after its OOM; no need to wait for a retry.
            (OsString::from("OOMSHIM_SETTLE"), OsString::from("0.2s")),
        ],
    })
    .map_err(|e| e.message)?;
    let dump = find_dump_of(dump_dir, pid).ok_or_else(|| {
        format!(
            "the demo client (pid {pid}) left no dump in {}",
            dump_dir.display()
        )
    })?;
    Ok(DemoOutcome { client_exit, dump })
}

/// The newest dump in `dir` written by process `pid`.
pub fn find_dump_of(dir: &Path, pid: u32) -> Option<PathBuf> {
    let marker = format!("-{pid}-");
    fs::read_dir(dir)
        .ok()?
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
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
