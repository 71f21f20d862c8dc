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
