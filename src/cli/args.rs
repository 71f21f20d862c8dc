//! The `oomshim` command line's arguments (clap): here in the library rather than in
//! src/cli/main.rs so that their test runs in the library's test binary and the CLI binary is not
//! compiled a second time as a test harness (`test = false` on the [[bin]]).

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "oomshim",
    version,
    about = "Explains CUDA out-of-memory errors",
    long_about = "Explains CUDA out-of-memory errors. `oomshim run` starts a program with \
                  liboomshim.so preloaded; when a device allocation fails, the shim writes a dump \
                  (JSON) naming the largest holders, the allocation sites and a verdict, and says \
                  the verdict on stderr. With PyTorch it adds torch's free blocks and memory by \
                  kind (through its Python hook), and every tensor with exact free blocks in \
                  allocator mode (`run --torch-allocator`). The other commands read dumps.",
    after_help = "Examples:\n  oomshim demo                               # the whole job on a simulated GPU\n  oomshim run -- python train.py             # record, and dump at out-of-memory\n  oomshim report                             # the newest dump in ./oomshim-dumps, explained\n  oomshim help env                           # every OOMSHIM_* setting"
)]
pub struct Args {
    /// None: `oomshim` alone, which prints the help and exits 0 (asking for nothing is no error).
    #[command(subcommand)]
    pub command: Option<Cmd>,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run a program with liboomshim.so preloaded; dumps are written when it runs out of memory.
    #[command(
        after_help = "Examples:\n  oomshim run -- python train.py\n  oomshim run --dir /shared/dumps --torch-allocator -- torchrun --nproc-per-node 8 train.py\n\nSettings (OOMSHIM_DIR, OOMSHIM_TOP, …): oomshim help env"
    )]
    Run {
        /// Directory for dumps (sets OOMSHIM_DIR; default ./oomshim-dumps).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The shim library, checked before the program starts (default: OOMSHIM_LIB, else
        /// liboomshim.so next to this binary or in the Python package it was installed with).
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// Don't inject oomshim's Python hook (also: OOMSHIM_TORCH_HOOK=0). In PyTorch programs
        /// the hook adds torch's view at an OOM (its free blocks, memory by kind, the snapshot
        /// for memory_viz) and marks training steps; without it the shim sees torch's segments
        /// only.
        #[arg(long)]
        no_torch_hook: bool,
        /// Make oomshim PyTorch's CUDA allocator (allocator mode): every tensor is recorded with
        /// its stack and the dump has the exact free-block state. Installed through the same
        /// Python hook, right after the program imports torch (sets OOMSHIM_TORCH_ALLOCATOR=1).
        #[arg(long, conflicts_with = "no_torch_hook")]
        torch_allocator: bool,
        /// Replace oomshim with the program (exec) instead of staying as its parent: the
        /// program keeps oomshim's pid, but no post-mortem dump is written if it is killed.
        #[arg(long)]
        exec: bool,
        /// When the program fails, exit with a status that says whether running it again can
        /// succeed, from its first failure's verdict: 75 when the memory was someone else's (retry
        /// on a free device), 78 when it was the program's own (change it first); otherwise, and
        /// without this flag, the program's own status (for Kubernetes' podFailurePolicy).
        #[arg(long, conflicts_with = "exec")]
        exit_code: bool,
        /// The program and its arguments, after `--`.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<OsString>,
    },
    /// Print a dump as a readable report (or as JSON, or as one HTML page).
    #[command(
        after_help = "Examples:\n  oomshim report                            # the newest dump in ./oomshim-dumps\n  oomshim report oomshim-dumps/oomshim-host-4242-1.json --top 20\n  oomshim report DUMP --json | jq .growth\n  oomshim report DUMP --html report.html"
    )]
    Report {
        /// A dump file, or a directory: its newest readable dump (by time of writing; broken
        /// newer ones are skipped and named on stderr; torch's side files oomshim-torch-* are
        /// not dumps). A directory without dumps stands for its oomshim-dumps/. Default:
        /// OOMSHIM_DIR when set, else ./oomshim-dumps.
        #[arg(value_name = "DUMP|DIR")]
        dump: Option<PathBuf>,
        /// How many holders and sites to show, 1 to 100,000.
        #[arg(long, default_value_t = 10, value_name = "N", value_parser = parse_top)]
        top: usize,
        /// Columns to wrap the report to, 60 to 400 (default: the terminal's width, 80 when the
        /// output is no terminal).
        #[arg(long, value_name = "COLUMNS", value_parser = parse_width)]
        width: Option<usize>,
        /// Print the report as JSON: everything the dump knows, in the documented shape
        /// `oomshim.report/1` (docs/dump-schema.md).
        #[arg(long)]
        json: bool,
        /// Write a self-contained HTML report (verdict, what fills the device, growth chart,
        /// icicle graph, sortable tables) here instead of printing, `-` for stdout; shows every
        /// holder and site in the dump (`--top` is ignored).
        #[arg(long, value_name = "OUT.html", conflicts_with = "json")]
        html: Option<PathBuf>,
    },
    /// Compare two dumps of one program: growth and shrinkage by allocation site.
    #[command(
        after_help = "Examples:\n  oomshim diff                              # the two newest dumps in ./oomshim-dumps\n  oomshim diff oomshim-dumps/oomshim-host-4242-1.json oomshim-dumps/oomshim-host-4242-2.json"
    )]
    Diff {
        /// The earlier dump (a directory stands for its newest readable dump). Named alone, a
        /// directory: its two newest dumps are compared. Neither named: the two newest in
        /// OOMSHIM_DIR when set, else ./oomshim-dumps.
        #[arg(value_name = "BEFORE")]
        before: Option<PathBuf>,
        /// The later dump (a directory: its newest readable dump). Sites are matched by their
        /// symbolised stacks, never by address.
        #[arg(value_name = "AFTER")]
        after: Option<PathBuf>,
        /// How many sites to show, 1 to 100,000.
        #[arg(long, default_value_t = 20, value_name = "N", value_parser = parse_top)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Convert a dump for PyTorch's memory viewer or for flame-graph tools.
    #[command(
        group(clap::ArgGroup::new("format").required(true).multiple(true).args(["memory_viz", "folded"])),
        after_help = "Examples:\n  oomshim export DUMP --memory-viz snapshot.pickle   # open at https://pytorch.org/memory_viz\n  oomshim export DUMP --folded - | flamegraph.pl > holders.svg\n  oomshim export DUMP --folded stacks.folded        # load into https://www.speedscope.app"
    )]
    Export {
        /// The dump to convert, or a directory: its newest readable dump (default: OOMSHIM_DIR
        /// when set, else ./oomshim-dumps).
        #[arg(value_name = "DUMP|DIR")]
        dump: Option<PathBuf>,
        /// Write a torch.cuda.memory._snapshot()-style pickle here (segments, blocks and an
        /// allocation timeline), `-` for stdout (not a terminal). This, --folded, or both.
        #[arg(long, value_name = "OUT.pickle")]
        memory_viz: Option<PathBuf>,
        /// Write folded stacks (`outer;…;inner bytes`, one line per stack) here, `-` for stdout:
        /// the input of flamegraph.pl, inferno and speedscope.
        #[arg(long, value_name = "OUT.folded")]
        folded: Option<PathBuf>,
    },
    /// One table of the dumps of all ranks of a job: the first rank to run out of memory, the
    /// ranks far above the median, whether the others had room, the ranks of each host.
    #[command(
        after_help = "Examples:\n  oomshim merge /shared/dumps --json\n  oomshim merge node-a/dumps node-b/dumps --clock-skew-ms 50"
    )]
    Merge {
        /// The directories to read (each with one level of subdirectories): one shared by all
        /// hosts, or one per host. A dump file may be named too.
        #[arg(value_name = "DIR", required = true)]
        dirs: Vec<PathBuf>,
        /// The most two hosts' clocks may disagree, in milliseconds (0 to 3,600,000): failures
        /// on different hosts closer than this are not ordered.
        #[arg(long, value_name = "MS", default_value_t = crate::report::merge::DEFAULT_CLOCK_SKEW_MS, value_parser = parse_clock_skew)]
        clock_skew_ms: u64,
        /// Print JSON instead of text.
        #[arg(long, conflicts_with = "html")]
        json: bool,
        /// Write the merge as one self-contained HTML page to this file instead (`-`: stdout).
        #[arg(long, value_name = "OUT.html")]
        html: Option<PathBuf>,
    },
    /// A live view of every oomshim process of this user on this host (or one pid), from the
    /// live summaries the shim publishes: device memory, growing sites, steps per second, the
    /// last failure. Refreshed about once a second.
    #[command(
        after_help = "Keys: q quits, p prunes the regions of gone processes (Ctrl-C quits too).\n\nExamples:\n  oomshim top\n  oomshim top --pid 4242 --once\n  oomshim top --prune --once"
    )]
    Top {
        /// Show only this process.
        #[arg(long, value_name = "PID")]
        pid: Option<u32>,
        /// Print one frame as plain text and exit (for scripts).
        #[arg(long)]
        once: bool,
        /// Where the live summaries are (default: OOMSHIM_LIVE_DIR, else /dev/shm/oomshim-UID).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Remove the regions of processes that are gone (left by a crash, not written for 10 s)
        /// before showing, and before every refresh; the `p` key does it once.
        #[arg(long)]
        prune: bool,
    },
    /// Serve the live summaries of this user's oomshim processes on this host as Prometheus
    /// metrics (text format 0.0.4) at GET /metrics: tracked device bytes and peaks per process,
    /// rank and device, OOM counts, steps, host RSS. Every scrape re-reads the regions.
    #[command(
        after_help = "Examples:\n  oomshim exporter\n  oomshim exporter --listen 127.0.0.1:9500\n  oomshim exporter --once"
    )]
    Exporter {
        /// IP:PORT to listen on (default 127.0.0.1:9464, loopback only). A non-loopback address
        /// is served only when named here, with a warning; host names are not resolved.
        #[arg(long, value_name = "IP:PORT")]
        listen: Option<String>,
        /// Where the live summaries are (default: OOMSHIM_LIVE_DIR, else /dev/shm/oomshim-UID).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print the metrics once to stdout and exit (for scripts and tests).
        #[arg(long)]
        once: bool,
        /// Also write one .prom file per out-of-memory dump and post-mortem into this directory,
        /// for node_exporter's textfile collector (atomic renames; files of removed dumps are
        /// removed; looked at every 5 s, or once with --once).
        #[arg(long, value_name = "DIR")]
        textfile_dir: Option<PathBuf>,
        /// The dump directories --textfile-dir reads (repeatable; default: OOMSHIM_DIR, else
        /// ./oomshim-dumps).
        #[arg(long = "dumps", value_name = "DIR", requires = "textfile_dir")]
        dumps: Vec<PathBuf>,
    },
    /// Run a bundled leaky training loop on a simulated CUDA device (no GPU needed) and show the
    /// answer of the dump it produces (the report's first screen).
    #[command(after_help = "Example:\n  oomshim demo --dir /tmp/demo-dumps")]
    Demo {
        /// Directory for the dumps (where the shim cannot write, it says so and puts them in a
        /// private directory of $TMPDIR; the demo reports them there).
        #[arg(long, default_value = oomshim_core::config::DEFAULT_DIR, value_name = "DIR")]
        dir: PathBuf,
        /// The shim library, checked before the demo runs (default: found as for `run`).
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
    },
    /// List every OOMSHIM_* setting with its default and meaning (also: oomshim help env).
    #[command(
        long_about = oomshim_core::config::settings_help(100),
        after_help = "Example:\n  OOMSHIM_DIR=/shared/dumps OOMSHIM_TOP=50 oomshim run -- python train.py"
    )]
    Env,
}

/// A whole number from `min` to `max`, or an error that says so in words (clap's own range
/// error names `1..18446744073709551615`).
fn number_in(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let range = format!(
        "a whole number from {} to {}",
        dump::units::thousands(min),
        dump::units::thousands(max)
    );
    match text.trim().replace(['_', ','], "").parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(format!("{text} is out of range: {range}")),
        Err(_) => Err(format!("{text} is not {range}")),
    }
}

/// `--top N`: a report of nothing is never what was meant.
pub fn parse_top(text: &str) -> Result<usize, String> {
    number_in(text, 1, 100_000).map(|n| n as usize)
}

/// `--width COLUMNS`.
pub fn parse_width(text: &str) -> Result<usize, String> {
    number_in(
        text,
        crate::report::MIN_WIDTH as u64,
        crate::report::MAX_WIDTH as u64,
    )
    .map(|n| n as usize)
}

/// `--clock-skew-ms MS`: up to an hour.
pub fn parse_clock_skew(text: &str) -> Result<u64, String> {
    number_in(text, 0, 3_600_000)
}
