//! How much a report shows and how: the options every reporter takes, the terminal's layout and
//! its widths, the frames shown per holder or site.

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
