//! The `oomshim` command line: parses arguments and dispatches to `oomshim_cli`.

use clap::Parser;
use oomshim_cli::args::{Args, Cmd};
use oomshim_cli::{self as cli, EXIT_BAD_INPUT};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

fn color_wanted() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The terminal report's width: `--width`, else the terminal's (stdout), else 80.
fn report_width(asked: Option<usize>) -> usize {
    if let Some(w) = asked {
        return w;
    }
    if std::io::stdout().is_terminal() {
        // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given, nothing else.
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: stdout's descriptor and a valid out-pointer; failure leaves `size` zeroed.
        if unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0
            && size.ws_col > 0
        {
            return (size.ws_col as usize).clamp(
                oomshim_cli::report::MIN_WIDTH,
                oomshim_cli::report::MAX_WIDTH,
            );
        }
    }
    oomshim_cli::report::DEFAULT_WIDTH
}

/// The terminal's height when stdout is one.
fn terminal_rows() -> Option<usize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: as in `report_width`.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: as in `report_width`.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_row > 0).then_some(size.ws_row as usize)
}

/// A report longer than the terminal goes through a pager, so that its first screen, the
/// answer, is what the user sees (git's way: `$PAGER`, else `less -FRX`; `PAGER=cat` or an
/// empty `PAGER` prints directly). Without a terminal, or when no pager can start, it is
/// printed.
fn print_paged(text: &str) -> ExitCode {
    let Some(rows) = terminal_rows() else {
        return print_out(text);
    };
    if text.lines().count() < rows {
        return print_out(text);
    }
    let (program, args): (String, Vec<String>) = match std::env::var("PAGER") {
        Ok(p) if p.trim().is_empty() || p.trim() == "cat" => return print_out(text),
        Ok(p) => ("sh".into(), vec!["-c".into(), p]),
        Err(_) => ("less".into(), vec!["-FRX".into()]),
    };
    let child = std::process::Command::new(&program)
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        return print_out(text);
    };
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        // A pager quit before the end (`q`) closes its end: that is the user's choice.
        let _ = stdin.write_all(text.as_bytes());
    }
    let _ = child.wait();
    ExitCode::SUCCESS
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
            exit_code,
            command,
        } => run_program(
            dir,
            lib,
            no_torch_hook,
            torch_allocator,
            exec,
            exit_code,
            command,
        ),
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
                let (cols, rows) = cli::top::screen_size();
                return print_out(&cli::top::clip(&text, cols, rows));
            }
            cli::top::live(&dir, pid, prune)
        }
        Cmd::Exporter {
            listen,
            dir,
            once,
            textfile_dir,
            dumps,
        } => exporter(listen, dir, once, textfile_dir, dumps),
        Cmd::Report {
            dump,
            html: Some(out),
            ..
        } => match cli::report_html(dump.as_deref(), &out) {
            Ok(text) => {
                note(&text);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Report {
            dump,
            top,
            json,
            width,
            ..
        } => {
            let style = cli::ReportStyle {
                top,
                json,
                color: color_wanted(),
                width: report_width(width),
                first_screen_only: false,
            };
            match cli::report(dump.as_deref(), &style) {
                Ok(text) if json => print_out(&text),
                Ok(text) => print_paged(&text),
                Err(e) => fail(&e, EXIT_BAD_INPUT),
            }
        }
        Cmd::Diff {
            before,
            after,
            top,
            json,
        } => match cli::diff(
            &[before, after].into_iter().flatten().collect::<Vec<_>>(),
            top,
            json,
        ) {
            Ok(text) => print_out(&text),
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Export {
            dump,
            memory_viz,
            folded,
        } => export(dump, memory_viz, folded),
        Cmd::Env => {
            print!("{}", oomshim_core::config::settings_help(100));
            ExitCode::SUCCESS
        }
        Cmd::Merge {
            dirs,
            clock_skew_ms,
            json,
            html,
        } => match cli::merge(
            &dirs,
            oomshim_cli::report::merge::MergeOptions { clock_skew_ms },
            json,
            html.as_deref(),
        ) {
            Ok(text) => print_out(&text),
            Err(e) => fail(&e, EXIT_BAD_INPUT),
        },
        Cmd::Demo { dir, lib } => demo(dir, lib),
    }
}

/// `oomshim run`: the program under the shim, supervised or exec'd.
fn run_program(
    dir: Option<PathBuf>,
    lib: Option<PathBuf>,
    no_torch_hook: bool,
    torch_allocator: bool,
    exec: bool,
    exit_code: bool,
    command: Vec<OsString>,
) -> ExitCode {
    let lib = match cli::run::find_library(lib.as_deref()) {
        Ok(l) => l,
        Err(e) => return fail(&e, cli::run::EXIT_RUN_FAILED),
    };
    let opts = cli::run::RunOptions {
        lib,
        torch_hook: !no_torch_hook,
        dir: dir.as_deref(),
        command: &command,
        exit_code,
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

/// `oomshim exporter`: the metrics once, or served, with the textfile writer beside.
fn exporter(
    listen: Option<String>,
    dir: Option<PathBuf>,
    once: bool,
    textfile_dir: Option<PathBuf>,
    dumps: Vec<PathBuf>,
) -> ExitCode {
    let dir = dir.unwrap_or_else(oomshim_core::flight::live_dir);
    let dumps = if dumps.is_empty() {
        vec![std::env::var_os("OOMSHIM_DIR")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| oomshim_core::config::DEFAULT_DIR.into())]
    } else {
        dumps
    };
    // Checked with --once too: one rule for the address, whether it is used or not.
    let addr = match cli::exporter::parse_listen(
        listen.as_deref().unwrap_or(cli::exporter::DEFAULT_LISTEN),
    ) {
        Ok(a) => a,
        Err(e) => return fail(&e, 2),
    };
    if once {
        if let Some(out) = &textfile_dir {
            textfile_pass(out, &dumps);
        }
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
    if let Some(out) = textfile_dir {
        let spawned = std::thread::Builder::new()
            .name("oomshim-textfile".into())
            .spawn(move || loop {
                textfile_pass(&out, &dumps);
                std::thread::sleep(cli::textfile::EVERY);
            });
        if let Err(e) = spawned {
            return fail(&format!("cannot start the textfile writer: {e}"), 1);
        }
    }
    cli::exporter::serve(listener, &dir)
}

/// `oomshim demo`: the bundled client against the simulated device, then its first screen.
fn demo(dir: PathBuf, lib: Option<PathBuf>) -> ExitCode {
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
            if let Some(actual) = out.dump.parent().filter(|d| *d != dir.as_path()) {
                text.push_str(&format!(
                    "oomshim demo: the shim could not write to {} and put its dumps in {}\n",
                    clean(&dir),
                    clean(actual)
                ));
            }
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
            text.push_str(&format!(
                "oomshim demo: the whole report: oomshim report {}\n\n",
                clean(&out.dump)
            ));
            note(&text);
            let style = cli::ReportStyle {
                top: 10,
                json: false,
                color: color_wanted(),
                width: report_width(None),
                first_screen_only: true,
            };
            // Named as the user would name it: nothing for the default directory.
            let default = dir == std::path::Path::new(oomshim_core::config::DEFAULT_DIR);
            let named = match out.dump.parent() {
                Some(d) if default && d == dir.as_path() => None,
                Some(d) => Some(d.to_path_buf()),
                None => Some(out.dump.clone()),
            };
            match cli::report_as(&out.dump, named.as_deref(), &style) {
                Ok(text) => print_out(&text),
                Err(e) => fail(&e, 1),
            }
        }
        Err(e) => fail(&e, 1),
    }
}

/// `oomshim export`: a dump in memory_viz's and flame graphs' formats.
fn export(dump: Option<PathBuf>, memory_viz: Option<PathBuf>, folded: Option<PathBuf>) -> ExitCode {
    if memory_viz.as_deref().is_some_and(cli::is_stdout)
        && folded.as_deref().is_some_and(cli::is_stdout)
    {
        return fail(
            "--memory-viz - and --folded - would both write to stdout: send one to a file",
            2,
        );
    }
    let dump = match cli::dump_or_default(dump.as_deref()) {
        Ok(d) => d,
        Err(e) => return fail(&e, EXIT_BAD_INPUT),
    };
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

/// One pass of `--textfile-dir`; each problem said once per exporter process.
fn textfile_pass(out: &std::path::Path, dumps: &[std::path::PathBuf]) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let pass = cli::textfile::refresh(out, dumps, cli::exporter::host_gpus());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    for p in pass.problems {
        if !said.contains(&p) && said.len() < 256 {
            note(&format!(
                "oomshim: exporter: textfile: {}\n",
                dump::units::clean(&p)
            ));
            said.push(p);
        }
    }
}
