//! The words of [`OWN_ALLOCATIONS`]: whose lines hold the device, and what to change in the
//! program's framework; growing shapes and possible fragmentation as hints.

use super::fragmentation::{dynamic_shapes_evidence, BUCKETING};
use super::{new_finding, segment_note, steps_word};
use crate::verdict::context::{Cache, Ctx};
use crate::verdict::fragmentation::expandable_segments_on;
use crate::verdict::framework::{framework, Framework};
use crate::verdict::leak::growing_shapes;
use crate::verdict::names::OWN_ALLOCATIONS;
use crate::verdict::own_allocations::{failing_line, next_holder};
use crate::verdict::sites::{short_label, Line};
use dump::api;
use dump::model::{Finding, GrowthFit};
use dump::units::{clean, human_bytes, percent, share, thousands};
use dump::view::{free_blocks_available, is_library_python_frame};

const GROWING_SHAPES: &str = "The memory a step needs grows with its inputs: find the largest input the program will see \
     (the longest sequence, the largest batch or image) and cap it, split it, or lower the batch size so that one fits.";

/// The evidence line for [`growing_shapes`].
fn growing_shapes_evidence(fit: &GrowthFit, steps: &str) -> String {
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

/// `700.00 MiB (×5) at forward (train.py:34)`: the line [`next_holder`] names.
fn next_holder_text(c: &Ctx, largest: Option<Line>, failing: Option<Line>) -> Option<String> {
    next_holder(c.dump, c.request.bytes, largest, failing).map(|h| {
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
    })
}

pub(in crate::verdict) fn finding(c: &Ctx, cache: Option<&Cache>) -> Finding {
    let (dev, tracked, used, req) = (c.dev, c.tracked, c.used, &c.req);
    let dump = c.dump;
    let request = c.request;
    let site = c
        .top
        .as_ref()
        .map(|t| t.label.as_str())
        .unwrap_or("the largest allocation sites");
    // The largest site as the headlines name it: its line, else its stack's label.
    let top_label = c.top.as_ref().map(|t| match t.line {
        Some(line) => line.short_label(),
        None => short_label(&t.site.stack),
    });
    let largest = match (&c.top, &top_label) {
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
    // Where the program asked for the memory that did not fit, when that is not the largest
    // holder itself: the line a user goes to first.
    let failing_at = failing_line(dump, request);
    let failing = failing_at
        .map(|l| format!(" at {}", l.short_label()))
        .unwrap_or_default();
    let largest_at = c.top.as_ref().and_then(|t| t.line);
    let largest = if failing_at.is_some() && c.top.is_some() && largest_at != failing_at {
        format!("{largest}; the {req} request{failing} failed")
    } else {
        largest
    };
    let largest = match next_holder_text(c, largest_at, failing_at) {
        Some(next) => format!("{largest}; next: {next}"),
        None => largest,
    };
    let kinds = crate::verdict::kinds::kinds_of(dump);
    // The largest holder beside the kinds, unless it is the failing line the headline names.
    let holder = c
        .top
        .as_ref()
        .zip(top_label)
        .filter(|(t, _)| failing_at.is_none() || t.line != failing_at)
        .map(|(t, label)| (t.site.bytes, label));
    // A request whose stack holds only torch's own Python code (a thread of the framework's,
    // not the program's) is named at the program's line the hook found instead: the line that
    // called the backward pass, say, rather than a frame inside torch.
    let inside_framework = matches!(failing_at, Some(Line::Frame(f)) if is_library_python_frame(f));
    let by_kind = kinds.and_then(|k| {
        let failing = if inside_framework && k.program_frame.is_some() {
            ""
        } else {
            failing.as_str()
        };
        // Any line but the failing one, the largest holder included: when the headline does not
        // name it as the largest holder, it may still hold the request's size alone.
        let room = next_holder_text(c, None, failing_at);
        super::kinds::headline(c, k, failing, holder, room)
    });
    let headline = match used {
        _ if by_kind.is_some() => by_kind.clone().unwrap_or_default(),
        Some(_)
            if request.api == api::FRAMEWORK_ALLOCATOR
                && dump.framework.as_ref().is_some_and(|f| f.name == "xla") =>
        {
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
    let fw = framework(dump);
    let xla_pool = fw == Framework::Jax && request.api == api::FRAMEWORK_ALLOCATOR;
    let kind_advice = kinds
        .filter(|_| by_kind.is_some())
        .map(|k| super::kinds::advice(c, k))
        .unwrap_or_default();
    let mut suggestions = if kind_advice.is_empty() {
        own_advice(fw, site)
    } else {
        kind_advice
    };
    if xla_pool {
        suggestions.insert(
            0,
            "XLA allocates its pool up front (75% of the device by default) and serves arrays from it, so oomshim sees \
             the pool, not the arrays in it: `XLA_PYTHON_CLIENT_MEM_FRACTION=.95` gives the pool more of the device, \
             `XLA_PYTHON_CLIENT_PREALLOCATE=false` grows it on demand, and `XLA_PYTHON_CLIENT_ALLOCATOR=platform` \
             allocates every array separately (slower), so oomshim names the line of each."
                .to_string(),
        );
    }
    let mut evidence = match kinds {
        Some(k) => super::kinds::evidence(c, k),
        None => Vec::new(),
    };
    if let Some(f) = dump.framework.as_ref().filter(|_| xla_pool) {
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
    let dynamic = dynamic_shapes_evidence(dump);
    if let Some(d) = &dynamic {
        evidence.push(d.clone());
    }
    if let Some((fit, steps)) = growing_shapes(dump) {
        evidence.push(growing_shapes_evidence(&fit, steps_word(steps)));
        suggestions.push(GROWING_SHAPES.to_string());
    }
    if fw == Framework::Torch
        && !hints.is_empty()
        && !free_blocks_available(dump)
        && !expandable_segments_on(dump)
    {
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
    let summary = match (c.n.total, used) {
        (Some(total), Some(0)) => format!(
            "Device {dev} showed no memory in use when the dump was written ({} total), so the state at capture does not \
             explain the failure of {req}: memory was probably released between the failure and the capture.{}",
            human_bytes(total),
            c.top_text(used)
        ),
        (Some(total), Some(used)) if xla_pool => format!(
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
            segment_note(dump)
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
    let summary = match growing_shapes(dump) {
        Some((fit, steps)) => format!(
            "{summary} The memory grew {}/step over the last {} {}, but as many allocations were live at the end as at \
             the start: they grew larger (inputs of growing shape), none accumulated, so this is no leak.",
            human_bytes(fit.bytes_per_step),
            fit.samples,
            steps_word(steps)
        ),
        None => summary,
    };
    let mut f = new_finding(OWN_ALLOCATIONS, tracked, headline, summary);
    f.evidence = evidence;
    f.suggestions = suggestions;
    f
}
