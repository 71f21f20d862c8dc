//! Reporters: pure functions from a parsed dump to text ([`terminal`]) or a machine-readable
//! report model ([`render_json`]); [`units`] formats sizes and text for both.
//!
//! The report shows the verdict as [`crate::verdict::judge`] finds it now (the rules may be newer
//! than the shim that wrote the dump); the verdict stored in the dump is kept in the JSON report
//! as `recorded_verdict`.

pub mod diff;
pub mod export;
pub mod html;
pub mod merge;
pub mod terminal;
pub mod torch_cache;
// The units and the frame views are shared with the verdict and the live shim; they live with
// the dump format and are re-exported at their old paths.
pub use crate::dump::units;
pub use crate::dump::view::{
    frame_label, is_cuda_api_frame, is_library_python_frame, named_frames,
};
pub(crate) use crate::dump::view::{free_blocks_available, sorted_sites, used_bytes};

use serde_json::{json, Value};

use crate::dump::model::{Dump, Frame, Holder};
use crate::verdict::judge;
use units::{human_bytes, share};

pub use terminal::render_terminal;

/// Identifies the layout of [`render_json`]'s output; bumped when a key changes meaning or goes.
pub const REPORT_SCHEMA: &str = "oomshim.report/1";

/// How much a report shows and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOptions {
    /// Rows in the largest-holders and sites tables (0 shows none).
    pub top: usize,
    /// ANSI colour in terminal output; the CLI decides (TTY, `NO_COLOR`). Ignored by JSON.
    pub color: bool,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            top: 10,
            color: false,
        }
    }
}

/// Frames shown per holder or site.
pub(crate) const FRAMES_SHOWN: usize = 3;

/// Holders largest first (stable for equal sizes), whatever order the dump has them in.
pub(crate) fn sorted_holders(dump: &Dump) -> Vec<&Holder> {
    let mut holders: Vec<&Holder> = dump.largest_holders.iter().collect();
    holders.sort_by_key(|h| std::cmp::Reverse(h.bytes));
    holders
}

/// What the failed request's `recovered` means, as one word: `recovered`, `stood`, `unknown`.
pub fn recovery_word(recovered: Option<bool>) -> &'static str {
    match recovered {
        Some(true) => "recovered",
        Some(false) => "stood",
        None => "unknown",
    }
}

fn frames_json(stack: &[Frame]) -> Value {
    Value::Array(
        named_frames(stack)
            .take(FRAMES_SHOWN)
            .map(|f| {
                json!({
                    "function": f.function,
                    "file": f.file,
                    "line": f.line,
                    "module": f.module,
                    "address": f.address,
                    "label": frame_label(f, usize::MAX),
                })
            })
            .collect(),
    )
}

/// The report's words for a post-mortem dump: reconstructed, how the program died, and how old
/// the state it shows is.
pub fn post_mortem_words(pm: &crate::dump::model::PostMortem) -> String {
    let how = match (&pm.signal_name, pm.exit_code) {
        (Some(name), _) => format!("killed by {}", units::clean(name)),
        (None, Some(code)) => format!("exited with status {code}"),
        _ => "ended".to_string(),
    };
    format!(
        "post-mortem dump, reconstructed by oomshim run: the program was {how}; its state as published {:.1} s before",
        pm.died_unix_ms.saturating_sub(pm.published_unix_ms) as f64 / 1000.0
    )
}

/// The report model as JSON. Keys (all always present; `null` where unknown):
///
/// - `report`: [`REPORT_SCHEMA`]; `dump_schema`: the dump's `schema`.
/// - `header`: `reason`, `oom` (bool: a failed request is present), `time`, `time_unix_ms`, `pid`,
///   `host`, `command_line` (array), `rank`, `local_rank`, `world_size`, `oomshim_version`.
/// - `post_mortem`: `null`, or the dump's `post_mortem` section as it is (a dump that
///   `oomshim run` reconstructed after its program died: README, Dump schema).
/// - `failed_request`: `null` or `bytes`, `bytes_human`, `api`, `device`, `error_code`,
///   `recovery` (`recovered` | `stood` | `unknown`), `failures_in_burst`, `top_frames`,
///   `last_failure` (`null` or `bytes`, `api`, `time_unix_ms`, `tracked_bytes`, `free_bytes`,
///   `total_bytes`).
/// - `devices[]`: `index`, `name`, `total_bytes`, `free_bytes`, `used_bytes`, `tracked_bytes`,
///   `tracked_count`, `peak_tracked_bytes`, `tracked_percent_of_used`.
/// - `verdict`: `kind`, `summary`, `evidence[]`, `suggestions[]` (judged now);
///   `recorded_verdict`: the same four keys as stored in the dump.
/// - `top_holders[]` (at most `opts.top`, largest first): `rank` (1-based), `bytes`,
///   `bytes_human`, `api`, `device`, `stream`, `thread`, `age_s`, `address`, `seq`, `top_frames`.
/// - `top_sites[]` (at most `opts.top`): `rank`, `bytes`, `bytes_human`, `count`,
///   `percent_of_tracked`, `top_frames`.
/// - `holders_total`, `sites_total`: how many the dump lists.
/// - `pinned_host`: `bytes`, `count`, `peak_bytes`.
/// - `free_blocks`: `source`, `available` (bool), `reason`, `total_free_bytes`,
///   `largest_free_bytes`, `fragmentation`, `histogram[]` (`lo`, `hi`, `count`, `bytes`).
/// - `recording`: `version`, `stacks`, `depth`, `unknown_frees`, `live_allocations`,
///   `total_allocations`, `oom_failures`.
///
/// `top_frames[]`: the first three frames that have a function name, innermost first:
/// `function`, `file`, `line`, `module`, `address`, `label` (`function (file:line)`).
///
/// Added in the same schema (new keys only; the keys above keep their meaning):
///
/// - `top_holders[]` also `thread_name`, `stack_merge`; `recording` also `python`,
///   `python_merge`; `free_blocks` also `reserved_bytes`, `allocated_bytes`,
///   `inactive_split_bytes`, `segments`, `segment_map[]`, `segment_map_omitted`.
/// - `growth`: `null`, or the dump's `growth` as written (`unit`, `steps`, `detected`,
///   `samples`, `current`, `free_bytes`, `projected_oom_step`, `tracked[]` of `step`/`bytes`,
///   `sites[]` with `bytes_per_step`, `r_squared`, `samples`, `first`, `last`,
///   `projected_oom_step`, `stack`), each site with `top_frames` and `label` (its innermost named
///   frame) added, and `capacity_bytes`: the device's total bytes the chart is drawn against.
/// - `gpu_processes`, `host`, `request_sizes`, `config`, `vmm`: `null` or the dump's objects as
///   written; `pools[]`: the dump's pools (empty when none).
/// - `header` also `launcher`, `job_id`; `devices[]` also `uuid`; `library_memory`: `null` or
///   the dump's object as written (live bytes by library, the untracked split).
///
/// The dump's keys are documented in the README (Dump schema).
pub fn render_json(dump: &Dump, opts: &ReportOptions) -> Value {
    let process = &dump.process;
    let verdict = judge(dump);
    let tracked_total: u64 = dump
        .devices
        .iter()
        .map(|d| d.tracked_bytes)
        .fold(0, u64::saturating_add);
    let failed_request = match &dump.failed_request {
        None => Value::Null,
        Some(req) => json!({
            "bytes": req.bytes,
            "bytes_human": human_bytes(req.bytes),
            "api": req.api,
            "device": req.device,
            "error_code": req.error_code,
            "recovery": recovery_word(req.recovered),
            "failures_in_burst": req.failures_in_burst,
            "top_frames": frames_json(&req.stack),
            "last_failure": match &req.last_failure {
                None => Value::Null,
                Some(lf) => json!({
                    "bytes": lf.bytes,
                    "api": lf.api,
                    "time_unix_ms": lf.time_unix_ms,
                    "tracked_bytes": lf.tracked_bytes,
                    "free_bytes": lf.free_bytes,
                    "total_bytes": lf.total_bytes,
                }),
            },
        }),
    };
    let devices: Vec<Value> = dump
        .devices
        .iter()
        .map(|d| {
            let used = used_bytes(d.total_bytes, d.free_bytes);
            json!({
                "index": d.index,
                "name": d.name,
                "total_bytes": d.total_bytes,
                "free_bytes": d.free_bytes,
                "used_bytes": used,
                "tracked_bytes": d.tracked_bytes,
                "tracked_count": d.tracked_count,
                "peak_tracked_bytes": d.peak_tracked_bytes,
                "uuid": d.uuid,
                "tracked_percent_of_used": used.and_then(|u| share(d.tracked_bytes, u)).map(round1),
            })
        })
        .collect();
    let holders: Vec<Value> = sorted_holders(dump)
        .into_iter()
        .take(opts.top)
        .enumerate()
        .map(|(i, h)| {
            json!({
                "rank": i + 1,
                "bytes": h.bytes,
                "bytes_human": human_bytes(h.bytes),
                "api": h.api,
                "device": h.device,
                "stream": h.stream,
                "thread": h.thread,
                "age_s": if h.age_s.is_finite() { json!(h.age_s) } else { Value::Null },
                "address": h.address,
                "seq": h.seq,
                "thread_name": h.thread_name,
                "stack_merge": h.stack_merge,
                "top_frames": frames_json(&h.stack),
            })
        })
        .collect();
    let sites: Vec<Value> = sorted_sites(dump)
        .into_iter()
        .take(opts.top)
        .enumerate()
        .map(|(i, s)| {
            json!({
                "rank": i + 1,
                "bytes": s.bytes,
                "bytes_human": human_bytes(s.bytes),
                "count": s.count,
                "percent_of_tracked": share(s.bytes, tracked_total).map(round1),
                "top_frames": frames_json(&s.stack),
            })
        })
        .collect();
    let fb = &dump.free_blocks;
    json!({
        "report": REPORT_SCHEMA,
        "dump_schema": dump.schema,
        "header": {
            "reason": dump.reason,
            "oom": dump.failed_request.is_some(),
            "time": dump.time,
            "time_unix_ms": dump.time_unix_ms,
            "pid": process.pid,
            "host": process.host,
            "command_line": process.command_line,
            "rank": process.rank,
            "local_rank": process.local_rank,
            "world_size": process.world_size,
            "launcher": process.launcher,
            "job_id": process.job_id,
            "oomshim_version": dump.recording.version,
        },
        "failed_request": failed_request,
        "post_mortem": dump.post_mortem,
        "devices": devices,
        "verdict": {
            "kind": verdict.kind,
            "summary": verdict.summary,
            "evidence": verdict.evidence,
            "suggestions": verdict.suggestions,
            "findings": findings_json(&verdict.findings),
        },
        "recorded_verdict": {
            "kind": dump.verdict.kind,
            "summary": dump.verdict.summary,
            "evidence": dump.verdict.evidence,
            "suggestions": dump.verdict.suggestions,
        },
        "top_holders": holders,
        "holders_total": dump.largest_holders.len(),
        "top_sites": sites,
        "sites_total": dump.sites.len(),
        "pinned_host": {
            "bytes": dump.pinned_host.bytes,
            "count": dump.pinned_host.count,
            "peak_bytes": dump.pinned_host.peak_bytes,
        },
        "free_blocks": {
            "source": fb.source,
            "available": free_blocks_available(dump),
            "reason": fb.reason,
            "total_free_bytes": fb.total_free_bytes,
            "largest_free_bytes": fb.largest_free_bytes,
            "fragmentation": fb.fragmentation.filter(|f| f.is_finite()),
            "histogram": fb.histogram.iter().map(|b| json!({
                "lo": b.lo, "hi": b.hi, "count": b.count, "bytes": b.bytes,
            })).collect::<Vec<_>>(),
            "reserved_bytes": fb.reserved_bytes,
            "allocated_bytes": fb.allocated_bytes,
            "inactive_split_bytes": fb.inactive_split_bytes,
            "segments": fb.segments,
            "segment_map": fb.segment_map,
            "segment_map_omitted": fb.segment_map_omitted,
        },
        "growth": growth_json(dump),
        "gpu_processes": dump.gpu_processes,
        "host": dump.host,
        "request_sizes": dump.request_sizes,
        "config": dump.config,
        "pools": dump.pools,
        "vmm": dump.vmm,
        "library_memory": dump.library_memory,
        "recording": {
            "version": dump.recording.version,
            "stacks": dump.recording.stacks,
            "depth": dump.recording.depth,
            "unknown_frees": dump.recording.unknown_frees,
            "live_allocations": dump.recording.live_allocations,
            "total_allocations": dump.recording.total_allocations,
            "oom_failures": dump.recording.oom_failures,
            "python": dump.recording.python,
            "python_merge": dump.recording.python_merge,
        },
    })
}

/// The dump's `growth` for the JSON report: as written, each site with its `top_frames` and
/// `label`, plus the device capacity a chart of it is drawn against.
fn growth_json(dump: &Dump) -> Value {
    let Some(g) = &dump.growth else {
        return Value::Null;
    };
    let mut v = serde_json::to_value(g).unwrap_or(Value::Null);
    if let Some(sites) = v.get_mut("sites").and_then(Value::as_array_mut) {
        for (site, s) in sites.iter_mut().zip(&g.sites) {
            site["top_frames"] = frames_json(&s.stack);
            site["label"] = json!(named_frames(&s.stack)
                .next()
                .map(|f| frame_label(f, usize::MAX)));
        }
    }
    v["capacity_bytes"] = json!(growth_capacity(dump));
    v
}

/// The total bytes of the device a growth chart is drawn against: the failing device's, else
/// the largest device's known total.
pub(crate) fn growth_capacity(dump: &Dump) -> Option<u64> {
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

/// Whether the dump carries free-block data (its source is not `unavailable`).
/// The ranked findings for JSON reports, each with its rank and human-readable bytes.
pub(crate) fn findings_json(findings: &[crate::dump::model::Finding]) -> Vec<Value> {
    findings
        .iter()
        .enumerate()
        .map(|(i, f)| {
            json!({
                "rank": i + 1,
                "kind": f.kind,
                "bytes": f.bytes,
                "bytes_human": human_bytes(f.bytes),
                "headline": f.headline,
                "summary": f.summary,
                "evidence": f.evidence,
                "suggestions": f.suggestions,
            })
        })
        .collect()
}

fn round1(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 10.0).round() / 10.0)
    } else {
        Value::Null
    }
}

/// Test fixtures under `tests/fixtures/` and golden-file comparison. `OOMSHIM_BLESS=1` rewrites
/// the expected files instead of comparing.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::PathBuf;

    use crate::dump::model::Dump;
    use crate::dump::read::read_dump;

    /// Dumps under `tests/fixtures/<name>.json` that have golden reports.
    pub fn fixture_names() -> &'static [&'static str] {
        &[
            "oom_own_allocations",
            "oom_untracked",
            "oom_request_exceeds_device",
            "oom_fragmentation",
            "snapshot",
            "minimal_unavailable",
        ]
    }

    pub fn fixture_path(file: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(file)
    }

    pub fn load_fixture(name: &str) -> Dump {
        let path = fixture_path(&format!("{name}.json"));
        read_dump(&path).unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    /// Compares `actual` with the expected file `tests/fixtures/<file>`; with `OOMSHIM_BLESS=1`
    /// writes `actual` there instead.
    pub fn check_golden(file: &str, actual: &str) {
        let path = fixture_path(file);
        if std::env::var_os("OOMSHIM_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            return;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with OOMSHIM_BLESS=1 to create it)",
                path.display()
            )
        });
        if expected != actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
            panic!(
                "{} differs from the rendered output at line {}:\n  expected: {:?}\n  actual:   {:?}\n\
                 --- actual output ---\n{actual}\n(run with OOMSHIM_BLESS=1 to accept)",
                path.display(),
                first + 1,
                expected.lines().nth(first).unwrap_or("<end>"),
                actual.lines().nth(first).unwrap_or("<end>"),
            );
        }
    }
}

#[cfg(test)]
mod library_frame_tests {
    use super::*;
    use crate::dump::model::FrameKind;

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            address: "0x1".into(),
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
            kind: FrameKind::Python,
            ..Frame::default()
        }
    }

    #[test]
    fn sites_are_named_after_the_programs_own_line() {
        let stack = vec![
            Frame {
                address: "0x2".into(),
                function: Some("cudaMalloc".into()),
                ..Frame::default()
            },
            py(
                "relu",
                "/venv/lib/python3.12/site-packages/torch/nn/functional.py",
                1723,
            ),
            py(
                "forward",
                "/venv/lib/python3.12/site-packages/torch/nn/modules/activation.py",
                144,
            ),
            py("train_step", "/home/ada/train.py", 17),
            py("<module>", "/home/ada/train.py", 40),
        ];
        let names: Vec<&str> = named_frames(&stack)
            .map(|f| f.function.as_deref().unwrap())
            .collect();
        assert_eq!(names, ["train_step", "<module>"]);
        // Only library code: it is named as it is.
        let lib_only = &stack[..3];
        assert_eq!(
            named_frames(lib_only).next().unwrap().function.as_deref(),
            Some("relu")
        );
        assert!(is_library_python_frame(&py(
            "f",
            "/usr/lib/python3.11/threading.py",
            1
        )));
        assert!(is_library_python_frame(&py(
            "f",
            "<frozen importlib._bootstrap>",
            1
        )));
        assert!(!is_library_python_frame(&py(
            "f",
            "/srv/python-apps/train.py",
            1
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::model::FrameKind;
    use fixtures::{check_golden, fixture_names, load_fixture};

    #[test]
    fn python_frames_name_a_stack_that_has_them() {
        let f = |name: &str, kind: FrameKind| Frame {
            address: "0x1".into(),
            function: Some(name.into()),
            kind,
            ..Frame::default()
        };
        let stack = vec![
            f("simcall_alloc", FrameKind::Native),
            f("forward", FrameKind::Python),
            f("PyObject_Call", FrameKind::Native),
            f("main", FrameKind::Python),
        ];
        let names: Vec<_> = named_frames(&stack)
            .map(|f| f.function.clone().unwrap())
            .collect();
        assert_eq!(names, ["forward", "main"]);
        assert_eq!(
            named_frames(&stack[..1]).count(),
            1,
            "native-only stacks are unchanged"
        );
    }

    #[test]
    fn frame_labels() {
        let f = |function: Option<&str>,
                 file: Option<&str>,
                 line: Option<u32>,
                 module: Option<&str>| Frame {
            address: "0x1".into(),
            function: function.map(Into::into),
            file: file.map(Into::into),
            line,
            module: module.map(Into::into),
            inlined: false,
            kind: Default::default(),
        };
        assert_eq!(
            frame_label(&f(Some("forward"), Some("model.py"), Some(42), None), 80),
            "forward (model.py:42)"
        );
        assert_eq!(
            frame_label(&f(Some("forward"), Some("model.py"), None, None), 80),
            "forward (model.py)"
        );
        assert_eq!(
            frame_label(
                &f(
                    Some("cudaMalloc"),
                    None,
                    None,
                    Some("/usr/lib/libcudart.so.13")
                ),
                80
            ),
            "cudaMalloc [libcudart.so.13]"
        );
        assert_eq!(frame_label(&f(Some("main"), None, None, None), 80), "main");
        let stack = vec![
            f(None, None, None, None),
            f(Some(""), None, None, None),
            f(Some("a"), None, None, None),
        ];
        assert_eq!(named_frames(&stack).count(), 1);
        // CUDA API frames are skipped when a caller is named, kept when nothing else is.
        let api = f(Some("cudaMalloc"), None, None, Some("/x/libcudart.so.13"));
        let static_api = f(Some("cuMemAlloc_v2"), None, None, Some("/opt/app"));
        let shim = f(
            Some("oomshim::ffi::hook"),
            None,
            None,
            Some("/x/liboomshim.so"),
        );
        let user = f(
            Some("alloc_matrix"),
            Some("m.cu"),
            Some(3),
            Some("/opt/app"),
        );
        let stack = vec![shim.clone(), api.clone(), static_api.clone(), user.clone()];
        let names: Vec<_> = named_frames(&stack)
            .map(|f| f.function.clone().unwrap())
            .collect();
        assert_eq!(names, ["alloc_matrix"]);
        let stack = vec![api, static_api];
        assert_eq!(named_frames(&stack).count(), 2);
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
        use crate::dump::model::{
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
        dump.host = Some(crate::facts::host::HostMemory {
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
                ["evidence", "findings", "kind", "suggestions", "summary"]
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
}
