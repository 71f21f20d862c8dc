//! What the `oomshim` subcommands do; `src/bin/oomshim.rs` only parses arguments and calls in.
//! Reporters read dump files only: nothing here touches a live process except `run`/`demo`,
//! which start one.

pub mod demo;
pub mod run;

use std::path::Path;

/// Exit code for unreadable or invalid input files.
pub const EXIT_BAD_INPUT: i32 = 2;

/// `oomshim report`: prints a dump as text or as the JSON report model.
pub fn report(path: &Path, top: usize, json: bool, color: bool) -> Result<String, String> {
    let dump = crate::dump::read::read_dump(path).map_err(|e| e.to_string())?;
    let opts = crate::report::ReportOptions { top, color };
    if json {
        let value = crate::report::render_json(&dump, &opts);
        serde_json::to_string_pretty(&value)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    } else {
        Ok(crate::report::render_terminal(&dump, &opts))
    }
}
