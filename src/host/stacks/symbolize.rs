//! Symbolisation of captured stacks, at dump time only (never on the allocation path).
//!
//! One batched `blazesym` request over `/proc/self/maps` (DWARF line tables and inline info where
//! the objects carry them, ELF symbols otherwise, names demangled). Module paths come from the
//! loader's own list (`super::loaded`), canonicalised, so frames of one object always carry the
//! same string whether or not a symbol was found.

use super::loaded::for_each_loaded_object;
use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer};
use blazesym::Pid;
use dump::model::Frame;
use std::ops::{ControlFlow, Range};

/// Symbolises absolute addresses of this process. Returns one `Vec<Frame>` per input address:
/// normally one frame; several when inlined functions are known (innermost inline first, each
/// but the last with `inlined: true`). Never fails: unknown fields stay `None`, `address` is
/// always set (`0x…`, the address as given).
///
/// Every address is taken to be a *return address*, as [`super::capture`] produces them: the
/// lookup uses `addr - 1` so that file:line name the call, not the line after it.
pub fn symbolize(addrs: &[usize]) -> Vec<Vec<Frame>> {
    if addrs.is_empty() {
        return Vec::new();
    }
    if let Some(v) = CACHE
        .try_with(|c| c.borrow_mut().as_mut().map(|c| c.symbolize(addrs)))
        .ok()
        .flatten()
    {
        return v;
    }
    symbolize_uncached(addrs)
}

fn symbolize_uncached(addrs: &[usize]) -> Vec<Vec<Frame>> {
    match std::panic::catch_unwind(|| symbolize_inner(addrs)) {
        Ok(v) if v.len() == addrs.len() => v,
        _ => addrs.iter().map(|&a| vec![bare_frame(a, None)]).collect(),
    }
}

/// Frames already found on this thread, for a thread that symbolises the same stacks over and
/// over (the live summary's publisher, src/core/flight): only addresses not seen before are looked
/// up, so the objects' debug information is not parsed again each second. Forgotten whenever
/// the loaded objects change (a `dlopen` or `dlclose` can reuse addresses). Dumps are
/// symbolised without it.
struct Cache {
    maps_fingerprint: u64,
    frames: rustc_hash::FxHashMap<usize, Vec<Frame>>,
}

/// Bounded: a process with more distinct addresses than this starts over.
const CACHE_MAX: usize = 100_000;

impl Cache {
    fn symbolize(&mut self, addrs: &[usize]) -> Vec<Vec<Frame>> {
        let fp = ModuleMap::new().fingerprint();
        if fp != self.maps_fingerprint || self.frames.len() > CACHE_MAX {
            self.frames.clear();
            self.maps_fingerprint = fp;
        }
        let mut missing: Vec<usize> = addrs
            .iter()
            .copied()
            .filter(|a| !self.frames.contains_key(a))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            for (a, f) in missing.iter().zip(symbolize_uncached(&missing)) {
                self.frames.insert(*a, f);
            }
        }
        addrs.iter().map(|a| self.frames[a].clone()).collect()
    }
}

thread_local! {
    static CACHE: std::cell::RefCell<Option<Cache>> = const { std::cell::RefCell::new(None) };
}

/// Keeps found frames on the calling thread from now on (see [`Cache`]).
pub fn cache_on_this_thread() {
    let _ = CACHE.try_with(|c| {
        c.borrow_mut().get_or_insert_with(|| Cache {
            maps_fingerprint: 0,
            frames: Default::default(),
        });
    });
}

fn bare_frame(addr: usize, module: Option<String>) -> Frame {
    Frame {
        address: format!("{addr:#x}"),
        function: None,
        file: None,
        line: None,
        module,
        inlined: false,
        kind: Default::default(),
    }
}

fn symbolize_inner(addrs: &[usize]) -> Vec<Vec<Frame>> {
    if crate::sys::fault() == oomshim_core::config::Fault::Symbolize {
        panic!("injected fault, OOMSHIM_FAULT=symbolize"); // caught just above: raw addresses
    }
    let lookups: Vec<u64> = addrs
        .iter()
        .map(|&a| (a as u64).saturating_sub(1))
        .collect();
    let modules = ModuleMap::new();
    // Out of host memory while dumping: the symboliser maps the objects it reads and parses
    // their debug information, by far the largest allocations of a dump. Rust aborts the whole
    // process when an allocation fails, so it is not started without room for it: the dump is
    // then written with raw addresses (and module paths), with one message.
    let need = symbolisation_budget(&modules, &lookups);
    if !address_space_headroom(need) {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            crate::say!(
                "oomshim: too little host memory left to symbolise stacks (about {} MiB needed); \
                 dumps carry raw addresses",
                need >> 20
            );
        }
        return lookups
            .iter()
            .zip(addrs)
            .map(|(&l, &a)| vec![bare_frame(a, modules.path_of(l))])
            .collect();
    }
    let symbolizer = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        // Debug information an object carries itself (the program's, a library built with -g)
        // is read; a separate debug file found through `.gnu_debuglink` under /usr/lib/debug
        // (a distribution's `libc6-dbg`) is not: it gave libc's frames a file and line, and cost
        // every dump about 10 MiB of decompressed sections and 25 ms, in the host program.
        .set_debug_dirs(Some(Vec::<std::path::PathBuf>::new()))
        .build();
    let source = |map_files: bool| {
        let mut p = Process::new(Pid::Slf);
        // perf maps are for JIT runtimes that write /tmp/perf-PID.map; harmless when absent.
        p.map_files = map_files;
        Source::Process(p)
    };
    // `/proc/self/map_files` can be refused (some containers); symbolic paths then.
    let results = symbolizer
        .symbolize(&source(true), Input::AbsAddr(&lookups))
        .or_else(|_| symbolizer.symbolize(&source(false), Input::AbsAddr(&lookups)))
        .ok();

    let mut out = Vec::with_capacity(addrs.len());
    for (i, &addr) in addrs.iter().enumerate() {
        let module = modules.path_of(lookups[i]);
        let sym = results
            .as_ref()
            .and_then(|r| r.get(i))
            .and_then(Symbolized::as_sym);
        let Some(sym) = sym else {
            out.push(vec![bare_frame(addr, module)]);
            continue;
        };
        let module = module.or_else(|| {
            sym.module
                .as_ref()
                .map(|m| m.to_string_lossy().into_owned())
        });
        let address = format!("{addr:#x}");
        let mut frames = Vec::with_capacity(1 + sym.inlined.len());
        // blazesym lists inlined calls outermost first, each carrying the location inside it;
        // the dump wants the innermost first.
        for inl in sym.inlined.iter().rev() {
            let (file, line) = file_line(inl.code_info.as_ref());
            frames.push(Frame {
                address: address.clone(),
                function: Some(inl.name.to_string()),
                file,
                line,
                module: module.clone(),
                inlined: true,
                kind: Default::default(),
            });
        }
        let (file, line) = file_line(sym.code_info.as_deref());
        frames.push(Frame {
            address,
            function: Some(sym.name.to_string()),
            file,
            line,
            module,
            inlined: false,
            kind: Default::default(),
        });
        out.push(frames);
    }
    out
}

/// What symbolising `lookups` may take at most, in bytes of address space: each object file
/// it reads, three times (mapped, plus what is parsed out of its debug information, which may
/// sit in a separate debug file), and 32 MiB. Measured here: symbolising `leak_until_oom`'s
/// stacks aborted the process under an `RLIMIT_AS` of 16 to 32 MiB and succeeded from 36 MiB;
/// this asks for about 37 MiB (RELIABILITY.md, section 4).
fn symbolisation_budget(modules: &ModuleMap, lookups: &[u64]) -> usize {
    let mut seen: Vec<String> = Vec::new();
    for &l in lookups {
        if let Some(p) = modules.path_of(l) {
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
    }
    let files: u64 = seen
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    (32u64 << 20).saturating_add(files.saturating_mul(3)) as usize
}

/// True when `bytes` of address space can be had now: a `PROT_NONE` reservation, released at
/// once. It fails under `RLIMIT_AS` (`ulimit -v`) as the allocations it stands for would; it
/// costs no memory, and strict overcommit does not charge it. A cgroup memory limit is not seen
/// (the kernel kills the process on RSS there, with or without the shim's allocations).
pub fn address_space_headroom(bytes: usize) -> bool {
    // SAFETY: an anonymous mapping nobody else knows about, unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes.max(1),
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(p, bytes.max(1));
    }
    true
}

fn file_line(ci: Option<&CodeInfo<'_>>) -> (Option<String>, Option<u32>) {
    match ci {
        Some(ci) => (Some(ci.to_path().to_string_lossy().into_owned()), ci.line),
        None => (None, None),
    }
}

/// Loaded objects' address ranges (all PT_LOAD segments) and canonical paths.
struct ModuleMap {
    /// Sorted by start.
    ranges: Vec<(Range<u64>, usize)>,
    paths: Vec<String>,
}

impl ModuleMap {
    /// Identifies the set of loaded objects and where they lie (not the heap or other
    /// mappings, which change all the time).
    fn fingerprint(&self) -> u64 {
        let mut bytes = Vec::new();
        for (r, i) in &self.ranges {
            bytes.extend_from_slice(&r.start.to_le_bytes());
            bytes.extend_from_slice(&r.end.to_le_bytes());
            bytes.extend_from_slice(self.paths[*i].as_bytes());
        }
        dump::checksum::checksum(&bytes)
    }

    fn new() -> ModuleMap {
        let mut ranges: Vec<(Range<u64>, usize)> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for_each_loaded_object(|o| {
            let Some(phdrs) = o.program_headers() else {
                return ControlFlow::Continue(());
            };
            let idx = names.len();
            names.push(o.name());
            for ph in phdrs {
                if ph.p_type == libc::PT_LOAD && ph.p_memsz > 0 {
                    let s = o.bias().wrapping_add(ph.p_vaddr);
                    ranges.push((s..s.saturating_add(ph.p_memsz), idx));
                }
            }
            ControlFlow::Continue(())
        });
        ranges.sort_by_key(|r| r.0.start);
        let exe = std::env::current_exe().ok();
        let paths = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                if name.is_empty() {
                    // The main program (first object) has an empty name.
                    return match (&exe, i) {
                        (Some(p), 0) => p.to_string_lossy().into_owned(),
                        _ => name,
                    };
                }
                std::fs::canonicalize(&name)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or(name)
            })
            .collect();
        ModuleMap { ranges, paths }
    }

    fn path_of(&self, addr: u64) -> Option<String> {
        let i = self.ranges.partition_point(|r| r.0.start <= addr);
        let (r, idx) = self.ranges.get(i.checked_sub(1)?)?;
        if addr < r.end {
            self.paths.get(*idx).filter(|p| !p.is_empty()).cloned()
        } else {
            None
        }
    }
}
