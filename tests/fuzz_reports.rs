//! Issue 8, hostile input: a mutation fuzzer for the dump reader and every reporter (terminal,
//! JSON, HTML, diff, merge, export), in process, on stable Rust (cargo-fuzz needs nightly).
//!
//! Seeds are the dumps under `tests/fixtures` and `fuzz/corpus`, and the torch side files
//! (`oomshim-torch-*.json`, which `report` merges into the dump of the same process) under
//! `fuzz/corpus/torch`. Each round mutates one seed,
//! either as JSON (numbers to extremes, strings to hostile text, keys removed, values of the
//! wrong type, arrays multiplied, objects nested) or as bytes (flips, cuts, splices), then parses
//! it and, when it parses, runs every reporter on it. A panic is a finding: the input is saved
//! to `fuzz/crashes/` and the test fails.
//!
//! - `cargo test --release --test all fuzz_reports::` replays `fuzz/corpus` and `fuzz/crashes` (fast);
//!   a side file's crash is saved as `fuzz/crashes/torch-*.json` and replayed as one.
//! - `OOMSHIM_FUZZ_SECS=600 cargo test --release --test all fuzz_reports:: -- --ignored --nocapture`
//!   fuzzes for that long (`OOMSHIM_FUZZ_SEED` repeats a run).

use dump::read::parse_dump;
use oomshim_cli::report::{self, ReportOptions};
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn seeds() -> Vec<Vec<u8>> {
    let mut files = json_files(&root().join("tests/fixtures"));
    files.retain(|p| !p.to_string_lossy().contains(".report."));
    files.extend(json_files(&root().join("fuzz/corpus")));
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Runs the reader and every reporter on `bytes`. Ok(true) when it parsed as a dump.
fn exercise(bytes: &[u8], other: &dump::model::Dump, scratch: &Path) -> bool {
    let Ok(dump) = parse_dump(bytes, Path::new("fuzz.json")) else {
        return false;
    };
    for top in [0, 3, usize::MAX] {
        for color in [false, true] {
            let opts = ReportOptions { top, color };
            let _ = report::terminal::render_terminal(&dump, &opts);
            let _ = report::render_json(&dump, &opts);
        }
    }
    let _ = report::html::render_html(&dump);
    let _ = report::html::script_safe_json(&report::html::html_payload(&dump));
    for (a, b) in [(&dump, other), (other, &dump), (&dump, &dump)] {
        let d = report::diff::diff(a, b);
        let _ = report::diff::render_diff(&d, 10);
        let _ = report::diff::diff_json(&d, usize::MAX);
    }
    let _ = report::export::memory_viz(&dump);
    let _ = report::export::folded(&dump);
    // merge reads a directory: this dump next to another one.
    let dir = scratch.join("merge");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("a.json"), bytes);
    if let Ok(m) = report::merge::merge_dir(&dir) {
        let _ = report::merge::render_merge(&m);
        let _ = report::merge::merge_json(&m);
    }
    true
}

/// A torch side file `bytes`, found by `report` next to a dump of its process, then everything
/// `report` does with it: parse, merge into the dump (its free blocks feed the verdict), the
/// lines describing it, and every renderer of the merged dump. Ok(true) when it parsed.
fn exercise_torch(bytes: &[u8], dump: &dump::model::Dump, scratch: &Path) -> bool {
    use oomshim_cli::report::torch_cache;
    let dir = scratch.join("torch");
    let _ = std::fs::create_dir_all(&dir);
    let dump_path = dir.join("oomshim-dump.json");
    let _ = std::fs::write(&dump_path, serde_json::to_vec(dump).unwrap());
    let side = dir.join(format!(
        "oomshim-torch-{}-{}-1.json",
        dump.process.host, dump.process.pid
    ));
    let _ = std::fs::write(&side, bytes);
    let found = torch_cache::find_for(&dump_path, dump);
    let Some(cache) = torch_cache::parse(bytes) else {
        return false;
    };
    // Found through the directory too, unless the mutation changed what it is matched by: its
    // process (host, pid), the dump it names, the failing device and request, or its time.
    let request = dump.failed_request.as_ref();
    let agrees = cache.pid == dump.process.pid
        && cache.host == dump.process.host
        && cache
            .dump
            .as_deref()
            .is_none_or(|d| d == "oomshim-dump.json")
        && request.is_none_or(|r| cache.device == r.device && cache.request_bytes == r.bytes)
        && cache.time_unix_ms.abs_diff(dump.time_unix_ms) <= torch_cache::MATCH_WINDOW_MS;
    assert!(
        found.is_some() || !agrees,
        "a side file of the dump's process, device, request and time was not found"
    );
    let mut merged = dump.clone();
    torch_cache::apply(&mut merged, &cache);
    let _ = torch_cache::describe(&side, &cache);
    let _ = oomshim_core::verdict::judge(&merged);
    for top in [0, usize::MAX] {
        let opts = ReportOptions { top, color: false };
        let _ = report::terminal::render_terminal(&merged, &opts);
        let _ = report::render_json(&merged, &opts);
    }
    let _ = report::html::render_html(&merged);
    let _ = report::export::memory_viz(&merged);
    true
}

fn torch_seeds() -> Vec<Vec<u8>> {
    json_files(&root().join("fuzz/corpus/torch"))
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .collect()
}

const HOSTILE_STRINGS: &[&str] = &[
    "",
    "<script>alert(1)</script>",
    "</script><!--",
    "\u{202e}evil\u{0}nul",
    "\u{1F600}\u{FE0F}\u{200D}",
    "%s%n%x",
    "../../../../etc/passwd",
    "\x1b[31mred\x1b[0m",
    "a\nb\r\nc\td",
];

fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(14) {
        0 => json!(0),
        1 => json!(u64::MAX),
        2 => json!(-1),
        3 => json!(i64::MIN),
        4 => json!(1e308),
        5 => json!(-0.5),
        6 => json!(null),
        7 => json!(true),
        8 => json!([]),
        9 => json!({}),
        10 => json!(u32::MAX),
        11 => Value::String("x".repeat(rng.below(100_000))),
        12 => json!(usize::MAX as f64),
        _ => Value::String(HOSTILE_STRINGS[rng.below(HOSTILE_STRINGS.len())].to_string()),
    }
}

/// Picks a random node (pre-order index) and returns a mutable reference to it.
fn nth_node(v: &mut Value, mut n: usize) -> &mut Value {
    fn walk<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Array(a) => {
                for x in a.iter_mut() {
                    if let Some(r) = walk(x, n) {
                        return Some(r);
                    }
                }
                None
            }
            Value::Object(o) => {
                for (_, x) in o.iter_mut() {
                    if let Some(r) = walk(x, n) {
                        return Some(r);
                    }
                }
                None
            }
            _ => None,
        }
    }
    let total = count(v);
    n %= total.max(1);
    // Two passes: find the node, then return it (the borrow checker wants one path).
    walk(v, &mut n).expect("n < node count")
}

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

fn mutate_json(v: &mut Value, rng: &mut Rng) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let n = rng.below(count(v));
        let node = nth_node(v, n);
        match rng.below(8) {
            0..=2 => *node = hostile_value(rng),
            3 => {
                if let Value::Object(o) = node {
                    let keys: Vec<String> = o.keys().cloned().collect();
                    if !keys.is_empty() {
                        o.remove(&keys[rng.below(keys.len())]);
                    }
                }
            }
            4 => {
                if let Value::Array(a) = node {
                    if let Some(first) = a.first().cloned() {
                        let times = 1 + rng.below(300);
                        for _ in 0..times {
                            a.push(first.clone());
                        }
                    }
                }
            }
            5 => {
                let inner = node.take();
                *node = json!([inner]);
            }
            6 => {
                if let Value::Number(x) = node {
                    if let Some(u) = x.as_u64() {
                        *node = json!(u.wrapping_mul(1 << (rng.below(64))));
                    }
                }
            }
            _ => {
                if let Value::Array(a) = node {
                    a.clear();
                } else if let Value::Object(o) = node {
                    o.insert("extra".into(), hostile_value(rng));
                }
            }
        }
    }
}

fn mutate_bytes(b: &mut Vec<u8>, rng: &mut Rng) {
    if b.is_empty() {
        b.push(b'{');
    }
    match rng.below(5) {
        0 => {
            let i = rng.below(b.len());
            b[i] ^= 1 << rng.below(8);
        }
        1 => b.truncate(rng.below(b.len())),
        2 => {
            let i = rng.below(b.len());
            let tok: &[u8] = [
                &b"\""[..],
                b"{",
                b"[",
                b"]",
                b"}",
                b",",
                b":",
                b"\\u0000",
                b"1e999",
            ][rng.below(9)];
            b.splice(i..i, tok.iter().copied());
        }
        3 => {
            let i = rng.below(b.len());
            let j = (i + rng.below(64)).min(b.len());
            b.drain(i..j);
        }
        _ => {
            let i = rng.below(b.len());
            b[i] = rng.next() as u8;
        }
    }
}

fn save_crash(bytes: &[u8], prefix: &str) -> PathBuf {
    let dir = root().join("fuzz/crashes");
    let _ = std::fs::create_dir_all(&dir);
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    let p = dir.join(format!("{prefix}-{h:016x}.json"));
    let _ = std::fs::write(&p, bytes);
    p
}

/// Runs one fuzz case: its result, or false after a panic, whose input is saved under
/// `fuzz/crashes/PREFIX-HASH.json` and pushed to `crashes`.
fn guarded(
    input: &[u8],
    prefix: &str,
    crashes: &mut Vec<PathBuf>,
    case: impl FnOnce() -> bool,
) -> bool {
    match catch_unwind(AssertUnwindSafe(case)) {
        Ok(accepted) => accepted,
        Err(e) => {
            let what = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let p = save_crash(input, prefix);
            eprintln!("fuzz: panic ({what}); saved {}", p.display());
            crashes.push(p);
            false
        }
    }
}

fn base_other() -> dump::model::Dump {
    let p = root().join("tests/fixtures/oom_own_allocations.json");
    parse_dump(&std::fs::read(&p).unwrap(), &p).unwrap()
}

#[test]
fn corpus_and_past_crashes_never_panic_any_reporter() {
    let scratch = tempfile::tempdir().unwrap();
    let other = base_other();
    let mut files = json_files(&root().join("fuzz/corpus"));
    files.extend(json_files(&root().join("fuzz/crashes")));
    let (side_files, dumps): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(|f| {
        f.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("torch-"))
    });
    for f in dumps {
        let bytes = std::fs::read(&f).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            exercise(&bytes, &other, scratch.path())
        }));
        assert!(r.is_ok(), "{} panics a reporter", f.display());
    }
    let mut side_files = side_files;
    side_files.extend(json_files(&root().join("fuzz/corpus/torch")));
    assert!(
        !side_files.is_empty(),
        "the torch side-file seeds are there"
    );
    for f in side_files {
        let bytes = std::fs::read(&f).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            exercise_torch(&bytes, &other, scratch.path())
        }));
        assert!(r.is_ok(), "{} panics a reporter", f.display());
        assert!(
            !f.starts_with(root().join("fuzz/corpus")) || r.unwrap(),
            "{} is a side file",
            f.display()
        );
    }
}

#[test]
#[ignore = "fuzzing: run with OOMSHIM_FUZZ_SECS=600 -- --ignored --nocapture"]
fn fuzz_reader_and_reporters() {
    let secs: u64 = std::env::var("OOMSHIM_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("OOMSHIM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fuzz: seed {seed}, {secs} s");
    let mut rng = Rng(seed);
    let seeds = seeds();
    assert!(!seeds.is_empty());
    let parsed: Vec<Option<Value>> = seeds
        .iter()
        .map(|b| serde_json::from_slice(b).ok())
        .collect();
    let other = base_other();
    let torch = torch_seeds();
    assert!(!torch.is_empty());
    let torch_parsed: Vec<Option<Value>> = torch
        .iter()
        .map(|b| serde_json::from_slice(b).ok())
        .collect();
    let scratch = tempfile::tempdir().unwrap();
    std::panic::set_hook(Box::new(|_| {}));
    let until = Instant::now() + Duration::from_secs(secs);
    let (mut runs, mut dumps, mut crashes) = (0u64, 0u64, Vec::new());
    let mut side_files = 0u64;
    while Instant::now() < until {
        // One round in five mutates a torch side file instead of a dump.
        if rng.below(5) == 0 {
            let i = rng.below(torch.len());
            let mut b = match &torch_parsed[i] {
                Some(v) if rng.below(4) != 0 => {
                    let mut v = v.clone();
                    mutate_json(&mut v, &mut rng);
                    serde_json::to_vec(&v).unwrap()
                }
                _ => torch[i].clone(),
            };
            if rng.below(4) == 0 {
                mutate_bytes(&mut b, &mut rng);
            }
            runs += 1;
            if guarded(&b, "torch", &mut crashes, || {
                exercise_torch(&b, &other, scratch.path())
            }) {
                side_files += 1;
            }
            continue;
        }
        let i = rng.below(seeds.len());
        let input = match (&parsed[i], rng.below(4)) {
            (Some(v), 0..=2) => {
                let mut v = v.clone();
                mutate_json(&mut v, &mut rng);
                let mut b = serde_json::to_vec(&v).unwrap();
                if rng.below(10) == 0 {
                    mutate_bytes(&mut b, &mut rng);
                }
                b
            }
            _ => {
                let mut b = seeds[i].clone();
                for _ in 0..1 + rng.below(8) {
                    mutate_bytes(&mut b, &mut rng);
                }
                b
            }
        };
        runs += 1;
        if guarded(&input, "crash", &mut crashes, || {
            exercise(&input, &other, scratch.path())
        }) {
            dumps += 1;
        }
    }
    let _ = std::panic::take_hook();
    eprintln!(
        "fuzz: {runs} inputs, {dumps} parsed as dumps and went through every reporter, \
         {side_files} parsed as torch side files and were merged and reported, {} panics",
        crashes.len()
    );
    assert!(crashes.is_empty(), "panics: {crashes:?}");
}
