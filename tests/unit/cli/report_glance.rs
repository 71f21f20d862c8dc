//! Unit tests of `oomshim_cli::report::glance` (src/cli/report/glance.rs): the paths people
//! read, system frames; and the bar the terminal draws of what fills the device.

use dump::model::*;
use oomshim_cli::report::glance::*;
use oomshim_cli::report::terminal::bar_cells;

fn frame(function: &str, file: Option<&str>, module: Option<&str>, python: bool) -> Frame {
    Frame {
        address: "0x1".into(),
        function: Some(function.into()),
        file: file.map(Into::into),
        line: Some(7),
        module: module.map(Into::into),
        inlined: false,
        kind: if python {
            FrameKind::Python
        } else {
            Default::default()
        },
    }
}

#[test]
fn bar_cells_are_proportional_and_show_every_part() {
    assert_eq!(bar_cells(&[50, 50], 10), [5, 5]);
    assert_eq!(bar_cells(&[0, 0], 10), [0, 0]);
    // A part far below one cell still gets one, taken from the largest.
    assert_eq!(bar_cells(&[1_000_000, 1], 10), [9, 1]);
    assert_eq!(bar_cells(&[1, 1, 1], 10).iter().sum::<usize>(), 10);
}

#[test]
fn paths_are_shown_from_the_programs_working_directory() {
    let mut dump = super::fixtures::load_fixture("oom_leak_steps");
    dump.process.command_line = vec!["python".into(), "./src/train.py".into()];
    let mut stack = vec![frame(
        "step",
        Some("/home/ada/proj/src/train.py"),
        None,
        true,
    )];
    stack.push(frame(
        "main",
        Some("/home/ada/proj/lib/util.py"),
        None,
        true,
    ));
    dump.largest_holders[0].stack = stack;
    let paths = SourcePaths::of(&dump);
    assert_eq!(paths.root.as_deref(), Some("/home/ada/proj/"));
    assert_eq!(paths.show("/home/ada/proj/lib/util.py"), "lib/util.py");
    assert_eq!(
        paths.show("/usr/lib/python3/site-packages/torch/nn/functional.py"),
        "torch/nn/functional.py"
    );
    assert_eq!(paths.show("/opt/other/x.c"), "/opt/other/x.c");
    assert_eq!(
        paths.in_text("at step (/home/ada/proj/src/train.py:7)"),
        "at step (src/train.py:7)"
    );
}

#[test]
fn without_a_script_paths_are_shown_from_the_common_source_directory() {
    let mut dump = super::fixtures::load_fixture("oom_leak_steps");
    for h in &mut dump.largest_holders {
        h.stack = vec![
            frame(
                "a",
                Some("/build/src/model/a.c"),
                Some("/usr/bin/app"),
                false,
            ),
            frame("b", Some("/build/src/main.c"), Some("/usr/bin/app"), false),
        ];
    }
    dump.sites.clear();
    dump.failed_request.as_mut().unwrap().stack.clear();
    assert_eq!(SourcePaths::of(&dump).root.as_deref(), Some("/build/src/"));
    // Nothing in common but `/`: no root.
    dump.largest_holders[0].stack = vec![frame("c", Some("/x/c.c"), None, false)];
    assert_eq!(SourcePaths::of(&dump).root, None);
}

#[test]
fn the_c_runtimes_frames_are_system_frames() {
    assert!(is_system_frame(&frame(
        "_start",
        None,
        Some("/usr/bin/app"),
        false
    )));
    assert!(is_system_frame(&frame(
        "__libc_start_call_main",
        None,
        Some("/lib/x86_64-linux-gnu/libc.so.6"),
        false
    )));
    assert!(is_system_frame(&frame(
        "f",
        None,
        Some("/lib64/ld-linux-x86-64.so.2"),
        false
    )));
    assert!(!is_system_frame(&frame(
        "main",
        Some("/a/main.c"),
        Some("/usr/bin/app"),
        false
    )));
    assert!(!is_system_frame(&frame(
        "_start",
        Some("/a/x.py"),
        None,
        true
    )));
}
