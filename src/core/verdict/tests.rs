//! The fixtures the verdict's tests share (a hand-built out-of-memory dump, growth, other
//! processes, free blocks), and the tests across kinds: the table of kinds, the ranking of
//! several findings, a finding for every dump, extreme numbers, old dumps. Each kind's own tests
//! sit in its file.

use super::*;
pub(crate) use dump::fixtures::{frame, oom_dump, site};
use dump::model::*;
use dump::model::{GpuProcess, Relation};

pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const MIB: u64 = 1 << 20;

pub(crate) fn contains_all(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().all(|n| haystack.contains(n))
}

pub(crate) fn kinds(v: &Verdict) -> Vec<&str> {
    v.findings.iter().map(|f| f.kind.as_str()).collect()
}

/// torch's snapshot of a fragmented cache: 8 GiB free, no block larger than 1 GiB.
pub(crate) fn torch_fragmented_free_blocks() -> FreeBlocks {
    FreeBlocks {
        source: "torch-snapshot".into(),
        reason: None,
        total_free_bytes: Some(8 * GIB),
        largest_free_bytes: Some(GIB),
        fragmentation: Some(0.875),
        histogram: vec![],
        ..Default::default()
    }
}

pub(crate) fn growing(name: &str, per_step: u64, steps: u64) -> GrowthSite {
    growing_in("/home/u/train.py", name, per_step, steps)
}

/// A site that grew by `per_step` bytes over `steps` steps, perfectly linearly, at `file`:12.
pub(crate) fn growing_in(file: &str, name: &str, per_step: u64, steps: u64) -> GrowthSite {
    GrowthSite {
        bytes_per_step: per_step,
        r_squared: 1.0,
        samples: steps,
        first: GrowthPoint { step: 1, bytes: 0 },
        last: GrowthPoint {
            step: steps,
            bytes: per_step * (steps - 1),
        },
        projected_oom_step: Some(steps + 2),
        stack: vec![Frame {
            address: "0x1".into(),
            function: Some(name.into()),
            file: Some(file.into()),
            line: Some(12),
            ..Frame::default()
        }],
        share: None,
        grouped_by: None,
    }
}

pub(crate) fn growth(steps: &str, site: GrowthSite, detected: Option<DetectedSteps>) -> Growth {
    let rate = site.bytes_per_step;
    Growth {
        unit: "step".into(),
        steps: Some(steps.into()),
        detected,
        samples: site.samples,
        current: site.last.step,
        free_bytes: Some(GIB),
        projected_oom_step: site.projected_oom_step,
        tracked: (1..=site.samples)
            .map(|i| GrowthPoint {
                step: i,
                bytes: i * rate,
            })
            .collect(),
        sites: vec![site],
        fit: None,
        framework_live: vec![],
        timeline: None,
    }
}

pub(crate) fn process(pid: u32, bytes: u64, relation: Relation) -> GpuProcess {
    GpuProcess {
        pid,
        name: Some("python".into()),
        used_bytes: Some(bytes),
        relation,
    }
}

pub(crate) fn with_processes(d: &mut Dump, processes: Vec<GpuProcess>) {
    d.gpu_processes = Some(GpuProcesses {
        device: 0,
        matched_by: "index".into(),
        processes,
        error: None,
    });
}

pub(crate) fn cache(
    source: &str,
    total_free: u64,
    largest: u64,
    inactive: Option<u64>,
) -> FreeBlocks {
    FreeBlocks {
        source: source.into(),
        total_free_bytes: Some(total_free),
        largest_free_bytes: Some(largest),
        fragmentation: Some(1.0 - largest as f64 / total_free.max(1) as f64),
        inactive_split_bytes: inactive,
        ..Default::default()
    }
}

pub(crate) fn sizes(distinct_large: u64, large: u64) -> RequestSizes {
    RequestSizes {
        window: 4096,
        distinct: distinct_large + 3,
        large,
        distinct_large,
        large_bytes: MIB,
        ..Default::default()
    }
}

pub(crate) fn check_common(v: &Verdict) {
    assert!(!v.findings.is_empty());
    assert_eq!(v.kind, v.findings[0].kind, "kind is the top finding's");
    for w in v.findings.windows(2) {
        assert!(w[0].bytes >= w[1].bytes, "ranked by bytes: {:?}", kinds(v));
    }
    for f in &v.findings {
        assert!(
            !f.headline.contains('\n') && !f.headline.is_empty(),
            "{f:?}"
        );
        assert!(!f.summary.contains('\n'), "{f:?}");
        assert!(
            f.suggestions.iter().all(|s| !s
                .replace("don't try to kill it", "")
                .replace("out-of-memory kill", "")
                .contains("kill")),
            "never suggest killing: {f:?}"
        );
        for s in &f.suggestions {
            assert!(
                v.suggestions.contains(s),
                "verdict carries every suggestion"
            );
        }
    }
}

#[test]
fn kinds_table() {
    struct Case {
        name: &'static str,
        dump: Dump,
        kind: &'static str,
        summary_has: &'static [&'static str],
        evidence_has: &'static [&'static str],
        suggestions_has: &'static [&'static str],
    }
    let mut recovered = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
    recovered.failed_request.as_mut().unwrap().recovered = Some(true);
    let mut stood = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
    stood.failed_request.as_mut().unwrap().recovered = Some(false);
    let mut burst = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
    burst.failed_request.as_mut().unwrap().failures_in_burst = 3;
    let mut from_last = oom_dump(2 * GIB, None, None, 78 * GIB);
    from_last.failed_request.as_mut().unwrap().last_failure = Some(LastFailure {
        bytes: 2 * GIB,
        api: "cudaMalloc".into(),
        time_unix_ms: 1,
        tracked_bytes: 10 * GIB,
        free_bytes: Some(GIB),
        total_bytes: Some(80 * GIB),
    });
    let mut fragmented = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
    fragmented.free_blocks = torch_fragmented_free_blocks();
    let mut other_device = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
    other_device.failed_request.as_mut().unwrap().device = 3;
    let mut big_request_no_free = oom_dump(100 * GIB, Some(80 * GIB), None, 0);
    big_request_no_free.devices[0].free_bytes = None;

    let cases = vec![
        Case {
            name: "own allocations fill the device",
            dump: oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB),
            kind: OWN_ALLOCATIONS,
            summary_has: &["own allocations fill device 0", "78.00 GiB of the 79.00 GiB in use (98.7%)", "forward (model.py:42)", "39.00 GiB in 5 allocations (49.4% of the memory in use)"],
            evidence_has: &["device 0: 79.00 GiB of 80.00 GiB in use; 78.00 GiB tracked (98.7% of used)", "top site: forward (model.py:42) holds 39.00 GiB in 5 allocations (49.4% of used)", "1.00 GiB free, less than the 2.00 GiB request", "recovered: unknown"],
            suggestions_has: &["forward (model.py:42) keeps alive", "loss.item()", "batch size"],
        },
        Case {
            name: "untracked: another process",
            dump: oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 10 * GIB),
            kind: UNTRACKED_MEMORY,
            summary_has: &["79.00 GiB of 80.00 GiB was in use", "only 10.00 GiB (12.7%)", "69.00 GiB untracked", "another process", "CUDA context"],
            evidence_has: &["untracked: 69.00 GiB of the 79.00 GiB in use (87.3%)"],
            suggestions_has: &["nvidia-smi", "CUDA_VISIBLE_DEVICES"],
        },
        Case {
            name: "request exceeds device",
            dump: oom_dump(100 * GIB, Some(80 * GIB), Some(79 * GIB), GIB),
            kind: REQUEST_EXCEEDS_DEVICE,
            summary_has: &["larger than the whole device: 100.00 GiB was asked of device 0, which has 80.00 GiB in total"],
            evidence_has: &["failed request: 100.00 GiB (107,374,182,400 bytes) via cudaMalloc on device 0 (error 2)", "failing call: cudaMalloc"],
            suggestions_has: &["100.00 GiB at cudaMalloc", "wrong shape"],
        },
        Case {
            name: "request exceeds device, free unknown",
            dump: big_request_no_free,
            kind: REQUEST_EXCEEDS_DEVICE,
            summary_has: &["which has 80.00 GiB in total"],
            evidence_has: &["memory numbers unavailable (total 80.00 GiB); 0 B tracked in 12 allocations"],
            suggestions_has: &[],
        },
        Case {
            name: "device numbers unavailable, tracked bytes present",
            dump: oom_dump(2 * GIB, None, None, 40 * GIB),
            kind: OWN_ALLOCATIONS,
            summary_has: &["memory numbers were unavailable", "tracked bytes alone", "40.00 GiB", "forward (model.py:42)"],
            evidence_has: &["device 0: memory numbers unavailable; 40.00 GiB tracked in 12 allocations"],
            suggestions_has: &["nvidia-smi"],
        },
        Case {
            name: "device numbers unavailable, nothing tracked",
            dump: oom_dump(2 * GIB, None, None, 0),
            kind: UNTRACKED_MEMORY,
            summary_has: &["memory numbers were unavailable", "no tracked memory on device 0"],
            evidence_has: &["memory numbers unavailable; 0 B tracked in 12 allocations"],
            suggestions_has: &["nvidia-smi"],
        },
        Case {
            name: "free known, total unknown",
            dump: oom_dump(2 * GIB, None, Some(GIB), 40 * GIB),
            kind: OWN_ALLOCATIONS,
            summary_has: &["tracked bytes alone"],
            evidence_has: &["1.00 GiB free, less than the 2.00 GiB request"],
            suggestions_has: &[],
        },
        Case {
            name: "failing device not in the device list",
            dump: other_device,
            kind: UNTRACKED_MEMORY,
            summary_has: &["no tracked memory on device 3"],
            evidence_has: &["device 3: memory numbers unavailable; no tracked numbers for this device"],
            suggestions_has: &["GPU 3"],
        },
        Case {
            name: "numbers from the last failure",
            dump: from_last,
            kind: UNTRACKED_MEMORY,
            summary_has: &["only 10.00 GiB"],
            evidence_has: &["device 0 at the last failure of the burst: 79.00 GiB of 80.00 GiB in use; 10.00 GiB tracked", "last failure of the burst: 2.00 GiB via cudaMalloc; 1.00 GiB free of 80.00 GiB; 10.00 GiB tracked"],
            suggestions_has: &[],
        },
        Case {
            name: "recovered",
            dump: recovered,
            kind: OWN_ALLOCATIONS,
            summary_has: &["This failure was recovered by a retry", "did not see this error", "own allocations"],
            evidence_has: &["recovered: yes"],
            suggestions_has: &[],
        },
        Case {
            name: "stood",
            dump: stood,
            kind: OWN_ALLOCATIONS,
            summary_has: &["the program saw this out-of-memory error"],
            evidence_has: &["recovered: no"],
            suggestions_has: &[],
        },
        Case {
            name: "burst hints at fragmentation as a possibility",
            dump: burst,
            kind: OWN_ALLOCATIONS,
            summary_has: &[],
            evidence_has: &["failures in this burst: 3"],
            suggestions_has: &["Possibly fragmentation (the allocation failed 3 times in one burst)", "not established", "expandable_segments:True"],
        },
        Case {
            name: "small request with more free than asked",
            dump: oom_dump(512 * MIB, Some(80 * GIB), Some(GIB), 78 * GIB + 512 * MIB),
            kind: OWN_ALLOCATIONS,
            summary_has: &[],
            evidence_has: &["1.00 GiB free, not less than the 512.00 MiB request"],
            suggestions_has: &["Possibly fragmentation (1.00 GiB was free, not less than the 512.00 MiB request)"],
        },
        Case {
            name: "fragmentation shown by free-block data",
            dump: fragmented,
            kind: FRAGMENTATION,
            summary_has: &["fragmented: 8.00 GiB was free in the allocator's blocks (torch-snapshot)", "largest free block was only 1.00 GiB"],
            evidence_has: &["free blocks (torch-snapshot): 8.00 GiB free, largest block 1.00 GiB (87.5% fragmentation)"],
            suggestions_has: &["expandable_segments:True", "empty_cache"],
        },
        Case {
            name: "empty device at capture",
            dump: oom_dump(2 * GIB, Some(80 * GIB), Some(80 * GIB), 0),
            kind: OWN_ALLOCATIONS,
            summary_has: &["showed no memory in use", "released between the failure and the capture", "No allocation sites were recorded"],
            evidence_has: &["0 B of 80.00 GiB in use; 0 B tracked (n/a of used)"],
            suggestions_has: &[],
        },
    ];
    for case in cases {
        let v = judge(&case.dump);
        assert_eq!(v.kind, case.kind, "{}: {v:#?}", case.name);
        assert!(
            contains_all(&v.summary, case.summary_has),
            "{}: summary {:?}",
            case.name,
            v.summary
        );
        let evidence = v.evidence.join("\n");
        assert!(
            contains_all(&evidence, case.evidence_has),
            "{}: evidence\n{evidence}",
            case.name
        );
        let suggestions = v.suggestions.join("\n");
        assert!(
            contains_all(&suggestions, case.suggestions_has),
            "{}: suggestions\n{suggestions}",
            case.name
        );
        assert!(!v.summary.contains('\n'), "{}: one paragraph", case.name);
        assert!(
            !suggestions.to_lowercase().contains("kill"),
            "{}: never suggest killing",
            case.name
        );
        assert_eq!(judge(&case.dump), v, "{}: deterministic", case.name);
    }
}

/// Another process holds 60 GiB AND a leak grows 512 MiB a step AND the cache is fragmented:
/// three findings, ranked by the bytes each explains.
#[test]
fn several_findings_are_ranked_by_bytes_explained() {
    let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 19 * GIB);
    with_processes(
        &mut d,
        vec![
            process(4242, 60 * GIB, Relation::OtherUser),
            process(4812, 19 * GIB, Relation::This),
        ],
    );
    d.growth = Some(growth("marked", growing("keep", 512 * MIB, 20), None));
    d.free_blocks = cache("torch-snapshot", 4 * GIB, 512 * MIB, Some(3 * GIB));
    let v = judge(&d);
    check_common(&v);
    assert_eq!(kinds(&v), [OTHER_PROCESSES, LEAK, FRAGMENTATION], "{v:#?}");
    let bytes: Vec<u64> = v.findings.iter().map(|f| f.bytes).collect();
    assert_eq!(bytes, [60 * GIB, 20 * 512 * MIB, 4 * GIB]);
    assert_eq!(v.kind, OTHER_PROCESSES);
    assert!(v.findings[0]
        .headline
        .contains("other processes hold 60.00 GiB on device 0; the largest is process 4242 (python, another user's) with 60.00 GiB"));
    assert!(v.findings[1].headline.contains(
        "keep (train.py:12) grows by 512.00 MiB every step (over the last 20 marked steps; 10.00 GiB so far, 100.0% of the growth)"
    ));
    assert!(v.findings[2].headline.contains(
        "4.00 GiB free in the cache (torch-snapshot) but the largest free block is 512.00 MiB"
    ));
    assert!(v.findings[2]
        .evidence
        .iter()
        .any(|e| e.starts_with("inactive split bytes: 3.00 GiB")));
    // Suggestions in rank order: the other process's, the leak's, then fragmentation's.
    let pos = |needle: &str| {
        v.suggestions
            .iter()
            .position(|s| s.contains(needle))
            .unwrap()
    };
    assert!(pos("don't try to kill it") < pos("loss.item()"));
    assert!(pos("loss.item()") < pos("expandable_segments:True"));
    // The untracked memory is the other process's: no untracked finding, and no
    // own_allocations while a leak accounts for this process's memory.
    assert_eq!(judge(&d), v, "deterministic");
}

#[test]
fn every_dump_gets_at_least_one_finding() {
    let values = [
        None,
        Some(0),
        Some(1),
        Some(GIB),
        Some(80 * GIB),
        Some(u64::MAX),
    ];
    for total in values {
        for free in values {
            for tracked in [0, 1, GIB, 79 * GIB, u64::MAX] {
                for others in [0, GIB, 60 * GIB] {
                    let mut d = oom_dump(2 * GIB, total, free, tracked);
                    with_processes(&mut d, vec![process(3, others, Relation::Unknown)]);
                    let v = judge(&d);
                    assert!(
                        !v.findings.is_empty(),
                        "{total:?} {free:?} {tracked} {others}"
                    );
                    check_common(&v);
                }
            }
        }
    }
}

#[test]
fn extreme_numbers_do_not_panic() {
    for (req, total, free, tracked) in [
        (u64::MAX, Some(u64::MAX), Some(u64::MAX), u64::MAX),
        (0, Some(0), Some(u64::MAX), 0),
        (0, Some(0), Some(0), u64::MAX),
        (1, None, Some(0), 0),
    ] {
        let mut dump = oom_dump(req, total, free, tracked);
        dump.devices.push(dump.devices[0].clone());
        dump.failed_request.as_mut().unwrap().failures_in_burst = u32::MAX;
        let _ = judge(&dump);
    }
}

#[test]
fn old_dumps_without_findings_still_parse_and_get_them_when_judged() {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("tests/fixtures/oom_fragmentation.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("\"findings\""));
    let d = dump::read::parse_dump(text.as_bytes(), &path).unwrap();
    assert!(d.verdict.findings.is_empty());
    let v = judge(&d);
    check_common(&v);
    assert_eq!(v.kind, FRAGMENTATION);
    // Serialised, the new keys appear; an empty list is left out.
    let json = serde_json::to_string(&v).unwrap();
    assert!(json.contains("\"findings\":[{\"kind\":\"fragmentation\""));
    let empty = serde_json::to_string(&Verdict::default()).unwrap();
    assert!(!empty.contains("findings"));
}
