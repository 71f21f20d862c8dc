//! Which processes hold memory on a GPU, through NVML (`libnvidia-ml.so.1`, loaded at run time
//! only when a dump is written). Seeing a pid does not mean it may be killed: the dump records
//! whose process it is, and the report never suggests killing processes the user doesn't own.

use dump::model::{GpuProcess, Relation};

/// What is known of a process from /proc, for [`relation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcFacts {
    pub visible: bool,
    pub ppid: Option<u32>,
    pub uid: Option<u32>,
}

/// Pure: how `pid` relates to this process (`me`, whose parent is `my_parent` and user `my_uid`).
pub fn relation(pid: u32, facts: ProcFacts, me: u32, my_parent: u32, my_uid: u32) -> Relation {
    if pid == me {
        Relation::This
    } else if pid == my_parent {
        Relation::Parent
    } else if !facts.visible {
        Relation::Unknown
    } else if facts.ppid == Some(me) {
        Relation::Child
    } else {
        match facts.uid {
            Some(u) if u == my_uid => Relation::SameUser,
            Some(_) => Relation::OtherUser,
            None => Relation::Unknown,
        }
    }
}

/// ppid from /proc/PID/stat text (the field after the parenthesised command, which may itself
/// contain spaces and parentheses).
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    stat_field(stat, 4)?.parse().ok()
}

/// Field `n` (numbered from 1, as in proc(5); 3 or more) of /proc/PID/stat text. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted from its last `)`.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(n.checked_sub(3)?)
}

/// Real uid from /proc/PID/status text.
pub fn parse_status_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| {
        l.strip_prefix("Uid:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

fn proc_facts(pid: u32) -> ProcFacts {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
    ProcFacts {
        visible: stat.is_some(),
        ppid: stat.as_deref().and_then(parse_stat_ppid),
        uid: status.as_deref().and_then(parse_status_uid),
    }
}

/// Processes using the GPU with this UUID (`GPU-…`, preferred: NVML's order of devices need not
/// be CUDA's) or, without one, NVML index `index`. Sorted by memory, largest first.
pub fn on_device(uuid: Option<&str>, index: u32) -> Result<Vec<GpuProcess>, String> {
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| nvml_wrapper::Nvml::init())
        .map_err(|e| format!("NVML is not available ({e})"))?;
    let device = match uuid {
        Some(u) => nvml.device_by_uuid(u),
        None => nvml.device_by_index(index),
    }
    .map_err(|e| format!("NVML has no such device ({e})"))?;
    let mut list = device
        .running_compute_processes()
        .map_err(|e| format!("NVML could not list processes ({e})"))?;
    if let Ok(graphics) = device.running_graphics_processes() {
        for g in graphics {
            if !list.iter().any(|p| p.pid == g.pid) {
                list.push(g);
            }
        }
    }
    let me = std::process::id();
    // SAFETY: `getppid` takes no argument, touches no memory and cannot fail.
    let my_parent = unsafe { libc::getppid() } as u32;
    // SAFETY: `getuid` takes no argument, touches no memory and cannot fail.
    let my_uid = unsafe { libc::getuid() };
    let mut out: Vec<GpuProcess> = list
        .into_iter()
        .map(|p| {
            let facts = proc_facts(p.pid);
            GpuProcess {
                pid: p.pid,
                name: std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                    .ok()
                    .map(|s| s.trim().to_string()),
                used_bytes: match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                },
                relation: relation(p.pid, facts, me, my_parent, my_uid),
            }
        })
        .collect();
    out.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
    Ok(out)
}

/// One GPU as NVML names it: what DCGM-exporter labels its series with (`gpu`, `UUID`,
/// `modelName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlDevice {
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// Every GPU NVML lists, in its order; an error in words when NVML is not available.
pub fn nvml_devices() -> Result<Vec<NvmlDevice>, String> {
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| nvml_wrapper::Nvml::init())
        .map_err(|e| format!("NVML is not available ({e})"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML could not count devices ({e})"))?;
    let mut out = Vec::new();
    for index in 0..count.min(1024) {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        if let (Ok(uuid), Ok(name)) = (d.uuid(), d.name()) {
            out.push(NvmlDevice {
                index: d.index().unwrap_or(index),
                uuid,
                name,
            });
        }
    }
    Ok(out)
}

/// How to find CUDA ordinal `device` in NVML: `CUDA_VISIBLE_DEVICES` (its value, passed in)
/// renumbers devices; entries are NVML indices or UUIDs. Returns (uuid, index, matched_by).
pub fn nvml_identity(device: i32, visible: Option<&str>) -> (Option<String>, u32, &'static str) {
    let ordinal = device.max(0) as usize;
    if let Some(entry) = visible.and_then(|v| v.split(',').map(str::trim).nth(ordinal)) {
        if entry.starts_with("GPU-") {
            return (Some(entry.to_string()), 0, "uuid");
        }
        if let Ok(i) = entry.parse::<u32>() {
            return (None, i, "index");
        }
    }
    (None, ordinal as u32, "index")
}

/// The processes on CUDA device `device`, for a dump.
pub fn for_dump(device: i32) -> dump::model::GpuProcesses {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let (uuid, index, matched_by) = nvml_identity(device, visible.as_deref());
    let (processes, error) = match on_device(uuid.as_deref(), index) {
        Ok(p) => (p, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    dump::model::GpuProcesses {
        device,
        matched_by: matched_by.to_string(),
        processes,
        error,
    }
}

/// The `GPU-xxxxxxxx-xxxx-…` form NVML uses for a 16-byte CUDA device UUID.
pub fn uuid_string(bytes: &[u8; 16]) -> String {
    let h: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations() {
        let seen = |ppid, uid| ProcFacts {
            visible: true,
            ppid: Some(ppid),
            uid: Some(uid),
        };
        assert_eq!(relation(10, seen(1, 0), 10, 1, 0), Relation::This);
        assert_eq!(relation(1, seen(0, 0), 10, 1, 0), Relation::Parent);
        assert_eq!(relation(11, seen(10, 0), 10, 1, 0), Relation::Child);
        assert_eq!(relation(12, seen(5, 0), 10, 1, 0), Relation::SameUser);
        assert_eq!(relation(13, seen(5, 1000), 10, 1, 0), Relation::OtherUser);
        assert_eq!(
            relation(14, ProcFacts::default(), 10, 1, 0),
            Relation::Unknown
        );
    }

    #[test]
    fn proc_parsing() {
        assert_eq!(
            parse_stat_ppid("4242 (python (worker)) S 77 4242 4242 0 -1"),
            Some(77)
        );
        assert_eq!(parse_stat_ppid("garbage"), None);
        assert_eq!(
            parse_status_uid("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n"),
            Some(1000)
        );
        let me = proc_facts(std::process::id());
        assert!(me.visible);
        // SAFETY: `getppid` takes no argument, touches no memory and cannot fail.
        let parent = unsafe { libc::getppid() } as u32;
        assert_eq!(me.ppid, Some(parent));
    }

    #[test]
    fn cuda_visible_devices_maps_ordinals_to_nvml() {
        assert_eq!(nvml_identity(0, None), (None, 0, "index"));
        assert_eq!(nvml_identity(1, Some("3,5")), (None, 5, "index"));
        assert_eq!(
            nvml_identity(0, Some("GPU-abc, 2")),
            (Some("GPU-abc".to_string()), 0, "uuid")
        );
        assert_eq!(
            nvml_identity(4, Some("1")),
            (None, 4, "index"),
            "out of range: CUDA's ordinal"
        );
    }

    #[test]
    fn uuid_format_matches_nvml() {
        let b = [
            0x5a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x60, 0x71, 0x82, 0x93, 0xa4, 0xb5, 0xc6, 0xd7,
            0xe8, 0xf9,
        ];
        assert_eq!(uuid_string(&b), "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9");
    }

    #[test]
    fn without_nvml_the_answer_is_an_error_not_a_crash() {
        // No NVIDIA driver on this machine (or CI): a clear message.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return;
        }
        let err = on_device(None, 0).unwrap_err();
        assert!(err.contains("NVML"), "{err}");
    }
}
