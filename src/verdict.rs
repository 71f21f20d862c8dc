//! Findings from a dump: whose memory filled the device, in plain words, with the numbers that
//! show it. Pure functions of the dump; table-tested.
//!
//! Kinds, first match wins for an out-of-memory dump (one with a `failed_request`):
//! - [`REQUEST_EXCEEDS_DEVICE`]: the request alone is larger than the device's total memory.
//! - [`FRAGMENTATION`]: the dump's free-block data shows enough free memory in total but no
//!   block large enough (only when a free-block source is available, never guessed).
//! - [`OTHER_PROCESSES`]: less than half of the memory in use is this process's, and other
//!   processes that NVML lists on the device hold at least half of the rest.
//! - [`UNTRACKED_MEMORY`]: less than half of the memory in use was allocated by this process
//!   through calls the shim tracks (or, without device numbers, it tracked nothing at all).
//! - [`LEAK`]: this process's allocations fill the device and the dump's `growth` (per marked
//!   step) shows one site growing by at least [`LEAK_MIN_BYTES_PER_STEP`] a step, carrying at
//!   least [`LEAK_MIN_SHARE`] of the growth.
//! - [`OWN_ALLOCATIONS`]: otherwise; this process's tracked allocations fill the device.
//!
//! [`HOST_MEMORY`] is the kind only when the failed request was for page-locked host memory;
//! otherwise low host memory (below [`HOST_MIN_AVAILABLE_SHARE`] available, or a cgroup at
//! [`CGROUP_MAX_USAGE_SHARE`] of its limit) is a secondary finding in the evidence.
//!
//! A dump without a failed request gets [`SNAPSHOT`].

use crate::dump::model::{DeviceInfo, Dump, FailedRequest, Frame, GrowthSite, Site, Verdict};
use crate::facts::gpu_processes::{GpuProcess, Relation};
use crate::report::units::{bytes_with_exact, clean, human_bytes, percent, share, thousands};
use crate::report::{frame_label, free_blocks_available, named_frames, sorted_sites, used_bytes};

pub const REQUEST_EXCEEDS_DEVICE: &str = "request_exceeds_device";
pub const FRAGMENTATION: &str = "fragmentation";
pub const OTHER_PROCESSES: &str = "other_processes";
pub const UNTRACKED_MEMORY: &str = "untracked_memory";
pub const OWN_ALLOCATIONS: &str = "own_allocations";
pub const LEAK: &str = "leak";
pub const HOST_MEMORY: &str = "host_memory";
pub const SNAPSHOT: &str = "snapshot";

/// Smallest growth per step of one site for [`LEAK`]: below it, growth is noise (counters,
/// small caches), not what fills a device.
pub const LEAK_MIN_BYTES_PER_STEP: u64 = 1 << 20;
/// Smallest share of the growth per step (the larger of the growing sites' sum and the fitted
/// growth of all tracked bytes) that the leaking site must carry for [`LEAK`]: the site is
/// *the* leak, not one of many growing things.
pub const LEAK_MIN_SHARE: f64 = 0.5;
/// Host memory is low when `MemAvailable` is below this share of `MemTotal`.
pub const HOST_MIN_AVAILABLE_SHARE: f64 = 0.05;
/// ... or when the cgroup's usage is at least this share of its limit.
pub const CGROUP_MAX_USAGE_SHARE: f64 = 0.95;

/// Longest function name quoted in a verdict.
const MAX_FUNCTION: usize = 100;

/// Judges a dump. Uses everything in it except its own `verdict` field. Deterministic.
pub fn judge(dump: &Dump) -> Verdict {
    match &dump.failed_request {
        Some(request) => judge_oom(dump, request),
        None => judge_snapshot(dump),
    }
}

/// The failing device's numbers, from the capture if complete, else from the last failure of the
/// burst, else whatever is known.
struct DeviceNumbers {
    index: i32,
    total: Option<u64>,
    free: Option<u64>,
    /// Tracked bytes on the device; `None` when the dump has neither a device entry nor a last
    /// failure for it.
    tracked: Option<u64>,
    count: Option<u64>,
    /// The numbers came from `last_failure`, not from the capture.
    from_last_failure: bool,
}

impl DeviceNumbers {
    fn of(dump: &Dump, request: &FailedRequest) -> DeviceNumbers {
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

    fn used(&self) -> Option<u64> {
        used_bytes(self.total, self.free)
    }
}

/// The largest site and how to name it.
struct TopSite<'a> {
    site: &'a Site,
    label: String,
}

fn top_site(dump: &Dump) -> Option<TopSite<'_>> {
    let site = *sorted_sites(dump).first()?;
    Some(TopSite {
        site,
        label: site_label(&site.stack),
    })
}

/// The innermost named frame of a stack, `function (file:line)`; a plain description when no
/// frame has a name.
fn site_label(stack: &[Frame]) -> String {
    match named_frames(stack).next() {
        Some(frame) => frame_label(frame, MAX_FUNCTION),
        None => match stack.first() {
            Some(frame) => format!(
                "an unnamed site (innermost address {})",
                clean(&frame.address)
            ),
            None => "a site without a recorded stack".to_string(),
        },
    }
}

fn count_word(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// The site that leaks, per marked step (see [`LEAK`]).
struct LeakFinding<'a> {
    site: &'a GrowthSite,
    label: String,
    share: f64,
    projected: Option<u64>,
}

fn leak_finding(dump: &Dump) -> Option<LeakFinding<'_>> {
    let g = dump.growth.as_ref().filter(|g| g.unit == "step")?;
    let site = g.sites.iter().max_by_key(|s| s.bytes_per_step)?;
    if site.bytes_per_step < LEAK_MIN_BYTES_PER_STEP {
        return None;
    }
    let sum: u64 = g.sites.iter().map(|s| s.bytes_per_step).sum();
    let points: Vec<(u64, u64)> = g.tracked.iter().map(|p| (p.step, p.bytes)).collect();
    let all = crate::runtime::fit_growth(&points).map_or(0.0, |f| f.0);
    let whole = (sum as f64).max(all);
    let share = site.bytes_per_step as f64 / whole;
    (share >= LEAK_MIN_SHARE).then(|| LeakFinding {
        site,
        label: site_label(&site.stack),
        share,
        projected: site.projected_oom_step,
    })
}

/// `PYTORCH_CUDA_ALLOC_CONF` in the dump's configuration snapshot.
fn alloc_conf(dump: &Dump) -> Option<&str> {
    dump.config
        .as_ref()?
        .env
        .get("PYTORCH_CUDA_ALLOC_CONF")
        .map(|s| s.as_str())
}

/// True when `PYTORCH_CUDA_ALLOC_CONF` already enables expandable segments.
fn expandable_segments_on(dump: &Dump) -> bool {
    alloc_conf(dump).is_some_and(|c| {
        let c: String = c.chars().filter(|ch| !ch.is_whitespace()).collect();
        c.to_ascii_lowercase().contains("expandable_segments:true")
    })
}

/// Evidence that host memory is low, when it is.
fn host_pressure(dump: &Dump) -> Option<String> {
    let h = dump.host.as_ref()?;
    if let (Some(avail), Some(total)) = (h.available_bytes, h.total_bytes) {
        if total > 0 && (avail as f64) < HOST_MIN_AVAILABLE_SHARE * total as f64 {
            return Some(format!(
                "host memory is low: {} available of {} ({})",
                human_bytes(avail),
                human_bytes(total),
                percent(share(avail, total))
            ));
        }
    }
    if let (Some(usage), Some(limit)) = (h.cgroup_usage_bytes, h.cgroup_limit_bytes) {
        if limit > 0 && usage as f64 >= CGROUP_MAX_USAGE_SHARE * limit as f64 {
            return Some(format!(
                "host memory is low: the cgroup uses {} of its {} limit ({})",
                human_bytes(usage),
                human_bytes(limit),
                percent(share(usage, limit))
            ));
        }
    }
    None
}

const HOST_SUGGESTION: &str = "Host memory is nearly exhausted (a CPU-side out-of-memory kill may follow): use fewer      DataLoader workers, fewer or smaller pinned buffers (`pin_memory`, `cudaMallocHost`), and don't keep results on the host      across steps.";

fn is_pinned_api(api: &str) -> bool {
    matches!(
        api,
        "cudaMallocHost" | "cudaHostAlloc" | "cuMemAllocHost" | "cuMemHostAlloc"
    )
}

/// One line per growing site (at most 3), from the dump's `growth`.
fn growth_evidence(dump: &Dump, evidence: &mut Vec<String>) {
    if let Some(g) = &dump.growth {
        for site in g.sites.iter().take(3) {
            let projected = site
                .projected_oom_step
                .map(|p| {
                    format!(
                        "; free memory runs out at {} {p} at this rate",
                        clean(&g.unit)
                    )
                })
                .unwrap_or_default();
            evidence.push(format!(
                "growth: {} adds {} per {} (R² {:.2} over {} samples, {} at {} {} to {} at {} {}){projected}",
                site_label(&site.stack),
                human_bytes(site.bytes_per_step),
                clean(&g.unit),
                site.r_squared,
                site.samples,
                human_bytes(site.first.bytes),
                clean(&g.unit),
                site.first.step,
                human_bytes(site.last.bytes),
                clean(&g.unit),
                site.last.step,
            ));
        }
    }
}

fn judge_oom(dump: &Dump, request: &FailedRequest) -> Verdict {
    let n = DeviceNumbers::of(dump, request);
    let used = n.used();
    let tracked = n.tracked.unwrap_or(0);
    let top = top_site(dump);
    let req = human_bytes(request.bytes);
    let dev = n.index;
    let fb = &dump.free_blocks;
    let fragmented = free_blocks_available(dump)
        && matches!((fb.total_free_bytes, fb.largest_free_bytes),
            (Some(total), Some(largest)) if total >= request.bytes && largest < request.bytes);

    let others = other_processes(dump, dev);
    let others_bytes: u64 = others.iter().filter_map(|p| p.used_bytes).sum();
    let untracked = used.map_or(0, |u| u.saturating_sub(tracked));
    let leak = leak_finding(dump);
    let host_low = host_pressure(dump);
    let kind = if is_pinned_api(&request.api) {
        HOST_MEMORY
    } else if n.total.is_some_and(|total| request.bytes > total) {
        REQUEST_EXCEEDS_DEVICE
    } else if fragmented {
        FRAGMENTATION
    } else if match used {
        Some(used) => used > 0 && (tracked as f64) < 0.5 * used as f64,
        None => tracked == 0,
    } {
        if others_bytes > 0 && others_bytes as f64 >= 0.5 * untracked as f64 {
            OTHER_PROCESSES
        } else {
            UNTRACKED_MEMORY
        }
    } else if leak.is_some() {
        LEAK
    } else {
        OWN_ALLOCATIONS
    };

    // --- evidence -------------------------------------------------------------------------
    let mut evidence = Vec::new();
    evidence.push(format!(
        "failed request: {} via {} on device {dev} (error {})",
        bytes_with_exact(request.bytes),
        clean(&request.api),
        request.error_code
    ));
    if let Some(frame) = named_frames(&request.stack).next() {
        evidence.push(format!(
            "failing call: {}",
            frame_label(frame, MAX_FUNCTION)
        ));
    }
    let when = if n.from_last_failure {
        " at the last failure of the burst"
    } else {
        ""
    };
    match (n.total, used) {
        (Some(total), Some(used)) => evidence.push(format!(
            "device {dev}{when}: {} of {} in use; {} tracked ({} of used)",
            human_bytes(used),
            human_bytes(total),
            human_bytes(tracked),
            percent(share(tracked, used))
        )),
        _ => {
            let total = n
                .total
                .map(|t| format!(" (total {})", human_bytes(t)))
                .unwrap_or_default();
            let tracked_text = match (n.tracked, n.count) {
                (Some(t), Some(c)) => format!(
                    "{} tracked in {}",
                    human_bytes(t),
                    count_word(c, "allocation", "allocations")
                ),
                (Some(t), None) => format!("{} tracked", human_bytes(t)),
                (None, _) => "no tracked numbers for this device".to_string(),
            };
            evidence.push(format!(
                "device {dev}: memory numbers unavailable{total}; {tracked_text}"
            ));
        }
    }
    if let Some(free) = n.free {
        let relation = if free >= request.bytes {
            "not less than"
        } else {
            "less than"
        };
        evidence.push(format!(
            "device {dev}{when}: {} free, {relation} the {req} request",
            human_bytes(free)
        ));
    }
    let untracked = used.map(|u| u.saturating_sub(tracked));
    if let (Some(untracked), Some(used)) = (untracked, used) {
        if untracked > 0 {
            evidence.push(format!(
                "untracked: {} of the {} in use ({})",
                human_bytes(untracked),
                human_bytes(used),
                percent(share(untracked, used))
            ));
        }
    }
    if let Some(top) = &top {
        let of_used = match used {
            Some(u) if u > 0 => format!(" ({} of used)", percent(share(top.site.bytes, u))),
            _ => String::new(),
        };
        evidence.push(format!(
            "top site: {} holds {} in {}{of_used}",
            top.label,
            human_bytes(top.site.bytes),
            count_word(top.site.count, "allocation", "allocations"),
        ));
    }
    growth_evidence(dump, &mut evidence);
    if let Some(text) = &host_low {
        evidence.push(text.clone());
    }
    if let Some(conf) = alloc_conf(dump) {
        evidence.push(format!("PYTORCH_CUDA_ALLOC_CONF={}", clean(conf)));
    }
    let devices_holding = dump.devices.iter().filter(|d| d.tracked_bytes > 0).count();
    if devices_holding > 1 && top.is_some() {
        evidence.push(format!(
            "{devices_holding} devices hold tracked memory; sites are not split by device"
        ));
    }
    if request.failures_in_burst > 1 {
        evidence.push(format!(
            "failures in this burst: {}",
            thousands(request.failures_in_burst.into())
        ));
    }
    if let Some(last) = &request.last_failure {
        let mut text = format!(
            "last failure of the burst: {} via {}",
            human_bytes(last.bytes),
            clean(&last.api)
        );
        match (last.free_bytes, last.total_bytes) {
            (Some(free), Some(total)) => {
                text += &format!("; {} free of {}", human_bytes(free), human_bytes(total))
            }
            (Some(free), None) => text += &format!("; {} free", human_bytes(free)),
            _ => {}
        }
        text += &format!("; {} tracked", human_bytes(last.tracked_bytes));
        evidence.push(text);
    }
    if free_blocks_available(dump) {
        if let (Some(total), Some(largest)) = (fb.total_free_bytes, fb.largest_free_bytes) {
            let frag = fb
                .fragmentation
                .filter(|f| f.is_finite())
                .map(|f| format!(" ({} fragmentation)", percent(Some(f * 100.0))))
                .unwrap_or_default();
            evidence.push(format!(
                "free blocks ({}): {} free, largest block {}{frag}",
                clean(&fb.source),
                human_bytes(total),
                human_bytes(largest)
            ));
        }
    }
    evidence.push(
        match request.recovered {
            Some(true) => {
                "recovered: yes, a later request of at least this size succeeded (the retry worked)"
            }
            Some(false) => {
                "recovered: no, no later request of this size succeeded (the program saw the error)"
            }
            None => "recovered: unknown (the dump was written before a retry could be seen)",
        }
        .to_string(),
    );

    // --- summary and suggestions ----------------------------------------------------------
    match dump.gpu_processes.as_ref().filter(|g| g.device == dev) {
        Some(g) if g.error.is_some() => evidence.push(format!(
            "other processes on device {dev}: unknown ({})",
            clean(g.error.as_deref().unwrap_or(""))
        )),
        Some(g) => {
            for p in g.processes.iter().take(5) {
                evidence.push(format!(
                    "process {} ({}, {}) holds {} on device {dev} (NVML)",
                    p.pid,
                    clean(p.name.as_deref().unwrap_or("name not visible")),
                    p.relation.words(),
                    p.used_bytes
                        .map(human_bytes)
                        .unwrap_or_else(|| "an unknown amount".to_string())
                ));
            }
        }
        None => {}
    }
    let mut suggestions = Vec::new();
    let top_text = |used: Option<u64>| -> String {
        match &top {
            Some(top) => {
                let share_text = match used {
                    Some(u) if u > 0 => format!(
                        " ({} of the memory in use)",
                        percent(share(top.site.bytes, u))
                    ),
                    _ => String::new(),
                };
                format!(
                    " The largest allocation site, {}, holds {} in {}{share_text}.",
                    top.label,
                    human_bytes(top.site.bytes),
                    count_word(top.site.count, "allocation", "allocations")
                )
            }
            None => " No allocation sites were recorded.".to_string(),
        }
    };
    let failing_at = named_frames(&request.stack)
        .next()
        .map(|f| format!(" at {}", frame_label(f, MAX_FUNCTION)))
        .unwrap_or_default();

    let judged = match kind {
        REQUEST_EXCEEDS_DEVICE => {
            let total = n.total.unwrap_or(0);
            suggestions.push(format!(
                "Make the allocation itself smaller: find what asks for {req}{failing_at} and reduce the batch size or sequence length, or split the work into chunks."
            ));
            suggestions.push(
                "Check the size computation: a request this large often comes from a wrong shape or an overflowed dimension.".to_string(),
            );
            suggestions.push(
                "If the data really is this large, spread it over several devices (sharding, tensor or pipeline parallelism) or keep it in host memory.".to_string(),
            );
            format!(
                "The failed request alone is larger than the whole device: {req} was asked of device {dev}, which has {} in total. \
                 No amount of freeing memory makes it fit; the allocation itself must shrink.",
                human_bytes(total)
            )
        }
        FRAGMENTATION => {
            let total_free = fb.total_free_bytes.unwrap_or(0);
            let largest = fb.largest_free_bytes.unwrap_or(0);
            if !expandable_segments_on(dump) {
                suggestions.push(
                    "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so the cache grows segments instead of needing one contiguous free block.".to_string(),
                );
            }
            suggestions.push(
                "Keep tensor shapes steady (pad or bucket variable-length inputs) so freed blocks are reused instead of split.".to_string(),
            );
            suggestions.push(
                "`torch.cuda.empty_cache()` returns only unused cached segments to the driver; it does not join blocks split by live tensors.".to_string(),
            );
            format!(
                "The free memory is fragmented: {} was free in the allocator's blocks ({}), more than the {req} request, \
                 but the largest free block was only {}, so no single block could hold it.{}",
                human_bytes(total_free),
                clean(&fb.source),
                human_bytes(largest),
                top_text(used)
            )
        }
        OTHER_PROCESSES => {
            let biggest = others
                .iter()
                .max_by_key(|p| p.used_bytes.unwrap_or(0))
                .expect("others is not empty");
            for p in &others {
                let who = format!(
                    "process {} ({})",
                    p.pid,
                    clean(p.name.as_deref().unwrap_or("name not visible"))
                );
                suggestions.push(match p.relation {
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
                if suggestions.len() >= 4 {
                    break;
                }
            }
            format!(
                "Other processes hold most of the memory on device {dev}: {} of the {} in use belongs to {}, the largest \
                 being process {} ({}, {}) with {}. This process's tracked allocations are only {}, so the {req} request \
                 failed for lack of room the other processes occupy.",
                human_bytes(others_bytes),
                used.map(human_bytes).unwrap_or_else(|| "memory".to_string()),
                count_word(others.len() as u64, "other process", "other processes"),
                biggest.pid,
                clean(biggest.name.as_deref().unwrap_or("name not visible")),
                biggest.relation.words(),
                biggest.used_bytes.map(human_bytes).unwrap_or_else(|| "an unknown amount".to_string()),
                human_bytes(tracked)
            )
        }
        UNTRACKED_MEMORY => {
            suggestions.push(format!(
                "Run `nvidia-smi` to see which processes hold memory on GPU {dev}; if another job is there, \
                 run on a free GPU (`CUDA_VISIBLE_DEVICES`) or wait until it finishes."
            ));
            suggestions.push(
                "If this process is alone on the GPU, the untracked memory is its own: the CUDA context and library workspaces \
                 (cuBLAS, cuDNN, NCCL) take from a few hundred MiB to a few GiB per device; much more than that points to an \
                 allocation path the shim does not hook yet."
                    .to_string(),
            );
            match (n.total, used) {
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
                    "The device's memory numbers were unavailable, and this process held no tracked memory on device {dev} when {req} \
                     failed, so the memory in use was not allocated through calls oomshim tracks: it belongs to another process, or \
                     this process got it in ways the shim does not see (the CUDA context, libraries, or allocation paths not hooked yet)."
                ),
            }
        }
        HOST_MEMORY => {
            suggestions.push(HOST_SUGGESTION.to_string());
            format!(
                "Page-locked host memory ran out: {req} via {} failed. This is host memory, not device memory; pinned buffers \
                 count against the machine's (or the container's) RAM.",
                clean(&request.api)
            )
        }
        LEAK => {
            let l = leak.as_ref().expect("kind is leak");
            suggestions.push(format!(
                "Find what {} keeps from each step. The classic causes: accumulating a tensor that is still on the GPU and \
                 attached to the graph (`total_loss += loss` or `losses.append(loss)`: keep `loss.item()`), keeping outputs or \
                 activations for logging (keep `t.detach().cpu()`), and appending model outputs to a list across steps.",
                l.label
            ));
            suggestions.push(
                "Run evaluation under `torch.inference_mode()` (or `torch.no_grad()`) so it keeps no graph.".to_string(),
            );
            let projected = l
                .projected
                .map(|p| format!(" At that rate the device's free memory runs out at step {p}."))
                .unwrap_or_default();
            format!(
                "A leak: memory allocated at {} grows by {} every step ({} steps observed, from {} at step {} to {} at step {}), \
                 {} of the growth per step.{projected} This process's own allocations fill device {dev}: {} tracked when {req} \
                 more was requested.",
                l.label,
                human_bytes(l.site.bytes_per_step),
                l.site.samples,
                human_bytes(l.site.first.bytes),
                l.site.first.step,
                human_bytes(l.site.last.bytes),
                l.site.last.step,
                percent(Some((l.share * 100.0).min(100.0))),
                human_bytes(tracked),
            )
        }
        _ => {
            let site = top
                .as_ref()
                .map(|t| t.label.as_str())
                .unwrap_or("the largest allocation sites");
            suggestions.push(format!(
                "Free or shrink what {site} keeps alive. Tensors kept across steps are the usual cause: store `loss.item()` \
                 rather than `loss`, `detach()` what you keep for logging, don't accumulate outputs on the GPU, and run \
                 evaluation under `torch.inference_mode()`."
            ));
            suggestions.push(
                "Reduce the batch size (or sequence length); gradient accumulation keeps the effective batch size.".to_string(),
            );
            let mut hints = Vec::new();
            if request.failures_in_burst > 1 {
                hints.push(format!(
                    "the allocation failed {} times in one burst",
                    request.failures_in_burst
                ));
            }
            if let Some(free) = n.free.filter(|&f| f >= request.bytes && request.bytes > 0) {
                hints.push(format!(
                    "{} was free, not less than the {req} request",
                    human_bytes(free)
                ));
            }
            if !hints.is_empty() && !free_blocks_available(dump) && !expandable_segments_on(dump) {
                suggestions.push(format!(
                    "Possibly fragmentation ({}), though the shim cannot see the framework's free blocks here, so this is not \
                     established: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` may help if it is.",
                    hints.join("; ")
                ));
            }
            match (n.total, used) {
                (Some(total), Some(0)) => format!(
                    "Device {dev} showed no memory in use when the dump was written ({} total), so the state at capture does not \
                     explain the failure of {req}: memory was probably released between the failure and the capture.{}",
                    human_bytes(total),
                    top_text(used)
                ),
                (Some(total), Some(used)) => format!(
                    "This process's own allocations fill device {dev}: {} of the {} in use ({}) was allocated by this process, \
                     out of {} in total, when {req} more was requested.{}",
                    human_bytes(tracked),
                    human_bytes(used),
                    percent(share(tracked, used)),
                    human_bytes(total),
                    top_text(Some(used))
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
                        top_text(None)
                    )
                }
            }
        }
    };

    if host_low.is_some() && kind != HOST_MEMORY {
        suggestions.push(HOST_SUGGESTION.to_string());
    }
    let summary = match request.recovered {
        Some(true) => format!(
            "This failure was recovered by a retry: a later request of at least {req} on device {dev} succeeded, so the program \
             did not see this error. {judged}"
        ),
        Some(false) => format!("{judged} The retry did not succeed: the program saw this out-of-memory error."),
        None => judged,
    };

    Verdict {
        kind: kind.to_string(),
        summary,
        evidence,
        suggestions,
    }
}

fn judge_snapshot(dump: &Dump) -> Verdict {
    let tracked: u64 = dump
        .devices
        .iter()
        .map(|d| d.tracked_bytes)
        .fold(0, u64::saturating_add);
    let count: u64 = dump
        .devices
        .iter()
        .map(|d| d.tracked_count)
        .fold(0, u64::saturating_add);
    let holding = dump.devices.iter().filter(|d| d.tracked_bytes > 0).count();
    let top = top_site(dump);

    let mut evidence = Vec::new();
    for d in &dump.devices {
        let mut line = format!("device {}: ", d.index);
        match (d.total_bytes, used_bytes(d.total_bytes, d.free_bytes)) {
            (Some(total), Some(used)) => {
                line += &format!(
                    "{} of {} in use; {} tracked ({} of used)",
                    human_bytes(used),
                    human_bytes(total),
                    human_bytes(d.tracked_bytes),
                    percent(share(d.tracked_bytes, used))
                )
            }
            _ => {
                line += &format!(
                    "memory numbers unavailable; {} tracked",
                    human_bytes(d.tracked_bytes)
                )
            }
        }
        line += &format!(
            " in {}, peak {}",
            count_word(d.tracked_count, "allocation", "allocations"),
            human_bytes(d.peak_tracked_bytes)
        );
        evidence.push(line);
    }
    if let Some(top) = &top {
        evidence.push(format!(
            "top site: {} holds {} in {} ({} of tracked)",
            top.label,
            human_bytes(top.site.bytes),
            count_word(top.site.count, "allocation", "allocations"),
            percent(share(top.site.bytes, tracked)),
        ));
    }
    growth_evidence(dump, &mut evidence);
    if dump.pinned_host.bytes > 0 {
        evidence.push(format!(
            "pinned host memory: {} in {} (not device memory)",
            human_bytes(dump.pinned_host.bytes),
            count_word(dump.pinned_host.count, "allocation", "allocations")
        ));
    }

    let reason = clean(&dump.reason);
    let opening = if dump.reason == "oom" {
        "The dump says out-of-memory but records no failed request; here is what was held."
            .to_string()
    } else {
        format!("On-demand dump ({reason}).")
    };
    let held = format!(
        " This process holds {} of tracked device memory in {} on {}.",
        human_bytes(tracked),
        count_word(count, "allocation", "allocations"),
        count_word(holding as u64, "device", "devices")
    );
    let site = match &top {
        Some(top) => format!(
            " The largest allocation site, {}, holds {} in {} ({} of tracked).",
            top.label,
            human_bytes(top.site.bytes),
            count_word(top.site.count, "allocation", "allocations"),
            percent(share(top.site.bytes, tracked))
        ),
        None => " No allocation sites were recorded.".to_string(),
    };
    let suggestions = vec![
        "To find a leak, take dumps at two points of the run and compare the sites: one whose bytes grow with the step count keeps memory alive across steps."
            .to_string(),
    ];
    Verdict {
        kind: SNAPSHOT.to_string(),
        summary: format!("{opening}{held}{site}"),
        evidence,
        suggestions,
    }
}

/// Processes other than this one that NVML lists on `device`.
fn other_processes(dump: &Dump, device: i32) -> Vec<&GpuProcess> {
    dump.gpu_processes
        .iter()
        .filter(|g| g.device == device)
        .flat_map(|g| g.processes.iter())
        .filter(|p| p.relation != Relation::This)
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dump::model::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn frame(function: Option<&str>, file: Option<&str>, line: Option<u32>) -> Frame {
        Frame {
            address: "0x7f00deadbeef".into(),
            function: function.map(Into::into),
            file: file.map(Into::into),
            line,
            module: None,
            inlined: false,
            kind: Default::default(),
        }
    }

    fn site(bytes: u64, count: u64) -> Site {
        Site {
            bytes,
            count,
            stack: vec![
                frame(None, None, None),
                frame(Some("forward"), Some("model.py"), Some(42)),
                frame(Some("train_step"), Some("train.py"), Some(88)),
            ],
        }
    }

    /// A hand-built OOM dump on device 0: `total`/`free` may be None.
    pub(crate) fn oom_dump(
        request: u64,
        total: Option<u64>,
        free: Option<u64>,
        tracked: u64,
    ) -> Dump {
        Dump {
            schema: SCHEMA.into(),
            reason: "oom".into(),
            time: "2026-11-29T15:43:11.123Z".into(),
            time_unix_ms: 1_795_966_991_123,
            process: ProcessInfo {
                pid: 4812,
                host: "gpu-node-7".into(),
                command_line: vec!["python".into(), "train.py".into()],
                rank: None,
                local_rank: None,
                world_size: None,
            },
            failed_request: Some(FailedRequest {
                bytes: request,
                api: "cudaMalloc".into(),
                device: 0,
                error_code: 2,
                stack: vec![frame(Some("cudaMalloc"), None, None)],
                stack_merge: None,
                failures_in_burst: 1,
                recovered: None,
                last_failure: None,
            }),
            devices: vec![DeviceInfo {
                index: 0,
                name: Some("NVIDIA H200".into()),
                total_bytes: total,
                free_bytes: free,
                tracked_bytes: tracked,
                tracked_count: 12,
                peak_tracked_bytes: tracked,
            }],
            pinned_host: PinnedHost::default(),
            largest_holders: vec![],
            sites: if tracked > 0 {
                vec![site(tracked / 4, 3), site(tracked / 2, 5)]
            } else {
                vec![]
            },
            free_blocks: FreeBlocks {
                source: "unavailable".into(),
                reason: Some("under LD_PRELOAD the framework's cache hides free blocks".into()),
                total_free_bytes: None,
                largest_free_bytes: None,
                fragmentation: None,
                histogram: vec![],
            },
            verdict: Verdict {
                kind: "ignored".into(),
                summary: String::new(),
                evidence: vec![],
                suggestions: vec![],
            },
            recording: Recording::default(),
            pools: Vec::new(),
            vmm: None,
            host: None,
            gpu_processes: None,
            growth: None,
            config: None,
        }
    }

    fn contains_all(haystack: &str, needles: &[&str]) -> bool {
        needles.iter().all(|n| haystack.contains(n))
    }

    #[test]
    fn kinds_table() {
        struct Case {
            name: &'static str,
            dump: Dump,
            kind: &'static str,
            summary_has: &'static [&'static str],
            evidence_has: &'static [&'static str],
            suggestions_has: &'static [&'static str],
        }
        let mut recovered = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        recovered.failed_request.as_mut().unwrap().recovered = Some(true);
        let mut stood = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        stood.failed_request.as_mut().unwrap().recovered = Some(false);
        let mut burst = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        burst.failed_request.as_mut().unwrap().failures_in_burst = 3;
        let mut from_last = oom_dump(2 * GIB, None, None, 78 * GIB);
        from_last.failed_request.as_mut().unwrap().last_failure = Some(LastFailure {
            bytes: 2 * GIB,
            api: "cudaMalloc".into(),
            time_unix_ms: 1,
            tracked_bytes: 10 * GIB,
            free_bytes: Some(GIB),
            total_bytes: Some(80 * GIB),
        });
        let mut fragmented = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        fragmented.free_blocks = FreeBlocks {
            source: "torch-snapshot".into(),
            reason: None,
            total_free_bytes: Some(8 * GIB),
            largest_free_bytes: Some(GIB),
            fragmentation: Some(0.875),
            histogram: vec![],
        };
        let mut other_device = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        other_device.failed_request.as_mut().unwrap().device = 3;
        let mut big_request_no_free = oom_dump(100 * GIB, Some(80 * GIB), None, 0);
        big_request_no_free.devices[0].free_bytes = None;

        let cases = vec![
            Case {
                name: "own allocations fill the device",
                dump: oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB),
                kind: OWN_ALLOCATIONS,
                summary_has: &["own allocations fill device 0", "78.00 GiB of the 79.00 GiB in use (98.7%)", "forward (model.py:42)", "39.00 GiB in 5 allocations (49.4% of the memory in use)"],
                evidence_has: &["device 0: 79.00 GiB of 80.00 GiB in use; 78.00 GiB tracked (98.7% of used)", "top site: forward (model.py:42) holds 39.00 GiB in 5 allocations (49.4% of used)", "1.00 GiB free, less than the 2.00 GiB request", "recovered: unknown"],
                suggestions_has: &["forward (model.py:42) keeps alive", "loss.item()", "batch size"],
            },
            Case {
                name: "untracked: another process",
                dump: oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 10 * GIB),
                kind: UNTRACKED_MEMORY,
                summary_has: &["79.00 GiB of 80.00 GiB was in use", "only 10.00 GiB (12.7%)", "69.00 GiB untracked", "another process", "CUDA context"],
                evidence_has: &["untracked: 69.00 GiB of the 79.00 GiB in use (87.3%)"],
                suggestions_has: &["nvidia-smi", "CUDA_VISIBLE_DEVICES"],
            },
            Case {
                name: "request exceeds device",
                dump: oom_dump(100 * GIB, Some(80 * GIB), Some(79 * GIB), GIB),
                kind: REQUEST_EXCEEDS_DEVICE,
                summary_has: &["larger than the whole device: 100.00 GiB was asked of device 0, which has 80.00 GiB in total"],
                evidence_has: &["failed request: 100.00 GiB (107,374,182,400 bytes) via cudaMalloc on device 0 (error 2)", "failing call: cudaMalloc"],
                suggestions_has: &["100.00 GiB at cudaMalloc", "wrong shape"],
            },
            Case {
                name: "request exceeds device, free unknown",
                dump: big_request_no_free,
                kind: REQUEST_EXCEEDS_DEVICE,
                summary_has: &["which has 80.00 GiB in total"],
                evidence_has: &["memory numbers unavailable (total 80.00 GiB); 0 B tracked in 12 allocations"],
                suggestions_has: &[],
            },
            Case {
                name: "device numbers unavailable, tracked bytes present",
                dump: oom_dump(2 * GIB, None, None, 40 * GIB),
                kind: OWN_ALLOCATIONS,
                summary_has: &["memory numbers were unavailable", "tracked bytes alone", "40.00 GiB", "forward (model.py:42)"],
                evidence_has: &["device 0: memory numbers unavailable; 40.00 GiB tracked in 12 allocations"],
                suggestions_has: &["nvidia-smi"],
            },
            Case {
                name: "device numbers unavailable, nothing tracked",
                dump: oom_dump(2 * GIB, None, None, 0),
                kind: UNTRACKED_MEMORY,
                summary_has: &["memory numbers were unavailable", "no tracked memory on device 0"],
                evidence_has: &["memory numbers unavailable; 0 B tracked in 12 allocations"],
                suggestions_has: &["nvidia-smi"],
            },
            Case {
                name: "free known, total unknown",
                dump: oom_dump(2 * GIB, None, Some(GIB), 40 * GIB),
                kind: OWN_ALLOCATIONS,
                summary_has: &["tracked bytes alone"],
                evidence_has: &["1.00 GiB free, less than the 2.00 GiB request"],
                suggestions_has: &[],
            },
            Case {
                name: "failing device not in the device list",
                dump: other_device,
                kind: UNTRACKED_MEMORY,
                summary_has: &["no tracked memory on device 3"],
                evidence_has: &["device 3: memory numbers unavailable; no tracked numbers for this device"],
                suggestions_has: &["GPU 3"],
            },
            Case {
                name: "numbers from the last failure",
                dump: from_last,
                kind: UNTRACKED_MEMORY,
                summary_has: &["only 10.00 GiB"],
                evidence_has: &["device 0 at the last failure of the burst: 79.00 GiB of 80.00 GiB in use; 10.00 GiB tracked", "last failure of the burst: 2.00 GiB via cudaMalloc; 1.00 GiB free of 80.00 GiB; 10.00 GiB tracked"],
                suggestions_has: &[],
            },
            Case {
                name: "recovered",
                dump: recovered,
                kind: OWN_ALLOCATIONS,
                summary_has: &["This failure was recovered by a retry", "did not see this error", "own allocations"],
                evidence_has: &["recovered: yes"],
                suggestions_has: &[],
            },
            Case {
                name: "stood",
                dump: stood,
                kind: OWN_ALLOCATIONS,
                summary_has: &["the program saw this out-of-memory error"],
                evidence_has: &["recovered: no"],
                suggestions_has: &[],
            },
            Case {
                name: "burst hints at fragmentation as a possibility",
                dump: burst,
                kind: OWN_ALLOCATIONS,
                summary_has: &[],
                evidence_has: &["failures in this burst: 3"],
                suggestions_has: &["Possibly fragmentation (the allocation failed 3 times in one burst)", "not established", "expandable_segments:True"],
            },
            Case {
                name: "small request with more free than asked",
                dump: oom_dump(512 * MIB, Some(80 * GIB), Some(GIB), 78 * GIB + 512 * MIB),
                kind: OWN_ALLOCATIONS,
                summary_has: &[],
                evidence_has: &["1.00 GiB free, not less than the 512.00 MiB request"],
                suggestions_has: &["Possibly fragmentation (1.00 GiB was free, not less than the 512.00 MiB request)"],
            },
            Case {
                name: "fragmentation shown by free-block data",
                dump: fragmented,
                kind: FRAGMENTATION,
                summary_has: &["fragmented: 8.00 GiB was free in the allocator's blocks (torch-snapshot)", "largest free block was only 1.00 GiB"],
                evidence_has: &["free blocks (torch-snapshot): 8.00 GiB free, largest block 1.00 GiB (87.5% fragmentation)"],
                suggestions_has: &["expandable_segments:True", "empty_cache"],
            },
            Case {
                name: "empty device at capture",
                dump: oom_dump(2 * GIB, Some(80 * GIB), Some(80 * GIB), 0),
                kind: OWN_ALLOCATIONS,
                summary_has: &["showed no memory in use", "released between the failure and the capture", "No allocation sites were recorded"],
                evidence_has: &["0 B of 80.00 GiB in use; 0 B tracked (n/a of used)"],
                suggestions_has: &[],
            },
        ];
        for case in cases {
            let v = judge(&case.dump);
            assert_eq!(v.kind, case.kind, "{}: {v:#?}", case.name);
            assert!(
                contains_all(&v.summary, case.summary_has),
                "{}: summary {:?}",
                case.name,
                v.summary
            );
            let evidence = v.evidence.join("\n");
            assert!(
                contains_all(&evidence, case.evidence_has),
                "{}: evidence\n{evidence}",
                case.name
            );
            let suggestions = v.suggestions.join("\n");
            assert!(
                contains_all(&suggestions, case.suggestions_has),
                "{}: suggestions\n{suggestions}",
                case.name
            );
            assert!(!v.summary.contains('\n'), "{}: one paragraph", case.name);
            assert!(
                !suggestions.to_lowercase().contains("kill"),
                "{}: never suggest killing",
                case.name
            );
            assert_eq!(judge(&case.dump), v, "{}: deterministic", case.name);
        }
    }

    #[test]
    fn fragmentation_is_only_a_possibility_when_free_blocks_unavailable() {
        let v = judge(&oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB));
        assert!(!v.suggestions.join(" ").contains("fragmentation"), "{v:#?}");
    }

    #[test]
    fn snapshot() {
        let mut dump = oom_dump(0, Some(80 * GIB), Some(40 * GIB), 38 * GIB);
        dump.failed_request = None;
        dump.reason = "manual".into();
        dump.pinned_host = PinnedHost {
            bytes: 256 * MIB,
            count: 4,
            peak_bytes: 256 * MIB,
        };
        let v = judge(&dump);
        assert_eq!(v.kind, SNAPSHOT);
        assert!(
            contains_all(
                &v.summary,
                &[
                    "On-demand dump (manual).",
                    "38.00 GiB of tracked device memory in 12 allocations on 1 device.",
                    "forward (model.py:42), holds 19.00 GiB in 5 allocations (50.0% of tracked)"
                ]
            ),
            "{}",
            v.summary
        );
        assert_eq!(v.evidence[0], "device 0: 40.00 GiB of 80.00 GiB in use; 38.00 GiB tracked (95.0% of used) in 12 allocations, peak 38.00 GiB");
        assert!(v
            .evidence
            .iter()
            .any(|e| e.starts_with("pinned host memory: 256.00 MiB in 4 allocations")));

        dump.sites.clear();
        dump.devices.clear();
        dump.reason = "oom".into();
        let v = judge(&dump);
        assert_eq!(v.kind, SNAPSHOT);
        assert!(v.summary.contains("records no failed request"));
        assert!(v.summary.contains("No allocation sites were recorded"));
    }

    #[test]
    fn site_labels() {
        assert_eq!(site_label(&[]), "a site without a recorded stack");
        assert_eq!(
            site_label(&[frame(None, None, None)]),
            "an unnamed site (innermost address 0x7f00deadbeef)"
        );
        assert_eq!(site_label(&site(1, 1).stack), "forward (model.py:42)");
    }

    #[test]
    fn extreme_numbers_do_not_panic() {
        for (req, total, free, tracked) in [
            (u64::MAX, Some(u64::MAX), Some(u64::MAX), u64::MAX),
            (0, Some(0), Some(u64::MAX), 0),
            (0, Some(0), Some(0), u64::MAX),
            (1, None, Some(0), 0),
        ] {
            let mut dump = oom_dump(req, total, free, tracked);
            dump.devices.push(dump.devices[0].clone());
            dump.failed_request.as_mut().unwrap().failures_in_burst = u32::MAX;
            let _ = judge(&dump);
        }
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;
    use crate::dump::model::GpuProcesses;
    use crate::facts::gpu_processes::GpuProcess;

    fn untracked_fixture() -> Dump {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/oom_untracked.json");
        crate::dump::read::parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
    }

    fn with_processes(processes: Vec<GpuProcess>, error: Option<&str>) -> Dump {
        let mut d = untracked_fixture();
        let device = d.failed_request.as_ref().unwrap().device;
        d.gpu_processes = Some(GpuProcesses {
            device,
            matched_by: "index".into(),
            processes,
            error: error.map(str::to_string),
        });
        d
    }

    fn used_untracked(d: &Dump) -> u64 {
        let failing = d.failed_request.as_ref().unwrap().device;
        let dev = d.devices.iter().find(|x| x.index == failing).unwrap();
        dev.total_bytes.unwrap() - dev.free_bytes.unwrap() - dev.tracked_bytes
    }

    #[test]
    fn another_users_process_holding_the_untracked_memory_is_named() {
        let base = untracked_fixture();
        let other = GpuProcess {
            pid: 4242,
            name: Some("python".into()),
            used_bytes: Some(used_untracked(&base) * 9 / 10),
            relation: Relation::OtherUser,
        };
        let me = GpuProcess {
            pid: base.process.pid,
            name: None,
            used_bytes: Some(1 << 30),
            relation: Relation::This,
        };
        let v = judge(&with_processes(vec![other, me], None));
        assert_eq!(v.kind, OTHER_PROCESSES, "{v:?}");
        assert!(
            v.summary.contains("process 4242 (python, another user's)"),
            "{}",
            v.summary
        );
        assert!(
            v.evidence
                .iter()
                .any(|e| e.starts_with("process 4242 (python, another user's) holds")),
            "{:?}",
            v.evidence
        );
        assert!(
            v.suggestions
                .iter()
                .any(|s| s.contains("don't try to kill it")),
            "{:?}",
            v.suggestions
        );
        assert!(!v.suggestions.iter().any(|s| s.contains("end it yourself")));
    }

    #[test]
    fn a_child_process_gets_advice_about_workers() {
        let base = untracked_fixture();
        let child = GpuProcess {
            pid: 77,
            name: Some("pt_data_worker".into()),
            used_bytes: Some(used_untracked(&base)),
            relation: Relation::Child,
        };
        let v = judge(&with_processes(vec![child], None));
        assert_eq!(v.kind, OTHER_PROCESSES);
        assert!(
            v.suggestions
                .iter()
                .any(|s| s.contains("child of this process")),
            "{:?}",
            v.suggestions
        );
    }

    #[test]
    fn small_other_processes_or_no_nvml_leave_it_untracked() {
        let base = untracked_fixture();
        let small = GpuProcess {
            pid: 5,
            name: None,
            used_bytes: Some(used_untracked(&base) / 10),
            relation: Relation::SameUser,
        };
        assert_eq!(
            judge(&with_processes(vec![small], None)).kind,
            UNTRACKED_MEMORY
        );
        let v = judge(&with_processes(
            vec![],
            Some("NVML is not available (library not found)"),
        ));
        assert_eq!(v.kind, UNTRACKED_MEMORY);
        assert!(v.evidence.iter().any(
            |e| e.contains("other processes on device") && e.contains("NVML is not available")
        ));
    }
}

#[cfg(test)]
mod growth_tests {
    use super::tests::oom_dump;
    use super::*;
    use crate::dump::model::*;
    use crate::facts::host::HostMemory;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn growth_site(name: &str, per_step: u64, steps: u64) -> GrowthSite {
        GrowthSite {
            bytes_per_step: per_step,
            r_squared: 1.0,
            samples: steps,
            first: GrowthPoint { step: 1, bytes: 0 },
            last: GrowthPoint {
                step: steps,
                bytes: per_step * (steps - 1),
            },
            projected_oom_step: Some(steps + 2),
            stack: vec![Frame {
                address: "0x1".into(),
                function: Some(name.into()),
                file: Some("train.py".into()),
                line: Some(12),
                ..Frame::default()
            }],
        }
    }

    fn with_growth(unit: &str, sites: Vec<GrowthSite>) -> Dump {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        let rate: u64 = sites.iter().map(|s| s.bytes_per_step).sum();
        d.growth = Some(Growth {
            unit: unit.into(),
            samples: 10,
            current: 10,
            free_bytes: Some(GIB),
            projected_oom_step: Some(12),
            tracked: (1..=10)
                .map(|i| GrowthPoint {
                    step: i,
                    bytes: i * rate,
                })
                .collect(),
            sites,
        });
        d
    }

    #[test]
    fn leak_thresholds_table() {
        // (name, dump, kind)
        let cases: Vec<(&str, Dump, &str)> = vec![
            (
                "one site grows 96 MiB a step",
                with_growth("step", vec![growth_site("keep_activations", 96 * MIB, 10)]),
                LEAK,
            ),
            (
                "exactly the threshold",
                with_growth(
                    "step",
                    vec![growth_site("keep", LEAK_MIN_BYTES_PER_STEP, 10)],
                ),
                LEAK,
            ),
            (
                "below the threshold",
                with_growth(
                    "step",
                    vec![growth_site("keep", LEAK_MIN_BYTES_PER_STEP - 1, 10)],
                ),
                OWN_ALLOCATIONS,
            ),
            (
                "growth per second is not a step leak",
                with_growth("second", vec![growth_site("keep", 96 * MIB, 10)]),
                OWN_ALLOCATIONS,
            ),
            (
                "the largest of two equal sites carries only half: still a leak at 50%",
                with_growth(
                    "step",
                    vec![
                        growth_site("a", 10 * MIB, 10),
                        growth_site("b", 10 * MIB, 10),
                    ],
                ),
                LEAK,
            ),
            (
                "three equal growing sites: none is the leak",
                with_growth(
                    "step",
                    vec![
                        growth_site("a", 10 * MIB, 10),
                        growth_site("b", 10 * MIB, 10),
                        growth_site("c", 10 * MIB, 10),
                    ],
                ),
                OWN_ALLOCATIONS,
            ),
            (
                "no growth key",
                oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB),
                OWN_ALLOCATIONS,
            ),
        ];
        for (name, dump, kind) in cases {
            let v = judge(&dump);
            assert_eq!(v.kind, kind, "{name}: {}", v.summary);
        }
        // A request larger than the device still wins over a leak.
        let mut d = with_growth("step", vec![growth_site("keep", 96 * MIB, 10)]);
        d.failed_request.as_mut().unwrap().bytes = 100 * GIB;
        assert_eq!(judge(&d).kind, REQUEST_EXCEEDS_DEVICE);
    }

    #[test]
    fn leak_verdict_names_site_rate_and_projection() {
        let v = judge(&with_growth(
            "step",
            vec![
                growth_site("keep_activations", 96 * MIB, 10),
                growth_site("small", 2 * MIB, 10),
            ],
        ));
        assert_eq!(v.kind, LEAK);
        for needle in [
            "keep_activations (train.py:12)",
            "96.00 MiB every step",
            "10 steps observed",
            "runs out at step 12",
        ] {
            assert!(v.summary.contains(needle), "{needle}: {}", v.summary);
        }
        assert!(v.evidence.iter().any(
            |e| e.starts_with("growth: keep_activations (train.py:12) adds 96.00 MiB per step")
        ));
        let s = v.suggestions.join("\n");
        for needle in ["loss.item()", "detach().cpu()", "append"] {
            assert!(s.contains(needle), "{needle}: {s}");
        }
    }

    #[test]
    fn fragmentation_suggestion_respects_alloc_conf() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        d.free_blocks = FreeBlocks {
            source: "torch-snapshot".into(),
            reason: None,
            total_free_bytes: Some(8 * GIB),
            largest_free_bytes: Some(GIB),
            fragmentation: Some(0.875),
            histogram: vec![],
        };
        let v = judge(&d);
        assert_eq!(v.kind, FRAGMENTATION);
        assert!(v
            .suggestions
            .iter()
            .any(|s| s.contains("expandable_segments:True")));
        let mut conf = ConfigSnapshot::default();
        conf.env.insert(
            "PYTORCH_CUDA_ALLOC_CONF".into(),
            "max_split_size_mb:128, expandable_segments: True".into(),
        );
        d.config = Some(conf);
        let v = judge(&d);
        assert_eq!(v.kind, FRAGMENTATION);
        assert!(
            !v.suggestions
                .iter()
                .any(|s| s.contains("expandable_segments")),
            "{:?}",
            v.suggestions
        );
        assert!(v
            .evidence
            .iter()
            .any(|e| e.contains("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128")));
    }

    #[test]
    fn host_memory_table() {
        let host = |total, avail, limit, usage| HostMemory {
            total_bytes: total,
            available_bytes: avail,
            cgroup_limit_bytes: limit,
            cgroup_usage_bytes: usage,
            rss_bytes: None,
        };
        // (host, low?)
        let cases = [
            (host(Some(100 * GIB), Some(4 * GIB), None, None), true),
            (host(Some(100 * GIB), Some(5 * GIB), None, None), false),
            (
                host(
                    Some(100 * GIB),
                    Some(50 * GIB),
                    Some(10 * GIB),
                    Some(9_500 * MIB),
                ),
                false,
            ),
            (
                host(
                    Some(100 * GIB),
                    Some(50 * GIB),
                    Some(10 * GIB),
                    Some(9_800 * MIB),
                ),
                true,
            ),
            (host(None, None, None, None), false),
        ];
        for (h, low) in cases {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
            d.host = Some(h.clone());
            let v = judge(&d);
            assert_eq!(
                v.kind, OWN_ALLOCATIONS,
                "a device verdict is not overridden"
            );
            assert_eq!(
                v.evidence
                    .iter()
                    .any(|e| e.starts_with("host memory is low")),
                low,
                "{h:?}"
            );
            assert_eq!(
                v.suggestions
                    .iter()
                    .any(|s| s.contains("DataLoader workers")),
                low
            );
        }
        let mut d = oom_dump(GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.failed_request.as_mut().unwrap().api = "cudaMallocHost".into();
        assert_eq!(judge(&d).kind, HOST_MEMORY);
    }
}
