//! The answer where a job's scheduler reads it: torchelastic's error file (torchrun's "Root
//! Cause") and Kubernetes' termination message. Both are written when a failure ends the
//! process: by the shim at the exit of a process that ran out of device memory
//! (src/preload/failure/job.rs), and by `oomshim run` after a post-mortem
//! (src/cli/supervise.rs). Builders are pure functions of a dump; the writers never replace
//! what the program wrote for another failure.
//!
//! torchelastic's format (torch.distributed.elastic.multiprocessing.errors): `@record` writes
//! `{"message": {"message": "Type: text", "extraInfo": {"py_callstack": TRACEBACK, "timestamp":
//! "SECONDS"}}}` to `$TORCHELASTIC_ERROR_FILE` when the decorated function raises; the agent reads
//! the file once, when it reaps the worker, and prints `py_callstack` (else `message`) as the
//! root cause's traceback, choosing the failure with the smallest timestamp as the root cause.

use crate::config::{Config, TerminationLog, DEFAULT_TERMINATION_LOG};
use dump::model::Dump;
use dump::units::{clean, human_bytes};
use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The variable torchrun sets for each worker: where its error file goes.
pub const ERROR_FILE_ENV: &str = "TORCHELASTIC_ERROR_FILE";
/// Kubernetes reads at most this many bytes of a termination message.
pub const TERMINATION_MAX: usize = 4096;
/// Where the termination message is too full to say more than this, nothing is added.
pub const TERMINATION_MIN_ROOM: usize = 64;
/// The key oomshim's structured answer takes in the error file's `extraInfo`.
const EXTRA_KEY: &str = "oomshim";

/// Where this process's answer goes, from its settings and environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    pub error_file: Option<PathBuf>,
    pub termination_log: Option<PathBuf>,
}

impl Targets {
    /// From a process's settings and its `TORCHELASTIC_ERROR_FILE` (torchrun sets it empty when
    /// it keeps no logs: then there is none). The default termination log counts only when it
    /// exists and is writable.
    pub fn of(config: &Config, lookup: impl Fn(&str) -> Option<String>) -> Targets {
        let error_file = config
            .torchelastic
            .then(|| lookup(ERROR_FILE_ENV))
            .flatten()
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        let termination_log = match &config.termination_log {
            TerminationLog::Off => None,
            TerminationLog::Path(p) => Some(p.clone()),
            TerminationLog::Default => {
                let p = Path::new(DEFAULT_TERMINATION_LOG);
                writable(p).then(|| p.to_path_buf())
            }
        };
        Targets {
            error_file,
            termination_log,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.error_file.is_none() && self.termination_log.is_none()
    }
}

fn writable(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; `access` reads it and touches nothing else.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// What a failure says to the job, taken from its dump once.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The failure and the verdict's headline, as the stderr summary's first line says them.
    pub title: String,
    pub kind: String,
    pub headline: String,
    pub retry: Option<dump::model::RetryHint>,
    /// Torch's memory by kind at the failure, in words.
    pub kinds: Option<String>,
    /// The program's line the verdict points at.
    pub line: Option<String>,
    /// The first suggestion.
    pub change: Option<String>,
    pub dump: Option<PathBuf>,
    /// rank, pid and host, in words.
    pub process: String,
    /// When it failed (the dump's time), in whole seconds: torchelastic's root cause is the
    /// failure with the smallest timestamp.
    pub unix_s: u64,
}

impl Answer {
    /// The answer of an out-of-memory dump or a post-mortem, written (or to be written) at
    /// `path`.
    pub fn of(dump: &Dump, path: Option<&Path>) -> Answer {
        let headline = dump.verdict.headline().to_string();
        let title = match (&dump.failed_request, &dump.post_mortem) {
            (_, Some(_)) => format!("post-mortem (reconstructed): {}", clean(&headline)),
            (Some(req), None) => format!(
                "CUDA out of memory on device {} ({} of {} failed): {}: {}",
                req.device,
                clean(&req.api),
                human_bytes(req.bytes),
                clean(&dump.verdict.kind),
                clean(&headline)
            ),
            (None, None) => clean(&headline),
        };
        let p = &dump.process;
        let mut process = match (p.rank, p.local_rank) {
            (Some(r), Some(l)) => format!("rank {r} (local rank {l}), "),
            (Some(r), None) => format!("rank {r}, "),
            _ => String::new(),
        };
        process.push_str(&format!("pid {} on {}", p.pid, clean(&p.host)));
        Answer {
            title,
            kind: dump.verdict.kind.clone(),
            headline,
            retry: dump.verdict.retry.clone(),
            kinds: kinds_words(dump),
            line: line_to_change(dump),
            change: dump.verdict.suggestions.first().map(|s| clean(s)),
            dump: path.map(Path::to_path_buf),
            process,
            unix_s: dump
                .post_mortem
                .as_ref()
                .map_or(dump.time_unix_ms, |pm| pm.died_unix_ms)
                / 1000,
        }
    }

    /// The summary both files carry, one fact a line, most important first, within `max` bytes
    /// (a line that does not fit is cut at a character boundary; the lines after it are left out).
    pub fn text(&self, max: usize) -> String {
        let mut lines = vec![format!("oomshim: {}", self.title)];
        if let Some(r) = &self.retry {
            lines.push(format!("retry: {} ({})", r.hint, clean(&r.reason)));
        }
        if let Some(l) = &self.line {
            lines.push(format!("line: {l}"));
        }
        if let Some(k) = &self.kinds {
            lines.push(format!("kinds: {k}"));
        }
        if let Some(c) = &self.change {
            lines.push(format!("change: {c}"));
        }
        match &self.dump {
            Some(d) => lines.push(format!(
                "dump: {}  (details: oomshim report {})",
                d.display(),
                d.display()
            )),
            None => lines.push("dump: none written".into()),
        }
        lines.push(format!("process: {}", self.process));
        let mut out = String::new();
        for l in lines {
            let room = max.saturating_sub(out.len() + usize::from(!out.is_empty()));
            if room == 0 {
                break;
            }
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(cut(&l, room));
            if l.len() > room {
                break;
            }
        }
        out
    }

    /// oomshim's part of the error file's `extraInfo`.
    fn extra(&self) -> Value {
        json!({
            "kind": self.kind,
            "headline": self.headline,
            "retry": self.retry.as_ref().map(|r| &r.hint),
            "retry_reason": self.retry.as_ref().map(|r| &r.reason),
            "dump": self.dump,
        })
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Torch's memory by kind at the failure, in words (absent without the Python hook's count).
fn kinds_words(dump: &Dump) -> Option<String> {
    let k = dump.framework.as_ref()?.kinds.as_ref()?;
    Some(dump::view::kinds_in_words(k))
}

/// The program's line the verdict points at: the growing site of a leak, else the program's own
/// frame at the failure (torch's hook), else the failing call's innermost named frame.
pub fn line_to_change(dump: &Dump) -> Option<String> {
    let leak = dump
        .verdict
        .findings
        .iter()
        .any(|f| f.kind == crate::verdict::LEAK);
    if leak {
        if let Some(site) = dump.growth.as_ref().and_then(|g| g.sites.first()) {
            return Some(crate::verdict::short_label(&site.stack));
        }
    }
    let kinds = dump.framework.as_ref().and_then(|f| f.kinds.as_ref());
    if let Some(f) = kinds.and_then(|k| k.program_frame.as_ref()) {
        let file = f.file.rsplit('/').next().unwrap_or(&f.file);
        return Some(format!(
            "{} ({}:{})",
            clean(&f.function),
            clean(file),
            f.line
        ));
    }
    let req = dump.failed_request.as_ref()?;
    if req.stack.iter().any(|f| f.line.is_some()) {
        return Some(crate::verdict::short_label(&req.stack));
    }
    None
}

/// Whether a post-mortem's death leaves an answer for the job: a SIGKILL (the death nobody else
/// explains: torchrun shows only "Signal 9", Kubernetes "OOMKilled" or "Error"), the kernel's
/// OOM killer, an exit or a crash right after a failed device allocation. Not a process asked
/// to stop (SIGTERM, SIGINT, SIGHUP: torchrun's own SIGTERM to the other workers after a
/// failure, a pod's deletion), nor a crash with no memory failure: another reason.
pub fn post_mortem_leaves_answer(dump: &Dump) -> bool {
    let Some(pm) = &dump.post_mortem else {
        return false;
    };
    let kind = dump.verdict.kind.as_str();
    if kind == crate::verdict::HOST_OOM_KILL || kind == crate::verdict::EXITED_AFTER_FAILURE {
        return true;
    }
    match pm.signal {
        Some(libc::SIGKILL) => true,
        Some(s)
            if [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGABRT,
                libc::SIGILL,
                libc::SIGFPE,
            ]
            .contains(&s) =>
        {
            pm.last_failure.is_some()
        }
        _ => false,
    }
}

/// The error file oomshim writes for a failure that `@record` did not report (torchelastic's
/// format: the root cause shows `py_callstack`).
pub fn error_file_json(a: &Answer) -> Vec<u8> {
    let mut extra = json!({
        "py_callstack": a.text(usize::MAX),
        "timestamp": a.unix_s.to_string(),
    });
    extra[EXTRA_KEY] = a.extra();
    let v = json!({"message": {"message": format!("oomshim: {}", a.title), "extraInfo": extra}});
    serde_json::to_vec(&v).unwrap_or_default()
}

/// What an existing error file allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// The program's `@record` reported an out-of-memory error: its message and traceback, with
    /// oomshim's answer after each.
    Merged(Vec<u8>),
    /// Written for another failure: never touched.
    OtherFailure,
    /// oomshim's answer is in it already.
    AlreadyAnswered,
    /// Not torchelastic's format: never touched.
    Unreadable,
}

/// Whether an error file's message is an out-of-memory error (torch's `OutOfMemoryError`, CUDA's
/// own text, XLA's `RESOURCE_EXHAUSTED`).
fn is_out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "out of memory",
        "outofmemoryerror",
        "resource_exhausted",
        "cudaerrormemoryallocation",
    ]
    .iter()
    .any(|k| m.contains(k))
}

/// oomshim's answer added to an error file the program wrote, when it reported an out-of-memory
/// error; what the program wrote stays first and whole.
pub fn merge_error_file(existing: &[u8], a: &Answer) -> Existing {
    let Ok(mut v) = serde_json::from_slice::<Value>(existing) else {
        return Existing::Unreadable;
    };
    let addition = format!("\n{}", a.text(usize::MAX));
    match v.get_mut("message") {
        // torchelastic's structured message.
        Some(Value::Object(m)) => {
            let Some(text) = m.get("message").and_then(Value::as_str).map(str::to_string) else {
                return Existing::Unreadable;
            };
            let extra = m
                .entry("extraInfo")
                .or_insert_with(|| json!({}))
                .as_object_mut();
            let Some(extra) = extra else {
                return Existing::Unreadable;
            };
            if extra.contains_key(EXTRA_KEY) {
                return Existing::AlreadyAnswered;
            }
            let stack = extra
                .get("py_callstack")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if !is_out_of_memory(&text) && !is_out_of_memory(&stack) {
                return Existing::OtherFailure;
            }
            if !stack.is_empty() {
                let joined = format!("{}{addition}", stack.trim_end_matches('\n'));
                extra.insert("py_callstack".into(), Value::String(joined));
            }
            extra.insert(EXTRA_KEY.into(), a.extra());
            m.insert("message".into(), Value::String(format!("{text}{addition}")));
        }
        // The plain-text form torchelastic also reads (`{"message": "...", "timestamp": N}`).
        Some(Value::String(text)) => {
            if text.contains("\noomshim: ") {
                return Existing::AlreadyAnswered;
            }
            if !is_out_of_memory(text) {
                return Existing::OtherFailure;
            }
            *text = format!("{text}{addition}");
        }
        _ => return Existing::Unreadable,
    }
    match serde_json::to_vec(&v) {
        Ok(b) => Existing::Merged(b),
        Err(_) => Existing::Unreadable,
    }
}

/// What became of the error file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorFileOutcome {
    /// Written by oomshim (there was none).
    Written,
    /// The program's out-of-memory report, with oomshim's answer added.
    Merged,
    /// The program reported another failure: left as it was (and that failure is the process's
    /// end, not the out-of-memory error).
    OtherFailure,
    /// Left as it was: answered already, or not torchelastic's format.
    Kept(&'static str),
}

/// Writes the answer into torchelastic's error file at `path`: a new file when there is none
/// (created exclusively: a file that appears meanwhile is never replaced), the program's
/// out-of-memory report with the answer added (replaced atomically), else nothing.
pub fn write_error_file(path: &Path, a: &Answer) -> std::io::Result<ErrorFileOutcome> {
    match std::fs::read(path) {
        Ok(existing) => match merge_error_file(&existing, a) {
            Existing::Merged(bytes) => {
                let mode = std::fs::metadata(path)
                    .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
                    .unwrap_or(0o644);
                dump::write::write_file_atomically(path, &bytes, mode)?;
                Ok(ErrorFileOutcome::Merged)
            }
            Existing::OtherFailure => Ok(ErrorFileOutcome::OtherFailure),
            Existing::AlreadyAnswered => Ok(ErrorFileOutcome::Kept("answered already")),
            Existing::Unreadable => Ok(ErrorFileOutcome::Kept("not torchelastic's format")),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(path)?;
            f.write_all(&error_file_json(a))?;
            Ok(ErrorFileOutcome::Written)
        }
        Err(e) => Err(e),
    }
}

/// Appends `message` (and a line end) to the termination log at `path` within
/// [`TERMINATION_MAX`] bytes: what is there already (the program's own message, an earlier
/// failure's) stays first, a line end between; the message is cut at a line to fit, and nothing
/// is added when less than a line's room is left. `create`:
/// the path was given by a setting, so a missing file is created. Returns the bytes written.
pub fn append_termination(path: &Path, message: &str, create: bool) -> std::io::Result<usize> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(create)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    let had = f.metadata()?.len() as usize;
    let sep = usize::from(had > 0);
    let room = TERMINATION_MAX.saturating_sub(had + sep);
    if room < TERMINATION_MIN_ROOM {
        return Ok(0);
    }
    // Room for the line end after the last line.
    let text = fit_lines(message, room - 1);
    if text.is_empty() {
        return Ok(0);
    }
    let mut bytes = Vec::with_capacity(text.len() + 2);
    if sep > 0 {
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(b'\n');
    f.write_all(&bytes)?;
    Ok(bytes.len())
}

/// The leading whole lines of `text` that fit in `max` bytes; the first line cut to fit when
/// not even it does.
pub fn fit_lines(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let head = cut(text, max);
    match head.rfind('\n') {
        Some(i) => &head[..i],
        None => head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dump::fixtures::oom_dump;

    const GIB: u64 = 1 << 30;

    fn answer() -> Answer {
        let mut d = oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB);
        d.process.rank = Some(1);
        d.process.local_rank = Some(1);
        d.verdict = crate::verdict::judge(&d);
        Answer::of(&d, Some(Path::new("/d/oomshim-h-1-r1-1.json")))
    }

    #[test]
    fn the_text_leads_with_the_failure_and_fits_any_limit() {
        let a = answer();
        let t = a.text(usize::MAX);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with(
                "oomshim: CUDA out of memory on device 0 (cudaMalloc of 2.00 GiB failed): own_allocations: "
            ),
            "{t}"
        );
        assert!(lines[1].starts_with("retry: after_change ("), "{t}");
        assert!(
            t.contains("dump: /d/oomshim-h-1-r1-1.json  (details: oomshim report /d/oomshim-h-1-r1-1.json)"),
            "{t}"
        );
        assert!(
            t.ends_with("process: rank 1 (local rank 1), pid 4812 on gpu-node-7"),
            "{t}"
        );
        for max in [0, 1, 10, 80, 200, 4096] {
            let cut = a.text(max);
            assert!(cut.len() <= max, "{max}: {}", cut.len());
            assert!(t.starts_with(&cut));
        }
    }

    #[test]
    fn a_fresh_error_file_is_torchelastics_format_with_the_answer_as_traceback() {
        let a = answer();
        let v: Value = serde_json::from_slice(&error_file_json(&a)).unwrap();
        let m = &v["message"];
        assert!(m["message"]
            .as_str()
            .unwrap()
            .starts_with("oomshim: CUDA out of memory"));
        assert_eq!(m["extraInfo"]["py_callstack"], a.text(usize::MAX));
        assert_eq!(
            m["extraInfo"]["timestamp"],
            (1_795_966_991_123u64 / 1000).to_string()
        );
        assert_eq!(m["extraInfo"]["oomshim"]["retry"], "after_change");
        assert_eq!(m["extraInfo"]["oomshim"]["kind"], "own_allocations");
    }

    fn recorded(message: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({"message": {"message": message, "extraInfo": {
            "py_callstack": format!("Traceback (most recent call last):\n  File \"train.py\", line 9\n{message}\n"),
            "timestamp": "1700000000"}}}))
        .unwrap()
    }

    #[test]
    fn a_records_out_of_memory_report_keeps_its_text_and_gets_the_answer_after_it() {
        let a = answer();
        let msg = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.";
        let Existing::Merged(bytes) = merge_error_file(&recorded(msg), &a) else {
            panic!("an out-of-memory report is answered");
        };
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let m = &v["message"];
        let text = m["message"].as_str().unwrap();
        assert!(
            text.starts_with(msg) && text.contains("\noomshim: CUDA out of memory"),
            "{text}"
        );
        let stack = m["extraInfo"]["py_callstack"].as_str().unwrap();
        assert!(stack.starts_with("Traceback (most recent call last):\n  File \"train.py\""));
        assert!(
            stack.contains(&format!("{msg}\noomshim: CUDA out of memory")),
            "{stack}"
        );
        assert_eq!(
            m["extraInfo"]["timestamp"], "1700000000",
            "the program's timestamp stays"
        );
        // Answered once only.
        assert_eq!(merge_error_file(&bytes, &a), Existing::AlreadyAnswered);
        // Another failure's report, or a file not in torchelastic's format, is never touched.
        assert_eq!(
            merge_error_file(&recorded("ValueError: bad shape"), &a),
            Existing::OtherFailure
        );
        assert_eq!(merge_error_file(b"{not json", &a), Existing::Unreadable);
        assert_eq!(merge_error_file(b"[1]", &a), Existing::Unreadable);
        // The plain-text form.
        let plain = br#"{"message": "RuntimeError: CUDA out of memory", "timestamp": 5}"#;
        let Existing::Merged(b) = merge_error_file(plain, &a) else {
            panic!()
        };
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert!(v["message"]
            .as_str()
            .unwrap()
            .starts_with("RuntimeError: CUDA out of memory\noomshim: "));
        assert_eq!(v["timestamp"], 5);
    }

    #[test]
    fn the_error_file_is_created_merged_or_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let a = answer();
        let fresh = dir.path().join("fresh.json");
        assert_eq!(
            write_error_file(&fresh, &a).unwrap(),
            ErrorFileOutcome::Written
        );
        assert_eq!(std::fs::read(&fresh).unwrap(), error_file_json(&a));
        let other = dir.path().join("other.json");
        let theirs = recorded("ValueError: bad shape");
        std::fs::write(&other, &theirs).unwrap();
        assert_eq!(
            write_error_file(&other, &a).unwrap(),
            ErrorFileOutcome::OtherFailure
        );
        assert_eq!(std::fs::read(&other).unwrap(), theirs, "byte for byte");
        let oom = dir.path().join("oom.json");
        std::fs::write(&oom, recorded("OutOfMemoryError: CUDA out of memory.")).unwrap();
        assert_eq!(
            write_error_file(&oom, &a).unwrap(),
            ErrorFileOutcome::Merged
        );
        // A directory that cannot be written to: an error, nothing else.
        assert!(write_error_file(Path::new("/proc/nope/error.json"), &a).is_err());
    }

    #[test]
    fn the_termination_message_keeps_what_is_there_and_never_passes_4096_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("termination-log");
        let a = answer();
        // Not there and not asked to create: an error.
        assert!(append_termination(&log, &a.text(TERMINATION_MAX), false).is_err());
        let n = append_termination(&log, &a.text(TERMINATION_MAX), true).unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(n, text.len());
        assert!(text.starts_with("oomshim: CUDA out of memory"), "{text}");
        // The program's own message first; the summary fills what is left, at whole lines.
        let theirs = "x".repeat(3900);
        std::fs::write(&log, &theirs).unwrap();
        append_termination(&log, &a.text(TERMINATION_MAX), false).unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.len() <= TERMINATION_MAX, "{}", text.len());
        assert!(text.starts_with(&theirs));
        // Full: nothing more.
        std::fs::write(&log, "y".repeat(4090)).unwrap();
        assert_eq!(append_termination(&log, "oomshim: more", false).unwrap(), 0);
        assert_eq!(std::fs::read(&log).unwrap().len(), 4090);
        let long = format!("{}\nsecond line", "z".repeat(5000));
        assert_eq!(fit_lines(&long, 100).len(), 100);
        assert_eq!(fit_lines("a\nbb\nccc", 5), "a\nbb");
    }

    #[test]
    fn only_deaths_nobody_else_explains_leave_an_answer() {
        use dump::model::{LiveFailure, PostMortem};
        let pm = |signal: Option<i32>, failed: bool| {
            let mut d = dump::fixtures::oom_dump(0, None, None, GIB);
            d.failed_request = None;
            d.post_mortem = Some(PostMortem {
                reconstructed: true,
                signal,
                signal_name: None,
                core_dumped: false,
                exit_code: signal.is_none().then_some(1),
                died_unix_ms: 1,
                published_unix_ms: 1,
                generation: 1,
                from_previous: false,
                rss: vec![],
                last_failure: failed.then(|| LiveFailure {
                    unix_ms: 1,
                    device: 0,
                    bytes: GIB,
                    api: "cudaMalloc".into(),
                    free_bytes: None,
                    total_bytes: None,
                    dump: None,
                    headline: None,
                    kind: None,
                    retry: None,
                }),
                host: Default::default(),
                reaped_by: None,
                started_unix_ms: None,
            });
            d.verdict = crate::verdict::judge(&d);
            d
        };
        assert!(post_mortem_leaves_answer(&pm(Some(libc::SIGKILL), false)));
        assert!(post_mortem_leaves_answer(&pm(Some(libc::SIGABRT), true)));
        assert!(!post_mortem_leaves_answer(&pm(Some(libc::SIGABRT), false)));
        assert!(!post_mortem_leaves_answer(&pm(Some(libc::SIGTERM), true)));
        assert!(!post_mortem_leaves_answer(&pm(Some(libc::SIGINT), false)));
        assert!(
            post_mortem_leaves_answer(&pm(None, true)),
            "exited after a failure"
        );
        let mut d = pm(Some(libc::SIGKILL), false);
        d.post_mortem = None;
        assert!(!post_mortem_leaves_answer(&d));
    }

    #[test]
    fn the_targets_follow_the_settings() {
        let env = |k: &str| (k == ERROR_FILE_ENV).then(|| "/logs/0/error.json".to_string());
        let mut c = Config {
            termination_log: TerminationLog::Off,
            ..Config::default()
        };
        assert_eq!(
            Targets::of(&c, env).error_file.as_deref(),
            Some(Path::new("/logs/0/error.json"))
        );
        // torchrun without a log directory sets it empty.
        assert_eq!(Targets::of(&c, |_| Some(" ".into())).error_file, None);
        c.torchelastic = false;
        assert!(Targets::of(&c, env).is_empty());
        c.termination_log = TerminationLog::Path("/t/log".into());
        assert_eq!(
            Targets::of(&c, env).termination_log.as_deref(),
            Some(Path::new("/t/log"))
        );
    }
}
