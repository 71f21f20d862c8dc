//! Unit tests of `dump::read` (src/format/read.rs).

use dump::model::Dump;
use dump::read::*;
use std::path::Path;

const P: &str = "dumps/oom-4812.json";

fn parse(text: &str) -> Result<Dump, DumpError> {
    parse_dump(text.as_bytes(), Path::new(P))
}

/// A complete, minimal valid dump.
pub(crate) const MINIMAL: &str = r#"{
  "schema": "oomshim.dump/1", "reason": "oom", "time": "2026-11-29T15:43:11.123Z",
  "time_unix_ms": 1795966991123,
  "process": {"pid": 4812, "host": "gpu-node-7", "command_line": ["python", "train.py"]},
  "failed_request": {"bytes": 2147483648, "api": "cudaMalloc", "device": 0, "error_code": 2,
    "stack": [], "failures_in_burst": 1, "recovered": null},
  "devices": [{"index": 0, "name": null, "total_bytes": null, "free_bytes": null,
    "tracked_bytes": 0, "tracked_count": 0, "peak_tracked_bytes": 0}],
  "pinned_host": {"bytes": 0, "count": 0, "peak_bytes": 0},
  "largest_holders": [], "sites": [],
  "free_blocks": {"source": "unavailable", "reason": "LD_PRELOAD mode", "histogram": []},
  "verdict": {"kind": "", "summary": "", "evidence": [], "suggestions": []},
  "recording": {"version": "0.1.0", "stacks": "native", "depth": 32, "unknown_frees": 0,
    "live_allocations": 0, "total_allocations": 0, "oom_failures": 1}
}"#;

#[test]
fn minimal_dump_parses() {
    let dump = parse(MINIMAL).expect("valid");
    assert_eq!(dump.process.pid, 4812);
    assert_eq!(dump.failed_request.unwrap().bytes, 2 << 30);
    // A byte-order mark in front is accepted.
    let mut with_bom = b"\xEF\xBB\xBF".to_vec();
    with_bom.extend_from_slice(MINIMAL.as_bytes());
    assert!(parse_dump(&with_bom, Path::new(P)).is_ok());
}

#[test]
fn error_table() {
    let cut = &MINIMAL[..MINIMAL.len() / 2];
    let wrong_type = MINIMAL.replace("\"pid\": 4812", "\"pid\": \"4812\"");
    let missing = MINIMAL.replace("\"host\": \"gpu-node-7\", ", "");
    let newer = MINIMAL.replace("oomshim.dump/1", "oomshim.dump/2");
    let cases: Vec<(&str, &str, &str)> = vec![
        ("", "Truncated", "empty or cut short"),
        ("  \n\t", "Truncated", "empty or cut short"),
        (cut, "Truncated", "cut short"),
        (
            "{\"schema\": \"oomshim.dump/1\", \"reason\": ",
            "Truncated",
            "cut short",
        ),
        (
            "hello",
            "NotJson",
            "not JSON (line 1, column 1: expected value)",
        ),
        (
            "{\"a\": 1,}",
            "NotJson",
            "not JSON (line 1, column 9: trailing comma)",
        ),
        ("{} {}", "NotJson", "trailing characters"),
        ("\u{0}\u{1}binary", "NotJson", "not JSON"),
        (
            "{\"name\": \"package.json\", \"version\": \"1.0\"}",
            "WrongSchema",
            "not an oomshim dump (no \"schema\" key",
        ),
        (
            "{\"schema\": \"https://json-schema.org/draft\"}",
            "WrongSchema",
            "not an oomshim dump (schema \"https://json-schema.org/draft\"",
        ),
        ("{\"schema\": 7}", "WrongSchema", "schema \"7\""),
        ("[1, 2, 3]", "WrongSchema", "no \"schema\" key"),
        ("\"oomshim.dump/1\"", "WrongSchema", "no \"schema\" key"),
        ("null", "WrongSchema", "no \"schema\" key"),
        (
            &newer,
            "WrongSchema",
            "unsupported oomshim dump schema \"oomshim.dump/2\"",
        ),
        (
            "{\"schema\": \"oomshim.dump/1\"}",
            "Invalid",
            "missing field `reason`",
        ),
        (
            &wrong_type,
            "Invalid",
            "invalid type: string \"4812\", expected u32",
        ),
        (&missing, "Invalid", "missing field `host`"),
    ];
    for (input, kind, text) in cases {
        let err = parse(input).expect_err(input);
        let got_kind = format!("{err:?}");
        assert!(got_kind.starts_with(kind), "{input:?}: {got_kind}");
        let msg = err.to_string();
        assert!(msg.starts_with(P), "{msg}");
        assert!(msg.contains(text), "{input:?}: {msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert_eq!(err.path(), Path::new(P));
    }
}

#[test]
fn deep_nesting_does_not_overflow() {
    let open = "[".repeat(100_000);
    assert!(matches!(parse(&open), Err(DumpError::Truncated { .. })));
    let balanced = format!("{open}{}", "]".repeat(100_000));
    assert!(matches!(
        parse(&balanced),
        Err(DumpError::WrongSchema { .. })
    ));
    let nested_schema = format!("{{\"schema\": {open}");
    assert!(parse(&nested_schema).is_err());
    let nested_schema = format!("{{\"schema\": {balanced}}}");
    assert!(matches!(
        parse(&nested_schema),
        Err(DumpError::NotJson { .. })
    ));
    let objects = "{\"a\":".repeat(100_000);
    assert!(parse(&objects).is_err());
    // Deep nesting inside an unknown key of a real dump: the typed pass skips it too.
    let deep_extra = MINIMAL.replacen('{', &format!("{{\"extra\": {balanced}, "), 1);
    assert!(parse(&deep_extra).is_ok());
    // Deep nesting where the schema expects a string.
    let deep_field = MINIMAL.replace("\"host\": \"gpu-node-7\"", &format!("\"host\": {balanced}"));
    assert!(parse(&deep_field).is_err());
}

#[test]
fn never_panics_on_prefixes_and_mutations() {
    let bytes = MINIMAL.as_bytes();
    for end in 0..bytes.len() {
        let _ = parse_dump(&bytes[..end], Path::new(P));
    }
    for i in 0..bytes.len() {
        for b in [b'"', b'{', b']', b'-', b'9', 0xff, b'\\'] {
            let mut m = bytes.to_vec();
            m[i] = b;
            let _ = parse_dump(&m, Path::new(P));
        }
    }
}

#[test]
fn read_dump_limits_and_io() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, MINIMAL).unwrap();
    assert!(read_dump(&good).is_ok());

    let err = read_dump_limited(&good, 100).unwrap_err();
    match &err {
        DumpError::TooLarge { bytes, limit, .. } => {
            assert_eq!(*bytes, MINIMAL.len() as u64);
            assert_eq!(*limit, 100);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("over the 100 B limit"), "{err}");

    let missing = dir.path().join("missing.json");
    let err = read_dump(&missing).unwrap_err();
    assert!(matches!(err, DumpError::Io { .. }));
    assert!(err.to_string().starts_with(&missing.display().to_string()));
    assert!(std::error::Error::source(&err).is_some());

    // Not regular files: refused from the opened descriptor, at once, in one line.
    let fifo = dir.path().join("fifo.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path in the test's own directory.
    let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(made, 0);
    for (path, kind) in [
        (dir.path(), "a directory"),
        (fifo.as_path(), "a FIFO"),
        (Path::new("/dev/zero"), "a character device"),
    ] {
        let err = read_dump(path).unwrap_err();
        assert!(
            matches!(&err, DumpError::NotRegular { kind: k, .. } if *k == kind),
            "{err:?}"
        );
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
    // A link is followed for a named dump, refused where asked.
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    assert!(read_dump(&link).is_ok());
    assert!(matches!(
        read_bounded(&link, 1 << 20, Links::Refuse),
        Err(BoundedReadError::NotRegular(_))
    ));
    assert_eq!(
        read_bounded(&good, 1 << 20, Links::Refuse).unwrap(),
        MINIMAL.as_bytes()
    );
    // A name with a newline and an escape sequence stays one clean line in messages.
    let odd = dir.path().join("odd\n\x1b[31mname.json");
    let err = read_dump(&odd).unwrap_err().to_string();
    assert!(!err.contains('\n') && !err.contains('\x1b'), "{err}");

    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "").unwrap();
    assert!(matches!(
        read_dump(&empty),
        Err(DumpError::Truncated { .. })
    ));
}
