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

#[cfg(test)]
mod tests {
    use super::*;
    use dump::model::HistogramBin;
    use dump::read::parse_dump;

    fn fixture() -> Dump {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom_own_allocations.json");
        parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
    }

    #[test]
    fn allocator_mode_kinds_are_merged_from_the_side_file_that_names_the_dump() {
        let mut dump = fixture();
        dump.framework = None;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("oomshim-h-1-1.json");
        std::fs::write(&path, b"{}").unwrap();
        let side = |dump_name: &str, pid: u32| {
            format!(
                r#"{{"schema":"oomshim.kinds/1","pid":{pid},"host":"{}","dump":"{dump_name}",
                    "kinds":{{"parameters_bytes":7,"activations_bytes":9,"phase":"forward"}}}}"#,
                dump.process.host
            )
        };
        let prefix = format!("oomshim-torch-{}-{}", dump.process.host, dump.process.pid);
        // Another dump's kinds, and another process's, are not this dump's.
        std::fs::write(
            dir.path().join(format!("{prefix}-other.kinds.json")),
            side("oomshim-h-1-2.json", dump.process.pid),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(format!("{prefix}-pid.kinds.json")),
            side("oomshim-h-1-1.json", dump.process.pid + 1),
        )
        .unwrap();
        assert!(kinds_for(&path, &dump).is_none());
        std::fs::write(
            dir.path()
                .join(format!("{prefix}-oomshim-h-1-1.kinds.json")),
            side("oomshim-h-1-1.json", dump.process.pid),
        )
        .unwrap();
        let k = kinds_for(&path, &dump).expect("the side file naming the dump");
        assert_eq!((k.parameters_bytes, k.activations_bytes), (7, Some(9)));
        apply_kinds(&mut dump, k);
        let fw = dump.framework.as_ref().unwrap();
        assert_eq!(fw.name, "torch");
        assert!(fw.kinds.is_some());
        // A dump with kinds of its own keeps them.
        assert!(kinds_for(&path, &dump).is_none());
    }

    fn fragmented(dump: &Dump) -> TorchCache {
        let req = dump.failed_request.as_ref().unwrap();
        TorchCache {
            schema: SCHEMA.into(),
            pid: dump.process.pid,
            host: dump.process.host.clone(),
            device: req.device,
            request_bytes: req.bytes,
            device_total_bytes: None,
            device_free_bytes: Some(100 << 20),
            alloc_conf: String::new(),
            torch_version: Some("2.11.0".into()),
            time_unix_ms: dump.time_unix_ms + 5,
            cache: CacheSummary {
                segments: 139,
                reserved_bytes: 139 << 30,
                allocated_bytes: 81 << 30,
                // Plenty free in total, but every block is smaller than the request.
                total_free_bytes: 58 << 30,
                largest_free_bytes: req.bytes / 2,
                inactive_split_bytes: 58 << 30,
                fragmentation: Some(0.99),
                histogram: vec![HistogramBin {
                    lo: 256 << 20,
                    hi: 512 << 20,
                    count: 139,
                    bytes: 58 << 30,
                }],
            },
            snapshot_file: Some("oomshim-torch-x.pickle".into()),
            dump: None,
        }
    }

    #[test]
    fn torch_free_blocks_turn_the_verdict_into_fragmentation() {
        let mut dump = fixture();
        let cache = fragmented(&dump);
        assert!(apply(&mut dump, &cache));
        assert_eq!(dump.free_blocks.source, "torch-snapshot");
        // torch's allocated vs reserved, inactive split bytes and segments travel too.
        let fb = &dump.free_blocks;
        assert_eq!(
            (
                fb.reserved_bytes,
                fb.allocated_bytes,
                fb.inactive_split_bytes,
                fb.segments
            ),
            (Some(139 << 30), Some(81 << 30), Some(58 << 30), Some(139))
        );
        assert_eq!(
            dump.config
                .as_ref()
                .and_then(|c| c.torch_version.as_deref()),
            Some("2.11.0"),
            "torch's own version when the dump found none"
        );
        let v = oomshim_core::verdict::judge(&dump);
        assert_eq!(v.kind, "fragmentation");
        assert_eq!(v.findings[0].bytes, 58 << 30);
        assert!(v
            .evidence
            .iter()
            .any(|e| e.starts_with("framework cache: 139.00 GiB reserved, 81.00 GiB allocated")));
        assert!(!apply(&mut dump, &cache), "applied once");
        let text = describe(Path::new("x.json"), &cache);
        assert!(
            text.contains("139 segments") && text.contains("(not set)"),
            "{text}"
        );
    }

    #[test]
    fn companions_are_found_by_host_and_pid_and_foreign_files_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let dump = fixture();
        let dump_path = dir.path().join("oomshim-dump.json");
        std::fs::write(&dump_path, serde_json::to_vec(&dump).unwrap()).unwrap();
        assert!(find_for(&dump_path, &dump).is_none());
        let c = fragmented(&dump);
        let json = serde_json::json!({
            "schema": SCHEMA, "pid": c.pid, "host": c.host, "device": c.device, "request_bytes": c.request_bytes,
            "time_unix_ms": c.time_unix_ms,
            "cache": {"segments": 1, "reserved_bytes": 1, "allocated_bytes": 0, "total_free_bytes": 1,
                      "largest_free_bytes": 1, "inactive_split_bytes": 0, "fragmentation": 0.0, "histogram": []}
        });
        let name = format!(
            "oomshim-torch-{}-{}-1.json",
            dump.process.host, dump.process.pid
        );
        std::fs::write(dir.path().join(&name), serde_json::to_vec(&json).unwrap()).unwrap();
        std::fs::write(
            dir.path().join(format!(
                "oomshim-torch-{}-{}-2.json",
                dump.process.host, dump.process.pid
            )),
            b"{not json",
        )
        .unwrap();
        let (p, found) = find_for(&dump_path, &dump).unwrap();
        assert!(p.ends_with(&name));
        assert_eq!(found.cache.segments, 1);
        // Another device's, another request's, or one far apart in time: not this dump's.
        let req = dump.failed_request.clone().unwrap();
        for (key, value) in [
            ("device", serde_json::json!(req.device + 1)),
            (
                "request_bytes",
                serde_json::json!(req.bytes * 4 + (1 << 30)),
            ),
            ("time_unix_ms", serde_json::json!(c.time_unix_ms + 120_000)),
        ] {
            let mut other = json.clone();
            other[key] = value;
            std::fs::write(dir.path().join(&name), serde_json::to_vec(&other).unwrap()).unwrap();
            assert!(find_for(&dump_path, &dump).is_none(), "{key}");
        }
        // One that names the dump wins, whatever its numbers.
        let mut named = json.clone();
        named["device"] = serde_json::json!(7);
        named["dump"] = serde_json::json!("oomshim-dump.json");
        std::fs::write(dir.path().join(&name), serde_json::to_vec(&named).unwrap()).unwrap();
        assert!(find_for(&dump_path, &dump).is_some());
    }
}
