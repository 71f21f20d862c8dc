//! [`OTHER_PROCESSES`](super::OTHER_PROCESSES): processes other than this one hold enough of the
//! device to matter. Its sentences are in `words/other_processes.rs`.

use super::context::Ctx;

/// Smallest share of the device's memory that other processes must hold for
/// [`OTHER_PROCESSES`](super::OTHER_PROCESSES): display servers and monitoring agents hold a few hundred MiB, which
/// does not change what fits.
pub const OTHER_PROCESSES_MIN_SHARE: f64 = 0.05;

/// Other processes on the device hold at least [`OTHER_PROCESSES_MIN_SHARE`] of its memory (of
/// the memory in use when the total is unknown).
pub(super) fn holds(c: &Ctx) -> bool {
    let others_threshold = c.n.total.or(c.used).map_or(1, |t| {
        (OTHER_PROCESSES_MIN_SHARE * t as f64).ceil().max(1.0) as u64
    });
    !c.others.is_empty() && c.others_bytes >= others_threshold
}

#[cfg(test)]
mod tests {
    use crate::verdict::tests::{check_common, kinds, oom_dump, process, with_processes, GIB};
    use crate::verdict::{judge, OTHER_PROCESSES, OWN_ALLOCATIONS, UNTRACKED_MEMORY};
    use dump::model::{Dump, GpuProcesses};
    use dump::model::{GpuProcess, Relation};

    fn untracked_fixture() -> Dump {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/oom_untracked.json");
        dump::read::parse_dump(&std::fs::read(&path).unwrap(), &path).unwrap()
    }

    fn untracked_with_processes(processes: Vec<GpuProcess>, error: Option<&str>) -> Dump {
        let mut d = untracked_fixture();
        let device = d.failed_request.as_ref().unwrap().device;
        d.gpu_processes = Some(GpuProcesses {
            device,
            matched_by: "index".into(),
            processes,
            error: error.map(str::to_string),
        });
        d
    }

    fn used_untracked(d: &Dump) -> u64 {
        let failing = d.failed_request.as_ref().unwrap().device;
        let dev = d.devices.iter().find(|x| x.index == failing).unwrap();
        dev.total_bytes.unwrap() - dev.free_bytes.unwrap() - dev.tracked_bytes
    }

    #[test]
    fn another_users_process_holding_the_untracked_memory_is_named() {
        let base = untracked_fixture();
        let other = GpuProcess {
            pid: 4242,
            name: Some("python".into()),
            used_bytes: Some(used_untracked(&base) * 9 / 10),
            relation: Relation::OtherUser,
        };
        let me = GpuProcess {
            pid: base.process.pid,
            name: None,
            used_bytes: Some(1 << 30),
            relation: Relation::This,
        };
        let v = judge(&untracked_with_processes(vec![other, me], None));
        assert_eq!(v.kind, OTHER_PROCESSES, "{v:?}");
        assert!(
            v.summary.contains("process 4242 (python, another user's)"),
            "{}",
            v.summary
        );
        assert!(
            v.evidence
                .iter()
                .any(|e| e.starts_with("process 4242 (python, another user's) holds")),
            "{:?}",
            v.evidence
        );
        assert!(
            v.suggestions
                .iter()
                .any(|s| s.contains("don't try to kill it")),
            "{:?}",
            v.suggestions
        );
        assert!(!v.suggestions.iter().any(|s| s.contains("end it yourself")));
    }

    #[test]
    fn a_child_process_gets_advice_about_workers() {
        let base = untracked_fixture();
        let child = GpuProcess {
            pid: 77,
            name: Some("pt_data_worker".into()),
            used_bytes: Some(used_untracked(&base)),
            relation: Relation::Child,
        };
        let v = judge(&untracked_with_processes(vec![child], None));
        assert_eq!(v.kind, OTHER_PROCESSES);
        assert!(
            v.suggestions
                .iter()
                .any(|s| s.contains("child of this process")),
            "{:?}",
            v.suggestions
        );
    }

    #[test]
    fn small_other_processes_or_no_nvml_leave_it_untracked() {
        let base = untracked_fixture();
        let small = GpuProcess {
            pid: 5,
            name: None,
            used_bytes: Some(used_untracked(&base) / 10),
            relation: Relation::SameUser,
        };
        assert_eq!(
            judge(&untracked_with_processes(vec![small], None)).kind,
            UNTRACKED_MEMORY
        );
        let v = judge(&untracked_with_processes(
            vec![],
            Some("NVML is not available (library not found)"),
        ));
        assert_eq!(v.kind, UNTRACKED_MEMORY);
        assert!(v.evidence.iter().any(
            |e| e.contains("other processes on device") && e.contains("NVML is not available")
        ));
    }

    #[test]
    fn other_processes_threshold() {
        // 5% of an 80 GiB device is 4 GiB. This process's own allocations fill the rest.
        for (others, listed) in [(4 * GIB, true), (4 * GIB - 1, false)] {
            let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
            with_processes(&mut d, vec![process(7, others, Relation::SameUser)]);
            let v = judge(&d);
            check_common(&v);
            let want: &[&str] = if listed {
                &[OWN_ALLOCATIONS, OTHER_PROCESSES]
            } else {
                &[OWN_ALLOCATIONS]
            };
            assert_eq!(kinds(&v), want, "{others}");
            assert_eq!(v.findings[0].bytes, 70 * GIB);
        }
    }
}
