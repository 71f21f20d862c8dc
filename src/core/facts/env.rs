//! The configuration snapshot of a dump: an allowlist of environment variables that change how
//! device memory is allocated or which device is used, plus the CUDA versions. Never the whole
//! environment: secrets live there.

pub use dump::model::ConfigSnapshot;
use std::path::{Path, PathBuf};

/// Variables copied into dumps when set, by exact name.
pub const ALLOWLIST: &[&str] = &[
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "TF_GPU_ALLOCATOR",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
];

/// Variables copied by prefix: the shim's own settings.
pub const ALLOWED_PREFIX: &str = "OOMSHIM_";

/// Longest value kept, in bytes (cut at a character boundary).
pub const MAX_VALUE: usize = 1024;

pub fn allowed(name: &str) -> bool {
    ALLOWLIST.contains(&name)
        || (name.starts_with(ALLOWED_PREFIX) && name.len() > ALLOWED_PREFIX.len())
        // The launchers' rank and job variables (src/core/facts/ranks.rs).
        || crate::facts::ranks::variables().any(|v| v == name)
}

/// The snapshot from `lookup` (a variable's value) and `names` (the names set in the
/// environment; only allowlisted ones are ever looked up).
pub fn snapshot(
    lookup: impl Fn(&str) -> Option<String>,
    names: impl Iterator<Item = String>,
    (driver, runtime): (Option<i32>, Option<i32>),
) -> ConfigSnapshot {
    let mut env = std::collections::BTreeMap::new();
    let mut wanted: Vec<String> = ALLOWLIST.iter().map(|s| s.to_string()).collect();
    wanted.extend(names.filter(|n| allowed(n)));
    for name in wanted {
        if let Some(mut v) = lookup(&name) {
            if v.len() > MAX_VALUE {
                let mut cut = MAX_VALUE;
                while !v.is_char_boundary(cut) {
                    cut -= 1;
                }
                v.truncate(cut);
            }
            env.insert(name, v);
        }
    }
    ConfigSnapshot {
        env,
        cuda_driver_version: driver,
        cuda_runtime_version: runtime,
        torch_version: None,
        frameworks: Vec::new(),
    }
}

/// Longest `version.py` read (torch's is a few hundred bytes).
const MAX_VERSION_FILE: u64 = 64 * 1024;

/// The torch package directory of a loaded torch library: a mapped file
/// `…/torch/lib/libtorch*.so*` (`libtorch_cpu.so`, `libtorch_cuda.so`, `libtorch.so`), found in
/// `/proc/self/maps` text. Nothing is imported or loaded.
pub fn torch_dir_from_maps(maps: &str) -> Option<PathBuf> {
    maps.lines().find_map(|line| {
        // address perms offset dev inode path (the path may contain spaces)
        let path = line.splitn(6, char::is_whitespace).nth(5)?.trim();
        let p = Path::new(path);
        let file = p.file_name()?.to_str()?;
        if !(file.starts_with("libtorch") && file.contains(".so")) {
            return None;
        }
        let lib = p.parent()?;
        let pkg = lib.parent()?;
        (lib.file_name()? == "lib" && pkg.file_name()? == "torch").then(|| pkg.to_path_buf())
    })
}

/// `__version__` from the text of torch's `version.py` (`__version__ = '2.11.0+cu130'`).
pub fn parse_torch_version(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("__version__")?;
        let rest = rest.trim_start().strip_prefix(':').map_or(rest, |r| {
            // `__version__: str = '…'`
            r.split_once('=').map_or(r, |x| x.1)
        });
        let v = rest.trim_start().strip_prefix('=').unwrap_or(rest).trim();
        let q = v.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let inner = &v[1..];
        let end = inner.find(q)?;
        let version = &inner[..end];
        (!version.is_empty()
            && version.len() <= 64
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+.-_".contains(c)))
        .then(|| version.to_string())
    })
}

/// The version of the torch package a loaded torch library belongs to, from `maps` text.
pub fn torch_version_in(maps: &str) -> Option<String> {
    use std::io::Read;
    let dir = torch_dir_from_maps(maps)?;
    let mut text = String::new();
    std::fs::File::open(dir.join("version.py"))
        .ok()?
        .take(MAX_VERSION_FILE)
        .read_to_string(&mut text)
        .ok()?;
    parse_torch_version(&text)
}

/// torch's version when a torch library is loaded in this process (dump time only: reads
/// /proc/self/maps and one small file).
pub fn torch_version() -> Option<String> {
    torch_version_in(&crate::facts::libraries::read_self_maps())
}

/// Frameworks whose libraries `maps` (the text of `/proc/self/maps`) shows loaded, in a fixed
/// order: `torch` (`torch/lib/libtorch*`, `libc10*`), `jax` (`jaxlib/`, `jax_plugins/`), `cupy`
/// (`cupy/`, `cupy_backends/`), `tensorflow` (`libtensorflow*`). What the verdict's advice is
/// written for; nothing is loaded or imported.
pub fn frameworks_in(maps: &str) -> Vec<String> {
    let mut found = [false; 4];
    for line in maps.lines() {
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else {
            continue;
        };
        let file = path.rsplit('/').next().unwrap_or(path);
        if path.contains("/torch/lib/")
            && (file.starts_with("libtorch") || file.starts_with("libc10"))
        {
            found[0] = true;
        }
        if path.contains("/jaxlib/") || path.contains("/jax_plugins/") {
            found[1] = true;
        }
        if path.contains("/cupy/") || path.contains("/cupy_backends/") {
            found[2] = true;
        }
        if file.starts_with("libtensorflow") {
            found[3] = true;
        }
    }
    ["torch", "jax", "cupy", "tensorflow"]
        .iter()
        .zip(found)
        .filter(|(_, f)| *f)
        .map(|(n, _)| n.to_string())
        .collect()
}

/// `13000` → `13.0`, `12080` → `12.8`.
pub fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowlisted_variables_are_kept() {
        let env = [
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("OOMSHIM_DIR", "/tmp/d"),
            ("OOMSHIM_", "bare prefix"),
            ("MY_SECRET_TOKEN", "x"),
            ("AWS_SECRET_ACCESS_KEY", "y"),
            ("CUDA_VISIBLE_DEVICES", &"7".repeat(2000)),
        ];
        let look = |k: &str| env.iter().find(|e| e.0 == k).map(|e| e.1.to_string());
        let s = snapshot(
            look,
            env.iter().map(|e| e.0.to_string()),
            (Some(13000), None),
        );
        let keys: Vec<&str> = s.env.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "CUDA_VISIBLE_DEVICES",
                "OOMSHIM_DIR",
                "PYTORCH_CUDA_ALLOC_CONF"
            ]
        );
        assert_eq!(s.env["CUDA_VISIBLE_DEVICES"].len(), MAX_VALUE);
        assert_eq!(s.cuda_driver_version, Some(13000));
        assert_eq!(version_text(13000), "13.0");
        assert_eq!(version_text(12080), "12.8");
    }

    #[test]
    fn torch_version_from_a_fake_torch_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let pkg = tmp.path().join("site packages/torch");
        std::fs::create_dir_all(pkg.join("lib")).unwrap();
        std::fs::write(pkg.join("lib/libtorch_cpu.so"), b"").unwrap();
        std::fs::write(
            pkg.join("version.py"),
            "from typing import Optional\n__all__ = ['__version__']\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n",
        )
        .unwrap();
        let lib = pkg.join("lib/libtorch_cpu.so");
        let maps = format!(
            "7f00a0000000-7f00a0001000 r--p 00000000 08:01 123 /usr/lib/libc.so.6\n\
             7f00b0000000-7f00b0100000 r-xp 00000000 08:01 456                        {}\n",
            lib.display()
        );
        assert_eq!(torch_dir_from_maps(&maps), Some(pkg.clone()));
        assert_eq!(torch_version_in(&maps).as_deref(), Some("2.11.0+cu130"));
        // Not torch: another libtorch-named file outside torch/lib, or no torch at all.
        let other = "7f-7f r-xp 0 0:0 1 /opt/x/lib/libtorch_cpu.so\n7f-7f r-xp 0 0:0 1 /usr/lib/libcudart.so.13\n";
        assert_eq!(torch_dir_from_maps(other), None);
        assert_eq!(torch_version_in(""), None);
        // A torch directory without version.py.
        std::fs::remove_file(pkg.join("version.py")).unwrap();
        assert_eq!(torch_version_in(&maps), None);
        // This test process has no torch loaded.
        assert_eq!(torch_version(), None);
    }

    #[test]
    fn frameworks_from_the_mapped_libraries() {
        let maps =
            "7f-7f r-xp 0 0:0 1 /venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so\n\
                    7f-7f r-xp 0 0:0 1 /venv/lib/python3.12/site-packages/jaxlib/_jax.so\n\
                    7f-7f r-xp 0 0:0 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n";
        assert_eq!(frameworks_in(maps), ["torch", "jax"]);
        let cupy = "7f-7f r-xp 0 0:0 1 /v/site-packages/cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so\n";
        assert_eq!(frameworks_in(cupy), ["cupy"]);
        // A libtorch-named file elsewhere, or none at all: no framework.
        assert!(frameworks_in("7f-7f r-xp 0 0:0 1 /opt/x/libtorch_cpu.so\n").is_empty());
        assert!(frameworks_in("").is_empty());
    }

    #[test]
    fn torch_version_lines() {
        for (text, want) in [
            ("__version__ = '2.11.0+cu130'", Some("2.11.0+cu130")),
            ("__version__ = \"2.5.1\"", Some("2.5.1")),
            (
                "__version__: str = '2.6.0a0+git1234'",
                Some("2.6.0a0+git1234"),
            ),
            ("version = '1'", None),
            ("__version__ = get_version()", None),
            ("__version__ = '<script>'", None),
        ] {
            assert_eq!(parse_torch_version(text).as_deref(), want, "{text}");
        }
    }
}
