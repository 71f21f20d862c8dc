//! `oomshim report DUMP --html OUT.html`: one self-contained HTML file (no network: the script
//! and style are inline, the page's Content-Security-Policy forbids every fetch) that shows the
//! verdict, the failed request, the devices, a chart of tracked bytes per step (or second) with
//! the fitted leak line and the device's capacity, an icicle graph of live bytes by stack, sortable
//! tables of holders and sites, and the free-block histogram.
//!
//! The page is a fixed skeleton plus the dump's data as JSON in a
//! `<script type="application/json">` element; the script ([`SCRIPT`], `html/report.js`) builds
//! everything with `createElement`/`textContent`, so no string from the dump (untrusted input) is
//! ever parsed as HTML. In the JSON every `<`, `>` and `&` is written as a `\u00XX` escape, so
//! no `</script>` inside a string can end the element.
//!
//! The payload is a rendering of the [`ReportModel`] (verdict, devices, free blocks, growth
//! capacity are derived there, as for the terminal and JSON reports), written by the JSON
//! report's functions (`json.rs`) wherever the two show the same thing; the page adds its
//! interned stacks and its compact rows.
//!
//! Stacks are interned: the payload has one table of distinct frames and one of distinct stacks
//! (frame indices, innermost first); holders and sites refer to stacks by index and are rows of
//! arrays, so a dump with 100,000 holders stays a few MiB.
//!
//! With the URL hash `#selftest` the page checks itself after rendering (visible verdict, flame
//! zoom, table sort, no script errors) and writes the result as JSON into
//! `<pre id="selftest-result">`; `tests/html.rs` runs it in headless Chromium.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::report::glance::{self, is_system_frame, SourcePaths};
use crate::report::json::{
    device_json, failed_request_json, free_blocks_json, pinned_host_json, process_json,
    recording_json, verdict_json, with,
};
use crate::report::model::{known_age, ReportModel};
use dump::model::{Dump, Frame, FrameKind};
use dump::units::clean;
use dump::view::is_cuda_api_frame;

/// The page's script (vanilla JS, no libraries).
const SCRIPT: &str = include_str!("html/report.js");
/// The page's style sheet.
const STYLE: &str = include_str!("html/report.css");

/// Column order of a holder row in the payload (`holder_columns` in the JSON says it too).
const HOLDER_COLUMNS: [&str; 10] = [
    "bytes",
    "address",
    "api",
    "device",
    "stream",
    "thread",
    "thread_name",
    "age_s",
    "seq",
    "stack",
];
/// Column order of a site row.
const SITE_COLUMNS: [&str; 3] = ["bytes", "count", "stack"];

/// Interns frames and stacks for the payload; keys borrow from the dump.
#[derive(Default)]
struct Interner<'a> {
    /// How files are named to a person (the payload keeps each file whole too).
    paths: SourcePaths,
    frames: Vec<Value>,
    frame_ids: HashMap<FrameKey<'a>, usize>,
    stacks: Vec<Vec<usize>>,
    stack_ids: HashMap<Vec<usize>, usize>,
}

/// What identifies a frame in the page: everything it shows.
#[derive(Hash, PartialEq, Eq)]
struct FrameKey<'a> {
    address: &'a str,
    function: Option<&'a str>,
    file: Option<&'a str>,
    line: Option<u32>,
    module: Option<&'a str>,
    inlined: bool,
    python: bool,
}

impl<'a> Interner<'a> {
    fn frame(&mut self, f: &'a Frame) -> usize {
        let key = FrameKey {
            address: &f.address,
            function: f.function.as_deref(),
            file: f.file.as_deref(),
            line: f.line,
            module: f.module.as_deref(),
            inlined: f.inlined,
            python: f.kind == FrameKind::Python,
        };
        let next = self.frames.len();
        let id = *self.frame_ids.entry(key).or_insert(next);
        if id == next {
            self.frames.push(frame_json(f, &self.paths));
        }
        id
    }

    fn stack(&mut self, stack: &'a [Frame]) -> usize {
        let ids: Vec<usize> = stack.iter().map(|f| self.frame(f)).collect();
        if let Some(&id) = self.stack_ids.get(&ids) {
            return id;
        }
        let id = self.stacks.len();
        self.stacks.push(ids.clone());
        self.stack_ids.insert(ids, id);
        id
    }
}

/// One frame of the payload: `l` the full label (its file named from the program's source
/// root), `s` a short one for flame boxes, `k` `"py"` or `"c"` (native), `n` whether it has a
/// function name, `a` whether it is a CUDA API/runtime frame (dropped from the compact view like
/// the text report does), `y` whether it is a system frame (libc, ld.so, `_start`: folded away by
/// default), `i` inlined, plus the raw fields (the file whole) for the tooltip.
fn frame_json(f: &Frame, paths: &SourcePaths) -> Value {
    let named = f.function.as_deref().is_some_and(|n| !n.trim().is_empty());
    let module_base = f
        .module
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| m.rsplit('/').next().unwrap_or(m));
    let (label, short) = if named {
        let short_fn =
            dump::units::truncate_function(&clean(f.function.as_deref().unwrap_or("")), 60);
        let place = match (f.file.as_deref().filter(|p| !p.is_empty()), f.line) {
            (Some(file), Some(line)) => {
                format!(
                    " ({}:{line})",
                    clean(file.rsplit('/').next().unwrap_or(file))
                )
            }
            (Some(file), None) => format!(" ({})", clean(file.rsplit('/').next().unwrap_or(file))),
            _ => module_base
                .map(|m| format!(" [{}]", clean(m)))
                .unwrap_or_default(),
        };
        let function = clean(f.function.as_deref().unwrap_or(""));
        let label = match (f.file.as_deref().filter(|p| !p.is_empty()), f.line) {
            (Some(file), Some(line)) => format!("{function} ({}:{line})", clean(&paths.show(file))),
            (Some(file), None) => format!("{function} ({})", clean(&paths.show(file))),
            _ => match module_base {
                Some(m) => format!("{function} [{}]", clean(m)),
                None => function,
            },
        };
        (label, format!("{short_fn}{place}"))
    } else {
        let label = match module_base {
            Some(m) => format!("{} [{}]", clean(&f.address), clean(m)),
            None => clean(&f.address),
        };
        (label.clone(), label)
    };
    json!({
        "l": label,
        "s": short,
        "k": if f.kind == FrameKind::Python { "py" } else { "c" },
        "n": named,
        "a": is_cuda_api_frame(f),
        "y": is_system_frame(f),
        "i": f.inlined,
        "fn": f.function,
        "file": f.file,
        "line": f.line,
        "module": f.module,
        "addr": f.address,
    })
}

/// The page's data: everything the script shows, as one JSON value.
pub fn html_payload(dump: &Dump) -> Value {
    payload(&ReportModel::new(dump))
}

/// [`html_payload`] of a model already derived. Holders and sites are in the dump's order (the
/// page sorts its tables itself); stacks are interned in the order they are met: the failed
/// request's, the holders', the sites', the growth sites'.
pub fn payload(model: &ReportModel) -> Value {
    payload_with(model, &SourcePaths::of(model.dump))
}

/// [`payload`] with the source paths already found.
fn payload_with(model: &ReportModel, paths: &SourcePaths) -> Value {
    let dump = model.dump;
    let mut interner = Interner {
        paths: paths.clone(),
        ..Default::default()
    };
    let failed_request = match &model.failed_request {
        None => Value::Null,
        Some(r) => with(
            failed_request_json(r),
            json!({ "stack": interner.stack(&r.request.stack) }),
        ),
    };
    let devices: Vec<Value> = model.devices.iter().map(device_json).collect();
    let holders = holders(dump, &mut interner);
    let sites: Vec<Value> = dump
        .sites
        .iter()
        .map(|s| json!([s.bytes, s.count, interner.stack(&s.stack)]))
        .collect();
    let fb = model.free_blocks.blocks;
    let growth = growth(model, &mut interner);
    json!({
        "schema": dump.schema,
        // The answer, as the terminal report's first screen has it.
        "occasion": glance::occasion_sentence(model),
        "headline": model.verdict.headline(),
        "change": model.first_change,
        "fill": model.fill,
        // Verdict texts name files as the dump has them; the page shows them from this root.
        "source_root": paths.root,
        // Evidence the page shows in another section (the failed request, NVML's error).
        "said_elsewhere": model.said_elsewhere,
        "reason": dump.reason,
        "time": dump.time,
        "process": process_json(dump),
        "verdict": verdict_json(&model.verdict),
        "recorded_verdict_kind": dump.verdict.kind,
        "failed_request": failed_request,
        "devices": devices,
        "pinned_host": pinned_host_json(&dump.pinned_host),
        "holder_columns": HOLDER_COLUMNS,
        "holders": holders,
        "site_columns": SITE_COLUMNS,
        "sites": sites,
        "growth": growth,
        "frames": interner.frames,
        "stacks": interner.stacks,
        "free_blocks": with(free_blocks_json(model), json!({
            "histogram": fb.histogram.iter().map(|b| json!([b.lo, b.hi, b.count, b.bytes])).collect::<Vec<_>>(),
        })),
        // Other processes on the device (NVML); the page shows a table when this is a
        // non-empty array of objects.
        "processes": model.gpu_processes.as_ref().map(|g| g.list.processes.iter().map(|p| json!({
            "pid": p.pid,
            "name": p.name,
            "used_bytes": p.used_bytes,
            "relation": p.relation,
        })).collect::<Vec<_>>()),
        // The failing device by kind (see dump::view::kind_rows); null without kinds.
        "by_kind": dump::view::kind_rows(dump).map(|(device, rows)| json!({
            "device": device,
            "rows": rows,
        })),
        "recording": recording_json(dump),
    })
}

/// Each holder as a row of [`HOLDER_COLUMNS`], its stack interned.
fn holders<'a>(dump: &'a Dump, interner: &mut Interner<'a>) -> Vec<Value> {
    dump.largest_holders
        .iter()
        .map(|h| {
            json!([
                h.bytes,
                h.address,
                h.api,
                h.device,
                h.stream,
                h.thread,
                h.thread_name,
                known_age(h),
                h.seq,
                interner.stack(&h.stack),
            ])
        })
        .collect()
}

/// The growth samples and fits for the chart, the sites' stacks interned; null without growth.
fn growth<'a>(model: &ReportModel<'a>, interner: &mut Interner<'a>) -> Option<Value> {
    model.growth.as_ref().map(|view| {
        let g = view.growth;
        json!({
            "unit": g.unit,
            "steps": g.steps,
            "samples": g.samples,
            "current": g.current,
            "free_bytes": g.free_bytes,
            "projected_oom_step": g.projected_oom_step,
            "capacity_bytes": view.capacity_bytes,
            "tracked": g.tracked.iter().map(|p| json!([p.step, p.bytes])).collect::<Vec<_>>(),
            "sites": g.sites.iter().map(|s| json!({
                "bytes_per_step": s.bytes_per_step,
                "r_squared": if s.r_squared.is_finite() { json!(s.r_squared) } else { Value::Null },
                "samples": s.samples,
                "first": [s.first.step, s.first.bytes],
                "last": [s.last.step, s.last.bytes],
                "projected_oom_step": s.projected_oom_step,
                "stack": interner.stack(&s.stack),
            })).collect::<Vec<_>>(),
        })
    })
}

/// JSON that is safe inside a `<script>` element: `<`, `>`, `&` and the JavaScript line
/// separators U+2028/U+2029 become `\u` escapes (valid JSON, the same value once parsed), so
/// neither `</script>` nor `<!--` can appear in it.
pub fn script_safe_json(value: &Value) -> String {
    let raw = value.to_string();
    let mut out = String::with_capacity(raw.len() + raw.len() / 64);
    for c in raw.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The whole page for `dump`.
pub fn render_html(dump: &Dump) -> String {
    page(&ReportModel::new(dump))
}

/// [`render_html`] of a model already derived.
pub fn page(model: &ReportModel) -> String {
    let paths = SourcePaths::of(model.dump);
    let data = script_safe_json(&payload_with(model, &paths));
    let mut page = String::with_capacity(data.len() + SCRIPT.len() + STYLE.len() + 4096);
    page.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>",
    );
    // The verdict is the page's title too (the script keeps it), escaped as text.
    let title = format!(
        "{}: {} - oomshim",
        model.verdict.kind,
        paths.in_text(model.verdict.headline())
    );
    page.push_str(&escape_text(&dump::units::truncate_middle(
        &clean(&title),
        200,
    )));
    page.push_str("</title>\n<style>\n");
    page.push_str(STYLE);
    page.push_str("</style>\n</head>\n<body>\n");
    page.push_str(SKELETON);
    page.push_str("<script type=\"application/json\" id=\"oomshim-data\">");
    page.push_str(&data);
    page.push_str("</script>\n<script>\n");
    page.push_str(SCRIPT);
    page.push_str("</script>\n</body>\n</html>\n");
    page
}

/// `text` for an HTML text node: `&`, `<`, `>` and `"` escaped.
fn escape_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The static part of the page; the script fills the sections in. The answer comes first: the
/// verdict's headline, what fills the device, the change to make and the growth chart, within
/// the first screen of a laptop's window.
const SKELETON: &str = r#"<header id="top"><div id="occasion"></div><h1 id="headline"></h1><div id="meta"></div></header>
<noscript><p class="warn">This report needs JavaScript to show the dump's data.</p></noscript>
<main>
<section id="answer"></section>
<section id="growth"></section>
<section id="verdict"></section>
<section id="failed"></section>
<section id="devices"></section>
<section id="flame"></section>
<section id="holders"></section>
<section id="sites"></section>
<section id="free-blocks"></section>
<section id="processes" hidden></section>
<section id="recording"></section>
</main>
"#;

/// Writes the page for `dump` to `out` atomically (mode 0600): a temporary file in the same
/// directory is written, synced and renamed over `out`, so readers see the old file or the
/// whole new one.
pub fn write_html(dump: &Dump, out: &Path) -> std::io::Result<()> {
    write_html_with_mode(dump, out, 0o600)
}

/// [`write_html`] with the file's permission bits (the CLI passes the dump's, see
/// `cli::output_mode`), through the one atomic writer every output file goes through.
pub fn write_html_with_mode(dump: &Dump, out: &Path, mode: u32) -> std::io::Result<()> {
    write_page(&ReportModel::new(dump), out, mode)
}

/// [`write_html_with_mode`] of a model already derived.
pub fn write_page(model: &ReportModel, out: &Path, mode: u32) -> std::io::Result<()> {
    dump::write::write_file_atomically(out, page(model).as_bytes(), mode)
}
