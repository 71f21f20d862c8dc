//! Stream-ordered memory pools. Bytes freed with `cudaFreeAsync`/`cuMemFreeAsync` leave the ledger
//! but stay reserved by their pool, so a dump reports each pool the process allocated from:
//! the default and current pool of every device that saw a stream-ordered allocation, plus the
//! pools passed explicitly to `cuMemAllocFromPoolAsync`. They are asked
//! (`cuMemPoolGetAttribute`) only at an out-of-memory failure, on the failing thread, or by
//! `oomshim_dump` on the calling thread: a process without stream-ordered allocations asks nothing.

use super::real::RealFn;
use dump::model::PoolInfo;
use oomshim_host::sys::cuda_error::SUCCESS;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Devices (bit = ordinal, < 64) that made stream-ordered allocations.
static DEVICES: AtomicU64 = AtomicU64::new(0);
/// Explicit pools seen (0 = empty slot), with their device in [`EXPLICIT_DEVICE`].
const MAX_EXPLICIT: usize = 16;
static EXPLICIT: [AtomicUsize; MAX_EXPLICIT] = [const { AtomicUsize::new(0) }; MAX_EXPLICIT];
static EXPLICIT_DEVICE: [AtomicUsize; MAX_EXPLICIT] = [const { AtomicUsize::new(0) }; MAX_EXPLICIT];

const RESERVED_MEM_CURRENT: c_int = 5;
const USED_MEM_CURRENT: c_int = 7;

/// A stream-ordered allocation succeeded on `device` (from `pool` when one was named).
pub(crate) fn note(device: i32, pool: Option<usize>) {
    if (0..64).contains(&device) {
        let bit = 1u64 << device;
        if DEVICES.load(Ordering::Relaxed) & bit == 0 {
            DEVICES.fetch_or(bit, Ordering::Relaxed);
        }
    }
    let Some(pool) = pool.filter(|p| *p != 0) else {
        return;
    };
    for (slot, dev) in EXPLICIT.iter().zip(&EXPLICIT_DEVICE) {
        match slot.load(Ordering::Acquire) {
            p if p == pool => return,
            0 => {
                if slot
                    .compare_exchange(0, pool, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    dev.store(device as usize, Ordering::Release);
                    return;
                }
                if slot.load(Ordering::Acquire) == pool {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// True when `device` has pools worth asking about.
fn relevant(device: i32) -> bool {
    let by_device =
        (0..64).contains(&device) && DEVICES.load(Ordering::Relaxed) & (1u64 << device) != 0;
    by_device
        || EXPLICIT.iter().zip(&EXPLICIT_DEVICE).any(|(p, d)| {
            p.load(Ordering::Acquire) != 0 && d.load(Ordering::Acquire) as i32 == device
        })
}

/// `CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)`.
type GetAttribute = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
/// `CUresult cuDeviceGet(Default)MemPool(CUmemoryPool *pool, CUdevice dev)`.
type GetPool = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;

fn attribute(get: GetAttribute, pool: usize, attr: c_int) -> Option<u64> {
    let mut v: u64 = 0;
    // SAFETY: a pool the driver handed out; both attributes asked write a `cuuint64_t`.
    (unsafe { get(pool as *mut c_void, attr, &mut v as *mut u64 as *mut c_void) } == SUCCESS)
        .then_some(v)
}

/// The pools of `device`, asked now on the calling thread (empty when it has none).
pub(crate) fn snapshot(device: i32) -> Vec<PoolInfo> {
    if !relevant(device) {
        return Vec::new();
    }
    // SAFETY: `cuDeviceGetDefaultMemPool`'s signature is `GetPool`.
    static DEFAULT: RealFn<GetPool> = unsafe { RealFn::driver(c"cuDeviceGetDefaultMemPool") };
    // SAFETY: `cuDeviceGetMemPool`'s signature is `GetPool`.
    static CURRENT: RealFn<GetPool> = unsafe { RealFn::driver(c"cuDeviceGetMemPool") };
    // SAFETY: `cuMemPoolGetAttribute`'s signature is `GetAttribute`.
    static GET_ATTR: RealFn<GetAttribute> = unsafe { RealFn::driver(c"cuMemPoolGetAttribute") };
    let Some(get) = GET_ATTR.get() else {
        return Vec::new();
    };
    let mut pools: Vec<usize> = Vec::new();
    for h in [&DEFAULT, &CURRENT] {
        if let Some(f) = h.get() {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-parameter.
            if unsafe { f(&mut p, device) } == SUCCESS && !p.is_null() {
                pools.push(p as usize);
            }
        }
    }
    for (p, d) in EXPLICIT.iter().zip(&EXPLICIT_DEVICE) {
        let p = p.load(Ordering::Acquire);
        if p != 0 && d.load(Ordering::Acquire) as i32 == device {
            pools.push(p);
        }
    }
    pools.sort_unstable();
    pools.dedup();
    pools
        .into_iter()
        .filter_map(|pool| {
            let reserved = attribute(get, pool, RESERVED_MEM_CURRENT)?;
            let used = attribute(get, pool, USED_MEM_CURRENT)?;
            Some(PoolInfo {
                device,
                pool: format!("{pool:#x}"),
                reserved_bytes: reserved,
                used_bytes: used,
                cached_bytes: reserved.saturating_sub(used),
            })
        })
        .collect()
}
