//! Added cost of a hooked cudaMalloc + cudaFree pair (512 B) against the simulated runtime, with
//! 32 frames of stack, next to the bare pair measured in the same run, in each recording mode
//! (`oomshim_set_recording`, switched inside this one process): pass-through, totals only and
//! all stacks (native ones here: the bench has no Python), and through a second copy of the
//! library that publishes its live summary (src/core/flight) ten times a second.
//! `OOMSHIM_BENCH_BASELINE_LIB=PATH` adds another build of the library, measured in the same run.
//!
//! The bench loads target/<profile>/liboomshim.so with dlopen, exactly the library users preload,
//! and calls its hooks from 32 frames deep; it does not link the oomshim crate, so the only hooks
//! in the process are the library's.

use criterion::{criterion_group, criterion_main, Criterion};
use std::ffi::{c_int, c_void, CString};
use std::hint::black_box;
use std::path::{Path, PathBuf};

type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void) -> c_int;
type SetRecording = unsafe extern "C" fn(c_int) -> c_int;

/// Brings target/<profile>/liboomshim.so up to date: `cargo bench` builds the library for the
/// bench as an rlib only, not the cdylib measured here.
fn build_shim() {
    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--lib", "--quiet", "--profile", profile])
        // The workspace root: its default members, the build `cargo run` and `cargo test` share.
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
        .status()
        .expect("cargo");
    assert!(status.success(), "building liboomshim.so failed");
}

fn profile_dir() -> PathBuf {
    // target/<profile>/deps/hook-HASH -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The newest simulated runtime built by build.rs for this profile.
fn sim_runtime() -> PathBuf {
    let build = profile_dir().join("build");
    std::fs::read_dir(&build)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("out/sim/libcudart.so.13"))
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("simulated libcudart.so.13 (build the package first)")
}

/// # Safety
/// Loading `path` runs its initialisers: it must be a library meant to be loaded here.
unsafe fn open(path: &Path, flags: c_int) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path alive for the call; what loading runs is the
    // caller's promise.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

/// # Safety
/// `handle` comes from [`open`], and `T` is a function pointer type of `name`'s real signature.
unsafe fn sym<T: Copy>(handle: *mut c_void, name: &str) -> T {
    let c = CString::new(name).unwrap();
    // SAFETY: `handle` is a live handle (the caller's promise), `c` a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    assert!(!p.is_null(), "{name}");
    // SAFETY: a non-NULL symbol address as the function pointer type the caller promises is
    // its signature (a pointer-sized `T`).
    unsafe { std::mem::transmute_copy(&p) }
}

/// Runs `f` from `depth` frames further down the stack.
#[inline(never)]
fn at_depth(depth: usize, f: &mut dyn FnMut()) {
    if depth == 0 {
        f()
    } else {
        at_depth(black_box(depth - 1), f);
        black_box(depth);
    }
}

/// # Safety
/// `malloc` and `free` are a CUDA runtime's `cudaMalloc` and `cudaFree` (or hooks of them).
#[inline(always)]
unsafe fn pair(malloc: Malloc, free: Free) {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `cudaMalloc(void **, size_t)` with a valid out-parameter, then `cudaFree` of
    // what it returned (the caller's promise about the functions).
    unsafe {
        assert_eq!(malloc(&mut p, 512), 0);
        assert_eq!(free(black_box(p)), 0);
    }
}

fn hook_overhead(c: &mut Criterion) {
    build_shim();
    let dumps = std::env::temp_dir().join(format!("oomshim-bench-{}", std::process::id()));
    // Read once by the shim at its first hooked call.
    std::env::set_var("OOMSHIM_DEPTH", "32");
    std::env::set_var("OOMSHIM_DIR", &dumps);
    std::env::set_var("OOMSHIM_LIVE", "0");
    // SAFETY: the libraries loaded are the simulated runtime and builds of liboomshim.so, the
    // symbols are taken with their CUDA (or oomshim C API) signatures, and every pair is a
    // cudaMalloc and the cudaFree of the same library; nothing is unloaded while in use.
    unsafe {
        let runtime = open(&sim_runtime(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        let shim = open(
            &profile_dir().join("liboomshim.so"),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        let (bare_malloc, bare_free): (Malloc, Free) =
            (sym(runtime, "cudaMalloc"), sym(runtime, "cudaFree"));
        let (shim_malloc, shim_free): (Malloc, Free) =
            (sym(shim, "cudaMalloc"), sym(shim, "cudaFree"));
        let set_recording: SetRecording = sym(shim, "oomshim_set_recording");
        // Its first call reads the settings: this copy publishes no live summary.
        pair(shim_malloc, shim_free);
        // A second copy of the library (its own state: dlopen'ed RTLD_LOCAL from another
        // path) with the flight recorder publishing ten times a second, its default being once.
        let live_dir = dumps.join("live");
        let copy = dumps.join("publishing").join("liboomshim.so");
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(profile_dir().join("liboomshim.so"), &copy).unwrap();
        std::env::set_var("OOMSHIM_LIVE", "1");
        std::env::set_var("OOMSHIM_LIVE_INTERVAL", "100ms");
        std::env::set_var("OOMSHIM_LIVE_DIR", &live_dir);
        let publishing = open(&copy, libc::RTLD_NOW | libc::RTLD_LOCAL);
        let (live_malloc, live_free): (Malloc, Free) =
            (sym(publishing, "cudaMalloc"), sym(publishing, "cudaFree"));
        pair(live_malloc, live_free);
        // Copies loaded after this one (the baseline) publish nothing.
        std::env::set_var("OOMSHIM_LIVE", "0");
        let mut group = c.benchmark_group("cudaMalloc+cudaFree 512 B, 32 frames deep");
        group.bench_function("bare (simulated runtime)", |b| {
            at_depth(32, &mut || b.iter(|| pair(bare_malloc, bare_free)))
        });
        // The default (all stacks) first, under the name earlier runs used.
        for (mode, name) in [
            (3, "through liboomshim.so"),
            (0, "through liboomshim.so, pass-through"),
            (1, "through liboomshim.so, totals only"),
        ] {
            // The first hooked call starts the shim; the switch itself starts it otherwise.
            assert!(set_recording(mode) >= 0, "oomshim_set_recording({mode})");
            group.bench_function(name, |b| {
                at_depth(32, &mut || b.iter(|| pair(shim_malloc, shim_free)))
            });
        }
        set_recording(3);
        // Another build of the library (an older commit, say), loaded beside this one with its
        // own state: before/after figures from one run, on one machine at one load.
        if let Some(other) = std::env::var_os("OOMSHIM_BENCH_BASELINE_LIB") {
            let other = open(Path::new(&other), libc::RTLD_NOW | libc::RTLD_LOCAL);
            let (m, f): (Malloc, Free) = (sym(other, "cudaMalloc"), sym(other, "cudaFree"));
            group.bench_function("through OOMSHIM_BENCH_BASELINE_LIB", |b| {
                at_depth(32, &mut || b.iter(|| pair(m, f)))
            });
        }
        group.bench_function("through liboomshim.so, publishing the live summary", |b| {
            at_depth(32, &mut || b.iter(|| pair(live_malloc, live_free)))
        });
        group.finish();
    }
    let _ = std::fs::remove_dir_all(dumps);
}

criterion_group!(benches, hook_overhead);
criterion_main!(benches);
