//! Which rank of which job a process is, from the variables its launcher sets. Read when a dump
//! is written; nothing is asked of the launcher itself.
//!
//! Precedence: torchrun's variables first (under Slurm, `srun torchrun …` gives each torchrun
//! agent a `SLURM_PROCID` that is the node's task, not the worker's rank), then Slurm's, Open
//! MPI's and PMI's (MPICH, Intel MPI, Slurm's PMI plug-ins).

/// A process's place in its job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankInfo {
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// `torchrun`, `slurm`, `openmpi`, `pmi`.
    pub launcher: Option<&'static str>,
    pub job_id: Option<String>,
}

/// (launcher, rank variable, local rank variable, world size variable), in precedence order.
const LAUNCHERS: &[(&str, &str, &str, &str)] = &[
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ),
    ("pmi", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
];

/// Job identifiers, in precedence order. torchrun's run id defaults to the word `none`.
const JOB_IDS: &[&str] = &[
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "PBS_JOBID",
    "LSB_JOBID",
];

/// Every variable this module reads (the dump's configuration snapshot keeps them too).
pub fn variables() -> impl Iterator<Item = &'static str> {
    LAUNCHERS
        .iter()
        .flat_map(|(_, r, l, w)| [*r, *l, *w])
        .chain(JOB_IDS.iter().copied())
}

/// Longest job id kept: an identifier, not a payload.
const MAX_JOB_ID: usize = 128;

/// The rank facts from `lookup` (a variable's value). A launcher counts only when its rank
/// variable parses; its local rank and world size are taken from the same launcher only, so
/// two launchers' numbers are never mixed.
pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> RankInfo {
    let num = |k: &str| lookup(k).and_then(|v| v.trim().parse::<u32>().ok());
    let mut info = RankInfo::default();
    for &(launcher, rank, local, world) in LAUNCHERS {
        if let Some(r) = num(rank) {
            info.rank = Some(r);
            info.local_rank = num(local);
            info.world_size = num(world);
            info.launcher = Some(launcher);
            break;
        }
    }
    info.job_id = JOB_IDS.iter().find_map(|k| {
        let v = lookup(k)?;
        let v = v.trim();
        let usable = !v.is_empty()
            && (*k != "TORCHELASTIC_RUN_ID" || v != "none")
            && v.len() <= MAX_JOB_ID
            && v.chars().all(|c| c.is_ascii_graphic());
        usable.then(|| v.to_string())
    });
    info
}

/// The rank facts of this process.
pub fn current() -> RankInfo {
    from_env(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun_variables_give_rank_local_rank_world_size_and_run_id() {
        let i = from_env(env(&[
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("TORCHELASTIC_RUN_ID", "job-42"),
        ]));
        assert_eq!(
            i,
            RankInfo {
                rank: Some(5),
                local_rank: Some(1),
                world_size: Some(8),
                launcher: Some("torchrun"),
                job_id: Some("job-42".into()),
            }
        );
        // torchrun's default run id is the word "none": no job id.
        let i = from_env(env(&[("RANK", "0"), ("TORCHELASTIC_RUN_ID", "none")]));
        assert_eq!(i.job_id, None);
    }

    #[test]
    fn torchrun_under_slurm_takes_torchruns_rank_and_slurms_job() {
        let i = from_env(env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "777"),
            ("RANK", "9"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "16"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ]));
        assert_eq!(
            (i.rank, i.local_rank, i.world_size, i.launcher),
            (Some(9), Some(1), Some(16), Some("torchrun"))
        );
        assert_eq!(i.job_id.as_deref(), Some("777"));
    }

    #[test]
    fn slurm_openmpi_and_pmi_alone() {
        let s = from_env(env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_ID", "12345"),
        ]));
        assert_eq!(
            (s.rank, s.local_rank, s.world_size, s.launcher),
            (Some(3), Some(3), Some(4), Some("slurm"))
        );
        assert_eq!(s.job_id.as_deref(), Some("12345"));
        let o = from_env(env(&[
            ("OMPI_COMM_WORLD_RANK", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
        ]));
        assert_eq!(
            (o.rank, o.local_rank, o.world_size, o.launcher),
            (Some(6), Some(2), Some(8), Some("openmpi"))
        );
        let p = from_env(env(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALRANKID", "0"),
        ]));
        assert_eq!(
            (p.rank, p.local_rank, p.world_size, p.launcher),
            (Some(2), Some(0), Some(3), Some("pmi"))
        );
    }

    #[test]
    fn malformed_values_are_ignored_not_mixed() {
        // A RANK that does not parse does not make torchrun the launcher; Slurm's numbers are
        // used whole, never torchrun's LOCAL_RANK with Slurm's rank.
        let i = from_env(env(&[
            ("RANK", "zero"),
            ("LOCAL_RANK", "7"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "x"),
        ]));
        assert_eq!(
            (i.rank, i.local_rank, i.world_size, i.launcher),
            (Some(2), None, None, Some("slurm"))
        );
        // A job id with control characters or of absurd length is dropped.
        let i = from_env(env(&[("SLURM_JOB_ID", "12\n34")]));
        assert_eq!(i.job_id, None);
        let long = "9".repeat(500);
        let i = from_env(env(&[("SLURM_JOB_ID", &long), ("PBS_JOBID", "77.pbs")]));
        assert_eq!(i.job_id.as_deref(), Some("77.pbs"));
        assert_eq!(from_env(env(&[])), RankInfo::default());
    }
}
