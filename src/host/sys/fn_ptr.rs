//! The one place where an address from the dynamic loader becomes a function the shim can call.
//! Every lookup of a C function (`dlsym`, `dlvsym`, a vtable slot) hands its address to
//! [`FnPtr::from_addr`] with the function's type written at the lookup, instead of transmuting
//! an integer into whatever type the caller's context infers.

/// A C function pointer type: `extern "C" fn`, `unsafe extern "C" fn` or
/// `unsafe extern "C-unwind" fn`, of up to eight arguments.
///
/// # Safety
/// Implemented only for function pointer types, which are one address wide and never null.
pub unsafe trait FnPtr: Copy + Send + Sync + 'static {
    /// The function at `addr`, or `None` for address 0.
    ///
    /// # Safety
    /// A non-zero `addr` must be the address of a function whose C signature is `Self`'s, in an
    /// object that stays loaded while the pointer is used.
    unsafe fn from_addr(addr: usize) -> Option<Self>;
}

macro_rules! fn_ptr {
    ($($arg:ident),*) => {
        fn_ptr!(@one [extern "C" fn($($arg),*) -> R] $($arg),*);
        fn_ptr!(@one [unsafe extern "C" fn($($arg),*) -> R] $($arg),*);
        fn_ptr!(@one [unsafe extern "C-unwind" fn($($arg),*) -> R] $($arg),*);
    };
    (@one [$ty:ty] $($arg:ident),*) => {
        // SAFETY: a function pointer type.
        unsafe impl<R: 'static, $($arg: 'static),*> FnPtr for $ty {
            #[inline(always)]
            unsafe fn from_addr(addr: usize) -> Option<Self> {
                // SAFETY: a non-zero address of a function of this signature (the caller's
                // contract); function pointers are one address wide.
                (addr != 0).then(|| unsafe { std::mem::transmute::<usize, Self>(addr) })
            }
        }
    };
}

fn_ptr!();
fn_ptr!(A);
fn_ptr!(A, B);
fn_ptr!(A, B, C);
fn_ptr!(A, B, C, D);
fn_ptr!(A, B, C, D, E);
fn_ptr!(A, B, C, D, E, F);
fn_ptr!(A, B, C, D, E, F, G);
fn_ptr!(A, B, C, D, E, F, G, H);

#[cfg(test)]
mod tests {
    use super::FnPtr;

    extern "C" fn add(a: i32, b: i32) -> i32 {
        a + b
    }

    #[test]
    fn an_address_becomes_the_function_and_zero_becomes_none() {
        let addr = add as extern "C" fn(i32, i32) -> i32 as usize;
        // SAFETY: the address of `add`, whose signature this is.
        let f = unsafe { <unsafe extern "C" fn(i32, i32) -> i32>::from_addr(addr) }.unwrap();
        // SAFETY: `add` is safe to call with any integers.
        assert_eq!(unsafe { f(2, 3) }, 5);
        // SAFETY: address 0 is never dereferenced.
        assert!(unsafe { <extern "C" fn(i32, i32) -> i32>::from_addr(0) }.is_none());
    }
}
