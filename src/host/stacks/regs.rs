//! What both stack walks share: the three registers a walk starts from, read in place by
//! [`read_regs!`], and the one way either walk reads the stack ([`read_bounded`]). Kept apart
//! so that the frame-pointer walk (`capture`) and the CFI walk (`dwarf`) both stand on it
//! without importing each other.

/// The registers a walk starts from: program counter, stack pointer, frame pointer.
#[derive(Clone, Copy, Debug)]
pub struct Regs {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
}

#[cfg(target_arch = "x86_64")]
macro_rules! read_regs {
    () => {{
        let (pc, sp, fp): (u64, u64, u64);
        // SAFETY: reads rip/rsp/rbp into general registers; no memory access.
        unsafe {
            ::core::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {fp}, rbp",
                pc = out(reg) pc,
                sp = out(reg) sp,
                fp = out(reg) fp,
                options(nomem, nostack, preserves_flags)
            );
        }
        $crate::stacks::regs::Regs { pc, sp, fp }
    }};
}

#[cfg(target_arch = "aarch64")]
macro_rules! read_regs {
    () => {{
        let (pc, sp, fp): (u64, u64, u64);
        // SAFETY: reads pc/sp/x29 into general registers; no memory access.
        unsafe {
            ::core::arch::asm!(
                "adr {pc}, .",
                "mov {sp}, sp",
                "mov {fp}, x29",
                pc = out(reg) pc,
                sp = out(reg) sp,
                fp = out(reg) fp,
                options(nomem, nostack, preserves_flags)
            );
        }
        $crate::stacks::regs::Regs { pc, sp, fp }
    }};
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
macro_rules! read_regs {
    () => {{
        // Unsupported architecture: an empty stack (sp = fp = 0 makes every walk stop).
        $crate::stacks::regs::Regs {
            pc: 0,
            sp: 0,
            fp: 0,
        }
    }};
}

pub(crate) use read_regs;

/// Reads one 8-byte word of the current thread's stack if `[addr, addr + 8)` lies inside
/// `[lo, hi)`; never touches anything else.
#[inline(always)]
pub(super) fn read_bounded(addr: u64, lo: u64, hi: u64) -> Result<u64, ()> {
    // `hi - lo >= 8` is checked by callers before walking.
    if addr >= lo && addr <= hi - 8 {
        // SAFETY: inside the mapped stack of this thread, at or above the current sp.
        Ok(unsafe { std::ptr::read_unaligned(addr as *const u64) })
    } else {
        Err(())
    }
}
