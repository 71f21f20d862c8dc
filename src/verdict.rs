//! Findings from a dump: whose memory filled the device, in plain words, with the numbers that
//! show it, and what to change. Pure functions of the dump; table-tested.
//!
//! An out-of-memory dump (one with a `failed_request`) gets every finding that holds, ranked by
//! the bytes each explains (ties in the order below); the verdict's `kind`, `summary` and
//! `suggestions` are the top finding's (the suggestions of the others follow, without repeats):
//! - [`REQUEST_EXCEEDS_DEVICE`] (bytes: the request): the request alone is larger than the
//!   device's total memory. Nothing else is judged then: no freeing makes it fit.
//! - [`OTHER_PROCESSES`] (bytes: what they hold): processes other than this one that NVML lists
//!   on the device hold at least [`OTHER_PROCESSES_MIN_SHARE`] of its memory.
//! - [`LEAK`] (bytes: what the process grew by over the fitted steps, up to the failure): the
//!   process's tracked bytes grow with the steps (marked by the program, by the Python hook's
//!   optimizer and forward-pass marks, or detected): at least [`LEAK_MIN_BYTES_PER_STEP`] a step,
//!   R² ≥ 0.9 over at least 4 steps ending at the newest sample, and still that high at the
//!   failure. The growth is then *named* by site (the program's own line), each with its share.
//!   Detected steps count only when at least [`DETECTED_MIN_FREEING_SHARE`] of the sampled
//!   intervals freed memory (a loop that only allocates, like loading weights, repeats too).
//! - [`FRAGMENTATION`] (bytes: free in the cache): a free-block source (torch's snapshot or
//!   oomshim's allocator) shows at least the request free in total, and at least
//!   [`FRAGMENTATION_MIN_RESERVED_SHARE`] of what the cache reserves, but no block that large.
//!   Many distinct large request sizes ([`DYNAMIC_MIN_DISTINCT_LARGE`]) name dynamic shapes as
//!   the cause, with bucketing as the fix.
//! - [`FRAMEWORK_CACHE`] (bytes: reserved but unallocated): not fragmented, and the cache's
//!   releasable free bytes are at least [`FRAMEWORK_CACHE_MIN_REQUEST_SHARE`] of the request
//!   and, with the device's free bytes, enough for it.
//! - [`UNTRACKED_MEMORY`] (bytes: untracked less what other processes explain): less than
//!   [`UNTRACKED_MIN_SHARE`] of the memory in use is this process's tracked allocations (or,
//!   without device numbers, it tracked nothing), and other processes explain less than that
//!   share of the rest.
//! - [`OWN_ALLOCATIONS`] (bytes: tracked): the residual account, when this process's tracked
//!   allocations are most of the memory in use and no more specific account of them (leak,
//!   fragmentation, framework cache) holds.
//! - [`HOST_MEMORY`]: the only finding when the failed request was for page-locked host memory;
//!   otherwise low host memory (below [`HOST_MIN_AVAILABLE_SHARE`] available, or a cgroup at
//!   [`CGROUP_MAX_USAGE_SHARE`] of its limit) is a finding with this process's pinned bytes.
//!
//! A dump without a failed request gets [`SNAPSHOT`]; a post-mortem dump (`oomshim run` rebuilt
//! it after its program died) is judged by [`judge_post_mortem`] (src/verdict/post_mortem.rs).

use crate::dump::model::{
    DetectedSteps, DeviceInfo, Dump, FailedRequest, Finding, Frame, Growth, GrowthFit, GrowthSite,
    Site, Verdict,
};
use crate::dump::units::{bytes_with_exact, clean, human_bytes, percent, share, thousands};
use crate::dump::view::{
    frame_label, free_blocks_available, named_frames, sorted_sites, used_bytes,
};
use crate::facts::gpu_processes::{GpuProcess, Relation};

pub const REQUEST_EXCEEDS_DEVICE: &str = "request_exceeds_device";
pub const FRAGMENTATION: &str = "fragmentation";
pub const FRAMEWORK_CACHE: &str = "framework_cache";
pub const OTHER_PROCESSES: &str = "other_processes";
pub const UNTRACKED_MEMORY: &str = "untracked_memory";
pub const OWN_ALLOCATIONS: &str = "own_allocations";
pub const LEAK: &str = "leak";
pub const HOST_MEMORY: &str = "host_memory";
pub const SNAPSHOT: &str = "snapshot";

mod post_mortem;
pub use post_mortem::{
    host_growth, judge_post_mortem, EXITED_AFTER_FAILURE, HOST_GROWTH_MIN_BYTES, HOST_OOM_KILL,
    KILLED_BY_SIGNAL,
};

/// Smallest growth per step of the process for [`LEAK`]: below it, growth is noise (counters,
/// small caches), not what fills a device.
pub const LEAK_MIN_BYTES_PER_STEP: u64 = 1 << 20;
/// A site carrying at least this share of the growth is named as *the* leak in the headline;
/// below it the headline names the process's growth and its largest parts.
pub const LEAK_NAMED_SHARE: f64 = 0.5;
/// Sites named with their share in a leak's summary.
const LEAK_SITES_NAMED: usize = 3;
/// Smallest free share of what the framework's cache reserves for [`FRAGMENTATION`]: when less
/// than a tenth of the cache is free, even a perfectly compacted cache would be full again within
/// a step or two; the cache ran out (a leak, or a working set too large), it did not fragment.
pub const FRAGMENTATION_MIN_RESERVED_SHARE: f64 = 0.1;
/// Smallest share of sampled intervals that freed memory for detected steps to support a
/// [`LEAK`]: a training step frees its working memory; a loop that only allocates (loading
/// weights layer by layer) also repeats, and its growth is no leak.
pub const DETECTED_MIN_FREEING_SHARE: f64 = 0.5;
/// Smallest share of the device's memory that other processes must hold for
/// [`OTHER_PROCESSES`]: display servers and monitoring agents hold a few hundred MiB, which
/// does not change what fits.
pub const OTHER_PROCESSES_MIN_SHARE: f64 = 0.05;
/// Below this share of the memory in use, this process's tracked allocations are not what
/// fills the device ([`UNTRACKED_MEMORY`]); at or above it they are ([`OWN_ALLOCATIONS`]).
pub const UNTRACKED_MIN_SHARE: f64 = 0.5;
/// Smallest releasable cache, as a share of the request, for [`FRAMEWORK_CACHE`]: a cache that
/// holds half the request or more is a real part of the missing room, not crumbs.
pub const FRAMEWORK_CACHE_MIN_REQUEST_SHARE: f64 = 0.5;
/// Distinct large request sizes (see `request_sizes`) from which shapes count as dynamic: a
/// steady training loop repeats a handful of sizes; variable-length batches make dozens.
pub const DYNAMIC_MIN_DISTINCT_LARGE: u64 = 16;
/// ... and the share of large requests with a size of their own: a long steady run repeats its
/// sizes many times (a low share), even when it has many tensors of different sizes.
pub const DYNAMIC_MIN_DISTINCT_SHARE: f64 = 0.25;
/// Host memory is low when `MemAvailable` is below this share of `MemTotal`.
pub const HOST_MIN_AVAILABLE_SHARE: f64 = 0.05;
/// ... or when the cgroup's usage is at least this share of its limit.
pub const CGROUP_MAX_USAGE_SHARE: f64 = 0.95;

/// Longest function name quoted in a verdict.
const MAX_FUNCTION: usize = 100;

/// Judges a dump. Uses everything in it except its own `verdict` field. Deterministic.
pub fn judge(dump: &Dump) -> Verdict {
    if dump.post_mortem.is_some() {
        return judge_post_mortem(dump); // how the program died comes first (issue 15)
    }
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
    let label = if site.stack.is_empty() && dump.recording.python.is_some() {
        // A Python process records a tensor's Python stack only: none means a thread without
        // Python frames allocated it.
        NO_PYTHON_FRAMES.to_string()
    } else {
        site_label(&site.stack)
    };
    Some(TopSite { site, label })
}

/// What allocations without Python frames in a Python process are.
const NO_PYTHON_FRAMES: &str =
    "allocations without Python frames (autograd's backward threads, C++ code)";

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

/// The process's growth per step, when it is a leak (see [`LEAK`]).
struct LeakFinding<'a> {
    growth: &'a Growth,
    fit: GrowthFit,
    /// Its largest parts, largest first, each with its share (0–1).
    sites: Vec<(&'a GrowthSite, f64)>,
    /// What a step is, as counted words (`marked steps`, `optimizer steps`, `forward passes`).
    steps_word: &'static str,
    /// Set when the steps were detected, not marked.
    detected: Option<DetectedSteps>,
    /// Bytes grown from the first fitted sample to the failure.
    grown: u64,
}

/// How the growth's steps are called in sentences.
fn steps_word(steps: Option<&str>) -> &'static str {
    match steps {
        Some("optimizer") => "optimizer steps",
        Some("forward") => "forward passes",
        Some("detected") => "detected steps",
        _ => "marked steps",
    }
}

/// Tracked bytes of every device at the capture (what the growth samples sum).
fn tracked_all(dump: &Dump) -> u64 {
    dump.devices
        .iter()
        .map(|d| d.tracked_bytes)
        .fold(0, u64::saturating_add)
}

/// The process's fitted growth: the dump's own, or (dumps of older versions) fitted from its
/// tracked samples.
fn growth_fit(g: &Growth) -> Option<GrowthFit> {
    if let Some(f) = &g.fit {
        return Some(f.clone());
    }
    let points: Vec<(u64, u64)> = g.tracked.iter().map(|p| (p.step, p.bytes)).collect();
    let (f, start) = crate::dump::fit::growing_suffix(&points)?;
    Some(GrowthFit {
        bytes_per_step: f.slope.round() as u64,
        r_squared: f.r2,
        samples: f.n as u64,
        first: g.tracked[start].clone(),
        last: g.tracked.last()?.clone(),
        of: Some("tracked".to_string()),
        live_allocations: None,
    })
}

/// True unless the fit's live allocations are known not to have accumulated: a leak keeps
/// allocations (at least one every other step); memory that grows while as many allocations
/// are live as before grew because the allocations got larger (inputs of growing shape).
fn accumulated(fit: &GrowthFit) -> bool {
    match fit.live_allocations {
        Some(c) => {
            c.last
                >= c.first
                    .saturating_add((fit.samples.saturating_sub(1) / 2).max(1))
        }
        None => true,
    }
}

/// The process's steady growth when it is no leak because nothing accumulated: the same
/// number of allocations, larger each step.
fn growing_shapes(dump: &Dump) -> Option<(GrowthFit, &'static str)> {
    let g = dump.growth.as_ref().filter(|g| g.unit == "step")?;
    let fit = growth_fit(g)?;
    (fit.bytes_per_step >= LEAK_MIN_BYTES_PER_STEP
        && fit.samples >= crate::dump::fit::MIN_SAMPLES as u64
        && fit.live_allocations.is_some()
        && !accumulated(&fit))
    .then(|| (fit, steps_word(g.steps.as_deref())))
}

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

fn leak_finding(dump: &Dump) -> Option<LeakFinding<'_>> {
    let g = dump.growth.as_ref().filter(|g| g.unit == "step")?;
    let steps = g.steps.as_deref();
    let detected = match steps {
        Some("time") => return None,
        Some("detected") => {
            let d = g.detected.as_ref()?;
            if d.intervals == 0
                || (d.freeing_intervals as f64) < DETECTED_MIN_FREEING_SHARE * d.intervals as f64
            {
                return None;
            }
            Some(d.clone())
        }
        _ => None,
    };
    let fit = growth_fit(g)?;
    if fit.bytes_per_step < LEAK_MIN_BYTES_PER_STEP
        || fit.samples < crate::dump::fit::MIN_SAMPLES as u64
        || !accumulated(&fit)
    {
        return None;
    }
    // Still held at the failure: what is live then has not fallen back below the last sample by
    // more than half of what the fit grew (a phase that freed its memory is no leak now). A
    // couple of steps' worth is always allowed: the failure comes mid-step, after some of the
    // step's memory was freed, and a framework's word arrives after its own cleanup. The
    // framework's live tensors are compared with its own count at the failure.
    let now = match fit.of.as_deref() {
        Some("framework_live") => dump.free_blocks.allocated_bytes.unwrap_or(fit.last.bytes),
        _ => tracked_all(dump),
    };
    let fit_grew = fit.last.bytes.saturating_sub(fit.first.bytes);
    let may_fall = (fit_grew / 2).max(fit.bytes_per_step.saturating_mul(2));
    if now.saturating_add(may_fall) < fit.last.bytes {
        return None;
    }
    let mut sites: Vec<(&GrowthSite, f64)> = g
        .sites
        .iter()
        .map(|s| {
            let share = s
                .share
                .unwrap_or(s.bytes_per_step as f64 / fit.bytes_per_step.max(1) as f64);
            (s, share.clamp(0.0, 1.0))
        })
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.0.bytes_per_step));
    // Grown over the fitted samples, plus what the step in progress added (at most a step's
    // worth: more than that was not this growth).
    let grown = fit
        .last
        .bytes
        .saturating_sub(fit.first.bytes)
        .saturating_add(now.saturating_sub(fit.last.bytes).min(fit.bytes_per_step));
    Some(LeakFinding {
        growth: g,
        fit,
        sites,
        steps_word: steps_word(steps),
        detected,
        grown,
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

const HOST_SUGGESTION: &str = "Host memory is nearly exhausted (a CPU-side out-of-memory kill may follow): use fewer \
     DataLoader workers, fewer or smaller pinned buffers (`pin_memory`, `cudaMallocHost`), and don't keep results on the \
     host across steps.";

fn is_pinned_api(api: &str) -> bool {
    matches!(
        api,
        "cudaMallocHost" | "cudaHostAlloc" | "cuMemAllocHost" | "cuMemHostAlloc"
    )
}

/// The growth in a few lines: how steps were found, the process's fit, the growing sites (at
/// most 3), from the dump's `growth`.
fn growth_evidence(dump: &Dump, evidence: &mut Vec<String>) {
    let Some(g) = &dump.growth else { return };
    if let (Some("detected"), Some(d)) = (g.steps.as_deref(), &g.detected) {
        evidence.push(format!(
            "steps detected automatically (no step marks): a cycle of {} allocations, anchored at {}; {} steps",
            thousands(d.period),
            short_label(&d.anchor),
            thousands(d.steps)
        ));
    }
    let unit = clean(&g.unit);
    if let Some(f) = growth_fit(g) {
        evidence.push(format!(
            "growth of the process: {} per {unit} (R² {:.2} over {} samples, {} at {unit} {} to {} at {unit} {})",
            human_bytes(f.bytes_per_step),
            f.r_squared,
            f.samples,
            human_bytes(f.first.bytes),
            f.first.step,
            human_bytes(f.last.bytes),
            f.last.step,
        ));
    }
    for site in g.sites.iter().take(3) {
        let projected = site
            .projected_oom_step
            .map(|p| format!("; free memory runs out at {unit} {p} at this rate"))
            .unwrap_or_default();
        let share = site
            .share
            .map(|s| format!(", {} of the growth", percent(Some(s * 100.0))))
            .unwrap_or_default();
        evidence.push(format!(
            "growth: {} adds {} per {unit} (R² {:.2} over {} samples{share}, {} at {unit} {} to {} at {unit} {}){projected}",
            site_name(site),
            human_bytes(site.bytes_per_step),
            site.r_squared,
            site.samples,
            human_bytes(site.first.bytes),
            site.first.step,
            human_bytes(site.last.bytes),
            site.last.step,
        ));
    }
}

/// Everything the findings of one out-of-memory dump are computed from.
struct Ctx<'a> {
    dump: &'a Dump,
    request: &'a FailedRequest,
    n: DeviceNumbers,
    used: Option<u64>,
    tracked: u64,
    top: Option<TopSite<'a>>,
    req: String,
    dev: i32,
    others: Vec<&'a GpuProcess>,
    others_bytes: u64,
}

impl Ctx<'_> {
    /// The largest site, as a sentence for a summary.
    fn top_text(&self, used: Option<u64>) -> String {
        match &self.top {
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
    }

    /// ` at function (file:line)` of the failing call, the file's base name only (headlines).
    fn failing_at_short(&self) -> String {
        named_frames(&self.request.stack)
            .next()
            .filter(|f| !crate::dump::view::is_cuda_api_frame(f))
            .map(|_| format!(" at {}", short_label(&self.request.stack)))
            .unwrap_or_default()
    }

    fn failing_at(&self) -> String {
        named_frames(&self.request.stack)
            .next()
            .map(|f| format!(" at {}", frame_label(f, MAX_FUNCTION)))
            .unwrap_or_default()
    }
}

/// The free blocks of the framework's cache, when a source shows them.
struct Cache {
    source: String,
    total_free: u64,
    largest: u64,
    /// Free bytes `empty_cache` can return: total free less the inactive split bytes (free
    /// blocks in segments that also hold a live block), when the source knows them.
    releasable: u64,
    inactive_split: Option<u64>,
    /// What the cache reserves from the device, when the source knows.
    reserved: Option<u64>,
}

fn cache(dump: &Dump) -> Option<Cache> {
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

/// Many distinct large request sizes in the recent history: dynamic shapes (see
/// [`DYNAMIC_MIN_DISTINCT_LARGE`]). Returns (distinct large sizes, large requests, window).
fn dynamic_shapes(dump: &Dump) -> Option<(u64, u64, u64)> {
    let r = dump.request_sizes.as_ref()?;
    (r.distinct_large >= DYNAMIC_MIN_DISTINCT_LARGE
        && r.large > 0
        && r.distinct_large as f64 >= DYNAMIC_MIN_DISTINCT_SHARE * r.large as f64)
        .then_some((r.distinct_large, r.large, r.window))
}

fn dynamic_shapes_evidence(dump: &Dump) -> Option<String> {
    let (distinct, large, window) = dynamic_shapes(dump)?;
    let large_bytes = dump
        .request_sizes
        .as_ref()
        .map_or(1 << 20, |r| r.large_bytes);
    Some(format!(
        "dynamic shapes: {} distinct sizes among the {} requests of at least {} in the last {} requests",
        thousands(distinct),
        thousands(large),
        human_bytes(large_bytes),
        thousands(window)
    ))
}

const GROWING_SHAPES: &str = "The memory a step needs grows with its inputs: find the largest input the program will see \
     (the longest sequence, the largest batch or image) and cap it, split it, or lower the batch size so that one fits.";

const BUCKETING: &str = "Pad or bucket variable-length inputs to a few fixed shapes (sequence lengths, image sizes, batch sizes), so freed blocks are reused instead of split into ever new sizes.";

/// The order among findings that explain equal bytes.
fn priority(kind: &str) -> usize {
    [
        REQUEST_EXCEEDS_DEVICE,
        OTHER_PROCESSES,
        LEAK,
        FRAGMENTATION,
        FRAMEWORK_CACHE,
        UNTRACKED_MEMORY,
        OWN_ALLOCATIONS,
        HOST_MEMORY,
    ]
    .iter()
    .position(|k| *k == kind)
    .unwrap_or(usize::MAX)
}

/// Findings ranked by bytes explained (largest first), ties by [`priority`].
pub fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(priority(&a.kind).cmp(&priority(&b.kind)))
    });
}

fn finding(kind: &str, bytes: u64, headline: String, summary: String) -> Finding {
    Finding {
        kind: kind.to_string(),
        bytes,
        headline,
        summary,
        evidence: Vec::new(),
        suggestions: Vec::new(),
    }
}

/// The innermost named frame with its file's base name: `forward (model.py:42)` (one-liners).
pub fn short_label(stack: &[Frame]) -> String {
    match named_frames(stack).next() {
        Some(frame) => {
            let mut f = frame.clone();
            if let Some(file) = &f.file {
                f.file = Some(file.rsplit('/').next().unwrap_or(file).to_string());
            }
            frame_label(&f, 60)
        }
        None => site_label(stack),
    }
}

fn judge_oom(dump: &Dump, request: &FailedRequest) -> Verdict {
    let n = DeviceNumbers::of(dump, request);
    let used = n.used();
    let tracked = n.tracked.unwrap_or(0);
    let dev = n.index;
    let others = other_processes(dump, dev);
    let others_bytes: u64 = others.iter().filter_map(|p| p.used_bytes).sum();
    let c = Ctx {
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
    };
    let evidence = general_evidence(&c);
    let host_low = host_pressure(dump);

    let mut findings = Vec::new();
    if is_pinned_api(&request.api) {
        findings.push(host_memory_failure(&c));
    } else if c.n.total.is_some_and(|total| request.bytes > total) {
        findings.push(request_exceeds_device(&c));
    } else {
        let cache = cache(dump);
        let fragmented = cache.as_ref().is_some_and(|k| {
            k.total_free >= request.bytes
                && k.largest < request.bytes
                && k.reserved.is_none_or(|r| {
                    k.total_free as f64 >= FRAGMENTATION_MIN_RESERVED_SHARE * r as f64
                })
        });
        if fragmented {
            findings.push(fragmentation(&c, cache.as_ref().expect("fragmented")));
        } else if let Some(k) = cache.as_ref().filter(|k| framework_cache_holds(&c, k)) {
            findings.push(framework_cache(&c, k));
        }
        let others_threshold = c.n.total.or(used).map_or(1, |t| {
            (OTHER_PROCESSES_MIN_SHARE * t as f64).ceil().max(1.0) as u64
        });
        let others_found = !c.others.is_empty() && others_bytes >= others_threshold;
        if others_found {
            findings.push(other_processes_finding(&c));
        }
        // Less than half of the memory in use is this process's tracked allocations.
        let mostly_untracked = match used {
            Some(used) => used > 0 && (tracked as f64) < UNTRACKED_MIN_SHARE * used as f64,
            None => tracked == 0,
        };
        let untracked = used.map_or(0, |u| u.saturating_sub(tracked));
        let unexplained = untracked.saturating_sub(others_bytes);
        // ... and other processes do not explain most of the rest (when they are a finding).
        let explained_by_others = others_found
            && used.is_some()
            && unexplained as f64 <= UNTRACKED_MIN_SHARE * untracked as f64;
        if mostly_untracked && !explained_by_others {
            findings.push(untracked_memory(&c, unexplained));
        }
        let leak = leak_finding(dump);
        if let Some(l) = &leak {
            findings.push(leak_found(&c, l));
        }
        let specific =
            leak.is_some() || fragmented || findings.iter().any(|f| f.kind == FRAMEWORK_CACHE);
        if (!mostly_untracked && !specific) || findings.is_empty() {
            findings.push(own_allocations(&c, cache.as_ref()));
        }
    }
    if let Some(text) = &host_low {
        if !findings.iter().any(|f| f.kind == HOST_MEMORY) {
            let mut f = finding(
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
            findings.push(f);
        }
    }
    rank(&mut findings);

    let top = &findings[0];
    let judged = top.summary.clone();
    let summary = match request.recovered {
        Some(true) => format!(
            "This failure was recovered by a retry: a later request of at least {} on device {dev} succeeded, so the program \
             did not see this error. {judged}",
            c.req
        ),
        Some(false) => format!("{judged} The retry did not succeed: the program saw this out-of-memory error."),
        None => judged,
    };
    let mut suggestions: Vec<String> = Vec::new();
    for f in &findings {
        for s in &f.suggestions {
            if !suggestions.contains(s) {
                suggestions.push(s.clone());
            }
        }
    }
    Verdict {
        kind: top.kind.clone(),
        summary,
        evidence,
        suggestions,
        findings,
    }
}

/// The dump's numbers that every finding rests on.
fn general_evidence(c: &Ctx) -> Vec<String> {
    let (dump, request, n, dev, used, tracked) =
        (c.dump, c.request, &c.n, c.dev, c.used, c.tracked);
    let fb = &dump.free_blocks;
    let req = &c.req;
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
    if let Some(top) = &c.top {
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
    if let Some(text) = host_pressure(dump) {
        evidence.push(text);
    }
    if let Some(conf) = alloc_conf(dump) {
        evidence.push(format!("PYTORCH_CUDA_ALLOC_CONF={}", clean(conf)));
    }
    let devices_holding = dump.devices.iter().filter(|d| d.tracked_bytes > 0).count();
    if devices_holding > 1 && c.top.is_some() {
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
        if let (Some(reserved), Some(allocated)) = (fb.reserved_bytes, fb.allocated_bytes) {
            evidence.push(format!(
                "framework cache: {} reserved, {} allocated, {} reserved but unallocated{}",
                human_bytes(reserved),
                human_bytes(allocated),
                human_bytes(reserved.saturating_sub(allocated)),
                fb.inactive_split_bytes
                    .map(|b| format!(" ({} inactive split)", human_bytes(b)))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(text) = dynamic_shapes_evidence(dump) {
        evidence.push(text);
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
    match dump.gpu_processes.as_ref().filter(|g| g.device == dev) {
        Some(g) if g.error.is_some() => evidence.push(format!(
            "other processes on device {dev}: unknown ({})",
            clean(g.error.as_deref().unwrap_or(""))
        )),
        Some(g) => {
            for p in g.processes.iter().take(5) {
                evidence.push(process_line(p, dev));
            }
        }
        None => {}
    }
    evidence
}

fn process_line(p: &GpuProcess, dev: i32) -> String {
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

fn host_memory_failure(c: &Ctx) -> Finding {
    let mut f = finding(
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
    if let Some(text) = host_pressure(c.dump) {
        f.evidence.push(text);
    }
    f.suggestions.push(HOST_SUGGESTION.to_string());
    f
}

fn request_exceeds_device(c: &Ctx) -> Finding {
    let total = c.n.total.unwrap_or(0);
    let (req, dev) = (&c.req, c.dev);
    let failing_at = c.failing_at();
    let mut f = finding(
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

fn fragmentation(c: &Ctx, k: &Cache) -> Finding {
    let dump = c.dump;
    let req = &c.req;
    let dynamic = dynamic_shapes_evidence(dump);
    let cause = if dynamic.is_some() {
        " Many distinct large request sizes point to dynamic shapes as the cause: each new size splits cached blocks \
         differently."
    } else {
        ""
    };
    let mut f = finding(
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
    if !expandable_segments_on(dump) {
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

/// The framework's cache holds enough reserved-but-unallocated memory that releasing it would
/// make room (see [`FRAMEWORK_CACHE_MIN_REQUEST_SHARE`]).
fn framework_cache_holds(c: &Ctx, k: &Cache) -> bool {
    let request = c.request.bytes;
    k.releasable > 0
        && k.releasable as f64 >= FRAMEWORK_CACHE_MIN_REQUEST_SHARE * request as f64
        && c.n
            .free
            .is_none_or(|free| k.releasable.saturating_add(free) >= request)
}

fn framework_cache(c: &Ctx, k: &Cache) -> Finding {
    let req = &c.req;
    let free =
        c.n.free
            .map(|f| format!(" with the device's {} free", human_bytes(f)))
            .unwrap_or_default();
    let mut f = finding(
        FRAMEWORK_CACHE,
        k.total_free,
        format!(
            "the framework's cache holds {} reserved but unallocated ({} releasable){}, enough for the {req} request",
            human_bytes(k.total_free),
            human_bytes(k.releasable),
            free
        ),
        format!(
            "The framework's cache ({}) holds {} that it reserved from the device but did not hand out; {} of it is in \
             segments with no live block, which releasing the cache returns to the device: together{free} that is enough \
             for the {req} request. The memory is not fragmented (the request is larger than the cache's free total), it is \
             kept in reserve.{}",
            clean(&k.source),
            human_bytes(k.total_free),
            human_bytes(k.releasable),
            c.top_text(c.used)
        ),
    );
    f.evidence.push(format!(
        "reserved but unallocated: {}, releasable {}, largest free block {}",
        human_bytes(k.total_free),
        human_bytes(k.releasable),
        human_bytes(k.largest)
    ));
    f.suggestions.push(
        "Release the cache where memory peaks change (between training and evaluation, or before a large allocation): \
         `torch.cuda.empty_cache()`."
            .to_string(),
    );
    f.suggestions.push(
        "Let the cache give memory back by itself: `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8` (or a \
         smaller cache, `max_split_size_mb`)."
            .to_string(),
    );
    f
}

fn other_processes_finding(c: &Ctx) -> Finding {
    let dev = c.dev;
    let biggest = c
        .others
        .iter()
        .max_by_key(|p| p.used_bytes.unwrap_or(0))
        .expect("others is not empty");
    let name = |p: &GpuProcess| clean(p.name.as_deref().unwrap_or("name not visible"));
    let mut f = finding(
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

fn untracked_memory(c: &Ctx, unexplained: u64) -> Finding {
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
    let mut f = finding(UNTRACKED_MEMORY, unexplained, headline, summary);
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

/// `42% (12.00 MiB per step) at forward (model.py:9)`.
fn share_text(site: &GrowthSite, share: f64) -> String {
    format!(
        "{} ({} per step) at {}",
        percent(Some((share * 100.0).min(100.0))),
        human_bytes(site.bytes_per_step),
        site_name(site)
    )
}

/// A growth site's name: its frame, or what its allocations have in common.
fn site_name(site: &GrowthSite) -> String {
    match site.grouped_by.as_deref() {
        Some("no_python") => NO_PYTHON_FRAMES.to_string(),
        _ => short_label(&site.stack),
    }
}

fn leak_found(c: &Ctx, l: &LeakFinding) -> Finding {
    let g = l.growth;
    let fw = framework(c.dump);
    let rate = human_bytes(l.fit.bytes_per_step);
    let n_steps = thousands(l.fit.samples);
    let projected = g.projected_oom_step;
    let top = l
        .sites
        .first()
        .filter(|(_, share)| *share >= LEAK_NAMED_SHARE);
    let parts: Vec<String> = l
        .sites
        .iter()
        .take(LEAK_SITES_NAMED)
        .map(|(s, share)| share_text(s, *share))
        .collect();
    // The step in progress at the failure: when the projection is later, a request larger than
    // one step's growth came first.
    let failing_step = g.current + 1;
    let runs_out = match projected {
        Some(p) if p > failing_step => format!(
            "; free memory would run out at step {p}, but the {} request failed earlier, in step {failing_step}",
            c.req
        ),
        Some(p) => format!("; free memory runs out at step {p}"),
        None => String::new(),
    };
    // Under preload oomshim sees torch's segments: when its sites name no line of the program
    // (new segments come from the backward pass), torch's own records of where the live tensors
    // were allocated, kept since the growth began, name the line.
    let recorded = c
        .dump
        .framework
        .as_ref()
        .and_then(|f| f.attribution.as_ref())
        .filter(|a| a.recorded_bytes > 0 && !a.lines.is_empty());
    let named_by_shim = top.is_some_and(|(s, _)| s.grouped_by.as_deref() != Some("no_python"));
    let headline = match (top, recorded) {
        (_, Some(a)) if !named_by_shim => {
            let line = &a.lines[0];
            format!(
                "{} holds the growth ({} of the tensors allocated since it began, by torch's records): the process grows by \
                 {rate} every step (over the last {n_steps} {}; {} so far){runs_out}",
                recorded_label(line),
                percent(share(line.bytes, a.recorded_bytes)),
                l.steps_word,
                human_bytes(l.grown),
            )
        }
        _ => match top {
        Some((site, share)) => format!(
            "{} grows by {} every step (over the last {n_steps} {}; {} so far, {} of the growth){runs_out}",
            site_name(site),
            human_bytes(site.bytes_per_step),
            l.steps_word,
            human_bytes(l.grown),
            percent(Some((share * 100.0).min(100.0))),
        ),
        None if !parts.is_empty() => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far), spread over sites: {}{runs_out}",
            l.steps_word,
            human_bytes(l.grown),
            parts.join(", ")
        ),
        None => format!(
            "the process grows by {rate} every step (over the last {n_steps} {}; {} so far){runs_out}",
            l.steps_word,
            human_bytes(l.grown)
        ),
        },
    };
    let records = recorded
        .map(|a| {
            let parts: Vec<String> = a
                .lines
                .iter()
                .take(LEAK_SITES_NAMED)
                .map(|line| {
                    format!(
                        "{} at {}",
                        percent(share(line.bytes, a.recorded_bytes)),
                        recorded_label(line)
                    )
                })
                .collect();
            format!(
                " torch's records of the {} of tensors allocated since the growth began put {}.",
                human_bytes(a.recorded_bytes),
                parts.join(", ")
            )
        })
        .unwrap_or_default();
    let how = match (&l.detected, g.steps.as_deref()) {
        (Some(d), _) => format!(
            " Steps were detected automatically (the program marks none): a cycle of {} allocations repeats, \
             anchored at {}; {} of {} sampled intervals freed working memory.",
            thousands(d.period),
            short_label(&d.anchor),
            thousands(d.freeing_intervals),
            thousands(d.intervals)
        ),
        (None, Some("optimizer")) => {
            " Steps are the program's optimizer steps (marked by oomshim's Python hook).".to_string()
        }
        (None, Some("forward")) => " Steps are forward passes of the program's outermost module (marked by \
             oomshim's Python hook): an evaluation or inference loop."
            .to_string(),
        _ => String::new(),
    };
    let named = if parts.is_empty() {
        " No single site carries the growth (it is spread over more sites than are kept)."
            .to_string()
    } else {
        format!(" The growth per step comes from: {}.", parts.join("; "))
    };
    let projection = match projected {
        Some(p) => {
            let next = g.current + 1;
            if p > next {
                format!(
                    " At that rate the device's free memory would run out at step {p}; the failure came earlier, at step \
                     {next}, because the failed request of {} is larger than what was still free.",
                    c.req
                )
            } else {
                format!(" At that rate the device's free memory runs out at step {p}.")
            }
        }
        None => String::new(),
    };
    let mut f = finding(
        LEAK,
        l.grown,
        headline,
        format!(
            "A leak: {} grows by {rate} every step ({n_steps} {} observed, from {} at step {} to \
             {} at step {}, R² {:.2}), and it was still that high when {} more was requested on device {}.{named}{records}{projection}{how}{}",
            if l.fit.of.as_deref() == Some("framework_live") {
                "the memory of torch's live tensors (its `memory_allocated()` at every step)"
            } else {
                "this process's tracked memory"
            },
            l.steps_word,
            human_bytes(l.fit.first.bytes),
            l.fit.first.step,
            human_bytes(l.fit.last.bytes),
            l.fit.last.step,
            l.fit.r_squared,
            c.req,
            c.dev,
            segment_note(c.dump),
        ),
    );
    f.evidence.push(format!(
        "growth of the process: {rate} per step (R² {:.2} over {} {}), {} from step {} to {}; {} tracked at the failure",
        l.fit.r_squared,
        n_steps,
        l.steps_word,
        human_bytes(l.fit.last.bytes.saturating_sub(l.fit.first.bytes)),
        l.fit.first.step,
        l.fit.last.step,
        human_bytes(tracked_all(c.dump))
    ));
    for (site, share) in l.sites.iter().take(LEAK_SITES_NAMED) {
        f.evidence.push(format!(
            "growth: {} ({} of it, R² {:.2}, {} at step {} to {} at step {})",
            share_text(site, *share),
            percent(Some((share * 100.0).min(100.0))),
            site.r_squared,
            human_bytes(site.first.bytes),
            site.first.step,
            human_bytes(site.last.bytes),
            site.last.step
        ));
    }
    if let Some(d) = &l.detected {
        f.evidence.push(format!(
            "steps: detected, not marked (a cycle of {} allocations; {} steps; {} allocations since the last)",
            thousands(d.period),
            thousands(d.steps),
            thousands(d.allocations_since_last_step)
        ));
    } else {
        f.evidence.push(format!(
            "steps: {}",
            match g.steps.as_deref() {
                Some("optimizer") =>
                    "optimizer steps (torch.optim), marked by oomshim's Python hook",
                Some("forward") =>
                    "forward passes of the outermost module, marked by oomshim's Python hook",
                _ => "marked by the program (oomshim_step)",
            }
        ));
    }
    let label = match (named_by_shim, recorded) {
        (false, Some(a)) => recorded_label(&a.lines[0]),
        _ => top
            .map(|(s, _)| site_name(s))
            .or_else(|| l.sites.first().map(|(s, _)| site_name(s)))
            .unwrap_or_else(|| "each step".to_string()),
    };
    f.suggestions.extend(leak_advice(fw, &label));
    if l.detected.is_some() {
        f.suggestions.push(match fw {
            Framework::Native => {
                "Mark steps with `oomshim_step()` (from `liboomshim.so`) to confirm the growth per step.".to_string()
            }
            _ => "Mark steps with `oomshim.step()` to confirm the growth per step.".to_string(),
        });
    }
    f
}

/// `function (file:line)` of a line from the framework's records, with the file's base name.
fn recorded_label(line: &crate::dump::model::AttributedLine) -> String {
    let file = line.file.rsplit('/').next().unwrap_or(&line.file);
    format!(
        "{} ({}:{})",
        clean(&crate::dump::units::truncate_function(&line.function, 60)),
        clean(file),
        line.line
    )
}

/// What to change for a leak, in the terms of the framework the program uses.
fn leak_advice(fw: Framework, label: &str) -> Vec<String> {
    match fw {
        Framework::Torch => vec![
            format!(
                "Find what {label} keeps from each step. The classic causes: accumulating a tensor that is still on the GPU \
                 and attached to the graph (`total_loss += loss` or `losses.append(loss)`: keep `loss.item()`), keeping \
                 outputs or activations for logging (keep `t.detach().cpu()`), `backward(retain_graph=True)` in a loop, \
                 and appending model outputs to a list across steps."
            ),
            "Run evaluation under `torch.inference_mode()` (or `torch.no_grad()`) so it keeps no graph.".to_string(),
        ],
        Framework::Jax => vec![format!(
            "Find what {label} keeps from each step: JAX arrays appended to a list or stored on an object across steps \
             stay on the device; keep `float(x)` or `jax.device_get(x)` instead, and don't close over per-step arrays."
        )],
        Framework::Cupy => vec![format!(
            "Find what {label} keeps from each step: CuPy arrays kept across iterations hold their blocks in CuPy's pool; \
             keep `x.get()` copies on the host, or `del` them (then `cupy.get_default_memory_pool().free_all_blocks()` \
             returns the cached blocks)."
        )],
        Framework::Python | Framework::Native => vec![format!(
            "Free what {label} allocates every step (a `cudaFree` for each `cudaMalloc`), or allocate its buffer once and \
             reuse it across steps."
        )],
    }
}

/// Under LD_PRELOAD with torch's caching allocator, what a site means (a segment's first
/// allocation) and what torch says holds the segments now.
fn segment_note(dump: &Dump) -> String {
    let torch_segments = framework(dump) == Framework::Torch
        && dump.failed_request.as_ref().is_some_and(|r| {
            matches!(
                r.api.as_str(),
                "cudaMalloc" | "cuMemCreate" | "cudaMallocAsync" | "framework_allocator"
            )
        })
        && dump.free_blocks.source != "oomshim-allocator";
    if !torch_segments {
        return String::new();
    }
    let fb = &dump.free_blocks;
    let held = match (fb.allocated_bytes, fb.reserved_bytes) {
        (Some(a), Some(r)) => format!(
            "; torch reports {} of its {} reserved in live tensors and {} free in its cache",
            human_bytes(a),
            human_bytes(r),
            human_bytes(fb.total_free_bytes.unwrap_or(r.saturating_sub(a)))
        ),
        _ => String::new(),
    };
    format!(
        " Under LD_PRELOAD oomshim sees torch's segments, not its tensors: a site is where torch first allocated a \
         segment, which other tensors may share by now{held}. `oomshim run --torch-allocator` records every tensor."
    )
}

/// The framework the program uses, for advice (from the dump's list of loaded frameworks;
/// dumps of older versions: torch's version, or Python frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framework {
    Torch,
    Jax,
    Cupy,
    /// Python without a known framework.
    Python,
    /// C, C++ or any program without Python.
    Native,
}

fn framework(dump: &Dump) -> Framework {
    let config = dump.config.as_ref();
    let listed = |name: &str| config.is_some_and(|c| c.frameworks.iter().any(|f| f == name));
    if let Some(f) = &dump.framework {
        match f.name.as_str() {
            "torch" => return Framework::Torch,
            "xla" | "jax" => return Framework::Jax,
            _ => {}
        }
    }
    // Dumps without the list (older versions): the libraries and files in the stacks.
    let in_stacks = |needles: &[&str]| {
        dump.failed_request
            .iter()
            .map(|r| &r.stack)
            .chain(dump.sites.iter().map(|s| &s.stack))
            .flatten()
            .any(|f| {
                [f.module.as_deref(), f.file.as_deref()]
                    .into_iter()
                    .flatten()
                    .any(|p| needles.iter().any(|n| p.contains(n)))
            })
    };
    if listed("torch")
        || config.is_some_and(|c| c.torch_version.is_some())
        || in_stacks(&["/torch/lib/", "/site-packages/torch/"])
    {
        Framework::Torch
    } else if listed("jax") || in_stacks(&["/jaxlib/", "/site-packages/jax/"]) {
        Framework::Jax
    } else if listed("cupy") || in_stacks(&["/cupy/", "/cupy_backends/"]) {
        Framework::Cupy
    } else if dump.recording.python.is_some() || in_stacks(&[".py"]) {
        Framework::Python
    } else {
        Framework::Native
    }
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

/// The line holding the most after the largest holder, when it alone holds at least the request
/// (freeing it would have made room): with the weights as the largest holder, this is usually
/// the activations or caches the program grew, the line a user can change. Sites are summed by
/// the line they name; the largest holder's line and the failing line are not repeated.
fn next_holder(dump: &Dump, request: u64, largest: Option<&str>, failing: &str) -> Option<String> {
    if request == 0 {
        return None;
    }
    let python_program = dump.recording.python.is_some();
    let mut by_line: Vec<(String, u64, u64)> = Vec::new();
    for s in &dump.sites {
        let label = if s.stack.is_empty() && python_program {
            NO_PYTHON_FRAMES.to_string()
        } else if named_frames(&s.stack).next().is_some() {
            short_label(&s.stack)
        } else {
            continue;
        };
        match by_line.iter_mut().find(|(l, _, _)| *l == label) {
            Some(e) => {
                e.1 = e.1.saturating_add(s.bytes);
                e.2 = e.2.saturating_add(s.count);
            }
            None => by_line.push((label, s.bytes, s.count)),
        }
    }
    by_line
        .into_iter()
        .filter(|(l, _, _)| Some(l.as_str()) != largest && !failing.ends_with(&format!(" at {l}")))
        .filter(|&(_, bytes, _)| bytes >= request)
        .max_by_key(|&(_, bytes, _)| bytes)
        .map(|(label, bytes, count)| {
            format!(
                "{}{} at {label}",
                human_bytes(bytes),
                if count > 1 {
                    format!(" (×{})", thousands(count))
                } else {
                    String::new()
                }
            )
        })
}

fn own_allocations(c: &Ctx, cache: Option<&Cache>) -> Finding {
    let (dev, tracked, used, req) = (c.dev, c.tracked, c.used, &c.req);
    let dump = c.dump;
    let request = c.request;
    let site = c
        .top
        .as_ref()
        .map(|t| t.label.as_str())
        .unwrap_or("the largest allocation sites");
    let largest = match &c.top {
        Some(t) => format!(
            "; largest: {}{} at {}",
            human_bytes(t.site.bytes),
            if t.site.count > 1 {
                format!(" (×{})", thousands(t.site.count))
            } else {
                String::new()
            },
            if t.label == NO_PYTHON_FRAMES {
                t.label.clone()
            } else {
                short_label(&t.site.stack)
            }
        ),
        None => String::new(),
    };
    // Where the program asked for the memory that did not fit, when that is not the largest
    // holder itself: the line a user goes to first.
    // In a Python program only a Python line says it: a backward thread's native frames name
    // the framework's internals.
    let python_program = dump.recording.python.is_some();
    let failing = match named_frames(&request.stack).next() {
        Some(f) if !python_program || f.kind == crate::dump::model::FrameKind::Python => {
            c.failing_at_short()
        }
        _ => String::new(),
    };
    let largest_label = c.top.as_ref().map(|t| {
        if t.label == NO_PYTHON_FRAMES {
            t.label.clone()
        } else {
            short_label(&t.site.stack)
        }
    });
    let largest = if !failing.is_empty()
        && largest_label
            .as_deref()
            .is_some_and(|l| !failing.ends_with(&format!(" at {l}")))
    {
        format!("{largest}; the {req} request{failing} failed")
    } else {
        largest
    };
    let largest = match next_holder(dump, request.bytes, largest_label.as_deref(), &failing) {
        Some(next) => format!("{largest}; next: {next}"),
        None => largest,
    };
    let headline = match used {
        Some(_)
            if request.api == "framework_allocator"
                && dump.framework.as_ref().is_some_and(|f| f.name == "xla") =>
        {
            format!(
                "XLA's memory pool on device {dev} is full: {} tracked, the pool included{largest}",
                human_bytes(tracked)
            )
        }
        Some(u) if u > 0 => format!(
            "this process's own allocations fill device {dev}: {} of the {} in use{largest}",
            human_bytes(tracked),
            human_bytes(u)
        ),
        _ => format!(
            "this process holds {} on device {dev}{largest}",
            human_bytes(tracked)
        ),
    };
    let fw = framework(dump);
    let xla_pool = fw == Framework::Jax && request.api == "framework_allocator";
    let mut suggestions = own_advice(fw, site);
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
    let mut evidence = Vec::new();
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
        evidence.push(growing_shapes_evidence(&fit, steps));
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
            "This process's own allocations fill device {dev}: {} of the {} in use ({}) was allocated by this process, \
             out of {} in total, when {req} more was requested.{}{}",
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
            "{summary} The memory grew {}/step over the last {} {steps}, but as many allocations were live at the end as at \
             the start: they grew larger (inputs of growing shape), none accumulated, so this is no leak.",
            human_bytes(fit.bytes_per_step),
            fit.samples
        ),
        None => summary,
    };
    let mut f = finding(OWN_ALLOCATIONS, tracked, headline, summary);
    f.evidence = evidence;
    f.suggestions = suggestions;
    f
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
    let summary = format!("{opening}{held}{site}");
    let headline = format!(
        "{}: {} tracked in {} on {}",
        if dump.reason == "oom" {
            "out-of-memory dump without a failed request"
        } else {
            "on-demand dump"
        },
        human_bytes(tracked),
        count_word(count, "allocation", "allocations"),
        count_word(holding as u64, "device", "devices")
    );
    let findings = vec![Finding {
        kind: SNAPSHOT.to_string(),
        bytes: tracked,
        headline,
        summary: summary.clone(),
        evidence: Vec::new(),
        suggestions: suggestions.clone(),
    }];
    Verdict {
        kind: SNAPSHOT.to_string(),
        summary,
        evidence,
        suggestions,
        findings,
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
                launcher: None,
                job_id: None,
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
                resolution: None,
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
                uuid: None,
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
                ..Default::default()
            },
            verdict: Verdict {
                findings: vec![],
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
            // A PyTorch program (train.py, model.py): torch is loaded.
            config: Some(ConfigSnapshot {
                frameworks: vec!["torch".into()],
                ..Default::default()
            }),
            request_sizes: None,
            framework: None,
            library_memory: None,
            post_mortem: None,
        }
    }

    fn contains_all(haystack: &str, needles: &[&str]) -> bool {
        needles.iter().all(|n| haystack.contains(n))
    }

    /// A Python program's dump: 100 GiB of weights loaded at `_zoo.py:12`, the forward pass at
    /// `train.py:34` holding `forward` bytes in two sites, 200 MiB from backward threads, and a
    /// 516 MiB request that failed on a backward thread (no Python frames).
    fn weights_then_forward(forward: [u64; 2]) -> Dump {
        let py = |function: &str, file: &str, line: u32| Frame {
            kind: FrameKind::Python,
            ..frame(Some(function), Some(file), Some(line))
        };
        let weights = vec![
            py("load_weights", "/w/_zoo.py", 12),
            py("<module>", "/w/train.py", 30),
        ];
        let forward_stack = |inner: u32| {
            vec![
                py(
                    "forward",
                    "/site-packages/torch/nn/modules/linear.py",
                    inner,
                ),
                py("<module>", "/w/train.py", 34),
            ]
        };
        let mut d = oom_dump(516 * MIB, Some(140 * GIB), Some(400 * MIB), 139 * GIB);
        d.recording.python = Some("all".into());
        d.failed_request.as_mut().unwrap().stack = vec![];
        d.sites = vec![
            Site {
                bytes: 100 * GIB,
                count: 1,
                stack: weights,
            },
            Site {
                bytes: forward[0],
                count: 3,
                stack: forward_stack(125),
            },
            Site {
                bytes: 200 * MIB,
                count: 9,
                stack: vec![],
            },
            Site {
                bytes: forward[1],
                count: 2,
                stack: forward_stack(130),
            },
        ];
        d
    }

    /// The top finding's kind and headline (the stderr summary's first line).
    fn headline(dump: &Dump) -> (String, String) {
        let v = judge(dump);
        let top = v.findings.first().expect("a finding");
        (top.kind.clone(), top.headline.clone())
    }

    #[test]
    fn own_allocations_names_the_next_holder_that_alone_would_make_room() {
        let v = headline(&weights_then_forward([400 * MIB, 300 * MIB]));
        assert_eq!(v.0, "own_allocations", "{}", v.1);
        assert!(
            v.1.contains("largest: 100.00 GiB at load_weights (_zoo.py:12)"),
            "{}",
            v.1
        );
        // The two forward sites are one line: 700 MiB in 5 allocations, more than the request.
        assert!(v.1.contains("next: 700.00 MiB (×5) at"), "{}", v.1);
        assert!(v.1.contains("train.py:34"), "{}", v.1);
        // The request had no Python frame: no failing line is invented.
        assert!(!v.1.contains("request at"), "{}", v.1);
    }

    #[test]
    fn own_allocations_does_not_name_a_next_holder_too_small_to_make_room() {
        let v = headline(&weights_then_forward([200 * MIB, 100 * MIB]));
        assert_eq!(v.0, "own_allocations", "{}", v.1);
        assert!(!v.1.contains("next:"), "{}", v.1);
    }

    #[test]
    fn own_allocations_names_the_failing_python_line_once() {
        let mut d = weights_then_forward([400 * MIB, 300 * MIB]);
        d.failed_request.as_mut().unwrap().stack = d.sites[1].stack.clone();
        let v = headline(&d);
        assert!(v.1.contains("the 516.00 MiB request at"), "{}", v.1);
        // The failing line is the forward line: it is not repeated as the next holder.
        assert!(!v.1.contains("next:"), "{}", v.1);
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
            ..Default::default()
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
            share: None,
            grouped_by: None,
        }
    }

    fn with_growth(unit: &str, sites: Vec<GrowthSite>) -> Dump {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        let rate: u64 = sites.iter().map(|s| s.bytes_per_step).sum();
        d.growth = Some(Growth {
            unit: unit.into(),
            steps: Some(if unit == "step" { "marked" } else { "time" }.into()),
            detected: None,
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
            fit: None,
            framework_live: vec![],
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
                "three equal growing sites: the process grows, spread over them",
                with_growth(
                    "step",
                    vec![
                        growth_site("a", 10 * MIB, 10),
                        growth_site("b", 10 * MIB, 10),
                        growth_site("c", 10 * MIB, 10),
                    ],
                ),
                LEAK,
            ),
            (
                "the process grows but no site is kept (spread over too many stacks)",
                with_growth("step", vec![]).tap(|d| {
                    let g = d.growth.as_mut().unwrap();
                    g.tracked = (1..=10)
                        .map(|i| GrowthPoint {
                            step: i,
                            bytes: i * 50 * MIB,
                        })
                        .collect();
                }),
                LEAK,
            ),
            (
                "growth that stopped before the failure (the memory was freed since): what fills \
                 the device now is not this process's tracked memory",
                with_growth("step", vec![growth_site("keep", 96 * MIB, 10)]).tap(|d| {
                    d.devices[0].tracked_bytes = 100 * MIB;
                }),
                UNTRACKED_MEMORY,
            ),
            (
                "detected steps that never free: a loading loop, not a leak",
                with_growth("step", vec![growth_site("load_layer", 96 * MIB, 10)]).tap(|d| {
                    let g = d.growth.as_mut().unwrap();
                    g.steps = Some("detected".into());
                    g.detected = Some(DetectedSteps {
                        period: 2,
                        steps: 10,
                        allocations_since_last_step: 0,
                        intervals: 9,
                        freeing_intervals: 0,
                        anchor: vec![],
                    });
                }),
                OWN_ALLOCATIONS,
            ),
            (
                "no growth key",
                oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB),
                OWN_ALLOCATIONS,
            ),
            (
                "fell back a step and a half by the failure (it comes mid-step): still a leak",
                on_top_of(70 * GIB, None, 70 * GIB + 960 * MIB - 144 * MIB),
                LEAK,
            ),
            (
                "fell back by more than half of what it grew: a phase that freed its memory",
                on_top_of(70 * GIB, None, 70 * GIB + 4 * 96 * MIB),
                OWN_ALLOCATIONS,
            ),
            (
                "as many allocations live at the end as at the start: they grew larger",
                on_top_of(70 * GIB, Some((40, 40)), 70 * GIB + 960 * MIB),
                OWN_ALLOCATIONS,
            ),
            (
                "fewer allocations than one every other step: nothing accumulates",
                on_top_of(70 * GIB, Some((40, 43)), 70 * GIB + 960 * MIB),
                OWN_ALLOCATIONS,
            ),
            (
                "one allocation every other step or more: a leak",
                on_top_of(70 * GIB, Some((40, 44)), 70 * GIB + 960 * MIB),
                LEAK,
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

    /// 96 MiB a step over 10 marked steps on top of `base`, fitted, with the live allocations
    /// of the fit's first and last sample; `now` tracked at the failure.
    fn on_top_of(base: u64, counts: Option<(u64, u64)>, now: u64) -> Dump {
        let mut d = with_growth("step", vec![growth_site("keep", 96 * MIB, 10)]);
        let g = d.growth.as_mut().unwrap();
        for p in g.tracked.iter_mut() {
            p.bytes += base;
        }
        g.fit = Some(GrowthFit {
            bytes_per_step: 96 * MIB,
            r_squared: 1.0,
            samples: 10,
            first: g.tracked[0].clone(),
            last: g.tracked[9].clone(),
            of: Some("tracked".into()),
            live_allocations: counts.map(|(first, last)| AllocationSpan { first, last }),
        });
        d.devices[0].tracked_bytes = now;
        d
    }

    trait Tap: Sized {
        fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
            f(&mut self);
            self
        }
    }
    impl Tap for Dump {}

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
        let top = &v.findings[0];
        assert!(
            top.headline.starts_with(
                "keep_activations (train.py:12) grows by 96.00 MiB every step (over the last 10 marked steps;"
            ) && top.headline.contains("98.0% of the growth")
                && top.headline.ends_with(
                    "free memory would run out at step 12, but the 2.00 GiB request failed earlier, in step 11"
                ),
            "{}",
            top.headline
        );
        for needle in [
            "grows by 98.00 MiB every step",
            "10 marked steps observed",
            "98.0% (96.00 MiB per step) at keep_activations (train.py:12)",
            "2.0% (2.00 MiB per step) at small (train.py:12)",
            "would run out at step 12; the failure came earlier, at step 11, because the failed request of \
             2.00 GiB is larger than what was still free",
        ] {
            assert!(v.summary.contains(needle), "{needle}: {}", v.summary);
        }
        assert!(
            v.evidence
                .iter()
                .any(|e| e
                    .starts_with("growth: keep_activations (train.py:12) adds 96.00 MiB per step")),
            "{:#?}",
            v.evidence
        );
        let s = v.suggestions.join("\n");
        for needle in ["loss.item()", "detach().cpu()", "append"] {
            assert!(s.contains(needle), "{needle}: {s}");
        }
        // Spread: no site carries half; the headline names the process and its parts.
        let spread = judge(&with_growth(
            "step",
            vec![
                growth_site("a", 10 * MIB, 10),
                growth_site("b", 10 * MIB, 10),
                growth_site("c", 10 * MIB, 10),
            ],
        ));
        assert!(
            spread.findings[0].headline.starts_with(
                "the process grows by 30.00 MiB every step (over the last 10 marked steps; "
            ),
            "{}",
            spread.findings[0].headline
        );
        assert!(
            spread.findings[0]
                .headline
                .contains("spread over sites: 33.3% (10.00 MiB per step) at a"),
            "{}",
            spread.findings[0].headline
        );
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
            ..Default::default()
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

#[cfg(test)]
mod findings_tests {
    use super::tests::oom_dump;
    use super::*;
    use crate::dump::model::*;
    use crate::facts::host::HostMemory;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn kinds(v: &Verdict) -> Vec<&str> {
        v.findings.iter().map(|f| f.kind.as_str()).collect()
    }

    fn growing(name: &str, per_step: u64, steps: u64) -> GrowthSite {
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
                file: Some("/home/u/train.py".into()),
                line: Some(12),
                ..Frame::default()
            }],
            share: None,
            grouped_by: None,
        }
    }

    fn growth(steps: &str, site: GrowthSite, detected: Option<DetectedSteps>) -> Growth {
        let rate = site.bytes_per_step;
        Growth {
            unit: "step".into(),
            steps: Some(steps.into()),
            detected,
            samples: site.samples,
            current: site.last.step,
            free_bytes: Some(GIB),
            projected_oom_step: site.projected_oom_step,
            tracked: (1..=site.samples)
                .map(|i| GrowthPoint {
                    step: i,
                    bytes: i * rate,
                })
                .collect(),
            sites: vec![site],
            fit: None,
            framework_live: vec![],
        }
    }

    fn process(pid: u32, bytes: u64, relation: Relation) -> GpuProcess {
        GpuProcess {
            pid,
            name: Some("python".into()),
            used_bytes: Some(bytes),
            relation,
        }
    }

    fn with_processes(d: &mut Dump, processes: Vec<GpuProcess>) {
        d.gpu_processes = Some(GpuProcesses {
            device: 0,
            matched_by: "index".into(),
            processes,
            error: None,
        });
    }

    fn cache(source: &str, total_free: u64, largest: u64, inactive: Option<u64>) -> FreeBlocks {
        FreeBlocks {
            source: source.into(),
            total_free_bytes: Some(total_free),
            largest_free_bytes: Some(largest),
            fragmentation: Some(1.0 - largest as f64 / total_free.max(1) as f64),
            inactive_split_bytes: inactive,
            ..Default::default()
        }
    }

    fn sizes(distinct_large: u64, large: u64) -> RequestSizes {
        RequestSizes {
            window: 4096,
            distinct: distinct_large + 3,
            large,
            distinct_large,
            large_bytes: MIB,
            ..Default::default()
        }
    }

    fn check_common(v: &Verdict) {
        assert!(!v.findings.is_empty());
        assert_eq!(v.kind, v.findings[0].kind, "kind is the top finding's");
        for w in v.findings.windows(2) {
            assert!(w[0].bytes >= w[1].bytes, "ranked by bytes: {:?}", kinds(v));
        }
        for f in &v.findings {
            assert!(
                !f.headline.contains('\n') && !f.headline.is_empty(),
                "{f:?}"
            );
            assert!(!f.summary.contains('\n'), "{f:?}");
            assert!(
                f.suggestions.iter().all(|s| !s
                    .replace("don't try to kill it", "")
                    .replace("out-of-memory kill", "")
                    .contains("kill")),
                "never suggest killing: {f:?}"
            );
            for s in &f.suggestions {
                assert!(
                    v.suggestions.contains(s),
                    "verdict carries every suggestion"
                );
            }
        }
    }

    /// Another process holds 60 GiB AND a leak grows 512 MiB a step AND the cache is fragmented:
    /// three findings, ranked by the bytes each explains.
    #[test]
    fn several_findings_are_ranked_by_bytes_explained() {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 19 * GIB);
        with_processes(
            &mut d,
            vec![
                process(4242, 60 * GIB, Relation::OtherUser),
                process(4812, 19 * GIB, Relation::This),
            ],
        );
        d.growth = Some(growth("marked", growing("keep", 512 * MIB, 20), None));
        d.free_blocks = cache("torch-snapshot", 4 * GIB, 512 * MIB, Some(3 * GIB));
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [OTHER_PROCESSES, LEAK, FRAGMENTATION], "{v:#?}");
        let bytes: Vec<u64> = v.findings.iter().map(|f| f.bytes).collect();
        assert_eq!(bytes, [60 * GIB, 20 * 512 * MIB, 4 * GIB]);
        assert_eq!(v.kind, OTHER_PROCESSES);
        assert!(v.findings[0]
            .headline
            .contains("other processes hold 60.00 GiB on device 0; the largest is process 4242 (python, another user's) with 60.00 GiB"));
        assert!(v.findings[1].headline.contains(
            "keep (train.py:12) grows by 512.00 MiB every step (over the last 20 marked steps; 10.00 GiB so far, 100.0% of the growth)"
        ));
        assert!(v.findings[2].headline.contains(
            "4.00 GiB free in the cache (torch-snapshot) but the largest free block is 512.00 MiB"
        ));
        assert!(v.findings[2]
            .evidence
            .iter()
            .any(|e| e.starts_with("inactive split bytes: 3.00 GiB")));
        // Suggestions in rank order: the other process's, the leak's, then fragmentation's.
        let pos = |needle: &str| {
            v.suggestions
                .iter()
                .position(|s| s.contains(needle))
                .unwrap()
        };
        assert!(pos("don't try to kill it") < pos("loss.item()"));
        assert!(pos("loss.item()") < pos("expandable_segments:True"));
        // The untracked memory is the other process's: no untracked finding, and no
        // own_allocations while a leak accounts for this process's memory.
        assert_eq!(judge(&d), v, "deterministic");
    }

    #[test]
    fn other_processes_threshold() {
        // 5% of an 80 GiB device is 4 GiB. This process's own allocations fill the rest.
        for (others, listed) in [(4 * GIB, true), (4 * GIB - 1, false)] {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
            with_processes(&mut d, vec![process(7, others, Relation::SameUser)]);
            let v = judge(&d);
            check_common(&v);
            let want: &[&str] = if listed {
                &[OWN_ALLOCATIONS, OTHER_PROCESSES]
            } else {
                &[OWN_ALLOCATIONS]
            };
            assert_eq!(kinds(&v), want, "{others}");
            assert_eq!(v.findings[0].bytes, 70 * GIB);
        }
    }

    #[test]
    fn untracked_threshold() {
        // 79 GiB in use: tracked at half of it is this process's; just below is untracked.
        let used = 79 * GIB;
        for (tracked, kind) in [
            (used / 2, OWN_ALLOCATIONS),
            (used / 2 - 1, UNTRACKED_MEMORY),
        ] {
            let v = judge(&oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), tracked));
            check_common(&v);
            assert_eq!(kinds(&v), [kind], "{tracked}");
        }
        // Other processes that explain at least half the untracked memory replace it.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 9 * GIB);
        with_processes(&mut d, vec![process(9, 35 * GIB, Relation::OtherUser)]);
        assert_eq!(kinds(&judge(&d)), [OTHER_PROCESSES]);
        with_processes(&mut d, vec![process(9, 35 * GIB - 1, Relation::OtherUser)]);
        let v = judge(&d);
        assert_eq!(kinds(&v), [UNTRACKED_MEMORY, OTHER_PROCESSES], "{v:#?}");
        assert_eq!(v.findings[0].bytes, 35 * GIB + 1);
        assert_eq!(v.findings[1].bytes, 35 * GIB - 1);
    }

    #[test]
    fn framework_cache_thresholds() {
        // A 2 GiB request, 1 GiB free on the device, 70 GiB of this process's segments.
        // (source, total free, largest, inactive split, device free, kind of the top finding)
        type Case = (&'static str, u64, u64, Option<u64>, u64, &'static str);
        let cases: Vec<Case> = vec![
            ("torch-snapshot", GIB, 256 * MIB, None, GIB, FRAMEWORK_CACHE),
            (
                "oomshim-allocator",
                GIB,
                256 * MIB,
                Some(0),
                GIB,
                FRAMEWORK_CACHE,
            ),
            // below half the request: crumbs
            (
                "torch-snapshot",
                GIB - 1,
                256 * MIB,
                None,
                2 * GIB,
                OWN_ALLOCATIONS,
            ),
            // releasing it would not make room: 1.5 GiB + 256 MiB < 2 GiB
            (
                "torch-snapshot",
                1536 * MIB,
                256 * MIB,
                None,
                256 * MIB,
                OWN_ALLOCATIONS,
            ),
            // ... exactly enough
            (
                "torch-snapshot",
                1536 * MIB,
                256 * MIB,
                None,
                512 * MIB,
                FRAMEWORK_CACHE,
            ),
            // inactive split bytes are not releasable: 1.5 GiB - 1 GiB < 1 GiB
            (
                "torch-snapshot",
                1536 * MIB,
                256 * MIB,
                Some(GIB),
                GIB,
                OWN_ALLOCATIONS,
            ),
            // more free than the request but split: fragmentation instead
            (
                "torch-snapshot",
                3 * GIB,
                256 * MIB,
                None,
                GIB,
                FRAGMENTATION,
            ),
            (
                "oomshim-allocator",
                3 * GIB,
                256 * MIB,
                None,
                GIB,
                FRAGMENTATION,
            ),
            // the shim cannot see free blocks: neither
            (
                "unavailable",
                3 * GIB,
                256 * MIB,
                None,
                GIB,
                OWN_ALLOCATIONS,
            ),
        ];
        for (source, total, largest, inactive, free, kind) in cases {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(free), 70 * GIB);
            d.free_blocks = cache(source, total, largest, inactive);
            let v = judge(&d);
            check_common(&v);
            assert_eq!(
                kinds(&v),
                [kind],
                "{source} {total} {inactive:?} {free}: {v:#?}"
            );
            let s = v.suggestions.join("\n");
            match kind {
                FRAMEWORK_CACHE => {
                    assert_eq!(v.findings[0].bytes, total);
                    assert!(s.contains("torch.cuda.empty_cache()"), "{s}");
                    assert!(s.contains("garbage_collection_threshold"), "{s}");
                    assert!(!s.contains("expandable_segments"), "{s}");
                }
                FRAGMENTATION => {
                    assert_eq!(v.findings[0].bytes, total);
                    assert!(s.contains("expandable_segments:True"), "{s}");
                }
                _ => {
                    assert!(!s.contains("garbage_collection_threshold"), "{s}");
                    if source != "unavailable" {
                        assert!(v.findings[0]
                            .evidence
                            .iter()
                            .any(|e| e.contains("reserved but unallocated")));
                    }
                }
            }
        }
    }

    #[test]
    fn dynamic_shapes_thresholds() {
        // (distinct large sizes, large requests, named?)
        let cases = [
            (16, 64, true),
            (15, 60, false), // too few distinct sizes
            (16, 65, false), // too few of the large requests have a size of their own
            (300, 400, true),
        ];
        for (distinct, large, named) in cases {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
            d.free_blocks = cache("torch-snapshot", 8 * GIB, GIB, None);
            d.request_sizes = Some(sizes(distinct, large));
            let v = judge(&d);
            check_common(&v);
            assert_eq!(v.kind, FRAGMENTATION);
            let f = &v.findings[0];
            assert_eq!(
                f.suggestions
                    .first()
                    .is_some_and(|s| s.starts_with("Pad or bucket")),
                named,
                "{distinct}/{large}: {:?}",
                f.suggestions
            );
            assert_eq!(f.summary.contains("dynamic shapes"), named);
            assert_eq!(
                f.evidence.iter().any(|e| e.starts_with(&format!(
                    "dynamic shapes: {distinct} distinct sizes among the {large} requests of at least 1.00 MiB"
                ))),
                named
            );
            if !named {
                // Shapes are known to be steady: no bucketing advice at all.
                assert!(
                    !v.suggestions.iter().any(|s| s.contains("bucket")),
                    "{:?}",
                    v.suggestions
                );
            }
        }
        // Without free blocks, dynamic shapes join the "possibly fragmentation" hint.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(4 * GIB), 70 * GIB);
        d.request_sizes = Some(sizes(40, 80));
        let v = judge(&d);
        assert_eq!(v.kind, OWN_ALLOCATIONS);
        assert!(v
            .suggestions
            .iter()
            .any(|s| s.starts_with("Possibly fragmentation")
                && s.contains("dynamic shapes: 40 distinct sizes")));
        assert!(v.suggestions.iter().any(|s| s.starts_with("Pad or bucket")));
    }

    #[test]
    fn detected_steps_support_a_leak_only_when_steps_free_memory() {
        let detected = |intervals, freeing| DetectedSteps {
            period: 2,
            steps: 20,
            allocations_since_last_step: 1,
            intervals,
            freeing_intervals: freeing,
            anchor: growing("keep_activations", 1, 2).stack,
        };
        // (intervals, freeing, leak?)
        for (intervals, freeing, leak) in
            [(10, 5, true), (10, 4, false), (10, 10, true), (0, 0, false)]
        {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
            d.growth = Some(growth(
                "detected",
                growing("keep_activations", 96 * MIB, 20),
                Some(detected(intervals, freeing)),
            ));
            let v = judge(&d);
            check_common(&v);
            if leak {
                assert_eq!(kinds(&v), [LEAK], "{intervals}/{freeing}");
                let f = &v.findings[0];
                // 19 steps of growth over the samples, and at most one more up to the failure.
                assert_eq!(f.bytes, 20 * 96 * MIB);
                assert!(
                    f.headline.contains("the last 20 detected steps"),
                    "{}",
                    f.headline
                );
                assert!(
                    f.summary.contains("Steps were detected automatically"),
                    "{}",
                    f.summary
                );
                assert!(f.evidence.iter().any(
                    |e| e.starts_with("steps: detected, not marked (a cycle of 2 allocations")
                ));
                assert!(f.suggestions.iter().any(|s| s.contains("oomshim.step()")));
                assert!(v
                    .evidence
                    .iter()
                    .any(|e| e.starts_with("steps detected automatically")));
            } else {
                assert_eq!(kinds(&v), [OWN_ALLOCATIONS], "{intervals}/{freeing}");
            }
        }
        // Marked steps need no such check.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        d.growth = Some(growth("marked", growing("keep", 96 * MIB, 20), None));
        let v = judge(&d);
        assert_eq!(kinds(&v), [LEAK]);
        assert!(v.findings[0]
            .evidence
            .iter()
            .any(|e| e.contains("marked by the program")));
        assert!(!v.suggestions.iter().any(|s| s.contains("oomshim.step()")));
    }

    #[test]
    fn host_memory_findings() {
        // MemAvailable (1 GiB) below the 3 GiB this process pinned: a host finding after the
        // device's, with the pinned bytes.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        d.pinned_host = PinnedHost {
            bytes: 3 * GIB,
            count: 6,
            peak_bytes: 3 * GIB,
        };
        d.host = Some(HostMemory {
            total_bytes: Some(64 * GIB),
            available_bytes: Some(GIB),
            ..Default::default()
        });
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [OWN_ALLOCATIONS, HOST_MEMORY]);
        assert_eq!(v.findings[1].bytes, 3 * GIB);
        assert_eq!(
            v.findings[1].headline,
            "host memory is low: 1.00 GiB available of 64.00 GiB (1.6%)"
        );
        // A cgroup at its limit, and a failed pinned request: the host finding alone.
        d.host = Some(HostMemory {
            total_bytes: Some(64 * GIB),
            available_bytes: Some(40 * GIB),
            cgroup_limit_bytes: Some(8 * GIB),
            cgroup_usage_bytes: Some(8 * GIB),
            rss_bytes: None,
        });
        d.failed_request.as_mut().unwrap().api = "cudaHostAlloc".into();
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [HOST_MEMORY]);
        assert_eq!(v.findings[0].bytes, 3 * GIB);
        assert!(v.findings[0]
            .evidence
            .iter()
            .any(|e| e.contains("the cgroup uses 8.00 GiB of its 8.00 GiB limit")));
    }

    #[test]
    fn small_other_processes_leave_the_untracked_memory_a_finding() {
        // 1 GiB in use on an 80 GiB device: 0.4 GiB tracked, another process holds 0.4 GiB,
        // below the 5% that makes it a finding: the untracked memory is the finding, whole.
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(79 * GIB), 400 * MIB);
        with_processes(&mut d, vec![process(3, 400 * MIB, Relation::OtherUser)]);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [UNTRACKED_MEMORY]);
        assert_eq!(v.findings[0].bytes, GIB - 800 * MIB);
    }

    #[test]
    fn every_dump_gets_at_least_one_finding() {
        let values = [
            None,
            Some(0),
            Some(1),
            Some(GIB),
            Some(80 * GIB),
            Some(u64::MAX),
        ];
        for total in values {
            for free in values {
                for tracked in [0, 1, GIB, 79 * GIB, u64::MAX] {
                    for others in [0, GIB, 60 * GIB] {
                        let mut d = oom_dump(2 * GIB, total, free, tracked);
                        with_processes(&mut d, vec![process(3, others, Relation::Unknown)]);
                        let v = judge(&d);
                        assert!(
                            !v.findings.is_empty(),
                            "{total:?} {free:?} {tracked} {others}"
                        );
                        check_common(&v);
                    }
                }
            }
        }
    }

    #[test]
    fn a_request_larger_than_the_device_is_the_only_finding() {
        let mut d = oom_dump(100 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        with_processes(&mut d, vec![process(1, 9 * GIB, Relation::OtherUser)]);
        d.free_blocks = cache("torch-snapshot", 8 * GIB, GIB, None);
        let v = judge(&d);
        check_common(&v);
        assert_eq!(kinds(&v), [REQUEST_EXCEEDS_DEVICE]);
        assert_eq!(v.findings[0].bytes, 100 * GIB);
        assert_eq!(
            v.findings[0].headline,
            "a single request of 100.00 GiB is larger than device 0 (80.00 GiB in total)"
        );
    }

    #[test]
    fn old_dumps_without_findings_still_parse_and_get_them_when_judged() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/oom_fragmentation.json");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("\"findings\""));
        let d = crate::dump::read::parse_dump(text.as_bytes(), &path).unwrap();
        assert!(d.verdict.findings.is_empty());
        let v = judge(&d);
        check_common(&v);
        assert_eq!(v.kind, FRAGMENTATION);
        // Serialised, the new keys appear; an empty list is left out.
        let json = serde_json::to_string(&v).unwrap();
        assert!(json.contains("\"findings\":[{\"kind\":\"fragmentation\""));
        let empty = serde_json::to_string(&Verdict::default()).unwrap();
        assert!(!empty.contains("findings"));
    }
}
