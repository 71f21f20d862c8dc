//! Unit tests of `oomshim_cli::report` (src/cli/report/mod.rs).

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
