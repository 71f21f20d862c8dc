//! The words of [`FRAGMENTATION`], and of dynamic shapes (its cause, when request sizes vary).

use super::new_finding;
use crate::verdict::context::{Cache, Ctx};
use crate::verdict::found::DynamicShapes;
use crate::verdict::names::FRAGMENTATION;
use dump::model::Finding;
use dump::units::{clean, human_bytes, thousands};

pub(in crate::verdict) const BUCKETING: &str = "Pad or bucket variable-length inputs to a few fixed shapes (sequence lengths, image sizes, batch sizes), so freed blocks are reused instead of split into ever new sizes.";

/// The evidence line of dynamic shapes.
pub(in crate::verdict) fn dynamic_shapes_evidence(d: &DynamicShapes) -> String {
    format!(
        "dynamic shapes: {} distinct sizes among the {} requests of at least {} in the last {} requests",
        thousands(d.distinct),
        thousands(d.large),
        human_bytes(d.large_bytes),
        thousands(d.window)
    )
}

pub(in crate::verdict) fn finding(c: &Ctx, k: &Cache) -> Finding {
    let dump = c.dump;
    let req = &c.req;
    let dynamic = c
        .readings
        .dynamic_shapes
        .as_ref()
        .map(dynamic_shapes_evidence);
    let cause = if dynamic.is_some() {
        " Many distinct large request sizes point to dynamic shapes as the cause: each new size splits cached blocks \
         differently."
    } else {
        ""
    };
    let mut f = new_finding(
        FRAGMENTATION,
        k.total_free,
        format!(
            "{} free in the cache ({}) but the largest free block is {}, less than the {req} request{}{}",
            human_bytes(k.total_free),
            clean(&k.source),
            human_bytes(k.largest),
            c.failing_at_short(),
            if dynamic.is_some() { "; input shapes vary (dynamic shapes)" } else { "" }
        ),
        format!(
            "The free memory is fragmented: {} was free in the allocator's blocks ({}), more than the {req} request, \
             but the largest free block was only {}, so no single block could hold it.{cause}{}",
            human_bytes(k.total_free),
            clean(&k.source),
            human_bytes(k.largest),
            c.top_text(c.used)
        ),
    );
    f.evidence.push(format!(
        "free in the cache {} ≥ request {} > largest free block {}",
        human_bytes(k.total_free),
        human_bytes(c.request.bytes),
        human_bytes(k.largest)
    ));
    if let Some(b) = k.inactive_split {
        f.evidence.push(format!(
            "inactive split bytes: {} (free blocks inside segments that also hold live tensors)",
            human_bytes(b)
        ));
    }
    if let Some(d) = &dynamic {
        f.evidence.push(d.clone());
        f.suggestions.push(BUCKETING.to_string());
    }
    if !c.readings.expandable_segments {
        f.suggestions.push(
            "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so the cache grows segments instead of needing one contiguous free block.".to_string(),
        );
    }
    if dynamic.is_none() && dump.request_sizes.is_none() {
        f.suggestions.push(
            "If input shapes vary from step to step, pad or bucket them to a few fixed shapes so freed blocks are reused instead of split.".to_string(),
        );
    }
    f.suggestions.push(
        "`torch.cuda.empty_cache()` returns only unused cached segments to the driver; it does not join blocks split by live tensors.".to_string(),
    );
    f
}
