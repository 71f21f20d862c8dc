//! The loader's own list of loaded objects (`dl_iterate_phdr`), walked here for both of its
//! readers: the unwinder's module snapshot (`dwarf.rs`, rebuilt only when objects come or go,
//! never per capture) and the symboliser's module paths (`symbolize.rs`, at dump time).
//!
//! The walk holds the loader's lock: the visitor must not `dlopen`, `dlclose` or walk again.

use std::ops::ControlFlow;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// 64-bit targets only, like the addresses (`u64`) the rest of this module works in.
pub(super) type ProgramHeader = libc::Elf64_Phdr;

/// One loaded object, as the loader describes it during the walk (borrowed from the loader:
/// valid only inside the visitor).
pub(super) struct LoadedObject<'a> {
    info: &'a libc::dl_phdr_info,
    /// How much of `info` this glibc fills in.
    size: usize,
}

impl LoadedObject<'_> {
    /// What was added to its segments' addresses when it was mapped.
    pub(super) fn bias(&self) -> u64 {
        self.info.dlpi_addr
    }

    /// Its program headers; `None` when the loader gives none.
    pub(super) fn program_headers(&self) -> Option<&[ProgramHeader]> {
        if self.info.dlpi_phdr.is_null() {
            return None;
        }
        // SAFETY: the loader's array of `dlpi_phnum` headers, alive for the walk.
        Some(unsafe {
            std::slice::from_raw_parts(self.info.dlpi_phdr, self.info.dlpi_phnum as usize)
        })
    }

    /// Its path as it was loaded (not canonicalised); empty for the main program.
    pub(super) fn name(&self) -> String {
        if self.info.dlpi_name.is_null() {
            return String::new();
        }
        // SAFETY: a NUL-terminated string of the loader's, alive for the walk.
        unsafe { std::ffi::CStr::from_ptr(self.info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The loader's counts of objects loaded and unloaded so far (`dlpi_adds`, `dlpi_subs`):
    /// they change whenever the list does. `None` from a glibc too old to fill them in.
    pub(super) fn load_counters(&self) -> Option<(u64, u64)> {
        (self.size >= std::mem::size_of::<libc::dl_phdr_info>())
            .then_some((self.info.dlpi_adds, self.info.dlpi_subs))
    }
}

/// Calls `visit` for each loaded object, in the loader's order (the main program first), until
/// it answers `Break`. A panic in `visit` ends the walk and goes on once the loader's lock is
/// released, never through the loader's C frames.
pub(super) fn for_each_loaded_object<F>(mut visit: F)
where
    F: FnMut(&LoadedObject<'_>) -> ControlFlow<()>,
{
    struct Walk<'f, F> {
        visit: &'f mut F,
        panic: Option<Box<dyn std::any::Any + Send>>,
    }

    unsafe extern "C" fn each<F>(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int
    where
        F: FnMut(&LoadedObject<'_>) -> ControlFlow<()>,
    {
        // SAFETY: `data` is the `&mut Walk` passed to `dl_iterate_phdr` below, which outlives
        // the iteration and is reached by no one else while it runs; `info` is the loader's
        // entry for this call, valid until the callback returns (`object` does not escape it).
        let (walk, object) = unsafe {
            (
                &mut *(data as *mut Walk<'_, F>),
                LoadedObject { info: &*info, size },
            )
        };
        match catch_unwind(AssertUnwindSafe(|| (walk.visit)(&object))) {
            Ok(ControlFlow::Continue(())) => 0,
            Ok(ControlFlow::Break(())) => 1,
            Err(payload) => {
                walk.panic = Some(payload);
                1
            }
        }
    }

    let mut walk = Walk {
        visit: &mut visit,
        panic: None,
    };
    // SAFETY: `each::<F>` casts `data` back to the `Walk<F>` passed here, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(each::<F>),
            &mut walk as *mut Walk<'_, F> as *mut libc::c_void,
        );
    }
    if let Some(payload) = walk.panic {
        resume_unwind(payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_sees_this_program_first_and_the_object_holding_this_code() {
        let here = the_walk_sees_this_program_first_and_the_object_holding_this_code as fn()
            as usize as u64;
        let (mut seen, mut first_name, mut holds_here) = (0, None, false);
        for_each_loaded_object(|o| {
            if seen == 0 {
                first_name = Some(o.name());
            }
            seen += 1;
            let headers = o.program_headers().unwrap_or(&[]);
            holds_here |= headers.iter().any(|ph| {
                let start = o.bias().wrapping_add(ph.p_vaddr);
                ph.p_type == libc::PT_LOAD && start <= here && here < start + ph.p_memsz
            });
            ControlFlow::Continue(())
        });
        assert!(seen > 1, "the program and at least libc");
        assert_eq!(
            first_name.as_deref(),
            Some(""),
            "the main program has no name"
        );
        assert!(holds_here);
    }

    #[test]
    fn break_ends_the_walk_and_a_panic_comes_out_after_it() {
        let mut seen = 0;
        for_each_loaded_object(|_| {
            seen += 1;
            ControlFlow::Break(())
        });
        assert_eq!(seen, 1);

        let mut after_panic = 0;
        let caught = catch_unwind(AssertUnwindSafe(|| {
            for_each_loaded_object(|_| {
                after_panic += 1;
                panic!("in the visitor");
            })
        }));
        assert!(caught.is_err());
        assert_eq!(after_panic, 1, "no object visited after the panic");
        // The loader's lock was let go: walking again does not hang.
        for_each_loaded_object(|_| ControlFlow::Break(()));
    }
}
