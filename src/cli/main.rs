//! The `oomshim` command line: parses arguments and dispatches to `oomshim_cli`.

use clap::{Parser, Subcommand};
use oomshim_cli::{self as cli, EXIT_BAD_INPUT};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "oomshim",
    version,
    about = "Explains CUDA out-of-memory errors",
    long_about = "Explains CUDA out-of-memory errors. `oomshim run` starts a program with \
                  liboomshim.so preloaded; when a device allocation fails, the shim writes a dump \
                  (JSON) naming the largest holders, the allocation sites, the free blocks and a \
                  verdict. The other commands read dumps.",
    after_help = "Examples:\n  oomshim demo                               # the whole job on a simulated GPU\n  oomshim run -- python train.py             # record, and dump at out-of-memory\n  oomshim report oomshim-dumps               # the newest dump, explained\n  oomshim help env                           # every OOMSHIM_* setting"
)]
struct Args {
    /// None: `oomshim` alone, which prints the help and exits 0 (asking for nothing is no error).
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program with liboomshim.so preloaded; dumps are written when it runs out of memory.
    #[command(
        after_help = "Examples:\n  oomshim run -- python train.py\n  oomshim run --dir /shared/dumps --torch-allocator -- torchrun --nproc-per-node 8 train.py\n\nSettings (OOMSHIM_DIR, OOMSHIM_TOP, …): oomshim help env"
    )]
    Run {
        /// Directory for dumps (sets OOMSHIM_DIR; default ./oomshim-dumps).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The shim library (default: OOMSHIM_LIB, else liboomshim.so next to this binary or in
        /// the Python package it was installed with).
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// Don't inject the Python hook that saves PyTorch's own memory snapshot when torch
        /// raises OutOfMemoryError (also: OOMSHIM_TORCH_HOOK=0).
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
        after_help = "Examples:\n  oomshim report oomshim-dumps/oomshim-host-4242-1.json\n  oomshim report oomshim-dumps --top 20     # the newest dump in the directory\n  oomshim report DUMP --json | jq .growth\n  oomshim report DUMP --html report.html"
    )]
    Report {
        /// A dump file, or a directory: its newest readable dump (by time of writing; broken
        /// newer ones are skipped and named on stderr; torch's side files oomshim-torch-* are
        /// not dumps).
        #[arg(value_name = "DUMP|DIR")]
        dump: PathBuf,
        /// How many holders and sites to show.
        #[arg(long, default_value_t = 10, value_name = "N", value_parser = at_least_one())]
        top: usize,
        /// Print the report as JSON: everything the dump knows, in the documented shape
        /// `oomshim.report/1` (README: Report JSON).
        #[arg(long)]
        json: bool,
        /// Write a self-contained HTML report (verdict, growth chart, icicle graph, sortable
        /// tables) here instead of printing; shows every holder and site in the dump (`--top` is
        /// ignored).
        #[arg(long, value_name = "OUT.html", conflicts_with = "json")]
        html: Option<PathBuf>,
    },
    /// Compare two dumps of one program: growth and shrinkage by allocation site.
    #[command(
        after_help = "Example:\n  oomshim diff oomshim-dumps/oomshim-host-4242-1.json oomshim-dumps/oomshim-host-4242-2.json"
    )]
    Diff {
        /// The earlier dump, or a directory: its newest readable dump.
        #[arg(value_name = "BEFORE")]
        before: PathBuf,
        /// The later dump (or a directory: its newest readable dump); sites are matched by their
        /// symbolised stacks, never by address.
        #[arg(value_name = "AFTER")]
        after: PathBuf,
        /// How many sites to show.
        #[arg(long, default_value_t = 20, value_name = "N", value_parser = at_least_one())]
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
        /// The dump to convert, or a directory: its newest readable dump.
        #[arg(value_name = "DUMP|DIR")]
        dump: PathBuf,
        /// Write a torch.cuda.memory._snapshot()-style pickle here (segments, blocks and an
        /// allocation timeline). This, --folded, or both.
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
        /// The most two hosts' clocks may disagree, in milliseconds: failures on different
        /// hosts closer than this are not ordered.
        #[arg(long, value_name = "MS", default_value_t = oomshim_cli::report::merge::DEFAULT_CLOCK_SKEW_MS)]
        clock_skew_ms: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
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
    },
    /// Run a bundled leaky training loop on a simulated CUDA device (no GPU needed) and report
    /// the dump it produces.
    #[command(after_help = "Example:\n  oomshim demo --dir /tmp/demo-dumps")]
    Demo {
        /// Directory for the dump (default ./oomshim-dumps).
        #[arg(long, default_value = "oomshim-dumps", value_name = "DIR")]
        dir: PathBuf,
        /// The shim library (default: found as for `run`).
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

fn color_wanted() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Status when stdout cannot be written for a reason other than a reader that went away.
const EXIT_OUTPUT_FAILED: u8 = 1;

/// Writes `text` to stdout and flushes it. A reader that went away (`EPIPE`, as after
/// `oomshim merge DIR | head -1`) ends the program quietly with status 0: the reader chose to
/// stop, and `set -o pipefail` scripts should not fail for it (ripgrep does the same). Any
/// other error (`> /dev/full`) is one line on stderr and status 1, never a panic.
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            note(&format!("oomshim: error: cannot write to stdout: {e}\n"));
            ExitCode::from(EXIT_OUTPUT_FAILED)
        }
    }
}

/// Writes `text` to stderr; a stderr that cannot be written is not worth failing for (and must
/// never panic, as `eprint!` does).
fn note(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// One line on stderr, whatever the message holds (file names and dump strings can carry
/// newlines and escape sequences: shown escaped), then the exit status.
fn fail(msg: &str, code: i32) -> ExitCode {
    note(&format!(
        "oomshim: error: {}\n",
        oomshim_cli::report::units::clean(msg)
    ));
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// `oomshim run` passes the caller's signal dispositions and mask on to the program exactly, so
/// they are noted before Rust's runtime sets SIGPIPE to ignored (src/cli/supervise.rs).
#[used]
#[link_section = ".init_array"]
static RECORD_SIGNAL_STATE: extern "C" fn() = cli::supervise::record_start_state;

/// A file write beyond `RLIMIT_FSIZE` raises SIGXFSZ, whose default action kills the process
/// and leaves a half-written temporary file. Ignored, the write fails with EFBIG instead: the
/// writer removes its temporary file and the error is reported. Not for `run` and `demo`: an
/// ignored signal stays ignored across `exec`, and the program must start as it would bare.
fn ignore_sigxfsz() {
    // SAFETY: SIG_IGN installs no handler code; the CLI's writes check EFBIG themselves.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// `--top N`: a report of nothing is never what was meant, so 0 is refused with clap's error.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(command) = args.command else {
        use clap::CommandFactory;
        // Ignored: a closed stdout leaves nothing to say it to.
        let _ = Args::command().print_long_help();
        return ExitCode::SUCCESS;
    };
    if !matches!(command, Cmd::Run { .. } | Cmd::Demo { .. }) {
        ignore_sigxfsz();
    }
    match command {
        Cmd::Run {
            dir,
            lib,
            no_torch_hook,
            torch_allocator,
            exec,
            command,
        } => {
            let lib = match cli::run::find_library(lib.as_deref()) {
                Ok(l) => l,
                Err(e) => return fail(&e, cli::run::EXIT_RUN_FAILED),
            };
            let opts = cli::run::RunOptions {
                lib,
                torch_hook: !no_torch_hook,
                dir: dir.as_deref(),
                command: &command,
                extra_env: if torch_allocator {
                    // `force` (skip the hook's reading of the program) survives the flag.
                    let forced = std::env::var("OOMSHIM_TORCH_ALLOCATOR")
                        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("force"));
                    let value = if forced { "force" } else { "1" };
                    vec![("OOMSHIM_TORCH_ALLOCATOR".into(), value.into())]
                } else {
                    vec![]
                },
            };
            if exec {
                // Returns only if the program could not be started.
                let e = cli::run::exec(&opts);
                return fail(&e.message, e.code);
            }
            match cli::supervise::supervise(&opts) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) if e.message.is_empty() => ExitCode::from(e.code.clamp(0, 255) as u8),
                Err(e) => fail(&e.message, e.code),
            }
        }
        Cmd::Top {
            pid,
            once,
            dir,
            prune,
        } => {
            let dir = dir.unwrap_or_else(oomshim_core::flight::live_dir);
            if once {
                let mut text = String::new();
                if prune {
                    for line in cli::top::prune(&dir) {
                        text.push_str(&format!("{line}\n"));
                    }
                }
                let now = dump::time::unix_ms(std::time::SystemTime::now());
                text.push_str(&cli::top::frame(&dir, pid, now));
                return print_out(&text);
            }
            cli::top::live(&dir, pid, prune)
        }
        Cmd::Exporter { listen, dir, once } => {
            let dir = dir.unwrap_or_else(oomshim_core::flight::live_dir);
            // Checked with --once too: one rule for the address, whether it is used or not.
            let addr = match cli::exporter::parse_listen(
                listen.as_deref().unwrap_or(cli::exporter::DEFAULT_LISTEN),
            ) {
                Ok(a) => a,
                Err(e) => return fail(&e, 2),
            };
            if once {
                let now = dump::time::unix_ms(std::time::SystemTime::now());
                return print_out(&cli::exporter::exposition(&dir, now));
            }
            if let Some(w) = cli::exporter::listen_warning(&addr) {
                note(&format!("{w}\n"));
            }
            let listener = match std::net::TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => return fail(&format!("cannot listen on {addr}: {e}"), 1),
            };
            let bound = listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            note(&format!(
                "oomshim: exporter serving http://{bound}/metrics (regions in {})\n",
                oomshim_cli::report::units::clean_path(&dir)
            ));
            cli::exporter::serve(listener, &dir)
        }
        Cmd::Report {
            dump,
            html: Some(out),
            ..
        } => match cli::report_html(&dump, &out) {
            Ok(text) => {
                note(&text);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Report {
            dump, top, json, ..
        } => match cli::report(&dump, top, json, color_wanted()) {
            Ok(text) => print_out(&text),
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Diff {
            before,
            after,
            top,
            json,
        } => match cli::diff(&before, &after, top, json) {
            Ok(text) => print_out(&text),
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Export {
            dump,
            memory_viz,
            folded,
        } => {
            if let Some(out) = &memory_viz {
                match cli::export_memory_viz(&dump, out) {
                    Ok(text) => note(&text),
                    Err(e) => return fail(&e, EXIT_BAD_INPUT),
                }
            }
            if let Some(out) = &folded {
                match cli::export_folded(&dump, out) {
                    Ok(text) => note(&text),
                    Err(e) => return fail(&e, EXIT_BAD_INPUT),
                }
            }
            ExitCode::SUCCESS
        }
        Cmd::Env => {
            print!("{}", oomshim_core::config::settings_help(100));
            ExitCode::SUCCESS
        }
        Cmd::Merge {
            dirs,
            clock_skew_ms,
            json,
        } => match cli::merge(
            &dirs,
            oomshim_cli::report::merge::MergeOptions { clock_skew_ms },
            json,
        ) {
            Ok(text) => print_out(&text),
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Demo { dir, lib } => {
            let lib = match cli::run::find_library(lib.as_deref()) {
                Ok(l) => l,
                Err(e) => return fail(&e, 1),
            };
            note(&format!(
                "oomshim demo: a training loop that keeps every activation runs on a simulated {} CUDA \
                 device under the shim until it runs out of memory…\n",
                cli::demo::DEMO_CAPACITY
            ));
            match cli::demo::run_demo(lib, &dir) {
                Ok(out) => {
                    let clean = oomshim_cli::report::units::clean_path;
                    let mut text = format!(
                        "oomshim demo: the client exited with status {}; its dump is {}\n",
                        out.client_exit,
                        clean(&out.dump)
                    );
                    if let Some(snapshot) = &out.snapshot {
                        text.push_str(&format!(
                            "oomshim demo: its snapshot at step {} is {}; what grew between them: \
                             oomshim diff {} {}\n",
                            cli::demo::SNAPSHOT_STEP,
                            clean(snapshot),
                            clean(snapshot),
                            clean(&out.dump)
                        ));
                    }
                    text.push('\n');
                    note(&text);
                    match cli::report(&out.dump, 10, false, color_wanted()) {
                        Ok(text) => print_out(&text),
                        Err(e) => fail(&e, 1),
                    }
                }
                Err(e) => fail(&e, 1),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Args;
    use clap::CommandFactory;

    /// Every argument of every subcommand has help text, and every subcommand an example.
    #[test]
    fn help_describes_every_argument_and_shows_an_example() {
        let cmd = Args::command();
        cmd.clone().debug_assert();
        for sub in cmd.get_subcommands() {
            let after = sub
                .get_after_help()
                .map(|s| s.to_string())
                .unwrap_or_default();
            assert!(
                after.contains("Example"),
                "{} has no example",
                sub.get_name()
            );
            assert!(sub.get_about().is_some(), "{} has no about", sub.get_name());
            for arg in sub.get_arguments() {
                if matches!(arg.get_id().as_str(), "help" | "version") {
                    continue;
                }
                assert!(
                    arg.get_help()
                        .is_some_and(|h| !h.to_string().trim().is_empty()),
                    "{} {} has no help",
                    sub.get_name(),
                    arg.get_id()
                );
            }
        }
    }
}
