//! `oomshim run -- CMD`: starts CMD with liboomshim.so preloaded.
//!
//! By default oomshim stays as the program's parent ([`super::supervise`]), invisible to job
//! control, so that it can write a post-mortem dump when the program is killed outright.
//! `oomshim run --exec` instead **replaces oomshim with the program** (`execvp`, as `env`,
//! `nice` and `numactl` do): the program keeps oomshim's pid, so every signal reaches it exactly
//! as without oomshim, and there is nothing left to write a post-mortem. The supervisor's rule
//! for telling a signal sent to oomshim alone from one the program got too is a heuristic with
//! a documented ambiguity (README, `oomshim run`); `--exec` has none.
//!
//! Exit statuses of oomshim itself, as `env` and the shells use them: 125 when oomshim cannot
//! prepare the run (no usable library), 126 when the program exists but cannot be executed,
//! 127 when it is not found.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

pub use super::locate::{find_library, LIB_NAME};

/// oomshim could not prepare the run (e.g. no library it can preload).
pub const EXIT_RUN_FAILED: i32 = 125;
/// The program exists but could not be executed (no execute permission, a directory, a bad
/// interpreter), as shells report it.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// The program was not found, as shells report it.
pub const EXIT_NOT_FOUND: i32 = 127;

/// Why the program was not run: one line, and the exit status to end with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    pub message: String,
    pub code: i32,
}

impl RunError {
    fn setup(message: String) -> RunError {
        RunError {
            message,
            code: EXIT_RUN_FAILED,
        }
    }
}

/// ld.so splits `LD_PRELOAD` at spaces and colons (ld.so(8)), and has no way to quote them: a
/// library whose path holds either would not be loaded, and the program would run untracked
/// with only ld.so's warning. Refused up front instead, saying what to do.
pub fn check_preloadable(lib: &Path) -> Result<(), String> {
    if lib
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|&b| b == b' ' || b == b':')
    {
        return Err(format!(
            "cannot preload {}: ld.so splits LD_PRELOAD at spaces and colons, so the library's \
             path must hold neither; copy or link {LIB_NAME} to a path without them (for example \
             ~/.local/lib/{LIB_NAME}) and pass it with --lib",
            dump::units::clean_path(lib)
        ));
    }
    Ok(())
}

/// `LD_PRELOAD` with `lib` first and whatever was already there after it (once).
pub fn preload_value(lib: &Path, existing: Option<&OsStr>) -> OsString {
    let mut v = OsString::from(lib.as_os_str());
    if let Some(existing) = existing {
        let rest: Vec<&str> = existing
            .to_str()
            .map(|s| {
                s.split([':', ' '])
                    .filter(|p| !p.is_empty() && Path::new(p) != lib)
                    .collect()
            })
            .unwrap_or_default();
        if existing.to_str().is_none() {
            // Not UTF-8: keep it byte for byte.
            v.push(":");
            v.push(existing);
        } else if !rest.is_empty() {
            v.push(":");
            v.push(rest.join(":"));
        }
    }
    v
}

/// How a child ended, as a shell would report it.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

/// The Python hook's directory (src/core/pyhook.rs), written if needed.
pub fn python_hook_dir() -> Result<PathBuf, String> {
    oomshim_core::pyhook::hook_dir()
}

pub struct RunOptions<'a> {
    pub lib: PathBuf,
    /// Inject the Python hook that saves torch's snapshot at OutOfMemoryError.
    pub torch_hook: bool,
    pub dir: Option<&'a Path>,
    pub command: &'a [OsString],
    pub extra_env: Vec<(OsString, OsString)>,
    /// `--exit-code`: a failed program's status becomes its first failure's retry hint's
    /// (src/cli/jobs.rs); off, the status is the program's own.
    pub exit_code: bool,
}

/// The program's command: its arguments, the preload and the settings in its environment.
pub fn command(opts: &RunOptions) -> Result<Command, RunError> {
    let (program, args) = opts.command.split_first().ok_or_else(|| {
        RunError::setup("no command given (usage: oomshim run -- CMD ARGS…)".into())
    })?;
    check_preloadable(&opts.lib).map_err(RunError::setup)?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.env(
        "LD_PRELOAD",
        preload_value(&opts.lib, std::env::var_os("LD_PRELOAD").as_deref()),
    );
    if let Some(dir) = opts.dir {
        // Absolute, so the Python hook (which reads it too) agrees with the shim wherever the
        // program moves to; the shim itself resolves a relative one where the program started.
        cmd.env(
            "OOMSHIM_DIR",
            std::path::absolute(dir).unwrap_or(dir.into()),
        );
    }
    if let Some(live) = std::env::var_os("OOMSHIM_LIVE_DIR").filter(|v| !v.is_empty()) {
        // Absolute, as for OOMSHIM_DIR: the program and oomshim (which reads the regions for a
        // post-mortem) agree on it wherever the program moves to.
        let live = PathBuf::from(live);
        if live.is_relative() {
            cmd.env(
                "OOMSHIM_LIVE_DIR",
                oomshim_core::config::resolve_dir(&live, std::env::current_dir().ok().as_deref()),
            );
        }
    }
    if opts.torch_hook {
        // The shim puts the hook on PYTHONPATH by itself, in each Python process only, before
        // its interpreter starts (src/core/pyhook.rs): the program and its other descendants
        // (shells, tools) see the PYTHONPATH they were given. Written here first only so that
        // a failure to write it is said once, now.
        if let Err(e) = python_hook_dir() {
            // The program still runs, with the shim; only torch's own snapshot will be missing.
            eprintln!("oomshim: the Python hook is off: {e}");
        }
    } else {
        // The shim would put the hook on the path by itself (src/core/pyhook.rs): say no to it too.
        cmd.env("OOMSHIM_TORCH_HOOK", "0");
    }
    for (k, v) in &opts.extra_env {
        cmd.env(k, v);
    }
    Ok(cmd)
}

/// Replaces this process with the program (see the module's comment for why). Returns only
/// when that failed, with why and the shell's status for it.
pub fn exec(opts: &RunOptions) -> RunError {
    match command(opts) {
        Ok(mut cmd) => launch_error(&opts.command[0], cmd.exec()),
        Err(e) => e,
    }
}

/// Runs the program as a child to completion (for `oomshim demo`, which reports its dump
/// afterwards); returns (child pid, exit code as a shell reports it).
pub fn spawn_and_wait(opts: &RunOptions) -> Result<(u32, i32), RunError> {
    let mut cmd = command(opts)?;
    let mut child = cmd.spawn().map_err(|e| launch_error(&opts.command[0], e))?;
    let pid = child.id();
    // Its region's name, read while it certainly exists (running, or a zombie of ours).
    let start_ticks = oomshim_core::flight::start_ticks_of(pid);
    let status = child
        .wait()
        .map_err(|e| RunError::setup(format!("waiting for the child failed: {e}")))?;
    // It ended: a live region it left (killed before its exit handler ran) is stale, and no
    // post-mortem will read it here (only `oomshim run` writes those).
    if let Some(ticks) = start_ticks {
        let _ = std::fs::remove_file(
            live_dir_of(opts).join(oomshim_core::flight::region_name(pid, ticks)),
        );
    }
    Ok((pid, exit_code(status)))
}

/// The live directory the child used: `OOMSHIM_LIVE_DIR` as given to it, else as here,
/// relative to where it started (here).
fn live_dir_of(opts: &RunOptions) -> PathBuf {
    let given = opts
        .extra_env
        .iter()
        .rev()
        .find(|(k, _)| k == "OOMSHIM_LIVE_DIR")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var_os("OOMSHIM_LIVE_DIR"));
    oomshim_core::config::resolve_dir(
        &oomshim_core::flight::live_dir_from(given),
        std::env::current_dir().ok().as_deref(),
    )
}

/// An `exec` failure as shells report it: 127 when the program is nowhere to be found, 126
/// when it is there but cannot be executed (no execute permission, a directory, a missing
/// interpreter or loader, a wrong architecture).
pub(crate) fn launch_error(program: &OsStr, e: std::io::Error) -> RunError {
    let name = dump::units::clean(&program.to_string_lossy());
    if e.kind() == std::io::ErrorKind::NotFound && !program_exists(program) {
        let where_ = if program.as_bytes().contains(&b'/') {
            "no such file"
        } else {
            "not in PATH"
        };
        return RunError {
            message: format!("cannot run {name}: command not found ({where_})"),
            code: EXIT_NOT_FOUND,
        };
    }
    let hint = match e.kind() {
        std::io::ErrorKind::PermissionDenied => " (is it an executable file? chmod +x)",
        std::io::ErrorKind::NotFound => " (its interpreter or loader is missing)",
        _ => "",
    };
    RunError {
        message: format!("cannot run {name}: {e}{hint}"),
        code: EXIT_CANNOT_EXECUTE,
    }
}

/// Whether `program` names something that exists: the path itself when it has a `/`, else an
/// entry of `PATH` (glibc's default when unset), as `execvp` looks it up.
fn program_exists(program: &OsStr) -> bool {
    if program.as_bytes().contains(&b'/') {
        return Path::new(program).exists();
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path).any(|d| d.join(program).exists())
}
