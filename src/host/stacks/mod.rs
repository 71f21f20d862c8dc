//! Native call stacks: capture on the allocation path, symbolisation at dump time.
//!
//! - [`capture`] walks the calling thread's stack with DWARF CFI (`.eh_frame`, via `framehop`,
//!   in-process, per-thread rule cache), so it works through code built without frame pointers
//!   (PyTorch wheels, `-O2` C, Rust release code). Warm cost is tens to low hundreds of
//!   nanoseconds for 32 frames (`benches/unwind.rs`); it never faults, never panics out and
//!   returns 0 when re-entered on the same thread (signal handlers).
//! - [`symbolize`] turns the captured return addresses into `function file:line module` frames
//!   with `blazesym` (inlined functions expanded), in one batch.
//! - [`refresh_modules`] rebuilds the unwinder's list of loaded objects ahead of time (shim start,
//!   after `dlopen`); `capture` also does it lazily when it meets a pc of a newly loaded object.
//!
//! Captured stacks are plain `usize` return addresses, innermost first, so they can be hashed,
//! interned and compared cheaply; only dumps pay for names.

mod capture;
#[cfg(target_arch = "x86_64")]
mod dwarf;
mod loaded;
mod regs;
mod symbolize;
pub use symbolize::address_space_headroom;

pub use capture::{
    capture, capture_frame_pointers, capture_interned, fork_prepare, fork_release, refresh_modules,
};
pub use symbolize::{cache_on_this_thread, symbolize};

#[cfg(test)]
mod tests {
    use super::*;
    use dump::model::Frame;
    use std::hint::black_box;

    /// This module's tests one at a time: a test that loads a library and walks through it
    /// publishes a new module snapshot, which (rightly) invalidates every thread's memo, so a
    /// test running meanwhile that asserts a memo was reused would see a fresh walk instead.
    fn one_walk_test_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static WALK_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        WALK_TESTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn names(frames: &[Vec<Frame>]) -> Vec<String> {
        frames
            .iter()
            .flatten()
            .map(|f| f.function.clone().unwrap_or_default())
            .collect()
    }

    /// Index of the first name containing each needle, each after the previous one.
    fn in_order(names: &[String], needles: &[&str]) -> Result<Vec<usize>, String> {
        let mut from = 0;
        let mut found = Vec::new();
        for n in needles {
            match names[from..].iter().position(|s| s.contains(n)) {
                Some(i) => {
                    found.push(from + i);
                    from += i + 1;
                }
                None => return Err(format!("{n} not found after index {from} in {names:#?}")),
            }
        }
        Ok(found)
    }

    #[inline(never)]
    fn stk_level_three(out: &mut [usize]) -> (usize, u32) {
        let (n, line) = (capture(out, false), line!());
        (black_box(n), black_box(line))
    }

    #[inline(never)]
    fn stk_level_two(out: &mut [usize]) -> (usize, u32) {
        let r = stk_level_three(black_box(out));
        black_box(r)
    }

    #[inline(never)]
    fn stk_level_one(out: &mut [usize]) -> (usize, u32) {
        let r = stk_level_two(black_box(out));
        black_box(r)
    }

    #[test]
    fn chain_of_functions_is_captured_and_symbolised_in_order() {
        let _serial = one_walk_test_at_a_time();
        let mut buf = [0usize; 64];
        let (n, line) = stk_level_one(&mut buf);
        assert!(n >= 4, "only {n} frames");
        let syms = symbolize(&buf[..n]);
        assert_eq!(syms.len(), n);
        let names = names(&syms);
        in_order(
            &names,
            &[
                "stk_level_three",
                "stk_level_two",
                "stk_level_one",
                "chain_of_functions_is_captured_and_symbolised_in_order",
            ],
        )
        .unwrap();
        // The innermost frame is the call of `capture` in stk_level_three: right file, the line.
        let first = &syms[0].last().unwrap();
        assert!(
            first
                .function
                .as_deref()
                .unwrap()
                .contains("stk_level_three"),
            "{first:?}"
        );
        let file = first.file.as_deref().unwrap_or("");
        assert!(file.ends_with("stacks/mod.rs"), "{first:?}");
        assert_eq!(first.line, Some(line), "{first:?}");
        assert_eq!(first.address, format!("{:#x}", buf[0]));
        assert!(
            first.module.as_deref().is_some_and(|m| !m.is_empty()),
            "{first:?}"
        );
        // Called again from another line of this test: the same stack but for that one frame.
        let mut again = [0usize; 64];
        let (n2, _) = stk_level_one(&mut again);
        assert_eq!(n2, n);
        assert_eq!(&again[..3], &buf[..3]);
        assert_ne!(again[3], buf[3]);
        assert_eq!(&again[4..n], &buf[4..n]);
    }

    #[test]
    fn tiny_output_slice_truncates() {
        let _serial = one_walk_test_at_a_time();
        let mut full = [0usize; 64];
        let (n, _) = stk_level_one(&mut full);
        let mut two = [0usize; 2];
        let (m, _) = stk_level_one(&mut two);
        assert_eq!(m, 2);
        assert!(n > 2);
        assert_eq!(&two[..], &full[..2]);
        assert_eq!(capture(&mut [], false), 0);
    }

    #[test]
    fn reentrant_capture_returns_zero() {
        let _serial = one_walk_test_at_a_time();
        use std::cell::Cell;
        thread_local!(static INNER: Cell<Option<usize>> = const { Cell::new(None) });
        fn reenter() {
            let mut buf = [0usize; 16];
            INNER.with(|c| c.set(Some(capture(&mut buf, false))));
        }
        capture::TEST_REENTER.with(|h| h.set(Some(reenter)));
        let mut buf = [0usize; 32];
        let n = capture(&mut buf, false);
        capture::TEST_REENTER.with(|h| h.set(None));
        assert_eq!(INNER.with(|c| c.get()), Some(0));
        assert!(n > 2, "outer capture got {n}");
        // And the thread is usable again afterwards.
        assert!(capture(&mut buf, false) > 2);
    }

    /// At thread exit the capture state is freed by a thread-local destructor: a capture from
    /// a destructor that runs before it still works, one that runs after it returns 0 (and
    /// makes no new state).
    #[test]
    fn captures_during_thread_exit_are_safe() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static BEFORE_FREE: AtomicUsize = AtomicUsize::new(usize::MAX);
        static AFTER_FREE: AtomicUsize = AtomicUsize::new(usize::MAX);
        struct CaptureOnDrop(&'static AtomicUsize);
        impl Drop for CaptureOnDrop {
            fn drop(&mut self) {
                let mut buf = [0usize; 32];
                self.0.store(capture(&mut buf, false), Ordering::Relaxed);
            }
        }
        thread_local! {
            // Destructors run in the reverse order of first use.
            static FIRST: CaptureOnDrop = const { CaptureOnDrop(&AFTER_FREE) };
            static LAST: CaptureOnDrop = const { CaptureOnDrop(&BEFORE_FREE) };
        }
        std::thread::spawn(|| {
            FIRST.with(|_| ());
            let mut buf = [0usize; 32];
            assert!(capture(&mut buf, false) > 0);
            LAST.with(|_| ());
        })
        .join()
        .unwrap();
        assert!(BEFORE_FREE.load(Ordering::Relaxed) > 0);
        assert_eq!(AFTER_FREE.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn symbolize_never_fails() {
        let _serial = one_walk_test_at_a_time();
        let out = symbolize(&[
            0,
            1,
            usize::MAX,
            0x1000,
            symbolize_never_fails as *const () as usize,
        ]);
        assert_eq!(out.len(), 5);
        for (f, a) in out.iter().zip([0usize, 1, usize::MAX, 0x1000]) {
            assert_eq!(f[0].address, format!("{a:#x}"));
        }
        assert!(symbolize(&[]).is_empty());
    }

    #[test]
    fn frame_pointer_walk_is_bounded() {
        let _serial = one_walk_test_at_a_time();
        // Code here has no frame pointers: whatever rbp holds, the walk must stay in bounds.
        let mut buf = [0usize; 64];
        let n = capture_frame_pointers(&mut buf);
        assert!(n <= 64);
    }

    /// Raises SIGUSR2 on this thread from a known frame.
    #[inline(never)]
    fn stk_raises_signal() {
        // SAFETY: signals this thread; the test installed SIGUSR2's handler before.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2) };
        black_box(());
    }

    /// Signals landing inside and outside captures: no crash, a nested capture returns 0, and a
    /// capture in a handler walks through the signal frame into the interrupted code.
    #[test]
    fn signals_during_capture_are_safe() {
        let _serial = one_walk_test_at_a_time();
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Mutex;
        static IN_HANDLER_TOTAL: AtomicUsize = AtomicUsize::new(0);
        static IN_HANDLER_ZERO: AtomicUsize = AtomicUsize::new(0);
        static RECORD: AtomicBool = AtomicBool::new(false);
        static RECORDED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
        extern "C" fn handler(_: libc::c_int) {
            let mut buf = [0usize; 64];
            let n = capture(&mut buf, false);
            IN_HANDLER_TOTAL.fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                IN_HANDLER_ZERO.fetch_add(1, Ordering::Relaxed);
            }
            if RECORD.swap(false, Ordering::Relaxed) {
                // Only while the test thread is blocked in pthread_kill: no lock is held.
                if let Ok(mut v) = RECORDED.try_lock() {
                    v.clear();
                    v.extend_from_slice(&buf[..n]);
                }
            }
        }
        let mut buf = [0usize; 64];
        // Warm this thread first.
        assert!(capture(&mut buf, false) > 2);
        // SAFETY: `sigaction` structs are plain data (all zeroes valid); the handler is an
        // `extern "C"` function of the SA_SIGINFO-less signature, and the old action is put
        // back below.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, &mut old), 0);

            // Through the signal frame (glibc's __restore_rt) into the interrupted code.
            RECORD.store(true, Ordering::Relaxed);
            stk_raises_signal();
            let recorded = RECORDED.lock().unwrap().clone();
            let names = names(&symbolize(&recorded));
            in_order(
                &names,
                &[
                    "handler",
                    "stk_raises_signal",
                    "signals_during_capture_are_safe",
                ],
            )
            .unwrap();

            let target = libc::pthread_self() as usize;
            static STOP: AtomicBool = AtomicBool::new(false);
            STOP.store(false, Ordering::Relaxed);
            let killer = std::thread::spawn(move || {
                let mut sent = 0;
                while !STOP.load(Ordering::Relaxed) && sent < 20_000 {
                    libc::pthread_kill(target as libc::pthread_t, libc::SIGUSR2);
                    sent += 1;
                    std::thread::yield_now();
                }
            });
            let t0 = std::time::Instant::now();
            let mut loops = 0u64;
            while t0.elapsed() < std::time::Duration::from_millis(300) {
                let (n, _) = stk_level_one(&mut buf);
                assert!(n >= 4, "capture under signals got {n}");
                loops += 1;
            }
            STOP.store(true, Ordering::Relaxed);
            killer.join().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(
                libc::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut()),
                0
            );
            let total = IN_HANDLER_TOTAL.load(Ordering::Relaxed);
            let zero = IN_HANDLER_ZERO.load(Ordering::Relaxed);
            eprintln!(
                "signals: {total} handled, {zero} returned 0 (nested), {loops} outer captures"
            );
            assert!(total > 0);
        }
    }

    // ---- walking through C built with -O2 -fomit-frame-pointer ------------------------------

    const C_SOURCE: &str = r#"
typedef void (*cb_t)(void *);
volatile int oomshim_test_sink;

__attribute__((noinline)) void c_inner(cb_t cb, void *ctx) {
    volatile char pad[40];
    pad[0] = 1;
    /* rbp is garbage from here on: only CFI can get past this frame. */
    __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
    cb(ctx);
    oomshim_test_sink += pad[0];
}

__attribute__((noinline)) void c_middle(cb_t cb, void *ctx) {
    volatile char pad[24];
    pad[0] = 2;
    c_inner(cb, ctx);
    oomshim_test_sink += pad[0];
}

__attribute__((noinline)) void c_outer(cb_t cb, void *ctx) {
    volatile char pad[72];
    pad[0] = 3;
    c_middle(cb, ctx);
    oomshim_test_sink += pad[0];
}
"#;

    struct CbState {
        buf: [usize; 64],
        n: usize,
        skip_own: bool,
        /// Also walk with framehop alone into `reference` (x86-64).
        with_reference: bool,
        reference: [usize; 64],
        n_reference: usize,
    }

    impl CbState {
        fn new(skip_own: bool, with_reference: bool) -> Self {
            CbState {
                buf: [0; 64],
                n: 0,
                skip_own,
                with_reference,
                reference: [0; 64],
                n_reference: 0,
            }
        }
    }

    extern "C" fn c_callback(ctx: *mut libc::c_void) {
        // SAFETY: `ctx` is the `&mut CbState` that `stk_rust_calls_into_c` passed through the C
        // chain, alive and not otherwise borrowed until the call returns.
        let st = unsafe { &mut *(ctx as *mut CbState) };
        #[cfg(target_arch = "x86_64")]
        if st.with_reference {
            (st.n, st.n_reference) =
                capture::capture_with_reference(&mut st.buf, &mut st.reference);
            return;
        }
        st.n = capture(&mut st.buf, st.skip_own);
    }

    type COuter = unsafe extern "C" fn(extern "C" fn(*mut libc::c_void), *mut libc::c_void);

    #[inline(never)]
    fn stk_rust_calls_into_c(outer: COuter, st: &mut CbState) {
        // SAFETY: `outer` is a test library's `c_outer(cb, ctx)`, which calls `cb(ctx)` once;
        // `st` outlives the call.
        unsafe { outer(c_callback, st as *mut CbState as *mut libc::c_void) };
        black_box(&st.n);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn walks_through_c_without_frame_pointers() {
        let _serial = one_walk_test_at_a_time();
        // Build the module list before the library exists, so the capture below must notice
        // the dlopen'ed object by itself.
        let mut warm = [0usize; 8];
        assert!(capture(&mut warm, false) > 0);

        let dir = tempfile::tempdir().unwrap();
        let handle = build_and_load(dir.path(), "cchain", C_SOURCE);
        // SAFETY: a live handle from `build_and_load`, a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, c"c_outer".as_ptr()) };
        assert!(!sym.is_null());
        // SAFETY: `c_outer` of C_SOURCE has COuter's signature.
        let outer: COuter = unsafe { std::mem::transmute(sym) };

        for skip_own in [false, true] {
            let mut st = CbState::new(skip_own, false);
            stk_rust_calls_into_c(outer, &mut st);
            let syms = symbolize(&st.buf[..st.n]);
            let names = names(&syms);
            let mut needles = vec!["c_inner", "c_middle", "c_outer", "stk_rust_calls_into_c"];
            if !skip_own {
                needles.insert(0, "c_callback");
            }
            in_order(&names, &needles).unwrap();
            if std::env::var_os("OOMSHIM_TEST_VERBOSE").is_some() {
                for f in syms.iter().flatten() {
                    eprintln!("{f:?}");
                }
            }
            let first = &syms[0].last().unwrap();
            if skip_own {
                // Frames inside this test binary (the "own module") were skipped: the stack
                // starts at the call into the callback inside c_inner.
                assert!(
                    first.function.as_deref().unwrap().contains("c_inner"),
                    "{first:?}"
                );
                let c_frame = first;
                assert!(
                    c_frame.file.as_deref().unwrap_or("").ends_with("cchain.c"),
                    "{c_frame:?}"
                );
                assert!(c_frame
                    .module
                    .as_deref()
                    .unwrap_or("")
                    .ends_with("libcchain.so"));
            }
        }
        // The two-level walk gives exactly what framehop alone gives, cold and warm.
        for _ in 0..2 {
            let mut st = CbState::new(false, true);
            stk_rust_calls_into_c(outer, &mut st);
            assert!(st.n > 6);
            assert_eq!(&st.buf[..st.n], &st.reference[..st.n_reference]);
        }
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(handle) };
    }

    /// A word only a saved rbp holds, changing from one call to the next: `c_outer` holds
    /// `c_word` in rbp across its call, `c_keep` saves it (and clears rbp for the callback).
    /// No frame's rule reads bp: only CFI walks this code.
    const C_SAVED_BP: &str = r#"
typedef void (*cb_t)(void *);
volatile long c_word;
volatile int c_sink;

__attribute__((noinline)) void c_keep(cb_t cb, void *ctx) {
    volatile char pad[8];
    pad[0] = 1;
    __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
    cb(ctx);
    c_sink += pad[0];
}

__attribute__((noinline)) void c_outer(cb_t cb, void *ctx) {
    volatile char pad[24];
    pad[0] = 2;
    __asm__ volatile("mov %0, %%rbp" :: "r"(c_word) : "rbp");
    c_keep(cb, ctx);
    c_sink += pad[0];
}
"#;

    /// The walk memo compares only the stack words that decide the stack: a saved rbp that
    /// no later frame reads bp from may change (here on every call) and the memo is still
    /// taken whole, with exactly framehop's frames.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_changed_saved_bp_that_no_frame_reads_keeps_the_memo() {
        let _serial = one_walk_test_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let handle = build_and_load(dir.path(), "savedbp", C_SAVED_BP);
        // SAFETY: a live handle, NUL-terminated names, both defined by C_SAVED_BP.
        let (outer, word) = unsafe {
            (
                libc::dlsym(handle, c"c_outer".as_ptr()),
                libc::dlsym(handle, c"c_word".as_ptr()) as usize,
            )
        };
        assert!(!outer.is_null() && word != 0);
        // SAFETY: `c_outer` of C_SAVED_BP has COuter's signature.
        let outer: COuter = unsafe { std::mem::transmute(outer) };
        std::thread::spawn(move || {
            let walked = || dwarf::WALKED.with(|c| c.get());
            let mut first: Option<Vec<usize>> = None;
            for v in 1..=6i64 {
                // SAFETY: the library's `volatile long`, written while nothing else runs in it.
                unsafe { (word as *mut i64).write_volatile(v * 0x1111) };
                let before = walked();
                let mut st = CbState::new(false, true);
                stk_rust_calls_into_c(outer, &mut st);
                let stepped = walked() - before;
                assert!(st.n > 4);
                assert_eq!(&st.buf[..st.n], &st.reference[..st.n_reference], "call {v}");
                match &first {
                    None => first = Some(st.buf[..st.n].to_vec()),
                    Some(f) => {
                        assert_eq!(&st.buf[..st.n], &f[..], "call {v}");
                        assert_eq!(stepped, 0, "call {v} stepped through {stepped} frames");
                    }
                }
            }
            let names = names(&symbolize(first.as_deref().unwrap()));
            in_order(&names, &["c_keep", "c_outer", "stk_rust_calls_into_c"]).unwrap();
        })
        .join()
        .unwrap();
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(handle) };
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_ref_two(fast: &mut [usize], reference: &mut [usize]) -> (usize, usize) {
        let r = capture::capture_with_reference(fast, reference);
        black_box(r)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_ref_one(fast: &mut [usize], reference: &mut [usize]) -> (usize, usize) {
        let r = stk_ref_two(black_box(fast), reference);
        black_box(r)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn two_level_walk_agrees_with_framehop() {
        let _serial = one_walk_test_at_a_time();
        for _ in 0..3 {
            let (mut fast, mut reference) = ([0usize; 64], [0usize; 64]);
            let (a, b) = stk_ref_one(&mut fast, &mut reference);
            assert!(a > 4);
            assert_eq!(&fast[..a], &reference[..b]);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_memo_leaf(fast: &mut [usize], reference: &mut [usize]) -> (usize, usize) {
        let r = capture::capture_with_reference(fast, reference);
        black_box(r)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_memo_common(fast: &mut [usize], reference: &mut [usize]) -> (usize, usize) {
        let r = stk_memo_leaf(black_box(fast), reference);
        black_box(r)
    }

    // Two callers of the same shape (one generic function: same frame size, called from the
    // same line): the frames below them sit at the same stack addresses with the same return
    // addresses, and only the word holding the return address into one or the other differs.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_memo_caller<const WHICH: u8>(
        fast: &mut [usize],
        reference: &mut [usize],
    ) -> (usize, usize) {
        let r = stk_memo_common(black_box(fast), reference);
        black_box(WHICH);
        black_box(r)
    }

    /// The walk memo (a walk stops at the first frame that matches the previous walk's state
    /// and takes the rest from it when the stack words it read are unchanged) gives exactly
    /// what framehop alone gives, when consecutive stacks share their outer frames and when
    /// they differ only in a word above identical inner frames.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_walk_memo_never_reuses_a_changed_stack() {
        let _serial = one_walk_test_at_a_time();
        type Caller = fn(&mut [usize], &mut [usize]) -> (usize, usize);
        let callers: [Caller; 2] = [stk_memo_caller::<1>, stk_memo_caller::<2>];
        let mut seen = [Vec::new(), Vec::new()];
        let splices = || dwarf::SPLICES.with(|c| c.get());
        let before = splices();
        for i in 0..12 {
            let which = (i / 3 + i) % 2; // a a b b a b ...: repeats and alternations
            let caller = black_box(callers[which]);
            for depth in [64usize, 3, 64] {
                let (mut fast, mut reference) = ([0usize; 64], [0usize; 64]);
                let (a, b) = caller(&mut fast[..depth], &mut reference[..depth]);
                assert_eq!(&fast[..a], &reference[..b], "call {i}, depth {depth}");
                if depth == 64 {
                    assert!(a > 5, "only {a} frames");
                    seen[which] = fast[..a].to_vec();
                }
            }
        }
        // Walks were completed from the memo (and the check above held for each of them); not
        // all: a saved register the walk reads (bp) holds the loop's own values here.
        assert!(splices() - before >= 8, "{} splices", splices() - before);
        let names_a = names(&symbolize(&seen[0]));
        let names_b = names(&symbolize(&seen[1]));
        in_order(
            &names_a,
            &["stk_memo_leaf", "stk_memo_common", "stk_memo_caller"],
        )
        .unwrap();
        in_order(
            &names_b,
            &["stk_memo_leaf", "stk_memo_common", "stk_memo_caller"],
        )
        .unwrap();
        // Same shape, different functions: the frames differ in the caller's return address.
        assert_ne!(seen[0], seen[1]);
    }

    /// Walks (fast and reference) from leaf `W`.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_leaf<const W: u8>(fast: &mut [usize], reference: &mut [usize]) -> (usize, usize) {
        let r = capture::capture_with_reference(fast, reference);
        black_box(W);
        black_box(r)
    }

    /// The leaves of [`walk_script`]'s steps, taken in turn by [`stk_deep`] at the leaf (not
    /// passed down: the frames below the leaf hold the same words whichever it is).
    #[cfg(target_arch = "x86_64")]
    static LEAVES: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

    /// Recurses `levels` more frames, then walks from the next leaf of [`LEAVES`].
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stk_deep(levels: usize, fast: &mut [usize], reference: &mut [usize]) -> (usize, usize) {
        let r = if levels > 0 {
            stk_deep(black_box(levels - 1), fast, reference)
        } else if LEAVES.lock().unwrap().pop() == Some(1) {
            stk_leaf::<1>(fast, reference)
        } else {
            stk_leaf::<2>(fast, reference)
        };
        black_box(r)
    }

    /// Walks 40 levels deep from the leaves of `leaves` one after another, all from this one
    /// call site, with nothing of the step in a register across the call (a value held in rbp
    /// there, even a dead one, is saved by the callees and read by the walk: the frames below
    /// would differ in more than the leaf): each stack (checked against framehop alone) and the
    /// frames the walk stepped through rather than took from the memo.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn walk_script(leaves: &[u8]) -> Vec<(Vec<usize>, u64)> {
        *LEAVES.lock().unwrap() = leaves.iter().rev().copied().collect();
        let mut results = Vec::new();
        for _ in 0..leaves.len() {
            let (mut fast, mut reference) = ([0usize; 128], [0usize; 128]);
            let before = dwarf::WALKED.with(|c| c.get());
            let (a, b) = stk_deep(black_box(40), &mut fast, &mut reference);
            let walked = dwarf::WALKED.with(|c| c.get()) - before;
            // (Nothing of the step is kept across the call, so the frames below differ only
            // in what the step chose: a value held in rbp here would reach the words a walk
            // reads through the callees' saved rbp.)
            assert_eq!(&fast[..a], &reference[..b]);
            assert!(a > 3, "only {a} frames");
            results.push((fast[..a].to_vec(), walked));
        }
        results
    }

    /// The memo cliff: a thread's first stack shallow, the next ones deeper. The
    /// memo was replaced only after a full walk, and a deeper walk always matched the shallow
    /// memo near the stack's bottom, so every deeper capture walked all its frames again. Now a
    /// walk that matched after walking frames of its own becomes the memo: a repeated capture
    /// from the same place steps through no frame, a new place through its own frames only,
    /// and every stack is still exactly framehop's.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn deeper_captures_after_a_shallow_first_one_reuse_the_memo() {
        let _serial = one_walk_test_at_a_time();
        std::thread::spawn(|| {
            // This thread's first capture, from a shallow frame.
            let (mut fast, mut reference) = ([0usize; 128], [0usize; 128]);
            let (a, b) = capture::capture_with_reference(&mut fast, &mut reference);
            assert_eq!(&fast[..a], &reference[..b]);
            let r = walk_script(&[
                1, // 1: deeper: walks its 40 frames once...
                1, // 2-4: ...and then never again
                1, 1, //
                2, // 5: another leaf, same frames below: a partial match
                2, // 6: which became the memo
                1, // 7: and back
            ]);
            let r: Vec<_> = [(Vec::new(), 0)].into_iter().chain(r).collect();
            let deep_a = &r[1].0;
            assert!(deep_a.len() > 40);
            assert!(
                r[1].1 >= 40,
                "the first deep capture walked {} frames",
                r[1].1
            );
            for (i, (stack, walked)) in r.iter().enumerate().skip(2).take(3) {
                assert_eq!(stack, deep_a, "capture {i}");
                assert!(
                    *walked <= 1,
                    "repeated deep capture {i} walked {walked} frames"
                );
            }
            let deep_b = &r[5].0;
            assert_ne!(deep_b, deep_a);
            assert_eq!(deep_b.len(), deep_a.len());
            assert!(r[5].1 < 10, "the partial match walked {} frames", r[5].1);
            assert_eq!(&r[6].0, deep_b);
            assert!(
                r[6].1 <= 1,
                "after a partial match, a repeat walked {} frames",
                r[6].1
            );
            assert_eq!(&r[7].0, deep_a);
            assert!(
                r[7].1 < 10,
                "the partial match back walked {} frames",
                r[7].1
            );
        })
        .join()
        .unwrap();
    }

    #[inline(never)]
    fn stk_interned<const W: u8>(
        table: &crate::ledger::StackTable,
        seen: &std::cell::RefCell<Vec<Vec<usize>>>,
    ) -> u32 {
        let id = capture_interned(64, false, table.tag(), |f| {
            seen.borrow_mut().push(f.to_vec());
            table.intern(f).0
        });
        black_box(W);
        black_box(id)
    }

    /// Interns from one place after another of `script` (leaf, table index), all from this
    /// one call site: (id, stacks interned so far) after each.
    #[inline(never)]
    fn intern_script(
        script: &[(u8, usize)],
        tables: &[crate::ledger::StackTable; 2],
        seen: &std::cell::RefCell<Vec<Vec<usize>>>,
    ) -> Vec<(u32, usize)> {
        let mut steps = Vec::new();
        for &(which, t) in black_box(script) {
            let id = if which == 1 {
                stk_interned::<1>(&tables[t], seen)
            } else {
                stk_interned::<2>(&tables[t], seen)
            };
            steps.push((id, seen.borrow().len()));
        }
        steps
    }

    /// `capture_interned` hands back the id kept with the memo only for the very same stack
    /// and the same table; anything else is interned again, and every id names the stack that
    /// was live when it was returned.
    #[test]
    fn interned_ids_are_reused_only_for_the_same_stack_and_table() {
        let _serial = one_walk_test_at_a_time();
        use crate::ledger::{StackId, StackTable};
        use std::cell::RefCell;
        std::thread::spawn(|| {
            let tables = [StackTable::new(), StackTable::new()];
            assert_ne!(tables[0].tag(), tables[1].tag());
            let seen = RefCell::new(Vec::new());
            // (leaf, table).
            let script = [(1, 0), (1, 0), (2, 0), (1, 0), (1, 1), (1, 1)];
            let steps = intern_script(&script, &tables, &seen);
            assert!(steps.iter().all(|s| s.0 != 0));
            let seen = seen.borrow();
            let frames = |step: usize| tables[script[step].1].frames(StackId(steps[step].0));
            // Every id names the stack interned for it.
            assert_eq!(frames(0), seen[0]);
            // The same place: the same id, not interned again (on x86-64, where the memo is).
            assert_eq!(steps[1].0, steps[0].0);
            #[cfg(target_arch = "x86_64")]
            assert_eq!(steps[1].1, 1, "the same stack was interned again");
            // Another place: its own id, its own frames.
            assert_ne!(steps[2].0, steps[0].0);
            assert_eq!(steps[2].1, steps[1].1 + 1);
            assert_eq!(frames(2), seen[steps[2].1 - 1]);
            assert_ne!(frames(2), frames(0));
            // The first place again: interned again, to the same id.
            assert_eq!(steps[3].0, steps[0].0);
            assert_eq!(steps[3].1, steps[2].1 + 1);
            // The same stack for another table: that table's id, interned there.
            assert_eq!(steps[4].1, steps[3].1 + 1);
            assert_eq!(frames(4), frames(0));
            assert_eq!(steps[5].0, steps[4].0);
            assert_eq!(
                capture_interned(0, false, tables[0].tag(), |_| unreachable!()),
                0
            );
        })
        .join()
        .unwrap();
    }

    #[inline(never)]
    fn stk_id_leaf(
        table: &crate::ledger::StackTable,
        seen: &std::cell::RefCell<Vec<Vec<usize>>>,
    ) -> u32 {
        let id = capture_interned(64, false, table.tag(), |f| {
            seen.borrow_mut().push(f.to_vec());
            table.intern(f).0
        });
        black_box(id)
    }

    #[inline(never)]
    fn stk_id_common(
        table: &crate::ledger::StackTable,
        seen: &std::cell::RefCell<Vec<Vec<usize>>>,
    ) -> u32 {
        let id = stk_id_leaf(black_box(table), seen);
        black_box(id)
    }

    /// Two callers of the same shape (see `stk_memo_caller`): the frames below them are the
    /// same, at the same addresses, and only the word holding the return address into one
    /// or the other differs.
    #[inline(never)]
    fn stk_id_caller<const WHICH: u8>(
        table: &crate::ledger::StackTable,
        seen: &std::cell::RefCell<Vec<Vec<usize>>>,
    ) -> u32 {
        let id = stk_id_common(black_box(table), seen);
        black_box(WHICH);
        black_box(id)
    }

    /// The id kept with the memo is handed back, without a walk, only while every word its
    /// stack was read from still holds the same: two callers whose stacks differ in one word
    /// far from the hook, taken in turn from one call site, each get their own stack's id.
    #[test]
    fn a_kept_id_is_not_reused_when_an_outer_return_address_changed() {
        let _serial = one_walk_test_at_a_time();
        use crate::ledger::{StackId, StackTable};
        use std::cell::RefCell;
        type Caller = fn(&StackTable, &RefCell<Vec<Vec<usize>>>) -> u32;
        std::thread::spawn(|| {
            let table = StackTable::new();
            let seen = RefCell::new(Vec::new());
            let callers: [Caller; 2] = [stk_id_caller::<1>, stk_id_caller::<2>];
            let mut ids = [0u32; 2];
            for (i, which) in [0usize, 0, 1, 1, 0, 1, 0, 0].into_iter().enumerate() {
                let interned = seen.borrow().len();
                let id = black_box(callers[which])(&table, &seen);
                assert_ne!(id, 0);
                let again = seen.borrow().len() > interned;
                if ids[which] == 0 {
                    ids[which] = id;
                }
                assert_eq!(id, ids[which], "capture {i} (caller {which})");
                let frames = table.frames(StackId(id));
                assert_eq!(frames, *seen.borrow().last().unwrap(), "capture {i}");
                // A repeat from the same caller reuses the kept id (on x86-64, where the
                // memo is); a change of caller interns again.
                let repeat = i > 0 && [0usize, 0, 1, 1, 0, 1, 0, 0][i - 1] == which;
                #[cfg(target_arch = "x86_64")]
                assert_eq!(again, !repeat, "capture {i}");
                let _ = (again, repeat);
            }
            assert_ne!(ids[0], ids[1]);
            let (a, b) = (table.frames(StackId(ids[0])), table.frames(StackId(ids[1])));
            assert_eq!(a.len(), b.len());
            assert_eq!(a.iter().zip(&b).filter(|(x, y)| x != y).count(), 1);
        })
        .join()
        .unwrap();
    }

    #[cfg(target_arch = "x86_64")]
    /// Compiles `source` into `dir/name` and loads it; returns the handle.
    fn build_and_load(dir: &std::path::Path, name: &str, source: &str) -> *mut libc::c_void {
        load(&build(dir, name, source))
    }

    /// Compiles `source` into `dir/lib{name}.so` without frame pointers, with CFI.
    fn build(dir: &std::path::Path, name: &str, source: &str) -> std::path::PathBuf {
        let src = dir.join(format!("{name}.c"));
        let lib = dir.join(format!("lib{name}.so"));
        std::fs::write(&src, source).unwrap();
        let status = std::process::Command::new("gcc")
            .args([
                "-O2",
                "-fomit-frame-pointer",
                "-g",
                "-shared",
                "-fPIC",
                "-o",
            ])
            .arg(&lib)
            .arg(&src)
            .status()
            .expect("gcc must be installed for this test");
        assert!(status.success());
        lib
    }

    /// `dlopen`s `lib` (`RTLD_NOW | RTLD_LOCAL`), which must load.
    fn load(lib: &std::path::Path) -> *mut libc::c_void {
        let path = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
        // SAFETY: the library just compiled from the test's C source (no initialisers).
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null());
        handle
    }

    /// dlclose, then another library (likely at the same address): no crash without telling
    /// the unwinder; right stacks after `refresh_modules`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn survives_dlclose_and_reload() {
        let _serial = one_walk_test_at_a_time();
        let other = r#"
typedef void (*cb_t)(void *);
volatile int sink2;
__attribute__((noinline)) void d_three(cb_t cb, void *ctx) {
    volatile char pad[200]; pad[0] = 1;
    __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
    cb(ctx); sink2 += pad[0];
}
__attribute__((noinline)) void d_two(cb_t cb, void *ctx) {
    volatile char pad[8]; pad[0] = 1; d_three(cb, ctx); sink2 += pad[0];
}
__attribute__((noinline)) void c_outer(cb_t cb, void *ctx) {
    volatile char pad[120]; pad[0] = 1; d_two(cb, ctx); sink2 += pad[0];
}
"#;
        let dir = tempfile::tempdir().unwrap();
        let h1 = build_and_load(dir.path(), "first", C_SOURCE);
        // SAFETY: dlsym finds `c_outer`, which C_SOURCE defines with COuter's signature.
        let outer1: COuter = unsafe { std::mem::transmute(libc::dlsym(h1, c"c_outer".as_ptr())) };
        let mut st = CbState::new(false, false);
        stk_rust_calls_into_c(outer1, &mut st);
        in_order(
            &names(&symbolize(&st.buf[..st.n])),
            &["c_inner", "c_middle", "c_outer"],
        )
        .unwrap();
        let base1 = outer1 as usize;
        // SAFETY: `outer1` is only printed as an address after this, never called.
        unsafe { libc::dlclose(h1) };

        let h2 = build_and_load(dir.path(), "second", other);
        // SAFETY: `c_outer` of the second source has COuter's signature too.
        let outer2: COuter = unsafe { std::mem::transmute(libc::dlsym(h2, c"c_outer".as_ptr())) };
        eprintln!(
            "c_outer before/after reload: {base1:#x} / {:#x}",
            outer2 as usize
        );
        let mut st = CbState::new(false, false);
        stk_rust_calls_into_c(outer2, &mut st); // must not crash; may be short or wrong
        if std::env::var_os("OOMSHIM_TEST_VERBOSE").is_some() {
            eprintln!("before refresh: {:?}", names(&symbolize(&st.buf[..st.n])));
        }
        refresh_modules();
        let mut st = CbState::new(false, false);
        stk_rust_calls_into_c(outer2, &mut st);
        let names = names(&symbolize(&st.buf[..st.n]));
        in_order(
            &names,
            &["d_three", "d_two", "c_outer", "stk_rust_calls_into_c"],
        )
        .unwrap();
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(h2) };
    }

    /// A library closed while the unwinder's module list still holds it, and another loaded
    /// in its place: glibc maps the new one at the same address and gives it the freed
    /// `struct link_map` (same size: the paths are as long), so that object identity alone
    /// cannot tell the two apart. The first walk through the new library, with no
    /// `refresh_modules`, must use the new library's unwind data, not read the old one's
    /// table over the new bytes (it ended the walk after the innermost C frame).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_library_loaded_where_a_closed_one_was_is_walked_with_its_own_unwind_data() {
        let _serial = one_walk_test_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let closed = build(dir.path(), "closed", C_SAVED_BP);
        let fresh = build(dir.path(), "fresh0", C_SOURCE);
        let base_of = |f: *mut libc::c_void| {
            // SAFETY: `Dl_info` is pointers and integers, for which all zeroes is valid.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: an address inside a loaded library; dladdr only writes `info`.
            let found = unsafe { libc::dladdr(f, &mut info) };
            assert_ne!(found, 0);
            info.dli_fbase as usize
        };
        // The place is reused every time here, the link map about one time in two (it depends
        // on what else the heap holds): go on until it was reused twice.
        let mut same_place = 0;
        for round in 0..200 {
            if same_place == 2 {
                break;
            }
            let h = load(&closed);
            // SAFETY: a live handle; C_SAVED_BP defines `c_outer` with COuter's signature.
            let outer: COuter = unsafe { std::mem::transmute(libc::dlsym(h, c"c_outer".as_ptr())) };
            let mut st = CbState::new(false, false);
            stk_rust_calls_into_c(outer, &mut st); // the module list now holds `closed`
            in_order(&names(&symbolize(&st.buf[..st.n])), &["c_keep", "c_outer"]).unwrap();
            let old = (h as usize, base_of(outer as *mut libc::c_void));
            // SAFETY: nothing of the library is used after this.
            unsafe { libc::dlclose(h) };

            let h = load(&fresh);
            // SAFETY: C_SOURCE defines `c_outer` with COuter's signature.
            let outer: COuter = unsafe { std::mem::transmute(libc::dlsym(h, c"c_outer".as_ptr())) };
            same_place += usize::from((h as usize, base_of(outer as *mut libc::c_void)) == old);
            let mut st = CbState::new(false, false);
            stk_rust_calls_into_c(outer, &mut st);
            in_order(
                &names(&symbolize(&st.buf[..st.n])),
                &["c_inner", "c_middle", "c_outer", "stk_rust_calls_into_c"],
            )
            .map_err(|e| format!("round {round}: {e}"))
            .unwrap();
            // SAFETY: as above.
            unsafe { libc::dlclose(h) };
        }
        // Otherwise this test walked only through libraries the unwinder could tell apart.
        assert!(
            same_place == 2,
            "in 200 rounds glibc did not load the second library in the first one's place and link map twice"
        );
    }
}
