//! Unit tests of `oomshim_cli::report::why_rank` (src/cli/report/why_rank.rs), through `merge`:
//! dumps built for each rule, and for the cases where each does not apply.

use dump::model::{Dump, FrameworkOom, Kinds};
use dump::read::parse_dump;
use oomshim_cli::report::merge::{merge_json, merge_rows, render_merge, row, MergeOptions, Merged};
use oomshim_cli::report::merge_html::merge_page;
use oomshim_cli::report::why_rank::{Why, CASCADE, HOT_EXPERT, PIPELINE_EDGES, RANK0_FULL_COPY};
use std::path::{Path, PathBuf};

const GIB: u64 = 1 << 30;

fn base() -> Dump {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom_own_allocations.json");
    parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
}

/// Rank `rank` of a job on `host`, with torch's kinds (parameters and activations in GiB,
/// gradients and optimizer state as its parameters) and an out-of-memory failure at `oom_at`
/// ms, or an at-exit dump.
fn rank(rank: u32, host: &str, params: u64, acts: u64, oom_at: Option<u64>) -> Dump {
    let mut d = base();
    d.process.rank = Some(rank);
    d.process.pid = 1000 + rank;
    d.process.host = host.into();
    d.devices.truncate(1);
    d.devices[0].index = 0;
    d.devices[0].peak_tracked_bytes = (params * 3 + acts) * GIB;
    d.framework = Some(FrameworkOom {
        name: "torch".into(),
        kinds: Some(Kinds {
            parameters_bytes: params * GIB,
            gradients_bytes: params * GIB,
            optimizer_state_bytes: params * GIB,
            activations_bytes: Some(acts * GIB),
            ..Default::default()
        }),
        ..Default::default()
    });
    match oom_at {
        Some(t) => {
            d.reason = "oom".into();
            d.time_unix_ms = t;
        }
        None => {
            d.reason = "exit".into();
            d.failed_request = None;
            d.time_unix_ms = 2_000_000_000_000;
        }
    }
    d
}

fn merged(dumps: &[Dump]) -> Merged {
    let rows = dumps
        .iter()
        .enumerate()
        .map(|(i, d)| row(PathBuf::from(format!("{i}.json")), d))
        .collect();
    merge_rows(
        rows,
        vec![],
        MergeOptions {
            clock_skew_ms: 1000,
        },
    )
}

fn rule<'a>(m: &'a Merged, name: &str) -> &'a Why {
    m.why
        .iter()
        .find(|w| w.rule == name)
        .unwrap_or_else(|| panic!("{name}: {:?}", m.why))
}

/// Each rule's outcome shows in all three renderings: the terminal's "Why this rank", the JSON's
/// `why`, the page's list (escaped).
fn rendered_everywhere(m: &Merged, w: &Why) {
    let text = render_merge(m);
    let section = text
        .split("\nWhy this rank\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(section.contains(&w.text), "{text}");
    let j = merge_json(m);
    let found = j["why"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["rule"] == w.rule)
        .unwrap()
        .clone();
    assert_eq!(found["applies"], true);
    assert_eq!(found["text"], w.text.as_str());
    let page = merge_page(m);
    assert!(
        page.contains(&format!("<li data-rule=\"{}\">", w.rule)),
        "{page}"
    );
}

#[test]
fn rank_0_holding_a_full_copy_of_the_parameters_is_named() {
    let mut dumps: Vec<Dump> = (1..4).map(|r| rank(r, "n", 4, 10, None)).collect();
    dumps.push(rank(0, "n", 8, 10, Some(1_000)));
    let m = merged(&dumps);
    let w = rule(&m, RANK0_FULL_COPY);
    assert!(w.applies, "{w:?}");
    assert_eq!(w.ranks, [0]);
    assert!(
        w.text.starts_with("rank 0 holds 2.0× the parameters of the others (8.00 GiB against a median of 4.00 GiB): a full copy before the broadcast"),
        "{}",
        w.text
    );
    rendered_everywhere(&m, w);
    // The others: the same model everywhere is no full copy; rank 0 without kinds says so.
    let m = merged(
        &(0..4)
            .map(|r| rank(r, "n", 4, 10, None))
            .collect::<Vec<_>>(),
    );
    let w = rule(&m, RANK0_FULL_COPY);
    assert!(
        !w.applies && w.text.contains("1.0× the parameters"),
        "{w:?}"
    );
    let mut dumps: Vec<Dump> = (0..4).map(|r| rank(r, "n", 4, 10, None)).collect();
    dumps[0].framework = None;
    let w = rule(&merged(&dumps), RANK0_FULL_COPY).clone();
    assert!(!w.applies && w.text == "rank 0 has no kinds", "{w:?}");
    // One process: nothing to compare, no rule at all.
    let m = merged(&[rank(0, "n", 8, 10, Some(1))]);
    assert!(m.why.is_empty());
    assert!(!render_merge(&m).contains("Why this rank"));
}

#[test]
fn the_first_and_last_pipeline_stages_holding_more_activations_are_named() {
    // 8 stages: 10 GiB of activations each, 13 GiB on the first and the last.
    let dumps: Vec<Dump> = (0..8)
        .map(|r| {
            rank(
                r,
                "n",
                4,
                if r == 0 || r == 7 { 13 } else { 10 },
                (r == 7).then_some(5_000),
            )
        })
        .collect();
    let m = merged(&dumps);
    let w = rule(&m, PIPELINE_EDGES);
    assert!(w.applies, "{:?}", m.why);
    assert_eq!(w.ranks, [0, 7]);
    assert!(
        w.text.starts_with(
            "ranks 0 and 7 hold 1.3× the median activations (first/last pipeline stage"
        ),
        "{}",
        w.text
    );
    assert!(
        !rule(&m, HOT_EXPERT).applies,
        "a pipeline is not a hot expert"
    );
    rendered_everywhere(&m, w);
    // A middle rank raised too: not the pipeline's shape.
    let dumps: Vec<Dump> = (0..8)
        .map(|r| {
            rank(
                r,
                "n",
                4,
                if [0, 3, 7].contains(&r) { 13 } else { 10 },
                None,
            )
        })
        .collect();
    let w = rule(&merged(&dumps), PIPELINE_EDGES).clone();
    assert!(!w.applies && w.text.contains("ranks 0, 3 and 7"), "{w:?}");
    // Two ranks: both are edges, so nothing can be said.
    let w = rule(
        &merged(&[rank(0, "n", 4, 13, None), rank(1, "n", 4, 10, None)]),
        PIPELINE_EDGES,
    )
    .clone();
    assert!(!w.applies && w.text.contains("3 ranks or more"), "{w:?}");
}

#[test]
fn a_hot_expert_is_one_rank_with_more_activations_and_the_same_parameters() {
    let dumps: Vec<Dump> = (0..8)
        .map(|r| {
            rank(
                r,
                "n",
                4,
                if r == 3 { 18 } else { 10 },
                (r == 3).then_some(5_000),
            )
        })
        .collect();
    let m = merged(&dumps);
    let w = rule(&m, HOT_EXPERT);
    assert!(w.applies, "{:?}", m.why);
    assert_eq!(w.ranks, [3]);
    assert!(
        w.text.starts_with("rank 3 holds 1.8× the median activations (18.00 GiB against 10.00 GiB) with the parameters of the others: a hot expert;"),
        "{}",
        w.text
    );
    assert!(!rule(&m, PIPELINE_EDGES).applies);
    rendered_everywhere(&m, w);
    // More parameters too: another model shard, not a hot expert.
    let dumps: Vec<Dump> = (0..8)
        .map(|r| {
            rank(
                r,
                "n",
                if r == 3 { 8 } else { 4 },
                if r == 3 { 18 } else { 10 },
                None,
            )
        })
        .collect();
    assert!(!rule(&merged(&dumps), HOT_EXPERT).applies);
    // Two hot ranks: not one expert.
    let dumps: Vec<Dump> = (0..8)
        .map(|r| rank(r, "n", 4, if r == 3 || r == 5 { 18 } else { 10 }, None))
        .collect();
    let w = rule(&merged(&dumps), HOT_EXPERT).clone();
    assert!(
        !w.applies && w.text.starts_with("2 ranks hold 1.5×"),
        "{w:?}"
    );
}

#[test]
fn failures_long_after_the_first_and_together_are_a_cascade() {
    // Rank 3 ran out at t; ranks 1 and 2 failed together 40 s later, when the collective they
    // waited in with rank 3 timed out. Rank 0 did not fail.
    let t = 1_800_000_000_000;
    let dumps = vec![
        rank(0, "n", 4, 10, None),
        rank(1, "n", 4, 10, Some(t + 40_000)),
        rank(2, "n", 4, 10, Some(t + 40_300)),
        rank(3, "n", 4, 10, Some(t)),
    ];
    let m = merged(&dumps);
    let w = rule(&m, CASCADE);
    assert!(w.applies, "{:?}", m.why);
    assert_eq!(w.ranks, [3, 1, 2]);
    assert!(
        w.text.starts_with("rank 3 failed first; ranks 1 and 2 failed 40 s later, together, after a collective timed out: a cascade"),
        "{}",
        w.text
    );
    rendered_everywhere(&m, w);
    // A post-mortem's death counts as a failure too.
    let mut pm = rank(1, "n", 4, 10, None);
    pm.reason = "post_mortem".into();
    pm.post_mortem = Some(dump::model::PostMortem {
        reconstructed: true,
        signal: Some(6),
        signal_name: Some("SIGABRT".into()),
        core_dumped: false,
        exit_code: None,
        died_unix_ms: t + 40_000,
        published_unix_ms: t,
        generation: 9,
        from_previous: false,
        rss: vec![],
        last_failure: None,
        host: Default::default(),
        reaped_by: None,
        started_unix_ms: None,
    });
    let m = merged(&[
        pm,
        rank(2, "n", 4, 10, Some(t + 40_300)),
        rank(3, "n", 4, 10, Some(t)),
    ]);
    assert!(rule(&m, CASCADE).applies, "{:?}", m.why);
    // Close together: one cause, not a timeout.
    let near = merged(&[
        rank(1, "n", 4, 10, Some(t + 800)),
        rank(3, "n", 4, 10, Some(t)),
    ]);
    let w = rule(&near, CASCADE).clone();
    assert!(
        !w.applies && w.text.contains("0.8 s after the first"),
        "{w:?}"
    );
    // Spread out: they did not fail together.
    let spread = merged(&[
        rank(1, "n", 4, 10, Some(t + 40_000)),
        rank(2, "n", 4, 10, Some(t + 90_000)),
        rank(3, "n", 4, 10, Some(t)),
    ]);
    assert!(rule(&spread, CASCADE).text.contains("spread over 50.0 s"));
    // One failure only.
    let one = merged(&[rank(1, "n", 4, 10, None), rank(3, "n", 4, 10, Some(t))]);
    assert!(!rule(&one, CASCADE).applies);
}

#[test]
fn without_a_cause_the_terminal_says_why_each_rule_did_not_apply_and_the_page_escapes() {
    let mut dumps: Vec<Dump> = (0..4).map(|r| rank(r, "n", 4, 10, None)).collect();
    dumps[2].process.host = "<script>x</script>".into();
    let m = merged(&dumps);
    assert!(m.why.iter().all(|w| !w.applies));
    let text = render_merge(&m);
    assert!(
        text.contains("no known structural cause applies (rank0_full_copy: "),
        "{text}"
    );
    let page = merge_page(&m);
    assert!(!page.contains("<script>"), "{page}");
    assert!(page.contains("&lt;script&gt;x&lt;/script&gt;"));
    assert!(page.contains("<tr class=\"median\">"));
}
