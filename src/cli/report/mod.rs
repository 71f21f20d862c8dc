//! Reporters: pure functions from a parsed dump to text ([`terminal`]), the machine-readable
//! JSON report ([`json`], [`render_json`]) and one HTML page ([`html`]). All three render one
//! [`model::ReportModel`], derived from the dump once; [`units`] formats sizes and text.
//!
//! The report shows the verdict as [`oomshim_core::verdict::judge`] finds it now (the rules may be newer
//! than the shim that wrote the dump); the verdict stored in the dump is kept in the JSON report
//! as `recorded_verdict`.

pub mod diff;
pub mod export;
pub mod glance;
pub mod html;
pub mod json;
pub mod merge;
pub mod merge_html;
pub mod model;
pub mod terminal;
pub mod torch_cache;
pub mod why_rank;

pub use json::render_json;
pub use model::ReportModel;
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

/// How the terminal report is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Columns the report is wrapped to (from [`MIN_WIDTH`] to [`MAX_WIDTH`]): the terminal's
    /// width, [`DEFAULT_WIDTH`] when the output is no terminal, or `--width`.
    pub width: usize,
    /// The dump as the user named it (`None`: the default directory), for the command lines
    /// the report suggests.
    pub source: Option<String>,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            width: DEFAULT_WIDTH,
            source: None,
        }
    }
}

/// The terminal report's width when the output is no terminal.
pub const DEFAULT_WIDTH: usize = 80;
/// The narrowest terminal report: below this the tables cannot be aligned.
pub const MIN_WIDTH: usize = 60;
/// The widest: beyond this a line is no longer read as one.
pub const MAX_WIDTH: usize = 400;

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            top: 10,
            color: false,
        }
    }
}

/// Frames shown per holder or site.
pub const FRAMES_SHOWN: usize = 3;

/// What the failed request's `recovered` means, as one word: `recovered`, `stood`, `unknown`.
pub fn recovery_word(recovered: Option<bool>) -> &'static str {
    model::Recovery::from_recovered(recovered).word()
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
