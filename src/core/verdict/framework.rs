//! Which framework the program uses, so that advice speaks its terms.

use super::found::Framework;
use dump::model::Dump;

/// The framework the program uses, for advice (from the dump's list of loaded frameworks;
/// dumps of older versions: torch's version, or Python frames).
pub(super) fn framework(dump: &Dump) -> Framework {
    let config = dump.config.as_ref();
    let listed = |name: &str| config.is_some_and(|c| c.frameworks.iter().any(|f| f == name));
    if let Some(f) = &dump.framework {
        match f.name.as_str() {
            "torch" => return Framework::Torch,
            "xla" | "jax" => return Framework::Jax,
            _ => {}
        }
    }
    // Dumps without the list (older versions): the libraries and files in the stacks.
    let in_stacks = |needles: &[&str]| {
        dump.failed_request
            .iter()
            .map(|r| &r.stack)
            .chain(dump.sites.iter().map(|s| &s.stack))
            .flatten()
            .any(|f| {
                [f.module.as_deref(), f.file.as_deref()]
                    .into_iter()
                    .flatten()
                    .any(|p| needles.iter().any(|n| p.contains(n)))
            })
    };
    if listed("torch")
        || config.is_some_and(|c| c.torch_version.is_some())
        || in_stacks(&["/torch/lib/", "/site-packages/torch/"])
    {
        Framework::Torch
    } else if listed("jax") || in_stacks(&["/jaxlib/", "/site-packages/jax/"]) {
        Framework::Jax
    } else if listed("cupy") || in_stacks(&["/cupy/", "/cupy_backends/"]) {
        Framework::Cupy
    } else if dump.recording.python.is_some() || in_stacks(&[".py"]) {
        Framework::Python
    } else {
        Framework::Native
    }
}
