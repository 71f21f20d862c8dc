//! Torch's live memory by kind at the failure (the dump's `framework.kinds`, counted by the
//! Python hook): which kind dominates, and the numbers the advice is quantified with. The
//! sentences are in `words/kinds.rs`.

use dump::model::{Dump, DuplicateModel, ForwardProgress, Kinds};

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

/// The kind holding the most, when the count can tell ([`dump::view::named_dominant`]: never a
/// kind the hook's walk could not finish, nor activations then, which are what is left).
pub(crate) fn dominant(k: &Kinds) -> Option<(Kind, u64)> {
    let (name, bytes) = dump::view::named_dominant(k)?;
    let kind = match name {
        "parameters" => Kind::Parameters,
        "gradients" => Kind::Gradients,
        "optimizer_state" => Kind::OptimizerState,
        _ => Kind::Activations,
    };
    Some((kind, bytes))
}

/// The share of a forward pass with autograd that had run when it failed, by the model's leaf
/// modules ([`dump::model::ForwardProgress`]): the leaves before the failing module, and the
/// failing module whole when it is a leaf (the failed request is its output) or half of it when it
/// holds several (the failure came somewhere inside). Each leaf weighs what its output does per
/// sample where the hook could size them (a language model's output layer as its vocabulary, a
/// CNN's first layers as their images: measured against the bytes autograd saves, within 5% for
/// ResNet-50, ConvNeXt, ViT and BERT and 10-16% low for GPT-2 and Llama, whose loss is counted as
/// their output layer), else alike. Only with autograd on: every activation of the pass is then
/// kept for the backward, so what is held grows with the share run; without it each layer's are
/// freed as the next runs ([`inference_scale`]).
pub(crate) fn forward_share(k: &Kinds) -> Option<f64> {
    let p = k
        .forward_progress
        .filter(|p| p.leaves > 0 && p.leaves_in_module > 0)?;
    if k.phase.as_deref() != Some("forward") || k.in_loss {
        return None;
    }
    let half_unless_leaf = |n: f64| if p.leaves_in_module == 1 { n } else { n / 2.0 };
    if let Some(share) = weighed_share(&p, half_unless_leaf) {
        return Some(share);
    }
    // At least one leaf (or half of two) counts as run, so the share is never 0.
    let in_module = half_unless_leaf(p.leaves_in_module as f64);
    Some(((p.leaves_before as f64 + in_module) / p.leaves as f64).min(1.0))
}

/// [`forward_share`] by the leaves' output sizes, when the hook sized them and the share run is
/// not nothing (a failing in-place leaf after nothing sized).
fn weighed_share(p: &ForwardProgress, in_module: impl Fn(f64) -> f64) -> Option<f64> {
    let all = p.elements.filter(|&e| e > 0)? as f64;
    let run = p.elements_before? as f64 + in_module(p.elements_in_module? as f64);
    (run > 0.0).then(|| (run / all).min(1.0))
}

/// The forward pass was sized by its leaves' outputs ([`weighed_share`]), not counted leaf by leaf.
pub(crate) fn share_is_weighed(k: &Kinds) -> bool {
    k.forward_progress
        .is_some_and(|p| weighed_share(&p, |n| n).is_some())
}

/// Without autograd a forward holds, as each leaf runs, about its input and its output: the
/// pass needs what its largest leaf does, this many times what the failing one held
/// (`largest_leaf_io` over `failing_leaf_io`, both sized by the hook), and a tenth more for what
/// is alive beside it that the leaves do not show (a residual branch's input, the batch itself:
/// on an H100, ConvNeXt-B failing in its stem said 7,759 where 7,139 fits, 7,053 with it). None
/// where the hook could not size them, or when the failing leaf is the largest (what is held is
/// then the need).
pub(crate) fn inference_scale(k: &Kinds) -> Option<f64> {
    if k.phase.as_deref() != Some("inference") {
        return None;
    }
    let p = k.forward_progress?;
    let failing = p.failing_leaf_io.filter(|&n| n > 0)?;
    let largest = p.largest_leaf_io?;
    (largest > failing).then(|| 1.1 * largest as f64 / failing as f64)
}

/// Activation bytes per sample of the batch that was running, counting the failed request as
/// part of what the step needed: scaled to the whole forward pass by [`forward_share`] where it
/// is known (and, in training, with room for the backward's gradients: [`backward_per_sample`]),
/// or to its largest layer by [`inference_scale`] without autograd, else a lower bound (the rest
/// of the step would have needed more).
pub(crate) fn bytes_per_sample(k: &Kinds, request: u64) -> Option<u64> {
    let batch = k.batch.filter(|&b| b > 0)?;
    let act = k.activations_bytes?;
    let held = act.saturating_add(request) / batch;
    Some(match (forward_share(k), inference_scale(k)) {
        (Some(share), _) => {
            let pass = (held as f64 / share).ceil() as u64;
            pass.saturating_add(backward_per_sample(k, pass))
        }
        (None, Some(scale)) => (held as f64 * scale).ceil() as u64,
        (None, None) => held,
    })
}

/// A training step's backward pass holds every activation the forward saved and, at its widest
/// layer, that layer's output gradient with the gradient of what it feeds (a language model's
/// logits: the loss's log-probabilities and their gradient): one and a half times the widest
/// leaf's output per sample, at the pass's bytes per element, where the hook sized the leaves
/// (on an H100: GPT-2 medium in float32, 29 where 29 fits, and GPT-2 small under bf16 autocast,
/// 52 where 53 does; counting the average leaf instead said 34 and 67); else one and a half
/// average leaves (what the corpus's MLPs needed, measured by bisection: 2 was 11% under the
/// real largest batch for one, 1 above it for the other). 0 unless [`counts_backward`].
fn backward_per_sample(k: &Kinds, pass: u64) -> u64 {
    let Some(p) = k.forward_progress.filter(|_| counts_backward(k)) else {
        return 0;
    };
    match (p.widest_leaf_elements, p.elements.filter(|&e| e > 0)) {
        (Some(widest), Some(all)) if share_is_weighed(k) => {
            (1.5 * widest as f64 * pass as f64 / all as f64).ceil() as u64
        }
        _ => (3 * pass).div_ceil(2 * p.leaves),
    }
}

/// The estimate makes room for a backward pass: a forward with autograd, scaled by
/// [`forward_share`], of a model in training mode (the running model is listed first). A model
/// in eval mode with autograd on never runs a backward.
pub(crate) fn counts_backward(k: &Kinds) -> bool {
    forward_share(k).is_some() && k.models.first().is_some_and(|m| m.training)
}

/// The parameters' gradients a training step's backward pass will allocate: those its
/// optimizers step, less the gradients already on the device (kept from the last step, or
/// never freed). Independent of the batch, so a smaller batch still needs them.
pub(crate) fn gradients_to_come(k: &Kinds) -> u64 {
    if !counts_backward(k) {
        return 0;
    }
    // Optimizers past the listed ones are not counted: a lower figure, so the batch is not cut
    // for gradients nobody knows of.
    let stepped: u64 = k.optimizers.iter().map(|o| o.param_bytes).sum();
    // Never more gradients than parameters: a wrapped optimizer (accelerate's, Lightning's) is
    // listed beside the one it wraps, both stepping the same parameters.
    stepped
        .min(k.parameters_bytes)
        .saturating_sub(k.gradients_bytes)
}

/// The largest batch that would have fit at [`bytes_per_sample`]: the activations and the
/// device's free bytes are what a batch can use (not torch's cache: torch frees what it can of it
/// and retries before it raises, so what is left there could not serve the request), less the
/// parameters' gradients a training step is still to allocate; `None` when the rate is unknown.
/// Without a [`forward_share`] or an [`inference_scale`] an upper bound: the part of the step not
/// yet run needs more.
pub(crate) fn largest_batch(k: &Kinds, request: u64, device_free: Option<u64>) -> Option<u64> {
    let per = bytes_per_sample(k, request).filter(|&p| p > 0)?;
    let budget = k
        .activations_bytes?
        .saturating_add(device_free.unwrap_or(0))
        .saturating_sub(gradients_to_come(k));
    Some(budget / per)
}

/// The model held most times over by bytes: copies of one class with the same parameter
/// shapes, each with storages of its own ([`dump::view::duplicates`]).
pub(crate) fn duplicate_model(k: &Kinds) -> Option<DuplicateModel> {
    dump::view::duplicates(k)
        .into_iter()
        .find(|d| d.copies > 1 && d.bytes_each > 0)
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
    const GIB: u64 = 1 << 30;

    fn kinds(p: u64, g: u64, o: u64, a: u64) -> Kinds {
        Kinds {
            parameters_bytes: p,
            gradients_bytes: g,
            optimizer_state_bytes: o,
            activations_bytes: Some(a),
            complete: true,
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

    /// Two failures seen on an H200 (139.80 GiB), each at a batch about 4 times what fits, with
    /// the largest batch that fits found by bisecting the same program: the advice must land
    /// between 90% of the real largest and the real largest, never above.
    #[test]
    fn a_forward_that_failed_part_way_is_scaled_to_the_whole_pass() {
        use dump::model::ForwardProgress;
        let progress = |before, inside, all| ForwardProgress {
            leaves_before: before,
            leaves_in_module: inside,
            leaves: all,
            ..Default::default()
        };
        // A 24-layer TransformerEncoder (8 leaves a layer), failing inside `layers.6` at a batch
        // of 559; 152 fits, 157 does not.
        let mut t = kinds(1_209_237_504, 0, 0, 147_024_162_816);
        t.batch = Some(559);
        t.phase = Some("forward".into());
        t.forward_progress = Some(progress(48, 8, 192));
        let free = 1 << 30; // about what was free: the dumps' own figures
        let fits = largest_batch(&t, 4_689_231_872, Some(free)).unwrap();
        assert!((141..=152).contains(&fits), "{fits}");
        // Unscaled, the same numbers said 3.7 times too many.
        t.forward_progress = None;
        assert!(largest_batch(&t, 4_689_231_872, Some(free)).unwrap() > 500);
        // Four blocks of Linear, GELU, Linear (12 leaves) in eval mode with autograd on, failing
        // at the third leaf (`0.2`) at a batch of 2,094,166; 507,180 fits, 515,360 does not.
        let mut e = kinds(537_018_368, 0, 0, 145_855_569_920);
        e.batch = Some(2_094_166);
        e.phase = Some("forward".into());
        e.forward_progress = Some(progress(2, 1, 12));
        let fits = largest_batch(&e, 8_579_448_832, Some(1 << 30)).unwrap();
        assert!((463_824..=507_180).contains(&fits), "{fits}");
        // Without autograd the held activations are the pass's need already; in the loss the
        // pass is over.
        e.phase = Some("inference".into());
        assert_eq!(forward_share(&e), None);
        e.phase = Some("forward".into());
        e.in_loss = true;
        assert_eq!(forward_share(&e), None);
    }

    /// Seen on an H100 (79.18 GiB): the same four-block MLP as above, in training with SGD,
    /// failing at its third leaf at a batch of 1,186,069; 254,818 fits, 259,452 does not. The
    /// forward alone said 281,963: the backward's gradients need more.
    #[test]
    fn a_training_step_makes_room_for_its_backward() {
        use dump::model::{ForwardProgress, OptimizerKind};
        let params = 537_018_368;
        let mut t = kinds(params, 0, 0, 82_623_922_176);
        t.batch = Some(1_186_069);
        t.phase = Some("forward".into());
        t.forward_progress = Some(ForwardProgress {
            leaves_before: 2,
            leaves_in_module: 1,
            leaves: 12,
            ..Default::default()
        });
        t.models = vec![ModelKind {
            class: "Sequential".into(),
            bytes: params,
            training: true,
            ..Default::default()
        }];
        t.optimizers = vec![OptimizerKind {
            class: "SGD".into(),
            param_bytes: params,
            ..Default::default()
        }];
        let (request, free) = (4_859_101_184, 564_330_496);
        assert!(counts_backward(&t));
        assert_eq!(gradients_to_come(&t), params);
        let fits = largest_batch(&t, request, Some(free)).unwrap();
        assert!((233_506..=254_818).contains(&fits), "{fits}");
        // Gradients kept from the last step are not allocated again.
        t.gradients_bytes = params;
        assert_eq!(gradients_to_come(&t), 0);
        // The same model in eval mode never runs a backward: the forward alone.
        t.models[0].training = false;
        assert!(!counts_backward(&t));
        assert_eq!(gradients_to_come(&t), 0);
        assert!(largest_batch(&t, request, Some(free)).unwrap() > 270_000);
    }

    /// Seen on an H100 (79.18 GiB): GPT-2 medium under the HF Trainer in float32 (failing at
    /// `transformer.h.6.mlp.act`, batch 136; 29 fits, 30 does not), and GPT-2 small under
    /// accelerate's bf16 autocast (rescored: the same architecture's leaves sized on torch's meta
    /// device; `transformer.h.4.mlp.act`, micro-batch 226; 53 fits, 54 does not). Counting leaves
    /// alike said more than 29 and 90; sized, with an average leaf's room for the backward, 34 and 67.
    #[test]
    fn a_language_models_pass_is_weighed_by_its_outputs_and_its_backward_by_its_logits() {
        use dump::model::{ForwardProgress, OptimizerKind};
        // (params, activations, batch, leaves before and in all, elements before, inside and in
        // all, request, free, what fits)
        let seen = [
            (
                1_419_292_672,
                80_718_012_416,
                136,
                (71, 245),
                (111_149_056, 1_048_576, 433_144_832),
                2_281_701_376,
                2_055_405_568,
                26..=29,
            ),
            (
                497_759_232,
                81_963_511_808,
                226,
                (51, 125),
                (59_768_832, 786_432, 196_166_656),
                2_843_738_112,
                1_778_581_504,
                48..=53,
            ),
        ];
        for (params, act, batch, (l_before, l_all), (before, inside, all), request, free, fits) in
            seen
        {
            let mut t = kinds(params, 0, 0, act);
            t.batch = Some(batch);
            t.phase = Some("forward".into());
            t.models = vec![ModelKind {
                class: "GPT2LMHeadModel".into(),
                bytes: params,
                training: true,
                ..Default::default()
            }];
            // accelerate's wrapper and the AdamW it wraps: one set of gradients to come.
            t.optimizers = ["AcceleratedOptimizer", "AdamW"]
                .map(|class| OptimizerKind {
                    class: class.into(),
                    param_bytes: params,
                    ..Default::default()
                })
                .to_vec();
            let leaves = ForwardProgress {
                leaves_before: l_before,
                leaves_in_module: 1,
                leaves: l_all,
                ..Default::default()
            };
            let sized = ForwardProgress {
                elements_before: Some(before),
                elements_in_module: Some(inside),
                elements: Some(all),
                // The logits: 1,024 positions of a 50,257-word vocabulary.
                widest_leaf_elements: Some(51_463_168),
                last_leaf_elements: Some(51_463_168),
                ..leaves
            };
            t.forward_progress = Some(sized);
            assert_eq!(gradients_to_come(&t), params);
            assert!(share_is_weighed(&t));
            let got = largest_batch(&t, request, Some(free)).unwrap();
            assert!(fits.contains(&got), "{got} not in {fits:?}");
            t.forward_progress = Some(ForwardProgress {
                widest_leaf_elements: None,
                ..sized
            });
            assert!(largest_batch(&t, request, Some(free)).unwrap() > *fits.end() + 1);
            t.forward_progress = Some(leaves);
            assert!(!share_is_weighed(&t));
            assert!(largest_batch(&t, request, Some(free)).unwrap() > *fits.end() + 1);
        }
    }

    /// Seen on an H100: ConvNeXt-B classifying (no autograd, bf16) a batch of 42,508, failing in
    /// its stem (`stem.1`) where 7,139 fits and 7,305 does not. Unscaled, what the stem held said
    /// 31,036; its widest layer (the first MLP's activation: 8 of the stem's outputs against its
    /// norm's 2) says 4.4 times that rate.
    #[test]
    fn inference_is_scaled_to_its_largest_layer() {
        use dump::model::ForwardProgress;
        let mut t = kinds(177_182_928, 0, 0, 81_051_301_680);
        t.batch = Some(42_508);
        t.phase = Some("inference".into());
        t.forward_progress = Some(ForwardProgress {
            leaves_before: 1,
            leaves_in_module: 1,
            leaves: 377,
            elements_before: Some(401_408),
            elements_in_module: Some(401_408),
            elements: Some(104_975_336),
            failing_leaf_io: Some(802_816),
            largest_leaf_io: Some(3_211_264),
            widest_leaf_elements: Some(1_605_632),
            last_leaf_elements: Some(1000),
        });
        assert_eq!(forward_share(&t), None);
        let (request, free) = (34_126_954_496, Some(3_045_261_312));
        let fits = largest_batch(&t, request, free).unwrap();
        assert!((6_425..=7_139).contains(&fits), "{fits}");
        // A failing leaf that is the largest: what it held is the need.
        if let Some(p) = t.forward_progress.as_mut() {
            p.failing_leaf_io = p.largest_leaf_io;
        }
        assert_eq!(inference_scale(&t), None);
        assert!(largest_batch(&t, request, free).unwrap() > 30_000);
    }

    #[test]
    fn the_hooks_copies_are_the_duplicate_and_an_older_dumps_marks_still_read() {
        let mut k = kinds(4 * MIB, 0, 0, 0);
        let model = |duplicate_of| ModelKind {
            class: "M".into(),
            bytes: MIB,
            duplicate_of,
            ..Default::default()
        };
        // An earlier version's dump: each later copy marked against the first listed one.
        k.models = vec![model(None), model(Some(0)), model(Some(0)), model(Some(0))];
        let d = duplicate_model(&k).unwrap();
        assert_eq!((d.class.as_str(), d.copies, d.bytes_each), ("M", 4, MIB));
        // The hook's groups count every copy found, listed or not.
        k.duplicates = vec![DuplicateModel {
            class: "M".into(),
            copies: 77,
            bytes_each: MIB,
            ..Default::default()
        }];
        assert_eq!(duplicate_model(&k).unwrap().copies, 77);
        k.duplicates.clear();
        k.models = vec![model(None), model(None)];
        assert_eq!(duplicate_model(&k), None);
    }

    #[test]
    fn a_kind_the_walk_did_not_finish_is_never_named_dominant() {
        // Parameters counted in full, gradients and optimizer state not: the parameters are
        // named only when no short kind could be larger, even with all of the rest.
        let mut k = kinds(10 * GIB, GIB, 0, 2 * GIB);
        k.complete = false;
        k.short_kinds = vec!["gradients".into(), "optimizer_state".into()];
        assert_eq!(dominant(&k), Some((Kind::Parameters, 10 * GIB)));
        k.activations_bytes = Some(12 * GIB);
        assert_eq!(dominant(&k), None, "activations, the rest, may be long");
        let mut k = kinds(10 * GIB, 2 * GIB, 0, 9 * GIB);
        k.complete = false;
        k.short_kinds = vec!["gradients".into()];
        assert_eq!(
            dominant(&k),
            None,
            "the gradients may hold up to 11 GiB: more than the parameters"
        );
        k.gradients_bytes = 0;
        k.short_kinds = vec!["optimizer_state".into()];
        k.activations_bytes = Some(5 * GIB);
        assert_eq!(dominant(&k), Some((Kind::Parameters, 10 * GIB)));
        // The dominant kind itself short: never named.
        k.short_kinds = vec!["parameters".into()];
        assert_eq!(dominant(&k), None);
        // Unknown activations: a short kind's most is unknown.
        k.short_kinds = vec!["gradients".into()];
        k.activations_bytes = None;
        assert_eq!(dominant(&k), None);
        // An earlier version's dump that says only "not complete": any kind may be short.
        let mut k = kinds(10 * GIB, 0, 0, GIB);
        k.complete = false;
        assert_eq!(dominant(&k), None);
        k.complete = true;
        assert_eq!(dominant(&k), Some((Kind::Parameters, 10 * GIB)));
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
