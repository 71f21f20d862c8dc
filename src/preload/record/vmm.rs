//! CUDA virtual memory management (`cuMemCreate`, `cuMemMap`, …) as the driver accounts it:
//!
//! - Physical memory is what holds device memory. A `cuMemCreate` handle is recorded in the
//!   ledger as one allocation of its size, with the creating stack, on the device of its
//!   properties (host-located handles count as page-locked host memory). Its ledger key is the
//!   handle with bit 63 set ([`handle_key`]), which no device or host address has.
//! - Mappings (`cuMemMap`) and reserved address ranges (`cuMemAddressReserve`) are recorded as
//!   such: they hold no memory of their own.
//! - `cuMemRelease` of a handle that is still mapped keeps its memory held until the last
//!   `cuMemUnmap` of it, as the driver does.
//!
//! Every change that releases something is made before the real call (another thread may get the
//! same handle or address back the moment the driver frees it) and undone if the call fails.
//! The state lock is held only for bookkeeping, never across a call into CUDA.

use oomshim_host::ledger::{Api, Taken};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Ledger key of a VMM handle.
pub fn handle_key(handle: u64) -> usize {
    (handle | (1u64 << 63)) as usize
}

#[derive(Debug, Clone, Copy)]
pub struct Handle {
    /// Live mappings of this handle.
    maps: u32,
    /// `cuMemRelease` succeeded while mapped: gone at the last unmap.
    released: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    size: u64,
    handle: u64,
}

struct State {
    handles: BTreeMap<u64, Handle>,
    mappings: BTreeMap<u64, Mapping>,
    reserves: BTreeMap<u64, u64>,
}

static STATE: Mutex<State> = Mutex::new(State {
    handles: BTreeMap::new(),
    mappings: BTreeMap::new(),
    reserves: BTreeMap::new(),
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

oomshim_host::fork_held! {
    /// The VMM state's lock, held by the forking thread across `fork`.
    static FORK_HELD: MutexGuard<'static, State>;
}

/// `fork` prepare handler: takes the VMM state's lock (never held while another lock is taken:
/// the state is dropped before the ledger is reached).
pub(crate) fn fork_prepare() {
    FORK_HELD.hold(state());
}

/// `fork` parent and child handler: releases it.
pub(crate) fn fork_release() {
    FORK_HELD.release();
}

/// What to put back when the real call fails.
#[derive(Debug)]
pub enum VmmUndo {
    /// A release: the handle's record, and its ledger entry if it was taken.
    Release(u64, Handle, Option<Taken>),
    /// An unmap: the removed mappings and the handles (with ledger entries) freed by it.
    Unmap(Vec<(u64, Mapping)>, Vec<(u64, Handle, Option<Taken>)>),
    /// An address-range free.
    AddressFree(u64, u64),
}

/// A successful `cuMemCreate`, recorded in the ledger by `record(api, key, bytes, device)`.
pub fn created(
    handle: u64,
    bytes: u64,
    device: i32,
    host: bool,
    record: impl FnOnce(Api, usize, u64, i32),
) {
    let api = if host {
        Api::CuMemCreateHost
    } else {
        Api::CuMemCreate
    };
    record(
        api,
        handle_key(handle),
        bytes,
        if host { -1 } else { device },
    );
    state().handles.insert(
        handle,
        Handle {
            maps: 0,
            released: false,
        },
    );
}

/// Before `cuMemRelease(handle)`; `take` removes a freed handle's ledger entry.
pub fn release_begin(handle: u64, take: impl FnOnce(usize) -> Option<Taken>) -> Option<VmmUndo> {
    let mut st = state();
    let h = st.handles.get_mut(&handle)?;
    let before = *h;
    if h.maps > 0 {
        h.released = true;
        return Some(VmmUndo::Release(handle, before, None));
    }
    st.handles.remove(&handle);
    drop(st);
    let taken = take(handle_key(handle));
    Some(VmmUndo::Release(handle, before, taken))
}

/// A successful `cuMemMap`.
pub fn mapped(va: u64, size: u64, handle: u64) {
    let mut st = state();
    if let Some(h) = st.handles.get_mut(&handle) {
        h.maps += 1;
    }
    st.mappings.insert(va, Mapping { size, handle });
}

/// Before `cuMemUnmap(va, size)`: every mapping starting in the range goes; a released handle
/// whose last mapping goes is freed (`take` removes its ledger entry).
pub fn unmap_begin(
    va: u64,
    size: u64,
    mut take: impl FnMut(usize) -> Option<Taken>,
) -> Option<VmmUndo> {
    let mut st = state();
    let end = va.saturating_add(size.max(1));
    let starts: Vec<u64> = st.mappings.range(va..end).map(|(k, _)| *k).collect();
    if starts.is_empty() {
        return None;
    }
    let mut removed = Vec::new();
    let mut freed = Vec::new();
    for s in starts {
        let m = st.mappings.remove(&s).expect("listed");
        removed.push((s, m));
        if let Some(h) = st.handles.get_mut(&m.handle) {
            let before = *h;
            h.maps = h.maps.saturating_sub(1);
            if h.maps == 0 && h.released {
                st.handles.remove(&m.handle);
                freed.push((m.handle, before));
            }
        }
    }
    drop(st);
    let freed = freed
        .into_iter()
        .map(|(h, before)| (h, before, take(handle_key(h))))
        .collect();
    Some(VmmUndo::Unmap(removed, freed))
}

/// A successful `cuMemAddressReserve`.
pub fn reserved(va: u64, size: u64) {
    state().reserves.insert(va, size);
}

/// Before `cuMemAddressFree(va, …)`.
pub fn address_free_begin(va: u64) -> Option<VmmUndo> {
    let size = state().reserves.remove(&va)?;
    Some(VmmUndo::AddressFree(va, size))
}

/// The real call failed: put back what its `*_begin` removed (`reinstate` puts back a ledger
/// entry).
pub fn undo(u: VmmUndo, mut reinstate: impl FnMut(usize, Taken)) {
    match u {
        VmmUndo::Release(handle, before, taken) => {
            state().handles.insert(handle, before);
            if let Some(a) = taken {
                reinstate(handle_key(handle), a);
            }
        }
        VmmUndo::Unmap(removed, freed) => {
            let mut st = state();
            // Freed handles come back without mappings; every removed mapping then counts again.
            for (h, before, _) in &freed {
                st.handles.insert(*h, Handle { maps: 0, ..*before });
            }
            for (s, m) in removed {
                st.mappings.insert(s, m);
                if let Some(h) = st.handles.get_mut(&m.handle) {
                    h.maps += 1;
                }
            }
            drop(st);
            for (h, _, taken) in freed {
                if let Some(a) = taken {
                    reinstate(handle_key(h), a);
                }
            }
        }
        VmmUndo::AddressFree(va, size) => {
            state().reserves.insert(va, size);
        }
    }
}

/// Totals of the VMM state, for dumps and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmmTotals {
    /// Live physical handles (released-but-mapped ones included).
    pub handles: u64,
    /// Handles released while still mapped.
    pub released_mapped: u64,
    pub mappings: u64,
    pub mapped_bytes: u64,
    pub reserved_ranges: u64,
    pub reserved_bytes: u64,
}

pub fn totals() -> VmmTotals {
    let st = state();
    VmmTotals {
        handles: st.handles.len() as u64,
        released_mapped: st.handles.values().filter(|h| h.released).count() as u64,
        mappings: st.mappings.len() as u64,
        mapped_bytes: st.mappings.values().map(|m| m.size).sum(),
        reserved_ranges: st.reserves.len() as u64,
        reserved_bytes: st.reserves.values().sum(),
    }
}

/// The VMM layout for a dump: `None` when the process reserved and mapped nothing.
pub fn summary() -> Option<dump::model::VmmInfo> {
    use dump::model::{VmmInfo, VmmRange};
    let st = state();
    if st.reserves.is_empty() && st.mappings.is_empty() {
        return None;
    }
    let mut ranges: Vec<VmmRange> = st
        .reserves
        .iter()
        .map(|(&va, &size)| {
            let inside = st.mappings.range(va..va.saturating_add(size));
            let (n, bytes) = inside.fold((0u64, 0u64), |(n, b), (_, m)| (n + 1, b + m.size));
            VmmRange {
                address: format!("{va:#x}"),
                reserved_bytes: size,
                mapped_bytes: bytes,
                mappings: n,
            }
        })
        .collect();
    ranges.sort_by(|a, b| {
        b.mapped_bytes
            .cmp(&a.mapped_bytes)
            .then(a.address.cmp(&b.address))
    });
    ranges.truncate(20);
    Some(VmmInfo {
        reserved_ranges: st.reserves.len() as u64,
        reserved_bytes: st.reserves.values().sum(),
        mappings: st.mappings.len() as u64,
        mapped_bytes: st.mappings.values().map(|m| m.size).sum(),
        released_but_mapped: st.handles.values().filter(|h| h.released).count() as u64,
        ranges,
    })
}
