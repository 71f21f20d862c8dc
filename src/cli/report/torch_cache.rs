//! PyTorch's own view of its cache, saved by the Python hook `oomshim run` injects
//! (shim/python/oomshim_hook) when torch raises OutOfMemoryError, and merged into the report of
//! the shim's dump from the same process. Under LD_PRELOAD the shim sees torch's segments but
//! not the free blocks inside them; torch's snapshot has them, which is what tells fragmentation
//! apart from plain exhaustion.

use dump::model::{CacheSummary, Dump};
use dump::read::Links;
use dump::units::{clean, clean_path, human_bytes, percent};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const SCHEMA: &str = "oomshim.torch/1";

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TorchCache {
    pub schema: String,
    pub pid: u32,
    pub host: String,
    pub device: i32,
    pub request_bytes: u64,
    #[serde(default)]
    pub device_total_bytes: Option<u64>,
    #[serde(default)]
    pub device_free_bytes: Option<u64>,
    #[serde(default)]
    pub alloc_conf: String,
    #[serde(default)]
    pub torch_version: Option<String>,
    #[serde(default)]
    pub time_unix_ms: u64,
    pub cache: CacheSummary,
    #[serde(default)]
    pub snapshot_file: Option<String>,
    /// The dump this side file belongs to (its file name), when the hook knew it.
    #[serde(default)]
    pub dump: Option<String>,
}

/// Files the hook writes are small; anything larger is not one of them.
pub const MAX_BYTES: u64 = 64 << 20;

/// A side file, if `path` is one: a regular file (never a FIFO or device, and never through a
/// symlink: it is found by name in a directory others may write to), at most [`MAX_BYTES`].
fn read(path: &Path) -> Option<TorchCache> {
    let bytes = dump::read::read_bounded(path, MAX_BYTES, Links::Refuse).ok()?;
    parse(&bytes)
}

/// A side file's bytes as its summary, when they are one.
pub fn parse(bytes: &[u8]) -> Option<TorchCache> {
    let c: TorchCache = serde_json::from_slice(bytes).ok()?;
    (c.schema == SCHEMA).then_some(c)
}

/// How far apart a side file and its dump may be written.
pub const MATCH_WINDOW_MS: u64 = 60_000;

/// The hook's summary of torch's cache that belongs to `dump`, in the dump's directory: the one
/// that names the dump, else one of the same process (host and pid) and device whose request
/// `cudaMalloc` could have been asked for (torch rounds a request up to its segment size: 2 MiB
/// for small blocks, 20 MiB for medium ones, the next 2 MiB otherwise), written within a minute
/// of the dump; the closest in time of those.
pub fn find_for(dump_path: &Path, dump: &Dump) -> Option<(PathBuf, TorchCache)> {
    let own_name = dump_path.file_name().and_then(|n| n.to_str());
    let candidates: Vec<(PathBuf, TorchCache)> = side_files(dump_path, dump, "", ".json")?
        .filter_map(|p| read(&p).map(|c| (p, c)))
        .filter(|(_, c)| c.pid == dump.process.pid && c.host == dump.process.host)
        .collect();
    if let Some(named) = candidates
        .iter()
        .find(|(_, c)| c.dump.is_some() && c.dump.as_deref() == own_name)
    {
        return Some(named.clone());
    }
    let req = dump.failed_request.as_ref();
    candidates
        .into_iter()
        .filter(|(_, c)| c.dump.is_none() || c.dump.as_deref() == own_name)
        .filter(|(_, c)| match req {
            Some(r) => c.device == r.device && could_ask_for(c.request_bytes, r.bytes),
            None => true,
        })
        .filter(|(_, c)| c.time_unix_ms.abs_diff(dump.time_unix_ms) <= MATCH_WINDOW_MS)
        .min_by_key(|(_, c)| c.time_unix_ms.abs_diff(dump.time_unix_ms))
}

/// True when torch, asked for a block of `torch_bytes`, could have asked CUDA for `cuda_bytes`:
/// the segment it allocates for the block is at least the block and at most its rounding.
fn could_ask_for(torch_bytes: u64, cuda_bytes: u64) -> bool {
    const MIB: u64 = 1 << 20;
    let segment = if torch_bytes <= MIB {
        2 * MIB
    } else if torch_bytes < 10 * MIB {
        20 * MIB
    } else {
        torch_bytes.div_ceil(2 * MIB) * 2 * MIB
    };
    // Expandable segments map in 20 MiB pages; allow one page of slack either way.
    cuda_bytes >= torch_bytes.saturating_sub(20 * MIB) && cuda_bytes <= segment + 20 * MIB
}

/// Schema of the hook's side file of memory by kind, written in allocator mode (where torch has
/// no OOM observer and the dump is final before Python hears of the failure): the kinds counted
/// when the OutOfMemoryError reached the model's forward or the top of a thread, for the dump
/// the error names.
pub const KINDS_SCHEMA: &str = "oomshim.kinds/1";

#[derive(Debug, Clone, Deserialize)]
struct KindsSide {
    schema: String,
    pid: u32,
    host: String,
    dump: String,
    kinds: dump::model::Kinds,
}

/// The files beside `dump_path` that the Python hook of the dump's process wrote:
/// `oomshim-torch-HOST-PID{sep}…{suffix}` (each reader then checks what the file says of itself).
fn side_files(
    dump_path: &Path,
    dump: &Dump,
    sep: &str,
    suffix: &'static str,
) -> Option<impl Iterator<Item = PathBuf>> {
    let dir = dump_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let prefix = format!(
        "oomshim-torch-{}-{}{sep}",
        dump.process.host, dump.process.pid
    );
    let entries = std::fs::read_dir(dir).ok()?;
    Some(
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(move |p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(suffix))
            }),
    )
}

/// The kinds side file that names `dump_path` (same directory, same process), when the dump has
/// no kinds of its own.
pub fn kinds_for(dump_path: &Path, dump: &Dump) -> Option<dump::model::Kinds> {
    if dump.framework.as_ref().is_some_and(|f| f.kinds.is_some()) {
        return None;
    }
    let own_name = dump_path.file_name()?.to_str()?;
    side_files(dump_path, dump, "-", ".kinds.json")?
        .filter_map(|p| dump::read::read_bounded(&p, MAX_BYTES, Links::Refuse).ok())
        .filter_map(|b| serde_json::from_slice::<KindsSide>(&b).ok())
        .find(|k| {
            k.schema == KINDS_SCHEMA
                && k.pid == dump.process.pid
                && k.host == dump.process.host
                && k.dump == own_name
        })
        .map(|k| k.kinds)
}

/// Puts the side file's kinds into the dump (torch's account, created when the dump has none).
pub fn apply_kinds(dump: &mut Dump, kinds: dump::model::Kinds) {
    let fw = dump
        .framework
        .get_or_insert_with(|| dump::model::FrameworkOom {
            name: "torch".to_string(),
            raised: true,
            ..Default::default()
        });
    fw.kinds = Some(kinds);
}

/// Fills the dump's free blocks from torch's snapshot when the shim could not see them (and the
/// snapshot is of the failing device), so the verdict can judge fragmentation.
pub fn apply(dump: &mut Dump, cache: &TorchCache) -> bool {
    let failing = dump.failed_request.as_ref().map(|r| r.device);
    if dump.free_blocks.source != "unavailable" || failing.is_some_and(|d| d != cache.device) {
        return false;
    }
    dump.free_blocks = cache.cache.free_blocks("torch-snapshot".to_string());
    // torch's version as torch itself reported it, when the dump's snapshot did not find one.
    if let Some(v) = &cache.torch_version {
        let config = dump.config.get_or_insert_with(Default::default);
        if config.torch_version.is_none() {
            config.torch_version = Some(v.clone());
        }
    }
    true
}

/// Lines for the report: torch's cache at the error.
pub fn describe(path: &Path, cache: &TorchCache) -> String {
    let c = &cache.cache;
    let mut out = format!(
        "PyTorch's cache when it raised OutOfMemoryError (from {})\n",
        clean_path(path)
    );
    out.push_str(&format!(
        "  reserved {} in {} segments; allocated {}; free inside the cache {} (largest block {}, {} of it in split segments)\n",
        human_bytes(c.reserved_bytes),
        c.segments,
        human_bytes(c.allocated_bytes),
        human_bytes(c.total_free_bytes),
        human_bytes(c.largest_free_bytes),
        human_bytes(c.inactive_split_bytes),
    ));
    out.push_str(&format!(
        "  request {}; fragmentation {}; free on the device {}\n",
        human_bytes(cache.request_bytes),
        percent(c.fragmentation),
        cache
            .device_free_bytes
            .map(human_bytes)
            .unwrap_or_else(|| "unknown".into()),
    ));
    out.push_str(&format!(
        "  PYTORCH_CUDA_ALLOC_CONF={}\n",
        if cache.alloc_conf.is_empty() {
            "(not set)".to_string()
        } else {
            clean(&cache.alloc_conf)
        }
    ));
    if let Some(f) = &cache.snapshot_file {
        out.push_str(&format!(
            "  full snapshot: {} (open it at https://pytorch.org/memory_viz)\n",
            clean(f)
        ));
    }
    out
}
