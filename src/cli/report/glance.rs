//! Words a report shows before its details, the same in the terminal and on the page: what
//! happened, in one sentence, and how stack frames are shown to a person (paths relative to the
//! program's source root, the C runtime's start-up frames as system frames). The JSON report
//! keeps every path as the dump has it. What fills the device and the one change to make are
//! the model's (`model.rs`).

use super::model::{Occasion, ReportModel};
use dump::model::{Dump, Frame, FrameKind};
use dump::view::{is_library_file, named_frames};

/// What happened, in one sentence: the failed request and its outcome, how the program died,
/// or why an on-demand dump was written.
pub fn occasion_sentence(model: &ReportModel) -> String {
    use dump::units::{clean, human_bytes};
    match model.occasion {
        Occasion::OutOfMemory(r) => {
            let outcome = match model.failed_request.map(|v| v.recovery) {
                Some(super::model::Recovery::Recovered) => "a retry succeeded",
                Some(super::model::Recovery::Stood) => "the program saw it",
                _ => "whether a retry succeeded is not known",
            };
            format!(
                "Out of memory on device {}: {} of {} failed; {outcome}.",
                r.device,
                clean(&r.api),
                human_bytes(r.bytes),
            )
        }
        Occasion::PostMortem(pm) => {
            let words = post_mortem_words(pm);
            let mut s = words[..1].to_uppercase();
            s.push_str(&words[1..]);
            s.push('.');
            s
        }
        Occasion::OnDemand => format!(
            "Dump on demand ({}): nothing failed.",
            clean(&model.dump.reason)
        ),
    }
}

/// Whether a frame is the C runtime's or the loader's (libc, ld.so, `_start`,
/// `__libc_start_main`, thread start): present in every native stack, never the program's
/// answer. Reports show them as system frames, folded away by default.
pub fn is_system_frame(frame: &Frame) -> bool {
    if frame.kind == FrameKind::Python {
        return false;
    }
    let module = frame.module.as_deref().unwrap_or("");
    let module = module.rsplit('/').next().unwrap_or(module);
    if module.starts_with("libc.so")
        || module.starts_with("ld-linux")
        || module.starts_with("ld.so")
        || module.starts_with("libpthread")
    {
        return true;
    }
    matches!(
        frame.function.as_deref(),
        Some(
            "_start"
                | "__libc_start_main"
                | "__libc_start_call_main"
                | "__libc_start_main_impl"
                | "start_thread"
                | "clone"
                | "clone3"
                | "__clone"
                | "__clone3"
        )
    )
}

/// How file paths of stack frames are shown to a person: relative to the program's source
/// root where one is known, packages from their `site-packages` directory, anything else as
/// the dump has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePaths {
    /// The directory, ending in `/`, that the program's own files are shown relative to.
    pub root: Option<String>,
}

impl SourcePaths {
    /// The program's source root in `dump`:
    /// - a Python program started as `python DIR/script.py` from its working directory: that
    ///   directory, found as the part of the script frame's absolute path before the relative
    ///   `DIR/script.py` of the command line;
    /// - otherwise the deepest directory holding every file of the program's own frames (the
    ///   frames that name holders, sites and the failed request, installed packages left out).
    pub fn of(dump: &Dump) -> SourcePaths {
        let stacks = dump
            .failed_request
            .iter()
            .map(|r| r.stack.as_slice())
            .chain(dump.largest_holders.iter().map(|h| h.stack.as_slice()))
            .chain(dump.sites.iter().map(|s| s.stack.as_slice()));
        // Distinct files, in the order met (a dump of 100,000 holders has a few hundred).
        let mut seen = std::collections::HashSet::new();
        let mut own: Vec<&str> = Vec::new();
        for stack in stacks {
            for f in named_frames(stack) {
                if let Some(file) = f.file.as_deref() {
                    if file.starts_with('/')
                        && seen.insert(file)
                        && !is_library_file(file)
                        && !is_system_frame(f)
                    {
                        own.push(file);
                    }
                }
            }
        }
        SourcePaths {
            root: working_dir_of_script(dump, &own).or_else(|| common_dir(&own)),
        }
    }

    /// `text` (a verdict's words, which name files as the dump has them) with the source root
    /// left out of every path in it.
    pub fn in_text(&self, text: &str) -> String {
        match self.root.as_deref() {
            Some(root) if root.len() > 1 => text.replace(root, ""),
            _ => text.to_string(),
        }
    }

    /// `file` as a person reads it.
    pub fn show(&self, file: &str) -> String {
        if let Some(rest) = self.root.as_deref().and_then(|r| file.strip_prefix(r)) {
            if !rest.is_empty() {
                return rest.to_string();
            }
        }
        for marker in ["/site-packages/", "/dist-packages/"] {
            if let Some(i) = file.find(marker) {
                return file[i + marker.len()..].to_string();
            }
        }
        file.to_string()
    }
}

/// The working directory of a Python program, from a relative `.py` argument and the absolute
/// path of that script in its frames.
fn working_dir_of_script(dump: &Dump, own: &[&str]) -> Option<String> {
    dump.process
        .command_line
        .iter()
        .filter(|a| a.ends_with(".py") && !a.starts_with('/') && !a.starts_with('-'))
        .find_map(|arg| {
            let arg = arg.trim_start_matches("./");
            own.iter().find_map(|file| {
                let dir = file.strip_suffix(arg)?;
                dir.ends_with('/').then(|| dir.to_string())
            })
        })
}

/// The deepest directory (ending in `/`) that holds every file, when there is one below `/`.
fn common_dir(files: &[&str]) -> Option<String> {
    let first = files.first()?;
    let mut prefix = &first[..first.rfind('/')? + 1];
    for f in &files[1..] {
        while !f.starts_with(prefix) {
            let trimmed = prefix.trim_end_matches('/');
            prefix = &prefix[..trimmed.rfind('/')? + 1];
        }
    }
    (prefix.len() > 1).then(|| prefix.to_string())
}

/// The report's words for a post-mortem dump: reconstructed, how the program died, and how old
/// the state it shows is.
pub fn post_mortem_words(pm: &dump::model::PostMortem) -> String {
    let how = match (&pm.signal_name, pm.exit_code) {
        (Some(name), _) => format!("killed by {}", dump::units::clean(name)),
        (None, Some(code)) => format!("exited with status {code}"),
        _ => "ended".to_string(),
    };
    if pm.generation == 0 {
        // It died before its first live summary: nothing of its state is in the dump.
        return format!(
            "post-mortem dump, reconstructed by oomshim run: the program was {how} before it published any state"
        );
    }
    format!(
        "post-mortem dump, reconstructed by oomshim run: the program was {how}; its state as published {:.1} s before",
        pm.died_unix_ms.saturating_sub(pm.published_unix_ms) as f64 / 1000.0
    )
}
