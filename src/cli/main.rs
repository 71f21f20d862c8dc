//! The `oomshim` command line: parses arguments and dispatches to `oomshim_cli`.

use clap::Parser;
use oomshim_cli::args::{Args, Cmd};
use oomshim_cli::{self as cli, EXIT_BAD_INPUT};
use std::io::IsTerminal;
use std::process::ExitCode;

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
    note(&format!("oomshim: error: {}\n", dump::units::clean(msg)));
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
                dump::units::clean_path(&dir)
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
                    let clean = dump::units::clean_path;
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
