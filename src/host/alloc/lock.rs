//! A spin-then-yield lock for one device's allocator state.
//!
//! Critical sections are a few tree and hash-map operations (well under a microsecond), so
//! spinning briefly beats a futex mutex: unlocking is a plain store rather than an atomic
//! read-modify-write, and an uncontended lock is one compare-exchange. After a short spin it
//! yields, because the holder may be descheduled (there are often more threads than cores).
//! A panic while the lock is held releases it on unwind (no poisoning): the allocator's state
//! stays consistent because every mutation is completed before any call that could panic.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// Safety: access to `value` is serialised by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// Safety: the lock owns its `T` and only moves it with itself, which `T: Send` allows.
unsafe impl<T: Send> Send for SpinLock<T> {}

pub(crate) struct SpinGuard<'a, T>(&'a SpinLock<T>);

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        SpinGuard(self)
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            // Spin on a plain load so waiters do not bounce the cache line with failed CASes.
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // Safety: the guard holds the lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // Safety: the guard holds the lock exclusively.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.0.locked.store(false, Ordering::Release);
    }
}
