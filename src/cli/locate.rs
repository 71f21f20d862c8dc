//! Where the CLI finds `liboomshim.so` for `run` and `demo`. The same places serve every way the
//! CLI is installed: a cargo build (`target/release/`, or `target/release/deps/` where
//! `cargo run` leaves the library), the wheel (the library inside the `oomshim` Python package,
//! the CLI in the environment's `bin/`), or anywhere by `--lib` / `OOMSHIM_LIB`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// File name of the shim library.
pub const LIB_NAME: &str = "liboomshim.so";

/// The environment variable that names the library (also read by `oomshim.torch`).
pub const LIB_ENV: &str = "OOMSHIM_LIB";

/// The library to preload, by this rule (first match wins):
///
/// 1. `--lib PATH` (it must exist);
/// 2. `OOMSHIM_LIB` when set (it must exist: a wrong explicit setting is an error, never
///    silently replaced by another copy);
/// 3. `liboomshim.so` next to the binary, or in `deps/` beside it — the newer of the two, since
///    `cargo run` rebuilds only the `deps/` copy and would otherwise leave a stale one in front;
/// 4. the `oomshim` Python package of the prefix the binary is installed in
///    (`BIN/../lib/python3.*/site-packages/oomshim/liboomshim.so`, where the wheel puts it).
///
/// The error names every place tried.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the oomshim binary: {e}"))?;
    find_library_from(explicit, std::env::var_os(LIB_ENV), &exe)
}

/// [`find_library`] with its inputs given: testable without touching the process.
pub fn find_library_from(
    explicit: Option<&Path>,
    env_lib: Option<OsString>,
    exe: &Path,
) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return std::fs::canonicalize(p).map_err(|e| format!("--lib {}: {e}", p.display()));
    }
    if let Some(v) = env_lib.filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        return if p.is_file() {
            std::fs::canonicalize(&p).map_err(|e| format!("{LIB_ENV}={}: {e}", p.display()))
        } else {
            Err(format!("{LIB_ENV}={} does not name a file", p.display()))
        };
    }
    let mut tried = vec![format!("{LIB_ENV} (unset)")];
    let dir = exe.parent().unwrap_or(Path::new("."));
    let beside = [dir.join(LIB_NAME), dir.join("deps").join(LIB_NAME)];
    let newest = beside
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .filter(|(_, p)| p.is_file())
        .max_by_key(|(t, _)| *t);
    if let Some((_, p)) = newest {
        return Ok(p.clone());
    }
    tried.extend(beside.iter().map(|p| p.display().to_string()));
    let (found, pattern) = in_python_prefix(dir);
    if let Some(p) = found {
        return Ok(p);
    }
    tried.push(pattern);
    Err(format!(
        "{LIB_NAME} not found; tried {}. Build it with `cargo build --release`, install the \
         wheel (README: Install), or pass --lib PATH / set {LIB_ENV}",
        tried.join(", ")
    ))
}

/// `liboomshim.so` in the `oomshim` package of the Python prefix whose `bin/` is `bin_dir`, and
/// the pattern searched (for the error message).
fn in_python_prefix(bin_dir: &Path) -> (Option<PathBuf>, String) {
    let prefix = bin_dir.parent().unwrap_or(bin_dir);
    let pattern = prefix
        .join("lib/python3.*/site-packages/oomshim")
        .join(LIB_NAME)
        .display()
        .to_string();
    let mut candidates: Vec<((u32, u32), PathBuf)> = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("python3") {
                continue;
            }
            // Debian's system Python installs into dist-packages.
            for packages in ["site-packages", "dist-packages"] {
                let p = entry.path().join(packages).join("oomshim").join(LIB_NAME);
                if p.is_file() {
                    candidates.push((python_version(&name), p));
                }
            }
        }
    }
    // Several Python versions in one prefix: the highest version's copy (by its numbers:
    // python3.12 above python3.9), deterministically.
    candidates.sort();
    (candidates.pop().map(|(_, p)| p), pattern)
}

/// (major, minor) of a `pythonX.Y` directory name (`python3.13t` too); a missing or odd part
/// counts as 0.
pub fn python_version(name: &str) -> (u32, u32) {
    let number = |part: Option<&str>| -> u32 {
        let digits: String = part
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().unwrap_or(0)
    };
    let mut parts = name.strip_prefix("python").unwrap_or(name).split('.');
    (number(parts.next()), number(parts.next()))
}
