//! The out-of-memory patterns of real programs (tests/clients/oom_patterns.c) against the
//! simulated CUDA: the number of dumps, `recovered` and how it was learnt, the verdict and the
//! line it names, and that stderr's first line says what the dump and `oomshim report` say.

use crate::common;

use common::{agree, dump_files, dumps, run_client};
use dump::read::read_dump;
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// First lines of the stderr summaries, in order.
fn summaries(err: &str) -> Vec<String> {
    err.lines()
        .filter(|l| l.starts_with("oomshim: CUDA out of memory"))
        .map(str::to_string)
        .collect()
}

fn run(
    mode: &[&str],
    capacity: &str,
    extra: &[(&str, &str)],
) -> (tempfile::TempDir, Output, Output) {
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        ("SIMCUDA_CAPACITY", capacity),
        ("OOMSHIM_DIR", dir.path().to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    let bare = run_client("oom_patterns", mode, &env, false);
    let shim = run_client("oom_patterns", mode, &env, true);
    assert_eq!(stdout(&bare), stdout(&shim), "output unchanged");
    assert_eq!(
        bare.status.code(),
        shim.status.code(),
        "exit code unchanged"
    );
    (dir, bare, shim)
}

#[test]
fn a_cache_that_frees_and_retries_successfully_recovered() {
    let (dir, _, shim) = run(&["cache", "recover"], "2G", &[]);
    assert!(stdout(&shim).contains("activation allocated after 1 failure(s)"));
    let all = dumps(dir.path());
    assert_eq!(all.len(), 1, "{}", stderr(&shim));
    let req = all[0].failed_request.as_ref().unwrap();
    assert_eq!(req.bytes, 512 * MIB);
    assert_eq!(req.recovered, Some(true));
    assert_eq!(req.resolution.as_deref(), Some("retry_succeeded"));
    assert_eq!(req.failures_in_burst, 1);
    // One quiet line, and no "CUDA out of memory" alarm.
    assert!(summaries(&stderr(&shim)).is_empty(), "{}", stderr(&shim));
    assert!(
        stderr(&shim).contains(
            "cudaMalloc of 512.00 MiB on device 0 failed, then its retry succeeded (recovered)"
        ),
        "{}",
        stderr(&shim)
    );
}

#[test]
fn a_cache_whose_retry_fails_stood_in_one_dump_with_its_retry() {
    let (dir, _, shim) = run(&["cache", "raise"], "2G", &[]);
    assert!(stdout(&shim).contains("OutOfMemoryError"));
    assert_eq!(shim.status.code(), Some(1));
    let files = dump_files(dir.path());
    let all = dumps(dir.path());
    assert_eq!(all.len(), 1, "{}", stderr(&shim));
    let req = all[0].failed_request.as_ref().unwrap();
    assert_eq!(req.bytes, 768 * MIB);
    assert_eq!(req.failures_in_burst, 2, "the failure and its retry");
    assert_eq!(req.recovered, Some(false));
    // The program exited right after: the exit decided it.
    assert_eq!(req.resolution.as_deref(), Some("process_exit"));
    let lines = summaries(&stderr(&shim));
    assert_eq!(lines.len(), 1, "{}", stderr(&shim));
    assert!(lines[0].contains("cudaMalloc of 768.00 MiB failed; 2 failures with its retries"));
    agree(&lines[0], &files[0], &all[0]);
}

#[test]
fn a_recovered_request_followed_by_one_that_stands_is_one_story() {
    // An op's output recovers after the cache is released; the next op's, of the same size,
    // finds nothing left to release and the program dies of it. The user reads one failure: no
    // "recovered" line before the alarm, one dump, which counts the recovery just before it.
    // `twice-dumped`: the first request's provisional dump is on disk before it recovers (a
    // process killed then keeps it), and goes when the second request's story takes it in.
    for arg in ["twice", "twice-dumped"] {
        one_story_after_a_recovery(arg);
    }
}

fn one_story_after_a_recovery(arg: &str) {
    let (dir, _, shim) = run(&["cache", arg], "2G", &[]);
    let out = stdout(&shim);
    assert!(
        out.contains("activation allocated after 1 failure(s)")
            && out.contains("next activation refused after 2 failure(s)"),
        "{out}"
    );
    assert_eq!(shim.status.code(), Some(1));
    let err = stderr(&shim);
    assert!(!err.contains("(recovered)"), "{err}");
    let files = dump_files(dir.path());
    let all = dumps(dir.path());
    assert_eq!(all.len(), 1, "{err}");
    let req = all[0].failed_request.as_ref().unwrap();
    assert_eq!(req.bytes, 512 * MIB);
    assert_eq!(req.recovered, Some(false));
    assert_eq!(req.failures_in_burst, 2, "the failure and its retry");
    assert_eq!(req.recovered_before, 1, "the request just before it");
    let lines = summaries(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(
            "cudaMalloc of 512.00 MiB failed; 2 failures with its retries; 1 earlier request \
             recovered just before)"
        ),
        "{}",
        lines[0]
    );
    agree(&lines[0], &files[0], &all[0]);
    // Nothing else in the directory: the first request's provisional dump went with it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn two_failures_of_different_sizes_ms_apart_get_two_dumps_and_a_repeat_none() {
    let (dir, _, shim) = run(&["two"], "2G", &[]);
    let files = dump_files(dir.path());
    let all = dumps(dir.path());
    assert_eq!(all.len(), 2, "{}", stderr(&shim));
    let sizes: Vec<u64> = all
        .iter()
        .map(|d| d.failed_request.as_ref().unwrap().bytes)
        .collect();
    assert_eq!(sizes, [256 * MIB, 96 * MIB]);
    for d in &all {
        let req = d.failed_request.as_ref().unwrap();
        assert_eq!(req.recovered, Some(false), "neither was retried");
        assert_eq!(req.failures_in_burst, 1);
    }
    // The first stood because the same thread moved on and failed another request.
    assert_eq!(
        all[0]
            .failed_request
            .as_ref()
            .unwrap()
            .resolution
            .as_deref(),
        Some("next_request_failed")
    );
    let lines = summaries(&stderr(&shim));
    assert_eq!(lines.len(), 2, "{}", stderr(&shim));
    for ((line, path), dump) in lines.iter().zip(&files).zip(&all) {
        agree(line, path, dump);
    }
    // The same 96 MiB failure again, after a success: a repeat, said once at exit.
    assert!(
        stderr(&shim).contains(
            "oomshim: 1 out-of-memory failures after the last dump got no dump of their own: 1 repeated"
        ),
        "{}",
        stderr(&shim)
    );
    // With no interval the repeat gets its own dump.
    let (dir, _, _) = run(&["two"], "2G", &[("OOMSHIM_MIN_INTERVAL", "0")]);
    assert_eq!(dumps(dir.path()).len(), 3);
    // And a cap of one dump a minute leaves one, the others counted.
    let (dir, _, shim) = run(
        &["two"],
        "2G",
        &[("OOMSHIM_MIN_INTERVAL", "0"), ("OOMSHIM_MAX_DUMPS", "1")],
    );
    assert_eq!(dumps(dir.path()).len(), 1);
    assert!(
        stderr(&shim).contains("2 came over the OOMSHIM_MAX_DUMPS cap"),
        "{}",
        stderr(&shim)
    );
}

#[test]
fn a_leak_spread_over_many_stacks_is_a_leak_named_by_its_function() {
    let (dir, _, shim) = run(&["spread"], "2G", &[]);
    let files = dump_files(dir.path());
    let all = dumps(dir.path());
    assert_eq!(all.len(), 1, "{}", stderr(&shim));
    let d = &all[0];
    assert_eq!(d.verdict.kind, "leak", "{:#?}", d.verdict);
    let g = d.growth.as_ref().unwrap();
    assert_eq!(g.steps.as_deref(), Some("optimizer"));
    assert_eq!(g.fit.as_ref().unwrap().bytes_per_step, 24 * MIB);
    // The 24 stacks of leak_level are one site by name, with all of the growth.
    let top = &g.sites[0];
    assert_eq!(top.bytes_per_step, 24 * MIB);
    assert!(top.share.unwrap() > 0.99);
    let headline = &d.verdict.findings[0].headline;
    assert!(
        headline.starts_with("leak_level (oom_patterns.c:")
            && headline.contains("grows by 24.00 MiB every step"),
        "{headline}"
    );
    assert!(headline.contains("optimizer steps"), "{headline}");
    let lines = summaries(&stderr(&shim));
    agree(&lines[0], &files[0], d);
}

#[test]
fn a_leak_that_frees_nothing_is_a_leak_when_steps_are_marked_and_not_when_detected() {
    // Marked (as the Python hook marks optimizer steps): a leak, though nothing is ever freed.
    let (dir, _, shim) = run(&["nofree", "1"], "2G", &[]);
    let files = dump_files(dir.path());
    let d = read_dump(&files[0]).unwrap();
    assert_eq!(d.verdict.kind, "leak", "{:#?}", d.verdict);
    assert_eq!(
        d.growth
            .as_ref()
            .unwrap()
            .fit
            .as_ref()
            .unwrap()
            .bytes_per_step,
        72 * MIB
    );
    assert!(
        d.verdict.findings[0]
            .headline
            .starts_with("keep_step_state (oom_patterns.c:"),
        "{}",
        d.verdict.findings[0].headline
    );
    agree(&summaries(&stderr(&shim))[0], &files[0], &d);
    // Unmarked: a pattern that frees nothing could be a loading loop; the verdict does not
    // guess a leak from it.
    let (dir, _, _) = run(&["nofree", "0"], "2G", &[]);
    let d = &dumps(dir.path())[0];
    assert_eq!(d.verdict.kind, "own_allocations", "{:#?}", d.verdict);
}

#[test]
fn steps_are_detected_as_the_whole_cycle_not_the_layer_loop() {
    let (dir, _, shim) = run(&["layers"], "2G", &[]);
    let files = dump_files(dir.path());
    let d = read_dump(&files[0]).unwrap();
    let g = d.growth.as_ref().expect("growth");
    assert_eq!(g.steps.as_deref(), Some("detected"));
    let det = g.detected.as_ref().unwrap();
    // 6 layers × (activation, gradient) + 2 update allocations.
    assert_eq!(det.period, 14, "{det:?}");
    // The loop ran until the device was full of 1 MiB activations: 6 per real step.
    let out = stdout(&shim);
    let real_steps: u64 = out
        .split("step ")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        det.steps <= real_steps && det.steps + 8 >= real_steps,
        "{} detected steps for {real_steps} real ones",
        det.steps
    );
    assert_eq!(d.verdict.kind, "leak", "{:#?}", d.verdict);
    assert_eq!(g.fit.as_ref().unwrap().bytes_per_step, 6 * MIB);
    assert!(d.verdict.findings[0]
        .headline
        .starts_with("layer_forward (oom_patterns.c:"));
    agree(&summaries(&stderr(&shim))[0], &files[0], &d);
}

#[test]
fn loading_a_model_too_big_is_not_a_leak() {
    let (dir, _, shim) = run(&["load"], "2G", &[]);
    let files = dump_files(dir.path());
    let d = read_dump(&files[0]).unwrap();
    assert_eq!(d.verdict.kind, "own_allocations", "{:#?}", d.verdict);
    assert!(!d.verdict.findings.iter().any(|f| f.kind == "leak"));
    agree(&summaries(&stderr(&shim))[0], &files[0], &d);
}

#[test]
fn memory_that_grows_with_the_inputs_without_accumulating_is_not_a_leak() {
    // Each step's activation is larger than the last, and replaces it: the bytes grow steadily
    // step after step, the number of live allocations does not.
    let (dir, _, shim) = run(&["grow"], "2G", &[]);
    let files = dump_files(dir.path());
    assert_eq!(files.len(), 1);
    let d = read_dump(&files[0]).unwrap();
    let fit = d.growth.as_ref().unwrap().fit.clone().unwrap();
    assert_eq!(fit.bytes_per_step, 32 * MIB, "{fit:?}");
    assert_eq!(
        fit.live_allocations.map(|c| (c.first, c.last)),
        Some((2, 2))
    );
    assert_eq!(d.verdict.kind, "own_allocations", "{:#?}", d.verdict);
    assert!(!d.verdict.findings.iter().any(|f| f.kind == "leak"));
    let top = &d.verdict.findings[0];
    assert!(
        top.headline
            .contains("forward_activations (oom_patterns.c:"),
        "{}",
        top.headline
    );
    assert!(
        top.summary.contains("none accumulated, so this is no leak"),
        "{}",
        top.summary
    );
    assert!(
        top.evidence
            .iter()
            .any(|e| e.contains("live allocations stayed 2 → 2")),
        "{:#?}",
        top.evidence
    );
    agree(&summaries(&stderr(&shim))[0], &files[0], &d);
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .arg("report")
        .arg(&files[0])
        .output()
        .unwrap();
    let text = stdout(&out);
    // The report wraps by width, and the paths in it (the checkout's) move the breaks.
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("none accumulated"), "{text}");
}

#[test]
fn a_leak_after_healthy_steps_is_fitted_from_where_it_began() {
    let (dir, _, shim) = run(&["late", "20"], "2G", &[]);
    let files = dump_files(dir.path());
    let d = read_dump(&files[0]).unwrap();
    assert_eq!(d.verdict.kind, "leak", "{:#?}", d.verdict);
    let fit = d.growth.as_ref().unwrap().fit.clone().unwrap();
    assert_eq!(fit.bytes_per_step, 64 * MIB);
    assert!(
        fit.first.step >= 19,
        "the healthy steps are not part of the fit: {fit:?}"
    );
    assert!(d.verdict.findings[0]
        .headline
        .starts_with("keep_late (oom_patterns.c:"));
    agree(&summaries(&stderr(&shim))[0], &files[0], &d);
}

#[test]
fn static_runtime_internals_never_name_the_site() {
    let (dir, _, shim) = run(&["static"], "2G", &[]);
    let files = dump_files(dir.path());
    let d = read_dump(&files[0]).unwrap();
    let line = &summaries(&stderr(&shim))[0];
    assert!(!line.contains("libcudart_static_"), "{line}");
    assert!(
        line.contains("grow_static_buffers (oom_patterns.c:"),
        "{line}"
    );
    // C advice, not PyTorch's.
    let advice = d.verdict.suggestions.join("\n");
    assert!(
        !advice.contains("torch") && !advice.contains("loss.item"),
        "{advice}"
    );
    agree(line, &files[0], &d);
}

#[test]
fn a_program_that_aborts_after_its_failure_still_leaves_a_dump() {
    // No framework will say more, so a provisional dump is written at once, in the background,
    // not after the settle window: a program that logs for a while before aborting keeps it. The
    // program aborts as soon as the dump is there, or after 5 s, half the 10 s window: no race
    // with a loaded runner, and a dump held back for the window still fails the test.
    let (dir, bare, _) = run(
        &["abort-dumped", "5000"],
        "1G",
        &[("OOMSHIM_SETTLE", "10s")],
    );
    assert_ne!(bare.status.code(), Some(0));
    let all = dumps(dir.path());
    assert_eq!(all.len(), 1);
    let req = all[0].failed_request.as_ref().unwrap();
    assert_eq!(
        req.recovered, None,
        "provisional: the outcome was not known yet"
    );
    assert_eq!(req.resolution.as_deref(), Some("unknown"));
    // With OOMSHIM_SETTLE=0 the failing call returns only once the dump is on disk: an
    // immediate abort keeps it too.
    let (dir, _, shim) = run(&["abort", "0"], "1G", &[("OOMSHIM_SETTLE", "0")]);
    assert_eq!(dumps(dir.path()).len(), 1, "{}", stderr(&shim));
    assert_eq!(summaries(&stderr(&shim)).len(), 1, "{}", stderr(&shim));
    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
