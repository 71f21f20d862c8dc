//! The words of [`REQUEST_EXCEEDS_DEVICE`].

use super::new_finding;
use crate::verdict::context::Ctx;
use crate::verdict::names::REQUEST_EXCEEDS_DEVICE;
use dump::model::Finding;
use dump::units::{bytes_with_exact, human_bytes};

pub(in crate::verdict) fn finding(c: &Ctx) -> Finding {
    let total = c.n.total.unwrap_or(0);
    let (req, dev) = (&c.req, c.dev);
    let failing_at = c.failing_at();
    if let Some(cap) = c.cap {
        return capped(c, cap);
    }
    let mut f = new_finding(
        REQUEST_EXCEEDS_DEVICE,
        c.request.bytes,
        format!(
            "a single request of {req}{} is larger than device {dev} ({} in total)",
            c.failing_at_short(),
            human_bytes(total)
        ),
        format!(
            "The failed request alone is larger than the whole device: {req} was asked of device {dev}, which has {} in total. \
             No amount of freeing memory makes it fit; the allocation itself must shrink.",
            human_bytes(total)
        ),
    );
    f.evidence.push(format!(
        "request {} > device total {} (by {})",
        bytes_with_exact(c.request.bytes),
        human_bytes(total),
        human_bytes(c.request.bytes.saturating_sub(total))
    ));
    f.suggestions.push(format!(
        "Make the allocation itself smaller: find what asks for {req}{failing_at} and reduce the batch size or sequence length, or split the work into chunks."
    ));
    f.suggestions.push(
        "Check the size computation: a request this large often comes from a wrong shape or an overflowed dimension.".to_string(),
    );
    f.suggestions.push(
        "If the data really is this large, spread it over several devices (sharding, tensor or pipeline parallelism) or keep it in host memory.".to_string(),
    );
    f
}

/// The request is larger than the per-process cap (torch's `set_per_process_memory_fraction`),
/// which is what the failure was judged against: the cap, not the device, is named.
fn capped(c: &Ctx, cap: &dump::model::MemoryCap) -> Finding {
    let (req, place) = (&c.req, c.place());
    let mut f = new_finding(
        REQUEST_EXCEEDS_DEVICE,
        c.request.bytes,
        format!("a single request of {req}{} is larger than {place}", c.failing_at_short()),
        format!(
            "The failed request alone is larger than {place}: {req} was asked where this process may use only {}. \
             No amount of freeing memory makes it fit under the cap; the cap must rise or the allocation shrink.",
            human_bytes(cap.bytes)
        ),
    );
    f.evidence.push(format!(
        "request {} > cap {} ({} of device {}'s {}, by {})",
        bytes_with_exact(c.request.bytes),
        human_bytes(cap.bytes),
        cap.set_by,
        c.dev,
        human_bytes(cap.device_total_bytes),
        human_bytes(c.request.bytes.saturating_sub(cap.bytes))
    ));
    f.suggestions.push(format!(
        "Raise the cap if the device can spare it: the device has {} in total, and {} allows this process {} of it.",
        human_bytes(cap.device_total_bytes),
        cap.set_by,
        human_bytes(cap.bytes)
    ));
    f.suggestions.push(format!(
        "Or make the allocation itself smaller: find what asks for {req}{} and reduce the batch size or sequence length, or split the work into chunks.",
        c.failing_at()
    ));
    f
}
