//! `oomshim run`'s part of the answer reaching the job (src/core/jobfiles.rs): after it wrote a
//! post-mortem, the dead process's torchelastic error file and Kubernetes termination message;
//! and `--exit-code`, the exit status a scheduler's policy can act on.
//!
//! The race with torchrun's agent over a SIGKILLed worker: the agent reads a worker's error
//! file once, right after it reaps the worker, and it polls its workers every
//! `--monitor-interval` (0.1 s by default). oomshim learns of the death the moment the worker
//! becomes a zombie (a pidfd per process of its tree), reads its live region, judges it, and
//! writes the error file first, before the post-mortem dump (the file names the dump's path
//! ahead of it). When the agent reaps the worker before the file exists, torchrun shows what it
//! shows bare: `exitcode: -9`, `Signal 9 (SIGKILL) received by PID N`, `error_file: <N/A>`;
//! oomshim then says on stderr that torchrun missed it, and the dump, its stderr lines and the
//! termination message still carry the answer.

use dump::model::Dump;
use oomshim_core::jobfiles::{self, Answer, Targets, TERMINATION_MAX};
use std::path::{Path, PathBuf};

/// Where a process's answer goes, from its environment as it started (`/proc/PID/environ`,
/// readable while it runs): its `TORCHELASTIC_ERROR_FILE` and its own settings.
pub fn targets_of_pid(pid: i32) -> Targets {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    targets_of_environ(&raw)
}

/// [`targets_of_pid`] from the bytes of an environ file (`NAME=value` entries, NUL-separated).
pub fn targets_of_environ(raw: &[u8]) -> Targets {
    let vars: Vec<(&[u8], &[u8])> = raw
        .split(|&b| b == 0)
        .filter_map(|e| {
            let i = e.iter().position(|&b| b == b'=')?;
            Some((&e[..i], &e[i + 1..]))
        })
        .collect();
    let lookup = |k: &str| {
        // The first, as getenv (and so the process's own shim) sees it.
        vars.iter()
            .find(|(n, _)| *n == k.as_bytes())
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let (config, _) = oomshim_core::config::Config::from_lookup(lookup);
    Targets::of(&config, lookup)
}

/// The dump's path, as the writer will name it (first free sequence number), so the error file
/// can go out before the dump.
pub fn planned_path(dir: &Path, name: &dump::write::DumpName) -> PathBuf {
    (dump::write::next_sequence()..)
        .take(10_000)
        .map(|seq| dir.join(name.file_name(seq)))
        .find(|p| !p.exists())
        .unwrap_or_else(|| dir.join(name.file_name(dump::write::next_sequence())))
}

/// The torchelastic error file of a process that died (written before its dump, for the race
/// with torchrun's agent). `reaped`: asked once the file is written, whether the process's parent
/// has reaped it, so the agent may have read no file. Says on stderr what went wrong.
pub fn error_file_after_death(
    dump: &Dump,
    dump_path: &Path,
    targets: &Targets,
    reaped: impl Fn() -> bool,
    say: impl Fn(&str),
) {
    let Some(path) = &targets.error_file else {
        return;
    };
    if !jobfiles::post_mortem_leaves_answer(dump) {
        return;
    }
    let answer = Answer::of(dump, Some(dump_path));
    let written = jobfiles::write_error_file(path, &answer);
    // Asked once the file is in place: the agent reaps a worker, then reads its file, so a
    // parent that had not reaped by now reads this file; one that had may have read none (a
    // reap between a check made before the write and the write itself would go unsaid).
    let missed = reaped();
    match written {
        Ok(_) if missed => say(&format!(
            "oomshim:   its parent reaped PID {} before oomshim's error file {} was in place: torchrun's root cause \
             may show the signal only",
            dump.process.pid,
            path.display()
        )),
        Ok(_) => {}
        Err(e) => say(&format!(
            "oomshim:   cannot write torchelastic's error file {}: {e}",
            path.display()
        )),
    }
}

/// The termination message of a process that died, once its dump is written (`dump_path`) or
/// failed to be.
pub fn termination_after_death(
    dump: &Dump,
    dump_path: Option<&Path>,
    targets: &Targets,
    say: impl Fn(&str),
) {
    let Some(path) = &targets.termination_log else {
        return;
    };
    if !jobfiles::post_mortem_leaves_answer(dump) {
        return;
    }
    let answer = Answer::of(dump, dump_path);
    let create = path.as_path() != Path::new(oomshim_core::config::DEFAULT_TERMINATION_LOG);
    if let Err(e) = jobfiles::append_termination(path, &answer.text(TERMINATION_MAX), create) {
        say(&format!(
            "oomshim:   cannot write the termination message {}: {e}",
            path.display()
        ));
    }
}

/// `oomshim run --exit-code`: the status for a run whose program failed, from the first failure
/// of its tree that got a dump (an out-of-memory failure that stood, or a post-mortem; the
/// root cause, as torchrun chooses it): 75 for `elsewhere`, 78 for `after_change`; `None` (the
/// program's own status) for `unknown`, or when no dump of this run is found. A dump belongs to
/// the run when the shim that wrote it was under this `oomshim run` (its `OOMSHIM_SUPERVISOR`
/// token) or this run wrote it (a post-mortem of one of its processes).
pub fn exit_code_for_run(dump_dir: &Path, token: &str, post_mortems: &[Dump]) -> Option<i32> {
    let mut dumps: Vec<Dump> = post_mortems.to_vec();
    if let Ok(entries) = std::fs::read_dir(dump_dir) {
        for e in entries.flatten().take(100_000) {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(d) = dump::read::read_dump(&p) else {
                continue;
            };
            let ours = d
                .config
                .as_ref()
                .and_then(|c| c.env.get(oomshim_core::flight::SUPERVISOR_ENV))
                .is_some_and(|t| t == token);
            let stood = d
                .failed_request
                .as_ref()
                .is_some_and(|r| r.recovered != Some(true));
            if ours && stood && d.post_mortem.is_none() {
                dumps.push(d);
            }
        }
    }
    let first = dumps
        .iter()
        .filter(|d| d.verdict.retry.is_some())
        .min_by_key(|d| {
            d.post_mortem
                .as_ref()
                .map_or(d.time_unix_ms, |pm| pm.died_unix_ms)
        })?;
    oomshim_core::verdict::retry::exit_code(&first.verdict.retry.as_ref()?.hint)
}
