//! The terminal report: a parsed dump as text, answer first. Its first screen (at most
//! [`FIRST_SCREEN_LINES`] lines) says what failed, what fills the device (a bar by kind where
//! the framework counted its kinds), the verdict's headline, the one change to make and where
//! the details are; the details follow, each once, every line within the report's width.
//! Pure: identical input gives identical output. The sections are here; `layout` has the
//! styling, wrapping and tables they are drawn with.

use std::fmt::Write as _;

pub mod layout;

use super::glance::{self, is_system_frame, SourcePaths};
use super::model::{group_holders, HolderGroup, Recovery, ReportModel, RequestView};
use super::options::{Layout, ReportOptions, MAX_WIDTH, MIN_WIDTH};
use dump::model::{Dump, Frame};
use dump::units::{
    bytes_with_exact, clean, human_age, human_bytes, percent, thousands, truncate_function,
    truncate_left, truncate_middle,
};
use dump::view::named_frames;
use layout::{at_most, fit, kv, plural, wrap, Align, Style, Table};

/// The most lines the answer takes before the details: one screen of a small terminal.
pub const FIRST_SCREEN_LINES: usize = 12;
/// Longest function name in a stack line.
const MAX_FUNCTION: usize = 60;
/// Longest device name, API name or address in a table cell.
const MAX_CELL: usize = 32;
/// Widest histogram bar.
const BAR: usize = 30;
/// Frames shown per stack in the details.
const FRAMES: usize = 3;

/// Renders the whole report. Ends with a newline.
pub fn render_terminal(dump: &Dump, opts: &ReportOptions) -> String {
    render(&ReportModel::new(dump), opts)
}

/// What every section needs: the style, the width, how paths are shown and how the dump was
/// named.
struct Ctx {
    s: Style,
    width: usize,
    paths: SourcePaths,
    source: Option<String>,
}

impl Ctx {
    fn new(model: &ReportModel, opts: &ReportOptions, layout: &Layout) -> Ctx {
        Ctx {
            s: Style { color: opts.color },
            width: layout.width.clamp(MIN_WIDTH, MAX_WIDTH),
            paths: SourcePaths::of(model.dump),
            source: layout.source.clone(),
        }
    }
}

/// [`render_terminal`] of a model already derived, at the default [`Layout`].
pub fn render(model: &ReportModel, opts: &ReportOptions) -> String {
    render_in(model, opts, &Layout::default())
}

/// [`render`] within `layout`; with a torch side file in the model, its description follows
/// the report after a blank line.
pub fn render_in(model: &ReportModel, opts: &ReportOptions, layout: &Layout) -> String {
    let c = Ctx::new(model, opts, layout);
    let dump = model.dump;
    let mut out = String::new();
    let whole = first_screen_into(&mut out, &c, model, false);
    header(&mut out, &c, model);
    verdict(&mut out, &c, model, whole);
    if let Some(request) = &model.failed_request {
        failed_request(&mut out, &c, request);
    }
    by_kind(&mut out, &c, dump);
    devices(&mut out, &c, model);
    libraries(&mut out, &c, dump);
    gpu_processes(&mut out, &c, model, opts.top);
    holders(&mut out, &c, model, opts.top);
    sites(&mut out, &c, model, opts.top);
    out.push('\n');
    pinned(&mut out, &c, dump);
    host(&mut out, &c, dump);
    config(&mut out, &c, dump);
    request_sizes(&mut out, &c, dump);
    free_blocks(&mut out, &c, model);
    recording(&mut out, &c, dump);
    if let Some(torch) = &model.torch_cache {
        out.push('\n');
        for line in super::torch_cache::describe(torch.path, torch.cache).lines() {
            for l in wrap(line, c.width, "", "  ") {
                let _ = writeln!(out, "{l}");
            }
        }
    }
    out
}

/// The report's first screen alone (what `oomshim demo` prints): at most
/// [`FIRST_SCREEN_LINES`] lines.
pub fn first_screen(model: &ReportModel, opts: &ReportOptions, layout: &Layout) -> String {
    let c = Ctx::new(model, opts, layout);
    let mut out = String::new();
    first_screen_into(&mut out, &c, model, true);
    out
}

/// What the first screen showed whole, so that the details repeat only what it had to cut.
#[derive(Clone, Copy)]
struct ShownWhole {
    verdict: bool,
    change: bool,
}

/// Writes the first screen followed by a blank line (`alone`: no details follow, it says where
/// they are); returns what it showed whole.
fn first_screen_into(out: &mut String, c: &Ctx, model: &ReportModel, alone: bool) -> ShownWhole {
    let w = c.width;
    let what = wrap(&glance::occasion_sentence(model), w, "", "  ");
    let mut place = Vec::new();
    if let Some(r) = &model.failed_request {
        let frames: Vec<String> = shown_frames(&r.request.stack)
            .take(2)
            .map(|f| frame_text(&c.paths, f))
            .collect();
        if !frames.is_empty() {
            place.push(fit(&format!("  at {}", frames.join(" ← ")), w));
        }
    }
    let (bar, legend) = fill_lines(c, model);
    let v = &model.verdict;
    let verdict_text = format!("{}: {}", v.kind, c.paths.in_text(&clean(v.headline())));
    let verdict_lines = wrap(&verdict_text, w, "Verdict: ", "  ");
    let change = model.first_change.as_deref();
    let change_lines = change
        .map(|t| wrap(&c.paths.in_text(&clean(t)), w, "Change: ", "  "))
        .unwrap_or_default();
    let report = match &c.source {
        Some(src) => format!("oomshim report {}", shell_word(src)),
        None => "oomshim report".to_string(),
    };
    let details_text = if alone {
        format!("Details: {report} (as a page: --html report.html)")
    } else {
        format!("Details below; as a page: {report} --html report.html")
    };
    let details = wrap(&details_text, w, "", "  ");
    let blocks = [
        &what,
        &place,
        &bar,
        &legend,
        &verdict_lines,
        &change_lines,
        &details,
    ];
    let keep = within_first_screen(&blocks);
    print_first_screen(out, c, &blocks, keep);
    out.push('\n');
    ShownWhole {
        verdict: keep[4] >= verdict_lines.len(),
        change: keep[5] >= change_lines.len(),
    }
}

/// How many lines of each block of the first screen fit in [`FIRST_SCREEN_LINES`]: within the
/// budget, the least telling are cut first. The blocks: what happened, where, the bar, its
/// legend, the verdict, the change, where the details are.
fn within_first_screen(blocks: &[&Vec<String>; 7]) -> [usize; 7] {
    let [what, place, bar, legend, verdict_lines, change_lines, details] = *blocks;
    let mut keep = [
        what.len().min(2),
        place.len(),
        bar.len(),
        legend.len().min(2),
        verdict_lines.len().min(4),
        change_lines.len().min(3),
        details.len().min(2),
    ];
    let cuts: [(usize, usize); 8] = [
        (6, 1),
        (3, 1),
        (1, 0),
        (5, 2),
        (4, 3),
        (0, 1),
        (5, 1),
        (4, 2),
    ];
    for (block, to) in cuts {
        if keep.iter().sum::<usize>() <= FIRST_SCREEN_LINES {
            break;
        }
        keep[block] = keep[block].min(to);
    }
    keep
}

/// The first screen's blocks, `keep` lines of each, the titles styled.
fn print_first_screen(out: &mut String, c: &Ctx, blocks: &[&Vec<String>; 7], keep: [usize; 7]) {
    let (s, w) = (&c.s, c.width);
    for (i, (block, n)) in blocks.iter().zip(keep).enumerate() {
        for (j, line) in at_most(block.to_vec(), n, w).into_iter().enumerate() {
            let styled = match (i, j) {
                (0, 0) => s.title(&line),
                (4, 0) => match line.strip_prefix("Verdict: ") {
                    Some(rest) => {
                        let kind_end = rest.find(':').unwrap_or(0);
                        format!(
                            "{} {}{}",
                            s.title("Verdict:"),
                            s.kind(&rest[..kind_end]),
                            &rest[kind_end..]
                        )
                    }
                    None => line,
                },
                (5, 0) => match line.strip_prefix("Change: ") {
                    Some(rest) => format!("{} {rest}", s.title("Change:")),
                    None => line,
                },
                _ => line,
            };
            let _ = writeln!(out, "{styled}");
        }
    }
}

/// The bar of what fills the device, and its legend (wrapped), within the width.
fn fill_lines(c: &Ctx, model: &ReportModel) -> (Vec<String>, Vec<String>) {
    let Some(fill) = &model.fill else {
        // Without the device's total there is no bar: say what is known.
        let Some(device) = model.focus_device else {
            return (vec![], vec![]);
        };
        let tracked = model
            .dump
            .devices
            .iter()
            .find(|d| d.index == device)
            .map_or(0, |d| d.tracked_bytes);
        return (
            vec![fit(
                &format!(
                    "Device {device}: {} tracked (its total and free bytes are not in the dump)",
                    human_bytes(tracked)
                ),
                c.width,
            )],
            vec![],
        );
    };
    const GLYPHS: [char; 8] = ['█', '▓', '▒', '░', '#', '=', '+', '~'];
    const COLORS: [&str; 8] = ["31", "33", "35", "34", "36", "32", "37", "90"];
    let glyph = |i: usize, key: &str| {
        if key == "free" {
            ('·', "2")
        } else {
            (GLYPHS[i % GLYPHS.len()], COLORS[i % COLORS.len()])
        }
    };
    let label = format!("Device {} ", fill.device);
    let total = format!(" {}", human_bytes(fill.total_bytes));
    let cells = c
        .width
        .saturating_sub(label.len() + total.len() + 2)
        .max(10);
    let widths = bar_cells(
        &fill.rows.iter().map(|r| r.bytes).collect::<Vec<_>>(),
        cells,
    );
    let mut bar = String::new();
    for (i, (row, n)) in fill.rows.iter().zip(&widths).enumerate() {
        let (g, color) = glyph(i, row.key);
        bar.push_str(&c.s.paint(color, &g.to_string().repeat(*n)));
    }
    let bar_line = format!("{}[{bar}]{total}", c.s.title(&label));
    // Entries are packed whole, two spaces apart; each starts with its glyph, coloured as in
    // the bar.
    let mut legend: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut line_w = 0;
    for (i, r) in fill.rows.iter().enumerate() {
        let (g, color) = glyph(i, r.key);
        let text = format!("{} {}", r.label, human_bytes(r.bytes));
        let w = 2 + 2 + text.chars().count();
        if line_w > 0 && line_w + w > c.width {
            legend.push(std::mem::take(&mut line));
            line_w = 0;
        }
        let _ = write!(line, "  {} {text}", c.s.paint(color, &g.to_string()));
        line_w += w;
    }
    legend.push(line);
    (vec![bar_line], legend)
}

/// Cells of a bar of `cells` for parts of `bytes`: proportional, largest remainders first, and
/// at least one cell for every part that holds anything (when there are cells enough).
pub fn bar_cells(bytes: &[u64], cells: usize) -> Vec<usize> {
    let total: u128 = bytes.iter().map(|&b| b as u128).sum();
    if total == 0 {
        return vec![0; bytes.len()];
    }
    let exact: Vec<u128> = bytes.iter().map(|&b| b as u128 * cells as u128).collect();
    let mut n: Vec<usize> = exact.iter().map(|e| (e / total) as usize).collect();
    let mut order: Vec<usize> = (0..bytes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(exact[i] % total));
    let mut left = cells.saturating_sub(n.iter().sum());
    for &i in &order {
        if left == 0 {
            break;
        }
        n[i] += 1;
        left -= 1;
    }
    // A part too small for a cell of its own takes one from the largest part.
    for i in 0..n.len() {
        if bytes[i] > 0 && n[i] == 0 {
            if let Some(big) = (0..n.len()).max_by_key(|&j| n[j]).filter(|&j| n[j] > 1) {
                n[big] -= 1;
                n[i] = 1;
            }
        }
    }
    n
}

/// A line of prose (a `Title: text` line or a paragraph), wrapped within the width.
fn prose(out: &mut String, c: &Ctx, title: &str, text: &str) {
    let lines = wrap(text, c.width, &format!("{title} "), "  ");
    for (i, line) in lines.iter().enumerate() {
        if i == 0 && !title.is_empty() {
            let _ = writeln!(out, "{}{}", c.s.title(title), &line[title.len()..]);
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// A `  key      value` line, its value wrapped under itself.
fn kv_wrapped(out: &mut String, c: &Ctx, key: &str, value: &str) {
    let lines = wrap(value, c.width.saturating_sub(12), "", "");
    let mut first = String::new();
    kv(
        &mut first,
        &c.s,
        key,
        lines.first().map_or("", String::as_str),
    );
    out.push_str(&first);
    for line in &lines[1..] {
        let _ = writeln!(out, "            {line}");
    }
}

/// One line on the recent request sizes (many distinct large sizes: dynamic shapes).
fn request_sizes(out: &mut String, c: &Ctx, dump: &Dump) {
    let Some(r) = &dump.request_sizes else { return };
    let top: Vec<String> = r
        .top
        .iter()
        .take(3)
        .map(|c| format!("{} ×{}", human_bytes(c.bytes), thousands(c.count)))
        .collect();
    let text = format!(
        "{} distinct among the last {}; {} distinct of {} ≥ {}; most frequent: {}",
        thousands(r.distinct),
        plural(r.window, "request", "requests"),
        thousands(r.distinct_large),
        plural(r.large, "request", "requests"),
        human_bytes(r.large_bytes),
        top.join(", ")
    );
    prose(out, c, "Request sizes:", &text);
}

/// What the dump is of: when, which process, which command. The first screen said what
/// happened; this says where.
fn header(out: &mut String, c: &Ctx, model: &ReportModel) {
    let dump = model.dump;
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
    let _ = writeln!(out, "{}", c.s.title("Dump"));
    kv_wrapped(out, c, "reason", &clean(&dump.reason));
    kv_wrapped(out, c, "time", &clean(&dump.time));
    kv_wrapped(out, c, "process", &process);
    kv_wrapped(out, c, "command", &command);
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

fn failed_request(out: &mut String, c: &Ctx, view: &RequestView) {
    let r = view.request;
    let _ = writeln!(out, "\n{}", c.s.title("Failed request"));
    kv_wrapped(out, c, "size", &bytes_with_exact(r.bytes));
    kv_wrapped(
        out,
        c,
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
    kv_wrapped(out, c, "outcome", outcome);
    let mut burst = plural(r.failures_in_burst.into(), "failure", "failures");
    if r.recovered_before > 0 {
        // Told here rather than in dumps of their own (see the dump's `recovered_before`).
        let _ = write!(
            burst,
            "; {} just before recovered",
            plural(
                r.recovered_before.into(),
                "earlier request",
                "earlier requests"
            )
        );
    }
    kv_wrapped(out, c, "burst", &burst);
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
        kv_wrapped(out, c, "last", &text);
    }
    for (i, line) in stack_lines(c, &r.stack, 12).iter().enumerate() {
        if i == 0 {
            kv(out, &c.s, "stack", line.trim_start());
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
}

fn shown_elsewhere(model: &ReportModel, evidence: &str) -> bool {
    model.said_elsewhere.contains(evidence)
}

/// The verdict's explanation: the summary, every finding with its evidence, the evidence, and
/// the suggestions (the first one only when the first screen did not show it whole).
fn verdict(out: &mut String, c: &Ctx, model: &ReportModel, whole: ShownWhole) {
    let v = &model.verdict;
    let s = &c.s;
    let w = c.width;
    let change_shown = whole.change;
    let _ = writeln!(out, "\n{} {}", s.title("Why:"), s.kind(&v.kind));
    // The headline the first screen had to cut, whole (the findings list has it otherwise).
    if !whole.verdict && v.findings.len() <= 1 {
        for line in wrap(&c.paths.in_text(&clean(v.headline())), w, "  ", "  ") {
            let _ = writeln!(out, "{line}");
        }
    }
    for line in wrap(&c.paths.in_text(&v.summary), w, "  ", "  ") {
        let _ = writeln!(out, "{line}");
    }
    // One line for whoever decides whether to resubmit (the reason is in `--json`).
    if let Some(r) = &v.retry {
        let gloss = match r.hint.as_str() {
            oomshim_core::verdict::retry::ELSEWHERE => "the same program fits on a free device",
            oomshim_core::verdict::retry::AFTER_CHANGE => "the same configuration fails again",
            _ => "the dump cannot tell whether a retry fits",
        };
        let _ = writeln!(out, "  {} {} ({gloss})", s.title("Retry:"), clean(&r.hint));
    }
    findings(out, c, model);
    let evidence: Vec<&String> = v
        .evidence
        .iter()
        .filter(|e| !shown_elsewhere(model, e))
        .collect();
    if !evidence.is_empty() {
        let _ = writeln!(out, "  {}", s.title("Evidence"));
        for e in evidence {
            for line in wrap(&c.paths.in_text(e), w, "    - ", "      ") {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    suggestions(out, c, model, change_shown);
}

/// The ranked findings, top first, each with the bytes it explains and its evidence (when the
/// verdict has more than one).
fn findings(out: &mut String, c: &Ctx, model: &ReportModel) {
    let (v, s, w) = (&model.verdict, &c.s, c.width);
    if v.findings.len() > 1 {
        let _ = writeln!(out, "  {}", s.title("Findings (by bytes explained)"));
        for (i, f) in v.findings.iter().enumerate() {
            let head = format!(
                "{}. {} ({}): {}",
                i + 1,
                clean(&f.kind),
                human_bytes(f.bytes),
                c.paths.in_text(&clean(&f.headline))
            );
            for line in wrap(&head, w, "    ", "       ") {
                let _ = writeln!(out, "{line}");
            }
            for e in f.evidence.iter().filter(|e| !shown_elsewhere(model, e)) {
                for line in wrap(&c.paths.in_text(e), w, "       - ", "         ") {
                    let _ = writeln!(out, "{line}");
                }
            }
        }
    }
}

/// The suggestions (the first one only when the first screen did not show it whole), and the
/// verdict the shim recorded when the rules judge otherwise now.
fn suggestions(out: &mut String, c: &Ctx, model: &ReportModel, change_shown: bool) {
    let (v, s, w) = (&model.verdict, &c.s, c.width);
    let first = model.first_change.as_deref();
    let rest: Vec<&String> = v
        .suggestions
        .iter()
        .filter(|t| !(change_shown && Some(t.as_str()) == first))
        .collect();
    if !rest.is_empty() {
        let title = if change_shown && first.is_some() {
            "Other suggestions"
        } else {
            "Suggestions"
        };
        let _ = writeln!(out, "  {}", s.title(title));
        for e in rest {
            for line in wrap(&c.paths.in_text(e), w, "    - ", "      ") {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    if let Some(recorded) = model.recorded_verdict_if_different() {
        let _ = writeln!(
            out,
            "  {}",
            s.dim(&fit(
                &format!(
                    "(the shim recorded verdict {} when it wrote the dump)",
                    truncate_middle(&clean(recorded), 40)
                ),
                w - 2
            ))
        );
    }
}

fn devices(out: &mut String, c: &Ctx, model: &ReportModel) {
    let _ = writeln!(out, "\n{}", c.s.title("Devices"));
    if model.devices.is_empty() {
        let _ = writeln!(out, "  (none recorded)");
        return;
    }
    let mut t = Table::new(&[
        ("DEV", Align::Right),
        ("NAME", Align::Left),
        ("TOTAL", Align::Right),
        ("FREE", Align::Right),
        ("TRACKED", Align::Right),
        ("ALLOCS", Align::Right),
        ("PEAK", Align::Right),
    ])
    .within(c.width, 1);
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
                human_bytes(d.tracked_bytes),
                thousands(d.tracked_count),
                human_bytes(d.peak_tracked_bytes),
            ],
            vec![],
        );
    }
    t.render(out, &c.s);
    for view in &model.devices {
        let Some(uuid) = view.device.uuid.as_deref() else {
            continue;
        };
        let text = format!(
            "device {} is {}",
            view.device.index,
            truncate_middle(&clean(uuid), 64)
        );
        for line in wrap(&text, c.width, "  ", "    ") {
            let _ = writeln!(out, "{line}");
        }
    }
    for view in &model.devices {
        if let Some(cap) = &view.device.memory_cap {
            let text = format!(
                "device {}: TOTAL and FREE are those of {}",
                view.device.index,
                clean(&dump::view::cap_phrase(view.device.index, cap))
            );
            for line in wrap(&text, c.width, "  ", "    ") {
                let _ = writeln!(out, "{line}");
            }
        }
    }
}

/// The failing device by kind of memory (torch's parameters, gradients, optimizer state,
/// activations, cache; outside torch; other processes; free), a bar per kind against the
/// device's total, and where the framework failed.
fn by_kind(out: &mut String, c: &Ctx, dump: &Dump) {
    let Some((device, rows)) = dump::view::kind_rows(dump) else {
        return;
    };
    let k = dump
        .framework
        .as_ref()
        .and_then(|f| f.kinds.as_ref())
        .expect("kind_rows has kinds");
    let total: u64 = rows.iter().map(|r| r.bytes).fold(0, u64::saturating_add);
    let _ = writeln!(
        out,
        "\n{}",
        c.s.title(&format!("By kind (device {device})"))
    );
    let label_w = rows.iter().map(|r| r.label.len()).max().unwrap_or(4).max(4);
    // KIND, BYTES (≤ 11), SHARE (≤ 6) and the gaps; the bar takes what is left, up to BAR.
    let bar_w = c
        .width
        .saturating_sub(2 + label_w + 2 + 11 + 2 + 6 + 2)
        .clamp(8, BAR);
    let mut t = Table::new(&[
        ("KIND", Align::Left),
        ("BYTES", Align::Right),
        ("SHARE", Align::Right),
        ("", Align::Left),
    ])
    .within(c.width, 0);
    for r in &rows {
        let bar = if total == 0 {
            0
        } else {
            ((r.bytes as u128 * bar_w as u128).div_ceil(total as u128)) as usize
        };
        t.row(
            vec![
                r.label.to_string(),
                human_bytes(r.bytes),
                percent(dump::units::share(r.bytes, total)),
                "#".repeat(bar.min(bar_w)),
            ],
            vec![],
        );
    }
    t.render(out, &c.s);
    let mut notes = Vec::new();
    for m in k.models.iter().take(4) {
        let dtypes: Vec<String> = m
            .dtypes
            .iter()
            .map(|(d, b)| format!("{} {}", clean(d), human_bytes(*b)))
            .collect();
        notes.push(format!(
            "model {}: {} of parameters ({}){}",
            truncate_middle(&clean(&m.class), MAX_CELL),
            human_bytes(m.bytes),
            dtypes.join(", "),
            match m.duplicate_of.and_then(|j| k.models.get(j)) {
                Some(first) => format!(
                    "; a copy of the {} above",
                    truncate_middle(&clean(&first.class), MAX_CELL)
                ),
                None => String::new(),
            }
        ));
    }
    notes.extend(dump::view::more_phrases(k));
    for d in dump::view::duplicates(k).iter().take(2) {
        notes.push(dump::view::held_phrase(k, d));
    }
    for o in k.optimizers.iter().take(4) {
        notes.push(format!(
            "optimizer {}: {} of state for {} of parameters",
            truncate_middle(&clean(&o.class), MAX_CELL),
            human_bytes(o.bytes),
            human_bytes(o.param_bytes)
        ));
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
                    .map(|p| format!(" at {}", truncate_left(&clean(p), 48)))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let batch = k.batch.map(|b| format!(", batch {b}")).unwrap_or_default();
    notes.push(format!("phase: {phase}{module}{batch}"));
    if let Some(short) = dump::view::short_phrase(k) {
        notes.push(format!("({short})"));
    }
    for note in notes {
        for line in wrap(&note, c.width, "  ", "    ") {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// Device memory by library, and what the untracked part is made of (absent in dumps without
/// `library_memory`).
fn libraries(out: &mut String, c: &Ctx, dump: &Dump) {
    let Some(l) = &dump.library_memory else {
        return;
    };
    if !l.libraries.is_empty() {
        let _ = writeln!(out, "\n{}", c.s.title("By library"));
        let mut t = Table::new(&[
            ("DEV", Align::Right),
            ("LIBRARY", Align::Left),
            ("BYTES", Align::Right),
            ("ALLOCS", Align::Right),
            ("VIA", Align::Left),
            ("MODULE", Align::Left),
        ])
        .within(c.width, 4);
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
        t.render(out, &c.s);
    }
    for u in &l.untracked {
        let Some(context) = u.context_bytes else {
            continue;
        };
        let text = format!(
            "device {}: {} used = {} tracked + {} CUDA context and unhooked (NVML, this process) + {} other processes + {} that no API shows",
            u.device,
            human_bytes(u.used_bytes),
            human_bytes(u.tracked_bytes),
            human_bytes(context),
            human_bytes(u.other_processes_bytes.unwrap_or(0)),
            human_bytes(u.unexplained_bytes.unwrap_or(0)),
        );
        for line in wrap(&text, c.width, "  ", "    ") {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// The frames a report shows for a stack: named ones (see [`named_frames`]), the C runtime's
/// start-up frames left out unless nothing else names the stack.
fn shown_frames(stack: &[Frame]) -> impl Iterator<Item = &Frame> {
    let own = named_frames(stack).any(|f| !is_system_frame(f));
    named_frames(stack).filter(move |f| !own || !is_system_frame(f))
}

/// A stack's first [`FRAMES`] shown frames, one line each at `indent`, within the width.
fn stack_lines(c: &Ctx, stack: &[Frame], indent: usize) -> Vec<String> {
    let pad = " ".repeat(indent);
    let lines: Vec<String> = shown_frames(stack)
        .take(FRAMES)
        .map(|f| fit(&format!("{pad}{}", frame_text(&c.paths, f)), c.width))
        .collect();
    if lines.is_empty() {
        vec![format!(
            "{pad}{}",
            if stack.is_empty() {
                "(no stack recorded)"
            } else {
                "(no named frames)"
            }
        )]
    } else {
        lines
    }
}

/// `function (file:line)` with the file as [`SourcePaths`] shows it, `function [module]`
/// without a file.
fn frame_text(paths: &SourcePaths, frame: &Frame) -> String {
    let function = truncate_function(
        &clean(frame.function.as_deref().unwrap_or("?")),
        MAX_FUNCTION,
    );
    match (frame.file.as_deref().filter(|f| !f.is_empty()), frame.line) {
        (Some(file), Some(line)) => format!("{function} ({}:{line})", clean(&paths.show(file))),
        (Some(file), None) => format!("{function} ({})", clean(&paths.show(file))),
        (None, _) => match frame.module.as_deref().filter(|m| !m.is_empty()) {
            Some(module) => {
                let base = module.rsplit('/').next().unwrap_or(module);
                format!("{function} [{}]", clean(base))
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
/// `count × size`, as the HTML page groups them; `top` counts rows. Each row's stack follows
/// it, indented.
fn holders(out: &mut String, c: &Ctx, model: &ReportModel, top: usize) {
    let all = &model.holders;
    let groups = group_holders(all);
    let shown = groups.len().min(top);
    section_title(
        out,
        c,
        "Largest holders",
        &holders_note(model, groups.len(), shown),
    );
    if shown == 0 {
        nothing_shown(out, all.is_empty());
        return;
    }
    holders_table(out, c, &groups[..shown]);
}

/// The line of a table that shows no row: none recorded, or `--top 0`.
fn nothing_shown(out: &mut String, none_recorded: bool) {
    let _ = writeln!(
        out,
        "  {}",
        if none_recorded {
            "(none recorded)"
        } else {
            "(not shown)"
        }
    );
}

/// `(12 of 40 listed in the dump; 1,024 live allocations)`, with how identical ones are grouped.
fn holders_note(model: &ReportModel, groups: usize, shown: usize) -> String {
    let all = &model.holders;
    let listed = if groups == all.len() {
        format!("{} listed in the dump", shown_of(shown, all.len()))
    } else {
        format!(
            "{} listed in the dump, identical ones grouped: {}",
            thousands(all.len() as u64),
            if shown == groups {
                plural(groups as u64, "row", "rows")
            } else {
                format!(
                    "top {} of {} rows",
                    thousands(shown as u64),
                    thousands(groups as u64)
                )
            }
        )
    };
    format!(
        "({listed}; {})",
        plural(
            model.dump.recording.live_allocations,
            "live allocation",
            "live allocations"
        )
    )
}

/// The table of the holders' rows shown: bytes, count × size where some row is a group, API,
/// device, age, thread, and each row's frames.
fn holders_table(out: &mut String, c: &Ctx, shown: &[HolderGroup]) {
    // The COUNT × SIZE column only where some row is a group.
    let grouped = shown.iter().any(|g| g.count > 1);
    let mut columns = vec![("#", Align::Right), ("BYTES", Align::Right)];
    if grouped {
        columns.push(("COUNT × SIZE", Align::Right));
    }
    columns.extend([
        ("API", Align::Left),
        ("DEV", Align::Right),
        ("AGE", Align::Right),
        ("THREAD", Align::Left),
    ]);
    let api_column = columns.len() - 4;
    let mut t = Table::new(&columns).within(c.width, api_column);
    for (i, g) in shown.iter().enumerate() {
        let h = g.first;
        let (each, age) = if g.count == 1 {
            (human_bytes(h.bytes), human_age(h.age_s))
        } else {
            let (young, old) = (human_age(g.age_min_s), human_age(g.age_max_s));
            (
                format!("{} × {}", thousands(g.count), human_bytes(h.bytes)),
                if young == old {
                    old
                } else {
                    format!("{young}–{old}")
                },
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
            h.thread_name
                .as_deref()
                .map(|n| truncate_middle(&clean(n), 16))
                .unwrap_or_else(|| h.thread.to_string()),
        ]);
        t.row(cells, vec![]);
        for line in stack_lines(c, &h.stack, 7) {
            t.more(line);
        }
    }
    t.render(out, &c.s);
}

/// A section's title with a dimmed note, the note wrapped onto its own line when both do not
/// fit.
fn section_title(out: &mut String, c: &Ctx, title: &str, note: &str) {
    if title.len() + 1 + note.chars().count() <= c.width {
        let _ = writeln!(out, "\n{} {}", c.s.title(title), c.s.dim(note));
    } else {
        let _ = writeln!(out, "\n{}", c.s.title(title));
        for line in wrap(note, c.width, "  ", "  ") {
            let _ = writeln!(out, "{}", c.s.dim(&line));
        }
    }
}

fn sites(out: &mut String, c: &Ctx, model: &ReportModel, top: usize) {
    let all = &model.sites;
    let shown = all.len().min(top);
    let note = format!(
        "({}; live bytes by allocation stack)",
        shown_of(shown, all.len())
    );
    section_title(out, c, "Allocation sites", &note);
    if shown == 0 {
        nothing_shown(out, all.is_empty());
        return;
    }
    let mut t = Table::new(&[
        ("#", Align::Right),
        ("BYTES", Align::Right),
        ("ALLOCS", Align::Right),
        ("TRACKED%", Align::Right),
    ]);
    for (i, view) in all.iter().take(shown).enumerate() {
        let site = view.site;
        t.row(
            vec![
                (i + 1).to_string(),
                human_bytes(site.bytes),
                thousands(site.count),
                percent(view.percent_of_tracked),
            ],
            vec![],
        );
        for line in stack_lines(c, &site.stack, 7) {
            t.more(line);
        }
    }
    t.render(out, &c.s);
}

fn pinned(out: &mut String, c: &Ctx, dump: &Dump) {
    let p = &dump.pinned_host;
    let text = format!(
        "{} in {} (peak {}); host memory, not counted as device memory",
        human_bytes(p.bytes),
        plural(p.count, "allocation", "allocations"),
        human_bytes(p.peak_bytes)
    );
    prose(out, c, "Pinned host memory:", &text);
}

/// Processes NVML lists on the device (absent in dumps without them): the `top` largest, and
/// this process wherever it ranks; the rest are counted, not listed (a shared node can list
/// thousands).
fn gpu_processes(out: &mut String, c: &Ctx, model: &ReportModel, top: usize) {
    use dump::model::Relation;
    let Some(view) = &model.gpu_processes else {
        return;
    };
    let g = view.list;
    let _ = writeln!(
        out,
        "\n{}",
        c.s.title(&format!("Processes on device {} (NVML)", g.device))
    );
    if let Some(e) = &g.error {
        for line in wrap(&format!("unknown: {}", clean(e)), c.width, "  ", "    ") {
            let _ = writeln!(out, "{line}");
        }
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
        let line = format!(
            "  {:>8}  {:>12}  {:<24} {}",
            p.pid,
            p.used_bytes.map(human_bytes).unwrap_or_else(|| "?".into()),
            truncate_middle(&clean(p.name.as_deref().unwrap_or("-")), 24),
            p.relation.words()
        );
        let _ = writeln!(out, "{}", fit(line.trim_end(), c.width));
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
        let text = format!(
            "… and {} more processes holding {} (--top shows more; --json or --html lists all)",
            thousands(hidden as u64),
            human_bytes(bytes)
        );
        for line in wrap(&text, c.width, "  ", "    ") {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// Host memory when the dump was written (absent in older dumps).
fn host(out: &mut String, c: &Ctx, dump: &Dump) {
    let Some(h) = &dump.host else { return };
    let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "?".into());
    let mut text = format!(
        "{} available of {}; this process's RSS {}",
        opt(h.available_bytes),
        opt(h.total_bytes),
        opt(h.rss_bytes)
    );
    if let Some(limit) = h.cgroup_limit_bytes {
        text.push_str(&format!(
            "; cgroup limit {} (using {})",
            human_bytes(limit),
            opt(h.cgroup_usage_bytes)
        ));
    }
    prose(out, c, "Host memory:", &text);
}

/// The configuration snapshot: CUDA versions and the allowlisted framework variables. The
/// shim's own `OOMSHIM_*` settings stay in the dump (the recording line shows their effect).
fn config(out: &mut String, c: &Ctx, dump: &Dump) {
    let Some(cfg) = &dump.config else { return };
    let mut parts = Vec::new();
    let v = oomshim_core::facts::env::version_text;
    match (cfg.cuda_driver_version, cfg.cuda_runtime_version) {
        (Some(d), Some(r)) => parts.push(format!("CUDA driver {}, runtime {}", v(d), v(r))),
        (Some(d), None) => parts.push(format!("CUDA driver {}", v(d))),
        (None, Some(r)) => parts.push(format!("CUDA runtime {}", v(r))),
        (None, None) => {}
    }
    if let Some(t) = &cfg.torch_version {
        parts.push(format!("torch {}", clean(t)));
    }
    for (k, val) in &cfg.env {
        if !k.starts_with(oomshim_core::facts::env::ALLOWED_PREFIX) {
            parts.push(format!("{}={}", clean(k), clean(val)));
        }
    }
    if parts.is_empty() {
        return;
    }
    prose(out, c, "Configuration:", &parts.join("; "));
}

fn free_blocks(out: &mut String, c: &Ctx, model: &ReportModel) {
    let fb = model.free_blocks.blocks;
    if !model.free_blocks.available {
        let reason = fb
            .reason
            .as_deref()
            .map(clean)
            .unwrap_or_else(|| "no reason given".to_string());
        prose(
            out,
            c,
            "Free blocks:",
            &format!("unavailable ({})", truncate_middle(&reason, 200)),
        );
        return;
    }
    let _ = writeln!(
        out,
        "{} {}",
        c.s.title("Free blocks"),
        c.s.dim(&format!(
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
    let text = format!(
        "total free {}, largest block {}, fragmentation {frag} (1 - largest / total)",
        opt(fb.total_free_bytes),
        opt(fb.largest_free_bytes)
    );
    for line in wrap(&text, c.width, "  ", "    ") {
        let _ = writeln!(out, "{line}");
    }
    if fb.histogram.is_empty() {
        let _ = writeln!(out, "  (no histogram)");
        return;
    }
    let max = fb.histogram.iter().map(|b| b.bytes).max().unwrap_or(0);
    // BLOCK SIZE (≤ 25), BLOCKS (≤ 9), BYTES (≤ 11) and the gaps; the bar takes what is left.
    let bar_w = c
        .width
        .saturating_sub(2 + 25 + 2 + 9 + 2 + 11 + 2)
        .clamp(8, BAR);
    let mut t = Table::new(&[
        ("BLOCK SIZE", Align::Left),
        ("BLOCKS", Align::Right),
        ("BYTES", Align::Right),
        ("", Align::Left),
    ])
    .within(c.width, 0);
    for b in &fb.histogram {
        let bar = if max == 0 {
            0
        } else {
            // Round up so that any non-empty bin shows at least one mark.
            ((b.bytes as u128 * bar_w as u128).div_ceil(max as u128)) as usize
        };
        t.row(
            vec![
                format!("{} - {}", human_bytes(b.lo), human_bytes(b.hi)),
                thousands(b.count),
                human_bytes(b.bytes),
                "#".repeat(bar.min(bar_w)),
            ],
            vec![],
        );
    }
    t.render(out, &c.s);
}

fn recording(out: &mut String, c: &Ctx, dump: &Dump) {
    let r = &dump.recording;
    let version = if r.version.is_empty() {
        "unknown version".to_string()
    } else {
        truncate_middle(&clean(&r.version), 40)
    };
    let text = format!(
        "oomshim {version}, stacks {} (depth {}); {} live, {} recorded in total, {}, {}",
        truncate_middle(&clean(&r.stacks), 20),
        r.depth,
        plural(r.live_allocations, "allocation", "allocations"),
        thousands(r.total_allocations),
        plural(r.unknown_frees, "unknown free", "unknown frees"),
        plural(r.oom_failures, "OOM failure", "OOM failures"),
    );
    prose(out, c, "Recording:", &text);
    if r.unknown_frees > 0 {
        for line in wrap(
            "unknown frees: pointers freed that the shim never saw allocated (allocated before it loaded, or through a path it does not hook)",
            c.width,
            "  ",
            "  ",
        ) {
            let _ = writeln!(out, "{}", c.s.dim(&line));
        }
    }
}
