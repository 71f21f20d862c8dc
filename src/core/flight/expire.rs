//! Regions nobody will read any more: those of processes that are gone (a region is left
//! behind only by a process that did not end on purpose) and those of other pid namespaces,
//! once nobody has written them for [`EXPIRE_AFTER`](super::EXPIRE_AFTER). A region of a
//! running process is never removed, whatever its age; nor one whose writer cannot be told
//! apart from a running one. Each shimmed process sweeps its live directory once, when it
//! creates its own region, so dead regions do not pile up in shared memory.

use super::read::scan;
use super::{Liveness, RegionId, EXPIRE_AFTER};
use std::path::Path;

/// Removes the stale regions of `dir` (see the module's comment) other than `own`'s; returns
/// how many went.
pub fn expire_stale(dir: &Path, own: &RegionId) -> usize {
    expire_older_than(dir, own, EXPIRE_AFTER)
}

/// [`expire_stale`] with another age (tests).
pub fn expire_older_than(dir: &Path, own: &RegionId, age: std::time::Duration) -> usize {
    let mut removed = 0;
    for r in scan(dir).regions {
        if r.id == *own || r.liveness == Liveness::Running {
            continue;
        }
        let idle = std::fs::symlink_metadata(&r.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|idle| idle >= age);
        // Looked at again just before: a writer of another namespace that published since is
        // alive after all.
        if idle
            && super::liveness(&r.id) != Liveness::Running
            && std::fs::remove_file(&r.path).is_ok()
        {
            removed += 1;
        }
    }
    removed
}
