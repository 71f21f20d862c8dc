//! Unit tests of `oomshim_cli::report::json` (src/cli/report/json.rs).

use super::fixtures::{self, check_golden, fixture_names, load_fixture};
use dump::view::{frame_label, named_frames};
use oomshim_cli::report::json::*;
use oomshim_cli::report::{ReportOptions, REPORT_SCHEMA};
use serde_json::{json, Value};

/// A side file in a directory whose name is not UTF-8 (Linux allows any bytes) is still
/// reported, its path written lossily, instead of the report panicking.
#[test]
fn a_torch_side_file_whose_path_is_not_utf8_is_reported() {
    use std::os::unix::ffi::OsStrExt;
    let dump = load_fixture("oom_own_allocations");
    let req = dump.failed_request.as_ref().unwrap();
    let cache: oomshim_cli::report::torch_cache::TorchCache = serde_json::from_value(json!({
        "schema": oomshim_cli::report::torch_cache::SCHEMA, "pid": dump.process.pid,
        "host": dump.process.host, "device": req.device, "request_bytes": req.bytes,
        "time_unix_ms": dump.time_unix_ms,
        "cache": {"segments": 1, "reserved_bytes": 1, "allocated_bytes": 0, "total_free_bytes": 1,
                  "largest_free_bytes": 1, "inactive_split_bytes": 0, "fragmentation": 0.0,
                  "histogram": []}
    }))
    .unwrap();
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(
        b"/runs/caf\xe9/oomshim-torch-h-1-1.json",
    ));
    let model = oomshim_cli::report::ReportModel::new(&dump).with_torch_cache(path, &cache);
    let value = render(
        &model,
        &ReportOptions {
            top: 5,
            color: false,
        },
    );
    assert_eq!(
        value["torch_cache_file"],
        json!("/runs/caf\u{fffd}/oomshim-torch-h-1-1.json")
    );
}

#[test]
fn json_report_golden() {
    for name in fixture_names() {
        let dump = load_fixture(name);
        let value = render_json(
            &dump,
            &ReportOptions {
                top: 5,
                color: false,
            },
        );
        let text = serde_json::to_string_pretty(&value).unwrap() + "\n";
        // Compared as JSON values, so key order (serde_json's `preserve_order` feature, which
        // another dependency could switch on) does not matter; text diff on a mismatch.
        let file = format!("{name}.report.json");
        let expected = std::fs::read(fixtures::fixture_path(&file))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if expected.as_ref() != Some(&value) {
            check_golden(&file, &text);
        }
    }
}

/// What a leak report needs from JSON: the growth samples and fits, who else uses the
/// device, host memory, request sizes and the configuration, as the dump has them.
#[test]
fn json_report_carries_everything_the_dump_knows() {
    use dump::model::{
        ConfigSnapshot, GpuProcesses, Growth, GrowthPoint, GrowthSite, RequestSizes, SizeCount,
    };
    let mut dump = load_fixture("oom_own_allocations");
    let stack = dump.sites[0].stack.clone();
    dump.growth = Some(Growth {
        unit: "step".into(),
        steps: Some("marked".into()),
        samples: 3,
        current: 12,
        free_bytes: Some(1 << 30),
        projected_oom_step: Some(20),
        sites: vec![GrowthSite {
            bytes_per_step: 96 << 20,
            r_squared: 0.998,
            samples: 3,
            first: GrowthPoint {
                step: 10,
                bytes: 1 << 30,
            },
            last: GrowthPoint {
                step: 12,
                bytes: (1 << 30) + (192 << 20),
            },
            projected_oom_step: Some(22),
            stack: stack.clone(),
            ..Default::default()
        }],
        tracked: (10..13)
            .map(|step| GrowthPoint {
                step,
                bytes: step << 30,
            })
            .collect(),
        ..Default::default()
    });
    dump.gpu_processes = Some(GpuProcesses {
        device: 0,
        matched_by: "index".into(),
        processes: vec![],
        error: Some("no NVML".into()),
    });
    dump.host = Some(dump::model::HostMemory {
        total_bytes: Some(64 << 30),
        available_bytes: Some(1 << 30),
        ..Default::default()
    });
    dump.request_sizes = Some(RequestSizes {
        window: 10,
        distinct: 2,
        top: vec![SizeCount {
            bytes: 512,
            count: 9,
        }],
        ..Default::default()
    });
    let mut env = std::collections::BTreeMap::new();
    env.insert(
        "PYTORCH_CUDA_ALLOC_CONF".to_string(),
        "expandable_segments:True".to_string(),
    );
    dump.config = Some(ConfigSnapshot {
        env,
        cuda_driver_version: Some(13000),
        ..Default::default()
    });
    let v = render_json(&dump, &ReportOptions::default());
    assert_eq!(
        v["gpu_processes"],
        serde_json::to_value(&dump.gpu_processes).unwrap()
    );
    assert_eq!(v["host"], serde_json::to_value(&dump.host).unwrap());
    assert_eq!(
        v["request_sizes"],
        serde_json::to_value(&dump.request_sizes).unwrap()
    );
    assert_eq!(v["config"], serde_json::to_value(&dump.config).unwrap());
    assert_eq!(
        v["config"]["env"]["PYTORCH_CUDA_ALLOC_CONF"],
        "expandable_segments:True"
    );
    let g = &v["growth"];
    assert_eq!(g["tracked"].as_array().unwrap().len(), 3);
    assert_eq!(g["tracked"][2], json!({"step": 12, "bytes": 12u64 << 30}));
    assert_eq!(g["sites"][0]["bytes_per_step"], 96 << 20);
    assert_eq!(g["sites"][0]["r_squared"], 0.998);
    assert_eq!(
        g["sites"][0]["stack"],
        serde_json::to_value(&stack).unwrap()
    );
    let named = named_frames(&stack).next().unwrap();
    assert_eq!(g["sites"][0]["label"], frame_label(named, usize::MAX));
    assert_eq!(g["sites"][0]["top_frames"], frames_json(&stack));
    let total = dump.devices[0].total_bytes;
    assert_eq!(g["capacity_bytes"], json!(total));
}

#[test]
fn json_report_keys_are_stable() {
    for name in fixture_names() {
        let dump = load_fixture(name);
        let v = render_json(&dump, &ReportOptions::default());
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v),
            [
                "by_kind",
                "config",
                "devices",
                "dump_schema",
                "failed_request",
                "free_blocks",
                "gpu_processes",
                "growth",
                "header",
                "holders_total",
                "host",
                "library_memory",
                "pinned_host",
                "pools",
                "post_mortem",
                "recorded_verdict",
                "recording",
                "report",
                "request_sizes",
                "sites_total",
                "top_holders",
                "top_sites",
                "verdict",
                "vmm"
            ]
        );
        assert_eq!(v["report"], REPORT_SCHEMA);
        assert_eq!(
            keys(&v["header"]),
            [
                "command_line",
                "host",
                "job_id",
                "launcher",
                "local_rank",
                "oom",
                "oomshim_version",
                "pid",
                "rank",
                "reason",
                "time",
                "time_unix_ms",
                "world_size"
            ]
        );
        assert_eq!(
            keys(&v["verdict"]),
            [
                "evidence",
                "findings",
                "kind",
                "retry",
                "suggestions",
                "summary"
            ]
        );
        for f in v["verdict"]["findings"].as_array().unwrap() {
            assert_eq!(
                keys(f),
                [
                    "bytes",
                    "bytes_human",
                    "evidence",
                    "headline",
                    "kind",
                    "rank",
                    "suggestions",
                    "summary"
                ]
            );
        }
        for d in v["devices"].as_array().unwrap() {
            assert_eq!(
                keys(d),
                [
                    "free_bytes",
                    "index",
                    "name",
                    "peak_tracked_bytes",
                    "total_bytes",
                    "tracked_bytes",
                    "tracked_count",
                    "tracked_percent_of_used",
                    "used_bytes",
                    "uuid"
                ]
            );
        }
        for h in v["top_holders"].as_array().unwrap() {
            assert_eq!(
                keys(h),
                [
                    "address",
                    "age_s",
                    "api",
                    "bytes",
                    "bytes_human",
                    "device",
                    "rank",
                    "seq",
                    "stack_merge",
                    "stream",
                    "thread",
                    "thread_name",
                    "top_frames"
                ]
            );
            for f in h["top_frames"].as_array().unwrap() {
                assert_eq!(
                    keys(f),
                    ["address", "file", "function", "label", "line", "module"]
                );
            }
        }
        for s in v["top_sites"].as_array().unwrap() {
            assert_eq!(
                keys(s),
                [
                    "bytes",
                    "bytes_human",
                    "count",
                    "percent_of_tracked",
                    "rank",
                    "top_frames"
                ]
            );
        }
        if !v["failed_request"].is_null() {
            assert_eq!(
                keys(&v["failed_request"]),
                [
                    "api",
                    "bytes",
                    "bytes_human",
                    "device",
                    "error_code",
                    "failures_in_burst",
                    "last_failure",
                    "recovered_before",
                    "recovery",
                    "top_frames"
                ]
            );
        }
        assert_eq!(
            keys(&v["free_blocks"]),
            [
                "allocated_bytes",
                "available",
                "fragmentation",
                "histogram",
                "inactive_split_bytes",
                "largest_free_bytes",
                "reason",
                "reserved_bytes",
                "segment_map",
                "segment_map_omitted",
                "segments",
                "source",
                "total_free_bytes"
            ]
        );
    }
}

#[test]
fn top_limits_rows() {
    let dump = load_fixture("oom_own_allocations");
    let v = render_json(
        &dump,
        &ReportOptions {
            top: 2,
            color: false,
        },
    );
    assert_eq!(v["top_holders"].as_array().unwrap().len(), 2);
    assert_eq!(v["top_sites"].as_array().unwrap().len(), 2);
    let v = render_json(
        &dump,
        &ReportOptions {
            top: 0,
            color: false,
        },
    );
    assert!(v["top_holders"].as_array().unwrap().is_empty());
    assert_eq!(v["holders_total"], dump.largest_holders.len());
}
