//! The words of [`UNTRACKED_MEMORY`].

use super::new_finding;
use crate::verdict::context::Ctx;
use crate::verdict::names::UNTRACKED_MEMORY;
use dump::model::Finding;
use dump::units::{human_bytes, percent, share};

pub(in crate::verdict) fn finding(c: &Ctx, unexplained: u64) -> Finding {
    let (dev, tracked, used) = (c.dev, c.tracked, c.used);
    let summary = match (c.n.total, used) {
        (Some(total), Some(used)) => format!(
            "Most of the memory in use on device {dev} was not allocated by this process through calls oomshim tracks: \
             {} of {} was in use, and this process's tracked allocations account for only {} ({}), leaving {} untracked. \
             That memory belongs to another process on the same GPU, or this process got it in ways the shim does not see: \
             the CUDA context, libraries, or allocation paths not hooked yet.",
            human_bytes(used),
            human_bytes(total),
            human_bytes(tracked),
            percent(share(tracked, used)),
            human_bytes(used.saturating_sub(tracked))
        ),
        _ => format!(
            "The device's memory numbers were unavailable, and this process held no tracked memory on device {dev} when {} \
             failed, so the memory in use was not allocated through calls oomshim tracks: it belongs to another process, or \
             this process got it in ways the shim does not see (the CUDA context, libraries, or allocation paths not hooked yet).",
            c.req
        ),
    };
    let headline = match used {
        Some(used) => format!(
            "{} of the {} in use on device {dev} is not this process's tracked memory (tracked: {})",
            human_bytes(used.saturating_sub(tracked)),
            human_bytes(used),
            human_bytes(tracked)
        ),
        None => format!("device {dev} is full, but this process tracked nothing on it"),
    };
    let mut f = new_finding(UNTRACKED_MEMORY, unexplained, headline, summary);
    if c.others_bytes > 0 {
        f.evidence.push(format!(
            "other processes (NVML) explain {} of it; {} remains unexplained",
            human_bytes(c.others_bytes),
            human_bytes(unexplained)
        ));
    }
    f.suggestions.push(format!(
        "Run `nvidia-smi` to see which processes hold memory on GPU {dev}; if another job is there, \
         run on a free GPU (`CUDA_VISIBLE_DEVICES`) or wait until it finishes."
    ));
    f.suggestions.push(
        "If this process is alone on the GPU, the untracked memory is its own: the CUDA context and library workspaces \
         (cuBLAS, cuDNN, NCCL) take from a few hundred MiB to a few GiB per device; much more than that points to an \
         allocation path the shim does not hook yet."
            .to_string(),
    );
    f
}
