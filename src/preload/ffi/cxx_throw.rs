//! Raising a C++ exception from allocator mode's `alloc`, so the Python program sees a catchable
//! error instead of a tensor at address 0 (torch's pluggable allocator wraps whatever `alloc`
//! returns, NULL included, and calls no error hook).
//!
//! Torch turns C++ exceptions into Python ones at its binding layer: `c10::OutOfMemoryError`
//! becomes `torch.OutOfMemoryError` (what torch's own allocator raises), any other
//! `std::exception` a `RuntimeError`. So the exception is built from the process's own C++
//! runtime, found by name at run time (nothing here links libstdc++ or libc10):
//!
//! 1. `c10::OutOfMemoryError` when torch's `libc10.so` is loaded: the object is constructed by
//!    c10's exported `c10::Error(SourceLocation, std::string)` constructor, so its layout is
//!    exactly the one torch's catch sites read, and thrown with OutOfMemoryError's type info.
//!    The subclass adds no members (it only inherits constructors), so an `Error` object with
//!    that type info is what torch itself throws.
//! 2. `std::runtime_error` when c10's symbols are missing but a C++ runtime is loaded.
//! 3. Nothing: the caller returns NULL (a C program, which checks for it).
//!
//! The unwind runs through this module's frames, which is why the entry point and the
//! function-pointer types here use the `"C-unwind"` ABI (and why nothing on the way holds a lock
//! or a value with a destructor).

use oomshim_host::sys::fn_ptr::FnPtr;
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

/// `__cxa_allocate_exception(size)`.
type AllocateException = unsafe extern "C" fn(usize) -> *mut c_void;
/// `__cxa_throw(object, type_info, destructor)`: never returns.
type Throw = unsafe extern "C-unwind" fn(
    *mut c_void,
    *const c_void,
    Option<unsafe extern "C" fn(*mut c_void)>,
) -> !;
/// `operator new(size)` / `operator delete(ptr)`, for the std::string's heap buffer.
type OperatorNew = unsafe extern "C" fn(usize) -> *mut c_void;
type OperatorDelete = unsafe extern "C" fn(*mut c_void);
/// `c10::Error::Error(c10::SourceLocation, std::string)` (complete-object constructor).
type C10ErrorCtor = unsafe extern "C" fn(*mut c_void, SourceLocation, *mut CxxString);
/// `std::runtime_error::runtime_error(const char*)`.
type RuntimeErrorCtor = unsafe extern "C" fn(*mut c_void, *const c_char);

/// `c10::SourceLocation`: three words, passed by value (in memory, as C passes a 24-byte struct).
#[repr(C)]
#[derive(Clone, Copy)]
struct SourceLocation {
    function: *const c_char,
    file: *const c_char,
    line: u32,
}

/// libstdc++'s `std::__cxx11::basic_string<char>`: pointer, length, then 16 bytes that hold
/// either a short string in place or the heap capacity.
#[repr(C)]
struct CxxString {
    ptr: *mut u8,
    len: usize,
    local: [u8; 16],
}

/// Room for the exception object: `c10::Error` is about 200 bytes in torch 2.4–2.15; the
/// constructor writes only within the real size, the rest stays unused.
const OBJECT_BYTES: usize = 1024;

struct Runtime {
    allocate: AllocateException,
    throw: Throw,
    c10: Option<C10>,
    std_runtime_error: Option<StdRuntimeError>,
}

struct C10 {
    ctor: C10ErrorCtor,
    dtor: unsafe extern "C" fn(*mut c_void),
    oom_type: *const c_void,
    new: OperatorNew,
    delete: OperatorDelete,
}

struct StdRuntimeError {
    ctor: RuntimeErrorCtor,
    dtor: unsafe extern "C" fn(*mut c_void),
    type_info: *const c_void,
}

// SAFETY: the raw pointers are addresses of functions and type-info objects in loaded
// libraries, never written after the lookup.
unsafe impl Send for Runtime {}
// SAFETY: as for `Send`.
unsafe impl Sync for Runtime {}

/// Looks `name` up in the global scope, then in each loaded library of `sonames` (opened
/// `RTLD_NOLOAD`: only one the program already loaded). Python loads torch's extension with
/// `RTLD_LOCAL`, so libstdc++ and libc10 are usually *not* in the global scope. The handles
/// stay open: the pointers must outlive any `dlclose` of the program's.
fn sym_in(name: &CStr, sonames: &[&CStr]) -> Option<usize> {
    // Quiet lookups: the program's `dlerror()` never sees a probe of the shim's.
    // SAFETY: RTLD_DEFAULT is always a valid handle.
    let p = unsafe { oomshim_host::sys::quiet_dlsym(libc::RTLD_DEFAULT, name) };
    if p != 0 {
        return Some(p);
    }
    sonames.iter().find_map(|soname| {
        // SAFETY: a NUL-terminated soname.
        let h = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            oomshim_host::sys::clear_dl_error();
            return None;
        }
        // SAFETY: a handle dlopen just returned, kept open (never closed here).
        let p = unsafe { oomshim_host::sys::quiet_dlsym(h, name) };
        (p != 0).then_some(p)
    })
}

/// The function `name` ([`sym_in`]) as a function of type `F`.
///
/// # Safety
/// `F` is the C signature of `name`.
unsafe fn fn_in<F: FnPtr>(name: &CStr, sonames: &[&CStr]) -> Option<F> {
    // SAFETY: this function's contract; the objects searched stay loaded (`sym_in`).
    sym_in(name, sonames).and_then(|p| unsafe { F::from_addr(p) })
}

const STDCXX: &[&CStr] = &[c"libstdc++.so.6"];
const TORCH: &[&CStr] = &[
    c"libc10.so",
    c"libtorch_python.so",
    c"libtorch_cuda.so",
    c"libtorch_cpu.so",
];

/// An `abi::__si_class_type_info`: a class with one public non-virtual base. Used when torch
/// does not export `c10::OutOfMemoryError`'s own type info (torch 2.11 does not): the C++
/// runtime matches a catch clause to a thrown type by the type's *name* (libstdc++ compares
/// the mangled names unless a name starts with '*'), so a type info with the same name and base
/// is caught by torch's `catch (const c10::OutOfMemoryError&)`.
#[repr(C)]
struct SiClassTypeInfo {
    vtable: *const c_void,
    name: *const c_char,
    base: *const c_void,
}

/// Builds (once, leaked: it must live as long as any exception that uses it) the type info of
/// `c10::OutOfMemoryError` from libstdc++'s `__si_class_type_info` vtable and c10::Error's type
/// info (or std::exception's, when c10 hides it).
fn synthesized_oom_type() -> Option<*const c_void> {
    let vtable = sym_in(c"_ZTVN10__cxxabiv120__si_class_type_infoE", STDCXX)?;
    let base =
        sym_in(c"_ZTIN3c105ErrorE", TORCH).or_else(|| sym_in(c"_ZTISt9exception", STDCXX))?;
    let ti = Box::new(SiClassTypeInfo {
        // The type info's vtable pointer points past the offset-to-top and RTTI words.
        vtable: (vtable + 2 * std::mem::size_of::<usize>()) as *const c_void,
        name: c"N3c1016OutOfMemoryErrorE".as_ptr(),
        base: base as *const c_void,
    });
    Some(Box::leak(ti) as *const SiClassTypeInfo as *const c_void)
}

/// Destroys a thrown `c10::Error` through its own vtable: slot 0 of an Itanium vtable with a
/// virtual destructor is the complete-object destructor. (c10 does not export `~Error`.)
///
/// # Safety
/// `obj` is a constructed `c10::Error` (the C++ runtime calls this with the thrown object).
unsafe extern "C" fn destroy_via_vtable(obj: *mut c_void) {
    // SAFETY: a polymorphic object starts with its vtable pointer, whose slot 0 is the
    // complete-object destructor, `void (Error *)`.
    unsafe {
        let vtable = *(obj as *const *const usize);
        if let Some(complete_dtor) = <unsafe extern "C" fn(*mut c_void)>::from_addr(*vtable) {
            complete_dtor(obj);
        }
    }
}

fn runtime() -> Option<&'static Runtime> {
    // Looked up at the first failure, not at load time, and then kept: torch is loaded by then.
    static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
    RUNTIME
        // SAFETY: each type is the C signature of the symbol it is looked up by (the types
        // above); the objects searched stay loaded (`sym_in`).
        .get_or_init(|| unsafe {
            let allocate: AllocateException = fn_in(c"__cxa_allocate_exception", STDCXX)?;
            let throw: Throw = fn_in(c"__cxa_throw", STDCXX)?;
            let c10 = (|| {
                Some(C10 {
                    ctor: fn_in::<C10ErrorCtor>(
                        c"_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
                        TORCH,
                    )?,
                    dtor: match fn_in::<unsafe extern "C" fn(*mut c_void)>(
                        c"_ZN3c105ErrorD1Ev",
                        TORCH,
                    ) {
                        Some(f) => f,
                        None => destroy_via_vtable,
                    },
                    oom_type: match sym_in(c"_ZTIN3c1016OutOfMemoryErrorE", TORCH) {
                        Some(p) => p as *const c_void,
                        None => synthesized_oom_type()?,
                    },
                    new: fn_in::<OperatorNew>(c"_Znwm", STDCXX)?,
                    delete: fn_in::<OperatorDelete>(c"_ZdlPv", STDCXX)?,
                })
            })();
            let std_runtime_error = (|| {
                Some(StdRuntimeError {
                    ctor: fn_in::<RuntimeErrorCtor>(c"_ZNSt13runtime_errorC1EPKc", STDCXX)?,
                    dtor: fn_in::<unsafe extern "C" fn(*mut c_void)>(
                        c"_ZNSt13runtime_errorD1Ev",
                        STDCXX,
                    )?,
                    type_info: sym_in(c"_ZTISt13runtime_error", STDCXX)? as *const c_void,
                })
            })();
            Some(Runtime {
                allocate,
                throw,
                c10,
                std_runtime_error,
            })
        })
        .as_ref()
}

/// Which exception [`throw_out_of_memory`] would raise in this process.
pub(crate) fn exception_kind() -> &'static str {
    match runtime() {
        Some(r) if r.c10.is_some() => "torch.OutOfMemoryError",
        Some(r) if r.std_runtime_error.is_some() => "RuntimeError",
        _ => "none",
    }
}

/// Throws `std::runtime_error(message)` (a Python `RuntimeError` under torch): for CUDA errors
/// other than out-of-memory, which must not be caught by `except torch.OutOfMemoryError`.
/// Returns only when no C++ runtime is loaded.
///
/// # Safety
/// As [`throw_out_of_memory`].
pub(crate) unsafe fn throw_runtime_error(message: &[u8]) {
    let Some(rt) = runtime() else { return };
    let text = CStr::from_bytes_until_nul(message).unwrap_or(c"CUDA error (oomshim)");
    if let Some(e) = &rt.std_runtime_error {
        // SAFETY: the C++ runtime's own functions, called as `throw std::runtime_error(text)`
        // compiles to: room for the object (64 bytes, more than libstdc++'s 16), the
        // constructor on it, the throw with its type info and destructor. The unwind passes
        // only frames the caller's contract keeps free of destructors and locks.
        unsafe {
            let obj = (rt.allocate)(64);
            std::ptr::write_bytes(obj as *mut u8, 0, 64);
            (e.ctor)(obj, text.as_ptr());
            (rt.throw)(obj, e.type_info, Some(e.dtor));
        }
    }
}

/// Throws the out-of-memory exception with `message` (NUL-terminated). Returns only when no C++
/// runtime is loaded, so the caller can fall back to returning NULL.
///
/// # Safety
/// `message` must be NUL-terminated. Nothing with a destructor or a lock may be live in the
/// calling frames between the C++ caller and this call.
pub(crate) unsafe fn throw_out_of_memory(message: &[u8]) {
    let Some(rt) = runtime() else { return };
    let text = CStr::from_bytes_until_nul(message).unwrap_or(c"CUDA out of memory (oomshim)");
    if let Some(c10) = &rt.c10 {
        // SAFETY: as in `throw_runtime_error`, with c10's constructor, which takes a
        // `SourceLocation` by value and a `std::string` built as libstdc++ lays it out.
        unsafe {
            let obj = (rt.allocate)(OBJECT_BYTES);
            std::ptr::write_bytes(obj as *mut u8, 0, OBJECT_BYTES);
            // The string argument, built as libstdc++ lays it out; the constructor may move
            // from it.
            let bytes = text.to_bytes();
            let mut arg = CxxString {
                ptr: std::ptr::null_mut(),
                len: bytes.len(),
                local: [0; 16],
            };
            if bytes.len() < 16 {
                arg.local[..bytes.len()].copy_from_slice(bytes);
                arg.ptr = arg.local.as_mut_ptr();
            } else {
                let heap = (c10.new)(bytes.len() + 1) as *mut u8;
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), heap, bytes.len());
                *heap.add(bytes.len()) = 0;
                arg.ptr = heap;
                arg.local[..8].copy_from_slice(&bytes.len().to_ne_bytes());
            }
            let location = SourceLocation {
                function: c"oomshim_torch_alloc".as_ptr(),
                file: c"liboomshim.so (oomshim allocator mode)".as_ptr(),
                line: 0,
            };
            (c10.ctor)(obj, location, &mut arg);
            // The caller destroys a by-value argument (Itanium ABI): free the buffer unless the
            // constructor moved it out (a moved-from string points at its own local bytes).
            if arg.ptr != arg.local.as_mut_ptr() && !arg.ptr.is_null() {
                (c10.delete)(arg.ptr as *mut c_void);
            }
            (rt.throw)(obj, c10.oom_type, Some(c10.dtor));
        }
    }
    // No c10 in the process: the same text as a plain runtime error.
    // SAFETY: this function's contract, which is that function's.
    unsafe { throw_runtime_error(message) };
}
