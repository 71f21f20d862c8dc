//! Python stacks of the allocating thread, read without the GIL.
//!
//! PyTorch releases the GIL before it dispatches an op, so the thread that reaches `cudaMalloc`
//! does not hold it, and taking it there can deadlock (the caller holds the allocator's mutex).
//! But that thread's own Python frames are frozen while it runs native code, so they can be read
//! directly, like py-spy does from outside, without the GIL and without touching a reference
//! count:
//!
//! - Everything is found at run time with `dlsym(RTLD_DEFAULT, …)`: `Py_GetVersion`,
//!   `PyGILState_GetThisThreadState` (the calling thread's state, whether or not it holds the
//!   GIL), `PyCode_Type`, `PyFrame_Type`, `_PyRuntime`. libpython is never linked. A process
//!   without Python pays one failed lookup, once ([`init`]).
//! - The frame chain is walked with per-version offsets: CPython 3.9 and 3.10 (`tstate->frame`,
//!   a chain of `PyFrameObject`s), 3.11 and 3.12 (`tstate->cframe->current_frame`, a chain of
//!   `_PyInterpreterFrame`s), 3.13 from the `_Py_DebugOffsets` the runtime publishes at the start
//!   of `_PyRuntime`. Other versions (3.14+, free-threaded builds, ≤ 3.8) give no Python stack.
//!   The 3.11, 3.12 and 3.13 frame layouts are also constants with a walk loop each, taken when
//!   the running interpreter's offsets are those (`FrameLoop`): offsets folded into the loop cost
//!   about 50 instructions a frame where reading them from the layout cost about 80.
//! - Per frame the hot path keeps only (code object id, bytecode offset). A code object is
//!   identified by its address *and* a fingerprint of its contents (name, file name, first line,
//!   line table: pointers, lengths and leading/trailing bytes), and resolved — names copied, line
//!   table copied — the first time that (address, fingerprint) is seen, while it is certainly
//!   alive. A code object freed and another created at the same address with a different name,
//!   file or table therefore gets a new id: an old allocation is never reported with the new
//!   code's names. Lines are decoded from the copied table when a dump is written.
//! - On CPython 3.12 and 3.13 oomshim's Python code registers a code watcher
//!   ([`watch_code_objects`]) that counts every code object created or destroyed. While that
//!   count stands no code object was freed, so one this thread identified by its fingerprint is
//!   known by its address alone: a frame then costs a few reads instead of a dozen (about 5x
//!   fewer instructions for a 32-frame stack; benches/hook_instructions.rs).
//! - Every read is validated: plausible, aligned addresses; the code object's type must be
//!   `PyCode_Type`; string and table lengths are bounded. A thread's first walk goes through the
//!   kernel ([`mem::Checked`]), so a wrong layout yields "no Python stack" and turns Python stacks
//!   off for the process, never a fault. Later walks read directly once that walk found a frame,
//!   or read the thread's state without fault after a walk on any thread found one
//!   (`ThreadWalk`).
//! - A thread keeps its last stack with the id it was interned to ([`capture_interned`]): the
//!   same frames again are neither hashed nor looked up.
//! - Frames owned by the C stack (3.12+ entry shims) are skipped and mark the boundary between
//!   two native `_PyEval_EvalFrameDefault` calls, as `is_entry` does in 3.11, so a dump can put
//!   each group of Python frames where its eval frame is in the native stack. At most
//!   [`MAX_PY_FRAMES`] frames are kept, innermost first.

mod linetable;
mod mem;

pub use linetable::{line_for, LineFormat};

use crate::sys::fn_ptr::FnPtr;
use mem::{Checked, Direct, FrameOffsets, Mem};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Python frames kept per stack, innermost first.
pub const MAX_PY_FRAMES: usize = 128;

/// Longest string or line table copied from a code object.
const MAX_STR: usize = 4096;
const MAX_TABLE: usize = 1 << 20;

/// Packed frame: bit 63 = last (outermost) frame of its eval-loop call; bits 32–62 = code id;
/// bits 0–31 = byte offset of the executing instruction (`NO_OFFSET` when unknown).
const GROUP_END: usize = 1 << 63;
const NO_OFFSET: u32 = u32::MAX;

/// Which frame chain a version has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chain {
    /// ≤ 3.10: `PyFrameObject`s linked by `f_back`.
    FrameObjects(FrameObjectShape),
    /// ≥ 3.11: `_PyInterpreterFrame`s linked by `previous`.
    Interpreter(FrameShape),
}

/// How a ≤ 3.10 chain of `PyFrameObject`s is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameObjectShape {
    /// `f_back`.
    previous: usize,
    /// `f_code`.
    code: usize,
    /// `f_lasti`, in bytes (3.9) or code units (3.10, `lasti_units`).
    lasti: usize,
    lasti_units: bool,
}

/// How a 3.11+ chain of `_PyInterpreterFrame`s is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameShape {
    /// `previous`, `f_code`, `prev_instr`/`instr_ptr`, `owner` and (3.11) `is_entry`; later
    /// versions mark entries with C-stack-owned frames.
    offsets: FrameOffsets,
    /// Owner value of C-stack shim frames (3.12+: 3); None in 3.11.
    cstack_owner: Option<u8>,
    /// Offset of `_co_firsttraceable` (frames not yet past it are incomplete: skipped).
    firsttraceable: Option<usize>,
    code_adaptive: usize,
}

/// A layout known when the shim is built: a field past [`mem::FRAME_BYTES`] fails the build.
const fn known(offsets: Option<FrameOffsets>) -> FrameOffsets {
    match offsets {
        Some(o) => o,
        None => panic!("a frame field lies past FRAME_BYTES"),
    }
}

/// CPython 3.11's frames. The walk takes this constant (not the copy in the layout) so that its
/// offsets and options fold into the loop: about a third fewer instructions a frame.
const FRAMES_311: FrameShape = FrameShape {
    offsets: known(FrameOffsets::new(48, 32, 56, 69, Some(68))),
    cstack_owner: None,
    firsttraceable: Some(168),
    code_adaptive: 184,
};

/// CPython 3.12's frames (see [`FRAMES_311`]).
const FRAMES_312: FrameShape = FrameShape {
    offsets: known(FrameOffsets::new(8, 0, 56, 70, None)),
    cstack_owner: Some(3),
    firsttraceable: Some(176),
    code_adaptive: 192,
};

/// CPython 3.13's frames in its default build, as its debug offsets give them: the walk takes
/// this constant when the running interpreter's offsets are these (see [`FRAMES_311`]).
const FRAMES_313: FrameShape = FrameShape {
    offsets: known(FrameOffsets::new(8, 0, 56, 70, None)),
    cstack_owner: Some(3),
    firsttraceable: None,
    code_adaptive: 200,
};

/// Which loop walks a 3.11+ frame chain: one of those compiled for a [`FrameShape`] known when
/// built (its offsets and options folded in), or the one that reads them from the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameLoop {
    Fixed311,
    Fixed312,
    Fixed313,
    FromLayout,
}

impl FrameLoop {
    fn of(shape: &FrameShape) -> FrameLoop {
        match *shape {
            s if s == FRAMES_311 => FrameLoop::Fixed311,
            s if s == FRAMES_312 => FrameLoop::Fixed312,
            s if s == FRAMES_313 => FrameLoop::Fixed313,
            _ => FrameLoop::FromLayout,
        }
    }
}

/// Offsets for one interpreter version (x86-64/aarch64, default build).
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// `Some(off)`: the current frame is at `*(*(tstate + off) + cframe_current)` (3.11/3.12);
    /// `None`: at `*(tstate + frame)` (≤ 3.10 and 3.13).
    cframe: Option<usize>,
    cframe_current: usize,
    frame: usize,
    chain: Chain,
    co_filename: usize,
    /// `co_qualname` from 3.11, `co_name` before.
    co_name: usize,
    co_firstlineno: usize,
    co_linetable: usize,
    line_format: LineFormat,
    ob_type: usize,
    /// `sizeof(PyASCIIObject)`; `sizeof(PyCompactUnicodeObject)`.
    ascii_size: usize,
    compact_size: usize,
    /// Offset of `PyCompactUnicodeObject.utf8` (after `utf8_length`).
    str_state: usize,
    str_length: usize,
    bytes_sval: usize,
    var_size: usize,
}

/// The interpreter found in this process.
struct Interp {
    version: (u32, u32),
    get_tstate: unsafe extern "C" fn() -> *mut c_void,
    code_type: usize,
    /// `PyFrame_Type` for ≤ 3.10 (frame objects are type-checked); 0 otherwise.
    frame_type: usize,
    layout: Layout,
    /// How a 3.11+ chain is walked (`FromLayout` before 3.11, where it is not used).
    frame_loop: FrameLoop,
}

static INTERP: OnceLock<Option<Interp>> = OnceLock::new();
/// Set when a checked walk proved the layout wrong: Python stacks stay off for the process.
static BROKEN: AtomicBool = AtomicBool::new(false);

fn lookup(name: &CStr) -> usize {
    // SAFETY: NUL-terminated name; RTLD_DEFAULT searches the global scope.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// Looks for a supported CPython in the process, once. Cheap to call again.
pub fn init() -> bool {
    INTERP.get_or_init(find_interp).is_some()
}

/// True when [`capture_interned`] can find Python frames in this process: one atomic load, so callers
/// skip even preparing a buffer in a process without Python.
#[inline]
pub fn active() -> bool {
    matches!(INTERP.get(), Some(Some(_))) && !BROKEN.load(Ordering::Relaxed)
}

/// `CPython 3.11` when Python stacks can be read in this process.
pub fn interpreter() -> Option<String> {
    let i = INTERP.get()?.as_ref()?;
    (!BROKEN.load(Ordering::Relaxed)).then(|| format!("CPython {}.{}", i.version.0, i.version.1))
}

fn find_interp() -> Option<Interp> {
    // The one lookup a process without Python pays.
    let get_tstate = lookup(c"PyGILState_GetThisThreadState");
    if get_tstate == 0 {
        return None;
    }
    let version = version()?;
    let code_type = lookup(c"PyCode_Type");
    if code_type == 0 {
        return None;
    }
    let layout = match version {
        (3, 13) => debug_offsets_313()?,
        _ => built_in_layout(version)?,
    };
    let frame_type = if version.1 <= 10 {
        let t = lookup(c"PyFrame_Type");
        if t == 0 {
            return None;
        }
        t
    } else {
        0
    };
    // SAFETY: the symbol is PyGILState_GetThisThreadState, `PyThreadState *(void)` in every
    // version; it reads a thread-specific key and is safe to call without the GIL.
    let get_tstate = unsafe { <unsafe extern "C" fn() -> *mut c_void>::from_addr(get_tstate) }?;
    Some(Interp {
        version,
        get_tstate,
        code_type,
        frame_type,
        layout,
        frame_loop: match layout.chain {
            Chain::Interpreter(shape) => FrameLoop::of(&shape),
            Chain::FrameObjects(_) => FrameLoop::FromLayout,
        },
    })
}

/// The offsets of a version whose layout is written here (3.9 to 3.12); None for others (3.13
/// publishes its own, [`debug_offsets_313`]).
fn built_in_layout(version: (u32, u32)) -> Option<Layout> {
    Some(match version {
        (3, 9) | (3, 10) => {
            let (lasti, lasti_units, co_linetable, line_format) = if version.1 == 9 {
                (104, false, 120, LineFormat::Lnotab)
            } else {
                (96, true, 120, LineFormat::Linetable310)
            };
            Layout {
                cframe: None,
                cframe_current: 0,
                frame: 24,
                chain: Chain::FrameObjects(FrameObjectShape {
                    previous: 24,
                    code: 32,
                    lasti,
                    lasti_units,
                }),
                co_filename: 104,
                co_name: 112,
                co_firstlineno: 40,
                co_linetable,
                line_format,
                ob_type: 8,
                ascii_size: 48,
                compact_size: 72,
                str_state: 32,
                str_length: 16,
                bytes_sval: 32,
                var_size: 16,
            }
        }
        (3, 11) => Layout {
            cframe: Some(56),
            cframe_current: 8,
            frame: 0,
            chain: Chain::Interpreter(FRAMES_311),
            co_filename: 112,
            co_name: 128,
            co_firstlineno: 72,
            co_linetable: 136,
            line_format: LineFormat::Locations,
            ob_type: 8,
            ascii_size: 48,
            compact_size: 72,
            str_state: 32,
            str_length: 16,
            bytes_sval: 32,
            var_size: 16,
        },
        (3, 12) => Layout {
            cframe: Some(56),
            cframe_current: 0,
            frame: 0,
            chain: Chain::Interpreter(FRAMES_312),
            co_filename: 112,
            co_name: 128,
            co_firstlineno: 68,
            co_linetable: 136,
            line_format: LineFormat::Locations,
            ob_type: 8,
            ascii_size: 40,
            compact_size: 56,
            str_state: 32,
            str_length: 16,
            bytes_sval: 32,
            var_size: 16,
        },
        _ => return None,
    })
}

/// (major, minor) from `Py_GetVersion()` ("3.11.7 (main, …)").
fn version() -> Option<(u32, u32)> {
    let f = lookup(c"Py_GetVersion");
    if f == 0 {
        return None;
    }
    // SAFETY: `const char *Py_GetVersion(void)` returns a static string in every version.
    let s = unsafe {
        let f = <unsafe extern "C" fn() -> *const c_char>::from_addr(f)?;
        let p = f();
        if p.is_null() {
            return None;
        }
        CStr::from_ptr(p)
    };
    let s = s.to_str().ok()?;
    let v = s.split_whitespace().next()?;
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor: String = it
        .next()?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some((major, minor.parse().ok()?))
}

/// 3.13: offsets from `_PyRuntime.debug_offsets` (`_Py_DebugOffsets`, stable within 3.13.x;
/// its own layout changes between minor versions, so it is read as 3.13's).
fn debug_offsets_313() -> Option<Layout> {
    let rt = lookup(c"_PyRuntime");
    if rt == 0 {
        return None;
    }
    const WORDS: usize = 73;
    let mut buf = [0u8; WORDS * 8];
    if !Checked.bytes(rt, &mut buf) {
        return None;
    }
    let w = |i: usize| u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap()) as usize;
    if &buf[..8] != b"xdebugpy" {
        return None;
    }
    let hex = w(1);
    if (hex >> 24, (hex >> 16) & 0xff) != (3, 13) || w(2) != 0 {
        return None; // another version's table, or a free-threaded build
    }
    let small = |v: usize| (v < 4096).then_some(v);
    let ascii_size = small(w(70))?;
    Some(Layout {
        cframe: None,
        cframe_current: 0,
        frame: small(w(23))?,
        chain: Chain::Interpreter(FrameShape {
            offsets: FrameOffsets::new(
                small(w(29))?,
                small(w(30))?,
                small(w(31))?,
                small(w(33))?,
                None,
            )?,
            cstack_owner: Some(3),
            firsttraceable: None,
            code_adaptive: small(w(43))?,
        }),
        co_filename: small(w(35))?,
        co_name: small(w(37))?,
        co_firstlineno: small(w(39))?,
        co_linetable: small(w(38))?,
        line_format: LineFormat::Locations,
        ob_type: small(w(45))?,
        ascii_size,
        compact_size: ascii_size + 16,
        str_state: small(w(68))?,
        str_length: small(w(69))?,
        bytes_sval: 32,
        var_size: 16,
    })
}

/// Identity of a code object as seen: its address plus a fingerprint of its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct CodeKey {
    code: usize,
    filename: usize,
    name: usize,
    linetable: usize,
    firstlineno: i32,
    name_len: u32,
    name_head: u64,
    file_len: u32,
    file_tail: u64,
    table_len: u32,
}

/// What a code object said when first seen.
struct CodeInfo {
    key: CodeKey,
    function: String,
    file: String,
    first_line: i32,
    table: Box<[u8]>,
}

#[derive(Default)]
struct CodeTable {
    ids: FxHashMap<CodeKey, u32>,
    codes: Vec<CodeInfo>,
}

static CODES: Mutex<CodeTable> = Mutex::new(CodeTable {
    ids: FxHashMap::with_hasher(rustc_hash::FxBuildHasher),
    codes: Vec::new(),
});

fn codes() -> std::sync::MutexGuard<'static, CodeTable> {
    CODES.lock().unwrap_or_else(|e| e.into_inner())
}

crate::fork_held! {
    /// The code table's lock, held by the forking thread across `fork` (see [`crate::sys::fork`]).
    static FORK_HELD: std::sync::MutexGuard<'static, CodeTable>;
}

/// `fork` prepare handler: takes the code table's lock.
pub fn fork_prepare() {
    FORK_HELD.hold(codes());
}

/// `fork` parent and child handler: releases it.
pub fn fork_release() {
    FORK_HELD.release();
}

/// Slots of a thread's code-id cache (direct-mapped by code address).
const LOCAL_SLOTS: usize = 256;

/// A generation no walk has: a slot stamped with it is never taken on its address alone.
const UNWATCHED: u64 = u64::MAX;
/// What a walk without a code watcher compares slots' stamps with: no slot holds it (slots are
/// stamped `UNWATCHED` or with a count of code events, which never gets this far), so no code is
/// known by its address alone, and the loop needs one comparison for that instead of two.
const NO_STAMP: u64 = u64::MAX - 1;

/// One slot of a thread's code-id cache: the full key, the id, and the value of
/// [`CODE_EVENTS`] when the key was last checked (`UNWATCHED` when no watcher ran then).
#[derive(Clone, Copy)]
struct Slot {
    key: CodeKey,
    id: u32,
    /// The code object's `_co_firsttraceable` (3.11+; 0 before): fixed when it is created.
    first_traceable: u32,
    seen: u64,
}

/// A thread's code ids, looked up without a lock or a hash-map probe. A slot holds the full key,
/// so a hit is exact; a collision just replaces the slot. `now` is [`CODE_EVENTS`] as read at the
/// start of the current walk (`UNWATCHED` without a code watcher), what slots are stamped with;
/// `known` is what a slot's stamp must equal for its code to be known by address (`now`, or
/// [`NO_STAMP`] without a watcher). Set both with [`LocalCache::start`].
struct LocalCache {
    /// A fixed length, so that an index reduced modulo it needs no bounds check in the walk.
    slots: Box<[Slot; LOCAL_SLOTS]>,
    now: u64,
    known: u64,
}

impl LocalCache {
    fn new() -> Self {
        let empty = Slot {
            key: CodeKey::default(),
            id: 0,
            first_traceable: 0,
            seen: UNWATCHED,
        };
        LocalCache {
            slots: Box::new([empty; LOCAL_SLOTS]),
            now: UNWATCHED,
            known: NO_STAMP,
        }
    }

    /// Starts a walk in generation `now` ([`UNWATCHED`] without a code watcher).
    fn start(&mut self, now: u64) {
        self.now = now;
        self.known = if now == UNWATCHED { NO_STAMP } else { now };
    }

    fn slot(code: usize) -> usize {
        ((code as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % LOCAL_SLOTS
    }

    /// The id of the code object at `code` when its key was checked in this generation: no code
    /// object was created or destroyed since, so the object at that address is the one checked
    /// (a code watcher counts every such event). Never without a watcher.
    #[inline(always)]
    fn checked_this_generation(&self, code: usize) -> Option<CodeId> {
        let s = &self.slots[Self::slot(code)];
        (s.key.code == code && s.seen == self.known).then_some(CodeId {
            id: s.id,
            first_traceable: s.first_traceable,
        })
    }

    /// The id stored for `key` (its slot then counts as checked in this generation).
    fn get(&mut self, key: &CodeKey) -> Option<u32> {
        let now = self.now;
        let s = &mut self.slots[Self::slot(key.code)];
        if s.key != *key {
            return None;
        }
        s.seen = now;
        Some(s.id)
    }

    /// Stores what `key`'s code object is known by, checked in the current generation.
    fn insert(&mut self, key: CodeKey, code: CodeId) {
        self.slots[Self::slot(key.code)] = Slot {
            key,
            id: code.id,
            first_traceable: code.first_traceable,
            seen: self.now,
        };
    }
}

/// What the walk needs of a code object: its id, and (3.11+) the index of its first traceable
/// instruction (a frame whose instruction is before it has not started: it is skipped).
#[derive(Clone, Copy)]
struct CodeId {
    id: u32,
    first_traceable: u32,
}

/// Code objects created or destroyed since a code watcher was registered
/// ([`watch_code_objects`]; CPython 3.12+). While it keeps its value, no code object was freed,
/// so one a thread identified at some address (by its full key, while that thread ran it) is
/// still the object at that address: the hot path then knows it by its address alone.
static CODE_EVENTS: AtomicU64 = AtomicU64::new(0);
/// Set once a code watcher counts into [`CODE_EVENTS`].
static WATCHING: AtomicBool = AtomicBool::new(false);

/// A code watcher's callback, `int (*)(PyCodeEvent, PyCodeObject *)`: the shim's (in its FFI
/// layer) calls [`note_code_event`] and returns 0.
pub type CodeWatcher = extern "C" fn(i32, *mut c_void) -> i32;

/// Counts a code object created or destroyed (called from the code watcher, under the GIL). Both
/// kinds count: what matters is that no object is freed unseen, whatever CPython numbers the
/// events.
#[inline]
pub fn note_code_event() {
    CODE_EVENTS.fetch_add(1, Ordering::Release);
}

/// Registers `watcher` as a CPython code watcher (`PyCode_AddWatcher`, 3.12 and 3.13), so that
/// [`capture_interned`] knows the code objects it has seen by their address until a code object is
/// created or destroyed (it then checks each one's full key again). The caller must hold the GIL
/// (oomshim's Python code calls it through `ctypes.PyDLL`, which keeps it); this is checked, and
/// nothing is done without it, under an exception already raised, or on other versions. A failed
/// registration (all of the interpreter's watcher slots taken) clears the exception it raised.
/// Returns whether a watcher counts (true again once registered).
pub fn watch_code_objects(watcher: CodeWatcher) -> bool {
    if WATCHING.load(Ordering::Acquire) {
        return true;
    }
    if !init() || BROKEN.load(Ordering::Relaxed) {
        return false;
    }
    let Some(Some(interp)) = INTERP.get() else {
        return false;
    };
    if interp.version < (3, 12) || interp.version > (3, 13) {
        return false;
    }
    // The thread state this thread runs Python with (NULL when it does not hold the GIL):
    // `PyThreadState_GetUnchecked` from 3.13, `_PyThreadState_UncheckedGet` in 3.12.
    let attached = match lookup(c"PyThreadState_GetUnchecked") {
        0 => lookup(c"_PyThreadState_UncheckedGet"),
        f => f,
    };
    let (add, occurred, clear) = (
        lookup(c"PyCode_AddWatcher"),
        lookup(c"PyErr_Occurred"),
        lookup(c"PyErr_Clear"),
    );
    type NoArgs = unsafe extern "C" fn() -> *mut c_void;
    type Clear = unsafe extern "C" fn();
    type Add = unsafe extern "C" fn(CodeWatcher) -> i32;
    // SAFETY: each symbol is the CPython function of that name and signature in 3.12 and 3.13:
    // `PyThreadState *(void)`, `PyObject *PyErr_Occurred(void)`, `void PyErr_Clear(void)` (its
    // result ignored) and `int PyCode_AddWatcher(PyCode_WatchCallback)`.
    let (Some(attached), Some(occurred), Some(clear), Some(add)) = (unsafe {
        (
            <NoArgs as FnPtr>::from_addr(attached),
            <NoArgs as FnPtr>::from_addr(occurred),
            <Clear as FnPtr>::from_addr(clear),
            <Add as FnPtr>::from_addr(add),
        )
    }) else {
        return false;
    };
    // SAFETY: both read this thread's own state and are callable without the GIL.
    let holds_gil = unsafe {
        let mine = (interp.get_tstate)();
        !mine.is_null() && attached() == mine
    };
    if !holds_gil {
        return false;
    }
    // SAFETY: this thread holds the GIL (above), which PyErr_Occurred, PyCode_AddWatcher and
    // PyErr_Clear need; the callback stays valid for the life of the process (the shim's
    // library is never unloaded).
    unsafe {
        if !occurred().is_null() {
            return false;
        }
        if add(watcher) < 0 {
            clear();
            tracing::debug!(
                "no code watcher (every watcher slot taken): Python stacks check every frame"
            );
            return false;
        }
    }
    WATCHING.store(true, Ordering::Release);
    tracing::debug!("code watcher registered: Python stacks know checked code objects by address");
    true
}

/// Some thread walked a frame chain of at least one frame through the kernel: the layout guess
/// holds for this interpreter (offsets in its thread states and frames are the same on every
/// thread).
static LAYOUT_PROVEN: AtomicBool = AtomicBool::new(false);

/// What a thread keeps between its walks: its code-id cache, whether it may read its frames
/// directly, and its last stack with the id the caller's table gave it.
struct ThreadWalk {
    codes: LocalCache,
    /// This thread reads its frames directly: a walk through the kernel found at least one
    /// frame here, or read this thread's state without fault once the layout was proven on
    /// another thread. Without the second way a thread that never runs Python code while it
    /// allocates (torch's autograd threads have a thread state and no frame) would pay the
    /// kernel's copies at every allocation.
    validated: bool,
    /// The walk writes here (never cleared: only the first `n` words are read).
    frames: Box<[usize]>,
    /// The last stack interned (its first `last_n` words), for the table `last_tag`, as `last_id`.
    last: Box<[usize]>,
    last_n: usize,
    last_tag: u64,
    last_id: u32,
}

impl ThreadWalk {
    fn new() -> Self {
        ThreadWalk {
            codes: LocalCache::new(),
            validated: false,
            frames: vec![0; MAX_PY_FRAMES].into_boxed_slice(),
            last: vec![0; MAX_PY_FRAMES].into_boxed_slice(),
            last_n: 0,
            last_tag: 0,
            last_id: 0,
        }
    }

    /// Walks the thread's frames into `frames`; how many (0 when anything read looked wrong).
    fn walk(&mut self, interp: &Interp, tstate: usize, now: u64) -> usize {
        self.codes.start(now);
        if self.validated {
            return walk(interp, &Direct, tstate, &mut self.frames, &mut self.codes).unwrap_or(0);
        }
        match walk(interp, &Checked, tstate, &mut self.frames, &mut self.codes) {
            Some(n) => {
                if n > 0 {
                    LAYOUT_PROVEN.store(true, Ordering::Relaxed);
                }
                self.validated = n > 0 || LAYOUT_PROVEN.load(Ordering::Relaxed);
                n
            }
            None => {
                if !BROKEN.swap(true, Ordering::Relaxed) {
                    tracing::debug!("Python frame layout check failed; Python stacks are off");
                }
                0
            }
        }
    }

    /// [`capture_interned`] on this thread's state.
    fn capture_interned(
        &mut self,
        interp: &Interp,
        tstate: usize,
        now: u64,
        tag: u64,
        intern: impl FnOnce(&[usize]) -> u32,
    ) -> u32 {
        let n = self.walk(interp, tstate, now);
        if n == 0 {
            return 0;
        }
        if n == self.last_n && tag == self.last_tag && self.frames[..n] == self.last[..n] {
            return self.last_id;
        }
        let id = intern(&self.frames[..n]);
        std::mem::swap(&mut self.frames, &mut self.last);
        self.last_n = n;
        self.last_tag = tag;
        self.last_id = id;
        id
    }
}

thread_local! {
    /// The thread's walk state: no lock on the hot path.
    static LOCAL: RefCell<ThreadWalk> = RefCell::new(ThreadWalk::new());
}

/// The calling thread's Python stack (packed frames, innermost first, at most
/// [`MAX_PY_FRAMES`]), interned: returns `intern(frames)`, the id the caller's table gives the
/// frames. When the frames are exactly those this thread captured last for the same table
/// (`tag`, unique to the table: its [`crate::ledger::StackTable::tag`]) the id that capture got is
/// returned without calling `intern` (the table gives equal frames the same id). 0 without
/// calling `intern` when the thread has no Python frame or state, the interpreter is
/// unsupported, or anything read looked wrong.
pub fn capture_interned(tag: u64, intern: impl FnOnce(&[usize]) -> u32) -> u32 {
    let Some(Some(interp)) = INTERP.get() else {
        return 0;
    };
    if BROKEN.load(Ordering::Relaxed) {
        return 0;
    }
    // SAFETY: see find_interp.
    let tstate = unsafe { (interp.get_tstate)() } as usize;
    if tstate == 0 {
        return 0;
    }
    // The generation this walk's shortcuts hold for, read before any frame is.
    let now = if WATCHING.load(Ordering::Relaxed) {
        CODE_EVENTS.load(Ordering::Acquire)
    } else {
        UNWATCHED
    };
    // Borrowed once per capture; a fresh state (checked walk, no memo) when the thread's is in
    // use (a signal handler's capture) or gone (thread teardown).
    let mut intern = Some(intern);
    let mut run = |state: &mut ThreadWalk| match intern.take() {
        Some(f) => state.capture_interned(interp, tstate, now, tag, f),
        None => 0,
    };
    LOCAL
        .try_with(|c| match c.try_borrow_mut() {
            Ok(mut state) => run(&mut state),
            Err(_) => run(&mut ThreadWalk::new()),
        })
        .unwrap_or_else(|_| run(&mut ThreadWalk::new()))
}

/// Walks the frame chain. `None` when something read contradicts the layout.
fn walk<M: Mem>(
    interp: &Interp,
    m: &M,
    tstate: usize,
    out: &mut [usize],
    cache: &mut LocalCache,
) -> Option<usize> {
    let l = &interp.layout;
    let frame = match l.cframe {
        Some(off) => {
            let cframe = m.ptr(tstate + off)?;
            if cframe == 0 {
                return Some(0);
            }
            m.ptr(cframe + l.cframe_current)?
        }
        None => m.ptr(tstate + l.frame)?,
    };
    let limit = out.len().min(MAX_PY_FRAMES);
    let out = &mut out[..limit];
    let n = match l.chain {
        Chain::FrameObjects(shape) => walk_frame_objects(interp, m, &shape, frame, out, cache)?,
        Chain::Interpreter(shape) => walk_interpreter_chain(interp, m, &shape, frame, out, cache)?,
    };
    if n > 0 {
        out[n - 1] |= GROUP_END;
    }
    Some(n)
}

/// A chain longer than the output is cut; a cycle is cut by this bound on the frames visited.
const MAX_HOPS: usize = 4 * MAX_PY_FRAMES;

/// ≤ 3.10: `PyFrameObject`s linked by `f_back`, one group each.
fn walk_frame_objects<M: Mem>(
    interp: &Interp,
    m: &M,
    shape: &FrameObjectShape,
    mut frame: usize,
    out: &mut [usize],
    cache: &mut LocalCache,
) -> Option<usize> {
    let l = &interp.layout;
    let FrameObjectShape {
        previous,
        code: code_at,
        lasti,
        lasti_units,
    } = *shape;
    let mut n = 0;
    let mut hops = 0;
    while frame != 0 && n < out.len() && hops < MAX_HOPS {
        hops += 1;
        let next = m.ptr(frame + previous)?;
        if m.ptr(frame + l.ob_type)? != interp.frame_type {
            return None;
        }
        let code = m.ptr(frame + code_at)?;
        let li = m.get::<i32>(frame + lasti)?;
        let offset = if li < 0 {
            NO_OFFSET
        } else if lasti_units {
            (li as u32).saturating_mul(2)
        } else {
            li as u32
        };
        let id = code_id(interp, m, code, cache)?.id;
        out[n] = pack(id, offset, true);
        n += 1;
        frame = next;
    }
    Some(n)
}

/// ≥ 3.11: the chain from `frame` (the layout's `shape`), by the loop `interp.frame_loop` names:
/// a layout known when built has a loop of its own with its constants folded in (`FrameLoop::of`
/// found `shape` equal to that constant), one call each so that each is a loop of its own.
fn walk_interpreter_chain<M: Mem>(
    interp: &Interp,
    m: &M,
    shape: &FrameShape,
    frame: usize,
    out: &mut [usize],
    cache: &mut LocalCache,
) -> Option<usize> {
    match interp.frame_loop {
        FrameLoop::Fixed311 => walk_interpreter_frames(interp, m, &FRAMES_311, frame, out, cache),
        FrameLoop::Fixed312 => walk_interpreter_frames(interp, m, &FRAMES_312, frame, out, cache),
        FrameLoop::Fixed313 => walk_interpreter_frames(interp, m, &FRAMES_313, frame, out, cache),
        FrameLoop::FromLayout => walk_interpreter_frames(interp, m, shape, frame, out, cache),
    }
}

/// ≥ 3.11: `_PyInterpreterFrame`s linked by `previous`, each read as one object (one check, or
/// one kernel copy, for all its fields).
#[inline(always)]
fn walk_interpreter_frames<M: Mem>(
    interp: &Interp,
    m: &M,
    shape: &FrameShape,
    mut frame: usize,
    out: &mut [usize],
    cache: &mut LocalCache,
) -> Option<usize> {
    let FrameShape {
        offsets: at,
        cstack_owner,
        firsttraceable,
        code_adaptive,
    } = *shape;
    let mut n = 0;
    let mut hops = 0;
    while frame != 0 && n < out.len() && hops < MAX_HOPS {
        hops += 1;
        let f = m.frame(frame, &at)?;
        let (next, own, entry) = (f.previous, f.owner, f.is_entry != 0);
        if cstack_owner.is_some_and(|c| own >= c) {
            // An entry shim of a native eval call: the frame before it was the outermost of
            // its group.
            if n > 0 {
                out[n - 1] |= GROUP_END;
            }
        } else {
            let (code, ip) = (f.code, f.instr);
            let known = code_id(interp, m, code, cache)?;
            let base = code + code_adaptive;
            // A frame not yet past its code's first traceable instruction (not a generator's,
            // owner 1) has not started: skipped.
            let incomplete = firsttraceable.is_some()
                && own != 1
                && ip < base + 2 * known.first_traceable as usize;
            if !incomplete {
                // Before the code's first instruction (3.12 points one unit before it until the
                // first runs) wraps to a huge distance: unknown, like one past 4 GiB.
                let distance = ip.wrapping_sub(base);
                let offset = if distance > NO_OFFSET as usize {
                    NO_OFFSET
                } else {
                    distance as u32
                };
                out[n] = pack(known.id, offset, entry);
                n += 1;
            } else if entry && n > 0 {
                out[n - 1] |= GROUP_END;
            }
        }
        frame = next;
    }
    Some(n)
}

fn pack(id: u32, offset: u32, group_end: bool) -> usize {
    ((id as usize) << 32) | offset as usize | if group_end { GROUP_END } else { 0 }
}

/// What the code object at `code` is known by, resolving it on first sight. Known by its
/// address alone when this thread checked it in this generation of [`CODE_EVENTS`] (it is still
/// that live code object: nothing of it is read); otherwise by its full key.
#[inline(always)]
fn code_id<M: Mem>(interp: &Interp, m: &M, code: usize, cache: &mut LocalCache) -> Option<CodeId> {
    match cache.checked_this_generation(code) {
        Some(known) => Some(known),
        None => identify(interp, m, code, cache),
    }
}

/// [`code_id`] when the code object is not known by its address: its full key, through the
/// thread's cache, then the process's table. Out of line and cold: the known case stays a few
/// instructions in the walk's loop, and the registers it holds are saved around this call only
/// when it is made.
#[cold]
#[inline(never)]
fn identify<M: Mem>(interp: &Interp, m: &M, code: usize, cache: &mut LocalCache) -> Option<CodeId> {
    let l = &interp.layout;
    if m.ptr(code + l.ob_type)? != interp.code_type {
        return None;
    }
    let first_traceable = match l.chain {
        Chain::Interpreter(FrameShape {
            firsttraceable: Some(off),
            ..
        }) => m.get::<i32>(code + off)?.max(0) as u32,
        _ => 0,
    };
    let filename = m.ptr(code + l.co_filename)?;
    let name = m.ptr(code + l.co_name)?;
    let linetable = m.ptr(code + l.co_linetable)?;
    // A string in a layout this module does not read gets a zero fingerprint (and is named
    // `?`); only a wrong code object type makes the walk fail.
    let (name_len, name_head, _) = str_fingerprint(l, m, name).unwrap_or_default();
    let (file_len, _, file_tail) = str_fingerprint(l, m, filename).unwrap_or_default();
    let key = CodeKey {
        code,
        filename,
        name,
        linetable,
        firstlineno: m.get::<i32>(code + l.co_firstlineno)?,
        name_len,
        name_head,
        file_len,
        file_tail,
        table_len: m
            .get::<isize>(linetable + l.var_size)?
            .clamp(0, u32::MAX as isize) as u32,
    };
    if let Some(id) = cache.get(&key) {
        return Some(CodeId {
            id,
            first_traceable,
        });
    }
    let id = {
        let known = codes().ids.get(&key).copied();
        match known {
            Some(id) => id,
            None => {
                // First sight: copy what the dump will need, through the kernel, while the
                // code object is certainly alive (this thread is running it).
                let info = CodeInfo {
                    key,
                    function: read_str(l, &Checked, name).unwrap_or_else(|| "?".into()),
                    file: read_str(l, &Checked, filename).unwrap_or_else(|| "?".into()),
                    first_line: key.firstlineno,
                    table: read_bytes_obj(l, &Checked, linetable).unwrap_or_default(),
                };
                let mut t = codes();
                match t.ids.get(&key) {
                    Some(&id) => id,
                    None => {
                        let id = t.codes.len() as u32;
                        if id >= (1 << 31) {
                            return None;
                        }
                        t.codes.push(info);
                        t.ids.insert(key, id);
                        id
                    }
                }
            }
        }
    };
    let known = CodeId {
        id,
        first_traceable,
    };
    cache.insert(key, known);
    Some(known)
}

/// Where a str object's characters are: (data address, length, bytes per character).
fn str_data<M: Mem>(l: &Layout, m: &M, s: usize) -> Option<(usize, usize, usize)> {
    let len = m.get::<isize>(s + l.str_length)?;
    if !(0..=(1 << 24)).contains(&len) {
        return None;
    }
    let state = m.get::<u32>(s + l.str_state)?;
    let kind = ((state >> 2) & 7) as usize;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = if ascii {
        s + l.ascii_size
    } else {
        s + l.compact_size
    };
    Some((data, len as usize, kind))
}

/// (length, first 8 bytes, last 8 bytes) of a str's data: part of a code object's fingerprint.
fn str_fingerprint<M: Mem>(l: &Layout, m: &M, s: usize) -> Option<(u32, u64, u64)> {
    let (data, len, kind) = str_data(l, m, s)?;
    let bytes = len * kind;
    if bytes >= 8 {
        // Two word reads: the data start is 8-aligned; the tail word may not be.
        let head = m.get::<u64>(data)?;
        let tail = m.unaligned_u64(data + bytes - 8)?;
        return Some((len as u32, head, tail));
    }
    let mut head = [0u8; 8];
    if !m.bytes(data, &mut head[..bytes]) {
        return None;
    }
    let head = u64::from_ne_bytes(head);
    Some((len as u32, head, head))
}

fn read_str<M: Mem>(l: &Layout, m: &M, s: usize) -> Option<String> {
    let (data, len, kind) = str_data(l, m, s)?;
    let len = len.min(MAX_STR);
    let mut raw = vec![0u8; len * kind];
    if !m.bytes(data, &mut raw) {
        return None;
    }
    Some(match kind {
        1 => raw.iter().map(|&b| b as char).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_ne_bytes([c[0], c[1]]) as u32).unwrap_or('?'))
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    })
}

fn read_bytes_obj<M: Mem>(l: &Layout, m: &M, b: usize) -> Option<Box<[u8]>> {
    let len = m.get::<isize>(b + l.var_size)?;
    if !(0..=MAX_TABLE as isize).contains(&len) {
        return None;
    }
    let mut raw = vec![0u8; len as usize];
    m.bytes(b + l.bytes_sval, &mut raw)
        .then(|| raw.into_boxed_slice())
}

/// One resolved Python frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyFrame {
    /// Qualified name (3.11+: `Class.method`), or the plain name before 3.11.
    pub function: String,
    pub file: String,
    pub line: Option<u32>,
    /// Address of the code object when it was seen.
    pub code: usize,
    /// Outermost frame of one native eval-loop call.
    pub group_end: bool,
}

// What kind of Python file a path names is a view of a dump's frames (`dump::view`);
// re-exported here, where the stack capture uses it.
pub use dump::view::{is_hook_file, is_library_file};

/// The innermost frame of the program's own code in packed frames from [`capture_interned`]: its code id
/// and line (0 when unknown). `None` when every frame is library code (or unknown).
pub fn user_line(packed: &[usize]) -> Option<(u32, u32)> {
    let format = INTERP
        .get()
        .and_then(|i| i.as_ref())
        .map(|i| i.layout.line_format)
        .unwrap_or(LineFormat::Locations);
    let t = codes();
    packed.iter().find_map(|&p| {
        let id = (p & !GROUP_END) >> 32;
        let offset = (p & 0xffff_ffff) as u32;
        let c = t.codes.get(id)?;
        if is_library_file(&c.file) {
            return None;
        }
        let line = if offset == NO_OFFSET {
            None
        } else {
            line_for(format, &c.table, c.first_line, offset)
        };
        Some((id as u32, line.unwrap_or(0)))
    })
}

/// Resolves packed frames from [`capture_interned`] (innermost first). Unknown ids are dropped.
pub fn resolve(packed: &[usize]) -> Vec<PyFrame> {
    let format = INTERP
        .get()
        .and_then(|i| i.as_ref())
        .map(|i| i.layout.line_format)
        .unwrap_or(LineFormat::Locations);
    let t = codes();
    packed
        .iter()
        .filter_map(|&p| {
            let id = (p & !GROUP_END) >> 32;
            let offset = (p & 0xffff_ffff) as u32;
            let c = t.codes.get(id)?;
            Some(PyFrame {
                function: c.function.clone(),
                file: c.file.clone(),
                line: if offset == NO_OFFSET {
                    None
                } else {
                    line_for(format, &c.table, c.first_line, offset)
                },
                code: c.key.code,
                group_end: p & GROUP_END != 0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::mem::{FrameFields, FRAME_BYTES};
    use super::*;

    /// A frame's bytes where [`Direct`] reads them (8-aligned).
    #[repr(C, align(8))]
    struct FrameBytes([u8; FRAME_BYTES]);

    extern "C" fn no_thread_state() -> *mut c_void {
        std::ptr::null_mut()
    }

    /// An interpreter whose frames have `shape`, walked by `frame_loop`.
    fn interp(shape: FrameShape, frame_loop: FrameLoop) -> Interp {
        let mut layout = built_in_layout((3, 12)).unwrap();
        layout.chain = Chain::Interpreter(shape);
        Interp {
            version: (3, 0),
            get_tstate: no_thread_state,
            code_type: 0,
            frame_type: 0,
            layout,
            frame_loop,
        }
    }

    /// One frame of a test chain: its code object's address, id and first traceable
    /// instruction, where it executes (in bytes from the code's first instruction), its owner
    /// and its `is_entry` byte.
    struct Spec {
        code: usize,
        id: u32,
        first_traceable: u32,
        at: isize,
        owner: u8,
        is_entry: u8,
    }

    /// Lays `specs` out as a chain (innermost first) with `shape`'s offsets, every code object
    /// already known to the thread's cache, and walks it with the loop for `shape` and with the
    /// loop that reads the shape at run time: both must give the same frames.
    fn walk_both(shape: FrameShape, specs: &[Spec]) -> Vec<usize> {
        let mut frames: Vec<FrameBytes> =
            specs.iter().map(|_| FrameBytes([0; FRAME_BYTES])).collect();
        let addrs: Vec<usize> = frames.iter().map(|f| f.0.as_ptr() as usize).collect();
        let mut cache = LocalCache::new();
        cache.start(7);
        for (i, s) in specs.iter().enumerate() {
            let base = s.code + shape.code_adaptive;
            frames[i].0 = shape.offsets.frame_bytes(FrameFields {
                previous: addrs.get(i + 1).copied().unwrap_or(0),
                code: s.code,
                instr: base.wrapping_add_signed(s.at),
                owner: s.owner,
                is_entry: s.is_entry,
            });
            let key = CodeKey {
                code: s.code,
                ..CodeKey::default()
            };
            let id = CodeId {
                id: s.id,
                first_traceable: s.first_traceable,
            };
            cache.insert(key, id);
        }
        let run = |frame_loop: FrameLoop, cache: &mut LocalCache| {
            let mut out = vec![0; MAX_PY_FRAMES];
            let i = interp(shape, frame_loop);
            let n = walk_interpreter_chain(&i, &Direct, &shape, addrs[0], &mut out, cache).unwrap();
            out.truncate(n);
            out
        };
        let fixed = FrameLoop::of(&shape);
        assert_ne!(fixed, FrameLoop::FromLayout);
        let out = run(fixed, &mut cache);
        let again = run(FrameLoop::FromLayout, &mut cache);
        assert_eq!(out, again, "the loops for {shape:?} disagree");
        drop(frames);
        out
    }

    fn spec(code: usize, id: u32, first_traceable: u32, at: isize, owner: u8) -> Spec {
        Spec {
            code,
            id,
            first_traceable,
            at,
            owner,
            is_entry: 0,
        }
    }

    #[test]
    fn each_layout_known_when_built_has_its_own_loop() {
        assert_eq!(FrameLoop::of(&FRAMES_311), FrameLoop::Fixed311);
        assert_eq!(FrameLoop::of(&FRAMES_312), FrameLoop::Fixed312);
        assert_eq!(FrameLoop::of(&FRAMES_313), FrameLoop::Fixed313);
        let moved = FrameShape {
            code_adaptive: 208,
            ..FRAMES_313
        };
        assert_eq!(FrameLoop::of(&moved), FrameLoop::FromLayout);
        for version in [(3, 11), (3, 12)] {
            let Chain::Interpreter(shape) = built_in_layout(version).unwrap().chain else {
                panic!("{version:?} has interpreter frames");
            };
            assert_ne!(FrameLoop::of(&shape), FrameLoop::FromLayout, "{version:?}");
        }
    }

    #[test]
    fn shim_frames_end_a_group_and_frames_not_started_are_skipped() {
        // 3.12 and 3.13: owner 3 is a C-stack shim frame.
        let (a, b, c) = (0x7100_0000, 0x7200_0000, 0x7300_0000);
        for shape in [FRAMES_312, FRAMES_313] {
            let got = walk_both(
                shape,
                &[
                    spec(a, 1, 0, 20, 0),
                    spec(a, 1, 0, 0, 3),
                    // Not yet past its first traceable instruction (3.12 only: 3.13 has none).
                    spec(b, 2, 4, 6, 0),
                    // A generator's frame (owner 1) is kept wherever it is.
                    spec(b, 2, 4, 2, 1),
                    // One unit before the first instruction: offset unknown.
                    spec(c, 3, 0, -2, 1),
                ],
            );
            let mut want = vec![pack(1, 20, true)];
            if shape.firsttraceable.is_none() {
                want.push(pack(2, 6, false));
            }
            want.extend([pack(2, 2, false), pack(3, NO_OFFSET, false)]);
            assert_eq!(got, want, "{shape:?}");
        }
    }

    #[test]
    fn entry_frames_end_their_group_in_3_11() {
        let (a, b, c) = (0x7100_0000, 0x7200_0000, 0x7300_0000);
        let entry = |mut s: Spec| {
            s.is_entry = 1;
            s
        };
        let got = walk_both(
            FRAMES_311,
            &[
                spec(a, 1, 0, 10, 0),
                entry(spec(a, 1, 0, 12, 0)),
                spec(b, 2, 0, 0, 0),
                // Not started, but an entry: the frame before it ends its group.
                entry(spec(c, 3, 3, 4, 0)),
                // Beyond 4 GiB of its code: offset unknown.
                spec(c, 3, 3, 1 << 40, 0),
            ],
        );
        assert_eq!(
            got,
            vec![
                pack(1, 10, false),
                pack(1, 12, true),
                pack(2, 0, true),
                pack(3, NO_OFFSET, false)
            ]
        );
    }
}
