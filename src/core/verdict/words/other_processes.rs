//! The words of [`OTHER_PROCESSES`], and the line that names one process on the device.

use super::{count_word, new_finding};
use crate::verdict::context::Ctx;
use crate::verdict::names::OTHER_PROCESSES;
use dump::model::Finding;
use dump::model::{GpuProcess, Relation};
use dump::units::{clean, human_bytes};

/// `process 4242 (python, another user's) holds 60.00 GiB on device 0 (NVML)`.
pub(in crate::verdict) fn process_line(p: &GpuProcess, dev: i32) -> String {
    format!(
        "process {} ({}, {}) holds {} on device {dev} (NVML)",
        p.pid,
        clean(p.name.as_deref().unwrap_or("name not visible")),
        p.relation.words(),
        p.used_bytes
            .map(human_bytes)
            .unwrap_or_else(|| "an unknown amount".to_string())
    )
}

pub(in crate::verdict) fn finding(c: &Ctx) -> Finding {
    let dev = c.dev;
    let biggest = c
        .others
        .iter()
        .max_by_key(|p| p.used_bytes.unwrap_or(0))
        .expect("others is not empty");
    let name = |p: &GpuProcess| clean(p.name.as_deref().unwrap_or("name not visible"));
    let mut f = new_finding(
        OTHER_PROCESSES,
        c.others_bytes,
        format!(
            "other processes hold {} on device {dev}; the largest is process {} ({}, {}) with {}",
            human_bytes(c.others_bytes),
            biggest.pid,
            name(biggest),
            biggest.relation.words(),
            biggest
                .used_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "an unknown amount".to_string())
        ),
        format!(
            "Other processes hold memory on device {dev}: {} of the {} in use belongs to {}, the largest being process {} \
             ({}, {}) with {}. This process's tracked allocations are {}; the {} request failed for lack of room the other \
             processes occupy.",
            human_bytes(c.others_bytes),
            c.used.map(human_bytes).unwrap_or_else(|| "memory".to_string()),
            count_word(c.others.len() as u64, "other process", "other processes"),
            biggest.pid,
            name(biggest),
            biggest.relation.words(),
            biggest
                .used_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "an unknown amount".to_string()),
            human_bytes(c.tracked),
            c.req
        ),
    );
    for p in c.others.iter().take(5) {
        f.evidence.push(process_line(p, dev));
    }
    for p in &c.others {
        let who = format!("process {} ({})", p.pid, name(p));
        f.suggestions.push(match p.relation {
            Relation::Child => format!(
                "{who} is a child of this process and holds GPU memory: child processes such as data-loader \
                 workers should not touch CUDA; create tensors on the GPU only in the main process."
            ),
            Relation::Parent => format!(
                "{who} is this process's parent (a launcher?) and holds GPU memory: keep the launcher off the GPU."
            ),
            Relation::SameUser => format!(
                "{who} is yours: if it is a finished or stale job, end it yourself, or run on another GPU \
                 (`CUDA_VISIBLE_DEVICES`)."
            ),
            Relation::OtherUser | Relation::Unknown => format!(
                "{who} is not yours: run on a free GPU (`CUDA_VISIBLE_DEVICES`), wait for it, or ask its owner or the \
                 cluster scheduler; don't try to kill it."
            ),
            Relation::This => continue,
        });
        if f.suggestions.len() >= 4 {
            break;
        }
    }
    f
}
