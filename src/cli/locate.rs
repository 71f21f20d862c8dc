//! Where the CLI finds `liboomshim.so` for `run` and `demo`. The same places serve every way the
//! CLI is installed: a cargo build (`target/release/`, or `target/release/deps/` where
//! `cargo run` leaves the library), the wheel (the library inside the `oomshim` Python package,
//! the CLI in the environment's `bin/`), or anywhere by `--lib` / `OOMSHIM_LIB`.

use dump::units::clean_path;
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
///
/// Whichever it is, it must be oomshim's shim ([`check_shim_library`]): a wrong file would
/// otherwise start the program untracked, with only ld.so's warning.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the oomshim binary: {e}"))?;
    let env_lib = std::env::var_os(LIB_ENV).filter(|v| !v.is_empty());
    let lib = find_library_from(explicit, env_lib.clone(), &exe)?;
    check_shim_library(&lib).map_err(|why| {
        let named = match (explicit, &env_lib) {
            (Some(p), _) => format!("--lib {}", clean_path(p)),
            (None, Some(v)) => format!("{LIB_ENV}={}", clean_path(Path::new(v))),
            (None, None) => clean_path(&lib),
        };
        format!("{named}: {why}; pass the {LIB_NAME} that `cargo build --release` or the wheel installs")
    })?;
    Ok(lib)
}

/// The symbols every build of the shim exports (its C API and the first CUDA hook).
const SHIM_SYMBOLS: [&str; 2] = ["oomshim_dump", "cudaMalloc"];

/// Whether `path` is oomshim's shim: an ELF shared object of this machine's kind whose dynamic
/// symbol table defines [`SHIM_SYMBOLS`]. Read from the file (never loaded: its constructors
/// must not run in the CLI). A library without section headers cannot be checked further than
/// its header and passes.
pub fn check_shim_library(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let read = |offset: u64, size: usize| -> Result<Vec<u8>, String> {
        if offset.checked_add(size as u64).is_none_or(|end| end > len) {
            return Err("a cut-short ELF file".to_string());
        }
        let mut buf = vec![0; size];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| e.to_string())?;
        Ok(buf)
    };
    let mut magic = [0u8; 4];
    if file.read_exact_at(&mut magic, 0).is_err() || &magic != b"\x7fELF" {
        return Err("not a shared library (no ELF header)".to_string());
    }
    let header =
        read(0, 64).map_err(|_| "not a shared library (a cut-short ELF header)".to_string())?;
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    if header[4] != 2 || header[5] != 1 {
        return Err(
            "an ELF file for another kind of machine (not 64-bit little-endian)".to_string(),
        );
    }
    const ET_DYN: u16 = 3;
    let kind = u16_at(&header, 16);
    if kind != ET_DYN {
        return Err(format!(
            "an ELF {}, not a shared library",
            match kind {
                1 => "object file",
                2 => "executable",
                4 => "core file",
                _ => "file",
            }
        ));
    }
    let machine = u16_at(&header, 18);
    let ours: u16 = if cfg!(target_arch = "x86_64") {
        62
    } else if cfg!(target_arch = "aarch64") {
        183
    } else {
        machine
    };
    if machine != ours {
        return Err(format!(
            "a shared library for another machine (ELF machine {machine})"
        ));
    }
    let (shoff, shentsize, shnum) = (
        u64_at(&header, 40),
        u16_at(&header, 58) as usize,
        u16_at(&header, 60) as usize,
    );
    if shnum == 0 || shentsize < 64 {
        return Ok(());
    }
    let sections = read(shoff, shentsize * shnum)?;
    let section = |i: usize| &sections[i * shentsize..i * shentsize + 64];
    const SHT_DYNSYM: u32 = 11;
    let Some(dynsym) = (0..shnum).map(section).find(|s| u32_at(s, 4) == SHT_DYNSYM) else {
        return Err(format!(
            "a shared library that exports nothing (it lacks {})",
            SHIM_SYMBOLS.join(" and ")
        ));
    };
    let link = u32_at(dynsym, 40) as usize;
    if link >= shnum {
        return Err("a shared library with a broken symbol table".to_string());
    }
    let strtab = section(link);
    // The tables of a real library are at most a few MiB: a larger claim is a broken file.
    let limit = 64 << 20;
    let (sym_size, str_size) = (u64_at(dynsym, 32), u64_at(strtab, 32));
    if sym_size > limit || str_size > limit {
        return Err("a shared library with a broken symbol table".to_string());
    }
    let symbols = read(u64_at(dynsym, 24), sym_size as usize)?;
    let strings = read(u64_at(strtab, 24), str_size as usize)?;
    let name_at = |o: usize| -> &[u8] {
        let rest = strings.get(o..).unwrap_or(&[]);
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    };
    let defined: std::collections::HashSet<&[u8]> = symbols
        .chunks_exact(24)
        .filter(|s| u16_at(s, 6) != 0)
        .map(|s| name_at(u32_at(s, 0) as usize))
        .collect();
    let missing: Vec<&str> = SHIM_SYMBOLS
        .iter()
        .copied()
        .filter(|n| !defined.contains(n.as_bytes()))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "an ELF shared object, but not oomshim's shim (it does not export {})",
            missing.join(" or ")
        ))
    }
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
         wheel (pip install .), or pass --lib PATH / set {LIB_ENV}",
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
