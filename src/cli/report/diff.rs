//! `oomshim diff A B`: what grew and what shrank between two dumps of one program, by allocation
//! site. Sites are matched by their symbolised stack (function, file, line of every frame), never
//! by address, so two runs of the same program (different address-space layouts) line up.

use dump::model::{Dump, Frame};
use dump::units::{clean, human_bytes, thousands};
use dump::view::named_frames;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One site present in either dump.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteChange {
    /// Readable name: the innermost named frames, cleaned for a terminal (function and file
    /// names come from the dump).
    pub label: String,
    pub before_bytes: u64,
    pub after_bytes: u64,
    pub before_count: u64,
    pub after_count: u64,
}

impl SiteChange {
    pub fn delta(&self) -> i128 {
        self.after_bytes as i128 - self.before_bytes as i128
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceChange {
    pub index: i32,
    pub before_bytes: u64,
    pub after_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    pub devices: Vec<DeviceChange>,
    /// Largest growth first, then largest shrinkage last.
    pub sites: Vec<SiteChange>,
    /// Set when the two dumps do not look like the same program.
    pub warning: Option<String>,
    /// Sites listed in the dumps (each dump keeps only its top `OOMSHIM_TOP`).
    pub listed: (usize, usize),
}

/// The identity of a site: every frame's function, file and line; frames the symboliser could
/// not name count by module only (their addresses differ from run to run).
fn site_key(stack: &[Frame]) -> Vec<String> {
    stack
        .iter()
        .map(|f| match &f.function {
            Some(name) => format!(
                "{name}|{}|{}",
                f.file.as_deref().unwrap_or(""),
                f.line.map(|l| l.to_string()).unwrap_or_default()
            ),
            None => format!("?|{}", f.module.as_deref().unwrap_or("")),
        })
        .collect()
}

fn site_label(stack: &[Frame]) -> String {
    let names: Vec<String> = named_frames(stack)
        .take(2)
        .map(|f| {
            let name = clean(f.function.as_deref().unwrap_or("?"));
            match (&f.file, f.line) {
                (Some(file), Some(line)) => {
                    format!(
                        "{name} ({}:{line})",
                        clean(file.rsplit('/').next().unwrap_or(file))
                    )
                }
                _ => name,
            }
        })
        .collect();
    if names.is_empty() {
        "(no symbolised frames)".to_string()
    } else {
        names.join(" ← ")
    }
}

pub fn diff(before: &Dump, after: &Dump) -> Diff {
    let mut sites: BTreeMap<Vec<String>, SiteChange> = BTreeMap::new();
    for (is_after, dump) in [(false, before), (true, after)] {
        for s in &dump.sites {
            let e = sites
                .entry(site_key(&s.stack))
                .or_insert_with(|| SiteChange {
                    label: site_label(&s.stack),
                    before_bytes: 0,
                    after_bytes: 0,
                    before_count: 0,
                    after_count: 0,
                });
            if is_after {
                e.after_bytes += s.bytes;
                e.after_count += s.count;
            } else {
                e.before_bytes += s.bytes;
                e.before_count += s.count;
            }
        }
    }
    let mut sites: Vec<SiteChange> = sites.into_values().collect();
    sites.sort_by(|a, b| {
        b.delta()
            .cmp(&a.delta())
            .then_with(|| a.label.cmp(&b.label))
    });

    let mut devices: BTreeMap<i32, DeviceChange> = BTreeMap::new();
    for d in &before.devices {
        devices
            .entry(d.index)
            .or_insert(DeviceChange {
                index: d.index,
                before_bytes: 0,
                after_bytes: 0,
            })
            .before_bytes = d.tracked_bytes;
    }
    for d in &after.devices {
        devices
            .entry(d.index)
            .or_insert(DeviceChange {
                index: d.index,
                before_bytes: 0,
                after_bytes: 0,
            })
            .after_bytes = d.tracked_bytes;
    }

    let warning = (before.process.command_line != after.process.command_line).then(|| {
        format!(
            "the dumps come from different command lines ({:?} and {:?}); sites are matched by stack anyway",
            before.process.command_line.join(" "),
            after.process.command_line.join(" ")
        )
    });
    Diff {
        devices: devices.into_values().collect(),
        sites,
        warning,
        listed: (before.sites.len(), after.sites.len()),
    }
}

fn signed(delta: i128) -> String {
    let mag = human_bytes(delta.unsigned_abs().min(u64::MAX as u128) as u64);
    match delta.signum() {
        1 => format!("+{mag}"),
        -1 => format!("-{mag}"),
        _ => "0 B".to_string(),
    }
}

/// The diff as text: devices, then sites that changed, largest growth first.
pub fn render_diff(d: &Diff, top: usize) -> String {
    let mut out = String::new();
    if let Some(w) = &d.warning {
        out.push_str(&format!("note: {w}\n\n"));
    }
    out.push_str("Devices (tracked bytes)\n");
    for dev in &d.devices {
        out.push_str(&format!(
            "  device {:<3} {:>12} → {:>12}  {:>13}\n",
            dev.index,
            human_bytes(dev.before_bytes),
            human_bytes(dev.after_bytes),
            signed(dev.after_bytes as i128 - dev.before_bytes as i128)
        ));
    }
    let changed: Vec<&SiteChange> = d
        .sites
        .iter()
        .filter(|s| s.delta() != 0 || s.before_count != s.after_count)
        .collect();
    out.push_str(&format!(
        "\nSites that changed ({} of {}; largest growth first)\n",
        changed.len(),
        dump::units::plural(d.sites.len() as u64, "site", "sites")
    ));
    if changed.is_empty() {
        out.push_str("  none\n");
    }
    for s in changed.iter().take(top) {
        out.push_str(&format!(
            "  {:>13}  {:>12} → {:>12}  allocations {} → {}  {}\n",
            signed(s.delta()),
            human_bytes(s.before_bytes),
            human_bytes(s.after_bytes),
            thousands(s.before_count),
            thousands(s.after_count),
            s.label
        ));
    }
    out.push_str(&format!(
        "\nEach dump lists only its largest sites ({} and {} here, OOMSHIM_TOP); a site missing from one \
         list may still have held memory below the cut.\n",
        d.listed.0, d.listed.1
    ));
    out
}

/// A byte delta as a JSON number: exact within i64/u64, else (only from hostile dumps, beyond
/// ±2^64) the nearest f64. `json!` of such an i128 would panic.
fn delta_json(delta: i128) -> Value {
    if let Ok(v) = i64::try_from(delta) {
        Value::from(v)
    } else if let Ok(v) = u64::try_from(delta) {
        Value::from(v)
    } else {
        Value::from(delta as f64)
    }
}

pub fn diff_json(d: &Diff, top: usize) -> Value {
    json!({
        "report": "oomshim.diff/1",
        "warning": d.warning,
        "devices": d.devices.iter().map(|x| json!({
            "index": x.index, "before_bytes": x.before_bytes, "after_bytes": x.after_bytes,
            "delta_bytes": delta_json(x.after_bytes as i128 - x.before_bytes as i128),
        })).collect::<Vec<_>>(),
        "sites": d.sites.iter().take(top).map(|s| json!({
            "site": s.label, "before_bytes": s.before_bytes, "after_bytes": s.after_bytes,
            "delta_bytes": delta_json(s.delta()), "before_count": s.before_count, "after_count": s.after_count,
        })).collect::<Vec<_>>(),
        "sites_listed": [d.listed.0, d.listed.1],
    })
}
