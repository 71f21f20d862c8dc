//! The x86-64 stack walk behind [`super::capture`]: in-process DWARF CFI unwinding. The module
//! list is the loader's (walked in `super::loaded`); each object's `.eh_frame_hdr`/`.eh_frame`
//! bytes are handed to `framehop` straight from the mapped image (no copy, no file I/O). Two
//! cache levels per thread:
//!
//! 1. a direct-mapped table (4096 slots, 64 KiB) from return address to a compact rule in the
//!    three registers a walk needs (`sp' = sp + k`, return address at `sp' - 8`, bp unchanged or
//!    reloaded from `sp + j`; or the frame-pointer rule; or "end of stack"). A warm frame costs
//!    one table probe and one or two stack loads, all inlined: ~4 ns/frame;
//! 2. framehop (its own 509-slot rule cache, allocation-free policy), which evaluates the CFI
//!    when the table misses; the compact rule is read off framehop's result on two synthetic
//!    stacks (see `learn`). Rules framehop cannot cache (CFA given by a DWARF expression, as in
//!    signal trampolines) are left to framehop on every walk.
//!
//! Stack reads are confined to `[sp, top of this thread's stack)`, so a wrong rule can end a walk
//! early but never fault, and every step must move sp strictly up, so a walk always ends. Where
//! a pc has no CFI (JIT code, objects without `.eh_frame_hdr`), framehop gives the frame-pointer
//! rule, validated the same way.

use super::loaded::{for_each_loaded_object, LoadedObject};
use super::regs::{read_bounded, Regs};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder,
};
use std::ops::{ControlFlow, Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

#[cfg(test)]
thread_local! {
    /// Walks completed from the walk memo on this thread (tests only).
    pub(crate) static SPLICES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Frames stepped by walks on this thread before they ended or matched the memo (tests
    /// only).
    pub(crate) static WALKED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Most frames skipped at the top of a stack (with `skip_own_module`, the shim's own
/// frames) before giving up.
const MAX_SKIPPED: usize = 64;

type Policy = MustNotAllocateDuringUnwind;
type Cache = CacheX86_64<Policy>;

/// Bytes of a loaded object, read in place. Loaded objects stay mapped until `dlclose`; to
/// survive that too, every access (framehop dereferences these only on a rule-cache miss)
/// first asks glibc's lock-free `_dl_find_object` whether the object that owned this unwind
/// data at snapshot time is still the one mapped there and still spans these bytes, and
/// yields an empty slice if not.
#[derive(Clone, Copy, Default)]
pub(super) struct MappedBytes {
    ptr: usize,
    len: usize,
    /// The owning object as `_dl_find_object` described it at snapshot time.
    owner: Owner,
}

#[derive(Clone, Copy, Default)]
struct Owner {
    /// Address of its PT_GNU_EH_FRAME (`.eh_frame_hdr`).
    hdr: usize,
    /// Its `struct link_map *`; 0 when glibc could not describe it (before 2.35, or an
    /// object still being loaded): then it is trusted unchecked.
    link_map: usize,
    /// Where it was mapped, and a hash of its path ([`path_hash`]). An object loaded after
    /// this one was closed can land at the same address with its `struct link_map` in the
    /// same freed heap chunk (the loader's allocation has the same size when the paths are
    /// about as long): the address and the link map alone cannot tell them apart.
    map_start: usize,
    map_end: usize,
    path: u64,
}

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 || !still_loaded(&self.owner, self.ptr, self.len) {
            return &[];
        }
        // SAFETY: a range of a loaded object's PT_LOAD segment, checked above to be mapped.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

/// Set when unwind data of an unloaded object was refused; the next capture that sees it
/// rebuilds the module list.
static SAW_STALE: AtomicBool = AtomicBool::new(false);

#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut libc::c_void,
    map_end: *mut libc::c_void,
    link_map: *mut libc::c_void,
    eh_frame: *mut libc::c_void,
    reserved: [u64; 7],
}
type DlFindObjectFn = unsafe extern "C" fn(*mut libc::c_void, *mut DlFindObject) -> libc::c_int;

/// `_dl_find_object` (glibc >= 2.35), resolved at the first snapshot; 1 = not yet looked up,
/// 0 = unavailable.
static DL_FIND_OBJECT: AtomicUsize = AtomicUsize::new(1);

fn dl_find_object_fn() -> Option<DlFindObjectFn> {
    let mut f = DL_FIND_OBJECT.load(Ordering::Acquire);
    if f == 1 {
        // SAFETY: RTLD_DEFAULT is always a valid handle.
        f = unsafe { crate::sys::quiet_dlsym(libc::RTLD_DEFAULT, c"_dl_find_object") };
        DL_FIND_OBJECT.store(f, Ordering::Release);
    }
    if f <= 1 {
        return None;
    }
    // SAFETY: the address of glibc's `_dl_find_object`, whose C signature this is; the C
    // library stays loaded.
    unsafe { <DlFindObjectFn as crate::sys::fn_ptr::FnPtr>::from_addr(f) }
}

/// What `_dl_find_object` says about the object mapped at `addr`.
struct Found {
    map: Range<usize>,
    link_map: usize,
    /// Its PT_GNU_EH_FRAME address, 0 if none.
    hdr: usize,
}

/// `Ok(Some)` for the object mapped at `addr`, `Ok(None)` if no object is; `Err` when glibc
/// cannot tell (before 2.35).
fn find_object(addr: u64) -> Result<Option<Found>, ()> {
    let Some(f) = dl_find_object_fn() else {
        return Err(());
    };
    // SAFETY: `DlFindObject` is integers and raw pointers, for which all zeroes is valid.
    let mut res: DlFindObject = unsafe { std::mem::zeroed() };
    // SAFETY: lock-free, async-signal-safe lookup that only writes `res`.
    if unsafe { f(addr as *mut libc::c_void, &mut res) } == 0 {
        Ok(Some(Found {
            map: res.map_start as usize..res.map_end as usize,
            link_map: res.link_map as usize,
            hdr: res.eh_frame as usize,
        }))
    } else {
        Ok(None)
    }
}

fn owner_of(hdr: usize) -> Owner {
    match find_object(hdr as u64) {
        Ok(Some(f)) if f.hdr == hdr => Owner {
            hdr,
            link_map: f.link_map,
            map_start: f.map.start,
            map_end: f.map.end,
            path: path_hash(f.link_map),
        },
        _ => Owner {
            hdr,
            ..Owner::default()
        },
    }
}

/// FNV-1a of an object's path as its `struct link_map` holds it (`l_name`; empty for the
/// main program), at most 4 KiB of it. Called only with a link map `_dl_find_object` has
/// just returned, so the object is loaded and its name allocated.
fn path_hash(link_map: usize) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    if link_map == 0 {
        return hash;
    }
    // SAFETY: `struct link_map`'s public head is `l_addr` then `l_name` (<link.h>, part of
    // glibc's ABI): the second word of a live link map is a pointer to a NUL-terminated path.
    let name = unsafe { *(link_map as *const *const u8).add(1) };
    if name.is_null() {
        return hash;
    }
    for i in 0..4096 {
        // SAFETY: inside the NUL-terminated path: the loop stops at its NUL.
        let b = unsafe { *name.add(i) };
        if b == 0 {
            break;
        }
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn still_loaded(owner: &Owner, ptr: usize, len: usize) -> bool {
    if owner.link_map == 0 {
        return true;
    }
    match find_object(owner.hdr as u64) {
        Ok(Some(f))
            if f.hdr == owner.hdr
                && f.link_map == owner.link_map
                && f.map.start == owner.map_start
                && f.map.end == owner.map_end
                && path_hash(f.link_map) == owner.path
                && f.map.start <= ptr
                && ptr.saturating_add(len) <= f.map.end =>
        {
            true
        }
        Ok(_) => {
            SAW_STALE.store(true, Ordering::Relaxed);
            false
        }
        Err(()) => true,
    }
}

/// An immutable view of the loaded objects, shared by all threads.
pub(super) struct Snapshot {
    generation: u64,
    unwinder: UnwinderX86_64<MappedBytes, Policy>,
    /// Executable ranges of every known object, sorted, non-overlapping.
    ranges: Vec<Range<u64>>,
    /// Executable range of the object containing this code (the shim).
    own: Range<u64>,
    /// `dl_iterate_phdr` load/unload counters when this snapshot was taken.
    adds: u64,
    subs: u64,
}

impl Snapshot {
    fn covers(&self, pc: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.start <= pc);
        i > 0 && pc < self.ranges[i - 1].end
    }
}

static CURRENT: RwLock<Option<Arc<Snapshot>>> = RwLock::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn current_snapshot() -> Option<Arc<Snapshot>> {
    let cur = CURRENT.read().unwrap_or_else(|e| e.into_inner()).clone();
    match cur {
        Some(s) => Some(s),
        None => Some(publish_new_snapshot()),
    }
}

crate::fork_held! {
    /// The snapshot lock, held by the forking thread from the `fork` prepare handler to the
    /// parent's or child's handler, so a child never starts with it write-locked by a
    /// thread it does not have.
    static FORK_HELD: std::sync::RwLockWriteGuard<'static, Option<Arc<Snapshot>>>;
}

pub(super) fn fork_prepare() {
    FORK_HELD.hold(CURRENT.write().unwrap_or_else(|e| e.into_inner()));
}

pub(super) fn fork_release() {
    FORK_HELD.release();
}

/// Builds a snapshot from `dl_iterate_phdr` (no lock of ours held meanwhile) and publishes it.
pub(super) fn publish_new_snapshot() -> Arc<Snapshot> {
    let _ = dl_find_object_fn();
    let mut snap = build_snapshot();
    let mut slot = CURRENT.write().unwrap_or_else(|e| e.into_inner());
    let generation = GENERATION.load(Ordering::Relaxed) + 1;
    snap.generation = generation;
    let snap = Arc::new(snap);
    *slot = Some(snap.clone());
    GENERATION.store(generation, Ordering::Release);
    snap
}

struct Object {
    name: String,
    bias: u64,
    exec: Range<u64>,
    /// (`.eh_frame_hdr` svma range, `.eh_frame` svma range); absent without CFI.
    cfi: Option<(Range<u64>, Range<u64>)>,
}

struct Collected {
    objects: Vec<Object>,
    adds: u64,
    subs: u64,
}

impl Collected {
    /// Notes one object of the walk: its executable range and, where it has them, its CFI
    /// sections.
    fn add(&mut self, o: &LoadedObject<'_>) {
        if let Some(counters) = o.load_counters() {
            (self.adds, self.subs) = counters;
        }
        let Some(phdrs) = o.program_headers().filter(|p| !p.is_empty()) else {
            return;
        };
        let bias = o.bias();
        let mut exec: Option<Range<u64>> = None;
        let mut hdr: Option<Range<u64>> = None;
        for ph in phdrs {
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 && ph.p_memsz > 0 {
                let (s, e) = (ph.p_vaddr, ph.p_vaddr.saturating_add(ph.p_memsz));
                exec = Some(match exec {
                    None => s..e,
                    Some(r) => r.start.min(s)..r.end.max(e),
                });
            } else if ph.p_type == libc::PT_GNU_EH_FRAME && ph.p_memsz >= 8 {
                hdr = Some(ph.p_vaddr..ph.p_vaddr.saturating_add(ph.p_memsz));
            }
        }
        let Some(exec) = exec else { return };
        let cfi = hdr.and_then(|hdr| {
            let eh = eh_frame_svma(bias, &hdr)?;
            // `.eh_frame` has no length in memory: bound it by the end of its PT_LOAD segment.
            let seg = phdrs.iter().find(|ph| {
                ph.p_type == libc::PT_LOAD
                    && ph.p_vaddr <= eh
                    && eh < ph.p_vaddr.saturating_add(ph.p_memsz)
            })?;
            Some((hdr, eh..seg.p_vaddr.saturating_add(seg.p_memsz)))
        });
        let exec = exec.start.wrapping_add(bias)..exec.end.wrapping_add(bias);
        if exec.start < exec.end {
            self.objects.push(Object {
                name: o.name(),
                bias,
                exec,
                cfi,
            });
        }
    }
}

/// Decodes `eh_frame_ptr` of a mapped `.eh_frame_hdr` (svma range `hdr`) into the svma of
/// `.eh_frame`.
fn eh_frame_svma(bias: u64, hdr: &Range<u64>) -> Option<u64> {
    let base = bias.wrapping_add(hdr.start) as *const u8;
    // SAFETY: PT_GNU_EH_FRAME lies inside a loaded segment; we read at most 12 bytes of it
    // and its size (p_memsz >= 8) was checked, more below before 8-byte reads.
    let (version, enc) = unsafe { (*base, *base.add(1)) };
    if version != 1 {
        return None;
    }
    let field = hdr.start + 4;
    // SAFETY: as above: the 4-byte forms end at byte 8 (p_memsz >= 8), the 8-byte form is
    // read only when the header holds 12 bytes; unaligned reads of plain integers.
    let (value, size): (i64, u64) = unsafe {
        let p = base.add(4);
        match enc & 0x0f {
            0x03 => (std::ptr::read_unaligned(p as *const u32) as i64, 4),
            0x0b => (std::ptr::read_unaligned(p as *const i32) as i64, 4),
            0x00 | 0x04 | 0x0c if hdr.end - hdr.start >= 12 => {
                (std::ptr::read_unaligned(p as *const i64), 8)
            }
            _ => return None,
        }
    };
    let _ = size;
    match enc & 0x70 {
        0x00 => Some(value as u64),
        0x10 => Some(field.wrapping_add(value as u64)),
        0x30 => Some(hdr.start.wrapping_add(value as u64)),
        _ => None,
    }
}

fn build_snapshot() -> Snapshot {
    let mut c = Collected {
        objects: Vec::with_capacity(64),
        adds: 0,
        subs: 0,
    };
    for_each_loaded_object(|o| {
        c.add(o);
        ControlFlow::Continue(())
    });
    c.objects.sort_by_key(|o| o.exec.start);
    // Any function of this object marks the shim's own object; this one is at hand and, unlike
    // `capture`, needs no import back into the module that calls this one.
    let own_pc = build_snapshot as *const () as u64;
    let mut own = 0..0;
    let mut ranges: Vec<Range<u64>> = Vec::with_capacity(c.objects.len());
    let mut unwinder = UnwinderX86_64::<MappedBytes, Policy>::new();
    for o in c.objects {
        if ranges.last().is_some_and(|r| r.end > o.exec.start) {
            continue; // overlapping: keep the first, never feed framehop overlaps
        }
        if o.exec.contains(&own_pc) {
            own = o.exec.clone();
        }
        ranges.push(o.exec.clone());
        let mut info = ExplicitModuleSectionInfo::<MappedBytes> {
            base_svma: 0,
            ..Default::default()
        };
        if let Some((hdr, eh)) = &o.cfi {
            let owner = owner_of(o.bias.wrapping_add(hdr.start) as usize);
            let bytes = |r: &Range<u64>| MappedBytes {
                ptr: o.bias.wrapping_add(r.start) as usize,
                len: (r.end - r.start) as usize,
                owner,
            };
            info.eh_frame_hdr_svma = Some(hdr.clone());
            info.eh_frame_hdr = Some(bytes(hdr));
            info.eh_frame_svma = Some(eh.clone());
            info.eh_frame = Some(bytes(eh));
        }
        unwinder.add_module(Module::new(o.name, o.exec.clone(), o.bias, info));
    }
    Snapshot {
        generation: 0,
        unwinder,
        ranges,
        own,
        adds: c.adds,
        subs: c.subs,
    }
}

/// `dl_iterate_phdr`'s load/unload counters, read from its first object (takes the loader
/// lock briefly). Only used before rebuilding.
fn loader_counters() -> (u64, u64) {
    let mut out = (0u64, 0u64);
    for_each_loaded_object(|o| {
        if let Some(counters) = o.load_counters() {
            out = counters;
        }
        ControlFlow::Break(())
    });
    out
}

/// Slots of the per-thread first-level rule table (power of two; 16 bytes each).
const FAST_SLOTS: usize = 4096;

/// How to step from a return address to its caller, in the only registers the walk needs
/// (sp, bp, return address). Learned once per return address from framehop, which derives
/// it from the object's CFI (or, without CFI, the frame-pointer rule).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rule {
    /// `sp' = sp + sp_delta`, return address at `sp' - 8`, `bp' = bp` or `*(sp + bp_off)`.
    Sp { sp_delta: u32, bp_off: Option<i32> },
    /// `sp' = bp + 16`, `bp' = *bp`, return address at `bp + 8`.
    FramePointer,
    /// The outermost frame (CFI marks the return address undefined).
    End,
    /// Not expressible above (CFA from a DWARF expression, e.g. signal trampolines): let
    /// framehop evaluate it against the real stack every time.
    Framehop,
    /// `ra` is the kernel's signal-return trampoline (glibc `__restore_rt`): the interrupted
    /// registers are in the `ucontext_t` at sp, and the next pc is not a return address.
    SignalReturn,
}

/// One slot of the first-level table, 16 bytes. `sp_delta > 0`: [`Rule::Sp`] with
/// `bp_off == NO_BP` meaning bp unchanged; `sp_delta == 0`: `bp_off` holds one of the
/// `KIND_*` values.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Entry {
    /// Lookup address (return address - 1); 0 = empty.
    key: u64,
    sp_delta: u32,
    bp_off: i32,
}

const NO_BP: i32 = i32::MIN;
const KIND_END: i32 = 0;
const KIND_FP: i32 = 1;
const KIND_FRAMEHOP: i32 = 2;
const KIND_SIGNAL: i32 = 3;

/// `mov $15, %rax; syscall` (rt_sigreturn): glibc's x86-64 `__restore_rt`.
const RESTORE_RT: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
/// Offsets in the `ucontext_t` a signal frame starts with (x86-64): `uc_mcontext.gregs`
/// begins at 40; REG_RBP = 10, REG_RSP = 15, REG_RIP = 16.
const UC_RBP: u64 = 40 + 10 * 8;
const UC_RSP: u64 = 40 + 15 * 8;
const UC_RIP: u64 = 40 + 16 * 8;

/// All zero, so a fresh table is a zeroed allocation (pages faulted in only when touched).
const EMPTY: Entry = Entry {
    key: 0,
    sp_delta: 0,
    bp_off: KIND_END,
};

impl Entry {
    fn new(key: u64, rule: Rule) -> Entry {
        let (sp_delta, bp_off) = match rule {
            Rule::Sp { sp_delta, bp_off } => (sp_delta, bp_off.unwrap_or(NO_BP)),
            Rule::FramePointer => (0, KIND_FP),
            Rule::End => (0, KIND_END),
            Rule::Framehop => (0, KIND_FRAMEHOP),
            Rule::SignalReturn => (0, KIND_SIGNAL),
        };
        Entry {
            key,
            sp_delta,
            bp_off,
        }
    }
}

type FastTable = [Entry; FAST_SLOTS];

#[inline(always)]
fn slot_of(key: u64) -> usize {
    ((key ^ (key >> 12) ^ (key >> 24)) as usize) & (FAST_SLOTS - 1)
}

/// Frames a walk memo holds: the shim's own frames at the top (kept as splice points, never
/// output) and the deepest depth a program may ask for.
const MEMO_FRAMES: usize = 256 + 16;
/// Stack reads a walk memo holds (two per frame at most for the compact rules).
const MEMO_READS: usize = 2 * MEMO_FRAMES;

/// One stack read of a walk: its address and what it gave (`ok` false: out of bounds).
#[derive(Clone, Copy, Default)]
struct Read {
    addr: u64,
    value: u64,
    ok: bool,
}

/// The walk state when a frame was reached: the return address and the sp and bp it was
/// unwound with; `reads_from` indexes the first read made after it, `live_from` the first
/// word of [`Memo::live`] after it, and `step` says how the walk stepped on from it.
#[derive(Clone, Copy, Default)]
struct MemoFrame {
    sp: u64,
    bp: u64,
    ra: u64,
    reads_from: u32,
    live_from: u32,
    step: Step,
}

/// How a walk stepped from one frame of a memo to the next, as far as the check cares: which
/// of the step's reads define bp, and whether the step depends on bp.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Step {
    /// No step (the walk ended here), or one that neither reads bp nor sets it from a read:
    /// its reads (the return address) count.
    #[default]
    Plain,
    /// `sp' = sp + k`, return address at `sp' - 8`, then `bp' = *(sp + j)`: the second read
    /// only sets bp, and counts only if a later step depends on bp before another sets it.
    LoadsBp,
    /// A step that depends on bp (the frame-pointer rule; framehop and signal frames, taken
    /// as such): all its reads count, and so does the read that set the bp it started from.
    UsesBp,
}

/// A stack word the check compares: its address and the value the walk read there.
#[derive(Clone, Copy, Default)]
struct Word {
    addr: u64,
    value: u64,
}

/// The last walk of this thread, kept so that the next one can stop at the first frame whose
/// state (ra, sp, bp) matches one of it and take the rest from it.
///
/// Why this is exact: from a given (ra, sp, bp) the walk is a function of the rules (fixed
/// for one module snapshot) and of the stack words it reads. If every word the memo's walk
/// read from that frame on still holds the same value (and is within the current bounds),
/// the rest of the walk would be the same. Those checks are independent loads that the
/// CPU runs in parallel, where the walk itself is a chain (read the return address, look
/// up its rule, read the next): the outer frames of a stack, shared by consecutive
/// allocations, cost a comparison each instead of a table probe and a dependent load.
///
/// The shim's own frames (skipped, never output) are kept too, as the first `skipped`
/// frames: a hook called again from the same place matches at its very first frame. A walk
/// that matched the memo only after walking frames of its own becomes the next memo (its own
/// frames, then the memo's from the match on), so a thread whose first stack was shallow and
/// whose later ones are deeper walks each new place once, not on every call.
struct Memo {
    frames: [MemoFrame; MEMO_FRAMES],
    reads: [Read; MEMO_READS],
    /// The reads that decide the walk's output, filled from the end: `live[f.live_from..]`
    /// are those made after frame `f` ([`Memo::index_live`]). A saved bp that no later step
    /// depends on before another is loaded (every saved rbp in code built without frame
    /// pointers) cannot change the output and is left out: about half the words of such a
    /// stack.
    live: [Word; MEMO_READS],
    count: usize,
    n_reads: usize,
    /// Leading frames that were skipped (the shim's own), not output.
    skipped: usize,
    /// The walk stopped because its output was full, not at the end of the stack.
    truncated: bool,
    /// The length of the output the walk filled (its depth limit).
    out_len: usize,
    /// The interned id of exactly this memo's output, when a caller gave one
    /// ([`ThreadUnwinder::remember_id`]), for the table `id_tag` names; 0: none.
    id: u32,
    id_tag: u64,
    /// Precomputed for the check: every read was inside the stack bounds (`all_ok`), the
    /// lowest address read, and the top of the stack then. A later walk whose sp is at or
    /// below `min_addr` (under the same top) reads every word in bounds again, and only
    /// compares values.
    all_ok: bool,
    min_addr: u64,
    hi: u64,
}

impl Memo {
    fn new_boxed() -> Box<Memo> {
        // SAFETY: plain integers and bools; all-zero is an empty memo.
        unsafe { Box::<Memo>::new_zeroed().assume_init() }
    }

    /// Forgets the walk (a new module list: its rules may differ).
    fn clear(&mut self) {
        self.count = 0;
        self.id = 0;
    }

    /// Output frames (the frames after the skipped ones).
    #[inline]
    fn outputs(&self) -> usize {
        self.count - self.skipped.min(self.count)
    }

    /// Fills [`Memo::live`] and each frame's `live_from` from `frames` and `reads`, once a
    /// walk recorded them. From frame `f` on, the walk is a function of (ra, sp, bp) at `f`
    /// and of the words read after it; a word that only sets bp, when no later step depends
    /// on bp before another step sets it again, reaches neither the return addresses nor
    /// the sp of any later frame. Its address still counts for the bounds (`min_addr`: a
    /// read out of bounds would end the walk), its value does not.
    fn index_live(&mut self) {
        let Memo {
            frames,
            reads,
            live,
            count,
            n_reads,
            ..
        } = self;
        let mut at = MEMO_READS;
        let mut end = (*n_reads).min(MEMO_READS);
        // Whether the bp at the current point of the (backward) scan is depended on later.
        let mut bp_needed = false;
        for f in frames[..*count].iter_mut().rev() {
            let from = (f.reads_from as usize).min(end);
            let step = &reads[from..end];
            let (bp_read, uses_bp) = match f.step {
                Step::LoadsBp if step.len() == 2 => (Some(1), false),
                Step::UsesBp => (None, true),
                _ => (None, false),
            };
            let keep_bp = bp_needed;
            bp_needed &= bp_read.is_none();
            for (i, r) in step.iter().enumerate().rev() {
                if bp_read == Some(i) && !keep_bp {
                    continue;
                }
                at -= 1;
                live[at] = Word {
                    addr: r.addr,
                    value: r.value,
                };
            }
            bp_needed |= uses_bp;
            f.live_from = at as u32;
            end = from;
        }
    }
}

/// The memo being read (`last`) and the one being recorded (`next`), swapped after a walk
/// that recorded a new one.
struct Memos {
    last: Box<Memo>,
    next: Box<Memo>,
}

/// What a capture's output is to the memo, for a caller that interns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MemoOutcome {
    /// The output is exactly the memo's, which carries this id (of the table asked for).
    Known(u32),
    /// The memo now describes exactly this output, without an id yet: give it one with
    /// [`ThreadUnwinder::remember_id`].
    Exact,
    /// The memo does not describe this output.
    Other,
}

/// Records the reads of one walk into a memo being written (through cells, so that the
/// read closure framehop borrows and the walk loop can both use it).
struct ReadLog<'a> {
    reads: &'a [std::cell::Cell<Read>],
    n: std::cell::Cell<usize>,
    /// Lowest address read, and whether every read was in bounds (see `Memo::all_ok`).
    min_addr: std::cell::Cell<u64>,
    all_ok: std::cell::Cell<bool>,
}

impl ReadLog<'_> {
    #[inline(always)]
    fn push(&self, addr: u64, r: Result<u64, ()>) {
        let n = self.n.get();
        if let Some(slot) = self.reads.get(n) {
            slot.set(Read {
                addr,
                value: r.unwrap_or(0),
                ok: r.is_ok(),
            });
        }
        self.min_addr.set(self.min_addr.get().min(addr));
        self.all_ok.set(self.all_ok.get() & r.is_ok());
        // Past the end counts on: the memo is then not kept.
        self.n.set(n + 1);
    }
}

/// Per-thread unwinding state. Two cache levels: `fast`, a direct-mapped table of compact
/// rules keyed by return address (the steady-state path: one probe and one or two stack
/// reads per frame, all inlined), and framehop's own rule cache behind it, which evaluates
/// CFI on a miss.
pub(super) struct ThreadUnwinder {
    cache: Box<Cache>,
    fast: Box<FastTable>,
    /// The compact rule of the first frame (a pc inside `capture`, the same on every call),
    /// keyed by that pc: the walk's first step without framehop.
    first: Entry,
    memos: Memos,
    snap: Option<Arc<Snapshot>>,
}

impl ThreadUnwinder {
    pub(super) fn new() -> Self {
        ThreadUnwinder {
            cache: Box::new(Cache::new_in()),
            // SAFETY: `Entry` is plain integers; all-zero is `EMPTY`.
            fast: unsafe { Box::<FastTable>::new_zeroed().assume_init() },
            first: EMPTY,
            memos: Memos {
                last: Memo::new_boxed(),
                next: Memo::new_boxed(),
            },
            snap: None,
        }
    }

    fn set_snapshot(&mut self, snap: Option<Arc<Snapshot>>) {
        let first = self.snap.is_none();
        self.snap = snap;
        if !first {
            self.fast.fill(EMPTY); // learned rules belong to one module list
        }
        self.first = EMPTY;
        self.memos.last.clear(); // and so does the last walk
    }

    /// Gives the memo's output the id `id` in the table `tag` names, when the last capture's
    /// outcome was [`MemoOutcome::Exact`] (and nothing walked since).
    pub(super) fn remember_id(&mut self, tag: u64, id: u32) {
        let last = &mut self.memos.last;
        last.id = id;
        last.id_tag = tag;
    }

    /// Walks from `regs` into `out` (see `walk`); with what the output is to the memo, for
    /// interning under the table `tag` (0: no table). Inlined into `capture_interned`.
    #[inline]
    pub(super) fn capture(
        &mut self,
        regs: Regs,
        hi: u64,
        out: &mut [usize],
        skip_own: bool,
        tag: u64,
    ) -> (usize, MemoOutcome) {
        if hi < regs.sp.saturating_add(16) {
            return (0, MemoOutcome::Other); // sp outside the known stack (e.g. sigaltstack): refuse
        }
        let generation = GENERATION.load(Ordering::Acquire);
        if self
            .snap
            .as_ref()
            .is_none_or(|s| s.generation != generation)
        {
            self.set_snapshot(current_snapshot());
        }
        if let Some(id) = self.reuse_whole(regs, hi, out.len(), skip_own, tag) {
            return (id.0, MemoOutcome::Known(id.1));
        }
        // Borrowed, not cloned: no shared reference count touched per capture.
        let ThreadUnwinder {
            cache,
            fast,
            first,
            memos,
            snap,
        } = self;
        let Some(snap) = snap.as_deref() else {
            return (0, MemoOutcome::Other);
        };
        let (n, learned, outcome) = walk(
            snap, cache, fast, first, memos, regs, hi, out, skip_own, tag,
        );
        if !learned {
            return (n, outcome); // every rule came from the cache: nothing new to learn
        }
        // Rules were looked up: was a pc inside an object we do not know yet (dlopen), or was
        // unwind data refused because its object was unloaded? Then rebuild once and redo.
        // Rebuild only if the loader's load/unload counters moved since the snapshot, so
        // code outside any object (JIT) or objects glibc will not describe never cause a
        // rebuild storm.
        let stale = SAW_STALE.swap(false, Ordering::Relaxed);
        if !stale
            && !out[..n]
                .iter()
                .any(|&pc| unknown_object_at(snap, pc as u64))
        {
            return (n, outcome);
        }
        if loader_counters() == (snap.adds, snap.subs) {
            return (n, outcome);
        }
        let fresh = publish_new_snapshot();
        self.set_snapshot(Some(fresh.clone()));
        let (n, _, outcome) = walk(
            &fresh,
            &mut self.cache,
            &mut self.fast,
            &mut self.first,
            &mut self.memos,
            regs,
            hi,
            out,
            skip_own,
            tag,
        );
        (n, outcome)
    }
}

impl ThreadUnwinder {
    /// The steady state of a hook called again from the same place, without setting up a
    /// walk: (frames, id) when `walk` would match the memo at its very first frame and return
    /// the id kept with it. That is: the first frame's kept rule (a stack-pointer rule) steps
    /// to exactly the memo's first frame state, in bounds; the memo's output carries an id of
    /// the table `tag` under the same depth limit and is whole within it; and every word of
    /// the memo that decides the output still holds what it held (`live_words_unchanged`).
    /// Anything else (`None`) is left to `walk`, which decides it the same way.
    #[inline(always)]
    fn reuse_whole(
        &self,
        regs: Regs,
        hi: u64,
        out_len: usize,
        skip_own: bool,
        tag: u64,
    ) -> Option<(usize, u32)> {
        let last: &Memo = &self.memos.last;
        let e = self.first;
        let lo = regs.sp;
        if e.key != regs.pc
            || e.sp_delta == 0
            || last.count == 0
            || last.id == 0
            || last.id_tag != tag
            || last.out_len != out_len
            || !last.all_ok
            || hi != last.hi
            || lo > last.min_addr
        {
            return None;
        }
        let sp = lo + e.sp_delta as u64;
        let ra = read_bounded(sp - 8, lo, hi).ok()?;
        let bp = if e.bp_off != NO_BP {
            read_bounded(lo.wrapping_add(e.bp_off as i64 as u64), lo, hi).ok()?
        } else {
            regs.fp
        };
        let f = &last.frames[0];
        if ra == 0 || f.sp != sp || f.ra != ra || f.bp != bp {
            return None;
        }
        let own_frame = skip_own && self.snap.as_ref()?.own.contains(&ra);
        if (last.skipped > 0) != own_frame {
            return None;
        }
        // As `splice` from frame 0 and `walk`'s test of the whole memo: all its output frames
        // fit, and a memo cut by its depth limit is as long as that limit.
        let outputs = last.outputs();
        if outputs > out_len || (last.truncated && outputs < out_len) {
            return None;
        }
        if !live_words_unchanged(last, 0) {
            return None;
        }
        #[cfg(test)]
        SPLICES.with(|c| c.set(c.get() + 1));
        Some((outputs, last.id))
    }
}

#[cfg(test)]
impl ThreadUnwinder {
    /// framehop's own iterator over the real stack, first frame dropped as in `walk`.
    pub(super) fn reference_walk(&mut self, regs: Regs, hi: u64, out: &mut [usize]) -> usize {
        let Some(snap) = self.snap.clone() else {
            return 0;
        };
        let lo = regs.sp;
        let mut read = move |addr: u64| read_bounded(addr, lo, hi);
        let uregs = UnwindRegsX86_64::new(regs.pc, regs.sp, regs.fp);
        let mut it = snap
            .unwinder
            .iter_frames(regs.pc, uregs, &mut *self.cache, &mut read);
        let _ = it.next(); // the pc inside `capture`
        let mut n = 0;
        while n < out.len() {
            match it.next() {
                Ok(Some(f)) => {
                    out[n] = f.address() as usize;
                    n += 1;
                }
                _ => break,
            }
        }
        n
    }
}

/// True when `pc` lies in no object of `snap` but inside some loaded object.
fn unknown_object_at(snap: &Snapshot, pc: u64) -> bool {
    if snap.covers(pc) {
        return false;
    }
    match find_object(pc) {
        Ok(found) => found.is_some(),
        Err(()) => true, // cannot tell: let the loader counters decide
    }
}

/// Learns the compact rule for return address `ra` by letting framehop unwind one frame
/// over two synthetic stacks whose every word holds (a tag and) its own address: where the
/// new sp, bp and return address come from then shows in the values. framehop only caches
/// rules that do not depend on register or memory values, so two runs with different
/// synthetic sp/bp agreeing means the rule is exactly such a cached rule.
#[cold]
#[inline(never)]
fn learn(snap: &Snapshot, cache: &mut Cache, ra: u64) -> Rule {
    let Some(addr) = FrameAddress::from_return_address(ra) else {
        return Rule::End;
    };
    if is_signal_trampoline(snap, ra) {
        return Rule::SignalReturn;
    }
    learn_at(snap, cache, ra, addr)
}

/// [`learn`] for the frame at `address` (`ra` as framehop's pc register): a return address, or
/// the first frame's pc (looked up at the pc itself).
#[cold]
#[inline(never)]
fn learn_at(snap: &Snapshot, cache: &mut Cache, ra: u64, addr: FrameAddress) -> Rule {
    const TAG: u64 = 0x5a5a << 48;
    const LOW: u64 = (1 << 48) - 1;
    let mut learned = None;
    for (s, b) in [(0x1000_0000u64, 0x7000_0000u64), (0x2000_0000, 0x6800_0000)] {
        let mut regs = UnwindRegsX86_64::new(ra, s, b);
        let mut synthetic = |a: u64| Ok(TAG | (a & LOW));
        let rule = match snap
            .unwinder
            .unwind_frame(addr, &mut regs, cache, &mut synthetic)
        {
            Ok(None) => Rule::End,
            Ok(Some(ret)) => {
                let (sp, bp) = (regs.sp(), regs.bp());
                if ret != TAG | (sp.wrapping_sub(8) & LOW) {
                    Rule::Framehop
                } else if sp == b + 16 && bp == TAG | b {
                    Rule::FramePointer
                } else if sp > s && sp - s <= 1 << 20 && (sp - s) % 8 == 0 {
                    let bp_off = if bp == b {
                        Some(None)
                    } else if bp & !LOW == TAG {
                        let off = (bp & LOW) as i64 - s as i64;
                        (off.abs() <= 1 << 20 && off % 8 == 0).then_some(Some(off as i32))
                    } else {
                        None
                    };
                    match bp_off {
                        Some(bp_off) => Rule::Sp {
                            sp_delta: (sp - s) as u32,
                            bp_off,
                        },
                        None => Rule::Framehop,
                    }
                } else {
                    Rule::Framehop
                }
            }
            Err(_) => Rule::Framehop,
        };
        match learned {
            None => learned = Some(rule),
            Some(first) if first == rule => {}
            Some(_) => return Rule::Framehop,
        }
    }
    learned.unwrap_or(Rule::Framehop)
}

/// Whether the code at `ra` (inside a known object, so mapped and readable) is the
/// rt_sigreturn trampoline.
fn is_signal_trampoline(snap: &Snapshot, ra: u64) -> bool {
    let i = snap.ranges.partition_point(|r| r.start <= ra);
    let Some(r) = i.checked_sub(1).map(|i| &snap.ranges[i]) else {
        return false;
    };
    if ra < r.start || ra.saturating_add(RESTORE_RT.len() as u64) > r.end {
        return false;
    }
    // SAFETY: inside the executable segment of a loaded object.
    let code = unsafe { std::slice::from_raw_parts(ra as *const u8, RESTORE_RT.len()) };
    code == RESTORE_RT
}

/// One walk from `regs` (a pc inside `capture`). The first frame (capture itself) is always
/// dropped; with `skip_own` so are the following frames inside the shim's own object.
/// Returns the frame count, whether any rule had to be learned (cache miss), and what the
/// output is to the memo (for interning under the table `tag`).
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "the walk's whole state, kept in registers"
)]
fn walk(
    snap: &Snapshot,
    cache: &mut Cache,
    fast: &mut FastTable,
    first: &mut Entry,
    memos: &mut Memos,
    regs: Regs,
    hi: u64,
    out: &mut [usize],
    skip_own: bool,
    tag: u64,
) -> (usize, bool, MemoOutcome) {
    let lo = regs.sp;
    let Memos { last, next } = memos;
    let last: &Memo = last;
    let next_frames = &mut next.frames;
    let log = ReadLog {
        reads: std::cell::Cell::from_mut(&mut next.reads[..]).as_slice_of_cells(),
        n: std::cell::Cell::new(0),
        min_addr: std::cell::Cell::new(u64::MAX),
        all_ok: std::cell::Cell::new(true),
    };
    let mut read = |addr: u64| {
        let r = read_bounded(addr, lo, hi);
        log.push(addr, r);
        r
    };
    // Index into `last.frames` (ascending sp) of the first frame not below the current sp.
    let mut k = 0usize;
    let mut splice_tries = 0u32;
    let mut learned = false;
    // The first frame is a pc inside `capture`, the same one on every call: its compact rule
    // is kept apart, learned once through framehop at the pc itself.
    if first.key != regs.pc {
        learned = true;
        let rule = learn_at(
            snap,
            cache,
            regs.pc,
            FrameAddress::from_instruction_pointer(regs.pc),
        );
        *first = Entry::new(regs.pc, rule);
    }
    let (mut sp, mut bp) = (regs.sp, regs.fp);
    let mut ra;
    let e = *first;
    if e.sp_delta != 0 {
        let new_sp = sp + e.sp_delta as u64;
        let Ok(next) = read(new_sp - 8) else {
            return (0, learned, MemoOutcome::Other);
        };
        if e.bp_off != NO_BP {
            let Ok(b) = read(sp.wrapping_add(e.bp_off as i64 as u64)) else {
                return (0, learned, MemoOutcome::Other);
            };
            bp = b;
        }
        sp = new_sp;
        ra = next;
    } else if e.bp_off == KIND_FP {
        if bp < sp || bp > hi - 16 {
            return (0, learned, MemoOutcome::Other);
        }
        let (Ok(next_bp), Ok(next)) = (read(bp), read(bp + 8)) else {
            return (0, learned, MemoOutcome::Other);
        };
        sp = bp + 16;
        bp = next_bp;
        ra = next;
    } else {
        // Any other rule: framehop, with first-frame semantics, as it always was.
        let mut uregs = UnwindRegsX86_64::new(regs.pc, regs.sp, regs.fp);
        let pc = FrameAddress::from_instruction_pointer(regs.pc);
        ra = match snap.unwinder.unwind_frame(pc, &mut uregs, cache, &mut read) {
            Ok(Some(ra)) => ra,
            _ => return (0, learned, MemoOutcome::Other),
        };
        (sp, bp) = (uregs.sp(), uregs.bp());
    }
    let own = if skip_own { snap.own.clone() } else { 0..0 };
    let mut skipping = skip_own;
    let mut skipped = 0usize;
    // After a signal frame the next address is an interrupted pc, not a return address.
    let mut at_pc = false;
    let mut n = 0usize;
    // Frames recorded into `next` (the skipped ones too).
    let mut m = 0usize;
    loop {
        if ra == 0 {
            break;
        }
        let own_frame = skipping && own.start <= ra && ra < own.end;
        if own_frame {
            skipped += 1;
            if skipped > MAX_SKIPPED {
                break;
            }
        } else {
            skipping = false;
        }
        if !at_pc && splice_tries < MAX_SPLICE_TRIES {
            while k < last.count && last.frames[k].sp < sp {
                k += 1;
            }
            if k < last.count {
                let f = &last.frames[k];
                if f.sp == sp && f.ra == ra && f.bp == bp && (k < last.skipped) == own_frame {
                    splice_tries += 1;
                    if let Some((start, take)) = splice(last, k, n, out.len(), lo, hi) {
                        #[cfg(test)]
                        SPLICES.with(|c| c.set(c.get() + 1));
                        let total = n + take;
                        if m == 0 {
                            // Nothing walked: the memo stays. It is exactly this output when
                            // matched at its first frame under the same depth limit; then
                            // its id, if it has one, is the answer and `out` is not written.
                            let outcome =
                                if k == 0 && last.out_len == out.len() && take == last.outputs() {
                                    if last.id != 0 && last.id_tag == tag {
                                        return (total, learned, MemoOutcome::Known(last.id));
                                    }
                                    MemoOutcome::Exact
                                } else {
                                    MemoOutcome::Other
                                };
                            copy_frames(last, start, &mut out[n..total]);
                            return (total, learned, outcome);
                        }
                        copy_frames(last, start, &mut out[n..total]);
                        // Frames were walked before the match: they and the memo's frames from
                        // the match on become the next memo (the reads renumbered after ours).
                        let base = log.n.get();
                        let from = last.frames[k].reads_from as usize;
                        let tail_reads = last.n_reads - from;
                        let tail_frames = last.count - k;
                        if take == last.count - k.max(last.skipped)
                            && m + tail_frames <= MEMO_FRAMES
                            && base + tail_reads <= MEMO_READS
                        {
                            for (to, f) in next_frames[m..m + tail_frames]
                                .iter_mut()
                                .zip(&last.frames[k..last.count])
                            {
                                *to = MemoFrame {
                                    reads_from: (f.reads_from as usize - from + base) as u32,
                                    ..*f
                                };
                            }
                            let (mut min_addr, mut all_ok) = (log.min_addr.get(), log.all_ok.get());
                            for (to, r) in log.reads[base..base + tail_reads]
                                .iter()
                                .zip(&last.reads[from..last.n_reads])
                            {
                                to.set(*r);
                                min_addr = min_addr.min(r.addr);
                                all_ok &= r.ok;
                            }
                            next.min_addr = min_addr;
                            next.all_ok = all_ok;
                            next.hi = hi;
                            next.count = m + tail_frames;
                            next.n_reads = base + tail_reads;
                            next.skipped =
                                skipped - own_frame as usize + last.skipped.saturating_sub(k);
                            next.truncated = last.truncated;
                            next.out_len = out.len();
                            // The output may still be exactly the memo's (only words that do
                            // not reach the output differed, e.g. a caller's rbp): then the id
                            // it carries stays valid, for the new memo too.
                            let s = last.skipped;
                            let same_output = last.out_len == out.len()
                                && take == last.count - k.max(s)
                                && if k <= s {
                                    n == 0
                                } else {
                                    k - s == n
                                        && out[..n]
                                            .iter()
                                            .zip(&last.frames[s..k])
                                            .all(|(o, f)| *o == f.ra as usize)
                                };
                            let (id, id_tag) = if same_output {
                                (last.id, last.id_tag)
                            } else {
                                (0, 0)
                            };
                            next.id = id;
                            next.id_tag = id_tag;
                            next.index_live();
                            std::mem::swap(&mut memos.last, &mut memos.next);
                            if id != 0 && id_tag == tag {
                                return (total, learned, MemoOutcome::Known(id));
                            }
                            return (total, learned, MemoOutcome::Exact);
                        }
                        return (total, learned, MemoOutcome::Other);
                    }
                }
            }
        }
        if let Some(f) = next_frames.get_mut(m) {
            *f = MemoFrame {
                // sp 0 never matches: a frame after a signal frame is not a splice point.
                sp: if at_pc { 0 } else { sp },
                bp,
                ra,
                reads_from: log.n.get() as u32,
                live_from: 0,
                step: Step::Plain,
            };
        }
        m += 1;
        #[cfg(test)]
        WALKED.with(|c| c.set(c.get() + 1));
        if !own_frame {
            out[n] = ra as usize;
            n += 1;
            if n == out.len() {
                break;
            }
        }
        // How this frame steps on (see `Memo::index_live`); `m >= 1` here.
        let mut mark = |step: Step| {
            if let Some(f) = next_frames.get_mut(m - 1) {
                f.step = step;
            }
        };
        if at_pc {
            // framehop with first-frame semantics (lookup at the pc itself).
            mark(Step::UsesBp);
            at_pc = false;
            let mut u = UnwindRegsX86_64::new(ra, sp, bp);
            let addr = FrameAddress::from_instruction_pointer(ra);
            match snap.unwinder.unwind_frame(addr, &mut u, cache, &mut read) {
                Ok(Some(next)) if u.sp() > sp => {
                    sp = u.sp();
                    bp = u.bp();
                    ra = next;
                    continue;
                }
                _ => break,
            }
        }
        let key = ra - 1;
        let slot = slot_of(key);
        let mut e = fast[slot];
        if e.key != key {
            learned = true;
            e = Entry::new(key, learn(snap, cache, ra));
            fast[slot] = e;
        }
        if e.sp_delta != 0 {
            // sp < hi and sp_delta <= 1 MiB: no overflow.
            let new_sp = sp + e.sp_delta as u64;
            mark(if e.bp_off != NO_BP {
                Step::LoadsBp
            } else {
                Step::Plain
            });
            let Ok(next) = read(new_sp - 8) else { break };
            if e.bp_off != NO_BP {
                let Ok(b) = read(sp.wrapping_add(e.bp_off as i64 as u64)) else {
                    break;
                };
                bp = b;
            }
            sp = new_sp;
            ra = next;
        } else if e.bp_off == KIND_FP {
            mark(Step::UsesBp);
            // Validated: strictly towards the stack top, inside the stack.
            if bp < sp || bp > hi - 16 {
                break;
            }
            let (Ok(next_bp), Ok(next)) = (read(bp), read(bp + 8)) else {
                break;
            };
            sp = bp + 16;
            bp = next_bp;
            ra = next;
        } else if e.bp_off == KIND_FRAMEHOP {
            mark(Step::UsesBp);
            let Some(addr) = FrameAddress::from_return_address(ra) else {
                break;
            };
            let mut u = UnwindRegsX86_64::new(ra, sp, bp);
            match snap.unwinder.unwind_frame(addr, &mut u, cache, &mut read) {
                Ok(Some(next)) if u.sp() > sp => {
                    sp = u.sp();
                    bp = u.bp();
                    ra = next;
                }
                _ => break,
            }
        } else if e.bp_off == KIND_SIGNAL {
            mark(Step::UsesBp);
            // sp is the address of the ucontext_t the kernel pushed.
            let (Ok(pc), Ok(new_sp), Ok(new_bp)) =
                (read(sp + UC_RIP), read(sp + UC_RSP), read(sp + UC_RBP))
            else {
                break;
            };
            if new_sp <= sp {
                break;
            }
            sp = new_sp;
            bp = new_bp;
            ra = pc;
            at_pc = true;
        } else {
            break; // KIND_END
        }
    }
    let n_reads = log.n.get();
    if n > 0 && m <= MEMO_FRAMES && n_reads <= MEMO_READS {
        next.count = m;
        next.n_reads = n_reads;
        next.skipped = skipped.min(m);
        next.truncated = n == out.len();
        next.out_len = out.len();
        next.id = 0;
        next.min_addr = log.min_addr.get();
        next.all_ok = log.all_ok.get();
        next.hi = hi;
        next.index_live();
        std::mem::swap(&mut memos.last, &mut memos.next);
        return (n, learned, MemoOutcome::Exact);
    }
    (n, learned, MemoOutcome::Other)
}

/// Matches of a frame state tried per walk before walking on regardless (a stack whose
/// outer words keep changing, as under a deep recursion, gives up quickly).
const MAX_SPLICE_TRIES: u32 = 4;

/// Whether `out[..n]` (of `out_len`) can be completed with `last`'s output frames from `k` on:
/// every stack read `last` made from there still reads the same within the current bounds.
/// `(first memo frame to take, how many)`, or `None` when a read differs or `last` stopped
/// short of what `out` still has room for.
#[inline(always)]
fn splice(
    last: &Memo,
    k: usize,
    n: usize,
    out_len: usize,
    lo: u64,
    hi: u64,
) -> Option<(usize, usize)> {
    let start = k.max(last.skipped);
    let rest = last.count - start;
    if last.truncated && n + rest < out_len {
        return None;
    }
    let f = &last.frames[k];
    if last.all_ok && lo <= last.min_addr && hi == last.hi {
        // Every word read then lies in [lo, hi - 8] now too (min_addr >= lo, and each was
        // at most hi - 8 under the same hi): compare the values alone.
        if !live_words_unchanged(last, k) {
            return None;
        }
    } else {
        let mut same = true;
        for r in &last.reads[f.reads_from as usize..last.n_reads] {
            // No early exit: the loads are independent and run side by side.
            same &= match read_bounded(r.addr, lo, hi) {
                Ok(v) => r.ok && v == r.value,
                Err(()) => !r.ok,
            };
        }
        if !same {
            return None;
        }
    }
    Some((start, rest.min(out_len - n)))
}

/// Whether every word that decides `last`'s output from frame `k` on (`Memo::index_live`)
/// still holds the value read then. Only for a memo whose reads were all in bounds, under the
/// same stack top, from an sp at or below its lowest read (`min_addr`): each word then lies in
/// this thread's stack at or above the current sp.
#[inline(always)]
fn live_words_unchanged(last: &Memo, k: usize) -> bool {
    let words = &last.live[last.frames[k].live_from as usize..];
    let word = |w: &Word| {
        // SAFETY: inside this thread's mapped stack, at or above the current sp (above).
        unsafe { std::ptr::read_unaligned(w.addr as *const u64) ^ w.value }
    };
    let mut diff = 0u64;
    let mut fours = words.chunks_exact(4);
    for c in &mut fours {
        diff |= word(&c[0]) | word(&c[1]) | word(&c[2]) | word(&c[3]);
    }
    for w in fours.remainder() {
        diff |= word(w);
    }
    diff == 0
}

/// Writes the return addresses of `last.frames[start..]` into `out`.
#[inline(always)]
fn copy_frames(last: &Memo, start: usize, out: &mut [usize]) {
    for (o, f) in out.iter_mut().zip(&last.frames[start..]) {
        *o = f.ra as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memo of `steps`, each (step, its reads' addresses): read `i` of it holds `i * 100`.
    fn memo_of(steps: &[(Step, &[u64])]) -> Box<Memo> {
        let mut memo = Memo::new_boxed();
        let mut n = 0;
        for (j, (step, addrs)) in steps.iter().enumerate() {
            memo.frames[j] = MemoFrame {
                sp: 0x1000 + j as u64 * 0x10,
                reads_from: n as u32,
                step: *step,
                ..MemoFrame::default()
            };
            for &addr in addrs.iter() {
                memo.reads[n] = Read {
                    addr,
                    value: n as u64 * 100,
                    ok: true,
                };
                n += 1;
            }
        }
        memo.count = steps.len();
        memo.n_reads = n;
        memo.index_live();
        memo
    }

    /// The addresses the check compares from frame `k` on.
    fn checked_from(memo: &Memo, k: usize) -> Vec<u64> {
        memo.live[memo.frames[k].live_from as usize..]
            .iter()
            .map(|w| w.addr)
            .collect()
    }

    #[test]
    fn saved_bp_words_are_checked_only_when_a_later_step_depends_on_bp() {
        // Code without frame pointers: every frame's saved rbp is loaded and never used; only
        // the return addresses are checked.
        let memo = memo_of(&[
            (Step::LoadsBp, &[1, 2]),
            (Step::LoadsBp, &[3, 4]),
            (Step::Plain, &[5]),
            (Step::LoadsBp, &[6, 7]),
            (Step::Plain, &[]),
        ]);
        assert_eq!(checked_from(&memo, 0), [1, 3, 5, 6]);
        assert_eq!(checked_from(&memo, 1), [3, 5, 6]);
        assert_eq!(checked_from(&memo, 3), [6]);
        assert_eq!(checked_from(&memo, 4), Vec::<u64>::new());
        // Values stay with their addresses.
        let values: Vec<u64> = memo.live[memo.frames[0].live_from as usize..]
            .iter()
            .map(|w| w.value)
            .collect();
        assert_eq!(values, [0, 200, 400, 500]);

        // A frame-pointer step further out depends on the bp loaded last before it (through
        // steps that keep bp), not on one loaded before that.
        let memo = memo_of(&[
            (Step::LoadsBp, &[1, 2]),
            (Step::LoadsBp, &[3, 4]),
            (Step::Plain, &[5]),
            (Step::UsesBp, &[6, 7]),
            (Step::LoadsBp, &[8, 9]),
        ]);
        assert_eq!(checked_from(&memo, 0), [1, 3, 4, 5, 6, 7, 8]);
        assert_eq!(checked_from(&memo, 2), [5, 6, 7, 8]);
        assert_eq!(checked_from(&memo, 4), [8]);

        // A step that ended before its bp read (out of bounds) keeps what it read; framehop's
        // steps keep all theirs.
        let memo = memo_of(&[(Step::LoadsBp, &[1]), (Step::UsesBp, &[2, 3, 4])]);
        assert_eq!(checked_from(&memo, 0), [1, 2, 3, 4]);
    }
}
