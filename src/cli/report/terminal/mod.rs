//! The terminal report: a parsed dump as aligned plain-text tables, ANSI colour on request.
//! Pure: identical input gives identical output. The sections are here; `layout` has the
//! styling, wrapping and tables they are drawn with.

use std::fmt::Write as _;

pub mod layout;

use super::model::{group_holders, shown_frames, Occasion, Recovery, ReportModel, RequestView};
use super::ReportOptions;
use dump::model::{Dump, Frame};
use dump::units::{
    bytes_with_exact, clean, human_age, human_bytes, percent, thousands, truncate_function,
    truncate_left, truncate_middle,
};
use layout::{kv, plural, wrap, Align, Style, Table};

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
    by_kind(&mut out, &s, dump);
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
        "{} {} distinct among the last {}; {} distinct of {} ≥ {}; most frequent: {}",
        s.title("Request sizes:"),
        thousands(r.distinct),
        plural(r.window, "request", "requests"),
        thousands(r.distinct_large),
        plural(r.large, "request", "requests"),
        human_bytes(r.large_bytes),
        top.join(", ")
    );
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
    for view in &model.devices {
        if let Some(cap) = &view.device.memory_cap {
            let _ = writeln!(
                out,
                "  device {}: TOTAL and FREE are those of {}",
                view.device.index,
                clean(&dump::view::cap_phrase(view.device.index, cap))
            );
        }
    }
}

/// Device memory by library, and what the untracked part is made of (absent in dumps without
/// `library_memory`).
/// The failing device by kind of memory (torch's parameters, gradients, optimizer state,
/// activations, cache; outside torch; other processes; free), a bar per kind against the
/// device's total, and where the framework failed.
fn by_kind(out: &mut String, s: &Style, dump: &Dump) {
    let Some((device, rows)) = dump::view::kind_rows(dump) else {
        return;
    };
    let k = dump
        .framework
        .as_ref()
        .and_then(|f| f.kinds.as_ref())
        .expect("kind_rows has kinds");
    let total: u64 = rows.iter().map(|r| r.bytes).fold(0, u64::saturating_add);
    let _ = writeln!(out, "\n{}", s.title(&format!("By kind (device {device})")));
    let mut t = Table::new(&[
        ("KIND", Align::Left),
        ("BYTES", Align::Right),
        ("SHARE", Align::Right),
        ("", Align::Left),
    ]);
    for r in &rows {
        let bar = if total == 0 {
            0
        } else {
            ((r.bytes as u128 * BAR as u128).div_ceil(total as u128)) as usize
        };
        t.row(
            vec![
                r.label.to_string(),
                human_bytes(r.bytes),
                percent(dump::units::share(r.bytes, total)),
                "#".repeat(bar.min(BAR)),
            ],
            vec![],
        );
    }
    t.render(out, s);
    for m in k.models.iter().take(4) {
        let dtypes: Vec<String> = m
            .dtypes
            .iter()
            .map(|(d, b)| format!("{} {}", clean(d), human_bytes(*b)))
            .collect();
        let _ = writeln!(
            out,
            "  model {}: {} of parameters ({}){}",
            truncate_middle(&clean(&m.class), MAX_CELL),
            human_bytes(m.bytes),
            dtypes.join(", "),
            match m.duplicate_of.and_then(|j| k.models.get(j)) {
                Some(first) => format!(
                    "; same parameter shapes as {}: a second copy",
                    truncate_middle(&clean(&first.class), MAX_CELL)
                ),
                None => String::new(),
            }
        );
    }
    for o in k.optimizers.iter().take(4) {
        let _ = writeln!(
            out,
            "  optimizer {}: {} of state for {} of parameters",
            truncate_middle(&clean(&o.class), MAX_CELL),
            human_bytes(o.bytes),
            human_bytes(o.param_bytes)
        );
    }
    let phase = k.phase.as_deref().map(clean).unwrap_or_else(|| "-".into());
    let module = k
        .module
        .as_ref()
        .map(|m| {
            format!(
                ", module {}{}",
                truncate_middle(&clean(&m.class), MAX_CELL),
                m.path
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .map(|p| format!(" at {}", truncate_left(&clean(p), MAX_FILE)))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let batch = k.batch.map(|b| format!(", batch {b}")).unwrap_or_default();
    let _ = writeln!(out, "  phase: {phase}{module}{batch}");
    if !k.complete {
        let _ = writeln!(out, "  (counted in part: the hook's time budget ran out)");
    }
}

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

/// The largest holders, identical ones (same size, API, device and stack) as one row
/// `count × size`, as the HTML page groups them; `top` counts rows.
fn holders(out: &mut String, s: &Style, model: &ReportModel, top: usize) {
    let all = &model.holders;
    let groups = group_holders(all);
    let shown = groups.len().min(top);
    let listed = if groups.len() == all.len() {
        format!("{} listed in the dump", shown_of(shown, all.len()))
    } else {
        format!(
            "{} listed in the dump, identical ones grouped: {}",
            thousands(all.len() as u64),
            if shown == groups.len() {
                plural(groups.len() as u64, "row", "rows")
            } else {
                format!(
                    "top {} of {} rows",
                    thousands(shown as u64),
                    thousands(groups.len() as u64)
                )
            }
        )
    };
    let _ = writeln!(
        out,
        "\n{} {}",
        s.title("Largest holders"),
        s.dim(&format!(
            "({listed}; {})",
            plural(
                model.dump.recording.live_allocations,
                "live allocation",
                "live allocations"
            )
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
    // The COUNT × SIZE column only where some row is a group.
    let grouped = groups.iter().take(shown).any(|g| g.count > 1);
    let mut columns = vec![("#", Align::Right), ("BYTES", Align::Right)];
    if grouped {
        columns.push(("COUNT × SIZE", Align::Right));
    }
    columns.extend([
        ("API", Align::Left),
        ("DEV", Align::Right),
        ("AGE", Align::Right),
        ("ADDRESS", Align::Left),
        ("STACK", Align::Left),
    ]);
    let mut t = Table::new(&columns);
    for (i, g) in groups.iter().take(shown).enumerate() {
        let h = g.first;
        let mut frames = stack_lines(&h.stack);
        let first = frames.remove(0);
        let (each, age, address) = if g.count == 1 {
            (
                human_bytes(h.bytes),
                human_age(h.age_s),
                truncate_middle(&clean(&h.address), MAX_CELL),
            )
        } else {
            let (young, old) = (human_age(g.age_min_s), human_age(g.age_max_s));
            (
                format!("{} × {}", thousands(g.count), human_bytes(h.bytes)),
                if young == old {
                    old
                } else {
                    format!("{young}–{old}")
                },
                format!("{} (first)", truncate_middle(&clean(&h.address), MAX_CELL)),
            )
        };
        let mut cells = vec![(i + 1).to_string(), human_bytes(g.bytes)];
        if grouped {
            cells.push(each);
        }
        cells.extend([
            truncate_middle(&clean(&h.api), MAX_CELL),
            h.device.to_string(),
            age,
            address,
            first,
        ]);
        t.row(cells, frames);
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
    use dump::model::Relation;
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
    let v = oomshim_core::facts::env::version_text;
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
        if !k.starts_with(oomshim_core::facts::env::ALLOWED_PREFIX) {
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
