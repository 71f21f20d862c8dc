//! Stack capture cost, 32 frames, warm caches: oomshim's DWARF capture vs glibc `backtrace()`
//! (libgcc DWARF unwinder) vs a frame-pointer walk (in C, the physical floor).
//!
//! Stacks: a Rust recursion (this bench binary: release, no frame pointers) and a C recursion
//! built at bench start with gcc -O2, once with and once without frame pointers. Each
//! benchmark runs at the bottom of a 40-deep recursion, so every method stops at 32 frames.
//!
//! `cargo bench -p oomshim-benches --bench unwind` (needs gcc for the C groups; they are skipped without it).

use criterion::{criterion_group, criterion_main, Criterion};
use oomshim_host::stacks;
use std::hint::black_box;
use std::time::{Duration, Instant};

const FRAMES: usize = 32;
const DEPTH: usize = 40;

/// Runs `f` at the bottom of `depth` frames of a non-inlined, non-tail-recursive Rust function.
#[inline(never)]
fn rust_deep(depth: usize, f: &mut dyn FnMut()) -> usize {
    if depth == 0 {
        f();
        return 0;
    }
    let r = rust_deep(black_box(depth - 1), f);
    black_box(r) + 1
}

const C_SOURCE: &str = r#"
typedef void (*cb_t)(void *);
volatile int oomshim_bench_sink;
__attribute__((noinline, noipa)) int c_recurse(int depth, cb_t cb, void *ctx) {
    volatile char pad[24];
    pad[0] = (char)depth;
    if (depth == 0) {
        cb(ctx);
        return pad[0];
    }
    int r = c_recurse(depth - 1, cb, ctx);
    oomshim_bench_sink = r;
    return r + pad[0];
}

/* Frame-pointer baseline, all in C (a frame-pointer chain cannot pass through Rust code built
   without frame pointers): a validated walk (monotonic, aligned) of 32 frames, timed in a loop
   at the bottom of the same recursion. Meaningful in the -fno-omit-frame-pointer build only. */
__attribute__((noinline, noipa)) int c_fp_walk(void **out, int max) {
    void **fp = (void **)__builtin_frame_address(0);
    int n = 0;
    while (n < max && fp) {
        void **next = (void **)fp[0];
        out[n++] = fp[1];
        if (next <= fp || ((unsigned long)next & 7)) break;
        fp = next;
    }
    return n;
}

__attribute__((noinline, noipa)) int c_fp_loop(int depth, long iters, void **out) {
    volatile char pad[24];
    pad[0] = (char)depth;
    if (depth == 0) {
        int least = 1 << 30;
        for (long i = 0; i < iters; i++) {
            int n = c_fp_walk(out, 32);
            if (n < least) least = n;
        }
        return least;
    }
    int r = c_fp_loop(depth - 1, iters, out);
    oomshim_bench_sink = r;
    return r + pad[0] - pad[0];
}
"#;

type CRecurse = unsafe extern "C" fn(
    libc::c_int,
    extern "C" fn(*mut libc::c_void),
    *mut libc::c_void,
) -> libc::c_int;

type CFpLoop =
    unsafe extern "C" fn(libc::c_int, libc::c_long, *mut *mut libc::c_void) -> libc::c_int;

struct CLib {
    recurse: CRecurse,
    fp_loop: CFpLoop,
}

/// Compiles and loads the C recursion with the given extra flags; None when gcc is missing.
fn c_lib(dir: &std::path::Path, name: &str, flags: &[&str]) -> Option<CLib> {
    let src = dir.join("recurse.c");
    std::fs::write(&src, C_SOURCE).ok()?;
    let lib = dir.join(format!("lib{name}.so"));
    let ok = std::process::Command::new("gcc")
        .args([
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-fno-optimize-sibling-calls",
        ])
        .args(flags)
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status()
        .ok()?
        .success();
    if !ok {
        return None;
    }
    let path = std::ffi::CString::new(lib.to_str()?).ok()?;
    // SAFETY: the library is the C source above, just compiled (no initialisers); it stays
    // loaded for the process, and its two functions have the C signatures of CRecurse and
    // CFpLoop, which the non-NULL symbols are turned into.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, c"c_recurse".as_ptr());
        let l = libc::dlsym(h, c"c_fp_loop".as_ptr());
        if f.is_null() || l.is_null() {
            return None;
        }
        Some(CLib {
            recurse: std::mem::transmute::<*mut libc::c_void, CRecurse>(f),
            fp_loop: std::mem::transmute::<*mut libc::c_void, CFpLoop>(l),
        })
    }
}

extern "C" fn c_trampoline(ctx: *mut libc::c_void) {
    // SAFETY: `ctx` is the `&mut &mut dyn FnMut()` that `c_deep` passed to `c_recurse`, alive
    // (and borrowed by no one else) until `c_recurse` returns.
    let f = unsafe { &mut *(ctx as *mut &mut dyn FnMut()) };
    f();
}

fn c_deep(lib: &CLib, depth: usize, mut f: &mut dyn FnMut()) {
    let ctx = &mut f as *mut &mut dyn FnMut() as *mut libc::c_void;
    // SAFETY: `c_recurse(depth, cb, ctx)` calls `cb(ctx)` once at the bottom; `ctx` points to
    // `f`, which outlives the call.
    unsafe { (lib.recurse)(depth as libc::c_int, c_trampoline, ctx) };
}

#[inline(never)]
fn oomshim_capture() -> usize {
    let mut buf = [0usize; FRAMES];
    let n = stacks::capture(black_box(&mut buf), false);
    black_box(&buf);
    n
}

/// The unwinding goal is stated for 40 frames: the same capture, 40 deep.
#[inline(never)]
fn oomshim_capture_40() -> usize {
    let mut buf = [0usize; 40];
    let n = stacks::capture(black_box(&mut buf), false);
    black_box(&buf);
    n
}

#[inline(never)]
fn glibc_backtrace() -> usize {
    let mut buf = [std::ptr::null_mut::<libc::c_void>(); FRAMES];
    // SAFETY: `backtrace` writes at most FRAMES entries into `buf`, which holds FRAMES.
    let n = unsafe { libc::backtrace(buf.as_mut_ptr(), FRAMES as libc::c_int) };
    black_box(&buf);
    n as usize
}

/// Benchmarks `method` at the bottom of `deep`, timing a tight loop there (`iter_custom`, so
/// no criterion frames sit between the recursion and `method`: a frame-pointer chain through
/// the C recursion stays intact), and says when it returned fewer than 32 frames.
fn bench_at_depth(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    deep: &dyn Fn(&mut dyn FnMut()),
    method: fn() -> usize,
) {
    let mut least = usize::MAX;
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            deep(&mut || {
                let t = Instant::now();
                for _ in 0..iters {
                    least = least.min(black_box(method()));
                }
                elapsed = t.elapsed();
            });
            elapsed
        })
    });
    if least < FRAMES {
        eprintln!("note: {name} returned as few as {least} frames (< {FRAMES}) on this stack");
    }
}

fn unwind(c: &mut Criterion) {
    // The module list and this thread's cache are built on first use: warm them.
    stacks::refresh_modules();

    let mut g = c.benchmark_group("rust_no_fp_32");
    let rust = |f: &mut dyn FnMut()| {
        rust_deep(DEPTH, f);
    };
    bench_at_depth(&mut g, "oomshim_capture", &rust, oomshim_capture);
    bench_at_depth(&mut g, "glibc_backtrace", &rust, glibc_backtrace);
    g.finish();

    let mut g = c.benchmark_group("rust_no_fp_40");
    let rust48 = |f: &mut dyn FnMut()| {
        rust_deep(DEPTH + 8, f);
    };
    bench_at_depth(&mut g, "oomshim_capture", &rust48, oomshim_capture_40);
    g.finish();

    let dir = tempfile::tempdir().expect("tempdir");
    let nofp = c_lib(dir.path(), "nofp", &["-fomit-frame-pointer"]);
    let fp = c_lib(dir.path(), "fp", &["-fno-omit-frame-pointer"]);
    match (nofp, fp) {
        (Some(nofp), Some(fp)) => {
            let mut g = c.benchmark_group("c_O2_no_fp_32");
            let deep = |f: &mut dyn FnMut()| c_deep(&nofp, DEPTH, f);
            bench_at_depth(&mut g, "oomshim_capture", &deep, oomshim_capture);
            bench_at_depth(&mut g, "glibc_backtrace", &deep, glibc_backtrace);
            g.finish();

            let mut g = c.benchmark_group("c_O2_fp_32");
            let deep = |f: &mut dyn FnMut()| c_deep(&fp, DEPTH, f);
            bench_at_depth(&mut g, "oomshim_capture", &deep, oomshim_capture);
            bench_at_depth(&mut g, "glibc_backtrace", &deep, glibc_backtrace);
            let mut least = i32::MAX;
            g.bench_function("frame_pointer_walk_in_c", |b| {
                b.iter_custom(|iters| {
                    let mut buf = [std::ptr::null_mut::<libc::c_void>(); FRAMES];
                    let t = Instant::now();
                    // SAFETY: `c_fp_loop` writes at most 32 frames into `out`, and `buf` holds
                    // FRAMES (at least 32).
                    let n = unsafe {
                        (fp.fp_loop)(
                            DEPTH as libc::c_int,
                            iters as libc::c_long,
                            buf.as_mut_ptr(),
                        )
                    };
                    let el = t.elapsed();
                    least = least.min(n);
                    el
                })
            });
            if least < FRAMES as i32 {
                eprintln!("note: frame_pointer_walk_in_c returned as few as {least} frames");
            }
            g.finish();
        }
        _ => eprintln!("gcc not available: C stack groups skipped"),
    }

    // One-off costs: a thread's first capture (stack bounds, cache allocation, cold rule cache)
    // and rebuilding the module list.
    let mut g = c.benchmark_group("one_off");
    g.sample_size(20);
    g.bench_function("first_capture_on_new_thread", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += std::thread::spawn(|| {
                    let mut buf = [0usize; FRAMES];
                    let t = Instant::now();
                    black_box(stacks::capture(&mut buf, false));
                    t.elapsed()
                })
                .join()
                .unwrap();
            }
            total
        })
    });
    g.bench_function("refresh_modules", |b| b.iter(stacks::refresh_modules));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = unwind
}
criterion_main!(benches);
