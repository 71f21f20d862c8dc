//! `oomshim exporter --textfile-dir DIR`: a process's last numbers outlive it. For every
//! out-of-memory dump and post-mortem in the dump directories, one `.prom` file in DIR that
//! node_exporter's textfile collector reads (written by atomic rename, so the collector never
//! reads half a file): the failure's verdict, retry hint and time, and each device's numbers at
//! that moment, with the exporter's labels (src/cli/exporter.rs: oomshim's and DCGM-exporter's).
//!
//! Files are named as their dump, `oomshim-….prom`, rewritten when their dump is (a provisional
//! dump replaced by the final one) and removed when their dump is gone; only the newest
//! [`MAX_FILES`] dumps get one, so a directory of old dumps cannot flood the collector. Files of
//! other names in DIR are never touched.

use crate::exporter::{device_labels, process_labels, render, visible_devices, Family, Samples};
use dump::model::Dump;
use oomshim_core::facts::gpu_processes::NvmlDevice;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The newest dumps that get a file (older ones' files are removed).
pub const MAX_FILES: usize = 256;
/// How often a serving exporter looks at the dump directories again.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// This module's file names: the dump's (`oomshim-…`), with `.prom` for `.json`.
const PREFIX: &str = "oomshim-";

const FAMILIES: &[Family] = &[
    (
        "oomshim_failure_info",
        "gauge",
        "1 per failure that got a dump (an out-of-memory dump whose failure stood or was recovered, or a post-mortem), labelled with its reason, verdict kind and retry hint (elsewhere, after_change, unknown).",
    ),
    (
        "oomshim_failure_timestamp_seconds",
        "gauge",
        "When the failure happened (a post-mortem: when the process died), Unix seconds.",
    ),
    (
        "oomshim_failure_request_bytes",
        "gauge",
        "The allocation that failed, in bytes (out-of-memory dumps).",
    ),
    (
        "oomshim_failure_tracked_bytes",
        "gauge",
        "Device bytes in live allocations tracked by oomshim at the failure.",
    ),
    (
        "oomshim_failure_peak_tracked_bytes",
        "gauge",
        "Highest tracked device bytes of the process up to the failure.",
    ),
    (
        "oomshim_failure_device_total_bytes",
        "gauge",
        "The device's total memory at the failure, where known.",
    ),
    (
        "oomshim_failure_device_free_bytes",
        "gauge",
        "The device's free memory at the failure, where known.",
    ),
    (
        "oomshim_failure_memory_bytes",
        "gauge",
        "Torch's memory on the failing device by kind at the failure (parameters, gradients, optimizer_state, activations, cache), where oomshim's Python hook counted it.",
    ),
];

/// The text of one dump's file; `None` for a dump that records no failure.
pub fn exposition_of(d: &Dump, file_name: &str, gpus: &[NvmlDevice]) -> Option<String> {
    let failed = d.failed_request.as_ref();
    if failed.is_none() && d.post_mortem.is_none() {
        return None;
    }
    let mut base = process_labels(d, d.process.pid);
    base.push(("dump", file_name.to_string()));
    let visible = visible_devices(d);
    let mut samples = Samples::new();
    let mut push = |name: &'static str, labels: &[(&'static str, String)], value: String| {
        samples
            .entry(name)
            .or_default()
            .push((labels.to_vec(), value));
    };
    let mut info = base.clone();
    info.push(("reason", d.reason.clone()));
    info.push(("kind", d.verdict.kind.clone()));
    info.push((
        "retry",
        d.verdict
            .retry
            .as_ref()
            .map_or_else(|| "unknown".to_string(), |r| r.hint.clone()),
    ));
    if let Some(r) = failed {
        info.push((
            "recovered",
            match r.recovered {
                Some(true) => "true",
                Some(false) => "false",
                None => "unknown",
            }
            .to_string(),
        ));
    }
    push("oomshim_failure_info", &info, "1".into());
    let at_ms = d
        .post_mortem
        .as_ref()
        .map_or(d.time_unix_ms, |pm| pm.died_unix_ms);
    push(
        "oomshim_failure_timestamp_seconds",
        &base,
        format!("{:.3}", at_ms as f64 / 1000.0),
    );
    // The failing device's labels, for the request and torch's kinds.
    let failing = failed.map(|r| {
        let mut l = base.clone();
        let dev = d.devices.iter().find(|x| x.index == r.device);
        l.extend(device_labels(r.device, dev, visible, gpus));
        l
    });
    if let (Some(r), Some(l)) = (failed, &failing) {
        push("oomshim_failure_request_bytes", l, r.bytes.to_string());
    }
    for dev in &d.devices {
        let mut l = base.clone();
        l.extend(device_labels(dev.index, Some(dev), visible, gpus));
        push(
            "oomshim_failure_tracked_bytes",
            &l,
            dev.tracked_bytes.to_string(),
        );
        push(
            "oomshim_failure_peak_tracked_bytes",
            &l,
            dev.peak_tracked_bytes.to_string(),
        );
        if let Some(t) = dev.total_bytes {
            push("oomshim_failure_device_total_bytes", &l, t.to_string());
        }
        if let Some(f) = dev.free_bytes {
            push("oomshim_failure_device_free_bytes", &l, f.to_string());
        }
    }
    let kinds = d.framework.as_ref().and_then(|f| f.kinds.as_ref());
    if let (Some(k), Some(l)) = (kinds, &failing) {
        for (kind, bytes) in dump::view::kinds_by_name(k) {
            if let Some(b) = bytes {
                let mut lk = l.clone();
                lk.push(("kind", kind.to_string()));
                push("oomshim_failure_memory_bytes", &lk, b.to_string());
            }
        }
    }
    Some(render(FAMILIES, &samples))
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub written: Vec<PathBuf>,
    pub removed: Vec<PathBuf>,
    /// `path: why` for what could not be read or written.
    pub problems: Vec<String>,
}

/// One pass: a file for each of the newest [`MAX_FILES`] failure dumps in `dumps` (each
/// directory and one level of subdirectories, as `merge` reads them) whose file is missing or
/// older than its dump, and the removal of this module's files whose dump is gone.
pub fn refresh(out_dir: &Path, dumps: &[PathBuf], gpus: &[NvmlDevice]) -> Pass {
    let mut pass = Pass::default();
    if let Err(e) = std::fs::create_dir_all(out_dir) {
        pass.problems
            .push(format!("{}: {e}", dump::units::clean_path(out_dir)));
        return pass;
    }
    let mut found: Vec<(SystemTime, PathBuf)> = Vec::new();
    for dir in dumps {
        collect(dir, 1, &mut found);
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut wanted: Vec<String> = Vec::new();
    for (modified, path) in found {
        if wanted.len() >= MAX_FILES {
            break;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let name = format!("{stem}.prom");
        let target = out_dir.join(&name);
        let fresh = std::fs::metadata(&target)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= modified);
        if fresh {
            wanted.push(name);
            continue;
        }
        let d = match dump::read::read_dump(&path) {
            Ok(d) => d,
            // Not a dump (foreign JSON, a side file): nothing to say.
            Err(dump::read::DumpError::WrongSchema { .. }) => continue,
            Err(e) => {
                pass.problems.push(e.to_string());
                continue;
            }
        };
        let file = path.file_name().and_then(|n| n.to_str()).unwrap_or(stem);
        let Some(text) = exposition_of(&d, file, gpus) else {
            continue;
        };
        wanted.push(name);
        match dump::write::write_file_atomically(&target, text.as_bytes(), 0o644) {
            Ok(()) => pass.written.push(target),
            Err(e) => pass
                .problems
                .push(format!("{}: {e}", dump::units::clean_path(&target))),
        }
    }
    if let Ok(entries) = std::fs::read_dir(out_dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let ours = name.starts_with(PREFIX) && name.ends_with(".prom");
            if ours && !wanted.iter().any(|w| w == name) && std::fs::remove_file(e.path()).is_ok() {
                pass.removed.push(e.path());
            }
        }
    }
    pass
}

/// Every `*.json` under `dir` (down `depth` levels of subdirectories) with its modification time.
fn collect(dir: &Path, depth: u32, out: &mut Vec<(SystemTime, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten().take(100_000) {
        let p = e.path();
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            if depth > 0 {
                collect(&p, depth - 1, out);
            }
        } else if meta.is_file() && p.extension().is_some_and(|x| x == "json") {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // torch's side files beside a dump are not dumps.
            if name.starts_with("oomshim-") && !name.starts_with("oomshim-torch-") {
                if let Ok(t) = meta.modified() {
                    out.push((t, p));
                }
            }
        }
    }
}
