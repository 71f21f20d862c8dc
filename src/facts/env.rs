//! The configuration snapshot of a dump: an allowlist of environment variables that change how
//! device memory is allocated or which device is used, plus the CUDA versions. Never the whole
//! environment: secrets live there.

use crate::dump::model::ConfigSnapshot;

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
    }
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
}
