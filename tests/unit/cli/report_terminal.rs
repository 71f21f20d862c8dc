//! The terminal report's goldens (`tests/fixtures/*.report.txt`) and hostile input.

use super::fixtures::{check_golden, fixture_names, load_fixture};
use dump::fixtures::oom_dump;
use dump::model::*;
use dump::units::width;
use oomshim_cli::report::terminal::*;
use oomshim_cli::report::ReportOptions;

#[test]
fn libraries_and_the_untracked_split_are_named_in_the_report() {
    let mut dump = load_fixture("oom_untracked");
    dump.library_memory = Some(LibraryMemory {
        source: "stack_modules".into(),
        libraries: vec![LibraryBytes {
            library: "nccl".into(),
            name: "NCCL".into(),
            device: 0,
            bytes: 96 << 20,
            count: 2,
            modules: vec!["/opt/nccl/lib/libnccl.so.2".into()],
            apis: vec!["cudaMalloc".into(), "cuMemCreate".into()],
        }],
        untracked: vec![UntrackedSplit {
            device: 0,
            used_bytes: 70 << 30,
            tracked_bytes: 10 << 30,
            context_bytes: Some(600 << 20),
            other_processes_bytes: Some(59 << 30),
            unexplained_bytes: Some(424 << 20),
        }],
    });
    let text = render_terminal(
        &dump,
        &ReportOptions {
            top: 5,
            color: false,
        },
    );
    let nccl = text.lines().find(|l| l.contains("  NCCL ")).unwrap_or("");
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        nccl.contains("96.00 MiB")
            && nccl.contains("cudaMalloc, cuMemCreate")
            && nccl.contains("libnccl.so.2"),
        "{text}"
    );
    assert!(
        flat.contains(
            "device 0: 70.00 GiB used = 10.00 GiB tracked + 600.00 MiB CUDA context and unhooked \
             (NVML, this process) + 59.00 GiB other processes + 424.00 MiB that no API shows"
        ),
        "{text}"
    );
    // Without the section, the report has no such lines.
    dump.library_memory = None;
    let text = render_terminal(
        &dump,
        &ReportOptions {
            top: 5,
            color: false,
        },
    );
    assert!(!text.contains("By library") && !text.contains("no API shows"));
}

#[test]
fn terminal_golden() {
    for name in fixture_names() {
        let dump = load_fixture(name);
        let text = render_terminal(
            &dump,
            &ReportOptions {
                top: 5,
                color: false,
            },
        );
        check_golden(&format!("{name}.report.txt"), &text);
        assert!(!text.contains('\x1b'), "{name}: no colour unless asked");
        assert_eq!(
            text,
            render_terminal(
                &dump,
                &ReportOptions {
                    top: 5,
                    color: false
                }
            ),
            "deterministic"
        );
    }
}

#[test]
fn terminal_golden_color() {
    let dump = load_fixture("oom_own_allocations");
    let text = render_terminal(
        &dump,
        &ReportOptions {
            top: 5,
            color: true,
        },
    );
    check_golden("oom_own_allocations.report.color.txt", &text);
    assert!(text.contains("\x1b[1m"));
    // Without the escape codes it is the plain report.
    let plain = strip_ansi(&text);
    assert_eq!(
        plain,
        render_terminal(
            &dump,
            &ReportOptions {
                top: 5,
                color: false
            }
        )
    );
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn empty_and_unknown_render_without_panicking() {
    let mut dump = oom_dump(1 << 30, None, None, 0);
    dump.devices.clear();
    dump.largest_holders.clear();
    dump.sites.clear();
    dump.process.command_line.clear();
    dump.recording = Recording::default();
    for top in [0, 1, 10] {
        let colored = render_terminal(&dump, &ReportOptions { top, color: true });
        let text = render_terminal(&dump, &ReportOptions { top, color: false });
        assert_eq!(strip_ansi(&colored), text);
        assert!(text.contains("Devices\n  (none recorded)"), "{text}");
        assert!(
            text.contains(
                "Largest holders (0 listed in the dump; 0 live allocations)\n  (none recorded)"
            ),
            "{text}"
        );
        assert!(text.lines().all(|l| width(l) <= 80), "{text}");
        let _ = oomshim_cli::report::render_json(&dump, &ReportOptions { top, color: false });
    }
}

#[test]
fn hostile_and_extreme_values() {
    let mut dump = oom_dump(u64::MAX, Some(u64::MAX), Some(0), u64::MAX);
    dump.process.host = "evil\x1b]0;pwned\x07host".into();
    dump.process.command_line = vec!["python".into(), "it's a\nscript.py".into(), String::new()];
    dump.reason = "\x1b[2J".into();
    let long = "ns::".repeat(200) + "f(int)";
    dump.largest_holders = vec![Holder {
        bytes: u64::MAX,
        address: "0x0".into(),
        api: "\x1b[31mcudaMalloc".into(),
        device: -1,
        stream: None,
        thread: 0,
        thread_name: None,
        age_s: f64::NAN,
        seq: 0,
        stack: vec![
            Frame {
                address: "0x1".into(),
                function: Some(long.clone()),
                file: Some("/".repeat(500)),
                line: Some(u32::MAX),
                module: None,
                inlined: false,
                kind: Default::default(),
            },
            Frame {
                address: "0x2".into(),
                function: None,
                file: None,
                line: None,
                module: None,
                inlined: false,
                kind: Default::default(),
            },
        ],
        stack_merge: None,
    }];
    dump.free_blocks = FreeBlocks {
        source: "oomshim-allocator".into(),
        reason: None,
        total_free_bytes: Some(u64::MAX),
        largest_free_bytes: Some(0),
        fragmentation: Some(f64::INFINITY),
        histogram: vec![
            HistogramBin {
                lo: 0,
                hi: u64::MAX,
                count: u64::MAX,
                bytes: u64::MAX,
            },
            HistogramBin {
                lo: 0,
                hi: 0,
                count: 0,
                bytes: 0,
            },
        ],
        ..Default::default()
    };
    for color in [false, true] {
        let text = render_terminal(
            &dump,
            &ReportOptions {
                top: usize::MAX,
                color,
            },
        );
        assert!(
            !text.contains("\x1b]"),
            "control characters from the dump are escaped"
        );
        assert!(
            !text.contains("\x1b[2J") && !text.contains("\x1b[31mcuda"),
            "{text}"
        );
        assert!(text.contains("python \"it's a\\nscript.py\" ''"), "{text}");
        for line in text.lines() {
            assert!(width(line) < 400, "line too long: {line}");
        }
    }
    let v = oomshim_cli::report::render_json(
        &dump,
        &ReportOptions {
            top: 3,
            color: false,
        },
    );
    assert!(v["top_holders"][0]["age_s"].is_null());
    assert!(v["free_blocks"]["fragmentation"].is_null());
    assert!(serde_json::to_string(&v).is_ok());
}

/// Issue 27: identical holders (same size, API, device and stack) are one row `count × size`,
/// as the HTML page shows them, not nine copies of one three-line stack; `--top` counts rows,
/// and a holder that differs in any of the four stays a row of its own.
#[test]
fn identical_holders_are_one_row_with_their_count() {
    let mut dump = load_fixture("oom_own_allocations");
    let template = dump.largest_holders[0].clone();
    let mut holders = Vec::new();
    for i in 0..9u64 {
        let mut h = template.clone();
        h.bytes = 96 << 20;
        h.seq = 100 - i;
        h.age_s = 1.0 + i as f64;
        h.address = format!("0x7f{:08x}", 0x1000 * (9 - i));
        holders.push(h);
    }
    let mut other_device = holders[0].clone();
    other_device.device = 1;
    holders.push(other_device);
    let mut big = template.clone();
    big.bytes = 512 << 20;
    holders.push(big);
    dump.largest_holders = holders;
    let text = render_terminal(
        &dump,
        &ReportOptions {
            top: 10,
            color: false,
        },
    );
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Largest holders"))
        .take_while(|l| !l.is_empty())
        .collect();
    // The title's note wraps onto its own line at 80 columns.
    let title = format!("{} {}", section[0], section[1].trim());
    assert!(
        title.contains("11 listed in the dump, identical ones grouped: 3 rows"),
        "{title}"
    );
    let rows: Vec<&str> = section
        .iter()
        .copied()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 3, "{}", section.join("\n"));
    // The group ranks by its total (864 MiB) above the single 512 MiB holder; its age is the
    // range of the nine (addresses are in the JSON report and on the page).
    assert!(
        rows[0].contains("864.00 MiB") && rows[0].contains("9 × 96.00 MiB"),
        "{}",
        rows[0]
    );
    assert!(rows[0].contains("1.0 s–9.0 s"), "{}", rows[0]);
    assert!(
        rows[1].contains("512.00 MiB") && !rows[1].contains('×'),
        "{}",
        rows[1]
    );
    assert!(
        rows[2].contains("96.00 MiB") && !rows[2].contains('×'),
        "{}",
        rows[2]
    );
    // --top counts rows.
    let text = render_terminal(
        &dump,
        &ReportOptions {
            top: 1,
            color: false,
        },
    );
    assert!(
        text.contains("identical ones grouped: top 1 of 3 rows"),
        "{text}"
    );
}

/// The answer first: for every fixture, the report opens with at most 12 lines that say what
/// happened, the verdict and where the details are (and the one change when the verdict has
/// one), and no line of the whole report passes the width it was rendered for.
#[test]
fn the_first_screen_is_the_answer_and_every_line_fits_the_width() {
    use oomshim_cli::report::terminal::{render_in, FIRST_SCREEN_LINES};
    use oomshim_cli::report::{Layout, ReportModel};
    let mut names: Vec<&str> = fixture_names().to_vec();
    names.push("oom_leak_steps");
    for name in names {
        let dump = load_fixture(name);
        let model = ReportModel::new(&dump);
        for width in [60, 80, 100, 132] {
            let layout = Layout {
                width,
                source: None,
            };
            let text = render_in(
                &model,
                &ReportOptions {
                    top: 5,
                    color: false,
                },
                &layout,
            );
            for line in text.lines() {
                assert!(
                    width_of(line) <= width,
                    "{name} at {width}: {line:?}\n{text}"
                );
            }
            let first: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
            assert!(
                first.len() <= FIRST_SCREEN_LINES,
                "{name}: {}",
                first.join("\n")
            );
            assert!(
                first[0].starts_with("Out of memory") || first[0].starts_with("Dump on demand"),
                "{name}: {}",
                first[0]
            );
            assert!(
                first.iter().any(|l| l.starts_with("Verdict: ")),
                "{name}: {first:?}"
            );
            assert!(
                first.last().unwrap().starts_with("Details below"),
                "{name}: {first:?}"
            );
            if !model.verdict.suggestions.is_empty() {
                assert!(
                    first.iter().any(|l| l.starts_with("Change: ")),
                    "{name}: {first:?}"
                );
            }
        }
    }
}

fn width_of(line: &str) -> usize {
    line.chars().count()
}

/// Each fact once: the failed request's size, its call and the NVML error are not repeated in
/// the verdict's evidence, and a suggestion shown on the first screen is not listed again.
#[test]
fn the_details_say_each_fact_once() {
    let dump = load_fixture("oom_leak_steps");
    let text = render_terminal(
        &dump,
        &ReportOptions {
            top: 5,
            color: false,
        },
    );
    let count = |needle: &str| text.matches(needle).count();
    assert_eq!(count("(536,870,912 bytes)"), 1, "{text}");
    assert_eq!(count("NVML is not available"), 1, "{text}");
    assert_eq!(count("failing call"), 0, "{text}");
    let change = text
        .lines()
        .find(|l| l.starts_with("Change: "))
        .expect("a change");
    let words = &change["Change: ".len()..];
    assert_eq!(count(words), 1, "{text}");
}

/// A verdict the first screen had to cut is said whole in the details (once: not when it fit).
#[test]
fn a_verdict_cut_on_the_first_screen_is_whole_in_the_details() {
    use oomshim_cli::report::terminal::render_in;
    use oomshim_cli::report::{Layout, ReportModel};
    let dump = load_fixture("oom_leak_steps");
    let model = ReportModel::new(&dump);
    let headline = model.verdict.headline().to_string();
    let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let opts = ReportOptions {
        top: 5,
        color: false,
    };
    let narrow = render_in(
        &model,
        &opts,
        &Layout {
            width: 60,
            source: None,
        },
    );
    let (first, details) = narrow.split_once("\n\n").unwrap();
    assert!(first.contains('…'), "{first}");
    assert!(flat(details).contains(&headline), "{details}");
    let wide = render_in(
        &model,
        &opts,
        &Layout {
            width: 200,
            source: None,
        },
    );
    assert_eq!(flat(&wide).matches(headline.as_str()).count(), 1, "{wide}");
}
