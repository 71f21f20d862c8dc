//! `oomshim exporter`: a program on the simulated device publishes its live region,
//! and the exporter turns it into Prometheus text, both with `--once` and over a real HTTP
//! scrape of loopback. The text is checked by a strict parser of the exposition format (and by
//! `promtool check metrics` where Prometheus is installed).

use crate::common;

use common::{cli, shim_lib};
use oomshim_cli::testbed;
use oomshim_core::flight::read::{list_regions, read_region};
use oomshim_core::flight::{region_name, start_ticks_of};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A strict reader of the text format 0.0.4: every line is a `# HELP`, a `# TYPE` or a sample
/// `name{labels} value`; every sample's family was declared by HELP and TYPE before it, a
/// family's lines are contiguous, label values use only the format's escapes, and no series
/// appears twice. Panics with the offending line otherwise.
fn parse_exposition(text: &str) -> Vec<Sample> {
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    let mut help: BTreeSet<String> = BTreeSet::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut series: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let (kw, rest) = rest.split_once(' ').expect(line);
            let (name, arg) = rest.split_once(' ').expect(line);
            assert!(valid_name(name), "{line}");
            assert!(!finished.contains(name), "family {name} split: {line}");
            if current.as_deref() != Some(name) {
                if let Some(c) = current.replace(name.to_string()) {
                    finished.insert(c);
                }
            }
            match kw {
                "HELP" => assert!(help.insert(name.to_string()) && !arg.is_empty(), "{line}"),
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg),
                        "{line}"
                    );
                    assert!(types.insert(name.into(), arg.into()).is_none(), "{line}");
                }
                _ => panic!("unexpected comment: {line}"),
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).expect(line);
        let name = &line[..name_end];
        assert!(valid_name(name), "{line}");
        assert_eq!(
            current.as_deref(),
            Some(name),
            "sample outside its family: {line}"
        );
        assert!(
            help.contains(name) && types.contains_key(name),
            "no HELP/TYPE: {line}"
        );
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            loop {
                let (start, c) = chars.next().expect(line);
                if c == '}' {
                    rest = &body[start + 1..];
                    break;
                }
                let eq = body[start..].find('=').expect(line) + start;
                let key = &body[start..eq];
                assert!(valid_name(key) && !key.starts_with("__"), "{line}");
                while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                    chars.next();
                }
                assert_eq!(chars.next().map(|x| x.1), Some('"'), "{line}");
                let mut value = String::new();
                loop {
                    match chars.next().expect(line).1 {
                        '"' => break,
                        '\\' => match chars.next().expect(line).1 {
                            '\\' => value.push('\\'),
                            '"' => value.push('"'),
                            'n' => value.push('\n'),
                            other => panic!("bad escape \\{other}: {line}"),
                        },
                        '\n' => panic!("raw newline: {line}"),
                        c => value.push(c),
                    }
                }
                assert!(labels.insert(key.to_string(), value).is_none(), "{line}");
                match chars.peek().map(|x| x.1) {
                    Some(',') => {
                        chars.next();
                    }
                    Some('}') => {}
                    _ => panic!("bad label list: {line}"),
                }
            }
        }
        let value = rest.strip_prefix(' ').expect(line);
        assert!(
            !value.contains(' '),
            "no timestamps or trailing fields: {line}"
        );
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().expect(line),
        };
        if types[name] == "counter" {
            assert!(value >= 0.0, "{line}");
        }
        assert!(
            series.insert(format!("{name}{labels:?}")),
            "duplicate series: {line}"
        );
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// `promtool check metrics` on the text, where Prometheus is installed; says so otherwise.
fn promtool_check(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        common::skip("promtool");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        return;
    }
    // The one lint accepted: DCGM-exporter's own label name `modelName` is camelCase, and the
    // series carry it as DCGM-exporter spells it so that joins need no label_replace. Every
    // other complaint (and a camelCase name of oomshim's own) fails.
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let only_dcgm_names = said.lines().all(|l| {
        l.trim().is_empty()
            || l.ends_with(" label names should be written in 'snake_case' not 'camelCase'")
    });
    let camel: BTreeSet<String> = parse_exposition(text)
        .into_iter()
        .flat_map(|s| s.labels.into_keys())
        .filter(|k| {
            k.chars().any(|c| c.is_ascii_uppercase()) && k.chars().any(|c| c.is_ascii_lowercase())
        })
        .collect();
    assert!(
        only_dcgm_names && camel.iter().all(|k| k == "modelName" || k == "Hostname"),
        "promtool: {said}\nmixed-case labels: {camel:?}"
    );
}

/// A real Prometheus server scraping the exporter on `port` every second, where Prometheus is
/// installed: asserts that it ingested the program's tracked bytes (its query API answers with
/// them) and that the target is up.
fn prometheus_scrape(port: u16, pid: u32, tracked: u64) {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        common::skip("prometheus");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: oomshim\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    // A free port for Prometheus's own API (bound and released: it cannot take port 0).
    let web = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let query = format!("/api/v1/query?query=hw_gpu_memory_usage_bytes%7Bpid%3D%22{pid}%22%7D");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    let found = loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", web)) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = write!(
                s,
                "GET {query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            );
            last.clear();
            let _ = s.read_to_string(&mut last);
            if last.contains(&format!("\"{tracked}\"")) {
                break true;
            }
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = prom.kill();
    let _ = prom.wait();
    assert!(
        found,
        "Prometheus never had {tracked} for pid {pid}: {last}"
    );
}

struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `flight_leak` under the shim, as rank 3 (local rank 1) of a job whose id needs escaping,
/// publishing into `live`; stopped (SIGSTOP) once it has published after 40 steps, so its
/// region holds still while it is read twice.
fn stopped_leak(live: &Path, job_id: &str) -> Stopped {
    stopped_leak_with(live, job_id, &[])
}

/// [`stopped_leak`] with more variables for the program.
fn stopped_leak_with(live: &Path, job_id: &str, env: &[(&str, &str)]) -> Stopped {
    let mut cmd = Command::new(testbed::client("flight_leak"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .env("LD_PRELOAD", shim_lib())
        .env("OOMSHIM_LIVE_DIR", live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("OOMSHIM_DIR", live.join("dumps"))
        .env("SIMCUDA_CAPACITY", "64G")
        .env("RANK", "3")
        .env("LOCAL_RANK", "1")
        .env("WORLD_SIZE", "4")
        .env("TORCHELASTIC_RUN_ID", job_id)
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_PROCID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 6];
    child.stdout.take().unwrap().read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    // A few publishes after step 40 (one every 100 ms, a step every 20 ms): a summary of step 60.
    common::wait_for_published_step(live, 60);
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    // Stopped for certain before the region is read: a publish cut short by the stop leaves the
    // slot torn, and readers take the one before it (both reads see the same summary).
    common::wait_until_stopped(child.id());
    Stopped(child)
}

fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

#[test]
fn a_running_programs_tracked_bytes_ranks_and_steps_are_exported_once_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let job_id = r#"job"7\b"#;
    let program = stopped_leak(&live, job_id);
    let pid = program.0.id();
    // A hostile file beside it, named like a region: skipped and counted.
    let ticks = start_ticks_of(std::process::id()).unwrap();
    let hostile = live.join(region_name(pid + 100_000, ticks));
    std::fs::write(&hostile, b"\x1b[2J not a region").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hostile, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let regions = list_regions(&live);
    let mine = regions
        .iter()
        .find(|r| r.pid == pid)
        .expect("the program's region");
    let snap = read_region(&mine.path).unwrap();
    let dev0 = snap
        .summary
        .dump
        .devices
        .iter()
        .find(|d| d.index == 0)
        .unwrap()
        .clone();
    // 8 MiB leaked per step, the transient 8 MiB freed again: at least 40 steps' worth.
    assert!(dev0.tracked_bytes >= 40 * (8 << 20), "{dev0:?}");
    assert_eq!(dev0.tracked_bytes % (8 << 20), 0, "{dev0:?}");
    let steps = snap
        .summary
        .dump
        .growth
        .as_ref()
        .map(|g| g.current)
        .unwrap();

    let out = cli()
        .args(["exporter", "--once", "--dir"])
        .arg(&live)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let samples = parse_exposition(&text);
    let me = [
        ("pid", pid.to_string()),
        ("rank", "3".to_string()),
        ("local_rank", "1".to_string()),
        ("job_id", job_id.to_string()),
        ("device", "0".to_string()),
    ];
    let me: Vec<(&str, &str)> = me.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let usage = find(&samples, "hw_gpu_memory_usage_bytes", &me);
    assert_eq!(usage.len(), 1, "{text}");
    assert_eq!(usage[0].value, dev0.tracked_bytes as f64, "{text}");
    assert!(usage[0].labels.contains_key("host"), "{text}");
    let peak = find(&samples, "oomshim_gpu_memory_peak_tracked_bytes", &me);
    assert_eq!(peak[0].value, dev0.peak_tracked_bytes as f64, "{text}");
    assert!(
        peak[0].value >= usage[0].value + (8 << 20) as f64,
        "the transient 8 MiB: {text}"
    );
    let per_process = &me[..4];
    assert_eq!(
        find(&samples, "oomshim_steps_total", per_process)[0].value,
        steps as f64
    );
    assert_eq!(
        find(&samples, "oomshim_oom_total", per_process)[0].value,
        0.0
    );
    assert!(find(&samples, "oomshim_host_rss_bytes", per_process)[0].value > 0.0);
    assert_eq!(
        find(&samples, "oomshim_process_running", per_process)[0].value,
        1.0
    );
    let age = find(&samples, "oomshim_region_age_seconds", per_process)[0].value;
    assert!((0.0..120.0).contains(&age), "{age}");
    // What a live summary of a preloaded program does not know is absent, not zero.
    for unknown in [
        "hw_gpu_memory_limit_bytes",
        "oomshim_gpu_memory_largest_free_block_bytes",
        "oomshim_gpu_memory_fragmentation_ratio",
        "oomshim_gpu_memory_untracked_bytes",
    ] {
        assert!(find(&samples, unknown, &[]).is_empty(), "{unknown}: {text}");
    }
    // The hostile file: one invalid region, counted; no series for it.
    assert_eq!(
        find(
            &samples,
            "oomshim_exporter_regions",
            &[("state", "invalid")]
        )[0]
        .value,
        1.0
    );
    assert_eq!(
        find(&samples, "oomshim_exporter_regions", &[("state", "read")])[0].value,
        1.0
    );
    assert_eq!(
        find(&samples, "oomshim_exporter_region_errors_total", &[])[0].value,
        1.0
    );
    let other_pid = (pid + 100_000).to_string();
    assert!(find(
        &samples,
        "hw_gpu_memory_usage_bytes",
        &[("pid", &other_pid)]
    )
    .is_empty());
    promtool_check(&text);

    // The server: an ephemeral loopback port, read from what it says on stderr.
    let mut server = cli()
        .args(["exporter", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&live)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    for scrape in 1..=2u32 {
        let (head, body) = http_get(port, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        let samples = parse_exposition(&body);
        let usage = find(&samples, "hw_gpu_memory_usage_bytes", &me);
        assert_eq!(usage[0].value, dev0.tracked_bytes as f64, "{body}");
        // Re-read at every scrape, and the server's error counter accumulates over them.
        let errors = find(&samples, "oomshim_exporter_region_errors_total", &[])[0].value;
        assert_eq!(errors, scrape as f64, "{body}");
    }
    prometheus_scrape(port, pid, dev0.tracked_bytes);
    let (head, _) = http_get(port, "/");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let (head, _) = http_get(port, "/metrics/../secrets");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    // Garbage instead of HTTP: answered, and the server goes on serving.
    {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&[0xff; 64]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
    }
    let (head, _) = http_get(port, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    server.kill().unwrap();
    server.wait().unwrap();
    drop(program);
}

#[test]
fn a_non_loopback_listen_address_is_served_only_when_named_and_host_names_are_refused() {
    // One rule for the address, with --once (which serves nothing) as without: a `--listen`
    // that a check with --once accepted must not be refused when the exporter serves it.
    for once in [false, true] {
        let mut cmd = cli();
        cmd.args(["exporter", "--listen", "localhost:9464"]);
        if once {
            cmd.arg("--once");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "--once {once}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("host names are not resolved"),
            "--once {once}: {err}"
        );
    }
    // Named explicitly, a wildcard address is served, with a warning first.
    let dir = tempfile::tempdir().unwrap();
    let mut server = cli()
        .args(["exporter", "--listen", "0.0.0.0:0", "--dir"])
        .arg(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("not only loopback"), "{first}");
    let second = lines.next().unwrap().unwrap();
    assert!(
        second.contains("exporter serving http://0.0.0.0:"),
        "{second}"
    );
    server.kill().unwrap();
    server.wait().unwrap();
}

/// An exporter serving `live` on an ephemeral loopback port: (server, port).
fn start_server(live: &Path) -> (std::process::Child, u16) {
    let mut server = cli()
        .args(["exporter", "--listen", "127.0.0.1:0", "--dir"])
        .arg(live)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (server, port)
}

/// Sends `request` in one write and reads the whole answer (within `limit`): the answer, or
/// the error that ended the read.
fn exchange(port: u16, request: &[u8], limit: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(request).map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// Issue 25 items 25 and 28: a client trickling a byte at a time never holds another's scrape,
/// and is cut off when its whole request takes too long; a request with bytes the server does
/// not read (a body, an oversized head, pipelining) still gets its answer, not a reset; a
/// request with bare-LF line ends is answered.
#[test]
fn slow_clients_never_hold_a_scrape_and_every_request_gets_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let (mut server, port) = start_server(&live);

    // One byte every 500 ms: under the old per-read timeout this held the server for good.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let started = Instant::now();
            // Until the server cuts it off (a write fails once the server closed), for 40 s at
            // most.
            for b in b"GET /metrics HTTP/1.1\r\nX-Slow: "
                .iter()
                .chain([b'x'; 48].iter())
            {
                if stop.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                    return Some(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            None
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let t = Instant::now();
        let answer = exchange(
            port,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            Duration::from_secs(3),
        )
        .expect("a scrape beside a slow client is answered");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    // The slow client is cut off once its whole request took too long, bytes or not (5 s,
    // then its answer, the drain and a failed write or two).
    let took = slow.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(12)),
        "{took:?}"
    );

    // Bytes the server never reads: the answer arrives whole all the same.
    let mut with_body = b"GET /metrics HTTP/1.1\r\nContent-Length: 200000\r\n\r\n".to_vec();
    with_body.extend(std::iter::repeat_n(b'b', 200_000));
    let mut oversized = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..1000 {
        oversized.extend(format!("X-Filler-{i}: {}\r\n", "f".repeat(20)).as_bytes());
    }
    oversized.extend(b"\r\n");
    let pipelined = b"GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n".to_vec();
    for (what, request, status) in [
        ("a body", with_body, "HTTP/1.1 200"),
        ("an oversized head", oversized, "HTTP/1.1 400"),
        ("pipelined requests", pipelined, "HTTP/1.1 200"),
    ] {
        let answer = exchange(port, &request, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{what}: no answer ({e})"));
        assert!(answer.starts_with(status), "{what}: {answer:?}");
        if status.ends_with("200") {
            assert!(
                answer.contains("oomshim_exporter_regions"),
                "{what}: {answer:?}"
            );
        }
    }

    // Bare-LF line ends: answered at once.
    let t = Instant::now();
    let answer = exchange(
        port,
        b"GET /metrics HTTP/1.1\nHost: x\n\n",
        Duration::from_secs(4),
    )
    .expect("a bare-LF request is answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    server.kill().unwrap();
    server.wait().unwrap();
}

/// Issue 27: the metrics are there for GET only; any other method on /metrics is 405 with the
/// method it takes (not 404, which says the resource is missing), and other paths stay 404.
#[test]
fn other_methods_on_metrics_are_refused_with_405_and_allow_get() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, port) = start_server(&dir.path().join("live"));
    for method in ["POST", "PUT", "DELETE"] {
        let answer = exchange(
            port,
            format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 405"), "{method}: {answer}");
        let head = answer.split("\r\n\r\n").next().unwrap();
        assert!(head.lines().any(|l| l == "Allow: GET"), "{method}: {head}");
    }
    let answer = exchange(
        port,
        b"POST /other HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let answer = exchange(
        port,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    server.kill().unwrap();
    server.wait().unwrap();
}

/// One sample as DCGM-exporter 3.x writes it for GPU 0 of a node whose pod mapping is on: its
/// labels `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname` and the pod's.
const DCGM_SAMPLE: &str = r#"# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-5e1d0013-1415-1617-1819-1a1b1c1d1e1f",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="580.159",container="trainer",namespace="ml",pod="trainer-0"} 1024
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-5e1d0113-1415-1617-1819-1a1b1c1d1e1f",pci_bus_id="00000000:0F:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="580.159"} 0
"#;

/// The labels a join on DCGM-exporter's series matches on.
const JOIN_ON: &[&str] = &[
    "gpu",
    "UUID",
    "Hostname",
    "modelName",
    "pod",
    "namespace",
    "container",
];

/// `left * on(JOIN_ON) group_left(pci_bus_id) right`, evaluated by a real PromQL engine
/// (`promtool test rules`) where Prometheus is installed: the join yields exactly the left
/// sample, with DCGM-exporter's `pci_bus_id`.
fn promql_join(left: &Sample, right_text: &str) {
    if !common::on_path("promtool") {
        common::skip("promtool");
        return;
    }
    let series = |name: &str, labels: &BTreeMap<String, String>| {
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        format!("{name}{{{}}}", body.join(","))
    };
    let mut input = vec![(series(&left.name, &left.labels), left.value)];
    for r in parse_exposition(right_text) {
        input.push((series(&r.name, &r.labels), r.value));
    }
    let mut expected = left.labels.clone();
    expected.insert("pci_bus_id".into(), "00000000:07:00.0".into());
    let mut yaml = String::from(
        "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
    );
    for (s, v) in &input {
        yaml.push_str(&format!("      - series: '{s}'\n        values: '{v}'\n"));
    }
    yaml.push_str(&format!(
        "    promql_expr_test:\n      - expr: '{} * on({}) group_left(pci_bus_id) (0 * DCGM_FI_DEV_FB_USED + 1)'\n        eval_time: 0m\n        exp_samples:\n          - labels: '{}'\n            value: {}\n",
        left.name,
        JOIN_ON.join(", "),
        series("", &expected),
        left.value
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("join_test.yml");
    std::fs::write(&file, &yaml).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules:\n{yaml}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pod of [`DCGM_SAMPLE`], as its downward-API variables give it to the program.
const POD_ENV: &[(&str, &str)] = &[
    ("NODE_NAME", "gpu-node-7"),
    ("POD_NAME", "trainer-0"),
    ("POD_NAMESPACE", "ml"),
    ("CONTAINER_NAME", "trainer"),
];

/// `oomshim exporter --once` over `live` with the NVML in `nvml` (two simulated GPUs): its text
/// and samples.
fn export_once(live: &Path, nvml: &Path) -> (String, Vec<Sample>) {
    let out = cli()
        .args(["exporter", "--once", "--dir"])
        .arg(live)
        .env("LD_LIBRARY_PATH", nvml)
        .env("SIMNVML_DEVICES", "2")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let samples = parse_exposition(&text);
    (text, samples)
}

#[test]
fn the_series_carry_dcgm_exporters_labels_and_join_its_series_of_the_same_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let nvml = tempfile::tempdir().unwrap();
    common::build_fake_nvml(nvml.path());
    let program = stopped_leak_with(&live, "job-41", POD_ENV);
    let pid = program.0.id().to_string();
    // The exporter asks this host's NVML for each GPU's index and model name, as DCGM-exporter
    // does; the program's live summary knows only the CUDA ordinal (no failure asked the driver).
    let (text, samples) = export_once(&live, nvml.path());
    let usage = find(&samples, "hw_gpu_memory_usage_bytes", &[("pid", &pid)]);
    assert_eq!(usage.len(), 1, "{text}");
    let l = &usage[0].labels;
    let want = [
        ("gpu", "0"),
        ("UUID", "GPU-5e1d0013-1415-1617-1819-1a1b1c1d1e1f"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-7"),
        ("pod", "trainer-0"),
        ("namespace", "ml"),
        ("container", "trainer"),
        // oomshim's own stay.
        ("device", "0"),
        ("gpu_uuid", "GPU-5e1d0013-1415-1617-1819-1a1b1c1d1e1f"),
        ("rank", "3"),
    ];
    for (k, v) in want {
        assert_eq!(l.get(k).map(String::as_str), Some(v), "{k}: {text}");
    }
    assert_ne!(
        l.get("host"),
        l.get("Hostname"),
        "the pod's host name is not the node's"
    );
    // The join, as PromQL would do it: on DCGM's labels, exactly one of its series matches.
    let dcgm = parse_exposition(DCGM_SAMPLE);
    let matching: Vec<&Sample> = dcgm
        .iter()
        .filter(|d| {
            JOIN_ON
                .iter()
                .all(|k| d.labels.get(*k) == usage[0].labels.get(*k))
        })
        .collect();
    assert_eq!(matching.len(), 1, "{text}");
    assert_eq!(matching[0].labels["pci_bus_id"], "00000000:07:00.0");
    promql_join(usage[0], DCGM_SAMPLE);
    promtool_check(&text);

    // CUDA_VISIBLE_DEVICES renumbers: CUDA's device 0 is NVML's 1 (another UUID).
    drop(program);
    let live1 = dir.path().join("live1");
    let env1: Vec<(&str, &str)> = [("CUDA_VISIBLE_DEVICES", "1")]
        .iter()
        .chain(POD_ENV)
        .copied()
        .collect();
    let program = stopped_leak_with(&live1, "job-41", &env1);
    let pid = program.0.id().to_string();
    let (text, samples) = export_once(&live1, nvml.path());
    let usage = find(&samples, "hw_gpu_memory_usage_bytes", &[("pid", &pid)]);
    assert_eq!(usage[0].labels["device"], "0", "{text}");
    assert_eq!(usage[0].labels["gpu"], "1", "{text}");
    assert_eq!(
        usage[0].labels["UUID"], "GPU-5e1d0113-1415-1617-1819-1a1b1c1d1e1f",
        "{text}"
    );
    // Without NVML: the index the ordinal maps to, no UUID or model to claim.
    let (text, samples) = export_once(&live1, Path::new("/nonexistent"));
    let usage = find(&samples, "hw_gpu_memory_usage_bytes", &[("pid", &pid)]);
    assert_eq!(usage[0].labels["gpu"], "1", "{text}");
    assert!(!usage[0].labels.contains_key("UUID"), "{text}");
    drop(program);
}

#[test]
fn a_failure_leaves_a_textfile_node_exporter_reads_until_its_dump_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("dumps");
    let tf = dir.path().join("textfile");
    let mut env: Vec<(&str, &str)> = vec![
        ("RANK", "1"),
        ("SIM_LEAK_RANK", "1"),
        ("OOMSHIM_DIR", dumps.to_str().unwrap()),
        ("OOMSHIM_LIVE", "0"),
    ];
    env.extend(POD_ENV);
    let o = common::run_client("rank_worker", &[], &env, true);
    assert_eq!(o.status.code(), Some(3));
    let files = common::dump_files(&dumps);
    assert_eq!(files.len(), 1);
    let d = dump::read::read_dump(&files[0]).unwrap();
    let exporter = |extra: &[&str]| {
        let out = cli()
            .args(["exporter", "--once", "--dir"])
            .arg(dir.path().join("no-live"))
            .arg("--textfile-dir")
            .arg(&tf)
            .args(extra)
            .env("LD_LIBRARY_PATH", "/nonexistent")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    exporter(&["--dumps", dumps.to_str().unwrap()]);
    let stem = files[0].file_stem().unwrap().to_str().unwrap();
    let prom = tf.join(format!("{stem}.prom"));
    let text = std::fs::read_to_string(&prom).unwrap();
    let samples = parse_exposition(&text);
    promtool_check(&text);
    let info = find(&samples, "oomshim_failure_info", &[]);
    assert_eq!(info.len(), 1, "{text}");
    let l = &info[0].labels;
    assert_eq!(l["reason"], "oom");
    assert_eq!(l["kind"], d.verdict.kind);
    assert_eq!(l["retry"], "after_change");
    assert_eq!(l["recovered"], "false");
    assert_eq!(l["Hostname"], "gpu-node-7");
    assert_eq!(l["pod"], "trainer-0");
    assert_eq!(l["rank"], "1");
    assert_eq!(l["dump"], files[0].file_name().unwrap().to_str().unwrap());
    let req = find(&samples, "oomshim_failure_request_bytes", &[]);
    assert_eq!(req[0].value, (256u64 << 20) as f64, "{text}");
    assert_eq!(
        req[0].labels["UUID"],
        "GPU-5e1d0013-1415-1617-1819-1a1b1c1d1e1f"
    );
    let tracked = find(
        &samples,
        "oomshim_failure_tracked_bytes",
        &[("device", "0")],
    );
    assert_eq!(tracked[0].value, d.devices[0].tracked_bytes as f64);
    let ts = find(&samples, "oomshim_failure_timestamp_seconds", &[])[0].value;
    assert_eq!((ts * 1000.0).round() as u64, d.time_unix_ms);
    // Nothing left half-written, nothing else in the directory.
    let names: Vec<String> = std::fs::read_dir(&tf)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [format!("{stem}.prom")]);
    // Another program's file in the directory is never touched; the dump's file goes with it.
    std::fs::write(tf.join("node.prom"), "up 1\n").unwrap();
    std::fs::remove_file(&files[0]).unwrap();
    exporter(&["--dumps", dumps.to_str().unwrap()]);
    assert!(!prom.exists());
    assert!(tf.join("node.prom").exists());
    // A directory that cannot be made is said, and the metrics are printed anyway.
    let out = cli()
        .args(["exporter", "--once", "--dir"])
        .arg(dir.path().join("no-live"))
        .arg("--textfile-dir")
        .arg("/proc/self/no-such-dir")
        .args(["--dumps", dumps.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("oomshim: exporter: textfile: /proc/self/no-such-dir"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running process whose allocation failed and got its dump: the exporter says its verdict's
/// kind and retry hint, so an alert can tell "retry elsewhere" from "change the job".
#[test]
fn the_last_failure_is_exported_with_its_verdict_and_retry_hint() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    // 1 GiB device: flight_leak's 8 MiB a step runs out within two seconds, and it goes on.
    let child = Command::new(testbed::client("flight_leak"))
        .env("LD_PRELOAD", shim_lib())
        .env("OOMSHIM_LIVE_DIR", &live)
        .env("OOMSHIM_LIVE_INTERVAL", "100ms")
        .env("OOMSHIM_DIR", dir.path().join("dumps"))
        .env("OOMSHIM_SETTLE", "0.2s")
        .env("SIMCUDA_CAPACITY", "1G")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let program = Stopped(child);
    let pid = program.0.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let published = || {
        list_regions(&live)
            .iter()
            .filter_map(|r| read_region(&r.path).ok())
            .find_map(|s| s.summary.last_failure.filter(|f| f.retry.is_some()))
    };
    while published().is_none() {
        assert!(
            Instant::now() < deadline,
            "no failure with a dump was published"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // It goes on failing: stopped, so that its region holds still while it is read twice.
    // SAFETY: `kill` takes integers only and touches no memory; the target is a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    common::wait_until_stopped(pid);
    let failure = published().expect("still published");
    let out = cli()
        .args(["exporter", "--once", "--dir"])
        .arg(&live)
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let samples = parse_exposition(&text);
    let pid = pid.to_string();
    let info = find(&samples, "oomshim_last_oom_info", &[("pid", &pid)]);
    assert_eq!(info.len(), 1, "{text}");
    assert_eq!(info[0].value, 1.0);
    assert_eq!(
        info[0].labels["retry"],
        failure.retry.clone().unwrap(),
        "{text}"
    );
    assert_eq!(
        info[0].labels["kind"],
        failure.kind.clone().unwrap(),
        "{text}"
    );
    assert_eq!(info[0].labels["device"], "0");
    let at = find(
        &samples,
        "oomshim_last_oom_timestamp_seconds",
        &[("pid", &pid)],
    );
    assert_eq!((at[0].value * 1000.0).round() as u64, failure.unix_ms);
    promtool_check(&text);
    drop(program);
}

/// Issue 40: a local user holding connections open (a slowloris: 64 unfinished requests,
/// renewed as the server cuts them off) cannot blind the exporter: at least 9 of 10 scrapes
/// from another user are answered. Needs root (to be the other user).
#[test]
fn a_neighbour_holding_64_connections_open_does_not_blind_the_exporter() {
    // SAFETY: `geteuid` takes no argument, touches no memory and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        common::skip("root (to hold the connections as another user)");
        return;
    }
    if !std::path::Path::new("/bin/bash").exists() {
        common::skip_unless_machine_allows("/bin/bash (its /dev/tcp opens the connections)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = start_server(&dir.path().join("live"));
    let _server = common::KillOnDrop(server);
    // As nobody (65534): 64 connections, each with half a request head, all renewed every 2 s
    // (the server cuts a head off after 5 s).
    let script = format!(
        "fds=(); while :; do for fd in \"${{fds[@]}}\"; do exec {{fd}}>&-; done; fds=(); \
         for i in $(seq 64); do exec {{fd}}<>/dev/tcp/127.0.0.1/{port} 2>/dev/null || continue; \
         printf 'GET /metrics HTTP/1.1\\r\\nX-Slow: ' >&$fd 2>/dev/null; fds+=($fd); done; \
         echo held; sleep 2; done"
    );
    let mut attacker = {
        use std::os::unix::process::CommandExt;
        Command::new("/bin/bash")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .current_dir("/")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let out = attacker.stdout.take().unwrap();
    let _attacker = common::KillOnDrop(attacker);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let mut answered = 0;
    let mut refused = Vec::new();
    for _ in 0..10 {
        match exchange(
            port,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            Duration::from_secs(3),
        ) {
            Ok(a) if a.starts_with("HTTP/1.1 200") => answered += 1,
            Ok(a) => refused.push(a.lines().next().unwrap_or("").to_string()),
            Err(e) => refused.push(e),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        answered >= 9,
        "{answered} of 10 answered; the others: {refused:?}"
    );
}
