//! `oomshim run -- CMD`: starts CMD with liboomshim.so preloaded, forwards the signals sent to
//! oomshim, and exits as the child did (128 + signal when it was killed).

use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use super::locate::{find_library, LIB_NAME};

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

/// The Python hook's directory (src/pyhook.rs), written if needed.
pub fn python_hook_dir() -> Result<PathBuf, String> {
    crate::pyhook::hook_dir()
}

/// `PYTHONPATH` with `dir` first.
pub fn pythonpath_value(dir: &Path, existing: Option<&OsStr>) -> OsString {
    crate::pyhook::pythonpath_value(dir, existing)
}

pub struct RunOptions<'a> {
    pub lib: PathBuf,
    /// Inject the Python hook that saves torch's snapshot at OutOfMemoryError.
    pub torch_hook: bool,
    pub dir: Option<&'a Path>,
    pub command: &'a [OsString],
    pub extra_env: Vec<(OsString, OsString)>,
}

/// Runs the command to completion; returns (child pid, exit code).
pub fn run(opts: &RunOptions) -> Result<(u32, i32), String> {
    let (program, args) = opts
        .command
        .split_first()
        .ok_or("no command given (usage: oomshim run -- CMD ARGS…)")?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.env(
        "LD_PRELOAD",
        preload_value(&opts.lib, std::env::var_os("LD_PRELOAD").as_deref()),
    );
    if let Some(dir) = opts.dir {
        cmd.env("OOMSHIM_DIR", dir);
    }
    if opts.torch_hook {
        match python_hook_dir() {
            Ok(dir) => {
                cmd.env(
                    "PYTHONPATH",
                    pythonpath_value(&dir, std::env::var_os("PYTHONPATH").as_deref()),
                );
            }
            // The program still runs, with the shim; only torch's own snapshot will be missing.
            Err(e) => eprintln!("oomshim: the Python hook is off: {e}"),
        }
    } else {
        // The shim would put the hook on the path by itself (src/pyhook.rs): say no to it too.
        cmd.env("OOMSHIM_TORCH_HOOK", "0");
    }
    for (k, v) in &opts.extra_env {
        cmd.env(k, v);
    }
    // Register before spawning so no signal falls in between.
    let forwarded = [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2];
    let mut signals = SignalsInfo::<WithOrigin>::new(forwarded)
        .map_err(|e| format!("cannot set up signal forwarding: {e}"))?;
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.to_string_lossy()))?;
    let pid = child.id();
    let handle = signals.handle();
    let forwarder = std::thread::spawn(move || {
        for origin in signals.forever() {
            // Signals the terminal sends (Ctrl-C) reach the child directly: it is in our process
            // group. Forwarding those too would deliver them twice; forward only sent ones.
            if !matches!(origin.cause, Cause::Kernel) {
                unsafe { libc::kill(pid as libc::pid_t, origin.signal) };
            }
        }
    });
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the child failed: {e}"))?;
    handle.close();
    let _ = forwarder.join();
    Ok((pid, exit_code(status)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
