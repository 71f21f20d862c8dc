//! The report model: what the reporters show about one dump, derived from it once.
//!
//! The terminal report ([`super::terminal`]), the JSON report ([`super::json`]) and the HTML
//! page's payload ([`super::html`]) are renderings of a [`ReportModel`]: the verdict is judged,
//! holders and sites are ranked, and every derived number and choice (used bytes, shares, the
//! growth chart's capacity, whether there are free blocks at all, what fills the device, the one
//! change to make, which evidence another section says) is made here, so the three cannot
//! disagree. The renderers only choose words, units and layout, and call nothing that decides. Sections that every reporter
//! shows as the dump has them (process, recording, host memory, configuration, …) are read from
//! [`ReportModel::dump`].

use std::collections::BTreeSet;
use std::path::Path;

use super::fill::{device_fill, focus_device, Fill};
use super::options::FRAMES_SHOWN;
use super::torch_cache::TorchCache;
use dump::model::{
    DeviceInfo, Dump, FailedRequest, Frame, FreeBlocks, GpuProcess, GpuProcesses, Growth, Holder,
    PostMortem, Site, Verdict,
};
use dump::units::share;
use dump::view::{free_blocks_available, named_frames, sorted_sites, used_bytes};
use oomshim_core::verdict::judge;

/// Everything the reporters show about one dump. Build it with [`ReportModel::new`]; it
/// borrows the dump.
#[derive(Debug, Clone)]
pub struct ReportModel<'a> {
    /// The dump the model is of.
    pub dump: &'a Dump,
    /// Why the dump was written, which is what the report's headline says.
    pub occasion: Occasion<'a>,
    /// The verdict as the current rules judge the dump (the one the shim recorded is
    /// `dump.verdict`: the rules may be newer than the shim that wrote the dump).
    pub verdict: Verdict,
    /// The request that failed, when the dump is of a failure.
    pub failed_request: Option<RequestView<'a>>,
    /// The devices in the dump's order.
    pub devices: Vec<DeviceView<'a>>,
    /// Tracked bytes over all devices (saturating): what a site's share is a share of.
    pub tracked_bytes: u64,
    /// Every holder, largest first (stable for equal sizes).
    pub holders: Vec<&'a Holder>,
    /// Every site, largest first (stable for equal sizes).
    pub sites: Vec<SiteView<'a>>,
    pub free_blocks: FreeBlocksView<'a>,
    /// The dump's growth samples and fits, when it has them.
    pub growth: Option<GrowthView<'a>>,
    /// The processes NVML listed on the device, when the dump has them.
    pub gpu_processes: Option<GpuProcessesView<'a>>,
    /// PyTorch's summary of its cache found next to the dump, already merged into it (see
    /// [`super::torch_cache::apply`]); set by [`ReportModel::with_torch_cache`].
    pub torch_cache: Option<TorchCacheNote<'a>>,
    /// The device the report is about: the failing one, else the one holding the most.
    pub focus_device: Option<i32>,
    /// What fills that device, when its total is known.
    pub fill: Option<Fill>,
    /// The one change to make: the top finding's first suggestion, else the verdict's.
    pub first_change: Option<String>,
    /// The lines of the verdict's evidence (its own and its findings') that repeat another
    /// section of the report: the reports leave them out of the evidence, so each fact is said
    /// once. The dump and the JSON report keep them.
    pub said_elsewhere: BTreeSet<String>,
}

/// Identical holders (same size, API, device and stack: a leak's activations, one per step)
/// as one row, as the HTML page shows them: `count × size`.
#[derive(Debug, Clone)]
pub struct HolderGroup<'a> {
    /// The group's earliest allocation (lowest `seq`): its address is the one shown.
    pub first: &'a Holder,
    /// How many holders are identical to it (1: no others).
    pub count: u64,
    /// Their bytes together (saturating).
    pub bytes: u64,
    /// The youngest and oldest age among them, in seconds.
    pub age_min_s: f64,
    pub age_max_s: f64,
}

/// `holders` (largest first) grouped into [`HolderGroup`]s, largest total first; groups of equal
/// totals keep the order of their first holders.
pub fn group_holders<'a>(holders: &[&'a Holder]) -> Vec<HolderGroup<'a>> {
    use std::collections::HashMap;
    // Keyed by what is cheap to hash; the stacks are compared in full within a bucket.
    let mut index: HashMap<(u64, &str, i32, Vec<&str>), Vec<usize>> = HashMap::new();
    let mut groups: Vec<HolderGroup<'a>> = Vec::new();
    for &h in holders {
        let key = (
            h.bytes,
            h.api.as_str(),
            h.device,
            h.stack.iter().map(|f| f.address.as_str()).collect(),
        );
        let bucket = index.entry(key).or_default();
        match bucket.iter().find(|&&g| groups[g].first.stack == h.stack) {
            Some(&g) => {
                let g = &mut groups[g];
                if h.seq < g.first.seq {
                    g.first = h;
                }
                g.count += 1;
                g.bytes = g.bytes.saturating_add(h.bytes);
                g.age_min_s = g.age_min_s.min(h.age_s);
                g.age_max_s = g.age_max_s.max(h.age_s);
            }
            None => {
                bucket.push(groups.len());
                groups.push(HolderGroup {
                    first: h,
                    count: 1,
                    bytes: h.bytes,
                    age_min_s: h.age_s,
                    age_max_s: h.age_s,
                });
            }
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.bytes));
    groups
}

/// Why the dump was written.
#[derive(Debug, Clone, Copy)]
pub enum Occasion<'a> {
    /// A device allocation failed (the dump has a failed request).
    OutOfMemory(&'a FailedRequest),
    /// `oomshim run` reconstructed the dump after the program died.
    PostMortem(&'a PostMortem),
    /// Asked for (signal, interval, API call): no failure in it.
    OnDemand,
}

/// What became of the failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// A retry succeeded; the program did not see the error.
    Recovered,
    /// No retry succeeded; the program saw the error.
    Stood,
    /// The dump was written before a retry could be seen.
    Unknown,
}

impl Recovery {
    pub fn from_recovered(recovered: Option<bool>) -> Recovery {
        match recovered {
            Some(true) => Recovery::Recovered,
            Some(false) => Recovery::Stood,
            None => Recovery::Unknown,
        }
    }

    /// The word the JSON report and the page use: `recovered`, `stood`, `unknown`.
    pub fn word(self) -> &'static str {
        match self {
            Recovery::Recovered => "recovered",
            Recovery::Stood => "stood",
            Recovery::Unknown => "unknown",
        }
    }
}

/// The failed request and what became of it.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub request: &'a FailedRequest,
    pub recovery: Recovery,
}

/// One device with the bytes derived from its totals.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    pub device: &'a DeviceInfo,
    /// `total - free` when both are known.
    pub used_bytes: Option<u64>,
    /// Tracked bytes as a percentage of the used bytes (unrounded); `None` when nothing is
    /// known to be used.
    pub tracked_percent_of_used: Option<f64>,
}

/// One allocation site with its share of all tracked bytes.
#[derive(Debug, Clone, Copy)]
pub struct SiteView<'a> {
    pub site: &'a Site,
    /// Percentage of [`ReportModel::tracked_bytes`] (unrounded); `None` when nothing is tracked.
    pub percent_of_tracked: Option<f64>,
}

/// The free-block section and whether there is any data in it.
#[derive(Debug, Clone, Copy)]
pub struct FreeBlocksView<'a> {
    pub blocks: &'a FreeBlocks,
    /// Whether the dump carries free-block data (its source is not `unavailable`).
    pub available: bool,
    /// The dump's fragmentation when it is a number (NaN and infinities are not shown).
    pub fragmentation: Option<f64>,
}

/// The growth section and the capacity its chart is drawn against.
#[derive(Debug, Clone, Copy)]
pub struct GrowthView<'a> {
    pub growth: &'a Growth,
    /// The total bytes of the failing device, else of the largest device whose total is known.
    pub capacity_bytes: Option<u64>,
}

/// The processes NVML listed, also ranked by their bytes.
#[derive(Debug, Clone)]
pub struct GpuProcessesView<'a> {
    /// The section as the dump has it (device, how it was matched, error, processes).
    pub list: &'a GpuProcesses,
    /// The processes largest first, stable for equal sizes (the shim writes them so; a dump
    /// from elsewhere may not be); an unknown size counts as 0.
    pub largest_first: Vec<&'a GpuProcess>,
}

/// The torch side file merged into the dump, and where it was found.
#[derive(Debug, Clone, Copy)]
pub struct TorchCacheNote<'a> {
    pub path: &'a Path,
    pub cache: &'a TorchCache,
}

impl<'a> ReportModel<'a> {
    /// Derives the model of `dump`: judges it and ranks what it holds.
    pub fn new(dump: &'a Dump) -> ReportModel<'a> {
        let occasion = match (&dump.failed_request, &dump.post_mortem) {
            (Some(request), _) => Occasion::OutOfMemory(request),
            (None, Some(pm)) => Occasion::PostMortem(pm),
            (None, None) => Occasion::OnDemand,
        };
        let tracked_bytes = dump
            .devices
            .iter()
            .map(|d| d.tracked_bytes)
            .fold(0, u64::saturating_add);
        let devices = dump
            .devices
            .iter()
            .map(|device| {
                let used = used_bytes(device.total_bytes, device.free_bytes);
                DeviceView {
                    device,
                    used_bytes: used,
                    tracked_percent_of_used: used.and_then(|u| share(device.tracked_bytes, u)),
                }
            })
            .collect();
        let mut holders: Vec<&Holder> = dump.largest_holders.iter().collect();
        holders.sort_by_key(|h| std::cmp::Reverse(h.bytes));
        let sites = sorted_sites(dump)
            .into_iter()
            .map(|site| SiteView {
                site,
                percent_of_tracked: share(site.bytes, tracked_bytes),
            })
            .collect();
        let fb = &dump.free_blocks;
        let verdict = judge(dump);
        let gpu_processes = dump.gpu_processes.as_ref().map(|list| {
            let mut largest_first: Vec<&GpuProcess> = list.processes.iter().collect();
            largest_first.sort_by_key(|p| std::cmp::Reverse(p.used_bytes.unwrap_or(0)));
            GpuProcessesView {
                list,
                largest_first,
            }
        });
        ReportModel {
            dump,
            occasion,
            first_change: first_change(&verdict).map(str::to_string),
            said_elsewhere: said_elsewhere(dump, &verdict),
            verdict,
            failed_request: dump.failed_request.as_ref().map(|request| RequestView {
                request,
                recovery: Recovery::from_recovered(request.recovered),
            }),
            devices,
            tracked_bytes,
            holders,
            sites,
            free_blocks: FreeBlocksView {
                blocks: fb,
                available: free_blocks_available(dump),
                fragmentation: fb.fragmentation.filter(|f| f.is_finite()),
            },
            growth: dump.growth.as_ref().map(|growth| GrowthView {
                growth,
                capacity_bytes: growth_capacity(dump),
            }),
            gpu_processes,
            torch_cache: None,
            focus_device: focus_device(dump),
            fill: device_fill(dump),
        }
    }

    /// The model with the torch side file that was merged into the dump (the CLI's `report`
    /// finds it next to the dump), so the reporters can say where it came from.
    pub fn with_torch_cache(mut self, path: &'a Path, cache: &'a TorchCache) -> ReportModel<'a> {
        self.torch_cache = Some(TorchCacheNote { path, cache });
        self
    }

    /// The verdict kind the shim recorded, when it is not the one judged now.
    pub fn recorded_verdict_if_different(&self) -> Option<&'a str> {
        let recorded = self.dump.verdict.kind.as_str();
        (!recorded.is_empty() && recorded != self.verdict.kind).then_some(recorded)
    }
}

/// Evidence lines that repeat what a report's Failed request and Processes sections show (the
/// request, its call, its burst and outcome; NVML's error).
const EVIDENCE_SHOWN_ELSEWHERE: [&str; 5] = [
    "failed request: ",
    "failing call: ",
    "failures in this burst: ",
    "last failure of the burst: ",
    "recovered: ",
];

/// The lines of `verdict`'s evidence and its findings' that repeat another section of the
/// report: the failed request's (when the dump has one), NVML's error (the Processes section's
/// line).
fn said_elsewhere(dump: &Dump, verdict: &Verdict) -> BTreeSet<String> {
    let nvml_error = dump
        .gpu_processes
        .as_ref()
        .is_some_and(|g| g.error.is_some());
    verdict
        .evidence
        .iter()
        .chain(verdict.findings.iter().flat_map(|f| f.evidence.iter()))
        .filter(|evidence| {
            dump.failed_request.is_some()
                && EVIDENCE_SHOWN_ELSEWHERE
                    .iter()
                    .any(|p| evidence.starts_with(p))
                || nvml_error
                    && evidence.starts_with("other processes on device ")
                    && evidence.contains(": unknown (")
        })
        .cloned()
        .collect()
}

/// The one change to make: the top finding's first suggestion, else the verdict's first.
fn first_change(verdict: &Verdict) -> Option<&str> {
    verdict
        .findings
        .first()
        .and_then(|f| f.suggestions.first())
        .or_else(|| verdict.suggestions.first())
        .map(String::as_str)
}

/// The frames a report shows for a stack: the first `FRAMES_SHOWN` (3) that have a name,
/// innermost first (see [`named_frames`] for which are skipped).
pub fn shown_frames(stack: &[Frame]) -> impl Iterator<Item = &Frame> {
    named_frames(stack).take(FRAMES_SHOWN)
}

/// A holder's age in seconds when it is a number (NaN and infinities are not shown).
pub fn known_age(holder: &Holder) -> Option<f64> {
    Some(holder.age_s).filter(|a| a.is_finite())
}

/// The total bytes of the device a growth chart is drawn against: the failing device's, else
/// the largest device's known total.
fn growth_capacity(dump: &Dump) -> Option<u64> {
    let failing = dump.failed_request.as_ref().map(|r| r.device);
    dump.devices
        .iter()
        .find(|d| Some(d.index) == failing && d.total_bytes.is_some())
        .or_else(|| {
            dump.devices
                .iter()
                .filter(|d| d.total_bytes.is_some())
                .max_by_key(|d| d.total_bytes)
        })
        .and_then(|d| d.total_bytes)
}
