//! `oomshim top`: every oomshim process of this user on this host (or one pid), from their live
//! regions (src/core/flight) alone: device memory tracked, the sites growing now, steps per second,
//! host memory, the last failure. `--once` prints one plain-text frame (for scripts and tests);
//! otherwise the frame is redrawn about once a second. A region that cannot be read (torn,
//! foreign, hostile) is one line saying why; nothing in a region can crash the view or drive
//! the terminal (every string is shown escaped).
//!
//! The live view reads keys from a terminal without waiting for Enter (`q` quits, `p` prunes);
//! the terminal's settings are restored on every way out: `q`, Ctrl-C, SIGTERM or SIGHUP, a
//! reader that went away.

use dump::units::{clean, human_bytes};
use oomshim_core::flight::read::{read_region, scan, ReadError, RegionEntry, Snapshot};
use oomshim_core::flight::Liveness;
use oomshim_core::verdict::short_label;
use std::fmt::Write;
use std::path::Path;

/// Sites shown per process.
const SITES_SHOWN: usize = 5;

/// One frame: every region in `dir` (only `pid`'s when given), the running processes first (and
/// those of other pid namespaces, which cannot be told apart from running ones from here), the
/// regions of gone processes folded into one line at the end. What is not this user's (the
/// directory, a region) is not read, and said once at the end of the frame.
pub fn frame(dir: &Path, pid: Option<u32>, now_ms: u64) -> String {
    let listing = scan(dir);
    let mut entries: Vec<RegionEntry> = listing
        .regions
        .into_iter()
        .filter(|r| pid.is_none_or(|p| r.pid == p))
        .collect();
    // Running first, then other namespaces, each by pid; gone ones are listed apart.
    entries.sort_by_key(|e| (e.liveness != Liveness::Running, e.pid, e.id));
    let (shown, gone): (Vec<RegionEntry>, Vec<RegionEntry>) = entries
        .into_iter()
        .partition(|e| e.liveness != Liveness::Gone);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "oomshim top — {}{} (regions in {})",
        dump::units::plural(shown.len() as u64, "process", "processes"),
        if gone.is_empty() {
            String::new()
        } else {
            format!(", {} gone", gone.len())
        },
        dump::units::clean_path(dir)
    );
    if shown.is_empty() && gone.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            match pid {
                Some(p) => format!("no oomshim process with pid {p} publishes here"),
                None => "no oomshim process of this user publishes here".to_string(),
            }
        );
    }
    // A single pid asked for by name is shown in full, gone or not.
    let (shown, gone) = if pid.is_some() {
        (shown.into_iter().chain(gone).collect(), Vec::new())
    } else {
        (shown, gone)
    };
    for e in &shown {
        let read = read_region(&e.path);
        if matches!(read, Err(ReadError::Gone)) {
            continue; // exited normally since the listing
        }
        out.push('\n');
        render_one(&mut out, e, read, now_ms);
    }
    if !gone.is_empty() {
        let pids: Vec<String> = gone
            .iter()
            .take(GONE_PIDS_SHOWN)
            .map(|e| e.pid.to_string())
            .collect();
        let _ = writeln!(
            out,
            "\n{} left {} behind (they did not exit normally): pid{} {}{}; `p` or --prune removes them, `--pid PID` shows one",
            dump::units::plural(gone.len() as u64, "gone process", "gone processes"),
            if gone.len() == 1 { "its region" } else { "their regions" },
            if gone.len() == 1 { "" } else { "s" },
            pids.join(", "),
            if gone.len() > GONE_PIDS_SHOWN { ", …" } else { "" }
        );
    }
    if !listing.ignored.is_empty() {
        out.push('\n');
        for why in &listing.ignored {
            let _ = writeln!(out, "ignored: {}", clean(why));
        }
    }
    out
}

/// Pids of gone processes named on their folded line.
const GONE_PIDS_SHOWN: usize = 8;

/// Columns and rows of the screen a frame goes to: the terminal's when standard output is one,
/// else `COLUMNS` and `LINES` when set; `None` for no limit.
pub fn screen_size() -> (Option<usize>, Option<usize>) {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        // SAFETY: `winsize` is plain data; TIOCGWINSZ writes it or fails.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: an ioctl that fills the local `winsize`.
        if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
            return (
                Some(ws.ws_col as usize),
                Some(ws.ws_row as usize).filter(|r| *r > 0),
            );
        }
    }
    let env = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
    };
    (env("COLUMNS"), env("LINES"))
}

/// `text` cut to `cols` characters a line and `rows` lines, the last of them saying how many
/// were left out; unchanged where a limit is `None`.
pub fn clip(text: &str, cols: Option<usize>, rows: Option<usize>) -> String {
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| match cols {
            Some(c) => truncate(l, c.max(2)),
            None => l.to_string(),
        })
        .collect();
    if let Some(r) = rows.map(|r| r.max(2)) {
        if lines.len() > r {
            let left = lines.len() - (r - 1);
            lines.truncate(r - 1);
            let note = format!("… {left} more lines (a larger terminal, or --pid PID, shows them)");
            lines.push(match cols {
                Some(c) => truncate(&note, c.max(2)),
                None => note,
            });
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

fn render_one(out: &mut String, e: &RegionEntry, read: Result<Snapshot, ReadError>, now_ms: u64) {
    let state = match e.liveness {
        Liveness::Running => "running",
        Liveness::OtherNamespace => {
            "in another pid namespace (its pid there; whether it still runs cannot be told from here)"
        }
        Liveness::Gone => {
            "gone (its region was left behind: it did not exit normally; `p` or --prune removes it)"
        }
    };
    let snap = match read {
        Ok(s) => s,
        Err(err) => {
            let _ = writeln!(out, "pid {}  {state}: {err}", e.pid);
            return;
        }
    };
    let s = &snap.summary;
    let d = &s.dump;
    let cmd = d
        .process
        .command_line
        .iter()
        .map(|a| clean(a))
        .collect::<Vec<_>>()
        .join(" ");
    let _ = writeln!(
        out,
        "pid {}  {state}  {}  (published {:.1} s ago, publish {}{})",
        e.pid,
        truncate(&cmd, 80),
        now_ms.saturating_sub(s.published_unix_ms) as f64 / 1000.0,
        s.generation,
        if snap.from_previous {
            "; the newest was torn, showing the one before"
        } else {
            ""
        }
    );
    if d.devices.is_empty() {
        let _ = writeln!(out, "  no device memory allocated yet");
    }
    for dev in &d.devices {
        let free = match &s.last_failure {
            Some(f) if f.device == dev.index => match (f.free_bytes, f.total_bytes) {
                (Some(free), Some(total)) => format!(
                    ", free {} of {} at the last failure",
                    human_bytes(free),
                    human_bytes(total)
                ),
                _ => String::new(),
            },
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  device {}: tracked {} in {}, peak {}{free}",
            dev.index,
            human_bytes(dev.tracked_bytes),
            dump::units::plural(dev.tracked_count, "allocation", "allocations"),
            human_bytes(dev.peak_tracked_bytes)
        );
    }
    let steps = d
        .growth
        .as_ref()
        .filter(|g| g.unit == "step")
        .map(|g| g.current);
    let rate = steps_per_second(&s.rss);
    let rss = s
        .rss
        .last()
        .map(|r| human_bytes(r.bytes))
        .unwrap_or_else(|| "unknown".into());
    let _ = writeln!(
        out,
        "  steps: {}{}   host RSS: {rss}",
        steps
            .map(|n| n.to_string())
            .unwrap_or_else(|| "none marked".into()),
        rate.map(|r| format!(" ({r:.1}/s)")).unwrap_or_default()
    );
    if let Some(lk) = &s.kinds {
        let _ = writeln!(
            out,
            "  by kind on device {} ({:.1} s ago): {}",
            lk.device,
            now_ms.saturating_sub(lk.unix_ms) as f64 / 1000.0,
            dump::view::kinds_in_words(&lk.kinds)
        );
    }
    if d.growth.as_ref().and_then(|g| g.steps.as_deref()) == Some("timeline") {
        // Growth over time, as the verdict judges it: a leak, or growing (young), loading,
        // stopped, with its numbers.
        if let Some(line) = oomshim_core::verdict::growth_line(d) {
            let _ = writeln!(out, "  {}", truncate(&clean(&line), 200));
        }
    } else if let Some(g) = &d.growth {
        for site in g.sites.iter().take(SITES_SHOWN) {
            let _ = writeln!(
                out,
                "  growing: {} +{} per {}",
                truncate(&short_label(&site.stack), 90),
                human_bytes(site.bytes_per_step),
                if g.unit == "step" { "step" } else { "second" }
            );
        }
    }
    for site in d.sites.iter().take(SITES_SHOWN) {
        let _ = writeln!(
            out,
            "  site: {} in {}  {}",
            human_bytes(site.bytes),
            site.count,
            truncate(&short_label(&site.stack), 90)
        );
    }
    if let Some(f) = &s.last_failure {
        let _ = writeln!(
            out,
            "  last failure: {} of {} on device {}, {:.1} s ago{}",
            human_bytes(f.bytes),
            clean(&f.api),
            f.device,
            now_ms.saturating_sub(f.unix_ms) as f64 / 1000.0,
            match (&f.headline, &f.dump) {
                (Some(h), Some(p)) => format!(": {}  (dump {})", clean(h), clean(p)),
                _ => " (no dump yet)".to_string(),
            }
        );
    }
}

/// Steps per second over the samples that carry steps.
fn steps_per_second(rss: &[oomshim_core::flight::RssSample]) -> Option<f64> {
    let stepped: Vec<_> = rss.iter().filter(|r| r.step.is_some()).collect();
    let (a, b) = (stepped.first()?, stepped.last()?);
    let dt = b.unix_ms.checked_sub(a.unix_ms).filter(|d| *d > 0)? as f64 / 1000.0;
    Some(b.step?.saturating_sub(a.step?) as f64 / dt)
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max - 1).collect();
    t.push('…');
    t
}

/// A region of a gone process is pruned only once it has not been written for this long: the
/// process published it last, and `oomshim run` (which reads it for a post-mortem the moment it
/// reaps the process) has had its turn.
pub const PRUNE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Removes the regions in `dir` of processes that are gone (pid and start time no longer
/// running) and idle for [`PRUNE_GRACE`]; only regions [`scan`] trusts (this user's, private).
/// Returns one line per region removed or that could not be removed.
pub fn prune(dir: &Path) -> Vec<String> {
    let mut said = Vec::new();
    for e in scan(dir)
        .regions
        .into_iter()
        .filter(|e| e.liveness == Liveness::Gone)
    {
        let idle = std::fs::symlink_metadata(&e.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|idle| idle >= PRUNE_GRACE);
        if !idle {
            continue;
        }
        let name = dump::units::clean_path(&e.path);
        match std::fs::remove_file(&e.path) {
            Ok(()) => said.push(format!("pruned the region of gone pid {}: {name}", e.pid)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => said.push(format!("cannot prune {name}: {err}")),
        }
    }
    said
}

/// The key legend of the live view.
fn legend(keys: bool) -> &'static str {
    if keys {
        "keys: q quit · p prune the regions of gone processes · Ctrl-C quits too"
    } else {
        "Ctrl-C quits (no keys: standard input is not a terminal)"
    }
}

/// The signal that asked the live view to end (0: none yet).
static STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    STOP.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// The terminal on standard input switched to reading keys one at a time without echo (signals
/// still work: Ctrl-C stays Ctrl-C); its settings come back when this is dropped.
struct KeyMode {
    saved: libc::termios,
}

impl KeyMode {
    fn enter() -> Option<KeyMode> {
        // SAFETY: `termios` is plain data, for which all zeroes is a valid value.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `tcgetattr` writes only the local `termios`; not a terminal is an error.
        if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: `tcsetattr` reads the local `termios`, a copy of the terminal's own.
        if unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(KeyMode { saved })
    }
}

impl Drop for KeyMode {
    fn drop(&mut self) {
        // SAFETY: `tcsetattr` reads the settings `enter` saved from this terminal.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.saved) };
    }
}

/// Waits up to `timeout` for a key on standard input; the keys read, empty on a timeout or a
/// signal.
fn read_keys(timeout: std::time::Duration) -> Vec<u8> {
    let mut fds = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `poll` of one local `pollfd`, count 1.
    if unsafe { libc::poll(&mut fds, 1, ms) } <= 0 || fds.revents & libc::POLLIN == 0 {
        return Vec::new();
    }
    let mut buf = [0u8; 64];
    // SAFETY: `read` writes at most `buf.len()` bytes into the local buffer.
    let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return Vec::new();
    }
    buf[..n as usize].to_vec()
}

/// `oomshim top` without `--once`: redraws about once a second until `q`, a signal (Ctrl-C,
/// SIGTERM, SIGHUP) or a reader that went away; `p` prunes now. `prune_each`: prune before
/// every frame (`--prune`). Returns the status to exit with (128 + the signal for a signal).
pub fn live(dir: &Path, pid: Option<u32>, prune_each: bool) -> std::process::ExitCode {
    use std::io::{IsTerminal, Write};
    use std::process::ExitCode;
    let tty = std::io::stdout().is_terminal();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `sigaction` is plain data, for which all zeroes is a valid value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `on_stop` is an `extern "C" fn(c_int)` that only stores into an atomic
        // (async-signal-safe); the set and the action are locals.
        unsafe {
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
    // Restored when this function returns, whichever way.
    let keys = if std::io::stdin().is_terminal() {
        KeyMode::enter()
    } else {
        None
    };
    let mut said: Vec<String> = Vec::new();
    let mut prune_now = prune_each;
    loop {
        if prune_now {
            said = prune(dir);
            prune_now = prune_each;
        }
        let mut text = frame(dir, pid, dump::time::unix_ms(std::time::SystemTime::now()));
        for line in &said {
            text.push_str(&format!("{line}\n"));
        }
        let clear = if tty { "\x1b[H\x1b[2J" } else { "" };
        // The legend and the line above it stay on screen: the frame is cut to the rest.
        let (cols, rows) = screen_size();
        let text = clip(&text, cols, rows.map(|r| r.saturating_sub(2)));
        let page = format!("{clear}{text}\n{}\n", legend(keys.is_some()));
        let mut out = std::io::stdout().lock();
        if out
            .write_all(page.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return ExitCode::SUCCESS; // the reader went away
        }
        drop(out);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            let sig = STOP.load(std::sync::atomic::Ordering::SeqCst);
            if sig != 0 {
                return ExitCode::from((128 + sig).clamp(0, 255) as u8);
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            if keys.is_none() {
                std::thread::sleep(left.min(std::time::Duration::from_millis(100)));
                continue;
            }
            let pressed = read_keys(left.min(std::time::Duration::from_millis(100)));
            if pressed.iter().any(|&k| k == b'q' || k == b'Q') {
                return ExitCode::SUCCESS;
            }
            if pressed.iter().any(|&k| k == b'p' || k == b'P') {
                prune_now = true;
                break;
            }
        }
    }
}
