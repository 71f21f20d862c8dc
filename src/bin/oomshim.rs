//! The `oomshim` command line: parses arguments and dispatches to `oomshim::cli`.

use clap::{Parser, Subcommand};
use oomshim::cli::{self, EXIT_BAD_INPUT};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "oomshim",
    version,
    about = "Explains CUDA out-of-memory errors"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program with liboomshim.so preloaded; dumps are written when it runs out of memory.
    Run {
        /// Directory for dumps (sets OOMSHIM_DIR; default ./oomshim-dumps).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The shim library (default: liboomshim.so next to this binary).
        #[arg(long)]
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
        /// The program and its arguments, after `--`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Print a dump as a readable report.
    Report {
        dump: PathBuf,
        /// How many holders and sites to show.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print the report as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Write a self-contained HTML report (verdict, flame graph, sortable tables) here
        /// instead of printing; shows every holder and site in the dump (`--top` is ignored).
        #[arg(long, value_name = "OUT.html", conflicts_with = "json")]
        html: Option<PathBuf>,
    },
    /// Compare two dumps of one program: growth and shrinkage by allocation site.
    Diff {
        before: PathBuf,
        after: PathBuf,
        /// How many sites to show.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Convert a dump for PyTorch's memory viewer.
    Export {
        dump: PathBuf,
        /// Write a torch.cuda.memory._snapshot()-style pickle here.
        #[arg(long, value_name = "OUT.pickle")]
        memory_viz: PathBuf,
    },
    /// One table of the dumps of all ranks of a job (a directory, shared by hosts or not).
    Merge {
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a bundled leaky training loop on a simulated CUDA device (no GPU needed) and report
    /// the dump it produces.
    Demo {
        /// Directory for the dump (default ./oomshim-dumps).
        #[arg(long, default_value = "oomshim-dumps")]
        dir: PathBuf,
        /// The shim library (default: liboomshim.so next to this binary).
        #[arg(long)]
        lib: Option<PathBuf>,
    },
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
        oomshim::report::units::clean(msg)
    ));
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// A file write beyond `RLIMIT_FSIZE` raises SIGXFSZ, whose default action kills the process
/// and leaves a half-written temporary file. Ignored, the write fails with EFBIG instead: the
/// writer removes its temporary file and the error is reported. Not for `run` and `demo`: an
/// ignored signal stays ignored across `exec`, and the program must start as it would bare.
fn ignore_sigxfsz() {
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !matches!(args.command, Cmd::Run { .. } | Cmd::Demo { .. }) {
        ignore_sigxfsz();
    }
    match args.command {
        Cmd::Run {
            dir,
            lib,
            no_torch_hook,
            torch_allocator,
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
                    vec![("OOMSHIM_TORCH_ALLOCATOR".into(), "1".into())]
                } else {
                    vec![]
                },
            };
            // Returns only if the program could not be started.
            let e = cli::run::exec(&opts);
            fail(&e.message, e.code)
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
        Cmd::Export { dump, memory_viz } => match cli::export_memory_viz(&dump, &memory_viz) {
            Ok(text) => {
                note(&text);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Merge { dir, json } => match cli::merge(&dir, json) {
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
                    note(&format!(
                        "oomshim demo: the client exited with status {}; its dump is {}\n\n",
                        out.client_exit,
                        oomshim::report::units::clean_path(&out.dump)
                    ));
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
