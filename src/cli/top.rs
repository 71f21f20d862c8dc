//! `oomshim top`: every oomshim process of this user on this host (or one pid), from their live
//! regions (src/core/flight) alone: device memory tracked, the sites growing now, steps per second,
//! host memory, the last failure. `--once` prints one plain-text frame (for scripts and tests);
//! otherwise the frame is redrawn about once a second. A region that cannot be read (torn,
//! foreign, hostile) is one line saying why; nothing in a region can crash the view or drive
//! the terminal (every string is shown escaped).

use crate::report::units::{clean, human_bytes};
use oomshim_core::flight::read::{read_region, scan, ReadError, RegionEntry, Snapshot};
use oomshim_core::verdict::short_label;
use std::fmt::Write;
use std::path::Path;

/// Sites shown per process.
const SITES_SHOWN: usize = 5;

/// One frame: every region in `dir` (only `pid`'s when given). What is not this user's (the
/// directory, a region) is not read, and said once at the end of the frame.
pub fn frame(dir: &Path, pid: Option<u32>, now_ms: u64) -> String {
    let listing = scan(dir);
    let entries: Vec<RegionEntry> = listing
        .regions
        .into_iter()
        .filter(|r| pid.is_none_or(|p| r.pid == p))
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "oomshim top — {} process{} (regions in {})",
        entries.len(),
        if entries.len() == 1 { "" } else { "es" },
        crate::report::units::clean_path(dir)
    );
    if entries.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            match pid {
                Some(p) => format!("no oomshim process with pid {p} publishes here"),
                None => "no oomshim process of this user publishes here".to_string(),
            }
        );
    }
    for e in &entries {
        let read = read_region(&e.path);
        if matches!(read, Err(ReadError::Gone)) {
            continue; // exited normally since the listing
        }
        out.push('\n');
        render_one(&mut out, e, read, now_ms);
    }
    if !listing.ignored.is_empty() {
        out.push('\n');
        for why in &listing.ignored {
            let _ = writeln!(out, "ignored: {}", clean(why));
        }
    }
    out
}

fn render_one(out: &mut String, e: &RegionEntry, read: Result<Snapshot, ReadError>, now_ms: u64) {
    let state = if e.alive {
        "running"
    } else {
        "gone (its region was left behind: it did not exit normally)"
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
            "  device {}: tracked {} in {} allocations, peak {}{free}",
            dev.index,
            human_bytes(dev.tracked_bytes),
            dev.tracked_count,
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
    if let Some(g) = &d.growth {
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

/// `oomshim top` without `--once`: redraws until interrupted.
pub fn live(dir: &Path, pid: Option<u32>) -> ! {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    loop {
        let text = frame(dir, pid, dump::time::unix_ms(std::time::SystemTime::now()));
        let mut out = std::io::stdout().lock();
        let clear = if tty { "\x1b[H\x1b[2J" } else { "" };
        if std::io::Write::write_all(&mut out, format!("{clear}{text}\n").as_bytes()).is_err() {
            std::process::exit(0); // the reader went away
        }
        let _ = std::io::Write::flush(&mut out);
        drop(out);
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}
