//! The storage of one ledger shard: live allocations as dense 32-byte [`Record`]s, found by
//! address through an open-addressing index of 4-byte slots, so that a live allocation costs at
//! most 64 bytes of host memory. What an allocation shares with others of its thread and call
//! site (stacks, API, device, stream, thread) is not in the record: it is interned once in the
//! ledger's context table, and the record keeps its 32-bit id.
//!
//! Both arrays live in their own anonymous mappings, grown with `mremap`: pages never written
//! are never resident, a grown array is moved, not copied, and freeing one returns it to the
//! system at once (a `malloc`ed table would leave its old copy in the heap).

use std::marker::PhantomData;

/// One live allocation, as stored: 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(super) struct Record {
    pub addr: u64,
    /// Bytes (low 56 bits) | the totals' slot it counts in (high 8 bits; see `Ledger`), so a
    /// free adjusts the totals without reading the context.
    bytes_slot: u64,
    /// Sequence number (low 48 bits) << 16 | the context id's high 16 bits.
    seq_ctx: u64,
    /// Microseconds since the shim started (48 bits, about 8.9 years) << 16 | the context id's
    /// low 16 bits.
    time_ctx: u64,
}

const LOW48: u64 = (1 << 48) - 1;
/// Bytes a record holds at most (64 PiB): more is kept as this.
pub(super) const MAX_BYTES: u64 = (1 << 56) - 1;

impl Record {
    /// `bytes` at most [`MAX_BYTES`] (the caller clamps, and counts what it stored).
    pub fn new(addr: usize, bytes: u64, slot: u8, seq: u64, time_ns: u64, ctx: u32) -> Record {
        debug_assert!(bytes <= MAX_BYTES);
        let time_us = (time_ns / 1000).min(LOW48);
        Record {
            addr: addr as u64,
            bytes_slot: bytes | u64::from(slot) << 56,
            seq_ctx: (seq & LOW48) << 16 | u64::from(ctx >> 16),
            time_ctx: time_us << 16 | u64::from(ctx & 0xFFFF),
        }
    }
    pub fn bytes(&self) -> u64 {
        self.bytes_slot & MAX_BYTES
    }
    pub fn slot(&self) -> u8 {
        (self.bytes_slot >> 56) as u8
    }
    pub fn seq(&self) -> u64 {
        self.seq_ctx >> 16
    }
    /// Whole microseconds: an allocation's age needs no more (the shim's clock ticks in
    /// milliseconds).
    pub fn time_ns(&self) -> u64 {
        (self.time_ctx >> 16) * 1000
    }
    pub fn ctx(&self) -> u32 {
        ((self.seq_ctx & 0xFFFF) << 16 | (self.time_ctx & 0xFFFF)) as u32
    }
}

/// An array of `T` in an anonymous mapping (zero-filled), grown with `mremap`.
struct Pages<T: Copy> {
    ptr: *mut T,
    /// Elements the mapping holds; 0 with no mapping.
    cap: usize,
    _t: PhantomData<T>,
}

// Safety: the mapping is owned by this value alone.
unsafe impl<T: Copy + Send> Send for Pages<T> {}

const PAGE: usize = 4096;

impl<T: Copy> Pages<T> {
    const fn empty() -> Self {
        Pages {
            ptr: std::ptr::null_mut(),
            cap: 0,
            _t: PhantomData,
        }
    }

    fn bytes_for(cap: usize) -> Option<usize> {
        let b = cap.checked_mul(std::mem::size_of::<T>())?;
        Some(b.checked_add(PAGE - 1)? & !(PAGE - 1))
    }

    /// A fresh zero-filled array of at least `cap` elements; `None` when the system refuses.
    fn zeroed(cap: usize) -> Option<Self> {
        let bytes = Self::bytes_for(cap)?;
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Pages {
            ptr: p.cast(),
            cap: bytes / std::mem::size_of::<T>(),
            _t: PhantomData,
        })
    }

    /// Grows to at least `cap` elements, keeping the contents; false when the system refuses
    /// (the array is then unchanged).
    fn grow(&mut self, cap: usize) -> bool {
        if cap <= self.cap {
            return true;
        }
        if self.cap == 0 {
            return match Self::zeroed(cap) {
                Some(p) => {
                    *self = p;
                    true
                }
                None => false,
            };
        }
        let (Some(old), Some(new)) = (Self::bytes_for(self.cap), Self::bytes_for(cap)) else {
            return false;
        };
        // SAFETY: `ptr` is this value's own mapping of `old` bytes; MAYMOVE may move it, after
        // which only the returned address is used.
        let p = unsafe { libc::mremap(self.ptr.cast(), old, new, libc::MREMAP_MAYMOVE) };
        if p == libc::MAP_FAILED {
            return false;
        }
        self.ptr = p.cast();
        self.cap = new / std::mem::size_of::<T>();
        true
    }

    #[inline]
    fn get(&self, i: usize) -> T {
        debug_assert!(i < self.cap);
        // SAFETY: i < cap (callers index below their own length, itself at most cap); the
        // mapping is zero-filled, and every T here is valid when all zero.
        unsafe { *self.ptr.add(i) }
    }

    #[inline]
    fn set(&mut self, i: usize, v: T) {
        debug_assert!(i < self.cap);
        // SAFETY: as in `get`.
        unsafe { *self.ptr.add(i) = v }
    }
}

impl<T: Copy> Drop for Pages<T> {
    fn drop(&mut self) {
        if let Some(bytes) = Self::bytes_for(self.cap).filter(|_| self.cap > 0) {
            // SAFETY: the mapping is this value's own and nothing refers to it any more.
            unsafe { libc::munmap(self.ptr.cast(), bytes) };
        }
    }
}

/// A slot of the index: 0 empty, else a fingerprint of the address's hash (8 bits) << 24 |
/// the record's position + 1 (24 bits).
const POS_BITS: u32 = 24;
const POS_MASK: u32 = (1 << POS_BITS) - 1;
/// Records one shard holds at most (64 shards: about a billion live allocations in all).
pub(super) const MAX_RECORDS: usize = POS_MASK as usize - 1;
const MIN_INDEX_BITS: u32 = 10;

/// The hash of an address: CUDA addresses are aligned, so every bit is mixed (fmix64's steps).
#[inline]
pub(super) fn hash(addr: u64) -> u64 {
    let mut h = addr ^ (addr >> 33);
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^ (h >> 29)
}

#[inline]
fn fingerprint(h: u64) -> u32 {
    ((h >> 32) as u32 & 0xFF) << POS_BITS
}

/// Live allocations of one shard.
pub(super) struct Table {
    records: Pages<Record>,
    len: usize,
    index: Pages<u32>,
    /// The index has `1 << bits` slots (none when `index.cap` is 0).
    bits: u32,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            records: Pages::empty(),
            len: 0,
            index: Pages::empty(),
            bits: 0,
        }
    }
}

impl Table {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The records, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = Record> + '_ {
        (0..self.len).map(|i| self.records.get(i))
    }

    fn mask(&self) -> usize {
        (1usize << self.bits) - 1
    }

    /// (slot, position) of `addr`, or Err(the empty slot where it would go).
    #[inline]
    fn find(&self, addr: u64, h: u64) -> Result<(usize, usize), usize> {
        if self.index.cap == 0 {
            return Err(usize::MAX);
        }
        let mask = self.mask();
        let fp = fingerprint(h);
        let mut i = h as usize & mask;
        loop {
            let s = self.index.get(i);
            if s == 0 {
                return Err(i);
            }
            if s & !POS_MASK == fp {
                let pos = (s & POS_MASK) as usize - 1;
                if self.records.get(pos).addr == addr {
                    return Ok((i, pos));
                }
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, addr: u64) -> Option<Record> {
        self.find(addr, hash(addr))
            .ok()
            .map(|(_, pos)| self.records.get(pos))
    }

    /// Adds `r`, or replaces the record at its address and returns the old one. `Err(())` when
    /// the shard is full or the system refuses memory: nothing changed.
    #[inline]
    pub fn insert(&mut self, r: Record) -> Result<Option<Record>, ()> {
        let h = hash(r.addr);
        match self.find(r.addr, h) {
            Ok((_, pos)) => {
                let old = self.records.get(pos);
                self.records.set(pos, r);
                Ok(Some(old))
            }
            // At most 3/4 of the slots used: short probes, and 4 bytes / (3/8 .. 3/4) = 5.3
            // to 10.7 bytes of index per record. (No index yet: `bits` is 0, so never here.)
            Err(slot)
                if self.len < self.records.cap && (self.len + 1) * 4 <= (3usize << self.bits) =>
            {
                self.records.set(self.len, r);
                self.len += 1;
                self.index.set(slot, fingerprint(h) | self.len as u32);
                Ok(None)
            }
            Err(_) => self.insert_growing(r, h),
        }
    }

    /// [`Self::insert`] of a new address when the records or the index must grow first.
    #[cold]
    #[inline(never)]
    fn insert_growing(&mut self, r: Record, h: u64) -> Result<Option<Record>, ()> {
        if self.len >= MAX_RECORDS {
            return Err(());
        }
        if self.index.cap == 0 || (self.len + 1) * 4 > (3usize << self.bits) {
            let bits = (self.bits + 1).max(MIN_INDEX_BITS);
            if !self.rebuild(bits) {
                return Err(());
            }
        }
        if self.len == self.records.cap && !self.records.grow((self.len * 2).max(PAGE / 32)) {
            return Err(());
        }
        let Err(empty) = self.find(r.addr, h) else {
            unreachable!("a new address")
        };
        self.records.set(self.len, r);
        self.len += 1;
        self.index.set(empty, fingerprint(h) | self.len as u32);
        Ok(None)
    }

    /// A new index of `1 << bits` slots holding every record.
    fn rebuild(&mut self, bits: u32) -> bool {
        let Some(index) = Pages::<u32>::zeroed(1 << bits) else {
            return false;
        };
        self.index = index;
        self.bits = bits;
        let mask = self.mask();
        for pos in 0..self.len {
            let h = hash(self.records.get(pos).addr);
            let mut i = h as usize & mask;
            while self.index.get(i) != 0 {
                i = (i + 1) & mask;
            }
            self.index.set(i, fingerprint(h) | (pos as u32 + 1));
        }
        true
    }

    /// Removes the record at `addr` and returns it.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<Record> {
        let (slot, pos) = self.find(addr, hash(addr)).ok()?;
        let r = self.records.get(pos);
        self.delete_slot(slot);
        let last = self.len - 1;
        if pos != last {
            self.move_last(pos);
        }
        self.len = last;
        Some(r)
    }

    /// The last record moves into the hole at `pos`: its slot now names `pos`.
    #[inline(never)]
    fn move_last(&mut self, pos: usize) {
        let last = self.len - 1;
        let moved = self.records.get(last);
        let mask = self.mask();
        let mut i = hash(moved.addr) as usize & mask;
        loop {
            let s = self.index.get(i);
            debug_assert!(s != 0, "a record without a slot");
            if s & POS_MASK == last as u32 + 1 {
                self.index.set(i, (s & !POS_MASK) | (pos as u32 + 1));
                break;
            }
            i = (i + 1) & mask;
        }
        self.records.set(pos, moved);
    }

    /// Empties `slot`, moving later slots of its run back (linear probing without tombstones).
    #[inline]
    fn delete_slot(&mut self, slot: usize) {
        let mask = self.mask();
        let mut hole = slot;
        let mut j = (slot + 1) & mask;
        loop {
            let s = self.index.get(j);
            if s == 0 {
                break;
            }
            let home = hash(self.records.get((s & POS_MASK) as usize - 1).addr) as usize & mask;
            // The slot may move back to the hole when the hole lies between its home and it.
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.index.set(hole, s);
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.index.set(hole, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn rec(addr: u64, n: u64) -> Record {
        Record::new(addr as usize, n, (n % 65) as u8, n, n * 1000, n as u32)
    }

    #[test]
    fn records_pack_and_unpack() {
        let r = Record::new(
            0x7f00_1234_5600,
            MAX_BYTES,
            64,
            (1 << 48) - 2,
            1_234_567_000,
            0xDEAD_BEEF,
        );
        assert_eq!(r.addr, 0x7f00_1234_5600);
        assert_eq!(r.bytes(), MAX_BYTES);
        assert_eq!(r.slot(), 64);
        assert_eq!(r.seq(), (1 << 48) - 2);
        assert_eq!(r.time_ns(), 1_234_567_000);
        assert_eq!(r.ctx(), 0xDEAD_BEEF);
        assert_eq!(std::mem::size_of::<Record>(), 32);
    }

    /// The table agrees with a HashMap through inserts, replacements and removals in a mixed
    /// order, across index rebuilds, with addresses that collide in their low bits.
    #[test]
    fn matches_a_hash_map() {
        let mut t = Table::default();
        let mut m: HashMap<u64, Record> = HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct addresses: many hits, replacements and misses.
            let addr = 0x7f00_0000_0000 + (x % 5_000) * 512;
            if x.is_multiple_of(3) {
                assert_eq!(t.remove(addr), m.remove(&addr), "step {step}");
            } else {
                let r = rec(addr, step);
                assert_eq!(t.insert(r).unwrap(), m.insert(addr, r), "step {step}");
            }
            assert_eq!(t.len(), m.len());
        }
        for (addr, r) in &m {
            assert_eq!(t.get(*addr), Some(*r));
        }
        let mut all: Vec<_> = t.iter().collect();
        all.sort_by_key(|r| r.addr);
        let mut want: Vec<_> = m.values().copied().collect();
        want.sort_by_key(|r| r.addr);
        assert_eq!(all, want);
        for addr in m.keys() {
            assert!(t.remove(*addr).is_some());
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.get(0x7f00_0000_0000), None);
    }

    #[test]
    fn grows_to_many_records() {
        let mut t = Table::default();
        for i in 0..300_000u64 {
            assert_eq!(t.insert(rec(i << 12, i)), Ok(None));
        }
        for i in (0..300_000u64).step_by(7) {
            assert_eq!(t.get(i << 12).map(|r| r.bytes()), Some(i));
        }
        assert_eq!(t.remove(5 << 12).map(|r| r.seq()), Some(5));
        assert_eq!(t.len(), 299_999);
    }
}
