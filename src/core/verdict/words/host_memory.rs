//! The words of [`HOST_MEMORY`]: a failed page-locked request, or low host memory besides the
//! device's failure.

use super::{count_word, new_finding};
use crate::verdict::context::Ctx;
use crate::verdict::found::HostPressure;
use crate::verdict::names::HOST_MEMORY;
use dump::model::{Dump, Finding};
use dump::units::{clean, human_bytes, percent, share};

const HOST_SUGGESTION: &str = "Host memory is nearly exhausted (a CPU-side out-of-memory kill may follow): use fewer \
     DataLoader workers, fewer or smaller pinned buffers (`pin_memory`, `cudaMallocHost`), and don't keep results on the \
     host across steps.";

/// The evidence line of low host memory.
pub(in crate::verdict) fn pressure(p: &HostPressure) -> String {
    match *p {
        HostPressure::Available { available, total } => format!(
            "host memory is low: {} available of {} ({})",
            human_bytes(available),
            human_bytes(total),
            percent(share(available, total))
        ),
        HostPressure::Cgroup { usage, limit } => format!(
            "host memory is low: the cgroup uses {} of its {} limit ({})",
            human_bytes(usage),
            human_bytes(limit),
            percent(share(usage, limit))
        ),
    }
}

/// The finding of a failed page-locked host request: the only one.
pub(in crate::verdict) fn pinned_request_failed(c: &Ctx) -> Finding {
    let mut f = new_finding(
        HOST_MEMORY,
        c.request.bytes.max(c.dump.pinned_host.bytes),
        format!(
            "page-locked host memory ran out: {} via {} failed, with {} already pinned",
            c.req,
            clean(&c.request.api),
            human_bytes(c.dump.pinned_host.bytes)
        ),
        format!(
            "Page-locked host memory ran out: {} via {} failed. This is host memory, not device memory; pinned buffers \
             count against the machine's (or the container's) RAM.",
            c.req,
            clean(&c.request.api)
        ),
    );
    f.evidence.push(format!(
        "pinned host memory: {} in {}",
        human_bytes(c.dump.pinned_host.bytes),
        count_word(c.dump.pinned_host.count, "allocation", "allocations")
    ));
    if let Some(low) = &c.readings.host_low {
        f.evidence.push(pressure(low));
    }
    f.suggestions.push(HOST_SUGGESTION.to_string());
    f
}

/// Host memory low besides the device's failure: a finding with this process's pinned bytes.
pub(in crate::verdict) fn host_low(dump: &Dump, low: &HostPressure) -> Finding {
    let text = pressure(low);
    let mut f = new_finding(
        HOST_MEMORY,
        dump.pinned_host.bytes,
        text.clone(),
        format!(
            "Besides the device, host memory is low: {}; this process holds {} of page-locked host memory. The \
             Linux out-of-memory killer may end the process after the device error.",
            text.trim_start_matches("host memory is low: "),
            human_bytes(dump.pinned_host.bytes)
        ),
    );
    f.evidence.push(text.clone());
    f.suggestions.push(HOST_SUGGESTION.to_string());
    f
}
