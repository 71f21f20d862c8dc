//! Issue 18: several ranks of one job on the simulated device, one leaking, each writing its
//! dumps; the dumps say which rank of which job they are, name NCCL's memory as NCCL, and
//! `oomshim merge` names the leaking rank as the first to fail, the imbalance and the room the
//! others had.

use crate::common;

use common::{cli, run_client, shim_lib};
use dump::model::Dump;
use dump::read::read_dump;
use std::path::{Path, PathBuf};
use std::process::Output;

fn dumps_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|x| x == "json"));
    v.sort();
    v
}

/// Runs `world` ranks of rank_worker at once, rank `r` with `env_of(r)`, and returns their
/// outputs in rank order.
fn run_job(world: u32, env_of: impl Fn(u32) -> Vec<(String, String)> + Sync) -> Vec<Output> {
    let _ = shim_lib(); // built once, before the ranks race to build it
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let env = env_of(r);
                s.spawn(move || {
                    let env: Vec<(&str, &str)> =
                        env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    run_client("rank_worker", &[], &env, true)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn pairs(p: &[(&str, String)]) -> Vec<(String, String)> {
    p.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// `oomshim merge DIR --json`, parsed.
fn merge_json_of(dir: &Path) -> serde_json::Value {
    let out = cli().arg("merge").arg(dir).arg("--json").output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn oom_dump_of(dumps: &[Dump], rank: u32) -> &Dump {
    dumps
        .iter()
        .find(|d| d.process.rank == Some(rank) && d.reason == "oom")
        .unwrap_or_else(|| panic!("no OOM dump of rank {rank}"))
}

#[test]
fn torchrun_style_job_one_rank_leaking_merge_names_it_first() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let outs = run_job(4, |r| {
        pairs(&[
            ("RANK", r.to_string()),
            ("LOCAL_RANK", r.to_string()),
            ("WORLD_SIZE", "4".into()),
            ("TORCHELASTIC_RUN_ID", "job-18".into()),
            ("SIM_LEAK_RANK", "2".into()),
            ("SIM_LATE_OOM_RANK", "3".into()),
            ("SIM_LATE_OOM_MS", "1500".into()),
            ("OOMSHIM_AT_EXIT", "1".into()),
            ("OOMSHIM_DIR", d.clone()),
        ])
    });
    // Outputs and exit codes are the program's own.
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    assert_eq!(codes, [Some(0), Some(0), Some(3), Some(3)], "{outs:?}");
    let stdout = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(stdout(&outs[0]), "rank 0: done\n");
    assert!(stdout(&outs[2]).starts_with("rank 2: out of memory at step "));
    let bare = run_client(
        "rank_worker",
        &[],
        &[("RANK", "2"), ("SIM_LEAK_RANK", "2")],
        false,
    );
    assert_eq!(
        (bare.status.code(), stdout(&bare)),
        (outs[2].status.code(), stdout(&outs[2])),
        "the leaking rank prints and exits the same without the shim"
    );

    let files = dumps_in(dir.path());
    let dumps: Vec<Dump> = files.iter().map(|p| read_dump(p).unwrap()).collect();
    for r in 0..4 {
        assert!(
            files
                .iter()
                .any(|p| p.to_str().unwrap().contains(&format!("-r{r}-"))),
            "a dump named for rank {r}: {files:?}"
        );
    }
    // Rank, local rank, world size, launcher and job in the dump; the GPU by its UUID.
    let leak = oom_dump_of(&dumps, 2);
    let p = &leak.process;
    assert_eq!(
        (p.rank, p.local_rank, p.world_size),
        (Some(2), Some(2), Some(4))
    );
    assert_eq!(p.launcher.as_deref(), Some("torchrun"));
    assert_eq!(p.job_id.as_deref(), Some("job-18"));
    assert_eq!(
        leak.devices[0].uuid.as_deref(),
        Some("GPU-5e1d0013-1415-1617-1819-1a1b1c1d1e1f")
    );
    // NCCL's buffers are named NCCL, both the cudaMalloc and the cuMemCreate one; the leak and
    // the weights are not NCCL's.
    let lm = leak.library_memory.as_ref().expect("library_memory");
    assert_eq!(lm.source, "stack_modules");
    let nccl: Vec<_> = lm
        .libraries
        .iter()
        .filter(|l| l.library == "nccl")
        .collect();
    assert_eq!(nccl.len(), 1, "{:?}", lm.libraries);
    assert_eq!((nccl[0].bytes, nccl[0].count), (96 << 20, 2));
    assert_eq!(nccl[0].device, 0);
    assert!(nccl[0].apis.contains(&"cudaMalloc".to_string()));
    assert!(nccl[0].apis.contains(&"cuMemCreate".to_string()));
    assert!(nccl[0].modules[0].ends_with("/libnccl.so.2"), "{nccl:?}");
    assert_eq!(lm.libraries.len(), 1, "only NCCL is a library here");
    // The report names it too.
    let o = cli()
        .arg("report")
        .arg(
            files
                .iter()
                .find(|f| read_dump(f).unwrap() == *leak)
                .unwrap(),
        )
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("By library"), "{report}");
    let line = report.lines().find(|l| l.contains("  NCCL ")).unwrap_or("");
    assert!(
        line.contains("96.00 MiB") && line.contains("libnccl.so.2"),
        "{report}"
    );
    assert!(
        report.contains("rank 2 / local rank 2, world size 4, job job-18"),
        "{report}"
    );

    // merge: rank 2 ran out first, rank 3 later; rank 2 is far above the median; the others
    // had room for its request; NCCL's share per process.
    let o = cli().arg("merge").arg(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    let first = text
        .lines()
        .find(|l| l.contains("first to run out of memory"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        first.contains("first to run out of memory: rank 2 (")
            && first.contains("before the next (rank 3 (")
            && first.contains("2 of 4 processes ran out"),
        "{text}"
    );
    assert!(text.contains("imbalance: rank 2 ("), "{text}");
    assert!(
        text.contains("room on the others: 2 of the 2 processes that did not run out had the 256.00 MiB rank 2"),
        "{text}"
    );
    assert!(text.contains("NCCL holds 96.00 MiB per process"), "{text}");
    let j = merge_json_of(dir.path());
    assert_eq!(j["first_failure"]["process"]["rank"], 2);
    assert_eq!(j["first_failure"]["next"]["process"]["rank"], 3);
    assert_eq!(j["imbalanced"][0]["rank"], 2);
}

#[test]
fn slurm_style_job_over_per_host_directories() {
    // Each "host" writes to its own directory, as node-local disks do; merge reads them all.
    let root = tempfile::tempdir().unwrap();
    let host_dir = |r: u32| root.path().join(format!("node{}", r / 2));
    for r in 0..2 {
        std::fs::create_dir_all(host_dir(r * 2)).unwrap();
    }
    let outs = run_job(4, |r| {
        pairs(&[
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_LOCALID", (r % 2).to_string()),
            ("SLURM_NTASKS", "4".into()),
            ("SLURM_JOB_ID", "4242".into()),
            ("SIM_LEAK_RANK", "1".into()),
            ("OOMSHIM_AT_EXIT", "1".into()),
            ("OOMSHIM_DIR", host_dir(r).to_str().unwrap().to_string()),
        ])
    });
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    assert_eq!(codes, [Some(0), Some(3), Some(0), Some(0)], "{outs:?}");
    let dumps: Vec<Dump> = dumps_in(&host_dir(0))
        .iter()
        .map(|p| read_dump(p).unwrap())
        .collect();
    let leak = oom_dump_of(&dumps, 1);
    assert_eq!(
        (
            leak.process.rank,
            leak.process.local_rank,
            leak.process.world_size,
            leak.process.launcher.as_deref(),
            leak.process.job_id.as_deref()
        ),
        (Some(1), Some(1), Some(4), Some("slurm"), Some("4242"))
    );
    assert_eq!(
        leak.config
            .as_ref()
            .unwrap()
            .env
            .get("SLURM_JOB_ID")
            .map(String::as_str),
        Some("4242"),
        "the launcher's variables are in the configuration snapshot"
    );
    let o = cli()
        .arg("merge")
        .arg(host_dir(0))
        .arg(host_dir(2))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("first to run out of memory: rank 1 (")
            && text.contains("the only one of 4 processes that ran out"),
        "{text}"
    );
    assert!(text.contains("imbalance: rank 1 ("), "{text}");
    assert!(
        text.contains("3 of the 3 processes that did not run out"),
        "{text}"
    );
}

/// "Why this rank" on real rank dumps: rank 1 leaks and runs out first; rank 3 runs out of
/// memory 6 s after its steps, long after rank 1, as a rank whose collective timed out would:
/// `merge` names the cascade and that rank 1's failure is the one to fix, in text, JSON and HTML.
#[test]
fn a_late_failure_after_the_first_is_named_a_cascade() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let outs = run_job(4, |r| {
        pairs(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "4".into()),
            ("SIM_LEAK_RANK", "1".into()),
            ("SIM_LATE_OOM_RANK", "3".into()),
            ("SIM_LATE_OOM_MS", "6000".into()),
            ("OOMSHIM_DIR", d.clone()),
        ])
    });
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    assert_eq!(codes, [Some(0), Some(3), Some(0), Some(3)], "{outs:?}");
    let o = cli().arg("merge").arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let why = text
        .split("\nWhy this rank\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        why.contains("- rank 1 failed first; rank 3 failed ")
            && why.contains(
                "s later, together, after a collective timed out: a cascade; fix rank 1's failure"
            ),
        "{text}"
    );
    let j = merge_json_of(dir.path());
    let rule = |name: &str| {
        j["why"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["rule"] == name)
            .unwrap()
            .clone()
    };
    let cascade = rule("cascade");
    assert_eq!(cascade["applies"], true);
    assert_eq!(cascade["ranks"], serde_json::json!([1, 3]));
    // The C ranks have no kinds: those rules say so.
    let edges = rule("pipeline_edges");
    assert_eq!(edges["applies"], false);
    assert!(edges["text"].as_str().unwrap().contains("kinds"));
    // The page.
    let page = dir.path().join("merge.html");
    let o = cli()
        .arg("merge")
        .arg(dir.path())
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<li data-rule=\"cascade\">rank 1 failed first"),
        "{html}"
    );
}
