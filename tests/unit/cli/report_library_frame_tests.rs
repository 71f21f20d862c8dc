//! Unit tests of `oomshim_cli::report` (src/cli/report/mod.rs).

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

/// The module torch.compile generated runs the graph: the site is the program's line that called
/// the compiled model, under inductor's default cache or one moved anywhere.
#[test]
fn code_torch_compile_generated_is_not_the_programs() {
    let generated = [
        "/tmp/torchinductor_ada/oh/coh56zsgghx3wm54icrqrecicbc27bhvoqq6k7zl4luiqtly3php.py",
        "/scratch/cache/oh/coh56zsgghx3wm54icrqrecicbc27bhvoqq6k7zl4luiqtly3php.py",
    ];
    for file in generated {
        let stack = vec![
            py("call", file, 605),
            py("train_step", "/home/ada/train.py", 32),
        ];
        let names: Vec<&str> = named_frames(&stack)
            .map(|f| f.function.as_deref().unwrap())
            .collect();
        assert_eq!(names, ["train_step"], "{file}");
    }
    // The program's own files that only look alike are its own.
    for own in [
        "/home/ada/oh/coh56zsgghx3wm54icrqrecicbc27bhvoqq6k7zl4luiqt.py",
        "/home/ada/xy/coh56zsgghx3wm54icrqrecicbc27bhvoqq6k7zl4luiqtly3php.py",
        "/home/ada/oh/coh56zsgg.py",
        "/home/ada/oh/cOH56zsgghx3wm54icrqrecicbc27bhvoqq6k7zl4luiqtly3php.py",
    ] {
        assert!(!is_library_python_frame(&py("f", own, 1)), "{own}");
    }
}
