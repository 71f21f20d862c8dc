//! The words of [`OWN_ALLOCATIONS`]: whose lines hold the device, and what to change in the
//! program's framework; growing shapes and possible fragmentation as hints.

use super::fragmentation::{dynamic_shapes_evidence, BUCKETING};
use super::{new_finding, segment_note, steps_word};
use crate::verdict::context::{Cache, Ctx};
use crate::verdict::found::{Framework, GrowingShapes, NextHolder, OwnAllocations};
use crate::verdict::names::OWN_ALLOCATIONS;
use crate::verdict::sites::short_label;
use dump::model::Finding;
use dump::units::{clean, human_bytes, percent, share, thousands};

const GROWING_SHAPES: &str = "The memory a step needs grows with its inputs: find the largest input the program will see \
     (the longest sequence, the largest batch or image) and cap it, split it, or lower the batch size so that one fits.";

/// The evidence line of growing shapes (the same allocations, larger each step; or the
/// framework's cache growing for larger steps while its live tensors do not).
fn growing_shapes_evidence(g: &GrowingShapes, steps: &str) -> String {
    let fit = &g.fit;
    if let Some((first, last)) = &g.live {
        return format!(
            "torch's segments grew {}/step over the last {} {steps} ({} → {}) while its live tensors at the step ends \
             went from {} to {}: the cache grew for steps that need more working memory (a growing batch or sequence), \
             nothing was kept from step to step, so this is no leak",
            human_bytes(fit.bytes_per_step),
            fit.samples,
            human_bytes(fit.first.bytes),
            human_bytes(fit.last.bytes),
            human_bytes(first.bytes),
            human_bytes(last.bytes)
        );
    }
    let c = fit.live_allocations.unwrap_or_default();
    let what = if fit.of.as_deref() == Some("framework_live") {
        "the framework's live tensors"
    } else {
        "live memory"
    };
    format!(
        "{what} grew {}/step over {} {steps} ({} → {}) while the live allocations stayed {} → {}: they grew larger, \
         none accumulated, so this is no leak (inputs of growing shape, or a buffer enlarged each step)",
        human_bytes(fit.bytes_per_step),
        fit.samples,
        human_bytes(fit.first.bytes),
        human_bytes(fit.last.bytes),
        thousands(c.first),
        thousands(c.last)
    )
}

/// What to change when the program's own allocations fill the device, in its framework's terms.
fn own_advice(fw: Framework, site: &str) -> Vec<String> {
    match fw {
        Framework::Torch => vec![
            format!(
                "Free or shrink what {site} keeps alive. Tensors kept across steps are the usual cause: store `loss.item()` \
                 rather than `loss`, `detach()` what you keep for logging, don't accumulate outputs on the GPU, and run \
                 evaluation under `torch.inference_mode()`."
            ),
            "Reduce the batch size (or sequence length); gradient accumulation keeps the effective batch size.".to_string(),
            "Use mixed precision (`torch.autocast`, bf16/fp16) to halve activation memory, and \
             `optimizer.zero_grad(set_to_none=True)` so gradients are freed between steps."
                .to_string(),
        ],
        Framework::Jax => vec![
            format!(
                "Free or shrink what {site} keeps alive: JAX arrays referenced from lists or objects stay on the device; \
                 `del` them, or keep `jax.device_get(x)` copies on the host."
            ),
            "Reduce the batch size, or shard the arrays over devices; `jax.checkpoint` (rematerialisation) trades compute \
             for activation memory."
                .to_string(),
        ],
        Framework::Cupy => vec![
            format!(
                "Free or shrink what {site} keeps alive: `del` CuPy arrays you no longer need; \
                 `cupy.get_default_memory_pool().free_all_blocks()` then returns the pool's cached blocks to the device."
            ),
            "Process the data in smaller chunks, or keep intermediate results on the host (`x.get()`).".to_string(),
        ],
        Framework::Python | Framework::Native => vec![
            format!(
                "Free what {site} allocates when it is no longer needed (a matching free for each allocation), or \
                 allocate less: smaller buffers, or the work in chunks."
            ),
            "Reuse buffers instead of allocating new ones for each piece of work.".to_string(),
        ],
    }
}

/// `700.00 MiB (×5) at forward (train.py:34)`: a line that alone holds the request.
fn holder_text(h: &NextHolder) -> String {
    format!(
        "{}{} at {}",
        human_bytes(h.bytes),
        if h.count > 1 {
            format!(" (×{})", thousands(h.count))
        } else {
            String::new()
        },
        h.line.short_label()
    )
}

pub(in crate::verdict) fn finding(c: &Ctx, own: &OwnAllocations, cache: Option<&Cache>) -> Finding {
    let (headline, by_kind) = headline(c, own);
    let mut suggestions = advice(c, own, by_kind);
    if c.readings.growing_shapes.is_some() {
        suggestions.push(GROWING_SHAPES.to_string());
    }
    fragmentation_hint(c, own, &mut suggestions);
    let summary = summary(c, own, &mut suggestions);
    let mut f = new_finding(OWN_ALLOCATIONS, c.tracked, headline, summary);
    f.evidence = evidence(c, own, cache);
    f.suggestions = suggestions;
    f
}

/// The headline, and whether it is the kinds' (when the hook counted them): else whose
/// allocations fill the device, with the largest holder, the failing line and the next line that
/// alone holds the request.
fn headline(c: &Ctx, own: &OwnAllocations) -> (String, bool) {
    let (dev, tracked, used) = (c.dev, c.tracked, c.used);
    // The largest site as the headlines name it: its line, else its stack's label.
    let top_label = c.top.as_ref().map(|t| match t.line {
        Some(line) => line.short_label(),
        None => short_label(&t.site.stack),
    });
    // Where the program asked for the memory that did not fit, when that is not the largest
    // holder itself: the line a user goes to first.
    let failing_at = own.failing_line;
    let failing = failing_at
        .map(|l| format!(" at {}", l.short_label()))
        .unwrap_or_default();
    // The largest holder beside the kinds, unless it is the failing line the headline names.
    let holder = c
        .top
        .as_ref()
        .zip(top_label.clone())
        .filter(|(t, _)| failing_at.is_none() || t.line != failing_at)
        .map(|(t, label)| (t.site.bytes, label));
    let by_kind = c.readings.kinds.and_then(|k| {
        let failing = if own.failing_inside_framework && k.program_frame.is_some() {
            ""
        } else {
            failing.as_str()
        };
        let room = own.room.as_ref().map(holder_text);
        super::kinds::headline(c, k, failing, holder, room)
    });
    if let Some(headline) = by_kind {
        return (headline, true);
    }
    let largest = largest_text(c, own, top_label.as_deref(), &failing);
    let headline = match used {
        Some(_) if own.xla_refused => {
            format!(
                "XLA's memory pool on device {dev} is full: {} tracked, the pool included{largest}",
                human_bytes(tracked)
            )
        }
        Some(u) if u > 0 => format!(
            "this process's own allocations fill {}: {} of the {} in use{largest}",
            c.place(),
            human_bytes(tracked),
            human_bytes(u)
        ),
        _ => format!(
            "this process holds {} on device {dev}{largest}",
            human_bytes(tracked)
        ),
    };
    (headline, false)
}

/// `; largest: 1.00 GiB (×5) at forward (model.py:9)`, the failed request at its line when
/// that is not the largest holder's, and the next line that alone holds the request.
fn largest_text(c: &Ctx, own: &OwnAllocations, top_label: Option<&str>, failing: &str) -> String {
    let req = &c.req;
    let largest = match (&c.top, top_label) {
        (Some(t), Some(label)) => format!(
            "; largest: {}{} at {label}",
            human_bytes(t.site.bytes),
            if t.site.count > 1 {
                format!(" (×{})", thousands(t.site.count))
            } else {
                String::new()
            },
        ),
        _ => String::new(),
    };
    let largest_at = c.top.as_ref().and_then(|t| t.line);
    let largest = if own.failing_line.is_some() && c.top.is_some() && largest_at != own.failing_line
    {
        format!("{largest}; the {req} request{failing} failed")
    } else {
        largest
    };
    match own.next_holder.as_ref().map(holder_text) {
        Some(next) => format!("{largest}; next: {next}"),
        None => largest,
    }
}

/// What to change: by the dominant kind when the headline is the kinds', else in the program's
/// framework's terms; XLA's pool first when that is what filled.
fn advice(c: &Ctx, own: &OwnAllocations, by_kind: bool) -> Vec<String> {
    let site = c
        .top
        .as_ref()
        .map(|t| t.label.as_str())
        .unwrap_or("the largest allocation sites");
    let kind_advice = c
        .readings
        .kinds
        .filter(|_| by_kind)
        .map(|k| super::kinds::advice(c, k))
        .unwrap_or_default();
    let mut suggestions = if kind_advice.is_empty() {
        own_advice(c.readings.framework, site)
    } else {
        kind_advice
    };
    if own.xla_pool {
        suggestions.insert(
            0,
            "XLA allocates its pool up front (75% of the device by default) and serves arrays from it, so oomshim sees \
             the pool, not the arrays in it: `XLA_PYTHON_CLIENT_MEM_FRACTION=.95` gives the pool more of the device, \
             `XLA_PYTHON_CLIENT_PREALLOCATE=false` grows it on demand, and `XLA_PYTHON_CLIENT_ALLOCATOR=platform` \
             allocates every array separately (slower), so oomshim names the line of each."
                .to_string(),
        );
    }
    suggestions
}

/// The evidence: by kind, XLA's refusal, the framework's cache too small to help, dynamic
/// shapes and growing shapes.
fn evidence(c: &Ctx, own: &OwnAllocations, cache: Option<&Cache>) -> Vec<String> {
    let (dump, req) = (c.dump, &c.req);
    let mut evidence = match c.readings.kinds {
        Some(k) => super::kinds::evidence(c, k),
        None => Vec::new(),
    };
    if let Some(f) = dump.framework.as_ref().filter(|_| own.xla_pool) {
        evidence.push(format!(
            "XLA refused {req} inside its own pool{}",
            f.message
                .as_deref()
                .map(|m| format!(": {}", clean(m)))
                .unwrap_or_default()
        ));
    }
    if let Some(k) = cache {
        evidence.push(format!(
            "the framework's cache holds {} reserved but unallocated ({} releasable): too little to make room for {req}",
            human_bytes(k.total_free),
            human_bytes(k.releasable)
        ));
    }
    if let Some(d) = &c.readings.dynamic_shapes {
        evidence.push(dynamic_shapes_evidence(d));
    }
    if let Some(g) = &c.readings.growing_shapes {
        evidence.push(growing_shapes_evidence(g, steps_word(g.steps)));
    }
    evidence
}

/// Possible fragmentation, when the shim cannot see the framework's free blocks: hinted by a
/// burst of failures, free memory not less than the request, and dynamic shapes.
fn fragmentation_hint(c: &Ctx, own: &OwnAllocations, suggestions: &mut Vec<String>) {
    let (request, req) = (c.request, &c.req);
    let mut hints = Vec::new();
    if request.failures_in_burst > 1 {
        hints.push(format!(
            "the allocation failed {} times in one burst",
            request.failures_in_burst
        ));
    }
    if let Some(free) =
        c.n.free
            .filter(|&f| f >= request.bytes && request.bytes > 0)
    {
        hints.push(format!(
            "{} was free, not less than the {req} request",
            human_bytes(free)
        ));
    }
    if !own.fragmentation_unseen || hints.is_empty() {
        return;
    }
    let dynamic = c
        .readings
        .dynamic_shapes
        .as_ref()
        .map(dynamic_shapes_evidence);
    if let Some(d) = &dynamic {
        hints.push(d.clone());
    }
    suggestions.push(format!(
        "Possibly fragmentation ({}), though the shim cannot see the framework's free blocks here, so this is not \
         established: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` may help if it is.",
        hints.join("; ")
    ));
    if dynamic.is_some() {
        suggestions.push(BUCKETING.to_string());
    }
}

/// The summary: whose allocations fill the device and how much, XLA's pool, or the tracked
/// bytes alone (then `nvidia-smi` is suggested); growing shapes said as no leak.
fn summary(c: &Ctx, own: &OwnAllocations, suggestions: &mut Vec<String>) -> String {
    let (dev, tracked, used, req) = (c.dev, c.tracked, c.used, &c.req);
    let summary = match (c.n.total, used) {
        (Some(total), Some(0)) => format!(
            "Device {dev} showed no memory in use when the dump was written ({} total), so the state at capture does not \
             explain the failure of {req}: memory was probably released between the failure and the capture.{}",
            human_bytes(total),
            c.top_text(used)
        ),
        (Some(total), Some(used)) if own.xla_pool => format!(
            "XLA's memory pool is full: XLA refused {req} inside the pool it allocated from device {dev}, which holds {} \
             of this process's tracked {} ({} of the device's {}). The program's own arrays fill the pool; oomshim cannot \
             see which ones, since XLA hands them out of one allocation.{}",
            human_bytes(c.top.as_ref().map_or(tracked, |t| t.site.bytes)),
            human_bytes(tracked),
            percent(share(tracked, total)),
            human_bytes(total),
            if used < total / 10 * 9 {
                format!(" The device itself still had {} free.", human_bytes(total - used))
            } else {
                String::new()
            }
        ),
        (Some(total), Some(used)) => format!(
            "This process's own allocations fill {}: {} of the {} in use ({}) was allocated by this process, \
             out of {} in total, when {req} more was requested.{}{}",
            c.place(),
            human_bytes(tracked),
            human_bytes(used),
            percent(share(tracked, used)),
            human_bytes(total),
            c.top_text(Some(used)),
            segment_note(c)
        ),
        _ => {
            suggestions.push(format!(
                "Run `nvidia-smi` to check whether other processes also use GPU {dev}."
            ));
            format!(
                "The device's memory numbers were unavailable, so this rests on tracked bytes alone: this process held {} \
                 of tracked memory on device {dev} when {req} more was requested; whether other processes also used the \
                 device cannot be told from this dump.{}",
                human_bytes(tracked),
                c.top_text(None)
            )
        }
    };
    match &c.readings.growing_shapes {
        Some(g @ GrowingShapes { live: Some(_), .. }) => format!(
            "{summary} The tracked memory grew {}/step over the last {} {}, but torch's live tensors at the step ends \
             did not: what grew is torch's cache, holding the larger working memory of later steps (a growing batch or \
             sequence); nothing was kept from step to step, so this is no leak.",
            human_bytes(g.fit.bytes_per_step),
            g.fit.samples,
            steps_word(g.steps)
        ),
        Some(g) => format!(
            "{summary} The memory grew {}/step over the last {} {}, but as many allocations were live at the end as at \
             the start: they grew larger (inputs of growing shape), none accumulated, so this is no leak.",
            human_bytes(g.fit.bytes_per_step),
            g.fit.samples,
            steps_word(g.steps)
        ),
        None => summary,
    }
}
