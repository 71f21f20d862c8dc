//! Unit tests of `oomshim_cli::exporter` (src/cli/exporter.rs).

use oomshim_cli::exporter::*;

#[test]
fn label_values_are_escaped_as_the_format_requires() {
    assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
    assert_eq!(escape_label("x\ny"), "x\\ny");
    assert_eq!(escape_label("plain"), "plain");
}

#[test]
fn listen_addresses_are_ip_and_port_and_non_loopback_ones_are_warned_about() {
    let a = parse_listen(DEFAULT_LISTEN).unwrap();
    assert!(listen_warning(&a).is_none());
    assert!(listen_warning(&parse_listen("[::1]:1").unwrap()).is_none());
    let public = parse_listen("0.0.0.0:9464").unwrap();
    assert!(listen_warning(&public)
        .unwrap()
        .contains("not only loopback"));
    let e = parse_listen("localhost:9464").unwrap_err();
    assert!(e.contains("host names are not resolved"), "{e}");
    assert!(parse_listen("127.0.0.1").is_err());
}

#[test]
fn a_request_head_ends_at_its_blank_line_with_crlf_or_bare_lf() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody"), Some(24));
    assert_eq!(head_end(b"GET / HTTP/1.1\nA: b\n\nbody"), Some(21));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
    assert_eq!(head_end(b"GET / HTTP/1.1\n"), None);
}

#[test]
fn an_empty_directory_exports_only_the_exporters_own_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let text = exposition(&dir.path().join("missing"), 0);
    assert!(
        text.contains("oomshim_exporter_regions{state=\"read\"} 0"),
        "{text}"
    );
    assert!(!text.contains("hw_gpu_memory_usage_bytes"), "{text}");
}
