//! The unit tests of the CLI crate (`oomshim_cli`, src/cli), compiled into this one test binary
//! instead of a test harness of their own, which compiled the whole crate a second time for them
//! (the test build's time). Each file holds the tests of one module of src/cli.

mod args;
mod demo;
mod exporter;
mod fixtures;
mod jobs;
mod locate;
mod report;
mod report_diff;
mod report_export;
mod report_fill;
mod report_glance;
mod report_html;
mod report_json;
mod report_library_frame_tests;
mod report_merge;
mod report_model;
mod report_terminal;
mod report_terminal_layout;
mod report_torch_cache;
mod report_why_rank;
mod run;
mod supervise;
