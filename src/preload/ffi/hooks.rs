//! The `oomshim_*` functions programs (and oomshim's Python package and hook) call. The hooked
//! CUDA functions are the tables of [`super::runtime`] and [`super::driver`].

use crate::shim;
use oomshim_host::sys::Guard;
use std::ffi::{c_char, c_int, CStr};

/// The `oomshim_*` functions programs (and oomshim's Python package and hook) call.
pub const PROGRAM_API: &[&str] = &[
    "oomshim_dump",
    "oomshim_step",
    "oomshim_mark_step",
    "oomshim_mark_step_live",
    "oomshim_note_step",
    "oomshim_steps_grow",
    "oomshim_framework_attached",
    "oomshim_framework_oom_wanted",
    "oomshim_framework_oom",
    "oomshim_framework_kinds",
    "oomshim_set_recording",
    "oomshim_recording",
    "oomshim_watch_python_code",
];

/// Lets the shim's Python stacks know a code object by its address once they identified it, for
/// as long as no code object is created or destroyed (CPython 3.12+: a code watcher counts both;
/// see `oomshim_host::pystack::watch_code_objects`): the full check of each frame's code object
/// is then paid once per code object instead of on every allocation. Must be called with the GIL
/// held (oomshim's Python code calls it through `ctypes.PyDLL`). Returns 1 when a watcher counts
/// (again 1 on later calls), 0 when none could be registered (another Python version, the GIL not
/// held, an exception pending, every watcher slot taken: Python stacks then check every frame as
/// before), -1 when the shim is off.
#[no_mangle]
pub extern "C" fn oomshim_watch_python_code() -> c_int {
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    guard
        .run(|| oomshim_host::pystack::watch_code_objects(code_event))
        .map_or(-1, c_int::from)
}

/// The code watcher (`int (*)(PyCodeEvent, PyCodeObject *)`): counts the event and returns 0,
/// which CPython takes as success. Runs under the GIL wherever a code object is created or
/// destroyed; an atomic add, so it cannot fail or panic.
extern "C" fn code_event(_event: i32, _code: *mut std::ffi::c_void) -> i32 {
    oomshim_host::pystack::note_code_event();
    0
}

/// Switches what the shim records from now on: 0 pass-through (the hooks only forward), 1
/// totals (sizes and totals, no stacks), 2 native stacks, 3 all stacks (native and Python), 4
/// Python stacks. Safe at any moment: an allocation made in one mode may be freed in any other.
/// Returns the mode before, or -1 when `mode` is unknown (nothing changes) or the shim is off.
/// For benchmarks that alternate modes inside one process.
#[no_mangle]
pub unsafe extern "C" fn oomshim_set_recording(mode: c_int) -> c_int {
    let Some(mode) = shim::Recording::from_code(mode) else {
        return -1;
    };
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    guard
        .run(|| shim::set_recording(mode))
        .flatten()
        .map_or(-1, |before| before as c_int)
}

/// The recording mode now (the numbers of [`oomshim_set_recording`]), -1 when the shim is off.
#[no_mangle]
pub unsafe extern "C" fn oomshim_recording() -> c_int {
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    guard
        .run(shim::current_recording)
        .flatten()
        .map_or(-1, |m| m as c_int)
}

/// Marks the end of a training step: the shim samples live device bytes per allocation site
/// (see the dump's `growth` key). One walk of the live allocations, off the allocation path:
/// cheap enough for every step.
#[no_mangle]
pub unsafe extern "C" fn oomshim_step() {
    if let Some(guard) = Guard::enter() {
        guard.run(|| shim::step(shim::StepSource::Program, None));
    }
}

/// A step boundary found by `source`: 0 the program itself (the same as `oomshim_step`), 1 an
/// optimizer step, 2 a forward pass of the program's outermost module (the last two are marked by
/// oomshim's Python hook). Other values are ignored. Returns 1 when the process has grown
/// steadily with these steps so far (the hook then asks torch to record where new tensors come
/// from), else 0.
#[no_mangle]
pub unsafe extern "C" fn oomshim_mark_step(source: c_int) -> c_int {
    mark_step(source, None)
}

/// [`oomshim_mark_step`], with the framework's own count of its live tensors at this step
/// (torch's `memory_stats()`: allocated bytes, and the number of allocations, `u64::MAX` when
/// unknown): under preload the shim sees torch's segments, whose cache grows with varying
/// shapes although no tensor is kept; the leak is judged on these.
#[no_mangle]
pub unsafe extern "C" fn oomshim_mark_step_live(
    source: c_int,
    live_bytes: u64,
    live_allocations: u64,
) -> c_int {
    mark_step(
        source,
        Some(shim::FrameworkLive::new(live_bytes, live_allocations)),
    )
}

fn mark_step(source: c_int, live: Option<shim::FrameworkLive>) -> c_int {
    let Some(source) = shim::StepSource::from_code(source) else {
        return 0;
    };
    let Some(guard) = Guard::enter() else {
        return 0;
    };
    guard
        .run(|| {
            shim::step(source, live);
            shim::growing(source)
        })
        .map_or(0, c_int::from)
}

/// [`oomshim_mark_step_live`] without its answer: marks a step of `source` (codes of
/// [`oomshim_mark_step`]) with the framework's figures (`live_bytes` `u64::MAX`: none;
/// `live_allocations` `u64::MAX`: no count). Costs the mark alone: whether the steps grow (a fit
/// over the history) is [`oomshim_steps_grow`], which the Python hook asks less often.
#[no_mangle]
pub unsafe extern "C" fn oomshim_note_step(source: c_int, live_bytes: u64, live_allocations: u64) {
    let live =
        (live_bytes != u64::MAX).then(|| shim::FrameworkLive::new(live_bytes, live_allocations));
    let Some(source) = shim::StepSource::from_code(source) else {
        return;
    };
    if let Some(guard) = Guard::enter() {
        guard.run(|| shim::step(source, live));
    }
}

/// 1 when the process has grown steadily with `source`'s marked steps so far (see
/// [`oomshim_mark_step`]), else 0.
#[no_mangle]
pub unsafe extern "C" fn oomshim_steps_grow(source: c_int) -> c_int {
    let Some(source) = shim::StepSource::from_code(source) else {
        return 0;
    };
    let Some(guard) = Guard::enter() else {
        return 0;
    };
    guard.run(|| shim::growing(source)).map_or(0, c_int::from)
}

/// Whether the out-of-memory error a framework raises now on the calling thread (`request_bytes`
/// on `device`) will get a dump, asked before it gathers its account: 1 yes (the account is
/// wanted), 0 no (a repeat of a dumped failure within `OOMSHIM_MIN_INTERVAL`, or over
/// `OOMSHIM_MAX_DUMPS`: the shim only counts it, and `oomshim_framework_oom` with the request
/// alone is enough), -1 when the shim is off.
#[no_mangle]
pub unsafe extern "C" fn oomshim_framework_oom_wanted(device: c_int, request_bytes: u64) -> c_int {
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    match guard
        .run(|| shim::framework_oom_wanted(device, request_bytes))
        .flatten()
    {
        Some(true) => 1,
        Some(false) => 0,
        None => -1,
    }
}

/// oomshim's Python hook attached to a framework's out-of-memory reporting (torch's OOM
/// observer): failures then wait for the framework's word. `name` is informational.
#[no_mangle]
pub unsafe extern "C" fn oomshim_framework_attached(_name: *const c_char) {
    if let Some(guard) = Guard::enter() {
        guard.run(shim::framework_attached);
    }
}

/// The framework raised its out-of-memory error on the calling thread. `json`/`len`: the
/// framework's account as UTF-8 JSON (schema `oomshim.framework-oom/1`, see
/// `crate::shim::framework`). Returns once the dump that explains the failure is written
/// (bounded): its path is copied into `path_out` (`cap` bytes, NUL-terminated; may be NULL) and
/// 0 is returned when the account is in that dump, 1 when the dump was final before it arrived,
/// 2 when the failure repeats an earlier dumped one, 3 when it is given from inside allocator
/// mode's out-of-memory observer (`oomshim_torch_set_oom_observer`): the account joins the dump
/// written when the observer returns, whose path is not known yet (`path_out` is empty); -1 when
/// no dump explains the failure.
#[no_mangle]
pub unsafe extern "C" fn oomshim_framework_oom(
    json: *const c_char,
    len: usize,
    path_out: *mut c_char,
    cap: usize,
) -> c_int {
    if json.is_null() || len > shim::MAX_FRAMEWORK_WORD_BYTES {
        return -1;
    }
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    // SAFETY: the caller passes `len` readable bytes at `json` (this function's contract); NULL
    // was refused above and `len` is bounded, so the slice cannot exceed what it handed over.
    let bytes = unsafe { std::slice::from_raw_parts(json.cast::<u8>(), len) };
    let path = guard.run(|| shim::framework_oom(bytes)).flatten();
    match path {
        Some((p, word)) => {
            if !path_out.is_null() && cap > 0 {
                let text = p.to_string_lossy();
                let n = text.len().min(cap - 1);
                // SAFETY: `path_out` is non-NULL and writable for `cap` bytes (this function's
                // contract); `n + 1 <= cap`, and a Rust string cannot overlap the caller's buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(text.as_ptr(), path_out.cast::<u8>(), n);
                    *path_out.add(n) = 0;
                }
            }
            word as c_int
        }
        None => -1,
    }
}

/// The framework's memory by kind now (oomshim's Python hook counts it at an optimizer step, at
/// most every `LIVE_KINDS_EVERY_S` seconds): `{"device": N, "kinds": {...}}` as UTF-8 JSON, with
/// `"attribution"` (torch's records of where the live tensors were allocated) while torch's
/// history is on. It goes into the live region for `oomshim top`, the exporter and a post-mortem. Returns 0 when taken, -1 when
/// not (not such JSON, or the shim is off).
#[no_mangle]
pub unsafe extern "C" fn oomshim_framework_kinds(json: *const c_char, len: usize) -> c_int {
    if json.is_null() || len > shim::MAX_FRAMEWORK_WORD_BYTES {
        return -1;
    }
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    // SAFETY: the caller passes `len` readable bytes at `json` (this function's contract); NULL
    // was refused above.
    let bytes = unsafe { std::slice::from_raw_parts(json.cast::<u8>(), len) };
    let taken = guard.run(|| shim::framework_kinds(bytes));
    match taken.flatten() {
        Some(()) => 0,
        None => -1,
    }
}

/// Writes a dump now. `reason` (may be NULL) is recorded in the dump's `reason` key.
/// Returns 0 when a dump was written, -1 otherwise (the reason is printed on stderr).
#[no_mangle]
pub unsafe extern "C" fn oomshim_dump(reason: *const c_char) -> c_int {
    let Some(guard) = Guard::enter() else {
        return -1;
    };
    let reason = if reason.is_null() {
        "on-demand".to_string()
    } else {
        // SAFETY: a non-NULL `reason` is a NUL-terminated string the caller keeps alive for the
        // call (this function's contract).
        shim::dump_reason(unsafe { CStr::from_ptr(reason) }.to_bytes())
    };
    let written = guard.run(|| shim::dump_on_demand(&reason));
    match written {
        Some(true) => 0,
        _ => -1,
    }
}
