//! What fills the report's device, the same in the terminal and on the page: by kind where the
//! framework counted its kinds, else this process's tracked bytes, what it holds untracked,
//! other processes and free.

use dump::model::{Dump, Relation};
use dump::view::used_bytes;

/// One part of the device's memory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FillRow {
    /// Machine-readable: the kind keys of `dump::view::kind_rows`, or `this_process`,
    /// `untracked` (the CUDA context, libraries: used but allocated through no hooked call),
    /// `other_processes`, `free`.
    pub key: &'static str,
    /// As people say it.
    pub label: &'static str,
    pub bytes: u64,
}

/// What fills one device: its parts, which sum to `total_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fill {
    pub device: i32,
    pub total_bytes: u64,
    /// Whether the parts are the framework's kinds (parameters, gradients, …).
    pub by_kind: bool,
    pub rows: Vec<FillRow>,
}

/// The device the report is about: the failing one, else the one holding the most tracked
/// bytes.
pub fn focus_device(dump: &Dump) -> Option<i32> {
    if let Some(r) = &dump.failed_request {
        return Some(r.device);
    }
    if let Some(last) = dump
        .post_mortem
        .as_ref()
        .and_then(|p| p.last_failure.as_ref())
    {
        return Some(last.device);
    }
    dump.devices
        .iter()
        .max_by_key(|d| d.tracked_bytes)
        .map(|d| d.index)
}

/// What fills the report's device, when its total is known: by kind where the framework
/// counted its kinds, else this process's tracked bytes, what it holds untracked (context,
/// libraries), other processes (NVML) and free.
pub fn device_fill(dump: &Dump) -> Option<Fill> {
    if let Some((device, rows)) = dump::view::kind_rows(dump) {
        let rows: Vec<FillRow> = rows
            .into_iter()
            .filter(|r| r.bytes > 0)
            .map(|r| FillRow {
                key: r.key,
                label: short_kind_label(r.key, r.label),
                bytes: r.bytes,
            })
            .collect();
        let sum = rows.iter().map(|r| r.bytes).fold(0, u64::saturating_add);
        let total = dump
            .devices
            .iter()
            .find(|d| d.index == device)
            .and_then(|d| d.total_bytes)
            .unwrap_or(sum)
            .max(sum);
        if total > 0 {
            return Some(Fill {
                device,
                total_bytes: total,
                by_kind: true,
                rows,
            });
        }
    }
    let device = focus_device(dump)?;
    let info = dump.devices.iter().find(|d| d.index == device)?;
    let total = info.total_bytes?;
    let free = info.free_bytes?;
    let used = used_bytes(Some(total), Some(free))?;
    let others = other_processes_bytes(dump, device);
    let tracked = info.tracked_bytes.min(used);
    // Free blocks of the framework's cache, where the dump knows them: oomshim's allocator
    // tracks tensors and keeps its cache beside them; torch's cache (seen through its
    // snapshot) is inside the segments the shim tracked.
    let fb = &dump.free_blocks;
    let cache_free = if dump::view::free_blocks_available(dump) {
        fb.total_free_bytes.unwrap_or(0)
    } else {
        0
    };
    let (in_use, cache) = if fb.source == "oomshim-allocator" {
        (tracked, cache_free.min(used - tracked))
    } else {
        let cache = cache_free.min(tracked);
        (tracked - cache, cache)
    };
    let not_tracked = used.saturating_sub(in_use + cache).saturating_sub(others);
    let rows = [
        ("this_process", "this process", in_use),
        ("framework_cache", "cache, free", cache),
        ("untracked", "untracked", not_tracked),
        (
            "other_processes",
            "other processes",
            others.min(used - in_use - cache),
        ),
        ("free", "free", free.min(total)),
    ]
    .into_iter()
    .filter(|(_, _, b)| *b > 0)
    .map(|(key, label, bytes)| FillRow { key, label, bytes })
    .collect();
    Some(Fill {
        device,
        total_bytes: total,
        by_kind: false,
        rows,
    })
}

/// The kinds' labels, short enough for a legend.
fn short_kind_label(key: &str, label: &'static str) -> &'static str {
    match key {
        "activations" => "activations",
        "framework_cache" => "torch's cache",
        "outside_framework" => "outside torch",
        _ => label,
    }
}

/// Other processes' bytes on `device`: from the dump's untracked split, else NVML's list.
fn other_processes_bytes(dump: &Dump, device: i32) -> u64 {
    if let Some(b) = dump
        .library_memory
        .as_ref()
        .and_then(|l| l.untracked.iter().find(|u| u.device == device))
        .and_then(|u| u.other_processes_bytes)
    {
        return b;
    }
    dump.gpu_processes
        .as_ref()
        .filter(|g| g.device == device && g.error.is_none())
        .map(|g| {
            g.processes
                .iter()
                .filter(|p| p.relation != Relation::This)
                .filter_map(|p| p.used_bytes)
                .fold(0, u64::saturating_add)
        })
        .unwrap_or(0)
}
