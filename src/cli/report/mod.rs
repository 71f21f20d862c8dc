//! Reporters: pure functions from a parsed dump to text ([`terminal`]), the machine-readable
//! JSON report ([`json`], [`render_json`]) and one HTML page ([`html`]). All three render one
//! [`model::ReportModel`], derived from the dump once; [`units`] formats sizes and text.
//!
//! The report shows the verdict as [`oomshim_core::verdict::judge`] finds it now (the rules may be newer
//! than the shim that wrote the dump); the verdict stored in the dump is kept in the JSON report
//! as `recorded_verdict`.

pub mod diff;
pub mod export;
pub mod html;
pub mod json;
pub mod merge;
pub mod model;
pub mod terminal;
pub mod torch_cache;

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

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            top: 10,
            color: false,
        }
    }
}

/// Frames shown per holder or site.
pub(crate) const FRAMES_SHOWN: usize = 3;

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

/// Test fixtures under `tests/fixtures/` and golden-file comparison. `OOMSHIM_BLESS=1` rewrites
/// the expected files instead of comparing.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::PathBuf;

    use dump::model::Dump;
    use dump::read::read_dump;

    /// Dumps under `tests/fixtures/<name>.json` that have golden reports.
    pub fn fixture_names() -> &'static [&'static str] {
        &[
            "oom_own_allocations",
            "oom_untracked",
            "oom_request_exceeds_device",
            "oom_fragmentation",
            "snapshot",
            "minimal_unavailable",
        ]
    }

    pub fn fixture_path(file: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(file)
    }

    pub fn load_fixture(name: &str) -> Dump {
        let path = fixture_path(&format!("{name}.json"));
        read_dump(&path).unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    /// Compares `actual` with the expected file `tests/fixtures/<file>`; with `OOMSHIM_BLESS=1`
    /// writes `actual` there instead.
    pub fn check_golden(file: &str, actual: &str) {
        let path = fixture_path(file);
        if std::env::var_os("OOMSHIM_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            return;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with OOMSHIM_BLESS=1 to create it)",
                path.display()
            )
        });
        if expected != actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
            panic!(
                "{} differs from the rendered output at line {}:\n  expected: {:?}\n  actual:   {:?}\n\
                 --- actual output ---\n{actual}\n(run with OOMSHIM_BLESS=1 to accept)",
                path.display(),
                first + 1,
                expected.lines().nth(first).unwrap_or("<end>"),
                actual.lines().nth(first).unwrap_or("<end>"),
            );
        }
    }
}

#[cfg(test)]
mod library_frame_tests {
    use dump::model::{Frame, FrameKind};
    use dump::view::*;

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            address: "0x1".into(),
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
            kind: FrameKind::Python,
            ..Frame::default()
        }
    }

    #[test]
    fn sites_are_named_after_the_programs_own_line() {
        let stack = vec![
            Frame {
                address: "0x2".into(),
                function: Some("cudaMalloc".into()),
                ..Frame::default()
            },
            py(
                "relu",
                "/venv/lib/python3.12/site-packages/torch/nn/functional.py",
                1723,
            ),
            py(
                "forward",
                "/venv/lib/python3.12/site-packages/torch/nn/modules/activation.py",
                144,
            ),
            py("train_step", "/home/ada/train.py", 17),
            py("<module>", "/home/ada/train.py", 40),
        ];
        let names: Vec<&str> = named_frames(&stack)
            .map(|f| f.function.as_deref().unwrap())
            .collect();
        assert_eq!(names, ["train_step", "<module>"]);
        // Only library code: it is named as it is.
        let lib_only = &stack[..3];
        assert_eq!(
            named_frames(lib_only).next().unwrap().function.as_deref(),
            Some("relu")
        );
        assert!(is_library_python_frame(&py(
            "f",
            "/usr/lib/python3.11/threading.py",
            1
        )));
        assert!(is_library_python_frame(&py(
            "f",
            "<frozen importlib._bootstrap>",
            1
        )));
        assert!(!is_library_python_frame(&py(
            "f",
            "/srv/python-apps/train.py",
            1
        )));
    }
}

#[cfg(test)]
mod tests {
    use dump::model::{Frame, FrameKind};
    use dump::view::*;

    #[test]
    fn python_frames_name_a_stack_that_has_them() {
        let f = |name: &str, kind: FrameKind| Frame {
            address: "0x1".into(),
            function: Some(name.into()),
            kind,
            ..Frame::default()
        };
        let stack = vec![
            f("simcall_alloc", FrameKind::Native),
            f("forward", FrameKind::Python),
            f("PyObject_Call", FrameKind::Native),
            f("main", FrameKind::Python),
        ];
        let names: Vec<_> = named_frames(&stack)
            .map(|f| f.function.clone().unwrap())
            .collect();
        assert_eq!(names, ["forward", "main"]);
        assert_eq!(
            named_frames(&stack[..1]).count(),
            1,
            "native-only stacks are unchanged"
        );
    }

    #[test]
    fn frame_labels() {
        let f = |function: Option<&str>,
                 file: Option<&str>,
                 line: Option<u32>,
                 module: Option<&str>| Frame {
            address: "0x1".into(),
            function: function.map(Into::into),
            file: file.map(Into::into),
            line,
            module: module.map(Into::into),
            inlined: false,
            kind: Default::default(),
        };
        assert_eq!(
            frame_label(&f(Some("forward"), Some("model.py"), Some(42), None), 80),
            "forward (model.py:42)"
        );
        assert_eq!(
            frame_label(&f(Some("forward"), Some("model.py"), None, None), 80),
            "forward (model.py)"
        );
        assert_eq!(
            frame_label(
                &f(
                    Some("cudaMalloc"),
                    None,
                    None,
                    Some("/usr/lib/libcudart.so.13")
                ),
                80
            ),
            "cudaMalloc [libcudart.so.13]"
        );
        assert_eq!(frame_label(&f(Some("main"), None, None, None), 80), "main");
        let stack = vec![
            f(None, None, None, None),
            f(Some(""), None, None, None),
            f(Some("a"), None, None, None),
        ];
        assert_eq!(named_frames(&stack).count(), 1);
        // CUDA API frames are skipped when a caller is named, kept when nothing else is.
        let api = f(Some("cudaMalloc"), None, None, Some("/x/libcudart.so.13"));
        let static_api = f(Some("cuMemAlloc_v2"), None, None, Some("/opt/app"));
        let shim = f(
            Some("oomshim::ffi::hook"),
            None,
            None,
            Some("/x/liboomshim.so"),
        );
        let user = f(
            Some("alloc_matrix"),
            Some("m.cu"),
            Some(3),
            Some("/opt/app"),
        );
        let stack = vec![shim.clone(), api.clone(), static_api.clone(), user.clone()];
        let names: Vec<_> = named_frames(&stack)
            .map(|f| f.function.clone().unwrap())
            .collect();
        assert_eq!(names, ["alloc_matrix"]);
        let stack = vec![api, static_api];
        assert_eq!(named_frames(&stack).count(), 2);
    }
}
