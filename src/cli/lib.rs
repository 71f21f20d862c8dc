//! The `oomshim` CLI: what its subcommands do; `src/cli/main.rs` only parses arguments and calls
//! in.
//! Reporters read dump files only: nothing here touches a live process except `run`/`demo`,
//! which start one.

pub mod args;
pub mod demo;
pub mod exporter;
pub mod jobs;
pub mod locate;
pub mod report;
pub mod run;
pub mod supervise;
pub mod testbed;
pub mod textfile;
pub mod top;

use dump::units::clean_path;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Exit code for unreadable or invalid input files.
pub const EXIT_BAD_INPUT: i32 = 2;

/// Permission bits for a file made from the dump at `input` (an HTML report, a pickle): what
/// the dump's owner may do, and no more for anyone else than the dump allows (its read bits).
/// A dump can hold secrets (the command line), so its 0600 must not become a report's 0644;
/// the umask has no say. Owner read/write always, so the file can be replaced later.
pub fn output_mode(input: &Path) -> u32 {
    std::fs::metadata(input)
        .map(|m| 0o600 | (m.mode() & 0o044))
        .unwrap_or(0o600)
}

/// Where the commands that read dumps look when none is named: `OOMSHIM_DIR` when set (where
/// the shim writes them), else `./oomshim-dumps`.
pub fn default_dump_dir() -> std::path::PathBuf {
    std::env::var_os("OOMSHIM_DIR")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(oomshim_core::config::DEFAULT_DIR))
}

/// The dump (or directory) a command reads: the one named, else [`default_dump_dir`], which
/// must then exist.
pub fn dump_or_default(named: Option<&Path>) -> Result<std::path::PathBuf, String> {
    if let Some(p) = named {
        return Ok(p.to_path_buf());
    }
    let dir = default_dump_dir();
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "no dump named and no {} here: name a dump file or a directory of dumps",
            clean_path(&dir)
        ))
    }
}

/// How a report is shown: its options, and whether it is the first screen alone.
#[derive(Debug, Clone, Default)]
pub struct ReportStyle {
    pub top: usize,
    pub json: bool,
    pub color: bool,
    pub width: usize,
    /// Only the answer (the first screen), as `oomshim demo` prints it.
    pub first_screen_only: bool,
}

/// [`report`] of the dump at `path`, named in the report's suggested commands as `named`
/// (`None`: the default directory).
pub fn report_as(path: &Path, named: Option<&Path>, style: &ReportStyle) -> Result<String, String> {
    let dump = dump::read::read_dump(path).map_err(|e| e.to_string())?;
    report_inner(path, dump, style, named)
}

/// `oomshim report`: prints a dump as text or as the JSON report model. PyTorch's own summary of
/// its cache, saved by the `oomshim run` Python hook next to the dump, is merged in when found.
/// `named` is the dump or directory as the user gave it (`None`: the default directory).
pub fn report(named: Option<&Path>, style: &ReportStyle) -> Result<String, String> {
    let path = dump_or_default(named)?;
    with_progress("reading", &path, || {
        let (path, dump) = read_chosen(&path)?;
        report_inner(&path, dump, style, named)
    })
}

/// Writes `text` on stderr; a stderr that cannot be written is not worth failing for (and must
/// never panic, as `eprint!` does).
fn note(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// The dumps a directory may hold (`oomshim-*.json`, torch's side files `oomshim-torch-*`
/// excepted), newest first: by modification time, which is when the shim renamed the dump
/// into place; ties by name, the greater first.
pub fn dump_candidates(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", clean_path(dir)))?;
    let mut found: Vec<_> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("oomshim-")
                && !name.starts_with("oomshim-torch-")
                && name.ends_with(".json")
                && e.file_type().is_ok_and(|t| t.is_file())
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// What a directory given for a dump stands for: its newest dump that can be read, and why each
/// newer one could not (`path: why`), as [`dump_candidates`] orders them.
pub struct Chosen {
    pub path: std::path::PathBuf,
    pub dump: dump::model::Dump,
    pub skipped: Vec<String>,
}

/// The newest readable dump in `dir`. A broken newer one (cut short, not JSON, a wrong schema)
/// is skipped and named in [`Chosen::skipped`], as `merge` lists it under "Not read"; none
/// readable at all is an error naming the first problem.
pub fn newest_readable(dir: &Path) -> Result<Chosen, String> {
    let candidates = dump_candidates(dir)?;
    let mut skipped = Vec::new();
    for path in candidates {
        match dump::read::read_dump(&path) {
            Ok(dump) => {
                return Ok(Chosen {
                    path,
                    dump,
                    skipped,
                })
            }
            Err(e) => skipped.push(e.to_string()),
        }
    }
    match skipped.first() {
        None => Err(format!(
            "no oomshim dumps (oomshim-*.json) in {}",
            clean_path(dir)
        )),
        Some(first) => Err(format!(
            "no readable oomshim dump in {}: {} unreadable, the newest: {}",
            clean_path(dir),
            dump::units::plural(skipped.len() as u64, "dump", "dumps"),
            dump::units::clean(first)
        )),
    }
}

/// The directory of dumps a directory given for one stands for: itself, or, when it holds no
/// dump but has an `oomshim-dumps` directory (`oomshim report .` from where the program ran),
/// that one.
pub fn dumps_dir(dir: &Path) -> std::path::PathBuf {
    let inner = dir.join(oomshim_core::config::DEFAULT_DIR);
    if dump_candidates(dir).is_ok_and(|c| c.is_empty()) && inner.is_dir() {
        inner
    } else {
        dir.to_path_buf()
    }
}

/// `path` read as a dump; for a directory its newest readable dump ([`newest_readable`]),
/// saying on stderr which one it chose and which broken newer ones it skipped. Every command
/// that takes a dump takes a directory through this.
pub fn read_chosen(path: &Path) -> Result<(std::path::PathBuf, dump::model::Dump), String> {
    if !path.is_dir() {
        let dump = dump::read::read_dump(path).map_err(|e| e.to_string())?;
        return Ok((path.to_path_buf(), dump));
    }
    let dir = dumps_dir(path);
    let path = dir.as_path();
    let chosen = newest_readable(path)?;
    let mut text = String::new();
    for why in &chosen.skipped {
        text.push_str(&format!(
            "oomshim: skipped a broken dump: {}\n",
            dump::units::clean(why)
        ));
    }
    text.push_str(&format!(
        "oomshim: the newest {}dump in {}: {}\n",
        if chosen.skipped.is_empty() {
            ""
        } else {
            "readable "
        },
        clean_path(path),
        clean_path(&chosen.path)
    ));
    note(&text);
    Ok((chosen.path, chosen.dump))
}

/// A spinner on stderr while `f` runs, when stderr is a terminal and the dump is large enough
/// for the wait to be felt (tens of MiB of JSON take seconds to parse, symbolise and render).
fn with_progress<R>(what: &str, input: &Path, f: impl FnOnce() -> R) -> R {
    use std::io::IsTerminal;
    let big = std::fs::metadata(input).is_ok_and(|m| m.len() > 32 << 20);
    if !big || !std::io::stderr().is_terminal() {
        return f();
    }
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(format!("{what} {}", clean_path(input)));
    spinner.enable_steady_tick(std::time::Duration::from_millis(100));
    let r = f();
    spinner.finish_and_clear();
    r
}

fn report_inner(
    path: &Path,
    mut dump: dump::model::Dump,
    style: &ReportStyle,
    named: Option<&Path>,
) -> Result<String, String> {
    if let Some(k) = crate::report::torch_cache::kinds_for(path, &dump) {
        crate::report::torch_cache::apply_kinds(&mut dump, k);
    }
    let torch = crate::report::torch_cache::find_for(path, &dump);
    if let Some((_, cache)) = &torch {
        crate::report::torch_cache::apply(&mut dump, cache);
    }
    let mut model = crate::report::ReportModel::new(&dump);
    if let Some((p, cache)) = &torch {
        model = model.with_torch_cache(p, cache);
    }
    let opts = crate::report::ReportOptions {
        top: style.top,
        color: style.color,
    };
    let layout = crate::report::Layout {
        width: style.width,
        source: named.map(|p| p.display().to_string()),
    };
    if style.json {
        serde_json::to_string_pretty(&crate::report::json::render(&model, &opts))
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    } else if style.first_screen_only {
        Ok(crate::report::terminal::first_screen(
            &model, &opts, &layout,
        ))
    } else {
        Ok(crate::report::terminal::render_in(&model, &opts, &layout))
    }
}

/// `-` as an output file: standard output.
pub fn is_stdout(out: &Path) -> bool {
    out == Path::new("-")
}

/// Writes `bytes` to standard output, or to `out` atomically with the permission bits of the
/// dump it was made from.
fn write_output(out: &Path, bytes: &[u8], input: &Path) -> Result<(), String> {
    if is_stdout(out) {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        return match stdout.write_all(bytes).and_then(|_| stdout.flush()) {
            // A reader that went away chose to stop reading.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(format!("cannot write to stdout: {e}"))
            }
            _ => Ok(()),
        };
    }
    dump::write::write_file_atomically(out, bytes, output_mode(input))
        .map_err(|e| format!("cannot write {}: {e}", clean_path(out)))
}

/// `oomshim report DUMP --html OUT`: the self-contained HTML page, written atomically (`-`:
/// to stdout).
pub fn report_html(named: Option<&Path>, out: &Path) -> Result<String, String> {
    let path = dump_or_default(named)?;
    with_progress("rendering", &path, || {
        let (path, dump) = read_chosen(&path)?;
        report_html_inner(&path, dump, out)
    })
}

fn report_html_inner(
    path: &Path,
    mut dump: dump::model::Dump,
    out: &Path,
) -> Result<String, String> {
    if let Some(k) = crate::report::torch_cache::kinds_for(path, &dump) {
        crate::report::torch_cache::apply_kinds(&mut dump, k);
    }
    if let Some((_, cache)) = crate::report::torch_cache::find_for(path, &dump) {
        crate::report::torch_cache::apply(&mut dump, &cache);
    }
    let model = crate::report::ReportModel::new(&dump);
    write_output(out, crate::report::html::page(&model).as_bytes(), path)?;
    if is_stdout(out) {
        return Ok(String::new());
    }
    Ok(format!("wrote {}\n", clean_path(out)))
}

/// The two dumps `oomshim diff` compares: with none named, the two newest of the default
/// directory; with one directory, its two newest; with two, each (a directory: its newest).
/// One dump compared with itself is refused: it can only show nothing.
pub fn diff_pair(
    named: &[std::path::PathBuf],
) -> Result<(dump::model::Dump, dump::model::Dump), String> {
    let (a, b) = match named {
        [] | [_] => {
            let dir = match named.first() {
                Some(p) if !p.is_dir() => {
                    return Err(format!(
                        "diff compares two dumps: name BEFORE and AFTER, or one directory to \
                         compare its two newest ({} is one dump)",
                        clean_path(p)
                    ))
                }
                Some(p) => dumps_dir(p),
                None => dumps_dir(&dump_or_default(None)?),
            };
            let [older, newer] = two_newest_readable(&dir)?;
            note(&format!(
                "oomshim: comparing the two newest dumps in {}: {} → {}\n",
                clean_path(&dir),
                clean_path(&older.0),
                clean_path(&newer.0)
            ));
            (older, newer)
        }
        [before, after] => (read_chosen(before)?, read_chosen(after)?),
        _ => return Err("diff compares two dumps; more were named".to_string()),
    };
    let same = |x: &Path, y: &Path| match (std::fs::canonicalize(x), std::fs::canonicalize(y)) {
        (Ok(x), Ok(y)) => x == y,
        _ => x == y,
    };
    if same(&a.0, &b.0) {
        return Err(format!(
            "BEFORE and AFTER are the same dump ({}): a dump compared with itself shows no \
             change; name two dumps, or one directory to compare its two newest",
            clean_path(&a.0)
        ));
    }
    Ok((a.1, b.1))
}

/// The two newest readable dumps of `dir`, older first.
fn two_newest_readable(dir: &Path) -> Result<[(std::path::PathBuf, dump::model::Dump); 2], String> {
    let mut found = Vec::new();
    for path in dump_candidates(dir)? {
        if let Ok(d) = dump::read::read_dump(&path) {
            found.push((path, d));
            if found.len() == 2 {
                break;
            }
        }
    }
    match <[_; 2]>::try_from(found) {
        Ok([newer, older]) => Ok([older, newer]),
        Err(found) => Err(format!(
            "diff needs two dumps; {} holds {} readable",
            clean_path(dir),
            found.len()
        )),
    }
}

/// `oomshim diff [BEFORE [AFTER]]`: growth and shrinkage by site between two dumps (see
/// [`diff_pair`] for which).
pub fn diff(named: &[std::path::PathBuf], top: usize, json: bool) -> Result<String, String> {
    let (a, b) = diff_pair(named)?;
    let d = crate::report::diff::diff(&a, &b);
    if json {
        let v = crate::report::diff::diff_json(&d, top);
        serde_json::to_string_pretty(&v)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    } else {
        Ok(crate::report::diff::render_diff(&d, top))
    }
}

/// `oomshim merge DIR...`: all ranks' dumps in one table (or JSON, or an HTML page written to
/// `html`, then a line saying where). No dump at all is an error.
pub fn merge(
    dirs: &[std::path::PathBuf],
    options: crate::report::merge::MergeOptions,
    json: bool,
    html: Option<&Path>,
) -> Result<String, String> {
    let m = crate::report::merge::merge_dirs(dirs, options)?;
    if m.rows.is_empty() {
        let names: Vec<String> = dirs.iter().map(|d| clean_path(d)).collect();
        let mut msg = format!("no oomshim dumps in {}", names.join(", "));
        if let Some(p) = m.problems.first() {
            msg.push_str(&format!(
                " ({} unreadable, e.g. {})",
                m.problems.len(),
                dump::units::clean(p)
            ));
        }
        return Err(msg);
    }
    if let Some(out) = html {
        let page = crate::report::merge_html::merge_page(&m);
        if out == Path::new("-") {
            return Ok(page);
        }
        dump::write::write_file_atomically(out, page.as_bytes(), 0o644)
            .map_err(|e| format!("cannot write {}: {e}", clean_path(out)))?;
        return Ok(format!(
            "merge of {} dumps written to {}\n",
            m.rows.len(),
            clean_path(out)
        ));
    }
    if json {
        let v = crate::report::merge::merge_json(&m);
        serde_json::to_string_pretty(&v)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    } else {
        Ok(crate::report::merge::render_merge(&m))
    }
}

/// `oomshim export DUMP --memory-viz OUT`: writes the PyTorch memory snapshot pickle; the file
/// appears whole or not at all (`-`: to stdout, unless stdout is a terminal).
pub fn export_memory_viz(dump: &Path, out: &Path) -> Result<String, String> {
    with_progress("exporting", dump, || export_memory_viz_inner(dump, out))
}

fn export_memory_viz_inner(dump: &Path, out: &Path) -> Result<String, String> {
    use std::io::IsTerminal;
    if is_stdout(out) && std::io::stdout().is_terminal() {
        return Err(
            "--memory-viz -: the pickle is binary; redirect stdout to a file or a pipe".to_string(),
        );
    }
    let (dump, d) = read_chosen(dump)?;
    let dump = dump.as_path();
    let viz = crate::report::export::memory_viz(&d)?;
    write_output(out, &viz.bytes, dump)?;
    let mut note = String::new();
    if let Some(w) = &viz.warning {
        note.push_str(&format!("oomshim: warning: {}\n", dump::units::clean(w)));
    }
    if is_stdout(out) {
        return Ok(note);
    }
    note.push_str(&format!(
        "wrote {} ({}); open it at https://pytorch.org/memory_viz or with torch.cuda._memory_viz\n",
        clean_path(out),
        dump::units::plural(viz.segments as u64, "segment", "segments")
    ));
    Ok(note)
}

/// `oomshim export DUMP --folded OUT`: folded stacks of the dump's sites (`-` writes to stdout).
/// Returns what to print on stderr: where it went, and a warning when the dump's sites do not
/// cover every tracked byte (the rest is one line of its own).
pub fn export_folded(dump: &Path, out: &Path) -> Result<String, String> {
    let (dump, d) = read_chosen(dump)?;
    let dump = dump.as_path();
    let folded = crate::report::export::folded(&d);
    let mut note = String::new();
    if let Some(w) = &folded.warning {
        note.push_str(&format!("oomshim: warning: {}\n", dump::units::clean(w)));
    }
    write_output(out, folded.text.as_bytes(), dump)?;
    if !is_stdout(out) {
        note.push_str(&format!(
            "wrote {} ({}); open it with flamegraph.pl, inferno-flamegraph or https://www.speedscope.app\n",
            clean_path(out),
            dump::units::plural(folded.lines as u64, "stack", "stacks")
        ));
    }
    Ok(note)
}
