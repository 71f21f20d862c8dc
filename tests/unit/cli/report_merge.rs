//! Unit tests of `oomshim_cli::report::merge` (src/cli/report/merge.rs).

use dump::model::Dump;
use dump::read::parse_dump;
use oomshim_cli::report::merge::*;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> Dump {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
}

fn write(dir: &Path, name: &str, d: &Dump) {
    std::fs::write(dir.join(name), serde_json::to_vec(d).unwrap()).unwrap();
}

/// Issue 27: the REASON column is as wide as the longest reason (it was cut to 12
/// characters: `manua...1000`, `snaps...exit`), and the columns after it stay aligned.
#[test]
fn reasons_are_shown_whole_and_the_table_stays_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let base = fixture("oom_own_allocations.json");
    for (i, reason) in ["oom", "manual: checkpoint at step 1000", "snapshot-at-exit"]
        .into_iter()
        .enumerate()
    {
        let mut d = base.clone();
        d.process.rank = Some(i as u32);
        d.process.pid = 100 + i as u32;
        d.reason = reason.into();
        write(dir.path(), &format!("oomshim-h-{i}-1.json"), &d);
    }
    let text = render_merge(&merge_dirs(&[dir.path().into()], MergeOptions::default()).unwrap());
    let lines: Vec<&str> = text.lines().take(5).collect();
    assert_eq!(lines[0], "3 dumps", "{text}");
    for reason in ["manual: checkpoint at step 1000", "snapshot-at-exit"] {
        assert!(text.contains(reason), "{reason} cut: {text}");
    }
    // TRACKED ends in the same column on the header and every row.
    let end = |l: &str| l.find(" TRACKED").map(|i| i + " TRACKED".len());
    let at = end(lines[1]).expect("header");
    for row in &lines[2..5] {
        assert_eq!(dump::units::width(&row[..row.len().min(at)]), at, "{text}");
        assert!(
            row[..at].ends_with(" GiB") || row[..at].ends_with(" MiB"),
            "{text}"
        );
    }
    // A hostile reason is cut in the middle, not allowed to widen the table without end.
    let mut d = base.clone();
    d.reason = "x".repeat(5000);
    write(dir.path(), "oomshim-h-9-1.json", &d);
    let text = render_merge(&merge_dirs(&[dir.path().into()], MergeOptions::default()).unwrap());
    assert!(text.lines().all(|l| l.len() < 400), "{text}");
}

#[test]
fn four_ranks_one_runs_out_while_the_others_idle() {
    let dir = tempfile::tempdir().unwrap();
    let base = fixture("oom_own_allocations.json");
    for rank in 0..4u32 {
        let mut d = base.clone();
        d.process.rank = Some(rank);
        d.process.pid = 100 + rank;
        d.process.host = if rank < 2 {
            "node-a".into()
        } else {
            "node-b".into()
        };
        if rank != 3 {
            d.reason = "snapshot-at-exit".into();
            d.failed_request = None;
            for dev in &mut d.devices {
                dev.peak_tracked_bytes = 30 << 30;
                dev.tracked_bytes = 20 << 30;
            }
        } else {
            for dev in &mut d.devices {
                dev.peak_tracked_bytes = 79 << 30;
                dev.tracked_bytes = 79 << 30;
            }
        }
        let sub = dir.path().join(&d.process.host);
        std::fs::create_dir_all(&sub).unwrap();
        write(
            &sub,
            &format!(
                "oomshim-{}-{}-r{rank}-1.json",
                d.process.host, d.process.pid
            ),
            &d,
        );
    }
    std::fs::write(dir.path().join("notes.json"), b"{\"not\": \"a dump\"}").unwrap();
    std::fs::write(
        dir.path().join("broken.json"),
        b"{\"schema\": \"oomshim.dump/1\", \"reason\"",
    )
    .unwrap();
    let m = merge_dir(dir.path()).unwrap();
    assert_eq!(m.rows.len(), 4);
    assert_eq!(
        m.rows.iter().map(|r| r.rank).collect::<Vec<_>>(),
        [Some(0), Some(1), Some(2), Some(3)]
    );
    assert_eq!(
        m.problems.len(),
        1,
        "only the broken dump is a problem: {:?}",
        m.problems
    );
    let text = render_merge(&m);
    assert!(
        text.contains("imbalance: rank 3 (node-b pid 103) peaked at 79.00 GiB"),
        "{text}"
    );
    assert!(
        text.contains(
            "rank 3 (node-b pid 103) ran out of memory at 79.00 GiB tracked while the 3 other"
        ),
        "{text}"
    );
    assert!(text.contains("broken.json"), "{text}");
    let j = merge_json(&m);
    assert_eq!(j["rows"].as_array().unwrap().len(), 4);
}

#[test]
fn a_single_process_has_no_balance_section_and_a_missing_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.json", &fixture("oom_own_allocations.json"));
    let m = merge_dir(dir.path()).unwrap();
    assert_eq!(m.rows.len(), 1);
    assert!(m.findings.is_empty());
    assert!(merge_dir(&dir.path().join("missing"))
        .unwrap_err()
        .contains("missing"));
}
/// A synthetic rank's dump: `peak` GiB peak on device 0 of 80 GiB, `free` GiB free when known,
/// an OOM at `oom_at` (ms) or a snapshot at exit.
fn rank_dump(
    base: &Dump,
    rank: u32,
    host: &str,
    peak_gib: u64,
    free_gib: Option<u64>,
    oom_at: Option<u64>,
) -> Dump {
    let mut d = base.clone();
    d.process.rank = Some(rank);
    d.process.world_size = Some(1024);
    d.process.pid = 1000 + rank;
    d.process.host = host.into();
    d.devices.truncate(1);
    d.devices[0].index = 0;
    d.devices[0].peak_tracked_bytes = peak_gib << 30;
    d.devices[0].tracked_bytes = peak_gib << 30;
    d.devices[0].total_bytes = Some(80 << 30);
    d.devices[0].free_bytes = free_gib.map(|f| f << 30);
    match oom_at {
        Some(t) => {
            d.reason = "oom".into();
            d.time_unix_ms = t;
            let r = d.failed_request.as_mut().expect("fixture is an OOM");
            r.device = 0;
            r.bytes = 4 << 30;
        }
        None => {
            d.reason = "exit".into();
            d.failed_request = None;
            d.time_unix_ms = 2_000_000_000_000;
        }
    }
    d
}

fn rows_of(dumps: &[Dump]) -> Vec<Row> {
    dumps
        .iter()
        .enumerate()
        .map(|(i, d)| row(PathBuf::from(format!("{i}.json")), d))
        .collect()
}

fn opts(ms: u64) -> MergeOptions {
    MergeOptions { clock_skew_ms: ms }
}

#[test]
fn the_first_rank_to_fail_is_named_by_failure_time_with_the_skew_between_hosts() {
    let base = fixture("oom_own_allocations.json");
    let t = 1_800_000_000_000;
    // Rank 5 leaks and fails first on node-b; rank 1 fails 4 s later on node-a (its
    // collective timed out, say); the rest exit normally.
    let mut dumps: Vec<Dump> = (0..8)
        .map(|r| {
            let host = if r < 4 { "node-a" } else { "node-b" };
            rank_dump(&base, r, host, 20, Some(50), None)
        })
        .collect();
    dumps[5] = rank_dump(&base, 5, "node-b", 76, Some(1), Some(t));
    dumps[1] = rank_dump(&base, 1, "node-a", 21, Some(2), Some(t + 4000));
    let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
    let f = m.first_failure.as_ref().unwrap();
    assert_eq!(m.rows[f.row].rank, Some(5));
    assert!(f.uncertain_with.is_empty());
    let (next, gap) = f.next.unwrap();
    assert_eq!((m.rows[next].rank, gap), (Some(1), 4000));
    assert_eq!(f.failed_processes, 2);
    let text = render_merge(&m);
    assert!(
        text.contains("first to run out of memory: rank 5 (node-b pid 1005)")
            && text.contains(
                "4000 ms before the next (rank 1 (node-a pid 1001)); 2 of 8 processes ran out"
            ),
        "{text}"
    );

    // The later rank's failure only 200 ms after, on another host: within a 1 s skew the
    // order is not known, and merge says so; with a 50 ms skew it is.
    dumps[1] = rank_dump(&base, 1, "node-a", 21, Some(2), Some(t + 200));
    let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
    let f = m.first_failure.as_ref().unwrap();
    assert_eq!(m.rows[f.row].rank, Some(5));
    assert_eq!(
        f.uncertain_with
            .iter()
            .map(|&i| m.rows[i].rank)
            .collect::<Vec<_>>(),
        [Some(1)]
    );
    assert!(render_merge(&m).contains("their order is not known"));
    let m = merge_rows(rows_of(&dumps), vec![], opts(50));
    assert!(m.first_failure.as_ref().unwrap().uncertain_with.is_empty());

    // On one host there is one clock: 1 ms apart is an order, whatever the skew.
    dumps[1] = rank_dump(&base, 1, "node-b", 21, Some(2), Some(t + 1));
    let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
    let f = m.first_failure.as_ref().unwrap();
    assert!(f.uncertain_with.is_empty(), "{f:?}");
    assert_eq!(f.next.map(|n| n.1), Some(1));

    // An earlier failure wins whatever the rank numbers: rank 1 first now.
    dumps[1] = rank_dump(&base, 1, "node-a", 21, Some(2), Some(t - 3000));
    let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
    assert_eq!(m.rows[m.first_failure.unwrap().row].rank, Some(1));
}

#[test]
fn with_two_ranks_the_one_far_above_the_other_is_imbalanced() {
    let base = fixture("oom_own_allocations.json");
    let dumps = vec![
        rank_dump(&base, 0, "node-0", 8, Some(50), None),
        rank_dump(&base, 1, "node-0", 130, Some(1), Some(1_800_000_000_000)),
    ];
    let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
    assert_eq!(m.median_peak_bytes, 69 << 30);
    assert_eq!(
        m.imbalanced.len(),
        1,
        "rank 1 at 130 GiB is far above the median of 69 GiB"
    );
    let text = render_merge(&m);
    assert!(text.contains("imbalance: rank 1"), "{text}");
}

#[test]
fn imbalance_names_every_rank_far_above_the_median_and_room_on_the_others() {
    let base = fixture("oom_own_allocations.json");
    let t = 1_800_000_000_000;
    let mut dumps: Vec<Dump> = (0..16)
        .map(|r| rank_dump(&base, r, &format!("node-{}", r / 8), 20, Some(50), None))
        .collect();
    dumps[3] = rank_dump(&base, 3, "node-0", 78, Some(1), Some(t));
    dumps[9] = rank_dump(&base, 9, "node-1", 30, Some(40), None);
    dumps[12] = rank_dump(&base, 12, "node-1", 26, None, None); // no free bytes: estimated
    let m = merge_rows(rows_of(&dumps), vec![], opts(1000));
    assert_eq!(m.median_peak_bytes, 20 << 30);
    assert_eq!(
        m.imbalanced
            .iter()
            .map(|&i| m.rows[i].rank)
            .collect::<Vec<_>>(),
        [Some(3), Some(9), Some(12)],
        "every process above 1.25× the median, highest first"
    );
    let text = render_merge(&m);
    assert!(
        text.contains("imbalance: rank 3 (node-0 pid 1003) peaked at 78.00 GiB, 3.9×"),
        "{text}"
    );
    assert!(text.contains("also far above the median (1.25× or more): rank 9 (node-1 pid 1009) 1.5×, rank 12 (node-1 pid 1012) 1.3×"), "{text}");
    assert!(
        text.contains("room on the others: 15 of the 15 processes that did not run out had the 4.00 GiB rank 3 (node-0 pid 1003) asked for (14 by their free bytes, 1 by rank 3 (node-0 pid 1003)'s device size less their peak)"),
        "{text}"
    );
    // By host: the ranks of each, as ranges.
    assert_eq!(m.hosts.len(), 2);
    assert_eq!(
        (m.hosts[0].host.as_str(), m.hosts[0].out_of_memory),
        ("node-0", 1)
    );
    assert_eq!(rank_ranges(&m.hosts[1].ranks), "8-15");
    assert!(text.contains("By host"), "{text}");

    // Every rank short of room: the job needs less per rank, not a better spread.
    let tight: Vec<Dump> = (0..4)
        .map(|r| {
            if r == 0 {
                rank_dump(&base, r, "n", 79, Some(0), Some(t))
            } else {
                rank_dump(&base, r, "n", 78, Some(2), None)
            }
        })
        .collect();
    let text = render_merge(&merge_rows(rows_of(&tight), vec![], opts(1000)));
    assert!(
        text.contains("0 of the 3 processes") && text.contains("every rank is near its limit"),
        "{text}"
    );
}

#[test]
fn kinds_are_listed_per_rank_when_the_hook_counted_them() {
    let base = fixture("oom_own_allocations.json");
    let mut with_kinds = rank_dump(&base, 0, "node-a", 70, Some(1), Some(1_000));
    with_kinds.framework = Some(dump::model::FrameworkOom {
        kinds: Some(dump::model::Kinds {
            parameters_bytes: 2 << 30,
            gradients_bytes: 2 << 30,
            optimizer_state_bytes: 4 << 30,
            activations_bytes: Some(60 << 30),
            ..Default::default()
        }),
        ..Default::default()
    });
    let without = rank_dump(&base, 1, "node-a", 10, Some(70), None);
    let m = merge_rows(rows_of(&[with_kinds, without]), vec![], opts(0));
    let text = render_merge(&m);
    let section = text
        .split("\nBy kind\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no By kind section:\n{text}"));
    let lines: Vec<&str> = section.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2, "a header and rank 0 only:\n{text}");
    assert!(lines[0].contains("PARAMETERS") && lines[0].contains("ACTIVATIONS"));
    let rank0: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(rank0[0], "0");
    assert_eq!(rank0.last(), Some(&"activations"), "{}", lines[1]);
    assert!(lines[1].contains("60.00 GiB") && lines[1].contains("4.00 GiB"));
    let j = merge_json(&m);
    assert_eq!(j["rows"][0]["kinds"]["dominant"], "activations");
    assert_eq!(j["rows"][0]["kinds"]["optimizer_state_bytes"], 4u64 << 30);
    assert!(j["rows"][1]["kinds"].is_null());
    // No process with kinds: no section.
    let plain = rank_dump(&base, 1, "node-a", 10, Some(70), None);
    let m = merge_rows(rows_of(&[plain]), vec![], opts(0));
    assert!(!render_merge(&m).contains("By kind"));
}

#[test]
fn rank_ranges_compress_sorted_ranks() {
    assert_eq!(rank_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(rank_ranges(&[4]), "4");
    assert_eq!(rank_ranges(&[1, 1, 2]), "1-2");
    assert_eq!(rank_ranges(&[]), "");
}

#[test]
fn per_host_directories_are_merged_and_a_file_may_be_named() {
    let base = fixture("oom_own_allocations.json");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(
        a.path(),
        "r0.json",
        &rank_dump(&base, 0, "node-a", 10, Some(60), None),
    );
    write(
        b.path(),
        "r1.json",
        &rank_dump(&base, 1, "node-b", 70, Some(2), Some(1)),
    );
    let m = merge_dirs(&[a.path().into(), b.path().into()], opts(1000)).unwrap();
    assert_eq!(m.rows.len(), 2);
    assert_eq!(m.rows[m.first_failure.as_ref().unwrap().row].rank, Some(1));
    // The same dump through its directory and by name counts once.
    let m = merge_dirs(&[a.path().into(), a.path().join("r0.json")], opts(1000)).unwrap();
    assert_eq!(m.rows.len(), 1);
    let j = merge_json(&m);
    assert_eq!(j["rows"][0]["rank"], 0);
    assert!(j["first_failure"].is_null());
}

/// Not a timed test: prints how long merging 1,024 and 8,192 synthetic rank dumps takes
/// (`cargo test --release --lib report::merge -- --ignored --nocapture`).
#[test]
#[ignore]
fn measure_merge_of_1024_and_8192_ranks() {
    let small = fixture("oom_own_allocations.json");
    // As large as a dump gets by default: 50 holders and 50 sites, 64 frames each.
    let mut heavy = small.clone();
    let mut stack = heavy.largest_holders[0].stack.clone();
    while stack.len() < 64 {
        stack.extend_from_within(..stack.len().min(64 - stack.len()));
    }
    let mut holder = heavy.largest_holders[0].clone();
    holder.stack = stack.clone();
    heavy.largest_holders = vec![holder; 50];
    let mut site = heavy.sites[0].clone();
    site.stack = stack;
    heavy.sites = vec![site; 50];
    for (n, base) in [(1024u32, &small), (8192, &small), (1024, &heavy)] {
        let dir = tempfile::tempdir().unwrap();
        let bytes_each = serde_json::to_vec_pretty(base).unwrap().len();
        for r in 0..n {
            let host = format!("node-{:04}", r / 8);
            let sub = dir.path().join(&host);
            if r % 8 == 0 {
                std::fs::create_dir(&sub).unwrap();
            }
            let d = if r == n / 3 {
                rank_dump(base, r, &host, 79, Some(0), Some(1_800_000_000_000))
            } else {
                rank_dump(base, r, &host, 20 + (r % 5) as u64, Some(50), None)
            };
            // Pretty, as the shim writes them.
            std::fs::write(
                sub.join(format!("oomshim-{host}-{}-r{r}-1.json", 1000 + r)),
                serde_json::to_vec_pretty(&d).unwrap(),
            )
            .unwrap();
        }
        let mut times = Vec::new();
        for _ in 0..3 {
            let start = std::time::Instant::now();
            let m = merge_dir(dir.path()).unwrap();
            let text = render_merge(&m);
            times.push(start.elapsed().as_secs_f64());
            assert_eq!(m.rows.len(), n as usize);
            assert!(text.contains(&format!("first to run out of memory: rank {}", n / 3)));
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "merge of {n} ranks ({} KiB each): median {:.3} s of 3 (min {:.3}, max {:.3})",
            bytes_each / 1024,
            times[1],
            times[0],
            times[2]
        );
    }
}
