//! The terminal report: a parsed dump as aligned plain-text tables, ANSI colour on request.
//! Pure: identical input gives identical output.

use std::fmt::Write as _;

use super::model::{shown_frames, Occasion, Recovery, ReportModel, RequestView};
use super::units::{
    bytes_with_exact, clean, human_age, human_bytes, percent, thousands, truncate_function,
    truncate_left, truncate_middle, width,
};
use super::ReportOptions;
use crate::dump::model::{Dump, Frame};
use crate::verdict::{
    FRAGMENTATION, OTHER_PROCESSES, OWN_ALLOCATIONS, REQUEST_EXCEEDS_DEVICE, SNAPSHOT,
    UNTRACKED_MEMORY,
};

/// Width that prose (summary, suggestions) is wrapped to.
const WRAP: usize = 100;
/// Longest function name in a table row.
const MAX_FUNCTION: usize = 60;
/// Longest file path in a table row (its end is kept).
const MAX_FILE: usize = 48;
/// Longest device name, API name or address in a table cell.
const MAX_CELL: usize = 32;
/// Width of the histogram bars.
const BAR: usize = 30;

/// Renders the whole report. Ends with a newline.
pub fn render_terminal(dump: &Dump, opts: &ReportOptions) -> String {
    render(&ReportModel::new(dump), opts)
}

/// [`render_terminal`] of a model already derived; with a torch side file in the model, its
/// description follows the report after a blank line.
pub fn render(model: &ReportModel, opts: &ReportOptions) -> String {
    let s = Style { color: opts.color };
    let dump = model.dump;
    let mut out = String::new();
    header(&mut out, &s, model);
    if let Some(request) = &model.failed_request {
        failed_request(&mut out, &s, request);
    }
    verdict(&mut out, &s, model);
    devices(&mut out, &s, model);
    libraries(&mut out, &s, dump);
    gpu_processes(&mut out, &s, model, opts.top);
    holders(&mut out, &s, model, opts.top);
    sites(&mut out, &s, model, opts.top);
    pinned(&mut out, &s, dump);
    host(&mut out, &s, dump);
    config(&mut out, &s, dump);
    request_sizes(&mut out, &s, dump);
    free_blocks(&mut out, &s, model);
    recording(&mut out, &s, dump);
    if let Some(torch) = &model.torch_cache {
        out.push('\n');
        out.push_str(&super::torch_cache::describe(torch.path, torch.cache));
    }
    out
}

/// One line on the recent request sizes (many distinct large sizes: dynamic shapes).
fn request_sizes(out: &mut String, s: &Style, dump: &Dump) {
    let Some(r) = &dump.request_sizes else { return };
    let top: Vec<String> = r
        .top
        .iter()
        .take(3)
        .map(|c| format!("{} ×{}", human_bytes(c.bytes), thousands(c.count)))
        .collect();
    let _ = writeln!(
        out,
        "{} {} distinct among the last {}; {} distinct of {} requests ≥ {}; most frequent: {}",
        s.title("Request sizes:"),
        thousands(r.distinct),
        plural(r.window, "request", "requests"),
        thousands(r.distinct_large),
        thousands(r.large),
        human_bytes(r.large_bytes),
        top.join(", ")
    );
}

/// ANSI styling that is a no-op without colour.
struct Style {
    color: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.color && !text.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
    fn title(&self, text: &str) -> String {
        self.paint("1", text)
    }
    fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    fn kind(&self, kind: &str) -> String {
        let code = match kind {
            REQUEST_EXCEEDS_DEVICE | UNTRACKED_MEMORY | OTHER_PROCESSES => "1;31",
            OWN_ALLOCATIONS
            | FRAGMENTATION
            | crate::verdict::LEAK
            | crate::verdict::FRAMEWORK_CACHE => "1;33",
            SNAPSHOT => "1;36",
            _ => "1",
        };
        self.paint(code, kind)
    }
}

fn header(out: &mut String, s: &Style, model: &ReportModel) {
    let dump = model.dump;
    let what = match model.occasion {
        Occasion::OutOfMemory(r) => format!(
            "out of memory on device {} ({} via {})",
            r.device,
            human_bytes(r.bytes),
            truncate_middle(&clean(&r.api), MAX_CELL)
        ),
        Occasion::PostMortem(pm) => crate::report::post_mortem_words(pm),
        Occasion::OnDemand => format!(
            "on-demand dump ({})",
            truncate_middle(&clean(&dump.reason), 60)
        ),
    };
    let p = &dump.process;
    let mut process = if p.host.is_empty() {
        format!("pid {} (host unknown)", p.pid)
    } else {
        format!("pid {} on {}", p.pid, truncate_middle(&clean(&p.host), 80))
    };
    if let Some(rank) = p.rank {
        let _ = write!(process, ", rank {rank}");
    }
    if let Some(local) = p.local_rank {
        let _ = write!(
            process,
            "{}local rank {local}",
            if p.rank.is_some() { " / " } else { ", " }
        );
    }
    if let Some(world) = p.world_size {
        let _ = write!(process, ", world size {world}");
    }
    if let Some(job) = &p.job_id {
        let _ = write!(process, ", job {}", truncate_middle(&clean(job), 64));
    }
    let command = if p.command_line.is_empty() {
        "(unknown)".to_string()
    } else {
        p.command_line
            .iter()
            .map(|a| shell_word(a))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(out, "{}", s.title(&format!("oomshim report: {what}")));
    kv(out, s, "reason", &clean(&dump.reason));
    kv(out, s, "time", &clean(&dump.time));
    kv(out, s, "process", &process);
    kv(out, s, "command", &command);
}

/// One `  key      value` line of a section.
fn kv(out: &mut String, s: &Style, key: &str, value: &str) {
    let _ = writeln!(
        out,
        "  {}{}  {value}",
        s.dim(key),
        " ".repeat(8usize.saturating_sub(width(key)))
    );
}

/// An argument as a shell would need it, control characters escaped.
fn shell_word(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_alphanumeric() || "-_./=:,+@%^".contains(c));
    if plain {
        clean(arg)
    } else if !arg.is_empty() && !arg.chars().any(|c| "\"$`\\!".contains(c)) {
        format!("\"{}\"", clean(arg))
    } else {
        format!("'{}'", clean(&arg.replace('\'', "'\\''")))
    }
}

fn failed_request(out: &mut String, s: &Style, view: &RequestView) {
    let r = view.request;
    let _ = writeln!(out, "\n{}", s.title("Failed request"));
    kv(out, s, "size", &bytes_with_exact(r.bytes));
    kv(
        out,
        s,
        "call",
        &format!(
            "{} on device {}, error {}",
            truncate_middle(&clean(&r.api), MAX_CELL),
            r.device,
            r.error_code
        ),
    );
    let outcome = match view.recovery {
        Recovery::Recovered => "recovered: a retry succeeded; the program did not see this error",
        Recovery::Stood => "stood: no retry succeeded; the program saw this error",
        Recovery::Unknown => "unknown: the dump was written before a retry could be seen",
    };
    kv(out, s, "outcome", outcome);
    kv(
        out,
        s,
        "burst",
        &plural(r.failures_in_burst.into(), "failure", "failures"),
    );
    if let Some(l) = &r.last_failure {
        let mut text = format!(
            "{} via {}",
            human_bytes(l.bytes),
            truncate_middle(&clean(&l.api), MAX_CELL)
        );
        match (l.free_bytes, l.total_bytes) {
            (Some(free), Some(total)) => {
                let _ = write!(
                    text,
                    ", {} free of {}",
                    human_bytes(free),
                    human_bytes(total)
                );
            }
            (Some(free), None) => {
                let _ = write!(text, ", {} free", human_bytes(free));
            }
            (None, Some(total)) => {
                let _ = write!(text, ", total {}", human_bytes(total));
            }
            (None, None) => {}
        }
        let _ = write!(text, ", {} tracked", human_bytes(l.tracked_bytes));
        kv(out, s, "last", &text);
    }
    let frames = stack_lines(&r.stack);
    for (i, line) in frames.iter().enumerate() {
        if i == 0 {
            kv(out, s, "stack", line);
        } else {
            let _ = writeln!(out, "  {}  {line}", " ".repeat(8));
        }
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

fn verdict(out: &mut String, s: &Style, model: &ReportModel) {
    let v = &model.verdict;
    let _ = writeln!(out, "\n{} {}", s.title("Verdict:"), s.kind(&v.kind));
    for line in wrap(&v.summary, WRAP, "  ", "  ") {
        let _ = writeln!(out, "{line}");
    }
    // The ranked findings, top first, each with the bytes it explains.
    if v.findings.len() > 1 {
        let _ = writeln!(out, "  {}", s.title("Findings (by bytes explained)"));
        for (i, f) in v.findings.iter().enumerate() {
            let head = format!(
                "{}. {} ({}): {}",
                i + 1,
                clean(&f.kind),
                human_bytes(f.bytes),
                clean(&f.headline)
            );
            for line in wrap(&head, WRAP, "    ", "       ") {
                let _ = writeln!(out, "{line}");
            }
            for e in &f.evidence {
                for line in wrap(e, WRAP, "       - ", "         ") {
                    let _ = writeln!(out, "{line}");
                }
            }
        }
    }
    if !v.evidence.is_empty() {
        let _ = writeln!(out, "  {}", s.title("Evidence"));
        for e in &v.evidence {
            for line in wrap(e, WRAP, "    - ", "      ") {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    if !v.suggestions.is_empty() {
        let _ = writeln!(out, "  {}", s.title("Suggestions"));
        for e in &v.suggestions {
            for line in wrap(e, WRAP, "    - ", "      ") {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    if let Some(recorded) = model.recorded_verdict_if_different() {
        let _ = writeln!(
            out,
            "  {}",
            s.dim(&format!(
                "(the shim recorded verdict {} when it wrote the dump)",
                truncate_middle(&clean(recorded), 40)
            ))
        );
    }
}

fn devices(out: &mut String, s: &Style, model: &ReportModel) {
    let _ = writeln!(out, "\n{}", s.title("Devices"));
    if model.devices.is_empty() {
        let _ = writeln!(out, "  (none recorded)");
        return;
    }
    let mut t = Table::new(&[
        ("DEV", Align::Right),
        ("NAME", Align::Left),
        ("TOTAL", Align::Right),
        ("FREE", Align::Right),
        ("USED", Align::Right),
        ("TRACKED", Align::Right),
        ("ALLOCS", Align::Right),
        ("PEAK", Align::Right),
    ]);
    let opt = |v: Option<u64>| v.map(human_bytes).unwrap_or_else(|| "-".to_string());
    for view in &model.devices {
        let d = view.device;
        t.row(
            vec![
                d.index.to_string(),
                d.name
                    .as_deref()
                    .map(|n| truncate_middle(&clean(n), MAX_CELL))
                    .unwrap_or_else(|| "-".into()),
                opt(d.total_bytes),
                opt(d.free_bytes),
                opt(view.used_bytes),
                human_bytes(d.tracked_bytes),
                thousands(d.tracked_count),
                human_bytes(d.peak_tracked_bytes),
            ],
            vec![],
        );
    }
    t.render(out, s);
    for view in &model.devices {
        let Some(uuid) = view.device.uuid.as_deref() else {
            continue;
        };
        let _ = writeln!(
            out,
            "  device {} is {}",
            view.device.index,
            truncate_middle(&clean(uuid), 64)
        );
    }
}

/// Device memory by library, and what the untracked part is made of (absent in dumps without
/// `library_memory`).
fn libraries(out: &mut String, s: &Style, dump: &Dump) {
    let Some(l) = &dump.library_memory else {
        return;
    };
    if !l.libraries.is_empty() {
        let _ = writeln!(out, "\n{}", s.title("By library"));
        let mut t = Table::new(&[
            ("DEV", Align::Right),
            ("LIBRARY", Align::Left),
            ("BYTES", Align::Right),
            ("ALLOCS", Align::Right),
            ("VIA", Align::Left),
            ("MODULE", Align::Left),
        ]);
        for b in &l.libraries {
            t.row(
                vec![
                    b.device.to_string(),
                    truncate_middle(&clean(&b.name), MAX_CELL),
                    human_bytes(b.bytes),
                    thousands(b.count),
                    truncate_middle(&clean(&b.apis.join(", ")), MAX_CELL),
                    b.modules
                        .first()
                        .map(|m| {
                            let file = m.rsplit('/').next().unwrap_or(m);
                            truncate_middle(&clean(file), MAX_CELL)
                        })
                        .unwrap_or_else(|| "-".into()),
                ],
                vec![],
            );
        }
        t.render(out, s);
    }
    for u in &l.untracked {
        let Some(context) = u.context_bytes else {
            continue;
        };
        let _ = writeln!(
            out,
            "  device {}: {} used = {} tracked + {} CUDA context and unhooked (NVML, this process) + {} other processes + {} that no API shows",
            u.device,
            human_bytes(u.used_bytes),
            human_bytes(u.tracked_bytes),
            human_bytes(context),
            human_bytes(u.other_processes_bytes.unwrap_or(0)),
            human_bytes(u.unexplained_bytes.unwrap_or(0)),
        );
    }
}

/// Up to three named frames as table lines: `function (…/file:line)`.
fn stack_lines(stack: &[Frame]) -> Vec<String> {
    let lines: Vec<String> = shown_frames(stack).map(table_frame).collect();
    if lines.is_empty() {
        vec![if stack.is_empty() {
            "(no stack recorded)"
        } else {
            "(no named frames)"
        }
        .to_string()]
    } else {
        lines
    }
}

fn table_frame(frame: &Frame) -> String {
    let function = truncate_function(
        &clean(frame.function.as_deref().unwrap_or("?")),
        MAX_FUNCTION,
    );
    match (frame.file.as_deref().filter(|f| !f.is_empty()), frame.line) {
        (Some(file), Some(line)) => format!(
            "{function} ({}:{line})",
            truncate_left(&clean(file), MAX_FILE)
        ),
        (Some(file), None) => format!("{function} ({})", truncate_left(&clean(file), MAX_FILE)),
        (None, _) => match frame.module.as_deref().filter(|m| !m.is_empty()) {
            Some(module) => {
                let base = module.rsplit('/').next().unwrap_or(module);
                format!("{function} [{}]", truncate_left(&clean(base), MAX_FILE))
            }
            None => function,
        },
    }
}

fn shown_of(shown: usize, total: usize) -> String {
    if shown == total {
        thousands(total as u64)
    } else {
        format!(
            "top {} of {}",
            thousands(shown as u64),
            thousands(total as u64)
        )
    }
}

fn holders(out: &mut String, s: &Style, model: &ReportModel, top: usize) {
    let all = &model.holders;
    let shown = all.len().min(top);
    let _ = writeln!(
        out,
        "\n{} {}",
        s.title("Largest holders"),
        s.dim(&format!(
            "({} listed in the dump; {} live allocations)",
            shown_of(shown, all.len()),
            thousands(model.dump.recording.live_allocations)
        ))
    );
    if shown == 0 {
        let _ = writeln!(
            out,
            "  {}",
            if all.is_empty() {
                "(none recorded)"
            } else {
                "(not shown)"
            }
        );
        return;
    }
    let mut t = Table::new(&[
        ("#", Align::Right),
        ("BYTES", Align::Right),
        ("API", Align::Left),
        ("DEV", Align::Right),
        ("AGE", Align::Right),
        ("ADDRESS", Align::Left),
        ("STACK", Align::Left),
    ]);
    for (i, h) in all.iter().take(shown).enumerate() {
        let mut frames = stack_lines(&h.stack);
        let first = frames.remove(0);
        t.row(
            vec![
                (i + 1).to_string(),
                human_bytes(h.bytes),
                truncate_middle(&clean(&h.api), MAX_CELL),
                h.device.to_string(),
                human_age(h.age_s),
                truncate_middle(&clean(&h.address), MAX_CELL),
                first,
            ],
            frames,
        );
    }
    t.render(out, s);
}

fn sites(out: &mut String, s: &Style, model: &ReportModel, top: usize) {
    let all = &model.sites;
    let shown = all.len().min(top);
    let _ = writeln!(
        out,
        "\n{} {}",
        s.title("Allocation sites"),
        s.dim(&format!(
            "({}; live bytes by allocation stack)",
            shown_of(shown, all.len())
        ))
    );
    if shown == 0 {
        let _ = writeln!(
            out,
            "  {}",
            if all.is_empty() {
                "(none recorded)"
            } else {
                "(not shown)"
            }
        );
        return;
    }
    let mut t = Table::new(&[
        ("#", Align::Right),
        ("BYTES", Align::Right),
        ("ALLOCS", Align::Right),
        ("TRACKED%", Align::Right),
        ("STACK", Align::Left),
    ]);
    for (i, view) in all.iter().take(shown).enumerate() {
        let site = view.site;
        let mut frames = stack_lines(&site.stack);
        let first = frames.remove(0);
        t.row(
            vec![
                (i + 1).to_string(),
                human_bytes(site.bytes),
                thousands(site.count),
                percent(view.percent_of_tracked),
                first,
            ],
            frames,
        );
    }
    t.render(out, s);
}

fn pinned(out: &mut String, s: &Style, dump: &Dump) {
    let p = &dump.pinned_host;
    let _ = writeln!(
        out,
        "\n{} {} in {} (peak {}); host memory, not counted as device memory",
        s.title("Pinned host memory:"),
        human_bytes(p.bytes),
        plural(p.count, "allocation", "allocations"),
        human_bytes(p.peak_bytes)
    );
}

/// Processes NVML lists on the device (absent in dumps without them): the `top` largest, and
/// this process wherever it ranks; the rest are counted, not listed (a shared node can list
/// thousands).
fn gpu_processes(out: &mut String, s: &Style, model: &ReportModel, top: usize) {
    use crate::facts::gpu_processes::Relation;
    let Some(view) = &model.gpu_processes else {
        return;
    };
    let g = view.list;
    let _ = writeln!(
        out,
        "\n{}",
        s.title(&format!("Processes on device {} (NVML)", g.device))
    );
    if let Some(e) = &g.error {
        let _ = writeln!(out, "  unknown: {}", clean(e));
        return;
    }
    if g.processes.is_empty() {
        let _ = writeln!(out, "  none listed");
        return;
    }
    let order = &view.largest_first;
    let top = top.max(1);
    // The largest `top`, and this process wherever it ranks below them.
    let me = order
        .iter()
        .skip(top)
        .position(|p| p.relation == Relation::This)
        .map(|i| i + top);
    let shown = order.iter().take(top).chain(me.map(|i| &order[i]));
    let mut listed = 0;
    for p in shown {
        listed += 1;
        let _ = writeln!(
            out,
            "  {:>8}  {:>12}  {:<24} {}",
            p.pid,
            p.used_bytes.map(human_bytes).unwrap_or_else(|| "?".into()),
            truncate_middle(&clean(p.name.as_deref().unwrap_or("-")), MAX_CELL),
            p.relation.words()
        );
    }
    let hidden = order.len() - listed;
    if hidden > 0 {
        // Saturating, so the order of the sum does not matter.
        let bytes: u64 = order
            .iter()
            .enumerate()
            .skip(top)
            .filter(|&(i, _)| Some(i) != me)
            .map(|(_, p)| p.used_bytes.unwrap_or(0))
            .fold(0u64, u64::saturating_add);
        let _ = writeln!(
            out,
            "  … and {} more processes holding {} (--top shows more; --json or --html lists all)",
            thousands(hidden as u64),
            human_bytes(bytes)
        );
    }
}

/// Host memory when the dump was written (absent in older dumps).
fn host(out: &mut String, s: &Style, dump: &Dump) {
    let Some(h) = &dump.host else { return };
    let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "?".into());
    let mut line = format!(
        "{} {} available of {}; this process's RSS {}",
        s.title("Host memory:"),
        opt(h.available_bytes),
        opt(h.total_bytes),
        opt(h.rss_bytes)
    );
    if let Some(limit) = h.cgroup_limit_bytes {
        line.push_str(&format!(
            "; cgroup limit {} (using {})",
            human_bytes(limit),
            opt(h.cgroup_usage_bytes)
        ));
    }
    let _ = writeln!(out, "{line}");
}

/// The configuration snapshot: CUDA versions and the allowlisted framework variables. The
/// shim's own `OOMSHIM_*` settings stay in the dump (the recording line shows their effect).
fn config(out: &mut String, s: &Style, dump: &Dump) {
    let Some(c) = &dump.config else { return };
    let mut parts = Vec::new();
    let v = crate::facts::env::version_text;
    match (c.cuda_driver_version, c.cuda_runtime_version) {
        (Some(d), Some(r)) => parts.push(format!("CUDA driver {}, runtime {}", v(d), v(r))),
        (Some(d), None) => parts.push(format!("CUDA driver {}", v(d))),
        (None, Some(r)) => parts.push(format!("CUDA runtime {}", v(r))),
        (None, None) => {}
    }
    if let Some(t) = &c.torch_version {
        parts.push(format!("torch {}", clean(t)));
    }
    for (k, val) in &c.env {
        if !k.starts_with(crate::facts::env::ALLOWED_PREFIX) {
            parts.push(format!("{}={}", clean(k), clean(val)));
        }
    }
    if parts.is_empty() {
        return;
    }
    let _ = writeln!(out, "{} {}", s.title("Configuration:"), parts.join("; "));
}

fn free_blocks(out: &mut String, s: &Style, model: &ReportModel) {
    let fb = model.free_blocks.blocks;
    if !model.free_blocks.available {
        let reason = fb
            .reason
            .as_deref()
            .map(clean)
            .unwrap_or_else(|| "no reason given".to_string());
        let _ = writeln!(
            out,
            "{} unavailable ({})",
            s.title("Free blocks:"),
            truncate_middle(&reason, 200)
        );
        return;
    }
    let _ = writeln!(
        out,
        "{} {}",
        s.title("Free blocks"),
        s.dim(&format!(
            "(source: {})",
            truncate_middle(&clean(&fb.source), 40)
        ))
    );
    let opt = |v: Option<u64>| v.map(human_bytes).unwrap_or_else(|| "-".to_string());
    let frag = model
        .free_blocks
        .fragmentation
        .map(|f| percent(Some(f * 100.0)))
        .unwrap_or_else(|| "-".into());
    let _ = writeln!(
        out,
        "  total free {}, largest block {}, fragmentation {frag} (1 - largest / total)",
        opt(fb.total_free_bytes),
        opt(fb.largest_free_bytes)
    );
    if fb.histogram.is_empty() {
        let _ = writeln!(out, "  (no histogram)");
        return;
    }
    let max = fb.histogram.iter().map(|b| b.bytes).max().unwrap_or(0);
    let mut t = Table::new(&[
        ("BLOCK SIZE", Align::Left),
        ("BLOCKS", Align::Right),
        ("BYTES", Align::Right),
        ("", Align::Left),
    ]);
    for b in &fb.histogram {
        let bar = if max == 0 {
            0
        } else {
            // Round up so that any non-empty bin shows at least one mark.
            ((b.bytes as u128 * BAR as u128).div_ceil(max as u128)) as usize
        };
        t.row(
            vec![
                format!("{} - {}", human_bytes(b.lo), human_bytes(b.hi)),
                thousands(b.count),
                human_bytes(b.bytes),
                "#".repeat(bar.min(BAR)),
            ],
            vec![],
        );
    }
    t.render(out, s);
}

fn recording(out: &mut String, s: &Style, dump: &Dump) {
    let r = &dump.recording;
    let version = if r.version.is_empty() {
        "unknown version".to_string()
    } else {
        truncate_middle(&clean(&r.version), 40)
    };
    let _ = writeln!(
        out,
        "{} oomshim {version}, stacks {} (depth {}); {} live, {} recorded in total, {}, {}",
        s.title("Recording:"),
        truncate_middle(&clean(&r.stacks), 20),
        r.depth,
        plural(r.live_allocations, "allocation", "allocations"),
        thousands(r.total_allocations),
        plural(r.unknown_frees, "unknown free", "unknown frees"),
        plural(r.oom_failures, "OOM failure", "OOM failures"),
    );
    if r.unknown_frees > 0 {
        let _ = writeln!(
            out,
            "  {}",
            s.dim("unknown frees: pointers freed that the shim never saw allocated (allocated before it loaded, or through a path it does not hook)")
        );
    }
}

/// Greedy word wrap; words longer than a line stand alone.
fn wrap(text: &str, max: usize, first: &str, rest: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && width(&line) + 1 + width(word) > max {
            lines.push(std::mem::replace(&mut line, rest.to_string()));
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    lines.push(line);
    lines
}

#[derive(Clone, Copy, PartialEq)]
enum Align {
    Left,
    Right,
}

/// A table whose last column is free text (not padded) and may carry continuation lines.
struct Table {
    headers: Vec<(String, Align)>,
    rows: Vec<(Vec<String>, Vec<String>)>,
}

impl Table {
    fn new(headers: &[(&str, Align)]) -> Table {
        Table {
            headers: headers.iter().map(|(h, a)| (h.to_string(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>, more: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push((cells, more));
    }

    fn render(&self, out: &mut String, s: &Style) {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|(h, _)| width(h)).collect();
        for (cells, _) in &self.rows {
            for (w, c) in widths.iter_mut().zip(cells) {
                *w = (*w).max(width(c));
            }
        }
        let line = |cells: Vec<&str>| -> String {
            let mut text = String::from("  ");
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i].saturating_sub(width(cell));
                if i + 1 == n {
                    if self.headers[i].1 == Align::Right {
                        text.push_str(&" ".repeat(pad));
                    }
                    text.push_str(cell);
                } else if self.headers[i].1 == Align::Right {
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad));
                }
            }
            text.trim_end().to_string()
        };
        let header = line(self.headers.iter().map(|(h, _)| h.as_str()).collect());
        let _ = writeln!(out, "{}", s.dim(&header));
        let continuation: usize = 2 + widths[..n - 1].iter().map(|w| w + 2).sum::<usize>();
        for (cells, more) in &self.rows {
            let _ = writeln!(out, "{}", line(cells.iter().map(String::as_str).collect()));
            for extra in more {
                let _ = writeln!(out, "{}{extra}", " ".repeat(continuation));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{check_golden, fixture_names, load_fixture};
    use super::*;
    use crate::dump::model::*;
    use crate::verdict::tests::oom_dump;

    #[test]
    fn libraries_and_the_untracked_split_are_named_in_the_report() {
        let mut dump = load_fixture("oom_untracked");
        dump.library_memory = Some(LibraryMemory {
            source: "stack_modules".into(),
            libraries: vec![LibraryBytes {
                library: "nccl".into(),
                name: "NCCL".into(),
                device: 0,
                bytes: 96 << 20,
                count: 2,
                modules: vec!["/opt/nccl/lib/libnccl.so.2".into()],
                apis: vec!["cudaMalloc".into(), "cuMemCreate".into()],
            }],
            untracked: vec![UntrackedSplit {
                device: 0,
                used_bytes: 70 << 30,
                tracked_bytes: 10 << 30,
                context_bytes: Some(600 << 20),
                other_processes_bytes: Some(59 << 30),
                unexplained_bytes: Some(424 << 20),
            }],
        });
        let text = render_terminal(
            &dump,
            &ReportOptions {
                top: 5,
                color: false,
            },
        );
        let nccl = text.lines().find(|l| l.contains("  NCCL ")).unwrap_or("");
        assert!(
            nccl.contains("96.00 MiB")
                && nccl.contains("cudaMalloc, cuMemCreate")
                && nccl.contains("libnccl.so.2"),
            "{text}"
        );
        assert!(
            text.contains(
                "device 0: 70.00 GiB used = 10.00 GiB tracked + 600.00 MiB CUDA context and unhooked \
                 (NVML, this process) + 59.00 GiB other processes + 424.00 MiB that no API shows"
            ),
            "{text}"
        );
        // Without the section, the report has no such lines.
        dump.library_memory = None;
        let text = render_terminal(
            &dump,
            &ReportOptions {
                top: 5,
                color: false,
            },
        );
        assert!(!text.contains("By library") && !text.contains("no API shows"));
    }

    #[test]
    fn terminal_golden() {
        for name in fixture_names() {
            let dump = load_fixture(name);
            let text = render_terminal(
                &dump,
                &ReportOptions {
                    top: 5,
                    color: false,
                },
            );
            check_golden(&format!("{name}.report.txt"), &text);
            assert!(!text.contains('\x1b'), "{name}: no colour unless asked");
            assert_eq!(
                text,
                render_terminal(
                    &dump,
                    &ReportOptions {
                        top: 5,
                        color: false
                    }
                ),
                "deterministic"
            );
        }
    }

    #[test]
    fn terminal_golden_color() {
        let dump = load_fixture("oom_own_allocations");
        let text = render_terminal(
            &dump,
            &ReportOptions {
                top: 5,
                color: true,
            },
        );
        check_golden("oom_own_allocations.report.color.txt", &text);
        assert!(text.contains("\x1b[1m"));
        // Without the escape codes it is the plain report.
        let plain = strip_ansi(&text);
        assert_eq!(
            plain,
            render_terminal(
                &dump,
                &ReportOptions {
                    top: 5,
                    color: false
                }
            )
        );
    }

    fn strip_ansi(text: &str) -> String {
        let mut out = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn empty_and_unknown_render_without_panicking() {
        let mut dump = oom_dump(1 << 30, None, None, 0);
        dump.devices.clear();
        dump.largest_holders.clear();
        dump.sites.clear();
        dump.process.command_line.clear();
        dump.recording = Recording::default();
        for top in [0, 1, 10] {
            let colored = render_terminal(&dump, &ReportOptions { top, color: true });
            let text = render_terminal(&dump, &ReportOptions { top, color: false });
            assert_eq!(strip_ansi(&colored), text);
            assert!(text.contains("Devices\n  (none recorded)"), "{text}");
            assert!(
                text.contains(
                    "Largest holders (0 listed in the dump; 0 live allocations)\n  (none recorded)"
                ),
                "{text}"
            );
            let _ = super::super::render_json(&dump, &ReportOptions { top, color: false });
        }
    }

    #[test]
    fn hostile_and_extreme_values() {
        let mut dump = oom_dump(u64::MAX, Some(u64::MAX), Some(0), u64::MAX);
        dump.process.host = "evil\x1b]0;pwned\x07host".into();
        dump.process.command_line =
            vec!["python".into(), "it's a\nscript.py".into(), String::new()];
        dump.reason = "\x1b[2J".into();
        let long = "ns::".repeat(200) + "f(int)";
        dump.largest_holders = vec![Holder {
            bytes: u64::MAX,
            address: "0x0".into(),
            api: "\x1b[31mcudaMalloc".into(),
            device: -1,
            stream: None,
            thread: 0,
            thread_name: None,
            age_s: f64::NAN,
            seq: 0,
            stack: vec![
                Frame {
                    address: "0x1".into(),
                    function: Some(long.clone()),
                    file: Some("/".repeat(500)),
                    line: Some(u32::MAX),
                    module: None,
                    inlined: false,
                    kind: Default::default(),
                },
                Frame {
                    address: "0x2".into(),
                    function: None,
                    file: None,
                    line: None,
                    module: None,
                    inlined: false,
                    kind: Default::default(),
                },
            ],
            stack_merge: None,
        }];
        dump.free_blocks = FreeBlocks {
            source: "oomshim-allocator".into(),
            reason: None,
            total_free_bytes: Some(u64::MAX),
            largest_free_bytes: Some(0),
            fragmentation: Some(f64::INFINITY),
            histogram: vec![
                HistogramBin {
                    lo: 0,
                    hi: u64::MAX,
                    count: u64::MAX,
                    bytes: u64::MAX,
                },
                HistogramBin {
                    lo: 0,
                    hi: 0,
                    count: 0,
                    bytes: 0,
                },
            ],
            ..Default::default()
        };
        for color in [false, true] {
            let text = render_terminal(
                &dump,
                &ReportOptions {
                    top: usize::MAX,
                    color,
                },
            );
            assert!(
                !text.contains("\x1b]"),
                "control characters from the dump are escaped"
            );
            assert!(
                !text.contains("\x1b[2J") && !text.contains("\x1b[31mcuda"),
                "{text}"
            );
            assert!(text.contains("python \"it's a\\nscript.py\" ''"), "{text}");
            for line in text.lines() {
                assert!(width(line) < 400, "line too long: {line}");
            }
        }
        let v = super::super::render_json(
            &dump,
            &ReportOptions {
                top: 3,
                color: false,
            },
        );
        assert!(v["top_holders"][0]["age_s"].is_null());
        assert!(v["free_blocks"]["fragmentation"].is_null());
        assert!(serde_json::to_string(&v).is_ok());
    }

    #[test]
    fn wrap_and_table_alignment() {
        assert_eq!(wrap("a b c", 3, "", ""), vec!["a b", "c"]);
        assert_eq!(wrap("", 10, "  ", "  "), vec!["  "]);
        assert_eq!(
            wrap("averyveryverylongword x", 5, "- ", "  "),
            vec!["- averyveryverylongword", "  x"]
        );
        let mut t = Table::new(&[
            ("N", Align::Right),
            ("NAME", Align::Left),
            ("TEXT", Align::Left),
        ]);
        t.row(
            vec!["1".into(), "a".into(), "first".into()],
            vec!["second".into()],
        );
        t.row(vec!["100".into(), "abcdef".into(), "x".into()], vec![]);
        let mut out = String::new();
        t.render(&mut out, &Style { color: false });
        assert_eq!(
            out,
            "    N  NAME    TEXT\n    1  a       first\n               second\n  100  abcdef  x\n"
        );
    }
}
