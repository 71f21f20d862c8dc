//! What the rules read from a dump, gathered once: the failing device's numbers, the largest
//! site, the framework's free blocks, the other processes on the device, and the rules' readings
//! of the whole dump ([`Readings`], made by `mod.rs`). The labels carried here (the largest
//! site's, the request's size) are computed once for the sentences in `words/`.

use super::found::{Readings, TopSite};
use super::sites::{site_label, Line, NO_PYTHON_FRAMES};
use dump::model::{DeviceInfo, Dump, FailedRequest, MemoryCap};
use dump::model::{GpuProcess, Relation};
use dump::units::human_bytes;
use dump::view::{free_blocks_available, sorted_sites, used_bytes};

/// The failing device's numbers, from the capture if complete, else from the last failure of the
/// burst, else whatever is known.
pub(super) struct DeviceNumbers {
    pub(super) index: i32,
    pub(super) total: Option<u64>,
    pub(super) free: Option<u64>,
    /// Tracked bytes on the device; `None` when the dump has neither a device entry nor a last
    /// failure for it.
    pub(super) tracked: Option<u64>,
    pub(super) count: Option<u64>,
    /// The numbers came from `last_failure`, not from the capture.
    pub(super) from_last_failure: bool,
}

impl DeviceNumbers {
    pub(super) fn of(dump: &Dump, request: &FailedRequest) -> DeviceNumbers {
        let device: Option<&DeviceInfo> = dump.devices.iter().find(|d| d.index == request.device);
        let last = request.last_failure.as_ref();
        let from_device = device.is_some_and(|d| d.total_bytes.is_some() && d.free_bytes.is_some());
        let from_last =
            !from_device && last.is_some_and(|l| l.total_bytes.is_some() && l.free_bytes.is_some());
        if from_last {
            let l = last.expect("checked");
            return DeviceNumbers {
                index: request.device,
                total: l.total_bytes,
                free: l.free_bytes,
                tracked: Some(l.tracked_bytes),
                count: None,
                from_last_failure: true,
            };
        }
        DeviceNumbers {
            index: request.device,
            total: device
                .and_then(|d| d.total_bytes)
                .or(last.and_then(|l| l.total_bytes)),
            free: device.and_then(|d| d.free_bytes),
            tracked: device
                .map(|d| d.tracked_bytes)
                .or(last.map(|l| l.tracked_bytes)),
            count: device.map(|d| d.tracked_count),
            from_last_failure: false,
        }
    }

    pub(super) fn used(&self) -> Option<u64> {
        used_bytes(self.total, self.free)
    }
}

pub(super) fn top_site(dump: &Dump) -> Option<TopSite<'_>> {
    let site = *sorted_sites(dump).first()?;
    // A Python process records a tensor's Python stack only: none means a thread without
    // Python frames allocated it.
    let line = Line::of_site(site, dump.recording.python.is_some());
    let label = match line {
        Some(Line::NoPythonFrames) => NO_PYTHON_FRAMES.to_string(),
        _ => site_label(&site.stack),
    };
    Some(TopSite { site, line, label })
}

/// Tracked bytes of every device at the capture (what the growth samples sum).
pub(super) fn tracked_all(dump: &Dump) -> u64 {
    dump.devices
        .iter()
        .map(|d| d.tracked_bytes)
        .fold(0, u64::saturating_add)
}

/// `PYTORCH_CUDA_ALLOC_CONF` in the dump's configuration snapshot.
pub(super) fn alloc_conf(dump: &Dump) -> Option<&str> {
    dump.config
        .as_ref()?
        .env
        .get("PYTORCH_CUDA_ALLOC_CONF")
        .map(|s| s.as_str())
}

/// Everything the findings of one out-of-memory dump are computed from.
pub(super) struct Ctx<'a> {
    pub(super) dump: &'a Dump,
    pub(super) request: &'a FailedRequest,
    pub(super) n: DeviceNumbers,
    pub(super) used: Option<u64>,
    pub(super) tracked: u64,
    pub(super) top: Option<TopSite<'a>>,
    pub(super) req: String,
    pub(super) dev: i32,
    pub(super) others: Vec<&'a GpuProcess>,
    pub(super) others_bytes: u64,
    /// The per-process cap the failure was judged against (`n.total` is the cap then).
    pub(super) cap: Option<&'a MemoryCap>,
    pub(super) readings: Readings<'a>,
}

impl<'a> Ctx<'a> {
    /// The numbers of the failing device and its other processes, with the rules' readings of
    /// the whole dump.
    pub(super) fn of(
        dump: &'a Dump,
        request: &'a FailedRequest,
        readings: Readings<'a>,
    ) -> Ctx<'a> {
        let n = DeviceNumbers::of(dump, request);
        let used = n.used();
        let tracked = n.tracked.unwrap_or(0);
        let dev = n.index;
        let others = other_processes(dump, dev);
        let others_bytes: u64 = others.iter().filter_map(|p| p.used_bytes).sum();
        Ctx {
            dump,
            request,
            used,
            tracked,
            top: top_site(dump),
            req: human_bytes(request.bytes),
            dev,
            others,
            others_bytes,
            n,
            cap: dump
                .devices
                .iter()
                .find(|d| d.index == request.device)
                .and_then(|d| d.memory_cap.as_ref()),
            readings,
        }
    }

    /// Where the request failed, in words: "device 0", or under a per-process cap "the 2.00 GiB
    /// cap set by set_per_process_memory_fraction(0.25) of device 0's 8.00 GiB".
    pub(super) fn place(&self) -> String {
        match self.cap {
            Some(cap) => dump::view::cap_phrase(self.dev, cap),
            None => format!("device {}", self.dev),
        }
    }
}

/// The free blocks of the framework's cache, when a source shows them.
pub(super) struct Cache {
    pub(super) source: String,
    pub(super) total_free: u64,
    pub(super) largest: u64,
    /// Free bytes `empty_cache` can return: total free less the inactive split bytes (free
    /// blocks in segments that also hold a live block), when the source knows them.
    pub(super) releasable: u64,
    pub(super) inactive_split: Option<u64>,
    /// What the cache reserves from the device, when the source knows.
    pub(super) reserved: Option<u64>,
}

pub(super) fn cache(dump: &Dump) -> Option<Cache> {
    if !free_blocks_available(dump) {
        return None;
    }
    let fb = &dump.free_blocks;
    let total_free = fb.total_free_bytes?;
    let largest = fb.largest_free_bytes.unwrap_or(0).min(total_free);
    Some(Cache {
        source: fb.source.clone(),
        total_free,
        largest,
        releasable: total_free.saturating_sub(fb.inactive_split_bytes.unwrap_or(0)),
        inactive_split: fb.inactive_split_bytes,
        reserved: fb.reserved_bytes,
    })
}

/// Processes other than this one that NVML lists on `device`.
pub(super) fn other_processes(dump: &Dump, device: i32) -> Vec<&GpuProcess> {
    dump.gpu_processes
        .iter()
        .filter(|g| g.device == device)
        .flat_map(|g| g.processes.iter())
        .filter(|p| p.relation != Relation::This)
        .collect()
}
