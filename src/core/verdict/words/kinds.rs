//! The words of torch's memory by kind (`src/core/verdict/kinds.rs`): the headline of
//! `own_allocations` when the hook counted the kinds, the evidence line by kind, and advice
//! chosen by the dominant kind, with numbers.

use crate::verdict::context::Ctx;
use crate::verdict::kinds::{
    bytes_per_sample, counts_backward, dominant, duplicate_model, forward_share,
    gradients_kept_into_forward, inference_scale, largest_batch, logits_in_loss, main_dtype,
    share_is_weighed, Kind,
};
use dump::model::{Kinds, ModuleAt, PyFrame};
use dump::units::{clean, human_bytes, thousands};
use dump::view::{duplicates, held_head, held_phrase, more_phrases, short_phrase};

/// How the kinds are called in sentences.
pub(in crate::verdict) fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Parameters => "parameters (the weights)",
        Kind::Gradients => "gradients",
        Kind::OptimizerState => "optimizer state",
        Kind::Activations => "activations and other live tensors",
    }
}

/// A file as the headline shows it: below `site-packages/` (`transformers/models/gpt2/…`), else
/// its base name.
/// The largest batch that fits, said against the batch that failed: "about" when it is not
/// smaller (the estimate says the batch was not the reason).
fn fits_phrase(fits: u64, batch: u64) -> String {
    if fits < batch {
        format!("a batch of {}", thousands(fits))
    } else {
        estimated_fits_phrase(fits)
    }
}

/// The largest batch a whole-pass estimate puts as fitting: "about", since the estimate can be
/// a few percent above the real largest batch as well as below it (measured in the corpus).
fn estimated_fits_phrase(fits: u64) -> String {
    format!("a batch of about {}", thousands(fits))
}

/// A share of a forward pass as a whole percent ("27%"), at least 1%.
fn percent_of_pass(share: f64) -> String {
    format!("{:.0}%", (share * 100.0).clamp(1.0, 100.0))
}

fn short_file(path: &str) -> String {
    let p = clean(path);
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = p.rfind(marker) {
            return p[i + marker.len()..].to_string();
        }
    }
    p.rsplit('/').next().unwrap_or(&p).to_string()
}

fn frame_text(f: &PyFrame) -> String {
    format!(
        "{} ({}:{})",
        clean(&f.function),
        short_file(&f.file),
        f.line
    )
}

/// `Attention.forward (model.py:12) at blocks.3.attn`.
pub(in crate::verdict) fn module_text(m: &ModuleAt) -> String {
    let at = match (&m.file, m.line) {
        (Some(f), Some(l)) => format!(" ({}:{l})", short_file(f)),
        _ => String::new(),
    };
    let path = match m.path.as_deref() {
        Some(p) if !p.is_empty() => format!(" at `{}`", clean(p)),
        _ => String::new(),
    };
    format!("{}.forward{at}{path}", clean(&m.class))
}

/// Where the program was: `in the forward pass, in Attention.forward (model.py:12) at
/// blocks.3.attn, batch 64 (64×128)`.
pub(in crate::verdict) fn phase_text(k: &Kinds) -> String {
    let batch = match (k.batch, k.input_shape.len()) {
        (Some(b), n) if n > 1 => format!(
            ", batch {b} ({})",
            k.input_shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("×")
        ),
        (Some(b), _) => format!(", batch {b}"),
        _ => String::new(),
    };
    let module = k
        .module
        .as_ref()
        .map(|m| format!(", in {}", module_text(m)))
        .unwrap_or_default();
    match k.phase.as_deref() {
        Some("forward") => format!("in the forward pass{module}{batch}"),
        Some("inference") => format!("in a forward pass without autograd{module}{batch}"),
        Some("backward") => format!("in the backward pass{batch}"),
        Some("optimizer") => "in the optimizer step".to_string(),
        Some("outside") => "outside any forward pass, backward pass or optimizer step".to_string(),
        _ => String::new(),
    }
}

/// The headline of `own_allocations` with the kinds: the dominant kind and its bytes, the
/// others, the largest holder when activations dominate, the phase, and the failing call (the
/// program's line and the framework's module). `largest` is the largest site's bytes and line;
/// `room`, a line other than the failing one that alone holds at least the request (its bytes
/// and label), named when the largest holder is not.
pub(in crate::verdict) fn headline(
    c: &Ctx,
    k: &Kinds,
    failing: &str,
    largest: Option<(u64, String)>,
    room: Option<String>,
) -> Option<String> {
    let (kind, bytes) = dominant(k)?;
    // "Activations and other live tensors" is everything that is no weight, gradient or
    // optimizer state: when one line holds at least half of it, that line is what fills the
    // device (a buffer, a cache, a batch kept), and the headline names it. Otherwise a line
    // that alone holds as much as the request is where to cut (freeing it would have made
    // room): a batch finder's input and output, say, when the failing line holds the most.
    let holder = match (largest, room) {
        (Some((held, label)), _)
            if kind == Kind::Activations && held.saturating_mul(2) >= bytes =>
        {
            format!("; the largest holder: {} at {label}", human_bytes(held))
        }
        (_, Some(room)) if kind == Kind::Activations => {
            format!("; {room} alone holds as much as the {} request", c.req)
        }
        _ => String::new(),
    };
    let of = match c.used {
        Some(u) if u > 0 => format!(" of the {} in use", human_bytes(u)),
        _ => String::new(),
    };
    let rest: Vec<String> = crate::verdict::kinds::by_kind(k)
        .into_iter()
        .filter(|&(other, _)| other != kind)
        .map(|(other, b)| format!("{} {}", short_name(other), human_bytes(b)))
        .collect();
    let what = match kind {
        Kind::OptimizerState => match k.optimizers.iter().max_by_key(|o| o.bytes) {
            Some(o) if o.param_bytes > 0 => format!(
                "{}'s optimizer state ({:.1}× the weights it steps)",
                clean(&o.class),
                o.bytes as f64 / o.param_bytes as f64
            ),
            _ => kind_name(kind).to_string(),
        },
        Kind::Gradients if gradients_kept_into_forward(k) => {
            "gradients kept from the last step".to_string()
        }
        _ => kind_name(kind).to_string(),
    };
    // The weights fill the device because a model is held more than once: the copies.
    let held = match duplicate_model(k) {
        Some(d) if kind == Kind::Parameters => format!("; {}", held_phrase(k, &d)),
        _ => String::new(),
    };
    let phase = phase_text(k);
    let phase = if phase.is_empty() {
        String::new()
    } else {
        format!("; {phase}")
    };
    let program = if failing.is_empty() {
        k.program_frame
            .as_ref()
            .map(|f| format!(" at {}", frame_text(f)))
            .unwrap_or_default()
    } else {
        failing.to_string()
    };
    Some(format!(
        "{what} fill device {}: {}{of} ({}){holder}{held}{phase}; the {} request{program} failed",
        c.dev,
        human_bytes(bytes),
        rest.join(", "),
        c.req,
    ))
}

fn short_name(k: Kind) -> &'static str {
    match k {
        Kind::Parameters => "parameters",
        Kind::Gradients => "gradients",
        Kind::OptimizerState => "optimizer state",
        Kind::Activations => "activations",
    }
}

/// `keep (train.py:20), a forward hook on `fc``: the program's own forward hook, the likeliest
/// keeper of a growth that comes from the model's outputs.
pub(in crate::verdict) fn hook_keeper(k: &Kinds) -> Option<String> {
    let h = k.forward_hooks.first()?;
    Some(format!(
        "{} ({}:{}), a forward hook of the program on `{}`",
        clean(&h.function),
        short_file(&h.file),
        h.line,
        clean(&h.module)
    ))
}

/// `` dict `outputs` (train.py:40, a global of __main__: 960.00 MiB in 10 tensors) ``: the
/// program's container that holds the most of the live tensors beyond the weights, gradients
/// and optimizer state, when it holds at least a quarter of them (and 1 MiB): what keeps a leak
/// alive, named at the line that grows it.
pub(in crate::verdict) fn container_keeper(k: &Kinds) -> Option<String> {
    let c = k.keepers.first()?;
    let rest = k.activations_bytes.unwrap_or(0);
    if c.bytes < (1 << 20) || c.bytes.saturating_mul(4) < rest {
        return None;
    }
    let at = match (&c.file, c.line) {
        (Some(f), Some(l)) => format!("{}:{l}, ", short_file(f)),
        _ => String::new(),
    };
    Some(format!(
        "{} `{}` ({at}{}: {} in {} tensors)",
        clean(&c.container),
        clean(&c.name),
        clean(&c.scope),
        human_bytes(c.bytes),
        c.tensors
    ))
}

/// One evidence line: every kind with its bytes, the models and optimizers.
pub(in crate::verdict) fn evidence(c: &Ctx, k: &Kinds) -> Vec<String> {
    let mut parts: Vec<String> = crate::verdict::kinds::by_kind(k)
        .into_iter()
        .map(|(kind, b)| format!("{} {}", short_name(kind), human_bytes(b)))
        .collect();
    if let Some(cache) = k.cache_bytes {
        parts.push(format!("torch's cache {}", human_bytes(cache)));
    }
    if let (Some(u), Some(r)) = (c.used, k.torch_reserved_bytes) {
        let outside = u.saturating_sub(r).saturating_sub(c.others_bytes);
        parts.push(format!(
            "outside torch (CUDA context, libraries) {}",
            human_bytes(outside)
        ));
    }
    if c.others_bytes > 0 {
        parts.push(format!("other processes {}", human_bytes(c.others_bytes)));
    }
    let mut out = vec![format!(
        "memory by kind on device {} when torch failed: {}{}",
        c.dev,
        parts.join(", "),
        short_phrase(k)
            .map(|p| format!(" ({p})"))
            .unwrap_or_default()
    )];
    for m in k.models.iter().take(4) {
        let dtypes: Vec<String> = m
            .dtypes
            .iter()
            .map(|(d, b)| format!("{} {}", clean(d), human_bytes(*b)))
            .collect();
        out.push(format!(
            "model {}: {} of parameters{}{}",
            clean(&m.class),
            human_bytes(m.bytes),
            if dtypes.is_empty() {
                String::new()
            } else {
                format!(" ({})", dtypes.join(", "))
            },
            match m.duplicate_of.and_then(|j| k.models.get(j)) {
                Some(first) => format!("; a copy of the {} above", clean(&first.class)),
                None => String::new(),
            }
        ));
    }
    out.extend(more_phrases(k));
    for d in duplicates(k).iter().take(2) {
        out.push(held_phrase(k, d));
    }
    for o in k.optimizers.iter().take(4) {
        out.push(format!(
            "optimizer {}: {} of state for {} of parameters",
            clean(&o.class),
            human_bytes(o.bytes),
            human_bytes(o.param_bytes)
        ));
    }
    if let Some(f) = &k.framework_frame {
        out.push(format!(
            "the failing allocation was made in {}",
            frame_text(f)
        ));
    }
    out
}

/// Advice chosen by the dominant kind, quantified; first the kind's own, then the general.
pub(in crate::verdict) fn advice(c: &Ctx, k: &Kinds) -> Vec<String> {
    let Some((kind, bytes)) = dominant(k) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(d) = duplicate_model(k) {
        let more = d.copies - 1;
        let head = held_head(k, &d);
        out.push(format!(
            "{}{}: {more} more {} {} {} beside the one in use. Keep one (`del` the others and every reference to \
             them, then `gc.collect()`), or share one copy's weights.",
            head[..1].to_uppercase(),
            &head[1..],
            if more == 1 { "copy" } else { "copies" },
            if more == 1 { "holds" } else { "hold" },
            human_bytes(more.saturating_mul(d.bytes_each))
        ));
    }
    if gradients_kept_into_forward(k) {
        out.push(format!(
            "Gradients of {} are still live in the forward pass: they were kept from the last step (never zeroed, or \
             `zero_grad(set_to_none=False)`). Call `optimizer.zero_grad(set_to_none=True)` after each step (the default \
             since torch 2.0) so they are freed until backward needs them.",
            human_bytes(k.gradients_bytes)
        ));
    }
    match kind {
        Kind::Activations => activations_advice(c, k, bytes, &mut out),
        Kind::OptimizerState => optimizer_state_advice(k, bytes, &mut out),
        Kind::Parameters => parameters_advice(k, &mut out),
        Kind::Gradients => gradients_advice(k, bytes, &mut out),
    }
    out
}

/// Activations dominate: the batch that would have fit, then what keeps fewer of them.
fn activations_advice(c: &Ctx, k: &Kinds, bytes: u64, out: &mut Vec<String>) {
    out.push(batch_advice(c, k, bytes));
    if k.phase.as_deref() == Some("forward")
        && k.outer_module.is_some()
        && !k.models.first().is_some_and(|m| m.training)
    {
        out.push(
                "The model is in eval mode but autograd is on, so every activation is kept for a backward that never \
                 comes: run evaluation under `torch.inference_mode()` (or `torch.no_grad()`)."
                    .to_string(),
            );
    }
    if logits_in_loss(k) {
        out.push(format!(
                "The failing request of {} is the loss over the logits (batch × sequence × vocabulary, upcast to \
                 float32 in the loss): compute the loss in chunks of the sequence (a chunked or fused cross-entropy, \
                 e.g. Liger's `LigerFusedLinearCrossEntropyLoss`), or only over the positions that need it.",
                c.req
            ));
    }
    if k.phase.as_deref() != Some("inference") {
        out.push(
                "Gradient checkpointing recomputes activations in backward instead of keeping them \
                 (`model.gradient_checkpointing_enable()` for Hugging Face models, `torch.utils.checkpoint` \
                 otherwise)."
                    .to_string(),
            );
    }
    if !k.autocast && main_dtype(k).is_some_and(|(d, _)| d == "float32") {
        out.push(
                "The weights are float32: `torch.autocast(\"cuda\", dtype=torch.bfloat16)` around the forward pass \
                 about halves the activations."
                    .to_string(),
            );
    }
}

/// The batch that would have fit at this batch's rate per sample, scaled to the whole forward
/// pass where the failure came part way through it.
fn batch_advice(c: &Ctx, k: &Kinds, bytes: u64) -> String {
    let request = c.request.bytes;
    let per = bytes_per_sample(k, request);
    let fits = largest_batch(k, request, c.n.free);
    let share = forward_share(k);
    let scale = inference_scale(k);
    // In training the estimate already counts the backward's gradients (one and a half of the
    // widest layer's output per sample, and the parameters' gradients still to come).
    let training_room = counts_backward(k);
    match (k.batch, per, fits) {
            (Some(b), Some(per), Some(0)) => format!(
                "At {} per sample not even one sample of this batch of {b} would fit: the activations are not this \
                 batch's alone. Look for tensors kept from earlier steps (outputs or losses stored in a list or dict, \
                 a hook that keeps them) before lowering the batch.",
                human_bytes(per)
            ),
            (Some(b), Some(per), Some(fits)) if share.is_some() => format!(
                "The batch of {} failed {} of the way through its forward pass ({}), holding {} \
                 of activations plus the {} request: about {} per sample for the whole pass{}, so {} would \
                 have fit{}: lower the batch (or sequence length) to that, and keep the effective batch with gradient \
                 accumulation.",
                thousands(b),
                percent_of_pass(share.unwrap_or(1.0)),
                if share_is_weighed(k) {
                    "by the sizes of its modules' outputs"
                } else {
                    "by the model's modules"
                },
                human_bytes(k.activations_bytes.unwrap_or(0)),
                c.req,
                human_bytes(per),
                if training_room { " and the backward's gradients" } else { "" },
                estimated_fits_phrase(fits),
                if training_room { "" } else { ", fewer if a backward pass follows" },
            ),
            (Some(b), Some(per), Some(fits)) if scale.is_some() => format!(
                "The batch of {} failed in a forward pass without autograd, holding {} of activations plus the {} \
                 request; its largest layer (by the sizes of its modules' inputs and outputs) needs {:.1} times what \
                 the failing one held: about {} per sample, so {} would have fit, fewer if the program keeps \
                 more as it goes (a generation's key/value cache): lower the batch (or sequence length) to that.",
                thousands(b),
                human_bytes(k.activations_bytes.unwrap_or(0)),
                c.req,
                scale.unwrap_or(1.0),
                human_bytes(per),
                estimated_fits_phrase(fits),
            ),
            (Some(b), Some(per), Some(fits)) => format!(
                "The batch of {} needs at least {} of activations per sample ({} held, plus the {} request); at this \
                 rate at most {} would have fit, fewer since the rest of the step needs more: lower the batch (or \
                 sequence length) well below that, and keep the effective batch with gradient accumulation.",
                thousands(b),
                human_bytes(per),
                human_bytes(k.activations_bytes.unwrap_or(0)),
                c.req,
                fits_phrase(fits, b),
            ),
            _ => format!(
                "Activations and other live tensors hold {}: lower the batch size or sequence length (gradient \
                 accumulation keeps the effective batch).",
                human_bytes(bytes)
            ),
        }
}

fn optimizer_state_advice(k: &Kinds, bytes: u64, out: &mut Vec<String>) {
    let o = k.optimizers.iter().max_by_key(|o| o.bytes);
    let against = o
        .filter(|o| o.param_bytes > 0)
        .map(|o| {
            format!(
                "{}'s state is {}, {:.1}× the {} of weights it steps",
                clean(&o.class),
                human_bytes(o.bytes),
                o.bytes as f64 / o.param_bytes as f64,
                human_bytes(o.param_bytes)
            )
        })
        .unwrap_or_else(|| format!("The optimizer state is {}", human_bytes(bytes)));
    out.push(format!(
            "{against}: an 8-bit optimizer (bitsandbytes `Adam8bit`/`AdamW8bit`) keeps it in about a quarter, a paged \
             one (`PagedAdamW`) moves it to host memory under pressure, and sharding it across devices (FSDP, \
             DeepSpeed ZeRO stage 1–2) divides it by the number of GPUs."
        ));
}

fn parameters_advice(k: &Kinds, out: &mut Vec<String>) {
    let dtype = main_dtype(k);
    if let Some((d, b)) = dtype.filter(|(d, _)| d == "float32") {
        out.push(format!(
                "{} of the weights are {d}: loading them in bfloat16 (`torch_dtype=torch.bfloat16`, or \
                 `model.to(torch.bfloat16)`) halves them.",
                human_bytes(b)
            ));
    }
    out.push(format!(
            "The weights alone hold {}: shard them across devices (FSDP, DeepSpeed ZeRO-3, `device_map=\"auto\"`), \
             offload part to the CPU, or quantise them (8-bit/4-bit).",
            human_bytes(k.parameters_bytes)
        ));
}

fn gradients_advice(k: &Kinds, bytes: u64, out: &mut Vec<String>) {
    if !gradients_kept_into_forward(k) {
        out.push(format!(
                "Gradients hold {}: with gradient accumulation they live between steps; sharding them (FSDP, ZeRO-2) \
                 divides them by the number of GPUs.",
                human_bytes(bytes)
            ));
    }
}

#[cfg(test)]
mod tests {
    use super::short_file;

    #[test]
    fn files_below_site_packages_keep_their_package() {
        assert_eq!(
            short_file("/usr/lib/python3/site-packages/transformers/models/gpt2/modeling_gpt2.py"),
            "transformers/models/gpt2/modeling_gpt2.py"
        );
        assert_eq!(short_file("/w/train.py"), "train.py");
    }
}
