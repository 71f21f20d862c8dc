//! Reporters: pure functions from a parsed dump to text ([`terminal`]), the machine-readable
//! JSON report ([`json`], [`render_json`]) and one HTML page ([`html`]). All three render one
//! [`model::ReportModel`], derived from the dump once; [`units`] formats sizes and text.
//!
//! The report shows the verdict as [`oomshim_core::verdict::judge`] finds it now (the rules may be newer
//! than the shim that wrote the dump); the verdict stored in the dump is kept in the JSON report
//! as `recorded_verdict`.

pub mod diff;
pub mod export;
pub mod fill;
pub mod glance;
pub mod html;
pub mod json;
pub mod merge;
pub mod merge_html;
pub mod model;
pub mod options;
pub mod terminal;
pub mod torch_cache;
pub mod why_rank;

pub use glance::post_mortem_words;
pub use json::{render_json, REPORT_SCHEMA};
pub use model::ReportModel;
pub use options::{Layout, ReportOptions, DEFAULT_WIDTH, FRAMES_SHOWN, MAX_WIDTH, MIN_WIDTH};
pub use terminal::render_terminal;
