//! A framework's own account of an out-of-memory error it raised, as oomshim's Python hook
//! sends it (`oomshim_framework_oom`): JSON of schema [`SCHEMA`]. Torch's includes its cache's
//! segments and free blocks (from `torch.cuda.memory._snapshot()`), which the shim cannot see
//! under LD_PRELOAD; they become the dump's `free_blocks` before the verdict is judged.

use super::event::FrameworkNote;
use dump::model::{Attribution, CacheSummary, FrameworkOom, Kinds, MemoryCap, PyFrame};
use serde::Deserialize;

pub const SCHEMA: &str = "oomshim.framework-oom/1";
/// Largest account accepted (a torch cache histogram is a few KiB).
pub const MAX_REPORT_BYTES: usize = 1 << 20;
/// Longest framework message kept.
const MAX_MESSAGE: usize = 1024;

#[derive(Deserialize)]
struct Report {
    schema: String,
    framework: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default = "yes")]
    raised: bool,
    device: i32,
    #[serde(default)]
    request_bytes: Option<u64>,
    #[serde(default)]
    device_total_bytes: Option<u64>,
    #[serde(default)]
    device_free_bytes: Option<u64>,
    #[serde(default)]
    alloc_conf: Option<String>,
    #[serde(default)]
    stats: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    cache: Option<CacheSummary>,
    #[serde(default)]
    snapshot_file: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    attribution: Option<Attribution>,
    /// A `kinds` the hook could not compute is `null`; one that does not parse is dropped
    /// without losing the rest of the account.
    #[serde(default, deserialize_with = "lenient")]
    kinds: Option<Kinds>,
    /// torch under `set_per_process_memory_fraction`: `device_total_bytes` is the cap; this is
    /// the device's own capacity (null without a cap).
    #[serde(default)]
    memory_cap: Option<CapReport>,
}

#[derive(Deserialize)]
struct CapReport {
    bytes: u64,
    device_total_bytes: u64,
}

fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Kinds>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// The hook's kinds, with every list and string cut to size.
fn bounded(mut k: Kinds) -> Kinds {
    k.models.truncate(16);
    k.optimizers.truncate(16);
    k.forward_hooks.truncate(8);
    k.keepers.truncate(4);
    k.input_shape.truncate(8);
    let n = k.models.len();
    for m in &mut k.models {
        m.class = cut(std::mem::take(&mut m.class), 256);
        m.qualified_class = cut(std::mem::take(&mut m.qualified_class), 512);
        m.dtypes = std::mem::take(&mut m.dtypes)
            .into_iter()
            .take(8)
            .map(|(d, b)| (cut(d, 32), b))
            .collect();
        if m.duplicate_of.is_some_and(|i| i >= n) {
            m.duplicate_of = None;
        }
    }
    for o in &mut k.optimizers {
        o.class = cut(std::mem::take(&mut o.class), 256);
        o.qualified_class = cut(std::mem::take(&mut o.qualified_class), 512);
    }
    k.duplicates.truncate(8);
    for d in &mut k.duplicates {
        d.class = cut(std::mem::take(&mut d.class), 256);
        d.qualified_class = cut(std::mem::take(&mut d.qualified_class), 512);
    }
    // Only the kinds the hook counts; any of them short means the count is not complete.
    k.short_kinds = dump::view::COUNTED_KINDS
        .iter()
        .filter(|kind| k.short_kinds.iter().any(|s| s == *kind))
        .map(|kind| kind.to_string())
        .collect();
    k.complete &= k.short_kinds.is_empty();
    for m in [&mut k.module, &mut k.outer_module].into_iter().flatten() {
        m.class = cut(std::mem::take(&mut m.class), 256);
        m.qualified_class = cut(std::mem::take(&mut m.qualified_class), 512);
        m.path = m.path.take().map(|p| cut(p, 512));
        m.file = m.file.take().map(|p| cut(p, 1024));
    }
    let frame = |f: &mut PyFrame| {
        f.function = cut(std::mem::take(&mut f.function), 256);
        f.file = cut(std::mem::take(&mut f.file), 1024);
    };
    for f in [&mut k.framework_frame, &mut k.program_frame]
        .into_iter()
        .flatten()
    {
        frame(f);
    }
    for h in &mut k.forward_hooks {
        h.function = cut(std::mem::take(&mut h.function), 256);
        h.file = cut(std::mem::take(&mut h.file), 1024);
        h.module = cut(std::mem::take(&mut h.module), 512);
    }
    for keeper in &mut k.keepers {
        keeper.container = cut(std::mem::take(&mut keeper.container), 32);
        keeper.name = cut(std::mem::take(&mut keeper.name), 256);
        keeper.scope = cut(std::mem::take(&mut keeper.scope), 512);
        keeper.file = keeper.file.take().map(|f| cut(f, 1024));
    }
    k.phase = k.phase.map(|p| cut(p, 32));
    k.found_by = k.found_by.map(|p| cut(p, 32));
    k
}

fn yes() -> bool {
    true
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut n = max;
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        s.truncate(n);
    }
    s
}

/// A live count of memory by kind (`{"device": 0, "kinds": {...}, "attribution": {...}}`, sent
/// by the Python hook at an optimizer step), bounded as an account's; `None` for anything else.
pub fn parse_live_kinds(bytes: &[u8]) -> Option<(i32, Kinds, Option<Attribution>)> {
    #[derive(Deserialize)]
    struct Live {
        device: i32,
        kinds: Kinds,
        #[serde(default)]
        attribution: Option<Attribution>,
    }
    let l: Live = serde_json::from_slice(bytes).ok()?;
    Some((
        l.device,
        bounded(l.kinds),
        l.attribution.map(bounded_attribution),
    ))
}

fn bounded_attribution(mut a: Attribution) -> Attribution {
    a.lines.truncate(10);
    for l in &mut a.lines {
        l.file = cut(std::mem::take(&mut l.file), 1024);
        l.function = cut(std::mem::take(&mut l.function), 256);
    }
    a
}

/// The account and the device's (free, total) as the framework reported them; `None` for
/// anything that is not a valid account (it is ignored: the hook's failure must not become the
/// program's).
pub fn parse(bytes: &[u8]) -> Option<(FrameworkNote, Option<(u64, u64)>)> {
    let r: Report = serde_json::from_slice(bytes).ok()?;
    if r.schema != SCHEMA || r.framework.is_empty() || r.framework.len() > 32 {
        return None;
    }
    let free_blocks = r
        .cache
        .as_ref()
        .map(|c| c.free_blocks(format!("{}-snapshot", r.framework)));
    let memory_cap = r
        .memory_cap
        .as_ref()
        .filter(|c| c.bytes > 0 && c.bytes < c.device_total_bytes)
        .map(|c| MemoryCap {
            bytes: c.bytes,
            fraction: c.bytes as f64 / c.device_total_bytes as f64,
            device_total_bytes: c.device_total_bytes,
            set_by: "set_per_process_memory_fraction".to_string(),
        });
    let mem_info = match (r.device_free_bytes, r.device_total_bytes, &memory_cap) {
        // Under a cap torch reports the cap as the total but the device's own free bytes: the
        // failure is judged against the cap, whose free part is what torch has not reserved
        // (as allocator mode judges it).
        (_, Some(_), Some(cap)) => {
            let reserved = r
                .cache
                .as_ref()
                .map(|c| c.reserved_bytes)
                .or_else(|| r.stats.get("reserved_bytes.all.current").copied());
            reserved.map(|res| (cap.bytes.saturating_sub(res), cap.bytes))
        }
        (Some(f), Some(t), None) => Some((f, t)),
        _ => None,
    };
    let account = FrameworkOom {
        name: r.framework,
        version: r.version.map(|v| cut(v, 64)),
        raised: r.raised,
        request_bytes: r.request_bytes,
        device_total_bytes: r.device_total_bytes,
        device_free_bytes: r.device_free_bytes,
        alloc_conf: r.alloc_conf.filter(|c| !c.is_empty()).map(|c| cut(c, 1024)),
        stats: r.stats.into_iter().take(64).collect(),
        cache: r.cache,
        snapshot_file: r.snapshot_file.map(|f| cut(f, 255)),
        message: r.message.map(|m| cut(m, MAX_MESSAGE)),
        attribution: r.attribution.map(bounded_attribution),
        kinds: r.kinds.map(bounded),
    };
    Some((
        FrameworkNote {
            device: r.device,
            account,
            free_blocks,
            memory_cap,
        },
        mem_info,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_accounts_carry_the_cache_as_free_blocks() {
        let json = br#"{"schema":"oomshim.framework-oom/1","framework":"torch","version":"2.11.0+cu130",
            "device":0,"request_bytes":134217728,"device_total_bytes":100,"device_free_bytes":7,
            "alloc_conf":"","stats":{"num_ooms":1},"snapshot_file":"oomshim-torch-h-1-1.pickle",
            "cache":{"segments":3,"reserved_bytes":3000,"allocated_bytes":1800,"total_free_bytes":1200,
                     "largest_free_bytes":400,"inactive_split_bytes":1200,"fragmentation":0.66,
                     "histogram":[{"lo":256,"hi":512,"count":3,"bytes":1200}]}}"#;
        let (note, mem) = parse(json).unwrap();
        assert_eq!(mem, Some((7, 100)));
        assert_eq!(note.device, 0);
        assert!(note.account.raised, "raised unless said otherwise");
        assert_eq!(
            note.account.alloc_conf, None,
            "an empty setting is no setting"
        );
        let fb = note.free_blocks.unwrap();
        assert_eq!(fb.source, "torch-snapshot");
        assert_eq!(
            (
                fb.total_free_bytes,
                fb.largest_free_bytes,
                fb.reserved_bytes,
                fb.segments
            ),
            (Some(1200), Some(400), Some(3000), Some(3))
        );
    }

    #[test]
    fn a_torch_account_under_a_memory_fraction_is_judged_against_the_cap() {
        // torch's observer reports the cap as the total and the device's own free bytes.
        let json = br#"{"schema":"oomshim.framework-oom/1","framework":"torch","device":0,
            "request_bytes":3000,"device_total_bytes":2000,"device_free_bytes":7900,
            "cache":{"segments":1,"reserved_bytes":1500,"allocated_bytes":1500,"total_free_bytes":0,
                     "largest_free_bytes":0,"inactive_split_bytes":0,"fragmentation":null,"histogram":[]},
            "memory_cap":{"bytes":2000,"device_total_bytes":8000}}"#;
        let (note, mem) = parse(json).unwrap();
        assert_eq!(mem, Some((500, 2000)), "the cap less what torch reserved");
        let cap = note.memory_cap.expect("the cap");
        assert_eq!(
            (cap.bytes, cap.device_total_bytes, cap.fraction),
            (2000, 8000, 0.25)
        );
        assert_eq!(cap.set_by, "set_per_process_memory_fraction");
        // No cap (null, or not below the device): the framework's numbers as they are.
        for none in ["null", r#"{"bytes":8000,"device_total_bytes":8000}"#] {
            let json = String::from_utf8_lossy(json)
                .replace(r#"{"bytes":2000,"device_total_bytes":8000}"#, none);
            let (note, mem) = parse(json.as_bytes()).unwrap();
            assert!(note.memory_cap.is_none());
            assert_eq!(mem, Some((7900, 2000)));
        }
    }

    #[test]
    fn anything_else_is_ignored() {
        for bad in [
            &b"not json"[..],
            br#"{"schema":"other/1","framework":"torch","device":0}"#,
            br#"{"schema":"oomshim.framework-oom/1","framework":"","device":0}"#,
            br#"{"schema":"oomshim.framework-oom/1","framework":"torch"}"#,
        ] {
            assert!(parse(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!(
            r#"{{"schema":"oomshim.framework-oom/1","framework":"xla","device":1,"raised":true,"message":"{}"}}"#,
            "é".repeat(2000)
        );
        let (note, mem) = parse(long.as_bytes()).unwrap();
        assert!(note.account.message.unwrap().len() <= MAX_MESSAGE);
        assert!(note.free_blocks.is_none() && mem.is_none());
    }

    #[test]
    fn kinds_pass_through_and_a_broken_kinds_keeps_the_rest() {
        let json = br#"{"schema":"oomshim.framework-oom/1","framework":"torch","device":0,"request_bytes":1,
            "kinds":{"torch_allocated_bytes":100,"parameters_bytes":40,"gradients_bytes":0,
                     "optimizer_state_bytes":0,"activations_bytes":60,"phase":"forward","batch":512,
                     "models":[{"class":"M","bytes":40,"duplicate_of":7}],"unknown_key":1}}"#;
        let (note, _) = parse(json).unwrap();
        let k = note.account.kinds.expect("kinds");
        assert_eq!((k.parameters_bytes, k.activations_bytes), (40, Some(60)));
        assert_eq!(k.batch, Some(512));
        assert!(k.complete, "complete unless said otherwise");
        assert_eq!(
            k.models[0].duplicate_of, None,
            "an index past the list is dropped"
        );
        // The kinds a count out of time names: only the counted ones, once each, and never a
        // complete count with any of them; at most 8 groups of copies.
        let json = format!(
            r#"{{"schema":"oomshim.framework-oom/1","framework":"torch","device":0,"kinds":{{
                "short_kinds":["optimizer_state","x","gradients","gradients"],"complete":true,
                "duplicates":[{}]}}}}"#,
            vec![r#"{"class":"M","copies":2,"bytes_each":1}"#; 20].join(",")
        );
        let k = parse(json.as_bytes()).unwrap().0.account.kinds.unwrap();
        assert_eq!(k.short_kinds, ["gradients", "optimizer_state"]);
        assert!(!k.complete);
        assert_eq!(k.duplicates.len(), 8);
        for kinds in ["null", r#""nonsense""#, r#"{"parameters_bytes":-5}"#] {
            let json = format!(
                r#"{{"schema":"oomshim.framework-oom/1","framework":"torch","device":0,"kinds":{kinds}}}"#
            );
            let (note, _) = parse(json.as_bytes()).expect(kinds);
            assert!(note.account.kinds.is_none(), "{kinds}");
        }
    }
}
