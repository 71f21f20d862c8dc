//! The JSON report (`oomshim report --json`): the [`ReportModel`] as one JSON value in the
//! documented shape [`REPORT_SCHEMA`]. The HTML page's payload (`html.rs`) is written by the same
//! functions: the process, the failed request, each device, the free blocks and the recording
//! are [`process_json`], [`failed_request_json`], [`device_json`], [`free_blocks_json`] and
//! [`recording_json`], to which each report adds its own keys (the JSON report human-readable
//! sizes and frames, the page an index into its interned stacks); the verdict, last failure and
//! pinned host memory are [`verdict_json`], [`last_failure_json`], [`pinned_host_json`].

use serde_json::{json, Value};

use super::model::{known_age, shown_frames, DeviceView, Occasion, ReportModel, RequestView};
use super::options::ReportOptions;
use dump::model::{Dump, Finding, Frame, LastFailure, PinnedHost, Verdict};
use dump::units::human_bytes;
use dump::view::{frame_label, named_frames};

/// Identifies the layout of [`render_json`]'s output; bumped when a key changes meaning or goes.
pub const REPORT_SCHEMA: &str = "oomshim.report/1";

/// The report model as JSON. Keys (all always present; `null` where unknown):
///
/// - `report`: [`REPORT_SCHEMA`]; `dump_schema`: the dump's `schema`.
/// - `header`: `reason`, `oom` (bool: a failed request is present), `time`, `time_unix_ms`, `pid`,
///   `host`, `command_line` (array), `rank`, `local_rank`, `world_size`, `oomshim_version`.
/// - `post_mortem`: `null`, or the dump's `post_mortem` section as it is (a dump that
///   `oomshim run` reconstructed after its program died: docs/dump-schema.md).
/// - `failed_request`: `null` or `bytes`, `bytes_human`, `api`, `device`, `error_code`,
///   `recovery` (`recovered` | `stood` | `unknown`), `failures_in_burst`, `recovered_before`
///   (requests that recovered just before it, told in its dump), `top_frames`,
///   `last_failure` (`null` or `bytes`, `api`, `time_unix_ms`, `tracked_bytes`, `free_bytes`,
///   `total_bytes`).
/// - `devices[]`: `index`, `name`, `total_bytes`, `free_bytes`, `used_bytes`, `tracked_bytes`,
///   `tracked_count`, `peak_tracked_bytes`, `tracked_percent_of_used`.
/// - `verdict`: `kind`, `summary`, `evidence[]`, `suggestions[]`, `findings[]`, `retry`
///   (`hint`: `elsewhere`, `after_change` or `unknown`, and `reason`; null without a failure)
///   (judged now);
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
/// The dump's keys are documented in docs/dump-schema.md.
pub fn render_json(dump: &Dump, opts: &ReportOptions) -> Value {
    render(&ReportModel::new(dump), opts)
}

/// [`render_json`] of a model already derived; with a torch side file in the model, also
/// `torch_cache_file`: where it was found.
pub fn render(model: &ReportModel, opts: &ReportOptions) -> Value {
    let dump = model.dump;
    let process = &dump.process;
    let verdict = &model.verdict;
    let mut report = json!({
        "report": REPORT_SCHEMA,
        "dump_schema": dump.schema,
        "header": with(process_json(dump), json!({
            "reason": dump.reason,
            "oom": matches!(model.occasion, Occasion::OutOfMemory(_)),
            "time": dump.time,
            "time_unix_ms": dump.time_unix_ms,
            "launcher": process.launcher,
            "job_id": process.job_id,
            "oomshim_version": dump.recording.version,
        })),
        "failed_request": failed_request(model),
        "post_mortem": dump.post_mortem,
        "devices": devices(model),
        "verdict": verdict_json(verdict),
        "recorded_verdict": {
            "kind": dump.verdict.kind,
            "summary": dump.verdict.summary,
            "evidence": dump.verdict.evidence,
            "suggestions": dump.verdict.suggestions,
        },
        "top_holders": holders(model, opts.top),
        "holders_total": dump.largest_holders.len(),
        "top_sites": sites(model, opts.top),
        "sites_total": dump.sites.len(),
        "pinned_host": pinned_host_json(&dump.pinned_host),
        "free_blocks": free_blocks(model),
        "growth": growth_json(model),
        "gpu_processes": dump.gpu_processes,
        "host": dump.host,
        "request_sizes": dump.request_sizes,
        "config": dump.config,
        "pools": dump.pools,
        "vmm": dump.vmm,
        "library_memory": dump.library_memory,
        // The failing device by kind (torch's parameters, gradients, optimizer state,
        // activations, cache; outside torch; other processes; free) and the framework's whole
        // account of the kinds; null when the framework counted none.
        "by_kind": by_kind(dump),
        "recording": with(recording_json(dump), json!({
            "python_merge": dump.recording.python_merge,
        })),
    });
    if let (Some(obj), Some(torch)) = (report.as_object_mut(), &model.torch_cache) {
        // Lossy: a path that is not UTF-8 cannot be a JSON string, and must not stop the report.
        obj.insert(
            "torch_cache_file".into(),
            json!(torch.path.to_string_lossy()),
        );
    }
    report
}

/// The failed request with its size in words and its top frames; null without one.
fn failed_request(model: &ReportModel) -> Value {
    match &model.failed_request {
        None => Value::Null,
        Some(r) => with(
            failed_request_json(r),
            json!({
                "bytes_human": human_bytes(r.request.bytes),
                "top_frames": frames_json(&r.request.stack),
            }),
        ),
    }
}

/// Each device with its UUID and the share of its used memory that is tracked.
fn devices(model: &ReportModel) -> Vec<Value> {
    model
        .devices
        .iter()
        .map(|v| {
            with(
                device_json(v),
                json!({
                    "uuid": v.device.uuid,
                    "tracked_percent_of_used": v.tracked_percent_of_used.map(round1),
                }),
            )
        })
        .collect()
}

/// The `top` largest holders, ranked.
fn holders(model: &ReportModel, top: usize) -> Vec<Value> {
    model
        .holders
        .iter()
        .take(top)
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
                "age_s": known_age(h),
                "address": h.address,
                "seq": h.seq,
                "thread_name": h.thread_name,
                "stack_merge": h.stack_merge,
                "top_frames": frames_json(&h.stack),
            })
        })
        .collect()
}

/// The `top` largest sites, ranked, with their share of the tracked bytes.
fn sites(model: &ReportModel, top: usize) -> Vec<Value> {
    model
        .sites
        .iter()
        .take(top)
        .enumerate()
        .map(|(i, v)| {
            let s = v.site;
            json!({
                "rank": i + 1,
                "bytes": s.bytes,
                "bytes_human": human_bytes(s.bytes),
                "count": s.count,
                "percent_of_tracked": v.percent_of_tracked.map(round1),
                "top_frames": frames_json(&s.stack),
            })
        })
        .collect()
}

/// The free blocks with their histogram, the cache's numbers and the segment map.
fn free_blocks(model: &ReportModel) -> Value {
    let fb = model.free_blocks.blocks;
    with(
        free_blocks_json(model),
        json!({
            "histogram": fb.histogram.iter().map(|b| json!({
                "lo": b.lo, "hi": b.hi, "count": b.count, "bytes": b.bytes,
            })).collect::<Vec<_>>(),
            "reserved_bytes": fb.reserved_bytes,
            "allocated_bytes": fb.allocated_bytes,
            "inactive_split_bytes": fb.inactive_split_bytes,
            "segments": fb.segments,
            "segment_map": fb.segment_map,
            "segment_map_omitted": fb.segment_map_omitted,
        }),
    )
}

/// The failing device by kind and the framework's account of the kinds; null when the
/// framework counted none.
fn by_kind(dump: &Dump) -> Value {
    json!(dump::view::kind_rows(dump).map(|(device, rows)| json!({
        "device": device,
        "rows": rows.iter().map(|r| json!({
            "kind": r.key,
            "label": r.label,
            "bytes": r.bytes,
            "bytes_human": human_bytes(r.bytes),
        })).collect::<Vec<_>>(),
        "kinds": dump.framework.as_ref().and_then(|f| f.kinds.as_ref()),
    })))
}

/// `base` (an object) with the keys of `extra` (an object) added.
pub fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

/// The process that wrote the dump: `pid`, `host`, `command_line`, `rank`, `local_rank`,
/// `world_size` (the JSON report's `header` and the page's `process`).
pub fn process_json(dump: &Dump) -> Value {
    let process = &dump.process;
    json!({
        "pid": process.pid,
        "host": process.host,
        "command_line": process.command_line,
        "rank": process.rank,
        "local_rank": process.local_rank,
        "world_size": process.world_size,
    })
}

/// The failed request, without its stack: `bytes`, `api`, `device`, `error_code`, `recovery`,
/// `failures_in_burst`, `recovered_before`, `last_failure` (both reports' `failed_request`).
pub fn failed_request_json(r: &RequestView) -> Value {
    let req = r.request;
    json!({
        "bytes": req.bytes,
        "api": req.api,
        "device": req.device,
        "error_code": req.error_code,
        "recovery": r.recovery.word(),
        "failures_in_burst": req.failures_in_burst,
        "recovered_before": req.recovered_before,
        "last_failure": req.last_failure.as_ref().map(last_failure_json),
    })
}

/// A device: `index`, `name`, `total_bytes`, `free_bytes`, `used_bytes`, `tracked_bytes`,
/// `tracked_count`, `peak_tracked_bytes` (both reports' `devices[]`).
pub fn device_json(v: &DeviceView) -> Value {
    let d = v.device;
    json!({
        "index": d.index,
        "name": d.name,
        "total_bytes": d.total_bytes,
        "free_bytes": d.free_bytes,
        "used_bytes": v.used_bytes,
        "tracked_bytes": d.tracked_bytes,
        "tracked_count": d.tracked_count,
        "peak_tracked_bytes": d.peak_tracked_bytes,
    })
}

/// The free blocks, without their histogram: `source`, `available`, `reason`,
/// `total_free_bytes`, `largest_free_bytes`, `fragmentation` (both reports' `free_blocks`).
pub fn free_blocks_json(model: &ReportModel) -> Value {
    let fb = model.free_blocks.blocks;
    json!({
        "source": fb.source,
        "available": model.free_blocks.available,
        "reason": fb.reason,
        "total_free_bytes": fb.total_free_bytes,
        "largest_free_bytes": fb.largest_free_bytes,
        "fragmentation": model.free_blocks.fragmentation,
    })
}

/// How the dump was recorded: `version`, `stacks`, `python`, `depth`, `unknown_frees`,
/// `live_allocations`, `total_allocations`, `oom_failures` (both reports' `recording`).
pub fn recording_json(dump: &Dump) -> Value {
    let r = &dump.recording;
    json!({
        "version": r.version,
        "stacks": r.stacks,
        "python": r.python,
        "depth": r.depth,
        "unknown_frees": r.unknown_frees,
        "live_allocations": r.live_allocations,
        "total_allocations": r.total_allocations,
        "oom_failures": r.oom_failures,
    })
}

/// The verdict judged now: `kind`, `summary`, `evidence`, `suggestions`, the ranked
/// `findings` and the `retry` hint (`hint`, `reason`; null without a failure) (the JSON
/// report's and the page's `verdict`).
pub fn verdict_json(verdict: &Verdict) -> Value {
    json!({
        "kind": verdict.kind,
        "summary": verdict.summary,
        "evidence": verdict.evidence,
        "suggestions": verdict.suggestions,
        "findings": findings_json(&verdict.findings),
        "retry": verdict.retry.as_ref().map(|r| json!({"hint": r.hint, "reason": r.reason})),
    })
}

/// The failure before the one that wrote the dump (the JSON report's and the page's
/// `failed_request.last_failure`).
pub(crate) fn last_failure_json(lf: &LastFailure) -> Value {
    json!({
        "bytes": lf.bytes,
        "api": lf.api,
        "time_unix_ms": lf.time_unix_ms,
        "tracked_bytes": lf.tracked_bytes,
        "free_bytes": lf.free_bytes,
        "total_bytes": lf.total_bytes,
    })
}

/// Pinned host memory: `bytes`, `count`, `peak_bytes` (the JSON report's and the page's).
pub fn pinned_host_json(p: &PinnedHost) -> Value {
    json!({
        "bytes": p.bytes,
        "count": p.count,
        "peak_bytes": p.peak_bytes,
    })
}

/// A stack's shown frames (`top_frames`), each with its `label`.
pub fn frames_json(stack: &[Frame]) -> Value {
    Value::Array(
        shown_frames(stack)
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

/// The dump's `growth` for the JSON report: as written, each site with its `top_frames` and
/// `label`, plus the device capacity a chart of it is drawn against.
fn growth_json(model: &ReportModel) -> Value {
    let Some(view) = &model.growth else {
        return Value::Null;
    };
    let g = view.growth;
    let mut v = serde_json::to_value(g).unwrap_or(Value::Null);
    if let Some(sites) = v.get_mut("sites").and_then(Value::as_array_mut) {
        for (site, s) in sites.iter_mut().zip(&g.sites) {
            site["top_frames"] = frames_json(&s.stack);
            site["label"] = json!(named_frames(&s.stack)
                .next()
                .map(|f| frame_label(f, usize::MAX)));
        }
    }
    v["capacity_bytes"] = json!(view.capacity_bytes);
    v
}

/// The ranked findings, each with its rank and human-readable bytes.
fn findings_json(findings: &[Finding]) -> Vec<Value> {
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

/// A percentage with one decimal; `null` when it is not a number.
fn round1(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 10.0).round() / 10.0)
    } else {
        Value::Null
    }
}
