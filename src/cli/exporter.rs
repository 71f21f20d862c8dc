//! `oomshim exporter`: the flight recorder's live regions (src/core/flight) in the Prometheus text
//! format (version 0.0.4), served on a local port by a process of its own, so fleet metrics
//! need nothing new inside the training processes. Every scrape lists and reads the regions
//! afresh with the same reader as `oomshim top`: nothing is shared with the writers, no lock is
//! held, and a region that cannot be read is skipped and counted, never a failed scrape.
//!
//! Names follow OpenTelemetry's `hw.gpu.memory.*` semantic conventions where they mean the same
//! thing (`hw.gpu.memory.usage` → `hw_gpu_memory_usage_bytes`, `hw.gpu.memory.limit` →
//! `hw_gpu_memory_limit_bytes`, as the OTel → Prometheus translation spells them); what OTel has
//! no name for is `oomshim_*`. Only what a summary knows is exported: an unknown is a missing
//! sample, never a zero.
//!
//! Labels join DCGM-exporter's series of the same GPU without `label_replace`: its label names
//! and values (`gpu`: NVML's index, `UUID`, `modelName`, `Hostname`: the node, and `pod`,
//! `namespace`, `container` from the process's downward-API variables), beside oomshim's own
//! (`pid`, `rank`, `local_rank`, `job_id`, `host`, `device`: the CUDA ordinal, `gpu_uuid`).

use dump::model::{DeviceInfo, Dump};
use oomshim_core::facts::gpu_processes::{nvml_devices, nvml_identity, NvmlDevice};
use oomshim_core::flight::read::{read_region, scan, ReadError, RegionEntry, Snapshot};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The default address: loopback only, on the port OpenTelemetry's Prometheus exporter uses.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// A request head larger than this is refused (a scrape's is a few hundred bytes).
const MAX_REQUEST_HEAD: usize = 16 << 10;
/// The time a client has for its whole request head (however its bytes trickle in), and for
/// taking each write of the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the exporter listens, from `--listen`: an IP address and port, never a host name (a
/// name could resolve to a public interface behind the user's back). The address is bound as
/// named: a non-loopback one is served (to the network) only because it was typed out, and
/// [`listen_warning`] says so.
pub fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    value.trim().parse::<SocketAddr>().map_err(|_| {
        format!(
            "--listen {}: expected IP:PORT (e.g. {DEFAULT_LISTEN} or [::1]:9464); host names are not resolved",
            dump::units::clean(value)
        )
    })
}

/// The warning for an address other than loopback: the metrics (pids, ranks, job ids, host
/// name) become readable by anyone who can reach it.
pub fn listen_warning(addr: &SocketAddr) -> Option<String> {
    (!is_loopback(addr.ip())).then(|| {
        format!(
            "oomshim: warning: serving metrics on {addr}, not only loopback: anyone who reaches it can read them"
        )
    })
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Unreadable regions seen by this exporter process since it started (the counter
/// `oomshim_exporter_region_errors_total`); the training processes never see it.
static REGION_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Escapes a label value as the text format requires: backslash, double quote, line feed.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Metric families in the order they are written, with their type and help text.
const FAMILIES: &[Family] = &[
    (
        "hw_gpu_memory_usage_bytes",
        "gauge",
        "Device memory in live allocations tracked by oomshim (what the process asked for through the hooked CUDA APIs; not the CUDA context or untracked memory).",
    ),
    (
        "hw_gpu_memory_limit_bytes",
        "gauge",
        "Total memory of the device, where the process's summary knows it (from cudaMemGetInfo at its last failed allocation).",
    ),
    (
        "oomshim_gpu_memory_peak_tracked_bytes",
        "gauge",
        "Highest tracked device memory of the process since it started.",
    ),
    (
        "oomshim_gpu_memory_largest_free_block_bytes",
        "gauge",
        "Largest free block in the memory the allocator holds (oomshim's allocator mode only).",
    ),
    (
        "oomshim_gpu_memory_fragmentation_ratio",
        "gauge",
        "1 - largest free block / total free bytes in the memory the allocator holds (oomshim's allocator mode only).",
    ),
    (
        "oomshim_gpu_memory_untracked_bytes",
        "gauge",
        "Device memory of the process that no hooked API allocated (NVML's figure less the tracked bytes: the CUDA context and libraries' own), where known.",
    ),
    (
        "oomshim_gpu_memory_bytes",
        "gauge",
        "Torch's device memory by kind (parameters, gradients, optimizer_state, activations: every other live tensor, cache: reserved but unallocated), as oomshim's Python hook last counted it at an optimizer step (at most every 10 s; oomshim_gpu_memory_kinds_age_seconds says when).",
    ),
    (
        "oomshim_gpu_memory_kinds_age_seconds",
        "gauge",
        "Seconds since oomshim_gpu_memory_bytes was counted.",
    ),
    (
        "oomshim_last_oom_info",
        "gauge",
        "1 for the process's last out-of-memory failure that got a dump, labelled with its verdict's kind and retry hint (elsewhere: the same program fits on a free device; after_change: the same configuration fails again; unknown).",
    ),
    (
        "oomshim_last_oom_timestamp_seconds",
        "gauge",
        "When the process's last out-of-memory failure happened (Unix seconds).",
    ),
    (
        "oomshim_oom_total",
        "counter",
        "Out-of-memory failures of device allocations since the process started (all devices, de-duplicated ones included).",
    ),
    (
        "oomshim_steps_total",
        "counter",
        "Training steps seen (marked, optimizer steps or forward passes), where steps are known.",
    ),
    (
        "oomshim_host_rss_bytes",
        "gauge",
        "Resident host memory of the process at its last publish.",
    ),
    (
        "oomshim_region_age_seconds",
        "gauge",
        "Seconds since the process last published its summary (a growing age: it stopped or is stuck).",
    ),
    (
        "oomshim_process_running",
        "gauge",
        "1 while the process runs, 0 for a region a process left behind when it died.",
    ),
    (
        "oomshim_exporter_regions",
        "gauge",
        "Regions found in the live directory at this scrape, by what became of them.",
    ),
    (
        "oomshim_exporter_region_errors_total",
        "counter",
        "Regions this exporter could not read (invalid, torn or unreadable) over all its scrapes; regions not yet initialised, removed while being read, or not this user's are not errors.",
    ),
];

/// Samples by family name: (label pairs, value).
pub type Samples = BTreeMap<&'static str, Vec<(Vec<(&'static str, String)>, String)>>;

/// One metric family: name, type, help.
pub type Family = (&'static str, &'static str, &'static str);

/// The GPUs NVML lists on this host, asked once per exporter process (GPUs do not come and go
/// while it runs); none without NVML.
pub fn host_gpus() -> &'static [NvmlDevice] {
    static GPUS: std::sync::OnceLock<Vec<NvmlDevice>> = std::sync::OnceLock::new();
    GPUS.get_or_init(|| nvml_devices().unwrap_or_default())
}

/// A process's labels, oomshim's and DCGM-exporter's: `pid`, `rank`, `local_rank`, `job_id`,
/// `host`, then `Hostname` (the node: `NODE_NAME`, else the host name) and `pod`, `namespace`,
/// `container` where the process's downward-API variables set them.
pub fn process_labels(d: &Dump, pid: u32) -> Vec<(&'static str, String)> {
    let p = &d.process;
    let mut labels: Vec<(&'static str, String)> = vec![("pid", pid.to_string())];
    if let Some(r) = p.rank {
        labels.push(("rank", r.to_string()));
    }
    if let Some(r) = p.local_rank {
        labels.push(("local_rank", r.to_string()));
    }
    if let Some(j) = &p.job_id {
        labels.push(("job_id", j.clone()));
    }
    labels.push(("host", p.host.clone()));
    let k8s = p.kubernetes.as_ref();
    let node = k8s.and_then(|k| k.node.clone());
    labels.push(("Hostname", node.unwrap_or_else(|| p.host.clone())));
    if let Some(k) = k8s {
        for (name, v) in [
            ("pod", &k.pod),
            ("namespace", &k.namespace),
            ("container", &k.container),
        ] {
            if let Some(v) = v {
                labels.push((name, v.clone()));
            }
        }
    }
    labels
}

/// A device's labels: oomshim's `device` (the CUDA ordinal) and `gpu_uuid`, and DCGM-exporter's
/// `gpu` (NVML's index), `UUID` and `modelName` for the same GPU. The GPU is the one whose UUID
/// the process asked the driver for; else the one its `CUDA_VISIBLE_DEVICES` (`visible`) names
/// for that ordinal; else NVML's device of that index. NVML's own index and name are taken where
/// this host's NVML lists the GPU, as DCGM-exporter takes them; without NVML, `gpu` is the index
/// the ordinal maps to (and absent where only a UUID is known) and `modelName` the name CUDA gave.
pub fn device_labels(
    index: i32,
    dev: Option<&DeviceInfo>,
    visible: Option<&str>,
    gpus: &[NvmlDevice],
) -> Vec<(&'static str, String)> {
    let mut labels: Vec<(&'static str, String)> = vec![("device", index.to_string())];
    let (listed_uuid, nvml_index, matched_by) = nvml_identity(index, visible);
    let uuid = dev.and_then(|d| d.uuid.clone()).or(listed_uuid);
    let known = match &uuid {
        Some(u) => gpus.iter().find(|g| g.uuid == *u),
        None => gpus.iter().find(|g| g.index == nvml_index),
    };
    let uuid = uuid.or_else(|| known.map(|g| g.uuid.clone()));
    if let Some(u) = &uuid {
        labels.push(("gpu_uuid", u.clone()));
    }
    let gpu = match known {
        Some(g) => Some(g.index),
        None => (matched_by == "index").then_some(nvml_index),
    };
    if let Some(g) = gpu {
        labels.push(("gpu", g.to_string()));
    }
    if let Some(u) = uuid {
        labels.push(("UUID", u));
    }
    let model = known
        .map(|g| g.name.clone())
        .or_else(|| dev.and_then(|d| d.name.clone()));
    if let Some(m) = model {
        labels.push(("modelName", m));
    }
    labels
}

/// The process's `CUDA_VISIBLE_DEVICES`, as its dump's configuration recorded it.
pub fn visible_devices(d: &Dump) -> Option<&str> {
    d.config
        .as_ref()?
        .env
        .get("CUDA_VISIBLE_DEVICES")
        .map(String::as_str)
}

/// Says each distinct reason for ignoring something in the live directory once per exporter
/// process, on stderr (the scrape shows the count as `state="foreign"`).
fn say_ignored_once(why: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.iter().any(|s| s == why) || said.len() >= 256 {
        return;
    }
    said.push(why.to_string());
    // Never a panic for a stderr that is gone (eprintln! would).
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("oomshim: exporter: {}\n", dump::units::clean(why)).as_bytes());
}

/// The exposition for every region in `dir`, at `now_ms`, labelled with this host's GPUs as
/// NVML lists them.
pub fn exposition(dir: &Path, now_ms: u64) -> String {
    exposition_with(dir, now_ms, host_gpus())
}

/// [`exposition`] with the GPUs given (`gpus`: NVML's list).
pub fn exposition_with(dir: &Path, now_ms: u64, gpus: &[NvmlDevice]) -> String {
    let listing = scan(dir);
    for why in &listing.ignored {
        say_ignored_once(why);
    }
    let mut entries: Vec<RegionEntry> = listing.regions;
    // Regions are sorted by (pid, start time): a pid with several is a reused pid whose earlier
    // owner died leaving its region. Only the newest is exported, so series stay unique.
    let mut superseded = 0u64;
    let mut keep: Vec<RegionEntry> = Vec::with_capacity(entries.len());
    for e in entries.drain(..) {
        if keep.last().is_some_and(|k| k.pid == e.pid) {
            keep.pop();
            superseded += 1;
        }
        keep.push(e);
    }
    let mut samples: Samples = BTreeMap::new();
    let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
    if !listing.ignored.is_empty() {
        states.insert("foreign", listing.ignored.len() as u64);
    }
    for e in &keep {
        match read_region(&e.path) {
            Ok(snap) => {
                *states.entry("read").or_default() += 1;
                add_process(&mut samples, e, &snap, now_ms, gpus);
            }
            Err(err) => {
                // A region not yet initialised (its process is starting), one removed since the
                // listing (its process exited) and one that is not this user's are states, not
                // errors.
                let (state, error) = match &err {
                    ReadError::Empty => ("empty", false),
                    ReadError::Gone => ("exited", false),
                    ReadError::Foreign(why) => {
                        say_ignored_once(why);
                        ("foreign", false)
                    }
                    ReadError::Io(_) => ("unreadable", true),
                    ReadError::Invalid(_) => ("invalid", true),
                    ReadError::Torn(_) => ("torn", true),
                };
                *states.entry(state).or_default() += 1;
                if error {
                    REGION_ERRORS.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    if superseded > 0 {
        states.insert("superseded", superseded);
    }
    for state in [
        "read",
        "empty",
        "invalid",
        "torn",
        "unreadable",
        "superseded",
        "exited",
        "foreign",
    ] {
        samples
            .entry("oomshim_exporter_regions")
            .or_default()
            .push((
                vec![("state", state.to_string())],
                states.get(state).copied().unwrap_or(0).to_string(),
            ));
    }
    samples
        .entry("oomshim_exporter_region_errors_total")
        .or_default()
        .push((
            Vec::new(),
            REGION_ERRORS.load(Ordering::Relaxed).to_string(),
        ));
    render(FAMILIES, &samples)
}

/// The text of `samples`, family by family in the order of `families` (those without samples
/// left out).
pub fn render(families: &[Family], samples: &Samples) -> String {
    let mut out = String::new();
    for (name, kind, help) in families {
        let Some(rows) = samples.get(name).filter(|r| !r.is_empty()) else {
            continue;
        };
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in rows {
            out.push_str(name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
    out
}

fn add_process(
    samples: &mut Samples,
    e: &RegionEntry,
    snap: &Snapshot,
    now_ms: u64,
    gpus: &[NvmlDevice],
) {
    let s = &snap.summary;
    let d = &s.dump;
    let proc_labels = process_labels(d, s.pid);
    let visible = visible_devices(d);
    let mut push = |name: &'static str, labels: &[(&'static str, String)], value: String| {
        samples
            .entry(name)
            .or_default()
            .push((labels.to_vec(), value));
    };
    for dev in &d.devices {
        let mut labels = proc_labels.clone();
        labels.extend(device_labels(dev.index, Some(dev), visible, gpus));
        push(
            "hw_gpu_memory_usage_bytes",
            &labels,
            dev.tracked_bytes.to_string(),
        );
        push(
            "oomshim_gpu_memory_peak_tracked_bytes",
            &labels,
            dev.peak_tracked_bytes.to_string(),
        );
        // A live summary asks no CUDA call, so the total is known from the last failure's
        // cudaMemGetInfo on this device, when there was one.
        let total = dev.total_bytes.or_else(|| {
            s.last_failure
                .as_ref()
                .filter(|f| f.device == dev.index)
                .and_then(|f| f.total_bytes)
        });
        if let Some(t) = total {
            push("hw_gpu_memory_limit_bytes", &labels, t.to_string());
        }
        // The live summary's free blocks are the allocator's for its current device, which
        // the publisher (having no failing device) asks as device 0 (src/preload/allocator_mode).
        let fb = &d.free_blocks;
        if dev.index == 0 && fb.source != "unavailable" {
            if let Some(b) = fb.largest_free_bytes {
                push(
                    "oomshim_gpu_memory_largest_free_block_bytes",
                    &labels,
                    b.to_string(),
                );
            }
            if let Some(f) = fb.fragmentation.filter(|f| f.is_finite()) {
                push(
                    "oomshim_gpu_memory_fragmentation_ratio",
                    &labels,
                    f.to_string(),
                );
            }
        }
        let untracked = d
            .library_memory
            .as_ref()
            .and_then(|l| l.untracked.iter().find(|u| u.device == dev.index))
            .and_then(|u| u.context_bytes);
        if let Some(b) = untracked {
            push("oomshim_gpu_memory_untracked_bytes", &labels, b.to_string());
        }
    }
    if let Some(lk) = &s.kinds {
        let mut labels = proc_labels.clone();
        let dev = d.devices.iter().find(|x| x.index == lk.device);
        labels.extend(device_labels(lk.device, dev, visible, gpus));
        for (kind, bytes) in dump::view::kinds_by_name(&lk.kinds) {
            if let Some(b) = bytes {
                let mut l = labels.clone();
                l.push(("kind", kind.to_string()));
                push("oomshim_gpu_memory_bytes", &l, b.to_string());
            }
        }
        push(
            "oomshim_gpu_memory_kinds_age_seconds",
            &labels,
            format!("{:.3}", now_ms.saturating_sub(lk.unix_ms) as f64 / 1000.0),
        );
    }
    if let Some(f) = s.last_failure.as_ref().filter(|f| f.dump.is_some()) {
        let mut labels = proc_labels.clone();
        let dev = d.devices.iter().find(|x| x.index == f.device);
        labels.extend(device_labels(f.device, dev, visible, gpus));
        labels.push(("kind", f.kind.clone().unwrap_or_else(|| "unknown".into())));
        labels.push(("retry", f.retry.clone().unwrap_or_else(|| "unknown".into())));
        push("oomshim_last_oom_info", &labels, "1".into());
        push(
            "oomshim_last_oom_timestamp_seconds",
            &proc_labels,
            format!("{:.3}", f.unix_ms as f64 / 1000.0),
        );
    }
    push(
        "oomshim_oom_total",
        &proc_labels,
        d.recording.oom_failures.to_string(),
    );
    if let Some(g) = d.growth.as_ref().filter(|g| g.unit == "step") {
        push("oomshim_steps_total", &proc_labels, g.current.to_string());
    }
    let rss = s
        .rss
        .last()
        .map(|r| r.bytes)
        .or_else(|| d.host.as_ref().and_then(|h| h.rss_bytes));
    if let Some(b) = rss {
        push("oomshim_host_rss_bytes", &proc_labels, b.to_string());
    }
    let age_ms = now_ms.saturating_sub(s.published_unix_ms);
    push(
        "oomshim_region_age_seconds",
        &proc_labels,
        format!("{:.3}", age_ms as f64 / 1000.0),
    );
    push(
        "oomshim_process_running",
        &proc_labels,
        if e.alive { "1" } else { "0" }.to_string(),
    );
}

/// Connections held at once, at most (fewer where `RLIMIT_NOFILE` is low: half of it).
const MAX_CONNECTIONS: usize = 512;
/// Unfinished connections one peer may hold; one more from it is answered 503 at once. A peer
/// is a local user (its uid, from the kernel's socket table) on loopback, else an address: a
/// neighbour holding connections open (a slowloris) blinds only itself.
const PER_PEER: usize = 8;
/// Unread request bytes (a body, pipelined requests, an oversized head) read and dropped after
/// the answer, so that closing does not reset the connection before the client read it.
const DRAIN_BYTES: usize = 1 << 20;
/// The longest the drain may take.
const DRAIN_TIME: Duration = Duration::from_millis(500);

/// Who is on the other end of a connection, for fairness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    /// A local user (a loopback connection whose socket the kernel's table names).
    Uid(u32),
    Addr(IpAddr),
}

/// What a connection is doing.
enum Phase {
    /// Reading the request head (up to [`MAX_REQUEST_HEAD`]).
    Head(Vec<u8>),
    /// Writing the answer from `at`.
    Answer { out: Vec<u8>, at: usize },
    /// Answered: reading what the client still sends, then closing.
    Drain { read: usize },
}

struct Conn {
    stream: TcpStream,
    peer: Peer,
    accepted: std::time::Instant,
    /// When this phase gives up: the whole head ([`IO_TIMEOUT`]), the answer, the drain.
    deadline: std::time::Instant,
    phase: Phase,
}

/// Serves `GET /metrics` on `listener` until the process is ended; every other request gets
/// 404. One thread serves every connection (non-blocking, `poll`): nothing a client does or
/// fails to do holds another's answer. Each connection has [`IO_TIMEOUT`] for its whole request
/// head however slowly its bytes arrive, and as long to take its answer; a peer holds at most
/// [`PER_PEER`] connections, and when all [`MAX_CONNECTIONS`] are taken the peer holding the
/// most loses its oldest, so a new peer is always served.
pub fn serve(listener: TcpListener, dir: &Path) -> ! {
    let _ = listener.set_nonblocking(true);
    let local = listener.local_addr().ok();
    let cap = connection_cap();
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let now = std::time::Instant::now();
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns.len() + 1);
        {
            use std::os::fd::AsRawFd;
            fds.push(libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            for c in &conns {
                fds.push(libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events: match c.phase {
                        Phase::Answer { .. } => libc::POLLOUT,
                        _ => libc::POLLIN,
                    },
                    revents: 0,
                });
            }
        }
        let wait_ms = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now).as_millis() as i32 + 1)
            .min()
            .unwrap_or(-1);
        // SAFETY: `fds.len()` initialised `pollfd`s in a live vector.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            continue; // EINTR
        }
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        // Each ready or overdue connection moves on; those that are done are dropped (closed).
        let now = std::time::Instant::now();
        let mut i = 0;
        conns.retain_mut(|c| {
            let keep = if ready[i] || now >= c.deadline {
                step(c, dir, now)
            } else {
                true
            };
            i += 1;
            keep
        });
        if fds[0].revents != 0 {
            accept_all(&listener, local, &mut conns, cap);
        }
    }
}

/// [`MAX_CONNECTIONS`], or half of `RLIMIT_NOFILE` when that is lower (at least 16).
fn connection_cap() -> usize {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 64;
    }
    ((rl.rlim_cur / 2) as usize).clamp(16, MAX_CONNECTIONS)
}

/// Takes every pending connection: over its peer's share it gets a 503 at once; when all
/// connections are taken, the peer with the most loses its oldest to make room.
fn accept_all(
    listener: &TcpListener,
    local: Option<SocketAddr>,
    conns: &mut Vec<Conn>,
    cap: usize,
) {
    loop {
        let (stream, addr) = match listener.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => return, // EMFILE and the like: tried again at the next wake
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let peer = peer_of(addr, local);
        let held = conns.iter().filter(|c| c.peer == peer).count();
        if held >= PER_PEER {
            refuse_busy(stream);
            continue;
        }
        if conns.len() >= cap {
            // The peer holding the most gives up its oldest connection.
            let mut counts: std::collections::HashMap<Peer, usize> = Default::default();
            for c in conns.iter() {
                *counts.entry(c.peer).or_default() += 1;
            }
            let greedy = counts.into_iter().max_by_key(|(_, n)| *n).map(|(p, _)| p);
            match conns
                .iter()
                .enumerate()
                .filter(|(_, c)| Some(c.peer) == greedy)
                .min_by_key(|(_, c)| c.accepted)
                .map(|(i, _)| i)
            {
                Some(i) => drop(conns.swap_remove(i)),
                None => {
                    refuse_busy(stream);
                    continue;
                }
            }
        }
        let now = std::time::Instant::now();
        conns.push(Conn {
            stream,
            peer,
            accepted: now,
            deadline: now + IO_TIMEOUT,
            phase: Phase::Head(Vec::with_capacity(1024)),
        });
    }
}

/// Who `addr` is: on loopback, the local user whose socket it is (the kernel's table of TCP
/// sockets names its uid), else its address.
fn peer_of(addr: SocketAddr, local: Option<SocketAddr>) -> Peer {
    if is_loopback(addr.ip()) {
        if let Some(uid) = local.and_then(|l| socket_uid(addr, l)) {
            return Peer::Uid(uid);
        }
    }
    Peer::Addr(addr.ip())
}

/// The uid owning the TCP socket bound to `addr` and connected to `to` (the client's end of
/// a loopback connection), from `/proc/net/tcp` or `/proc/net/tcp6`.
fn socket_uid(addr: SocketAddr, to: SocketAddr) -> Option<u32> {
    use std::io::BufRead;
    let hex = |a: &SocketAddr| -> String {
        let ip = match a.ip() {
            IpAddr::V4(v4) => format!("{:08X}", u32::from_ne_bytes(v4.octets())),
            IpAddr::V6(v6) => v6
                .octets()
                .chunks(4)
                .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
                .collect(),
        };
        format!("{ip}:{:04X}", a.port())
    };
    let (mine, theirs) = (hex(&addr), hex(&to));
    let table = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let file = std::fs::File::open(table).ok()?;
    std::io::BufReader::new(file)
        .lines()
        .skip(1)
        .map_while(Result::ok)
        .find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() > 7 && f[1] == mine && f[2] == theirs)
                .then(|| f[7].parse().ok())
                .flatten()
        })
}

/// Moves a connection on as far as it can go without waiting; false when it is done (closed).
fn step(c: &mut Conn, dir: &Path, now: std::time::Instant) -> bool {
    loop {
        match &mut c.phase {
            Phase::Head(buf) => {
                if now >= c.deadline {
                    // Its whole head took too long, however its bytes trickled in.
                    bad_request(c, now);
                    continue;
                }
                let mut chunk = [0u8; 4096];
                match read_now(&mut c.stream, &mut chunk) {
                    Got::End => return false,
                    Got::Later => return true,
                    Got::Bytes(n) => {
                        // Only the new bytes and the three before them can complete the head.
                        let from = buf.len().saturating_sub(3);
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(end) = head_end(&buf[from..]) {
                            let head = String::from_utf8(buf[..from + end].to_vec()).ok();
                            let (status, extra, ctype, body) = route(head.as_deref(), dir);
                            answer(c, status, extra, ctype, &body, now);
                        } else if buf.len() > MAX_REQUEST_HEAD {
                            bad_request(c, now);
                        }
                    }
                }
            }
            Phase::Answer { out, at } => {
                if now >= c.deadline {
                    return false; // it would not take its answer
                }
                match c.stream.write(&out[*at..]) {
                    Ok(n) => {
                        *at += n;
                        if *at == out.len() {
                            // Answered: read what it still sends before closing, so the close
                            // does not reset the connection under the answer.
                            let _ = c.stream.shutdown(std::net::Shutdown::Write);
                            c.phase = Phase::Drain { read: 0 };
                            c.deadline = now + DRAIN_TIME;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                    Err(_) => return false,
                }
            }
            Phase::Drain { read } => {
                if now >= c.deadline || *read >= DRAIN_BYTES {
                    return false;
                }
                let mut chunk = [0u8; 16 << 10];
                match read_now(&mut c.stream, &mut chunk) {
                    Got::End => return false,
                    Got::Later => return true,
                    Got::Bytes(n) => *read += n,
                }
            }
        }
    }
}

/// What one read of a non-blocking connection gave.
enum Got {
    Bytes(usize),
    /// Nothing now: wait for `poll`.
    Later,
    /// The client closed, or the connection failed.
    End,
}

fn read_now(stream: &mut TcpStream, buf: &mut [u8]) -> Got {
    loop {
        match stream.read(buf) {
            Ok(0) => return Got::End,
            Ok(n) => return Got::Bytes(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Got::Later,
            Err(_) => return Got::End,
        }
    }
}

/// A 400 for a head that is not HTTP, too large, or not complete in time.
fn bad_request(c: &mut Conn, now: std::time::Instant) {
    answer(
        c,
        "400 Bad Request",
        "",
        "text/plain",
        b"bad request\n",
        now,
    );
}

/// Starts writing an answer on `c`.
fn answer(
    c: &mut Conn,
    status: &str,
    extra: &str,
    ctype: &str,
    body: &[u8],
    now: std::time::Instant,
) {
    let mut out = format!(
        "HTTP/1.1 {status}\r\n{extra}Content-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    c.phase = Phase::Answer { out, at: 0 };
    c.deadline = now + IO_TIMEOUT;
}

/// The answer to a request head (`None`: not HTTP): (status, extra header lines, content type,
/// body).
fn route(head: Option<&str>, dir: &Path) -> (&'static str, &'static str, &'static str, Vec<u8>) {
    let Some(head) = head else {
        return (
            "400 Bad Request",
            "",
            "text/plain",
            b"bad request\n".to_vec(),
        );
    };
    let request_line = head.lines().next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method == "GET" && path == "/metrics" {
        let now = dump::time::unix_ms(std::time::SystemTime::now());
        (
            "200 OK",
            "",
            CONTENT_TYPE,
            exposition(dir, now).into_bytes(),
        )
    } else if path == "/metrics" {
        // The resource is there, the method is not served: 405, not "not found".
        (
            "405 Method Not Allowed",
            "Allow: GET\r\n",
            "text/plain",
            b"method not allowed: GET /metrics\n".to_vec(),
        )
    } else {
        (
            "404 Not Found",
            "",
            "text/plain",
            b"not found: the metrics are at /metrics\n".to_vec(),
        )
    }
}

/// Over its peer's share: a short 503, never waiting on the client.
fn refuse_busy(mut stream: TcpStream) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
    );
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Where the request head ends (just past its blank line), with CRLF or bare LF line ends.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.iter().enumerate().find_map(|(i, &b)| {
        if b != b'\n' {
            return None;
        }
        match buf.get(i + 1..) {
            Some([b'\n', ..]) => Some(i + 2),
            Some([b'\r', b'\n', ..]) => Some(i + 3),
            _ => None,
        }
    })
}
