//! The ledger: every live allocation of the process (address → what, where, who, when, which
//! stack), per-device totals and peaks, and the interned stacks. Pure Rust; many threads record
//! into it at once, so the maps are sharded and the totals are atomics. No lock here is ever held
//! while calling out of this module.

use rustc_hash::FxHashMap;
use std::cell::UnsafeCell;
use std::hash::Hasher;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};

/// A lock for the ledger's shards. Critical sections are a hash-map insert or remove, so a
/// spin-then-yield lock is cheaper than a futex mutex: unlocking is a plain store, not an atomic
/// read-modify-write, which is a measurable share of a hooked call.
struct ShardLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// Safety: access to `value` is serialised by `locked`.
unsafe impl<T: Send> Sync for ShardLock<T> {}

struct ShardGuard<'a, T>(&'a ShardLock<T>);

impl<T> ShardLock<T> {
    fn new(value: T) -> Self {
        ShardLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    fn lock(&self) -> ShardGuard<'_, T> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The holder may be descheduled (or rehashing a large map): let it run.
                std::thread::yield_now();
            }
        }
        ShardGuard(self)
    }
}

impl<T> ShardLock<T> {
    /// Takes the lock and keeps it past any guard: for `fork`, which must not copy a shard
    /// another thread is changing. [`Self::force_unlock`] releases it (in the parent and the child).
    fn lock_for_fork(&self) {
        std::mem::forget(self.lock());
    }

    fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl<T> Deref for ShardGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a ShardGuard exists only while its shard's lock is held by it, so nothing
        // else reaches the value until the guard drops.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> DerefMut for ShardGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the guard's only borrow.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for ShardGuard<'_, T> {
    fn drop(&mut self) {
        self.0.locked.store(false, Ordering::Release);
    }
}

/// Devices with their own counters; higher indices share the last slot.
pub const MAX_DEVICES: usize = 64;
const SHARDS: usize = 64;

/// Which hooked function made an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Api {
    CudaMalloc,
    CudaMallocAsync,
    CudaMallocFromPoolAsync,
    CudaMallocManaged,
    CudaMallocPitch,
    CudaMalloc3D,
    CudaMallocHost,
    CudaHostAlloc,
    // Driver API (src/preload/ffi/driver.rs). Named as programs write them, without the `_v2`/`_ptsz`
    // of the exported symbol.
    CuMemAlloc,
    CuMemAllocPitch,
    CuMemAllocManaged,
    CuMemAllocAsync,
    CuMemAllocFromPoolAsync,
    CuMemAllocHost,
    CuMemHostAlloc,
    /// Physical memory of a VMM handle on a device (src/preload/record/vmm.rs).
    CuMemCreate,
    /// Physical memory of a VMM handle located in host memory (HOST/HOST_NUMA).
    CuMemCreateHost,
    /// A tensor handed to PyTorch by oomshim's own caching allocator (allocator mode,
    /// `oomshim_torch_alloc`); its segments are not in the ledger.
    TorchAlloc,
    /// Never an allocation: the failing "call" of an out-of-memory error a framework raised
    /// without any CUDA call failing (torch under `set_per_process_memory_fraction`, XLA inside
    /// its preallocated pool), reported by oomshim's Python hook.
    FrameworkAllocator,
}

impl Api {
    /// The name a dump's `api` field holds (spelled once, in `dump::api`).
    pub fn name(self) -> &'static str {
        use dump::api;
        match self {
            Api::CudaMalloc => api::CUDA_MALLOC,
            Api::CudaMallocAsync => api::CUDA_MALLOC_ASYNC,
            Api::CudaMallocFromPoolAsync => api::CUDA_MALLOC_FROM_POOL_ASYNC,
            Api::CudaMallocManaged => api::CUDA_MALLOC_MANAGED,
            Api::CudaMallocPitch => api::CUDA_MALLOC_PITCH,
            Api::CudaMalloc3D => api::CUDA_MALLOC_3D,
            Api::CudaMallocHost => api::CUDA_MALLOC_HOST,
            Api::CudaHostAlloc => api::CUDA_HOST_ALLOC,
            Api::CuMemAlloc => api::CU_MEM_ALLOC,
            Api::CuMemAllocPitch => api::CU_MEM_ALLOC_PITCH,
            Api::CuMemAllocManaged => api::CU_MEM_ALLOC_MANAGED,
            Api::CuMemAllocAsync => api::CU_MEM_ALLOC_ASYNC,
            Api::CuMemAllocFromPoolAsync => api::CU_MEM_ALLOC_FROM_POOL_ASYNC,
            Api::CuMemAllocHost => api::CU_MEM_ALLOC_HOST,
            Api::CuMemHostAlloc => api::CU_MEM_HOST_ALLOC,
            Api::CuMemCreate | Api::CuMemCreateHost => api::CU_MEM_CREATE,
            Api::TorchAlloc => api::TORCH_ALLOC,
            Api::FrameworkAllocator => api::FRAMEWORK_ALLOCATOR,
        }
    }

    /// Page-locked host memory: tracked, never counted as device memory.
    pub fn is_pinned_host(self) -> bool {
        matches!(
            self,
            Api::CudaMallocHost
                | Api::CudaHostAlloc
                | Api::CuMemAllocHost
                | Api::CuMemHostAlloc
                | Api::CuMemCreateHost
        )
    }

    /// Stream-ordered allocations: their stream is meaningful.
    pub fn has_stream(self) -> bool {
        matches!(
            self,
            Api::CudaMallocAsync
                | Api::CudaMallocFromPoolAsync
                | Api::CuMemAllocAsync
                | Api::CuMemAllocFromPoolAsync
        )
    }
}

/// Identifier of an interned stack; [`StackId::EMPTY`] when no stack was captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

impl StackId {
    pub const EMPTY: StackId = StackId(0);
}

/// One live allocation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    /// Bytes as the caller requested them.
    pub bytes: u64,
    pub api: Api,
    /// CUDA device ordinal; -1 for pinned host memory.
    pub device: i32,
    /// Stream handle (0 for APIs without one).
    pub stream: usize,
    /// Kernel thread id of the allocating thread.
    pub thread: u64,
    /// Nanoseconds since the shim started.
    pub time_ns: u64,
    /// 1 for the first allocation recorded, then increasing.
    pub seq: u64,
    /// Native stack (in the shim's native [`StackTable`]).
    pub stack: StackId,
    /// Python stack of the allocating thread (in the shim's second, Python [`StackTable`]:
    /// packed `(code id, offset)` frames from [`crate::pystack::capture_interned`]); EMPTY when
    /// the thread had none or Python stacks are off.
    pub py_stack: StackId,
}

/// Live bytes and peak of one device. The live count is not kept here: it is derived from the
/// shards when asked (rarely), which saves an atomic update on every call.
///
/// `wake_above` / `wake_below`: the live summary's watch ([`Ledger::watch`]). Bytes moving past
/// either ring the publisher's doorbell (`sys::doorbell`): one relaxed load and a compare per
/// allocation and free, in the cache line the update touches anyway; no lock, no system call
/// unless a mark is crossed.
struct Counters {
    bytes: AtomicU64,
    peak_bytes: AtomicU64,
    wake_above: AtomicU64,
    wake_below: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            bytes: AtomicU64::new(0),
            peak_bytes: AtomicU64::new(0),
            wake_above: AtomicU64::new(UNWATCHED_ABOVE),
            wake_below: AtomicU64::new(0),
        }
    }
}

/// A mark no byte count reaches: nothing watched.
const UNWATCHED_ABOVE: u64 = u64::MAX;

impl Counters {
    #[inline]
    fn add(&self, bytes: u64) {
        let now = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // A plain load first: the read-modify-write is needed only when a new peak is set.
        if now > self.peak_bytes.load(Ordering::Relaxed) {
            self.peak_bytes.fetch_max(now, Ordering::Relaxed);
        }
        if now >= self.wake_above.load(Ordering::Relaxed) {
            crate::sys::doorbell::ring();
        }
    }
    #[inline]
    fn sub(&self, bytes: u64) {
        let now = self
            .bytes
            .fetch_sub(bytes, Ordering::Relaxed)
            .wrapping_sub(bytes);
        if now < self.wake_below.load(Ordering::Relaxed) {
            crate::sys::doorbell::ring();
        }
    }
    /// Rings when the bytes reach `above` or fall below `below`.
    fn watch(&self, above: u64, below: u64) {
        self.wake_below.store(below, Ordering::Relaxed);
        self.wake_above.store(above, Ordering::Relaxed);
    }
}

/// Live bytes, live count and peak bytes of one device (or of pinned host memory).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes: u64,
    pub count: u64,
    pub peak_bytes: u64,
}

/// What a dump needs of the ledger, gathered in one pass over the shards, each under its own
/// lock: allocations racing with the pass may or may not be counted, but none twice. No copy of
/// every entry is made, so that the peak host memory of a dump stays near what the ledger
/// holds: the largest holders are kept to the asked number, the rest is summed per site.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The largest device allocations (pinned host memory is not a holder), largest first,
    /// the older first among equal sizes; at most the number asked.
    pub holders: Vec<(usize, Allocation)>,
    /// Every site of device allocations, (native stack, Python stack) → (bytes, count), in no
    /// particular order.
    pub sites: Vec<((StackId, StackId), u64, u64)>,
    /// Device allocations by (device, API, native stack) → (bytes, count), in no particular
    /// order: what the libraries that asked for memory hold (`facts::libraries`).
    pub by_stack: Vec<((i32, Api, StackId), u64, u64)>,
    /// Live allocations of every kind (device and pinned host).
    pub live_allocations: u64,
    /// (device, totals) for every device that ever held tracked memory.
    pub devices: Vec<(i32, Totals)>,
    pub pinned_host: Totals,
    pub unknown_frees: u64,
    pub total_allocations: u64,
}

/// The holders, sites and counts of a [`Snapshot`], fed one allocation at a time.
struct Gather {
    top: usize,
    holders: Vec<(usize, Allocation)>,
    sites: FxHashMap<(StackId, StackId), (u64, u64)>,
    by_stack: FxHashMap<(i32, Api, StackId), (u64, u64)>,
    live: u64,
    device_counts: [u64; MAX_DEVICES],
    pinned_count: u64,
}

fn holder_order(a: &(usize, Allocation), b: &(usize, Allocation)) -> std::cmp::Ordering {
    b.1.bytes.cmp(&a.1.bytes).then(a.1.seq.cmp(&b.1.seq))
}

impl Gather {
    fn new(top: usize) -> Self {
        Gather {
            top,
            holders: Vec::new(),
            sites: FxHashMap::default(),
            by_stack: FxHashMap::default(),
            live: 0,
            device_counts: [0; MAX_DEVICES],
            pinned_count: 0,
        }
    }

    fn add(&mut self, addr: usize, a: Allocation) {
        self.live += 1;
        if a.api.is_pinned_host() {
            self.pinned_count += 1;
            return;
        }
        self.device_counts[device_slot(a.device)] += 1;
        let e = self.sites.entry((a.stack, a.py_stack)).or_default();
        e.0 += a.bytes;
        e.1 += 1;
        let e = self.by_stack.entry((a.device, a.api, a.stack)).or_default();
        e.0 += a.bytes;
        e.1 += 1;
        if self.top == 0 {
            return;
        }
        self.holders.push((addr, a));
        // Amortised: trimmed back to `top` each time it doubles.
        if self.holders.len() >= self.top.saturating_mul(2).max(64) {
            self.trim();
        }
    }

    fn trim(&mut self) {
        self.holders.sort_unstable_by(holder_order);
        self.holders.truncate(self.top);
    }

    fn finish(mut self) -> Snapshot {
        self.trim();
        Snapshot {
            holders: self.holders,
            sites: self
                .sites
                .into_iter()
                .map(|(k, (b, c))| (k, b, c))
                .collect(),
            by_stack: self
                .by_stack
                .into_iter()
                .map(|(k, (b, c))| (k, b, c))
                .collect(),
            live_allocations: self.live,
            ..Snapshot::default()
        }
    }
}

impl Snapshot {
    /// The holders, sites and count of `allocations`, as [`Ledger::snapshot`] gathers them
    /// (no device totals): for tests and benches that state a ledger directly.
    pub fn of_allocations(
        allocations: impl IntoIterator<Item = (usize, Allocation)>,
        top: usize,
    ) -> Snapshot {
        let mut g = Gather::new(top);
        for (addr, a) in allocations {
            g.add(addr, a);
        }
        g.finish()
    }
}

mod table;
use table::{Record, Table};

/// An allocation taken out of the ledger by [`Ledger::take`], as stored: enough to put it back
/// ([`Ledger::reinstate`]) when its free fails, without reading its context on every free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken(Record);

impl Taken {
    pub fn bytes(&self) -> u64 {
        self.0.bytes()
    }
}

/// The totals' slot of pinned host memory in a record (devices are 0..MAX_DEVICES).
const PINNED_SLOT: u8 = MAX_DEVICES as u8;

/// The live allocations of one recorded context ([`Ledger::for_each_live_sum`]): several
/// contexts (other devices, streams or threads) may share an API and stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveSum {
    pub api: Api,
    pub stack: StackId,
    pub py_stack: StackId,
    pub bytes: u64,
    pub count: u64,
}

/// What allocations of one thread and call site share, interned once per distinct value
/// ([`Contexts`]); a ledger record keeps only its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Context {
    stack: StackId,
    py_stack: StackId,
    thread: u64,
    stream: usize,
    device: i32,
    api: Api,
}

impl Context {
    fn of(a: &Allocation) -> Context {
        Context {
            stack: a.stack,
            py_stack: a.py_stack,
            thread: a.thread,
            stream: a.stream,
            device: a.device,
            api: a.api,
        }
    }
}

/// Ids of contexts in chunks 0.. hold 256 << k each: ids up to about 2^32, and chunks never
/// move, so a context is read by id without a lock.
const CHUNK0_BITS: u32 = 8;
const CHUNKS: usize = 24;

/// Interned [`Context`]s: added under a lock, read by id without one (each is written before
/// its id is published through `len` and never changes after).
struct Contexts {
    ids: ShardLock<FxHashMap<Context, u32>>,
    chunks: [std::sync::atomic::AtomicPtr<Context>; CHUNKS],
    /// Unique to this table in the process: the key of a thread's cached last context.
    tag: u64,
}

fn chunk_of(id: u32) -> (usize, usize) {
    let n = u64::from(id) + (1 << CHUNK0_BITS);
    let k = (63 - n.leading_zeros() - CHUNK0_BITS) as usize;
    (k, (n - ((1u64 << CHUNK0_BITS) << k)) as usize)
}

fn chunk_len(k: usize) -> usize {
    (1usize << CHUNK0_BITS) << k
}

thread_local! {
    /// The calling thread's last context: (table tag, context, id). Most allocations of a
    /// thread repeat its previous one's context, found here without a lock.
    static LAST_CONTEXT: std::cell::Cell<(u64, Context, u32)> = const {
        std::cell::Cell::new((
            0,
            Context {
                stack: StackId::EMPTY,
                py_stack: StackId::EMPTY,
                thread: 0,
                stream: 0,
                device: 0,
                api: Api::CudaMalloc,
            },
            0,
        ))
    };
}

impl Contexts {
    fn new() -> Self {
        static TAGS: AtomicU64 = AtomicU64::new(1);
        Contexts {
            ids: ShardLock::new(FxHashMap::default()),
            chunks: std::array::from_fn(
                |_| std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            ),
            tag: TAGS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The id of `c`, adding it if new; `None` when the table is full or out of memory.
    #[inline]
    fn intern(&self, c: &Context) -> Option<u32> {
        if let Ok((tag, last, id)) = LAST_CONTEXT.try_with(|l| l.get()) {
            if tag == self.tag && last == *c {
                return Some(id);
            }
        }
        let id = self.intern_locked(c)?;
        let _ = LAST_CONTEXT.try_with(|l| l.set((self.tag, *c, id)));
        Some(id)
    }

    #[cold]
    fn intern_locked(&self, c: &Context) -> Option<u32> {
        let mut ids = self.ids.lock();
        if let Some(&id) = ids.get(c) {
            return Some(id);
        }
        let id = u32::try_from(ids.len()).ok()?;
        let (k, i) = chunk_of(id);
        if k >= CHUNKS {
            return None;
        }
        let mut chunk = self.chunks[k].load(Ordering::Acquire);
        if chunk.is_null() {
            let fresh: Box<[Context]> = vec![*c; chunk_len(k)].into_boxed_slice();
            chunk = Box::into_raw(fresh).cast::<Context>();
            self.chunks[k].store(chunk, Ordering::Release);
        }
        // SAFETY: i < chunk_len(k); slot `i` is not yet published (no record holds `id`), and
        // writers are serialised by `ids`' lock.
        unsafe { chunk.add(i).write(*c) };
        ids.insert(*c, id);
        Some(id)
    }

    /// The context of an id this table gave out.
    #[inline]
    fn get(&self, id: u32) -> Context {
        let (k, i) = chunk_of(id);
        let chunk = self.chunks[k.min(CHUNKS - 1)].load(Ordering::Acquire);
        assert!(
            !chunk.is_null() && k < CHUNKS,
            "a context id never given out"
        );
        // SAFETY: ids come from records, each written after its context (see `intern_locked`);
        // the shard lock the reader holds orders the two.
        unsafe { *chunk.add(i) }
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        for (k, c) in self.chunks.iter().enumerate() {
            let p = c.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: made by Box::into_raw of a boxed slice of chunk_len(k) contexts.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, chunk_len(k))) });
            }
        }
    }
}

pub struct Ledger {
    shards: Box<[ShardLock<Table>]>,
    contexts: Contexts,
    devices: Box<[Counters]>,
    pinned_host: Counters,
    unknown_frees: AtomicU64,
    /// Allocations passed through untracked (recording mode `pass-through`) whose free has not
    /// been seen: a free that finds no entry is one of them before it is an unknown free.
    untracked: AtomicU64,
    seq: AtomicU64,
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

fn shard_of(addr: usize) -> usize {
    // The top bits of the address's hash; the table's index uses the low ones.
    (table::hash(addr as u64) >> 58) as usize % SHARDS
}

fn device_slot(device: i32) -> usize {
    (device.max(0) as usize).min(MAX_DEVICES - 1)
}

impl Ledger {
    pub fn new() -> Self {
        Ledger {
            shards: (0..SHARDS)
                .map(|_| ShardLock::new(Table::default()))
                .collect(),
            contexts: Contexts::new(),
            devices: (0..MAX_DEVICES).map(|_| Counters::default()).collect(),
            pinned_host: Counters::default(),
            unknown_frees: AtomicU64::new(0),
            untracked: AtomicU64::new(0),
            seq: AtomicU64::new(0),
        }
    }

    /// An allocation was made without being recorded (pass-through): its free will find no
    /// entry, and is not counted as an unknown free.
    pub fn note_untracked(&self) {
        self.untracked.fetch_add(1, Ordering::Relaxed);
    }

    /// Before `fork`: takes every shard's lock, so the child gets no shard frozen mid-change
    /// by a thread that does not exist there. Undone by [`Self::after_fork`] in both processes.
    pub fn before_fork(&self) {
        self.contexts.ids.lock_for_fork();
        for s in self.shards.iter() {
            s.lock_for_fork();
        }
    }

    /// After `fork`, in the parent and in the child: releases what [`Self::before_fork`] took.
    pub fn after_fork(&self) {
        for s in self.shards.iter() {
            s.force_unlock();
        }
        self.contexts.ids.force_unlock();
    }

    /// Next allocation sequence number.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn slot(alloc: &Allocation) -> u8 {
        if alloc.api.is_pinned_host() {
            PINNED_SLOT
        } else {
            device_slot(alloc.device) as u8
        }
    }

    fn counters(&self, slot: u8) -> &Counters {
        match self.devices.get(slot as usize) {
            Some(c) => c,
            None => &self.pinned_host,
        }
    }

    fn shard(&self, addr: usize) -> ShardGuard<'_, Table> {
        self.shards[shard_of(addr)].lock()
    }

    fn allocation(&self, r: &Record) -> Allocation {
        let c = self.contexts.get(r.ctx());
        Allocation {
            bytes: r.bytes(),
            api: c.api,
            device: c.device,
            stream: c.stream,
            thread: c.thread,
            time_ns: r.time_ns(),
            seq: r.seq(),
            stack: c.stack,
            py_stack: c.py_stack,
        }
    }

    /// The record of `alloc`, its context interned; `None` when the ledger has no room.
    #[inline]
    fn record(&self, addr: usize, alloc: &Allocation) -> Option<Record> {
        let ctx = self.contexts.intern(&Context::of(alloc))?;
        Some(Record::new(
            addr,
            alloc.bytes.min(table::MAX_BYTES),
            Self::slot(alloc),
            alloc.seq,
            alloc.time_ns,
            ctx,
        ))
    }

    /// The allocation a [`Taken`] stands for (its context read back).
    pub fn allocation_of(&self, taken: &Taken) -> Allocation {
        self.allocation(&taken.0)
    }

    /// Records a successful allocation. If the address was already live (its free went through
    /// a path the shim does not see), the stale entry is replaced and returned. An allocation
    /// the ledger has no room for (host memory refused; a billion live) is passed through.
    pub fn record_alloc(&self, addr: usize, alloc: Allocation) -> Option<Allocation> {
        let Some(r) = self.record(addr, &alloc) else {
            self.note_untracked();
            return None;
        };
        let old = match self.shard(addr).insert(r) {
            Ok(old) => old,
            Err(()) => {
                self.note_untracked();
                return None;
            }
        };
        if let Some(o) = &old {
            self.counters(o.slot()).sub(o.bytes());
        }
        self.counters(r.slot()).add(r.bytes());
        old.map(|o| self.allocation(&o))
    }

    /// Removes an allocation before the real free runs, so that the address, once the runtime
    /// hands it out again, can never be confused with this one. Unknown addresses are counted.
    pub fn take(&self, addr: usize) -> Option<Taken> {
        let old = self.shard(addr).remove(addr as u64);
        match old {
            Some(r) => {
                self.counters(r.slot()).sub(r.bytes());
                Some(Taken(r))
            }
            None => {
                let passed_through = self
                    .untracked
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok();
                if !passed_through {
                    self.unknown_frees.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Puts back an allocation whose free failed (the memory is still held).
    pub fn reinstate(&self, addr: usize, taken: Taken) {
        let r = taken.0;
        debug_assert_eq!(r.addr, addr as u64);
        let mut shard = self.shard(addr);
        // Something may have been recorded at this address meanwhile; the newer entry wins.
        if shard.get(addr as u64).is_none() && shard.insert(r).is_ok() {
            drop(shard);
            self.counters(r.slot()).add(r.bytes());
        }
    }

    /// Arms the live summary's watch (see [`Counters`]): each device's bytes moving more than
    /// `threshold` away from what they are now ring the doorbell once. `None` disarms it.
    pub fn watch(&self, threshold: Option<u64>) {
        for c in self.devices.iter() {
            match threshold {
                Some(t) => {
                    let now = c.bytes.load(Ordering::Relaxed);
                    c.watch(
                        now.saturating_add(t.max(1)),
                        now.saturating_sub(t.max(1)).min(now),
                    );
                }
                None => c.watch(UNWATCHED_ABOVE, 0),
            }
        }
    }

    /// Arms the watch for the first device allocation: any byte recorded rings.
    pub fn watch_first(&self) {
        for c in self.devices.iter() {
            c.watch(1, 0);
        }
    }

    /// Live bytes of a device (one atomic load: cheap enough for the OOM path).
    pub fn device_bytes(&self, device: i32) -> u64 {
        self.devices[device_slot(device)]
            .bytes
            .load(Ordering::Relaxed)
    }

    /// Peak live bytes of a device since start.
    pub fn device_peak_bytes(&self, device: i32) -> u64 {
        self.devices[device_slot(device)]
            .peak_bytes
            .load(Ordering::Relaxed)
    }

    /// Bytes, count and peak of a device; the count walks every shard.
    pub fn device_totals(&self, device: i32) -> Totals {
        let slot = device_slot(device);
        self.totals(&self.devices[slot], |a| {
            !a.api.is_pinned_host() && device_slot(a.device) == slot
        })
    }

    pub fn pinned_host_totals(&self) -> Totals {
        self.totals(&self.pinned_host, |a| a.api.is_pinned_host())
    }

    fn totals(&self, c: &Counters, counts: impl Fn(&Allocation) -> bool) -> Totals {
        let mut count = 0;
        self.for_each_live(|a| count += u64::from(counts(a)));
        Totals {
            bytes: c.bytes.load(Ordering::Relaxed),
            count,
            peak_bytes: c.peak_bytes.load(Ordering::Relaxed),
        }
    }

    /// Allocations recorded since start.
    pub fn total_allocations(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees.load(Ordering::Relaxed)
    }

    /// Live allocations now (device and pinned host): one load per shard.
    pub fn live_count(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().len() as u64).sum()
    }

    /// Calls `f` for every live allocation, one shard at a time under that shard's lock (a cold
    /// path: growth samples). `f` must not call back into the ledger.
    pub fn for_each_live(&self, mut f: impl FnMut(&Allocation)) {
        self.for_each_live_at(|_, a| f(a));
    }

    /// Live bytes and allocations summed per recorded context (API, device, stream, thread and
    /// stacks), then `f` once per context with its API and stacks, after every shard's lock is
    /// released. A growth sample's walk: it reads only each record's size and context id, where
    /// [`Ledger::for_each_live`] builds every allocation.
    pub fn for_each_live_sum(&self, mut f: impl FnMut(&LiveSum)) {
        let mut by_context: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            for r in shard.iter() {
                let e = by_context.entry(r.ctx()).or_insert((0, 0));
                e.0 += r.bytes();
                e.1 += 1;
            }
        }
        for (ctx, (bytes, count)) in by_context {
            let c = self.contexts.get(ctx);
            f(&LiveSum {
                api: c.api,
                stack: c.stack,
                py_stack: c.py_stack,
                bytes,
                count,
            });
        }
    }

    fn for_each_live_at(&self, mut f: impl FnMut(usize, &Allocation)) {
        for shard in self.shards.iter() {
            let shard = shard.lock();
            for r in shard.iter() {
                f(r.addr as usize, &self.allocation(&r));
            }
        }
    }

    /// What a dump shows of the ledger: the `top` largest holders, every site's sum, the
    /// counts and totals (see [`Snapshot`]).
    pub fn snapshot(&self, top: usize) -> Snapshot {
        let mut g = Gather::new(top);
        self.for_each_live_at(|addr, a| g.add(addr, *a));
        let (device_counts, pinned_count) = (g.device_counts, g.pinned_count);
        let read = |c: &Counters, count: u64| Totals {
            bytes: c.bytes.load(Ordering::Relaxed),
            count,
            peak_bytes: c.peak_bytes.load(Ordering::Relaxed),
        };
        let devices = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, c)| (i as i32, read(c, device_counts[i])))
            .filter(|(_, t)| t.peak_bytes > 0 || t.count > 0)
            .collect();
        Snapshot {
            devices,
            pinned_host: read(&self.pinned_host, pinned_count),
            unknown_frees: self.unknown_frees(),
            total_allocations: self.seq.load(Ordering::Relaxed),
            ..g.finish()
        }
    }
}

/// Interned stacks: identical return-address lists share one [`StackId`]. Sharded by hash so
/// threads recording different stacks rarely meet on a lock.
pub struct StackTable {
    shards: Box<[ShardLock<StackShard>]>,
    /// Unique to this table in the process ([`Self::tag`]).
    tag: u64,
}

#[derive(Default)]
struct StackShard {
    /// Hash of a stack's frames ([`stack_hash`]) → index of the first stack with that hash;
    /// the rest are chained through `next_same_hash`. Keyed by the hash, not the frames, so a
    /// lookup hashes the frames once and each stack is stored once.
    by_hash: std::collections::HashMap<u64, u32, std::hash::BuildHasherDefault<HashIsKey>>,
    stacks: Vec<Box<[usize]>>,
    /// Next stack with the same hash, `NO_STACK` at the end of a chain.
    next_same_hash: Vec<u32>,
}

const NO_STACK: u32 = u32::MAX;

#[cfg(test)]
thread_local! {
    /// Tests only: interning keeps just a few bits of each hash, so most stacks share one.
    static COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The hasher of `by_hash`: its keys are already well-mixed hashes.
#[derive(Default)]
struct HashIsKey(u64);

impl Hasher for HashIsKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Hash of a stack's frames, on the allocation path: four independent multiply lanes (a
/// 32-frame stack is 8 dependent steps, not 32 as with one running hash), then a full
/// avalanche, so both the top bits (the shard) and the low bits (the map's bucket) are mixed.
#[inline]
fn stack_hash(frames: &[usize]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes: [u64; 4] = [
        0x243F_6A88_85A3_08D3,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    ];
    let mut chunks = frames.chunks_exact(4);
    for c in &mut chunks {
        for (lane, &f) in lanes.iter_mut().zip(c) {
            *lane = (*lane ^ f as u64).wrapping_mul(K).rotate_left(31);
        }
    }
    for (lane, &f) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane = (*lane ^ f as u64).wrapping_mul(K).rotate_left(31);
    }
    let mut h = (frames.len() as u64)
        ^ lanes[0]
        ^ lanes[1].rotate_left(17)
        ^ lanes[2].rotate_left(34)
        ^ lanes[3].rotate_left(51);
    // fmix64 (MurmurHash3's finaliser).
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

const STACK_SHARD_BITS: u32 = 5;
const STACK_SHARDS: usize = 1 << STACK_SHARD_BITS;
const STACK_INDEX_BITS: u32 = 32 - STACK_SHARD_BITS;

impl Default for StackTable {
    fn default() -> Self {
        Self::new()
    }
}

impl StackTable {
    pub fn new() -> Self {
        static TAGS: AtomicU64 = AtomicU64::new(1);
        StackTable {
            shards: (0..STACK_SHARDS)
                .map(|_| ShardLock::new(StackShard::default()))
                .collect(),
            tag: TAGS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A number no other table of this process has (never 0): the key under which
    /// [`crate::stacks::capture_interned`] keeps an id of this table for reuse.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Before `fork`: takes every shard's lock (see [`Ledger::before_fork`]).
    pub fn before_fork(&self) {
        for s in self.shards.iter() {
            s.lock_for_fork();
        }
    }

    /// After `fork`, in the parent and in the child: releases what `before_fork` took.
    pub fn after_fork(&self) {
        for s in self.shards.iter() {
            s.force_unlock();
        }
    }

    /// Returns the id of `frames`, adding it if new. An empty stack is [`StackId::EMPTY`]; a
    /// table that is full (2^27 stacks in a shard) also answers EMPTY rather than failing.
    pub fn intern(&self, frames: &[usize]) -> StackId {
        if frames.is_empty() {
            return StackId::EMPTY;
        }
        let hash = stack_hash(frames);
        #[cfg(test)]
        let hash = if COLLIDE.with(|c| c.get()) {
            hash & 0xF800_0000_0000_0003 // the shard's bits and four hashes per shard
        } else {
            hash
        };
        let shard_index = (hash >> (64 - STACK_SHARD_BITS)) as usize;
        let mut guard = self.shards[shard_index].lock();
        let shard = &mut *guard;
        let first = shard.by_hash.get(&hash).copied().unwrap_or(NO_STACK);
        let mut i = first;
        while i != NO_STACK {
            if *shard.stacks[i as usize] == *frames {
                return Self::id(shard_index, i);
            }
            i = shard.next_same_hash[i as usize];
        }
        let i = shard.stacks.len() as u32;
        if i >= (1 << STACK_INDEX_BITS) - 1 {
            return StackId::EMPTY;
        }
        shard.stacks.push(frames.into());
        shard.next_same_hash.push(first);
        shard.by_hash.insert(hash, i);
        Self::id(shard_index, i)
    }

    fn id(shard: usize, index: u32) -> StackId {
        // +1 keeps 0 free for EMPTY.
        StackId(((shard as u32) << STACK_INDEX_BITS | index) + 1)
    }

    /// The frames of a stack id; empty for EMPTY or an unknown id.
    pub fn frames(&self, id: StackId) -> Vec<usize> {
        if id == StackId::EMPTY {
            return Vec::new();
        }
        let raw = id.0 - 1;
        let shard = (raw >> STACK_INDEX_BITS) as usize;
        let index = (raw & ((1 << STACK_INDEX_BITS) - 1)) as usize;
        let Some(shard) = self.shards.get(shard) else {
            return Vec::new();
        };
        let shard = shard.lock();
        shard
            .stacks
            .get(index)
            .map(|s| s.to_vec())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn alloc(bytes: u64, api: Api, device: i32) -> Allocation {
        Allocation {
            bytes,
            api,
            device,
            stream: 0,
            thread: 1,
            time_ns: 0,
            seq: 0,
            stack: StackId::EMPTY,
            py_stack: StackId::EMPTY,
        }
    }

    #[test]
    fn totals_follow_allocs_and_frees() {
        let l = Ledger::new();
        l.record_alloc(0x1000, alloc(100, Api::CudaMalloc, 0));
        l.record_alloc(0x2000, alloc(50, Api::CudaMallocAsync, 0));
        l.record_alloc(0x3000, alloc(7, Api::CudaMalloc, 1));
        assert_eq!(
            l.device_totals(0),
            Totals {
                bytes: 150,
                count: 2,
                peak_bytes: 150
            }
        );
        assert_eq!(l.take(0x1000).map(|a| a.bytes()), Some(100));
        assert_eq!(
            l.device_totals(0),
            Totals {
                bytes: 50,
                count: 1,
                peak_bytes: 150
            }
        );
        assert_eq!(l.device_totals(1).bytes, 7);
        assert_eq!(l.unknown_frees(), 0);
    }

    #[test]
    fn pinned_host_is_never_device_memory() {
        let l = Ledger::new();
        l.record_alloc(0x5000, alloc(4096, Api::CudaMallocHost, -1));
        l.record_alloc(0x6000, alloc(8192, Api::CudaHostAlloc, -1));
        assert_eq!(l.device_totals(0).bytes, 0);
        assert_eq!(l.pinned_host_totals().bytes, 12288);
        assert!(l.snapshot(10).devices.is_empty());
    }

    #[test]
    fn unknown_free_is_counted_and_changes_nothing() {
        let l = Ledger::new();
        l.record_alloc(0x1000, alloc(100, Api::CudaMalloc, 0));
        assert!(l.take(0xdead00).is_none());
        assert!(l.take(0x1000).is_some());
        assert!(
            l.take(0x1000).is_none(),
            "double free is unknown the second time"
        );
        assert_eq!(l.unknown_frees(), 2);
        assert_eq!(l.device_totals(0).bytes, 0);
    }

    #[test]
    fn failed_free_is_reinstated() {
        let l = Ledger::new();
        l.record_alloc(0x1000, alloc(100, Api::CudaMalloc, 0));
        let a = l.take(0x1000).unwrap();
        l.reinstate(0x1000, a);
        assert_eq!(
            l.device_totals(0),
            Totals {
                bytes: 100,
                count: 1,
                peak_bytes: 100
            }
        );
        // An address already re-recorded by a newer allocation keeps the newer entry.
        let b = l.take(0x1000).unwrap();
        l.record_alloc(0x1000, alloc(30, Api::CudaMalloc, 0));
        l.reinstate(0x1000, b);
        assert_eq!(l.device_totals(0).bytes, 30);
    }

    #[test]
    fn reused_address_replaces_stale_entry() {
        let l = Ledger::new();
        l.record_alloc(0x1000, alloc(100, Api::CudaMalloc, 0));
        let old = l.record_alloc(0x1000, alloc(40, Api::CudaMalloc, 0));
        assert_eq!(old.map(|a| a.bytes), Some(100));
        assert_eq!(l.device_totals(0).bytes, 40);
        assert_eq!(l.device_totals(0).count, 1);
    }

    #[test]
    fn high_device_ordinals_share_the_last_slot() {
        let l = Ledger::new();
        l.record_alloc(0x1000, alloc(1, Api::CudaMalloc, 1000));
        assert_eq!(l.device_totals(MAX_DEVICES as i32 - 1).bytes, 1);
    }

    #[test]
    fn concurrent_threads_keep_exact_totals() {
        let l = Arc::new(Ledger::new());
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000usize {
                        let addr = (t << 32) | (i << 9);
                        l.record_alloc(addr, alloc(512, Api::CudaMalloc, (t % 2) as i32));
                        if i % 4 != 0 {
                            assert!(l.take(addr).is_some());
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let live = 16 * 5_000;
        let snap = l.snapshot(10);
        assert_eq!(snap.live_allocations, live as u64);
        assert_eq!(
            l.device_totals(0).bytes + l.device_totals(1).bytes,
            512 * live as u64
        );
        assert_eq!(
            l.device_totals(0).count + l.device_totals(1).count,
            live as u64
        );
    }

    /// Every field of an allocation comes back from the ledger as it went in (the time in
    /// whole microseconds), whatever its thread, stream, stacks and API share with others.
    #[test]
    fn allocations_come_back_whole() {
        let l = Ledger::new();
        let mut want = Vec::new();
        for i in 0..5_000u64 {
            let a = Allocation {
                bytes: i * 3 + 1,
                api: if i % 7 == 0 {
                    Api::CudaMallocHost
                } else {
                    Api::CuMemAllocAsync
                },
                device: if i % 7 == 0 { -1 } else { (i % 3) as i32 },
                stream: (i % 5) as usize * 0x1000,
                thread: 100 + i % 4,
                time_ns: i * 1_000_000 + 123_000,
                seq: l.next_seq(),
                stack: StackId((i % 11) as u32),
                py_stack: StackId((i % 13) as u32),
            };
            let addr = 0x7f00_0000_0000 + i as usize * 512;
            assert_eq!(l.record_alloc(addr, a), None);
            want.push((addr, a));
        }
        let mut seen = Vec::new();
        l.for_each_live(|a| seen.push(*a));
        seen.sort_by_key(|a| a.seq);
        assert_eq!(seen, want.iter().map(|w| w.1).collect::<Vec<_>>());
        // The sums per context are the allocations' sums by (API, stacks), whatever the split.
        let mut by_key: FxHashMap<(Api, StackId, StackId), (u64, u64)> = FxHashMap::default();
        for (_, a) in &want {
            let e = by_key.entry((a.api, a.stack, a.py_stack)).or_default();
            e.0 += a.bytes;
            e.1 += 1;
        }
        let mut summed: FxHashMap<(Api, StackId, StackId), (u64, u64)> = FxHashMap::default();
        l.for_each_live_sum(|s| {
            let e = summed.entry((s.api, s.stack, s.py_stack)).or_default();
            e.0 += s.bytes;
            e.1 += s.count;
        });
        assert_eq!(summed, by_key);
        for (addr, a) in want.iter().rev() {
            let taken = l.take(*addr).unwrap();
            assert_eq!(taken.bytes(), a.bytes);
            assert_eq!(l.allocation_of(&taken), *a);
        }
        assert_eq!(l.live_count(), 0);
        assert_eq!(l.unknown_frees(), 0);
    }

    /// A snapshot keeps the largest device holders (older first among equals), sums every
    /// site of device memory and counts everything, without pinned host memory as a holder.
    #[test]
    fn snapshot_keeps_top_holders_and_every_site() {
        let l = Ledger::new();
        let rec = |addr: usize, bytes: u64, api: Api, site: u32| {
            let mut a = alloc(bytes, api, if api.is_pinned_host() { -1 } else { 0 });
            a.seq = l.next_seq();
            a.stack = StackId(site);
            l.record_alloc(addr, a);
        };
        for i in 0..1_000usize {
            rec(
                0x10_0000 + i * 512,
                100 + (i % 10) as u64,
                Api::CudaMalloc,
                1 + (i % 3) as u32,
            );
        }
        rec(0x90_0000, 1 << 40, Api::CudaMallocHost, 9);
        rec(0x91_0000, 5_000, Api::CudaMalloc, 4);
        rec(0x92_0000, 5_000, Api::CudaMalloc, 4);
        let snap = l.snapshot(3);
        let holders: Vec<(usize, u64)> = snap.holders.iter().map(|(p, a)| (*p, a.bytes)).collect();
        assert_eq!(
            holders,
            [
                (0x91_0000, 5_000),
                (0x92_0000, 5_000),
                (0x10_0000 + 9 * 512, 109)
            ]
        );
        let mut sites = snap.sites.clone();
        sites.sort();
        let site = |k: u32| -> (u64, u64) {
            let (mut b, mut c) = (0, 0);
            for i in (0..1_000u64).filter(|i| 1 + (i % 3) as u32 == k) {
                b += 100 + i % 10;
                c += 1;
            }
            (b, c)
        };
        let want: Vec<_> = (1..=3)
            .map(|k| ((StackId(k), StackId::EMPTY), site(k).0, site(k).1))
            .chain([((StackId(4), StackId::EMPTY), 10_000, 2)])
            .collect();
        assert_eq!(sites, want);
        assert_eq!(snap.live_allocations, 1_003);
        assert_eq!(snap.pinned_host.count, 1);
        assert_eq!(snap.devices, vec![(0, l.device_totals(0))]);
        assert_eq!(snap.devices[0].1.count, 1_002);
    }

    #[test]
    fn stacks_intern_to_stable_ids() {
        let t = StackTable::new();
        let a = t.intern(&[1, 2, 3]);
        let b = t.intern(&[1, 2, 4]);
        assert_ne!(a, b);
        assert_eq!(t.intern(&[1, 2, 3]), a);
        assert_eq!(t.frames(a), vec![1, 2, 3]);
        assert_eq!(t.frames(b), vec![1, 2, 4]);
        assert_eq!(t.intern(&[]), StackId::EMPTY);
        assert!(t.frames(StackId::EMPTY).is_empty());
        assert!(t.frames(StackId(u32::MAX)).is_empty());
    }

    #[test]
    fn stacks_sharing_a_hash_keep_their_own_ids() {
        for collide in [false, true] {
            COLLIDE.with(|c| c.set(collide));
            let t = StackTable::new();
            let stacks: Vec<Vec<usize>> = (0..2000usize)
                .map(|i| (0..(i % 40 + 1)).map(|k| 0x40_0000 + i * 64 + k).collect())
                .collect();
            let ids: Vec<StackId> = stacks.iter().map(|f| t.intern(f)).collect();
            let distinct: std::collections::HashSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), stacks.len());
            for (f, id) in stacks.iter().zip(&ids) {
                assert_eq!(t.intern(f), *id);
                assert_eq!(&t.frames(*id), f);
            }
            COLLIDE.with(|c| c.set(false));
        }
    }
}
