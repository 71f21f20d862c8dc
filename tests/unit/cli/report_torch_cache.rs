//! Unit tests of `oomshim_cli::report::torch_cache` (src/cli/report/torch_cache.rs).

use dump::model::HistogramBin;
use dump::model::{CacheSummary, Dump};
use dump::read::parse_dump;
use oomshim_cli::report::torch_cache::*;
use std::path::Path;

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
