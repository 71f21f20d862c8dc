//! Native stack capture for the hot path (inside every hooked allocation call): the entry
//! points, the per-thread state and its re-entrancy guard, and the frame-pointer walk.
//!
//! x86-64: in-process DWARF CFI unwinding, in [`super::dwarf`] (module snapshot from
//! `dl_iterate_phdr`, `framehop` over the mapped `.eh_frame`, a per-thread compact-rule table in
//! front of it).
//!
//! Stack reads are confined to `[sp, top of this thread's stack)` ([`super::regs::read_bounded`]),
//! so a wrong rule can end a walk early but never fault, and every step must move sp strictly
//! up, so a walk always ends.
//!
//! Other architectures: a bounded, validated frame-pointer walk (no CFI).

use std::cell::Cell;

#[cfg(target_arch = "x86_64")]
use super::dwarf;
use super::regs::{read_bounded, read_regs, Regs};

thread_local! {
    /// This thread's capture slot: one `const`, drop-free thread-local, so that a capture
    /// looks up one thread-local (a call into the loader in a shared library) and testing the
    /// busy flag never runs lazy thread-local initialisation (signal handlers may land
    /// anywhere, including inside that initialisation).
    static SLOT: Slot = const {
        Slot {
            busy: Cell::new(false),
            state: Cell::new(std::ptr::null_mut()),
        }
    };
    /// Frees this thread's state when the thread exits; touched once per thread, when the
    /// state is made.
    static OWNER: StateOwner = const { StateOwner };
}

struct Slot {
    /// Set while this thread is inside [`capture`] (or anything else run by [`while_busy`]).
    busy: Cell<bool>,
    /// This thread's state: null before its first capture, [`GONE`] once freed at thread exit.
    state: Cell<*mut ThreadState>,
}

/// [`Slot::state`] after the thread's destructors freed it: captures then return 0, as they
/// do when thread-locals are gone.
const GONE: *mut ThreadState = std::ptr::dangling_mut();

struct StateOwner;

impl Drop for StateOwner {
    fn drop(&mut self) {
        let _ = SLOT.try_with(|slot| {
            // Marked busy meanwhile: a capture from a signal handler landing here returns 0.
            let was_busy = slot.busy.replace(true);
            let state = slot.state.replace(GONE);
            if !state.is_null() && state != GONE {
                // SAFETY: made by `Box::into_raw` in `thread_state` on this thread, freed only
                // here, once (the slot holds GONE from now on); no capture runs on this thread
                // while its destructors do, and a signal handler's is refused (busy).
                drop(unsafe { Box::from_raw(state) });
            }
            slot.busy.set(was_busy);
        });
    }
}

/// This thread's state, made on first use; `None` once the thread's destructors ran (or the
/// state cannot be freed at exit: it is then not made). Valid until the thread's
/// `StateOwner` frees it, which marks the slot GONE first.
#[inline(always)]
fn thread_state(slot: &Slot) -> Option<*mut ThreadState> {
    let mut state = slot.state.get();
    if state.is_null() {
        state = new_thread_state();
        slot.state.set(state);
    }
    (state != GONE).then_some(state)
}

#[cold]
#[inline(never)]
fn new_thread_state() -> *mut ThreadState {
    // Registers the destructor that frees the state; refused once the thread's destructors
    // ran (then nothing is made).
    if OWNER.try_with(|_| ()).is_err() {
        return GONE;
    }
    Box::into_raw(ThreadState::new())
}

#[cfg(test)]
thread_local! {
    /// Test hook run inside `capture` while the thread is marked busy (re-entrancy test).
    pub(crate) static TEST_REENTER: Cell<Option<fn()>> = const { Cell::new(None) };
}

/// Per-thread state: stack bounds, and on x86-64 the framehop rule cache and the module snapshot.
struct ThreadState {
    /// Highest address (exclusive) of this thread's stack; 0 when unknown (capture then yields 0).
    stack_hi: u64,
    /// Where [`capture_interned`] walks: the caller gets an id, never the frames, so no buffer
    /// of its own is zeroed on every call.
    frames: Box<[usize; oomshim_core::config::MAX_DEPTH]>,
    #[cfg(target_arch = "x86_64")]
    dwarf: dwarf::ThreadUnwinder,
}

impl ThreadState {
    fn new() -> Box<ThreadState> {
        Box::new(ThreadState {
            stack_hi: thread_stack_top().unwrap_or(0),
            frames: Box::new([0; oomshim_core::config::MAX_DEPTH]),
            #[cfg(target_arch = "x86_64")]
            dwarf: dwarf::ThreadUnwinder::new(),
        })
    }
}

/// Top (highest address, exclusive) of the calling thread's stack, from `pthread_getattr_np`.
/// For the main thread glibc reads /proc/self/maps here: done once per thread.
fn thread_stack_top() -> Option<u64> {
    // SAFETY: plain libc calls on a zeroed attribute object that we destroy afterwards.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() || size == 0 {
            return None;
        }
        (addr as u64).checked_add(size as u64)
    }
}

/// Runs `f` with this thread marked busy, unless it already is (re-entry, e.g. from a signal
/// handler: `None`) or its thread-locals are gone (thread exit: `None`). A panic in `f` is
/// caught (`None`); it never crosses into the host program.
#[inline(always)]
fn while_busy<R>(f: impl FnOnce() -> R) -> Option<R> {
    SLOT.try_with(|slot| while_busy_in(slot, |_| f()))
        .ok()
        .flatten()
}

/// [`while_busy`] with the slot at hand, passed on to `f`.
#[inline(always)]
fn while_busy_in<R>(slot: &Slot, f: impl FnOnce(&Slot) -> R) -> Option<R> {
    if slot.busy.replace(true) {
        return None;
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(slot))).ok();
    slot.busy.set(false);
    r
}

/// Runs `f` with this thread's state (created on first use), inside [`while_busy`]; the
/// default (0) when that refuses or the state is gone. One thread-local lookup.
#[inline(always)]
fn with_thread_state<R: Default>(f: impl FnOnce(&mut ThreadState) -> R) -> R {
    SLOT.try_with(|slot| {
        while_busy_in(slot, |slot| {
            let st = thread_state(slot)?;
            // SAFETY: this thread's live state (`thread_state`: never null); the busy flag,
            // held here, makes this the only reference to it until `f` returns.
            let st = unsafe { &mut *st };
            #[cfg(test)]
            if let Some(hook) = TEST_REENTER.with(|h| h.get()) {
                hook();
            }
            Some(f(st))
        })
        .flatten()
        .unwrap_or_default()
    })
    .unwrap_or_default()
}

/// Writes the calling thread's return addresses, innermost first, into `out`; returns how many.
///
/// Every entry is a *return address* (the instruction after a call): `out[0]` is the return
/// address into the function that called `capture` (or, with `skip_own_module`, into the first
/// function outside the object that contains `capture`, i.e. the caller of the shim's hook).
/// Symbolise `addr - 1` to name the call line ([`super::symbolize`] does).
///
/// With `skip_own_module`, leading frames whose pc lies inside the object that contains this
/// function (liboomshim.so when loaded as the shim) are skipped, so the stack starts at the
/// caller of the hook.
///
/// Never panics, never faults on a bad unwind (all stack reads are bounds-checked against this
/// thread's stack), allocates only on a thread's first call and when the module list must be
/// rebuilt. Returns 0 when called re-entrantly on one thread (e.g. from a signal handler that
/// interrupted a capture), during thread exit, or if the stack bounds are unknown.
#[inline(never)]
pub fn capture(out: &mut [usize], skip_own_module: bool) -> usize {
    if out.is_empty() {
        return 0;
    }
    // Registers of *this* frame: the walk starts here and is still valid while `capture` has
    // not returned (everything at or above this sp is left untouched by the callees below).
    let regs = read_regs!();
    with_thread_state(|st| walk(st, regs, out, skip_own_module))
}

/// The calling thread's stack (at most `depth` frames, as [`capture`] would write them),
/// interned: returns `intern(frames)`, the id the caller's table gives the frames. When the
/// stack is exactly the one this thread captured last for the same table (`tag`, unique to
/// the table: its [`crate::ledger::StackTable::tag`]) and nothing it depends on changed, the
/// id stored with that capture is returned without calling `intern` (no hashing, no lock).
/// 0 when [`capture`] would return 0 (and `intern` is not called then), or `depth` is 0.
#[inline(never)]
pub fn capture_interned(
    depth: usize,
    skip_own_module: bool,
    tag: u64,
    intern: impl FnOnce(&[usize]) -> u32,
) -> u32 {
    let depth = depth.min(oomshim_core::config::MAX_DEPTH);
    if depth == 0 {
        return 0;
    }
    let regs = read_regs!();
    with_thread_state(|st| {
        let ThreadState {
            stack_hi,
            frames,
            #[cfg(target_arch = "x86_64")]
            dwarf,
        } = st;
        let out = &mut frames[..depth];
        #[cfg(target_arch = "x86_64")]
        let (n, memo) = dwarf.capture(regs, *stack_hi, out, skip_own_module, tag);
        #[cfg(not(target_arch = "x86_64"))]
        let (n, memo) = (fp_walk(regs.sp, regs.fp, *stack_hi, out), Memo::Other);
        if n == 0 {
            return 0;
        }
        match memo {
            Memo::Known(id) => id,
            Memo::Exact => {
                let id = intern(&out[..n]);
                #[cfg(target_arch = "x86_64")]
                dwarf.remember_id(tag, id);
                id
            }
            Memo::Other => intern(&out[..n]),
        }
    })
}

/// Test only: one register snapshot, walked twice: by [`capture`]'s two-level walk into `fast`
/// and by framehop alone (every frame through framehop's rule evaluation) into `reference`.
#[cfg(all(test, target_arch = "x86_64"))]
#[inline(never)]
pub(crate) fn capture_with_reference(
    fast: &mut [usize],
    reference: &mut [usize],
) -> (usize, usize) {
    let regs = read_regs!();
    let mut r = (0, 0);
    with_thread_state(|st| {
        r.0 = st.dwarf.capture(regs, st.stack_hi, fast, false, 0).0;
        r.1 = st.dwarf.reference_walk(regs, st.stack_hi, reference);
        0
    });
    r
}

/// A bounded, validated frame-pointer walk (`[fp] = caller fp`, `[fp + 8] = return address`).
/// Correct only through code that keeps frame pointers; kept as the fallback on non-x86-64
/// targets and as a speed baseline. Same output convention and safety as [`capture`].
#[inline(never)]
pub fn capture_frame_pointers(out: &mut [usize]) -> usize {
    if out.is_empty() {
        return 0;
    }
    let regs = read_regs!();
    with_thread_state(|st| fp_walk(regs.sp, regs.fp, st.stack_hi, out))
}

fn fp_walk(sp: u64, mut fp: u64, hi: u64, out: &mut [usize]) -> usize {
    if hi < sp.saturating_add(16) {
        return 0;
    }
    let mut n = 0;
    while n < out.len() {
        if fp < sp || !fp.is_multiple_of(8) || fp > hi - 16 {
            break;
        }
        let (Ok(next), Ok(ret)) = (read_bounded(fp, sp, hi), read_bounded(fp + 8, sp, hi)) else {
            break;
        };
        if ret == 0 {
            break;
        }
        out[n] = ret as usize;
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// Rebuilds the list of loaded objects the unwinder knows, now. `capture` does this by itself on
/// first use and when it meets a pc inside an object loaded later; calling it at shim start and
/// after a hooked `dlopen` returns moves that cost (and the loader lock `dl_iterate_phdr` takes)
/// out of the allocation path. Never call it from a signal handler.
pub fn refresh_modules() {
    // Marked busy so that a capture in a signal handler landing here returns 0 instead of
    // waiting for the lock this holds.
    #[cfg(target_arch = "x86_64")]
    let _ = while_busy(dwarf::publish_new_snapshot);
}

/// `fork` prepare handler (see `crate::sys::register_fork_handlers`): takes the module
/// snapshot's lock, with this thread marked busy meanwhile (a capture from a signal handler on
/// it returns nothing rather than wait for the lock it holds).
pub fn fork_prepare() {
    let _ = SLOT.try_with(|s| s.busy.set(true));
    #[cfg(target_arch = "x86_64")]
    dwarf::fork_prepare();
}

/// `fork` parent and child handler: releases what [`fork_prepare`] took.
pub fn fork_release() {
    #[cfg(target_arch = "x86_64")]
    dwarf::fork_release();
    let _ = SLOT.try_with(|s| s.busy.set(false));
}

/// What a walk's output is to the thread's walk memo (see `dwarf::MemoOutcome`).
#[cfg(target_arch = "x86_64")]
use dwarf::MemoOutcome as Memo;
#[cfg(not(target_arch = "x86_64"))]
enum Memo {
    #[allow(dead_code)]
    Known(u32),
    #[allow(dead_code)]
    Exact,
    Other,
}

#[cfg(target_arch = "x86_64")]
fn walk(st: &mut ThreadState, regs: Regs, out: &mut [usize], skip_own: bool) -> usize {
    st.dwarf.capture(regs, st.stack_hi, out, skip_own, 0).0
}

#[cfg(not(target_arch = "x86_64"))]
fn walk(st: &mut ThreadState, regs: Regs, out: &mut [usize], skip_own: bool) -> usize {
    // Frame-pointer only (no CFI unwinder here); `skip_own_module` is not implemented: the
    // shim's own frames stay at the top of the stack on these targets.
    let _ = skip_own;
    fp_walk(regs.sp, regs.fp, st.stack_hi, out)
}
