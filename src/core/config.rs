//! The shim's settings, read once from `OOMSHIM_*` environment variables. Parsing is a pure
//! function of a lookup so it is tested without touching the real environment; a malformed value
//! yields a warning naming the variable and the default used, never a failure.

use std::path::PathBuf;
use std::time::Duration;

/// Default dump directory, relative to the working directory the program started in (see
/// [`resolve_dir`]).
pub const DEFAULT_DIR: &str = "oomshim-dumps";
pub const DEFAULT_DEPTH: usize = 64;
/// Frames kept at most, whatever `OOMSHIM_DEPTH` says: bounds the per-allocation cost.
pub const MAX_DEPTH: usize = 256;
pub const DEFAULT_TOP: usize = 20;
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(2);
/// Out-of-memory dumps written per minute at most: a program that catches its OOMs in a loop
/// gets a handful of dumps and a count, not thousands of files.
pub const DEFAULT_MAX_DUMPS_PER_MINUTE: u64 = 10;

/// One `OOMSHIM_*` setting as users see it: the one list behind `oomshim env` (and
/// `oomshim help env`) and the table of settings in docs/configuration.md (a test keeps the two equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    /// The default as a user would write it (`—` where unset means "not used").
    pub default: &'static str,
    /// What it does, in Markdown (inline code in backticks).
    pub meaning: &'static str,
}

/// Every setting a user may set, in the order they are documented. Adding one is adding a row
/// here (and running the docs test with `OOMSHIM_BLESS=1` to copy it into docs/configuration.md); a test
/// fails when the code reads an `OOMSHIM_*` variable this table lacks.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "OOMSHIM_DIR",
        default: DEFAULT_DIR,
        meaning: "Where dumps are written (created if missing). A relative path is relative to the working directory the program had when the shim was loaded (for `LD_PRELOAD` and `oomshim run`: where the program was started), resolved once to an absolute path; a later `chdir` of the program moves nothing, and stderr names dumps by their absolute path. (If that directory could not be read then, the one at the first CUDA call is used.) A world-writable directory such as `/tmp` gets a private `DIR/oomshim-UID/` (0700, owner checked), and a symlink there is followed only if it is yours or root's. If the directory cannot be written, dumps go to `$TMPDIR/oomshim-UID/` (0700, checked to be yours), and stderr says so once. A full disk leaves no partial file, and the program goes on.",
    },
    Setting {
        name: "OOMSHIM_DEPTH",
        default: "64",
        meaning: "Native frames captured per allocation (1–256).",
    },
    Setting {
        name: "OOMSHIM_STACKS",
        default: "all",
        meaning: "`all`: the native stack and, on threads running Python, the Python stack, merged in dumps (docs: user guide, Python stacks). `native`: native stacks only. `python`: Python stacks only (no native unwinding). `off`: no stacks (cheapest); sizes, APIs and totals are still exact. Native stacks are symbolised only when a dump is written.",
    },
    Setting {
        name: "OOMSHIM_TOP",
        default: "20",
        meaning: "Largest holders and sites written into a dump (1–100000).",
    },
    Setting {
        name: "OOMSHIM_MIN_INTERVAL",
        default: "10s",
        meaning: "The same failure again (same device, size and stack) within this interval of its dump is counted as a repeat instead of getting a dump of its own; a failure of another size, or at another line, is always a new one. Retries of one request (the same thread asking for the same size with only frees between) are never repeats: they are part of its dump. Accepts `500ms`, `10s`, `2m`, or a bare number of seconds.",
    },
    Setting {
        name: "OOMSHIM_MAX_DUMPS",
        default: "10",
        meaning: "Out-of-memory dumps written per minute at most (`unlimited` for no cap): a program that catches its failures in a loop gets a few dumps and a count. Failures over the cap are counted in the next dump and said once at exit.",
    },
    Setting {
        name: "OOMSHIM_SETTLE",
        default: "2s",
        meaning: "How long a failure's dump waits to learn whether a retry recovered it (at most 600s); torch's word (through the Python hook) ends the wait at once, and with the hook attached the wait is at least 30s. A provisional dump is written at once in the background and replaced when the outcome is known. A recovered failure then waits as long again: a failure on its device by then tells its story (no line or dump of its own). `0` writes the dump before the failing call returns (with `recovered: null`); it blocks that thread only.",
    },
    Setting {
        name: "OOMSHIM_LOG",
        default: "off",
        meaning: "A filter for the shim's own diagnostics on stderr: a level or `target=level` directives separated by commas, for example `debug` or `oomshim=trace,warn`; a value that is no filter is said once and leaves them off.",
    },
    Setting {
        name: "OOMSHIM_SIGNAL",
        default: "off",
        meaning: "`USR1`, `USR2` or a real-time signal number: that signal writes a dump (reason `signal`). Other signals are refused.",
    },
    Setting {
        name: "OOMSHIM_INTERVAL",
        default: "off",
        meaning: "Write a dump this often (at least 100ms; reason `interval`).",
    },
    Setting {
        name: "OOMSHIM_AT_EXIT",
        default: "0",
        meaning: "`1` writes a dump of what is still live at exit (reason `exit`).",
    },
    Setting {
        name: "OOMSHIM_DUMP_MODE",
        default: "0600",
        meaning: "Permission bits of dump files, in octal (`0640` lets the group read them). Never world-writable; applied exactly, whatever the umask. The post-mortem dumps of `oomshim run` get the same bits (read with the shim's own parser).",
    },
    Setting {
        name: "OOMSHIM_TORCH_HOOK",
        default: "1",
        meaning: "`0` switches off oomshim's Python hook, which the shim puts on a Python program's path by itself (plain `LD_PRELOAD`) and `oomshim run` puts there too (docs: user guide, With PyTorch): torch's OOM observer, the automatic step marks, JAX's out-of-memory errors.",
    },
    Setting {
        name: "OOMSHIM_AUTO_STEPS",
        default: "optimizer",
        meaning: "Steps the Python hook marks in PyTorch programs: `optimizer` (also `1`) every `torch.optim` optimizer step (through torch's global step post-hook; nothing per forward pass); `forward` also every forward pass of the program's outermost module, seen by two global module hooks that every module call pays for (+38 µs a forward of a 6-module MLP on the 2-core VM: docs/performance.md) and that are never removed (`torch.compile` warns that global hooks are in place and traces them as no-ops); `0` none (then only `oomshim.step()` and detected steps). Any other value is said once on stderr and means `optimizer`.",
    },
    Setting {
        name: "OOMSHIM_TORCH_HISTORY",
        default: "1",
        meaning: "`1`: once the shim sees the process grow step after step under plain preload, the Python hook asks torch to record the Python stack of each new tensor (`torch.cuda.memory._record_memory_history`, about 2 µs per allocation from then on), so the dump names the lines that hold the growth; never when the program records torch's history itself (its `enabled`, `max_entries` and `stacks` stay as it chose, and its records serve the dump). `0` never asks.",
    },
    Setting {
        name: "OOMSHIM_KINDS_BUDGET_MS",
        default: "2000",
        meaning: "Time the Python hook may spend counting torch's memory by kind at one OOM (walking the garbage collector for models and optimizers, counting their tensors); what is not counted in time is marked `complete: false`. Spent only on failures that get a dump: a repeat within `OOMSHIM_MIN_INTERVAL` or a failure over `OOMSHIM_MAX_DUMPS` costs microseconds. A value that is no whole number means 2000.",
    },
    Setting {
        name: "OOMSHIM_TORCH_ALLOCATOR",
        default: "0",
        meaning: "`1` makes the injected hook enable allocator mode right after the program imports torch (what `oomshim run --torch-allocator` sets), unless the program's command line, the config files it names, its script or the modules of its own that it imports ask for a feature torch cannot run on a pluggable allocator (CUDA-graph `torch.compile`, `MemPool`, `cudnn.benchmark`): then torch keeps its own allocator, watched as under `LD_PRELOAD`, and one line says why. `force` skips that reading.",
    },
    Setting {
        name: "OOMSHIM_LIVE",
        default: "1",
        meaning: "`1`: the shim keeps a live summary of its ledger in a private shared-memory region (docs: operations, the flight recorder), read by `oomshim top` and by `oomshim run` for a post-mortem dump when the program is killed. `0`: no region (and no post-mortem dumps).",
    },
    Setting {
        name: "OOMSHIM_LIVE_DIR",
        default: "/dev/shm/oomshim-UID",
        meaning: "Where live regions are kept (created 0700, checked to be yours and writable by no one else: readers ignore it otherwise; `$TMPDIR/oomshim-UID/live` where there is no `/dev/shm`). `oomshim top` and `oomshim run` read the same variable. A relative path is relative to where the program started, resolved once when the shim starts (as `OOMSHIM_DIR`); `oomshim run` passes it on absolute.",
    },
    Setting {
        name: "OOMSHIM_LIVE_INTERVAL",
        default: "1s",
        meaning: "How often the live summary is republished (100ms–60s; any other value is said once on stderr and `1s` is used); the first device allocation creates the region and publishes at once, a failed allocation republishes at once, and so does a change of `OOMSHIM_LIVE_CHANGE`. The publisher takes at most 2% of a core over time: it earns 1/50 of the time that passes as publishing time (200 ms saved up at most, and at start), and a publish that overspends waits 50 times its debt.",
    },
    Setting {
        name: "OOMSHIM_LIVE_CHANGE",
        default: "64M",
        meaning: "The live summary is also republished when the process's tracked device memory moved by more than this since the last publish (`64M`, `1G`, a byte count; 1M–1T), at most every 100ms (later once the 2% budget of `OOMSHIM_LIVE_INTERVAL` is spent): a process killed at any moment has a post-mortem at most this far, or that long, from its last state. `0`: only the first allocation, failures and `OOMSHIM_LIVE_INTERVAL` publish. Any other value is said once on stderr and `64M` is used.",
    },
    Setting {
        name: "OOMSHIM_CGROUP_ROOT",
        default: "/sys/fs/cgroup",
        meaning: "Where `oomshim run` finds the cgroup filesystem, to read the program's `memory.events` (`oom_kill`), `memory.max` and `memory.current` for a post-mortem dump.",
    },
    Setting {
        name: "OOMSHIM_TORCHELASTIC",
        default: "1",
        meaning: "`1`: a process that ends because of an out-of-memory error (or, under `oomshim run`, is SIGKILLed) puts oomshim's headline, retry hint and dump path into torchelastic's error file (`TORCHELASTIC_ERROR_FILE`, set by torchrun for each worker), so torchrun's \"Root Cause\" shows them: added to the message of a file the program's `@record` wrote for the out-of-memory error, or a file of its own in torchelastic's format when there is none; a file written for any other failure is never touched. `0`: never.",
    },
    Setting {
        name: "OOMSHIM_TERMINATION_LOG",
        default: "/dev/termination-log",
        meaning: "Where a process that ends because of an out-of-memory error (or, under `oomshim run`, is SIGKILLed or crashes) leaves a summary of at most 4096 bytes for Kubernetes' termination message: headline, retry hint, memory by kind, the line to change, the dump. The default is used only when it exists and is writable (a pod's container); an absolute path given here is created if missing; `off` writes none. Text already there (the program's own, an earlier failure's) is kept first; the summary fills what is left of the 4096 bytes. Nothing is written at a normal exit.",
    },
    Setting {
        name: "OOMSHIM_LIB",
        default: "—",
        meaning: "Where the CLI (`run`, `demo`) and `oomshim.torch.enable()` find `liboomshim.so`; it must name a file. Unset, each looks beside itself (docs: configuration, where the shim library is found).",
    },
];

/// `oomshim env`: every setting with its default, wrapped to `width` columns, backticks dropped.
pub fn settings_help(width: usize) -> String {
    let intro = "Settings are environment variables, read once by the shim at the first hooked \
                 call. A malformed value is never fatal: one warning on stderr names it and the \
                 default applies.";
    let mut out = wrap(intro, width).join("\n") + "\n";
    for s in SETTINGS {
        out.push('\n');
        out.push_str(&format!("{}  (default: {})\n", s.name, s.default));
        for line in wrap(&s.meaning.replace('`', ""), width.saturating_sub(4).max(20)) {
            out.push_str("    ");
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Every `OOMSHIM_*` name written in `text` (the checks that every setting the code reads is
/// listed, and every one the documents name is read, scan files with it).
pub fn setting_names_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("OOMSHIM_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        let name = name.trim_end_matches('_');
        if name.len() > "OOMSHIM_".len() {
            out.insert(name.to_string());
        }
    }
    out
}

/// The table of settings in docs/configuration.md (section "Environment variables"), generated
/// from [`SETTINGS`]; a test keeps the page equal to it.
pub fn settings_markdown_table() -> String {
    let mut out = String::from("| variable | default | meaning |\n| --- | --- | --- |\n");
    for s in SETTINGS {
        let default = match s.default {
            "—" => "—".to_string(),
            d => format!("`{d}`"),
        };
        out.push_str(&format!("| `{}` | {default} | {} |\n", s.name, s.meaning));
    }
    out
}

/// Greedy word wrap; a word longer than `width` gets a line of its own.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackMode {
    /// No stacks: the cheapest mode; dumps still have sizes, APIs and totals.
    Off,
    /// Native return addresses, symbolised when a dump is written.
    Native,
    /// The allocating thread's Python stack only (file:line per frame), no native unwinding.
    Python,
    /// Native and Python stacks, merged in dumps (the default). In a process without Python it
    /// costs what `native` costs.
    All,
}

impl StackMode {
    /// An `OOMSHIM_STACKS` value (case and surrounding blanks ignored); `None` when it names no
    /// mode. The one reading of that variable: the settings and allocator mode's own default
    /// (`src/preload/allocator_mode/config.rs`) both go through it.
    pub fn parse(value: &str) -> Option<StackMode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "all" | "on" => Some(StackMode::All),
            "native" => Some(StackMode::Native),
            "python" => Some(StackMode::Python),
            "off" | "none" => Some(StackMode::Off),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StackMode::Off => "off",
            StackMode::Native => "native",
            StackMode::Python => "python",
            StackMode::All => "all",
        }
    }

    /// Native return addresses are captured.
    pub fn native(self) -> bool {
        matches!(self, StackMode::Native | StackMode::All)
    }

    /// Python stacks are captured (where the thread has a Python thread state).
    pub fn python(self) -> bool {
        matches!(self, StackMode::Python | StackMode::All)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `OOMSHIM_DIR`: where dumps go.
    pub dir: PathBuf,
    /// `OOMSHIM_DEPTH`: frames captured per allocation.
    pub depth: usize,
    /// `OOMSHIM_STACKS`: `all` (default), `native`, `python` or `off`.
    pub stacks: StackMode,
    /// `OOMSHIM_TOP`: holders and sites written to a dump.
    pub top: usize,
    /// `OOMSHIM_MIN_INTERVAL`: the same failure again (same device, size and stack) within this
    /// interval of its dump is counted as a repeat instead of writing another dump.
    pub min_interval: Duration,
    /// `OOMSHIM_MAX_DUMPS`: out-of-memory dumps per minute at most (`None`: unlimited); the
    /// failures over it are counted in the next dump.
    pub max_dumps_per_minute: Option<u64>,
    /// `OOMSHIM_SETTLE`: how long the writer waits after a failure to learn whether a retry
    /// recovered it, before writing the dump and the summary; and how long a recovered failure
    /// waits for a failure on its device that would tell its story.
    pub settle: Duration,
    /// `OOMSHIM_LOG`: a tracing filter (e.g. `debug`) for the shim's own logs; off when unset.
    pub log: Option<String>,
    /// `OOMSHIM_SIGNAL`: a signal (`USR1`, `USR2` or a number) that asks for a dump. Off unless
    /// set: the shim never installs a signal handler unasked.
    pub dump_signal: Option<i32>,
    /// `OOMSHIM_INTERVAL`: write a dump this often (off unless set).
    pub interval: Option<Duration>,
    /// `OOMSHIM_AT_EXIT`: write a dump of what is still live when the program exits.
    pub at_exit: bool,
    /// `OOMSHIM_DUMP_MODE`: permission bits of dump files (octal, default 0600). Never
    /// world-writable; applied exactly (with `fchmod`), so the umask cannot widen or narrow it.
    pub dump_mode: u32,
    /// `OOMSHIM_TORCHELASTIC`: a failure that ends the process puts oomshim's answer into
    /// torchelastic's error file (`TORCHELASTIC_ERROR_FILE`), src/core/jobfiles.rs.
    pub torchelastic: bool,
    /// `OOMSHIM_TERMINATION_LOG`: where a failure that ends the process leaves its summary for
    /// Kubernetes (src/core/jobfiles.rs).
    pub termination_log: TerminationLog,
}

/// Kubernetes' default `terminationMessagePath`.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// `OOMSHIM_TERMINATION_LOG`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminationLog {
    /// Unset: [`DEFAULT_TERMINATION_LOG`], only when it exists and is writable (a container of a
    /// pod; nowhere else).
    Default,
    /// A path given: written, created if missing.
    Path(PathBuf),
    /// `off`.
    Off,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: PathBuf::from(DEFAULT_DIR),
            depth: DEFAULT_DEPTH,
            stacks: StackMode::All,
            top: DEFAULT_TOP,
            min_interval: DEFAULT_MIN_INTERVAL,
            max_dumps_per_minute: Some(DEFAULT_MAX_DUMPS_PER_MINUTE),
            settle: DEFAULT_SETTLE,
            log: None,
            dump_signal: None,
            interval: None,
            at_exit: false,
            dump_mode: DEFAULT_DUMP_MODE,
            torchelastic: true,
            termination_log: TerminationLog::Default,
        }
    }
}

/// A malformed setting: the variable, what it held, and the default used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
    pub used: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ignoring {}={:?}: expected {}; using {}",
            self.var, self.value, self.expected, self.used
        )
    }
}

impl Config {
    /// Reads the configuration through `lookup` (normally `std::env::var`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<Warning>) {
        let mut cfg = Config::default();
        let mut warnings = Vec::new();
        let mut warn = |var: &'static str, value: &str, expected: &'static str, used: String| {
            warnings.push(Warning {
                var,
                value: value.to_string(),
                expected,
                used,
            })
        };

        if let Some(v) = lookup("OOMSHIM_DIR") {
            if v.trim().is_empty() {
                warn(
                    "OOMSHIM_DIR",
                    &v,
                    "a directory path",
                    DEFAULT_DIR.to_string(),
                );
            } else {
                cfg.dir = PathBuf::from(v);
            }
        }
        if let Some(v) = lookup("OOMSHIM_DEPTH") {
            match v.trim().parse::<usize>() {
                Ok(d) if (1..=MAX_DEPTH).contains(&d) => cfg.depth = d,
                _ => warn(
                    "OOMSHIM_DEPTH",
                    &v,
                    "an integer from 1 to 256",
                    DEFAULT_DEPTH.to_string(),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_STACKS") {
            match StackMode::parse(&v) {
                Some(mode) => cfg.stacks = mode,
                None => warn(
                    "OOMSHIM_STACKS",
                    &v,
                    "`all`, `native`, `python` or `off`",
                    "all".to_string(),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_TOP") {
            match v.trim().parse::<usize>() {
                Ok(n) if (1..=100_000).contains(&n) => cfg.top = n,
                _ => warn(
                    "OOMSHIM_TOP",
                    &v,
                    "an integer from 1 to 100000",
                    DEFAULT_TOP.to_string(),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_MIN_INTERVAL") {
            match parse_duration(&v) {
                Some(d) => cfg.min_interval = d,
                None => warn(
                    "OOMSHIM_MIN_INTERVAL",
                    &v,
                    "a duration such as `10s`, `500ms` or `0`",
                    "10s".to_string(),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_MAX_DUMPS") {
            match v.trim().to_ascii_lowercase().as_str() {
                "unlimited" | "off" | "none" => cfg.max_dumps_per_minute = None,
                t => match t.parse::<u64>() {
                    Ok(n) if (1..=1_000_000).contains(&n) => cfg.max_dumps_per_minute = Some(n),
                    _ => warn(
                        "OOMSHIM_MAX_DUMPS",
                        &v,
                        "a number of dumps per minute from 1 to 1000000, or `unlimited`",
                        DEFAULT_MAX_DUMPS_PER_MINUTE.to_string(),
                    ),
                },
            }
        }
        if let Some(v) = lookup("OOMSHIM_SETTLE") {
            match parse_duration(&v) {
                Some(d) if d <= Duration::from_secs(600) => cfg.settle = d,
                _ => warn(
                    "OOMSHIM_SETTLE",
                    &v,
                    "a duration up to 600s such as `2s` or `0`",
                    "2s".to_string(),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_SIGNAL") {
            match parse_signal(&v) {
                Some(sig) => cfg.dump_signal = sig,
                None => warn(
                    "OOMSHIM_SIGNAL",
                    &v,
                    "`USR1`, `USR2`, a real-time signal number, or `off`",
                    "off".to_string(),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_INTERVAL") {
            match v.trim() {
                "" | "0" | "off" => {}
                t => match parse_duration(t) {
                    Some(d) if d >= Duration::from_millis(100) => cfg.interval = Some(d),
                    _ => warn(
                        "OOMSHIM_INTERVAL",
                        &v,
                        "a duration of at least 100ms such as `60s`, or `off`",
                        "off".to_string(),
                    ),
                },
            }
        }
        if let Some(v) = lookup("OOMSHIM_AT_EXIT") {
            match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => cfg.at_exit = true,
                "" | "0" | "false" | "no" | "off" => cfg.at_exit = false,
                _ => warn("OOMSHIM_AT_EXIT", &v, "`1` or `0`", "0".to_string()),
            }
        }
        if let Some(v) = lookup("OOMSHIM_DUMP_MODE") {
            match parse_mode(&v) {
                Some(m) => cfg.dump_mode = m,
                None => warn(
                    "OOMSHIM_DUMP_MODE",
                    &v,
                    "octal permission bits such as `0640`, never world-writable",
                    format!("{DEFAULT_DUMP_MODE:04o}"),
                ),
            }
        }
        if let Some(v) = lookup("OOMSHIM_TORCHELASTIC") {
            match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => cfg.torchelastic = true,
                "0" | "false" | "no" | "off" => cfg.torchelastic = false,
                _ => warn("OOMSHIM_TORCHELASTIC", &v, "`1` or `0`", "1".to_string()),
            }
        }
        if let Some(v) = lookup("OOMSHIM_TERMINATION_LOG") {
            let t = v.trim();
            if t.eq_ignore_ascii_case("off") || t == "0" {
                cfg.termination_log = TerminationLog::Off;
            } else if t == DEFAULT_TERMINATION_LOG {
                cfg.termination_log = TerminationLog::Default;
            } else if t.starts_with('/') {
                cfg.termination_log = TerminationLog::Path(PathBuf::from(t));
            } else {
                warn(
                    "OOMSHIM_TERMINATION_LOG",
                    &v,
                    "an absolute path or `off`",
                    DEFAULT_TERMINATION_LOG.to_string(),
                );
            }
        }
        if let Some(v) = lookup("OOMSHIM_LOG") {
            let v = v.trim();
            if !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("off") {
                cfg.log = Some(v.to_string());
            }
        }
        (cfg, warnings)
    }
}

/// `Some(None)` for off, `Some(Some(signo))` for a signal the shim may take over: SIGUSR1,
/// SIGUSR2 or a real-time signal; never one a program or the kernel relies on (SEGV, CHLD, …).
fn parse_signal(s: &str) -> Option<Option<i32>> {
    let t = s.trim().to_ascii_uppercase();
    let name = t.strip_prefix("SIG").unwrap_or(&t);
    match name {
        "" | "0" | "OFF" => Some(None),
        "USR1" => Some(Some(libc::SIGUSR1)),
        "USR2" => Some(Some(libc::SIGUSR2)),
        n => {
            let signo: i32 = n.parse().ok()?;
            let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
            (signo == libc::SIGUSR1 || signo == libc::SIGUSR2 || (lo..=hi).contains(&signo))
                .then_some(Some(signo))
        }
    }
}

/// `OOMSHIM_FAULT`: a fault injected on purpose, for the reliability tests only (RELIABILITY.md,
/// section 7). Read once, when the shim starts; unset in normal use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// `panic-in-alloc[:N]`: the shim panics inside the hook of the Nth successful allocation
    /// (default the first), after the real call returned, as a bug in the bookkeeping would.
    PanicInAlloc(u64),
    /// `symbolize`: the symboliser fails (panics inside), as a broken or unreadable object
    /// would make it; dumps then carry raw addresses.
    Symbolize,
}

/// The dump directory as used: `dir` when absolute, else `dir` under `base` (the working
/// directory the program started in), with `.` components dropped so messages read well.
/// Resolved once, when the shim starts: a program that `chdir`s later (to `/`, say) must not
/// move its dumps, nor have stderr name a path that means something else to the user. Without
/// a base (no working directory could be read) the relative path stays as it is.
pub fn resolve_dir(dir: &std::path::Path, base: Option<&std::path::Path>) -> PathBuf {
    if dir.is_absolute() {
        return dir.to_path_buf();
    }
    let rest: PathBuf = dir
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    match base {
        Some(b) if b.is_absolute() => b.join(rest),
        _ => dir.to_path_buf(),
    }
}

/// Parses `OOMSHIM_FAULT`'s value; `None` when malformed.
pub fn parse_fault(s: &str) -> Option<Fault> {
    let t = s.trim().to_ascii_lowercase();
    match t.as_str() {
        "" | "0" | "off" | "none" => Some(Fault::None),
        "symbolize" => Some(Fault::Symbolize),
        "panic-in-alloc" => Some(Fault::PanicInAlloc(1)),
        _ => {
            let n: u64 = t.strip_prefix("panic-in-alloc:")?.parse().ok()?;
            (n >= 1).then_some(Fault::PanicInAlloc(n))
        }
    }
}

/// Default permission bits of a dump file (defined with the writer that applies them).
pub use dump::write::DEFAULT_DUMP_MODE;

/// `0640`, `640` or `0o640`: octal permission bits up to 0777 without the world-writable bit
/// (a dump anyone could rewrite could lie). Anything else is refused.
pub fn parse_mode(s: &str) -> Option<u32> {
    let t = s.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return None;
    }
    let m = u32::from_str_radix(digits, 8).ok()?;
    (m <= 0o777 && m & 0o002 == 0).then_some(m)
}

/// Parses a byte count: `64M`, `64MiB`, `1.5G`, `512k`, `4096` (binary units; `B` and `iB` are
/// optional, case is not significant).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 10),
        Some((i, 'm')) => (&t[..i], 20),
        Some((i, 'g')) => (&t[..i], 30),
        Some((i, 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    let x: f64 = num.trim().parse().ok()?;
    let bytes = x * (1u64 << shift) as f64;
    (x.is_finite() && x >= 0.0 && bytes < u64::MAX as f64).then_some(bytes.round() as u64)
}

/// Parses `10s`, `1.5s`, `500ms`, `2m`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let x: f64 = num.trim().parse().ok()?;
    if !x.is_finite() || x < 0.0 || x * scale > 1e9 {
        return None;
    }
    Some(Duration::from_secs_f64(x * scale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> (Config, Vec<Warning>) {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn byte_counts_in_binary_units() {
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes(" 64MiB "), Some(64 << 20));
        assert_eq!(parse_bytes("1.5g"), Some(3 << 29));
        assert_eq!(parse_bytes("512kB"), Some(512 << 10));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("0"), Some(0));
        for bad in ["", "M", "-1M", "1X", "nan", "inf", "99999999999T"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let (cfg, warnings) = parse(&[]);
        assert_eq!(cfg, Config::default());
        assert!(warnings.is_empty());
        assert_eq!(cfg.dir, PathBuf::from("oomshim-dumps"));
        assert_eq!(cfg.depth, 64);
        assert_eq!(cfg.stacks, StackMode::All);
    }

    #[test]
    fn stack_modes() {
        for (v, mode, native, python) in [
            ("all", StackMode::All, true, true),
            ("native", StackMode::Native, true, false),
            ("PYTHON", StackMode::Python, false, true),
            ("off", StackMode::Off, false, false),
        ] {
            let (cfg, w) = parse(&[("OOMSHIM_STACKS", v)]);
            assert!(w.is_empty(), "{v}: {w:?}");
            assert_eq!(cfg.stacks, mode, "{v}");
            assert_eq!((mode.native(), mode.python()), (native, python), "{v}");
            assert_eq!(mode.as_str(), v.to_ascii_lowercase());
        }
    }

    #[test]
    fn valid_values_are_taken() {
        let (cfg, warnings) = parse(&[
            ("OOMSHIM_DIR", "/data/dumps"),
            ("OOMSHIM_DEPTH", "32"),
            ("OOMSHIM_STACKS", "off"),
            ("OOMSHIM_TOP", "5"),
            ("OOMSHIM_MIN_INTERVAL", "500ms"),
            ("OOMSHIM_SETTLE", "0"),
            ("OOMSHIM_LOG", "debug"),
            ("OOMSHIM_MAX_DUMPS", "3"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.max_dumps_per_minute, Some(3));
        assert_eq!(
            parse(&[("OOMSHIM_MAX_DUMPS", "unlimited")])
                .0
                .max_dumps_per_minute,
            None
        );
        assert_eq!(cfg.dir, PathBuf::from("/data/dumps"));
        assert_eq!(cfg.depth, 32);
        assert_eq!(cfg.stacks, StackMode::Off);
        assert_eq!(cfg.top, 5);
        assert_eq!(cfg.min_interval, Duration::from_millis(500));
        assert_eq!(cfg.settle, Duration::ZERO);
        assert_eq!(cfg.log.as_deref(), Some("debug"));
    }

    #[test]
    fn each_malformed_value_warns_once_and_keeps_the_default() {
        let (cfg, warnings) = parse(&[
            ("OOMSHIM_DIR", "  "),
            ("OOMSHIM_DEPTH", "lots"),
            ("OOMSHIM_STACKS", "pyth0n"),
            ("OOMSHIM_TOP", "0"),
            ("OOMSHIM_MIN_INTERVAL", "-3s"),
            ("OOMSHIM_SETTLE", "forever"),
            ("OOMSHIM_MAX_DUMPS", "0"),
        ]);
        assert_eq!(cfg, Config::default());
        let vars: Vec<&str> = warnings.iter().map(|w| w.var).collect();
        assert_eq!(
            vars,
            [
                "OOMSHIM_DIR",
                "OOMSHIM_DEPTH",
                "OOMSHIM_STACKS",
                "OOMSHIM_TOP",
                "OOMSHIM_MIN_INTERVAL",
                "OOMSHIM_MAX_DUMPS",
                "OOMSHIM_SETTLE"
            ]
        );
        let text = warnings[1].to_string();
        assert!(
            text.contains("OOMSHIM_DEPTH") && text.contains("\"lots\"") && text.contains("64"),
            "{text}"
        );
    }

    #[test]
    fn depth_is_bounded() {
        let (cfg, w) = parse(&[("OOMSHIM_DEPTH", "100000")]);
        assert_eq!(cfg.depth, DEFAULT_DEPTH);
        assert_eq!(w.len(), 1);
        let (cfg, w) = parse(&[("OOMSHIM_DEPTH", "256")]);
        assert_eq!(cfg.depth, 256);
        assert!(w.is_empty());
    }

    #[test]
    fn log_off_values_disable_logging() {
        for v in ["", "0", "off", "OFF"] {
            assert_eq!(parse(&[("OOMSHIM_LOG", v)]).0.log, None, "{v:?}");
        }
    }

    #[test]
    fn on_demand_triggers_are_off_unless_asked_and_checked() {
        let (cfg, w) = parse(&[]);
        assert_eq!(
            (cfg.dump_signal, cfg.interval, cfg.at_exit),
            (None, None, false)
        );
        assert!(w.is_empty());
        let (cfg, w) = parse(&[
            ("OOMSHIM_SIGNAL", "SIGUSR2"),
            ("OOMSHIM_INTERVAL", "60s"),
            ("OOMSHIM_AT_EXIT", "1"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(cfg.dump_signal, Some(libc::SIGUSR2));
        assert_eq!(cfg.interval, Some(Duration::from_secs(60)));
        assert!(cfg.at_exit);
        assert_eq!(
            parse(&[("OOMSHIM_SIGNAL", "usr1")]).0.dump_signal,
            Some(libc::SIGUSR1)
        );
        let (cfg, w) = parse(&[
            ("OOMSHIM_SIGNAL", "SEGV"),
            ("OOMSHIM_INTERVAL", "1ms"),
            ("OOMSHIM_AT_EXIT", "maybe"),
        ]);
        assert_eq!(
            (cfg.dump_signal, cfg.interval, cfg.at_exit),
            (None, None, false)
        );
        let vars: Vec<&str> = w.iter().map(|w| w.var).collect();
        assert_eq!(
            vars,
            ["OOMSHIM_SIGNAL", "OOMSHIM_INTERVAL", "OOMSHIM_AT_EXIT"]
        );
        assert_eq!(
            parse(&[("OOMSHIM_SIGNAL", "11")]).0.dump_signal,
            None,
            "SIGSEGV by number is refused"
        );
    }

    #[test]
    fn dump_mode_is_octal_and_never_world_writable() {
        assert_eq!(parse(&[]).0.dump_mode, 0o600);
        for (v, m) in [
            ("0640", 0o640),
            ("640", 0o640),
            ("0o440", 0o440),
            ("0400", 0o400),
            (" 0600 ", 0o600),
            ("0755", 0o755),
        ] {
            let (cfg, w) = parse(&[("OOMSHIM_DUMP_MODE", v)]);
            assert!(w.is_empty(), "{v}: {w:?}");
            assert_eq!(cfg.dump_mode, m, "{v}");
        }
        for v in [
            "0666",
            "0602",
            "0777",
            "1600",
            "01640",
            "0800",
            "rw-r-----",
            "",
            "-1",
            "0x1a0",
            "06400",
        ] {
            let (cfg, w) = parse(&[("OOMSHIM_DUMP_MODE", v)]);
            assert_eq!(cfg.dump_mode, 0o600, "{v}");
            assert_eq!(w.len(), 1, "{v}");
            let text = w[0].to_string();
            assert!(
                text.contains("OOMSHIM_DUMP_MODE") && text.contains("using 0600"),
                "{text}"
            );
        }
    }

    #[test]
    fn injected_faults() {
        assert_eq!(parse_fault("panic-in-alloc"), Some(Fault::PanicInAlloc(1)));
        assert_eq!(
            parse_fault("PANIC-IN-ALLOC:7"),
            Some(Fault::PanicInAlloc(7))
        );
        assert_eq!(parse_fault("symbolize"), Some(Fault::Symbolize));
        assert_eq!(parse_fault("off"), Some(Fault::None));
        for bad in ["panic-in-alloc:0", "panic-in-alloc:x", "panic", "segv"] {
            assert_eq!(parse_fault(bad), None, "{bad}");
        }
    }

    #[test]
    fn each_documented_default_is_the_real_default() {
        for s in SETTINGS {
            if matches!(
                s.name,
                "OOMSHIM_TORCH_HOOK"
                    | "OOMSHIM_TORCH_ALLOCATOR"
                    | "OOMSHIM_LIB"
                    | "OOMSHIM_AUTO_STEPS"
                    | "OOMSHIM_TORCH_HISTORY"
                    | "OOMSHIM_KINDS_BUDGET_MS"
            ) {
                continue; // read by the Python hook and the library locators, not by Config
            }
            let (cfg, w) = parse(&[(s.name, s.default)]);
            assert!(w.is_empty(), "{}={}: {w:?}", s.name, s.default);
            assert_eq!(cfg, Config::default(), "{}={}", s.name, s.default);
        }
        // And each Config-read setting is one that Config really reads: a changed value shows.
        for (name, other) in [
            ("OOMSHIM_DEPTH", "3"),
            ("OOMSHIM_TOP", "3"),
            ("OOMSHIM_STACKS", "off"),
            ("OOMSHIM_AT_EXIT", "1"),
            ("OOMSHIM_DUMP_MODE", "0640"),
        ] {
            assert!(SETTINGS.iter().any(|s| s.name == name));
            assert_ne!(parse(&[(name, other)]).0, Config::default(), "{name}");
        }
    }

    #[test]
    fn every_variable_the_code_reads_is_in_the_table() {
        // Test hooks, not settings: documented where they are used.
        // OOMSHIM_SUPERVISOR: set by `oomshim run` for its tree (src/core/flight), not a setting.
        const INTERNAL: &[&str] = &[
            "OOMSHIM_FAULT",
            "OOMSHIM_BLESS",
            "OOMSHIM_TEST_VERBOSE",
            "OOMSHIM_SUPERVISOR",
        ];
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let mut read = std::collections::BTreeSet::new();
        let mut stack = vec![root.join("src"), root.join("shim/python")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
                if entry.is_dir() {
                    stack.push(entry);
                    continue;
                }
                let Ok(mut text) = std::fs::read_to_string(&entry) else {
                    continue;
                };
                if entry.ends_with("src/core/config.rs") {
                    // The table itself and these tests name every setting: not a use.
                    let start = text.find("pub const SETTINGS").unwrap();
                    let end = start + text[start..].find("\n];\n").unwrap();
                    let tests = text.find("#[cfg(test)]").unwrap();
                    text = format!("{}{}", &text[..start], &text[end..tests]);
                }
                read.extend(setting_names_in(&text));
            }
        }
        let listed: std::collections::BTreeSet<String> =
            SETTINGS.iter().map(|s| s.name.to_string()).collect();
        let missing: Vec<&String> = read
            .iter()
            .filter(|n| !listed.contains(*n) && !INTERNAL.contains(&n.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "settings read but not in SETTINGS: {missing:?}"
        );
        let unread: Vec<&String> = listed.iter().filter(|n| !read.contains(*n)).collect();
        assert!(unread.is_empty(), "in SETTINGS but never read: {unread:?}");
    }

    /// docs/configuration.md's table is [`settings_markdown_table`]; `OOMSHIM_BLESS=1` rewrites it.
    #[test]
    fn the_configuration_page_table_is_the_settings_table() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("docs/configuration.md");
        let page = std::fs::read_to_string(&path).unwrap();
        let start = page
            .find("| variable | default | meaning |")
            .expect("docs/configuration.md has the settings table");
        let end = start + page[start..].find("\n\n").expect("a blank line after it") + 1;
        let expected = settings_markdown_table();
        if std::env::var_os("OOMSHIM_BLESS").is_some_and(|v| v == "1") {
            let updated = format!("{}{expected}{}", &page[..start], &page[end..]);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        assert_eq!(
            &page[start..end],
            expected,
            "docs/configuration.md's settings table differs from config::SETTINGS (run this test with \
             OOMSHIM_BLESS=1 to rewrite it)"
        );
    }

    #[test]
    fn settings_help_lists_every_setting_with_its_default_wrapped() {
        let text = settings_help(80);
        for s in SETTINGS {
            assert!(
                text.contains(&format!("{}  (default: {})", s.name, s.default)),
                "{}",
                s.name
            );
        }
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
        assert!(!text.contains('`'));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("nan"), None);
        assert_eq!(parse_duration("1e300"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn relative_dump_dirs_are_resolved_against_the_start_directory() {
        use std::path::Path;
        let base = Some(Path::new("/work/run"));
        assert_eq!(
            resolve_dir(Path::new(DEFAULT_DIR), base),
            Path::new("/work/run/oomshim-dumps")
        );
        assert_eq!(
            resolve_dir(Path::new("./a/./b"), base),
            Path::new("/work/run/a/b")
        );
        assert_eq!(
            resolve_dir(Path::new("../shared"), base),
            Path::new("/work/run/../shared"),
            "`..` kept: the start directory may be a symlink"
        );
        assert_eq!(
            resolve_dir(Path::new("/data/d"), base),
            Path::new("/data/d")
        );
        assert_eq!(resolve_dir(Path::new("rel"), None), Path::new("rel"));
        assert_eq!(
            resolve_dir(Path::new("rel"), Some(Path::new("not/absolute"))),
            Path::new("rel")
        );
    }
}
