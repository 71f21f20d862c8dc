//! Allocator mode's configuration, read from the environment on its first use.

use oomshim_host::alloc::AllocConfig;
use std::sync::OnceLock;

/// The cache policy torch's own `PYTORCH_CUDA_ALLOC_CONF` asks for, where it applies:
/// `max_split_size_mb` is honoured; other keys are torch's business (and `expandable_segments`
/// has no meaning here: segments are plain `cudaMalloc` ranges).
pub fn config_from_env() -> AllocConfig {
    alloc_config(std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok().as_deref())
}

/// [`config_from_env`] for the value `conf` of `PYTORCH_CUDA_ALLOC_CONF` (`None`: unset).
fn alloc_config(conf: Option<&str>) -> AllocConfig {
    let mut config = AllocConfig::default();
    if let Some(conf) = conf {
        for part in conf.split(',') {
            let mut kv = part.splitn(2, ':');
            let (Some(k), Some(v)) = (kv.next(), kv.next()) else {
                continue;
            };
            if k.trim() == "max_split_size_mb" {
                match v.trim().parse::<u64>() {
                    Ok(mb) if mb > 20 => config.max_split_size = Some(mb << 20),
                    _ => oomshim_host::say!(
                        "oomshim: PYTORCH_CUDA_ALLOC_CONF max_split_size_mb={v} ignored (must be a number above 20)"
                    ),
                }
            }
        }
    }
    config
}

/// In a Python process tensors get native stacks only when OOMSHIM_STACKS asks for them (`all`
/// or `native`): by default their Python stack alone is recorded (a program without Python gets
/// native stacks as usual). Measured on the H200 (tests/gpu/torch_alloc.py):
/// unwinding libtorch's ~40 frames on every `torch.empty` made the allocation loop 1.6x slower
/// than torch's native allocator, while Python stacks alone ran at 0.92x. The Python line is
/// what names a tensor's owner; the native frames below it are torch's dispatcher.
pub fn native_tensor_stacks() -> bool {
    static NATIVE: OnceLock<bool> = OnceLock::new();
    *NATIVE.get_or_init(|| native_stacks_asked(std::env::var("OOMSHIM_STACKS").ok().as_deref()))
}

/// Whether `OOMSHIM_STACKS=value` asks for native stacks; unset or unreadable: Python stacks
/// alone, unlike the settings' default (`all`).
fn native_stacks_asked(value: Option<&str>) -> bool {
    value
        .and_then(oomshim_core::config::StackMode::parse)
        .is_some_and(oomshim_core::config::StackMode::native)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_split_size_is_taken_from_torch_s_setting() {
        assert_eq!(alloc_config(None), AllocConfig::default());
        let c = alloc_config(Some("expandable_segments:True, max_split_size_mb : 128"));
        assert_eq!(c.max_split_size, Some(128 << 20));
        assert_eq!(
            AllocConfig {
                max_split_size: None,
                ..c
            },
            AllocConfig::default()
        );
    }

    #[test]
    fn a_max_split_size_torch_would_refuse_is_ignored() {
        for conf in [
            "max_split_size_mb:20",
            "max_split_size_mb:big",
            "max_split_size_mb",
        ] {
            assert_eq!(alloc_config(Some(conf)).max_split_size, None, "{conf}");
        }
    }

    #[test]
    fn native_stacks_only_when_asked() {
        assert!(!native_stacks_asked(None));
        assert!(!native_stacks_asked(Some("python")));
        assert!(!native_stacks_asked(Some("nonsense")));
        assert!(native_stacks_asked(Some("native")));
        assert!(native_stacks_asked(Some("all")));
    }
}
