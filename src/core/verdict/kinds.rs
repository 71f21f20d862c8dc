//! Torch's live memory by kind at the failure (the dump's `framework.kinds`, counted by the
//! Python hook): which kind dominates, and the numbers the advice is quantified with. The
//! sentences are in `words/kinds.rs`.

use dump::model::{Dump, Kinds};

/// A kind of the framework's live memory the advice can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
}

/// The kinds of a dump of a PyTorch program on the failing device, when the hook counted them.
pub(crate) fn kinds_of(dump: &Dump) -> Option<&Kinds> {
    dump.framework.as_ref()?.kinds.as_ref()
}

/// Each kind and its bytes, in a fixed order.
pub(crate) fn by_kind(k: &Kinds) -> [(Kind, u64); 4] {
    [
        (Kind::Parameters, k.parameters_bytes),
        (Kind::Gradients, k.gradients_bytes),
        (Kind::OptimizerState, k.optimizer_state_bytes),
        (Kind::Activations, k.activations_bytes.unwrap_or(0)),
    ]
}

/// The kind holding the most, when anything was counted (ties: the first in [`by_kind`]'s
/// order).
pub(crate) fn dominant(k: &Kinds) -> Option<(Kind, u64)> {
    let mut best: Option<(Kind, u64)> = None;
    for (kind, bytes) in by_kind(k) {
        if bytes > best.map_or(0, |b| b.1) {
            best = Some((kind, bytes));
        }
    }
    best
}

/// Activation bytes per sample of the batch that was running, counting the failed request as
/// part of what the step needed (a lower bound of the step's need: the rest of the step would
/// have needed more).
pub(crate) fn bytes_per_sample(k: &Kinds, request: u64) -> Option<u64> {
    let batch = k.batch.filter(|&b| b > 0)?;
    let act = k.activations_bytes?;
    Some(act.saturating_add(request) / batch)
}

/// The largest batch that would have fit at [`bytes_per_sample`]: the activations and the
/// device's free bytes are what a batch can use (not torch's cache: torch frees what it can of it
/// and retries before it raises, so what is left there could not serve the request); `None` when
/// the rate is unknown. An upper bound: the part of the step not yet run needs more.
pub(crate) fn largest_batch(k: &Kinds, request: u64, device_free: Option<u64>) -> Option<u64> {
    let per = bytes_per_sample(k, request).filter(|&p| p > 0)?;
    let budget = k
        .activations_bytes?
        .saturating_add(device_free.unwrap_or(0));
    Some(budget / per)
}

/// A model with the same parameter shapes as an earlier one, and its bytes: a second copy.
pub(crate) fn duplicate_model(k: &Kinds) -> Option<(usize, usize, u64)> {
    k.models
        .iter()
        .enumerate()
        .find_map(|(i, m)| m.duplicate_of.map(|j| (i, j, m.bytes)))
        .filter(|&(_, _, b)| b > 0)
}

/// The dtype most parameter bytes are in, and its bytes.
pub(crate) fn main_dtype(k: &Kinds) -> Option<(String, u64)> {
    let mut all = std::collections::BTreeMap::<&str, u64>::new();
    for m in &k.models {
        for (d, b) in &m.dtypes {
            *all.entry(d.as_str()).or_default() += b;
        }
    }
    all.into_iter()
        .max_by_key(|&(_, b)| b)
        .map(|(d, b)| (d.to_string(), b))
}

/// Gradients are live while a forward pass (or inference) runs: they were not freed after the
/// last step (`zero_grad(set_to_none=False)`, or never zeroed). Only when they are a real share
/// of the weights (at least a quarter).
pub(crate) fn gradients_kept_into_forward(k: &Kinds) -> bool {
    matches!(k.phase.as_deref(), Some("forward") | Some("inference"))
        && k.gradients_bytes > 0
        && k.gradients_bytes >= k.parameters_bytes / 4
}

/// The failing request is the loss over the logits: a loss function on the stack, or the model's
/// output projection (`lm_head`) running.
pub(crate) fn logits_in_loss(k: &Kinds) -> bool {
    k.in_loss
        || k.module
            .as_ref()
            .and_then(|m| m.path.as_deref())
            .is_some_and(|p| p == "lm_head" || p.ends_with(".lm_head"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dump::model::ModelKind;

    const MIB: u64 = 1 << 20;

    fn kinds(p: u64, g: u64, o: u64, a: u64) -> Kinds {
        Kinds {
            parameters_bytes: p,
            gradients_bytes: g,
            optimizer_state_bytes: o,
            activations_bytes: Some(a),
            ..Default::default()
        }
    }

    #[test]
    fn the_dominant_kind_is_the_largest() {
        assert_eq!(dominant(&kinds(1, 2, 3, 4)), Some((Kind::Activations, 4)));
        assert_eq!(dominant(&kinds(9, 2, 3, 4)), Some((Kind::Parameters, 9)));
        assert_eq!(
            dominant(&kinds(1, 2, 30, 4)),
            Some((Kind::OptimizerState, 30))
        );
        assert_eq!(dominant(&kinds(0, 0, 0, 0)), None);
    }

    #[test]
    fn largest_batch_is_what_fits_at_the_rate_of_this_one() {
        let mut k = kinds(0, 0, 0, 1000 * MIB);
        k.batch = Some(64);
        // torch's cache is not counted: torch already tried it.
        k.cache_bytes = Some(500 * MIB);
        // 1000 MiB + 24 MiB request over 64 samples: 16 MiB each; 1000 + 200 free → 75.
        assert_eq!(bytes_per_sample(&k, 24 * MIB), Some(16 * MIB));
        assert_eq!(largest_batch(&k, 24 * MIB, Some(200 * MIB)), Some(75));
        k.batch = None;
        assert_eq!(largest_batch(&k, 24 * MIB, Some(200 * MIB)), None);
    }

    #[test]
    fn a_second_model_of_the_same_shapes_is_a_duplicate() {
        let mut k = kinds(2, 0, 0, 0);
        k.models = vec![
            ModelKind {
                class: "M".into(),
                bytes: 1,
                ..Default::default()
            },
            ModelKind {
                class: "M".into(),
                bytes: 1,
                duplicate_of: Some(0),
                ..Default::default()
            },
        ];
        assert_eq!(duplicate_model(&k), Some((1, 0, 1)));
    }

    #[test]
    fn gradients_live_in_a_forward_pass_were_kept() {
        let mut k = kinds(100, 100, 0, 10);
        k.phase = Some("forward".into());
        assert!(gradients_kept_into_forward(&k));
        k.phase = Some("backward".into());
        assert!(!gradients_kept_into_forward(&k), "backward makes them");
    }
}
