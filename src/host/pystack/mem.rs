//! Reading the interpreter's memory from inside the process. Two readers with one interface:
//!
//! - [`Checked`] copies through `process_vm_readv(2)` on our own pid (or `/proc/self/mem` where
//!   that syscall is refused): an unmapped address gives `None`, never a fault. Used for the first
//!   walk on each thread (it validates the layout guess for this interpreter) and for everything
//!   read when a code object is seen for the first time (names, line table).
//! - [`Direct`] dereferences, after checking that the address is plausible (user-space, aligned,
//!   not near zero). Used for the hot path once the checked walk succeeded on this thread: it
//!   then only follows the current thread's own, frozen frame chain with a layout that has been
//!   proven right.
//!
//! The unsafe reads of this module are the only ones of [`super`].

use std::sync::OnceLock;

/// Lowest and highest address a user-space object can live at on x86-64/aarch64 (48-bit VA).
const LOW: usize = 0x1_0000;
const HIGH: usize = 0x0000_8000_0000_0000;

/// True when `[addr, addr + size)` is a plausible user-space range aligned to `align`.
#[inline]
pub fn plausible(addr: usize, size: usize, align: usize) -> bool {
    addr >= LOW
        && addr.checked_add(size).is_some_and(|end| end <= HIGH)
        && addr.is_multiple_of(align)
}

pub trait Mem {
    /// Copies `buf.len()` bytes from `addr`; false when they cannot be read.
    fn bytes(&self, addr: usize, buf: &mut [u8]) -> bool;

    /// A plain value at `addr` (must be naturally aligned).
    fn get<T: Copy + Default>(&self, addr: usize) -> Option<T>;

    fn ptr(&self, addr: usize) -> Option<usize> {
        self.get::<usize>(addr)
    }

    /// A u64 at any alignment.
    fn unaligned_u64(&self, addr: usize) -> Option<u64> {
        let mut b = [0u8; 8];
        self.bytes(addr, &mut b).then(|| u64::from_ne_bytes(b))
    }

    /// The fields the walk reads of the 3.11+ interpreter frame at `addr` (8-aligned), read with
    /// one check ([`Direct`]) or one kernel copy ([`Checked`]) for all of them. None when the
    /// frame's bytes cannot be read.
    fn frame(&self, addr: usize, at: &FrameOffsets) -> Option<FrameFields> {
        let mut buf = [0u8; FRAME_BYTES];
        let bytes = &mut buf[..at.span];
        if !plausible(addr, bytes.len(), 8) || !self.bytes(addr, bytes) {
            return None;
        }
        let word = |off: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[off..off + 8]);
            u64::from_ne_bytes(w) as usize
        };
        Some(FrameFields {
            previous: word(at.previous),
            code: word(at.code),
            instr: word(at.instr),
            owner: bytes[at.owner],
            is_entry: at.is_entry.map_or(0, |o| bytes[o]),
        })
    }
}

/// Room for the fields the walk reads of a 3.11+ interpreter frame (they end before 80 bytes in
/// 3.11-3.13).
pub const FRAME_BYTES: usize = 128;

/// Where the fields the walk reads lie in a 3.11+ interpreter frame, all within its first
/// `span` bytes (checked when made, so that a read of them never leaves the frame's bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameOffsets {
    previous: usize,
    code: usize,
    instr: usize,
    owner: usize,
    is_entry: Option<usize>,
    span: usize,
}

impl FrameOffsets {
    /// None when a field would end past [`FRAME_BYTES`]. A `const fn`, so that the layouts
    /// known at build time are checked at build time.
    pub const fn new(
        previous: usize,
        code: usize,
        instr: usize,
        owner: usize,
        is_entry: Option<usize>,
    ) -> Option<FrameOffsets> {
        let words = [previous + 8, code + 8, instr + 8, owner + 1];
        let mut span = match is_entry {
            Some(o) => o + 1,
            None => 0,
        };
        let mut i = 0;
        while i < words.len() {
            if words[i] > span {
                span = words[i];
            }
            i += 1;
        }
        if span > FRAME_BYTES {
            return None;
        }
        Some(FrameOffsets {
            previous,
            code,
            instr,
            owner,
            is_entry,
            span,
        })
    }
}

#[cfg(test)]
impl FrameOffsets {
    /// The bytes of a frame that reads as `f` with these offsets (the rest zero).
    pub fn frame_bytes(&self, f: FrameFields) -> [u8; FRAME_BYTES] {
        let mut b = [0u8; FRAME_BYTES];
        b[self.previous..self.previous + 8].copy_from_slice(&f.previous.to_ne_bytes());
        b[self.code..self.code + 8].copy_from_slice(&f.code.to_ne_bytes());
        b[self.instr..self.instr + 8].copy_from_slice(&f.instr.to_ne_bytes());
        b[self.owner] = f.owner;
        if let Some(o) = self.is_entry {
            b[o] = f.is_entry;
        }
        b
    }
}

/// What the walk reads of one 3.11+ interpreter frame (`is_entry` 0 where the layout has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameFields {
    pub previous: usize,
    pub code: usize,
    pub instr: usize,
    pub owner: u8,
    pub is_entry: u8,
}

/// Dereferences plausible addresses. See the module notes for when this is used.
pub struct Direct;

impl Mem for Direct {
    #[inline]
    fn bytes(&self, addr: usize, buf: &mut [u8]) -> bool {
        if !plausible(addr, buf.len(), 1) {
            return false;
        }
        // SAFETY: only used on the current thread's frozen frame chain and the objects it
        // references, after a checked walk with the same layout succeeded on this thread.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        true
    }

    #[inline]
    fn get<T: Copy + Default>(&self, addr: usize) -> Option<T> {
        if !plausible(addr, std::mem::size_of::<T>(), std::mem::align_of::<T>()) {
            return None;
        }
        // SAFETY: as above; the address is aligned for T.
        Some(unsafe { std::ptr::read_volatile(addr as *const T) })
    }

    #[inline]
    fn unaligned_u64(&self, addr: usize) -> Option<u64> {
        if !plausible(addr, 8, 1) {
            return None;
        }
        // SAFETY: as above.
        Some(unsafe { std::ptr::read_unaligned(addr as *const u64) })
    }

    #[inline(always)]
    fn frame(&self, addr: usize, at: &FrameOffsets) -> Option<FrameFields> {
        if !plausible(addr, at.span, 8) {
            return None;
        }
        let p = addr as *const u8;
        // SAFETY: as above: a frame of the current thread's frozen chain (not written while this
        // thread runs the shim), by the proven layout; every offset read lies within `span`
        // (FrameOffsets::new), which was checked as a whole.
        unsafe {
            Some(FrameFields {
                previous: std::ptr::read_unaligned(p.add(at.previous).cast::<usize>()),
                code: std::ptr::read_unaligned(p.add(at.code).cast::<usize>()),
                instr: std::ptr::read_unaligned(p.add(at.instr).cast::<usize>()),
                owner: std::ptr::read(p.add(at.owner)),
                is_entry: at.is_entry.map_or(0, |o| std::ptr::read(p.add(o))),
            })
        }
    }
}

/// Copies through the kernel: faults become `None`.
pub struct Checked;

impl Mem for Checked {
    fn bytes(&self, addr: usize, buf: &mut [u8]) -> bool {
        if buf.is_empty() {
            return true;
        }
        if !plausible(addr, buf.len(), 1) {
            return false;
        }
        match vm_read(addr, buf) {
            Some(ok) => ok,
            None => proc_mem_read(addr, buf),
        }
    }

    fn get<T: Copy + Default>(&self, addr: usize) -> Option<T> {
        if !plausible(addr, std::mem::size_of::<T>(), std::mem::align_of::<T>()) {
            return None;
        }
        let mut v = T::default();
        // SAFETY: a T is plain old data here (integers and pointers); we overwrite its bytes.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                (&mut v as *mut T).cast::<u8>(),
                std::mem::size_of::<T>(),
            )
        };
        self.bytes(addr, buf).then_some(v)
    }
}

/// `process_vm_readv` on ourselves: `Some(true)` read, `Some(false)` not readable, `None` the
/// syscall itself is unavailable (seccomp, old kernel).
fn vm_read(addr: usize, buf: &mut [u8]) -> Option<bool> {
    static UNAVAILABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf` exactly; the remote side is checked by the kernel.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == buf.len() as isize {
        return Some(true);
    }
    if n < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        if matches!(e, Some(libc::ENOSYS) | Some(libc::EPERM)) {
            UNAVAILABLE.store(true, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
    }
    Some(false)
}

/// Reads through `/proc/self/mem`, kept open as a descriptor of the shim's own: high, and
/// checked to still be that file before each read (the program may have closed it and reused
/// the number, see `crate::own_fd`). Once it is gone it stays gone (this is the fallback of a
/// fallback): reads then fail.
fn proc_mem_read(addr: usize, buf: &mut [u8]) -> bool {
    static OPENED: OnceLock<()> = OnceLock::new();
    static FD: crate::own_fd::OwnFd = crate::own_fd::OwnFd::new();
    OPENED.get_or_init(|| {
        if let Ok(f) = std::fs::File::open("/proc/self/mem") {
            FD.adopt(f);
        }
    });
    let Some(fd) = FD.get() else {
        return false;
    };
    // SAFETY: `pread` writes at most `buf.len()` bytes into the live buffer; an unmapped
    // address is an error from the kernel, never a fault in this process.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), addr as libc::off_t) };
    n == buf.len() as isize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_reads_never_fault() {
        let x: u64 = 0x1122_3344_5566_7788;
        assert_eq!(Checked.get::<u64>(&x as *const u64 as usize), Some(x));
        assert_eq!(Checked.get::<u64>(8), None);
        assert_eq!(Checked.get::<u64>(0x7000_0000_0008), None); // unmapped (almost surely)
        assert_eq!(Checked.get::<u64>((&x as *const u64 as usize) + 1), None); // misaligned
        assert_eq!(Direct.get::<u64>(&x as *const u64 as usize), Some(x));
        assert_eq!(Direct.get::<u64>(0), None);
    }

    #[test]
    fn frames_read_the_same_either_way_or_not_at_all() {
        // previous, code, instr, then owner and is_entry bytes.
        let frame: [u64; 4] = [0x1000, 0x2000, 0x3000, 0x0201];
        let at = FrameOffsets::new(0, 8, 16, 24, Some(25)).unwrap();
        let addr = frame.as_ptr() as usize;
        let want = FrameFields {
            previous: 0x1000,
            code: 0x2000,
            instr: 0x3000,
            owner: 1,
            is_entry: 2,
        };
        assert_eq!(Checked.frame(addr, &at), Some(want));
        assert_eq!(Direct.frame(addr, &at), Some(want));
        let no_entry = FrameOffsets::new(0, 8, 16, 24, None).unwrap();
        assert_eq!(Direct.frame(addr, &no_entry).unwrap().is_entry, 0);
        // A field past FRAME_BYTES: no offsets at all.
        assert_eq!(FrameOffsets::new(0, 8, FRAME_BYTES - 4, 24, None), None);
        // Misaligned, near zero, unmapped: nothing.
        assert_eq!(Checked.frame(addr + 1, &at), None);
        assert_eq!(Direct.frame(addr + 1, &at), None);
        assert_eq!(Direct.frame(8, &at), None);
        assert_eq!(Checked.frame(0x7000_0000_0008, &at), None);
    }
}
