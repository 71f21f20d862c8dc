//! `dlsym`: the exported interposer and the real one behind it.
//!
//! Static cudart (nvcc's default, CuPy, RAPIDS) and XLA's libcuda stub reach the driver with
//! `dlopen("libcuda.so.1")` + `dlsym(handle, …)`, which no PLT hook sees. The shim therefore
//! exports `dlsym`:
//!
//! - `RTLD_DEFAULT` (0) and `RTLD_NEXT` (-1) lookups are resolved by glibc relative to the
//!   *caller's* return address. The export is a naked stub that tail-jumps to the real `dlsym` for
//!   those, so the caller's identity is preserved exactly (a Rust wrapper would make the shim the
//!   caller and `RTLD_NEXT` would resolve relative to it).
//! - Any other handle goes to [`dlsym_with_handle`], which calls the real `dlsym` and, only when
//!   the result is the real address of a driver function the shim tracks, returns the shim's
//!   wrapper of exactly that function (pointer identity, see [`super::driver`]).
//!
//! The real `dlsym` comes from `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (glibc ≥ 2.34), else
//! `"GLIBC_2.2.5"` (older glibc, where it lives in libdl). It is looked up by one `.init_array`
//! constructor that does nothing else, and again lazily if a `dlsym` call arrives before that
//! constructor ran (another library's constructor). The shim's own code must never call the
//! exported `dlsym` for a handle lookup: it uses [`real_dlsym`].

use oomshim_host::sys::dl::{ensure_real_dlsym, quiet_fn, real_dlsym, REAL_DLSYM};
use std::ffi::{c_char, c_void};

/// glibc calls `.init_array` functions with the program's `argc`, `argv` and `envp`.
extern "C" fn init_real_dlsym(
    argc: std::ffi::c_int,
    argv: *const *const c_char,
    _envp: *const *const c_char,
) {
    ensure_real_dlsym();
    // In a Python program that has not started yet: oomshim's Python hook on its path (one
    // symbol lookup here; src/core/pyhook.rs).
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: RTLD_DEFAULT is always a valid handle; `int Py_IsInitialized(void)`.
        let Some(initialized) = (unsafe {
            quiet_fn::<unsafe extern "C" fn() -> std::ffi::c_int>(
                libc::RTLD_DEFAULT,
                c"Py_IsInitialized",
            )
        }) else {
            return;
        };
        let mut args: Vec<&[u8]> = Vec::new();
        if !argv.is_null() {
            for i in 0..argc.max(0) as usize {
                // SAFETY: glibc passes `argc` entries of `argv`.
                let a = unsafe { *argv.add(i) };
                if a.is_null() {
                    break;
                }
                // SAFETY: a non-NULL argument string, NUL-terminated.
                args.push(unsafe { std::ffi::CStr::from_ptr(a) }.to_bytes());
            }
        }
        // SAFETY: `Py_IsInitialized` may be called at any time, before Python starts too.
        oomshim_core::pyhook::prepare_for_python(unsafe { initialized() } == 0, &args);
    });
}

/// The only load-time work of the shim: one `dlvsym` lookup, and, in a Python program, one more
/// lookup and the hook's directory on `PYTHONPATH`.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT_REAL_DLSYM: extern "C" fn(std::ffi::c_int, *const *const c_char, *const *const c_char) =
    init_real_dlsym;

/// `dlsym` for a real handle (not `RTLD_DEFAULT`/`RTLD_NEXT`): the real lookup, with a tracked
/// driver function swapped for its wrapper.
unsafe extern "C" fn dlsym_with_handle(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the program's own arguments to `dlsym`.
    let found = unsafe { real_dlsym(handle, name) };
    if found.is_null() || name.is_null() {
        return found;
    }
    // SAFETY: a handle the real `dlsym` just accepted.
    match std::panic::catch_unwind(|| unsafe {
        super::driver::substitute_from_handle(handle, found as usize)
    }) {
        Ok(p) => p as *mut c_void,
        Err(_) => found,
    }
}

/// The exported `dlsym`. x86-64 System V: `handle` in rdi, `name` in rsi. RTLD_DEFAULT and
/// RTLD_NEXT tail-jump to the real `dlsym` with the caller's return address untouched; other
/// handles tail-jump to [`dlsym_with_handle`]. If the real `dlsym` is not known yet, it is looked
/// up first with the arguments saved and the stack aligned.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "test rdi, rdi",
        "je 2f",
        "cmp rdi, -1",
        "je 2f",
        "jmp {with_handle}",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "je 3f",
        "jmp rax",
        "3:",
        // Entry: rsp = 8 mod 16. Two pushes and 8 bytes make it 0 mod 16 for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {ensure}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        with_handle = sym dlsym_with_handle,
        real = sym REAL_DLSYM,
        ensure = sym ensure_real_dlsym,
    )
}
