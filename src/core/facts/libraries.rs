//! Naming device memory by the library that allocated it: NCCL's communication buffers,
//! cuBLAS/cuDNN workspaces, CUDA graph pools, and the CUDA context's share of what the tracked
//! allocations do not explain.
//!
//! Done when a dump is written, never per allocation: the ledger already interns every stack, so
//! each distinct stack is looked at once, its return addresses matched against the address
//! ranges of the known libraries in `/proc/self/maps`. No symbolisation is needed for that.

use dump::model::Relation;
use dump::model::{DeviceInfo, GpuProcesses, LibraryBytes, SegmentEntry, UntrackedSplit};
use rustc_hash::FxHashMap;

/// (file name prefix of the loaded object, machine name, name as people write it). The first
/// matching prefix wins, so `libcublasLt` is found before `libcublas` would be asked.
const KNOWN: &[(&str, &str, &str)] = &[
    ("libnccl", "nccl", "NCCL"),
    ("libcublasLt", "cublas", "cuBLAS"),
    ("libcublas", "cublas", "cuBLAS"),
    ("libcudnn", "cudnn", "cuDNN"),
    ("libcufft", "cufft", "cuFFT"),
    ("libcusparse", "cusparse", "cuSPARSE"),
    ("libcusolver", "cusolver", "cuSOLVER"),
    ("libcurand", "curand", "cuRAND"),
];

/// Machine name of torch's CUDA graph private pools (allocator mode's segment map).
pub const CUDA_GRAPH_POOL: &str = "cuda_graph_pool";

/// The text of this process's `/proc/self/maps` (empty when it cannot be read): the one place
/// it is read. What is mapped is asked of the text by [`LibraryMap::parse`] and by
/// `facts::env` (torch's directory, the loaded frameworks), so one reading serves a dump.
pub fn read_self_maps() -> String {
    std::fs::read_to_string("/proc/self/maps").unwrap_or_default()
}

/// The known library a loaded object's path belongs to: (machine name, display name).
pub fn library_of(path: &str) -> Option<(&'static str, &'static str)> {
    let file = path.rsplit('/').next().unwrap_or(path);
    if !file.contains(".so") {
        return None;
    }
    KNOWN
        .iter()
        .find(|(prefix, _, _)| file.starts_with(prefix))
        .map(|&(_, lib, name)| (lib, name))
}

/// One mapped range of a known library.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    start: usize,
    end: usize,
    lib: &'static str,
    name: &'static str,
    path: String,
}

/// The address ranges of known libraries in `maps` (the text of `/proc/self/maps`).
#[derive(Debug, Clone, Default)]
pub struct LibraryMap {
    ranges: Vec<Range>,
}

impl LibraryMap {
    pub fn parse(maps: &str) -> LibraryMap {
        let mut ranges = Vec::new();
        for line in maps.lines() {
            // address perms offset dev inode path (the path may contain spaces)
            let mut parts = line.splitn(6, char::is_whitespace);
            let (Some(addr), Some(path)) = (parts.next(), parts.nth(4).map(str::trim)) else {
                continue;
            };
            let Some((lib, name)) = library_of(path) else {
                continue;
            };
            let Some((a, b)) = addr.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                continue;
            };
            if start < end {
                ranges.push(Range {
                    start,
                    end,
                    lib,
                    name,
                    path: path.to_string(),
                });
            }
        }
        ranges.sort_by_key(|r| r.start);
        LibraryMap { ranges }
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    fn range_of(&self, pc: usize) -> Option<&Range> {
        // A return address points after the call: look up the call instruction's byte.
        let pc = pc.checked_sub(1)?;
        let i = self.ranges.partition_point(|r| r.start <= pc);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (pc < r.end).then_some(r)
    }

    /// The innermost frame of `stack` (innermost first) inside a known library.
    fn attribute(&self, stack: &[usize]) -> Option<&Range> {
        stack.iter().find_map(|&pc| self.range_of(pc))
    }
}

/// One live device allocation, as attribution needs it.
#[derive(Debug, Clone, Copy)]
pub struct LiveAlloc<S> {
    pub device: i32,
    pub bytes: u64,
    /// Live allocations this entry stands for (the ledger sums those sharing device, API and
    /// stack).
    pub count: u64,
    pub api: &'static str,
    pub stack: S,
}

/// Live bytes by (library, device), largest first. `frames` gives a stack's return addresses,
/// innermost first; it is asked once per distinct stack.
pub fn attribute<S: Copy + Eq + std::hash::Hash>(
    map: &LibraryMap,
    allocs: &[LiveAlloc<S>],
    frames: impl Fn(S) -> Vec<usize>,
) -> Vec<LibraryBytes> {
    if map.is_empty() {
        return Vec::new();
    }
    let mut by_stack: FxHashMap<S, Option<&Range>> = FxHashMap::default();
    let mut out: Vec<LibraryBytes> = Vec::new();
    for a in allocs {
        let range = *by_stack
            .entry(a.stack)
            .or_insert_with(|| map.attribute(&frames(a.stack)));
        let Some(r) = range else { continue };
        let i = match out
            .iter()
            .position(|l| l.library == r.lib && l.device == a.device)
        {
            Some(i) => i,
            None => {
                out.push(LibraryBytes {
                    library: r.lib.to_string(),
                    name: r.name.to_string(),
                    device: a.device,
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        let l = &mut out[i];
        l.bytes += a.bytes;
        l.count += a.count;
        if l.modules.len() < 4 && !l.modules.contains(&r.path) {
            l.modules.push(r.path.clone());
        }
        if !l.apis.iter().any(|x| x == a.api) {
            l.apis.push(a.api.to_string());
        }
    }
    sort(&mut out);
    out
}

fn sort(libs: &mut [LibraryBytes]) {
    libs.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.device.cmp(&b.device))
            .then(a.library.cmp(&b.library))
    });
}

/// Torch's CUDA graph private pools on `device`, from the allocator's segment map: segments that
/// belong to a graph capture. Appended to `libs` (and the list sorted again).
pub fn add_graph_pools(libs: &mut Vec<LibraryBytes>, device: i32, segments: &[SegmentEntry]) {
    let (bytes, count) = segments
        .iter()
        .filter(|s| s.capture.is_some())
        .fold((0u64, 0u64), |(b, c), s| (b + s.bytes, c + 1));
    if count == 0 {
        return;
    }
    libs.push(LibraryBytes {
        library: CUDA_GRAPH_POOL.to_string(),
        name: "CUDA graph pool".to_string(),
        device,
        bytes,
        count,
        modules: Vec::new(),
        apis: vec![dump::api::TORCH_ALLOC.to_string()],
    });
    sort(libs);
}

/// For each device whose free and total bytes are known: used memory split into this process's
/// tracked bytes, its CUDA context and unhooked memory (NVML's figure for this process less the
/// tracked bytes), other processes, and the rest, which no API shows.
pub fn untracked_split(devices: &[DeviceInfo], nvml: Option<&GpuProcesses>) -> Vec<UntrackedSplit> {
    let mut out = Vec::new();
    for d in devices {
        let (Some(total), Some(free)) = (d.total_bytes, d.free_bytes) else {
            continue;
        };
        let used = total.saturating_sub(free);
        let mut split = UntrackedSplit {
            device: d.index,
            used_bytes: used,
            tracked_bytes: d.tracked_bytes,
            ..Default::default()
        };
        if let Some(g) = nvml.filter(|g| g.device == d.index && g.error.is_none()) {
            let this = g
                .processes
                .iter()
                .filter(|p| p.relation == Relation::This)
                .find_map(|p| p.used_bytes);
            let others: u64 = g
                .processes
                .iter()
                .filter(|p| p.relation != Relation::This)
                .filter_map(|p| p.used_bytes)
                .sum();
            if let Some(this) = this {
                let context = this.saturating_sub(d.tracked_bytes);
                split.context_bytes = Some(context);
                split.other_processes_bytes = Some(others);
                split.unexplained_bytes = Some(
                    used.saturating_sub(d.tracked_bytes)
                        .saturating_sub(context)
                        .saturating_sub(others),
                );
            }
        }
        out.push(split);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dump::model::GpuProcess;

    const MAPS: &str = "\
7f0000000000-7f0000100000 r-xp 00000000 08:01 11 /opt/nvidia/nccl/lib/libnccl.so.2.21.5
7f0000100000-7f0000200000 r--p 00100000 08:01 11 /opt/nvidia/nccl/lib/libnccl.so.2.21.5
7f1000000000-7f1000400000 r-xp 00000000 08:01 12 /site-packages/nvidia/cublas/lib/libcublasLt.so.13
7f2000000000-7f2000400000 r-xp 00000000 08:01 13 /site-packages/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9
7f3000000000-7f3000400000 r-xp 00000000 08:01 14 /site-packages/torch/lib/libtorch_cuda.so
7f4000000000-7f4000001000 r-xp 00000000 08:01 15 /home/me/libncclient.txt
55aa00000000-55aa00010000 r-xp 00000000 00:00 0 [anon]
garbage line
";

    #[test]
    fn library_names_come_from_the_objects_file_name() {
        assert_eq!(library_of("/x/libnccl.so.2"), Some(("nccl", "NCCL")));
        assert_eq!(
            library_of("/x/libcublasLt.so.13"),
            Some(("cublas", "cuBLAS"))
        );
        assert_eq!(library_of("/x/libcublas.so.13"), Some(("cublas", "cuBLAS")));
        assert_eq!(library_of("/x/libcudnn_ops.so.9"), Some(("cudnn", "cuDNN")));
        assert_eq!(library_of("/x/libtorch_cuda.so"), None);
        assert_eq!(library_of("/x/libnccl-notes.txt"), None);
        assert_eq!(
            library_of("/nccl/lib/libc.so.6"),
            None,
            "the directory does not count"
        );
    }

    #[test]
    fn stacks_are_attributed_to_their_innermost_known_library() {
        let map = LibraryMap::parse(MAPS);
        let nccl = 0x7f0000000100usize;
        let cublas = 0x7f1000000100usize;
        let cudnn = 0x7f2000000100usize;
        let torch = 0x7f3000000100usize;
        let stacks: std::collections::HashMap<u32, Vec<usize>> = [
            (1, vec![nccl, torch]),           // torch calls NCCL, NCCL allocates
            (2, vec![cublas, cudnn, torch]),  // cuDNN calls cuBLAS: cuBLAS's workspace
            (3, vec![torch]),                 // torch's own
            (4, vec![0x7f0000000000]), // return address at the range start: the call was before it
            (5, vec![0x7f0000100000, torch]), // one past the text range: nccl's data, still nccl
        ]
        .into();
        let a = |device, bytes, api, stack| LiveAlloc {
            device,
            bytes,
            count: 1,
            api,
            stack,
        };
        let allocs = [
            a(0, 64 << 20, "cudaMalloc", 1),
            a(0, 32 << 20, "cuMemCreate", 1),
            a(1, 16 << 20, "cudaMalloc", 1),
            a(0, 8 << 20, "cudaMalloc", 2),
            a(0, 1 << 30, "cudaMalloc", 3),
            a(0, 1 << 20, "cudaMalloc", 4),
            a(0, 2 << 20, "cudaMalloc", 5),
        ];
        let asked = std::cell::Cell::new(0);
        let libs = attribute(&map, &allocs, |s| {
            asked.set(asked.get() + 1);
            stacks[&s].clone()
        });
        assert_eq!(asked.get(), 5, "each distinct stack is looked at once");
        let got: Vec<(&str, i32, u64, u64)> = libs
            .iter()
            .map(|l| (l.library.as_str(), l.device, l.bytes, l.count))
            .collect();
        assert_eq!(
            got,
            [
                ("nccl", 0, (96 << 20) + (2 << 20), 3),
                ("nccl", 1, 16 << 20, 1),
                ("cublas", 0, 8 << 20, 1),
            ]
        );
        assert_eq!(libs[0].apis, ["cudaMalloc", "cuMemCreate"]);
        assert_eq!(libs[0].modules, ["/opt/nvidia/nccl/lib/libnccl.so.2.21.5"]);
        assert!(attribute(&LibraryMap::parse(""), &allocs, |s| stacks[&s].clone()).is_empty());
    }

    #[test]
    fn graph_pools_come_from_captured_segments() {
        let seg = |bytes, capture| SegmentEntry {
            bytes,
            capture,
            ..Default::default()
        };
        let mut libs = vec![LibraryBytes {
            library: "nccl".into(),
            bytes: 1 << 20,
            ..Default::default()
        }];
        add_graph_pools(
            &mut libs,
            0,
            &[
                seg(20 << 20, Some(1)),
                seg(2 << 20, None),
                seg(4 << 20, Some(2)),
            ],
        );
        assert_eq!(libs[0].library, CUDA_GRAPH_POOL);
        assert_eq!((libs[0].bytes, libs[0].count), (24 << 20, 2));
        let mut none = Vec::new();
        add_graph_pools(&mut none, 0, &[seg(2 << 20, None)]);
        assert!(none.is_empty());
    }

    #[test]
    fn the_context_is_what_nvml_counts_for_this_process_beyond_its_tracked_bytes() {
        let dev = DeviceInfo {
            index: 0,
            name: None,
            total_bytes: Some(80 << 30),
            free_bytes: Some(10 << 30),
            tracked_bytes: 60 << 30,
            tracked_count: 3,
            peak_tracked_bytes: 60 << 30,
            uuid: None,
            memory_cap: None,
        };
        let proc_ = |pid, used: u64, relation| GpuProcess {
            pid,
            name: None,
            used_bytes: Some(used),
            relation,
        };
        let nvml = GpuProcesses {
            device: 0,
            matched_by: "index".into(),
            processes: vec![
                proc_(1, (60 << 30) + (600 << 20), Relation::This),
                proc_(2, 5 << 30, Relation::OtherUser),
            ],
            error: None,
        };
        let s = untracked_split(std::slice::from_ref(&dev), Some(&nvml));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].used_bytes, 70 << 30);
        assert_eq!(s[0].context_bytes, Some(600 << 20));
        assert_eq!(s[0].other_processes_bytes, Some(5 << 30));
        assert_eq!(
            s[0].unexplained_bytes,
            Some((10 << 30) - (5 << 30) - (600 << 20))
        );
        // Without NVML: the used and tracked bytes only, nothing guessed.
        let s = untracked_split(std::slice::from_ref(&dev), None);
        assert_eq!((s[0].context_bytes, s[0].unexplained_bytes), (None, None));
        // Without free/total: no split at all.
        let mut blind = dev.clone();
        blind.free_bytes = None;
        assert!(untracked_split(&[blind], Some(&nvml)).is_empty());
    }
}
