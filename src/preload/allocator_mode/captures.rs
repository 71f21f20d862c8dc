//! CUDA graph captures allocator mode allocated for: the allocator keeps a capture's blocks for
//! the graph's replays until it is told the capture ended, which the hooks learn by asking CUDA
//! about the captures still open here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Captures whose end the allocator has not been told of yet: (stream, capture id). Checked
/// only while non-empty, so a program that never captures pays one atomic load.
pub struct OpenCaptures {
    open: Mutex<Vec<(usize, u64)>>,
    count: AtomicUsize,
}

impl OpenCaptures {
    pub const fn new() -> OpenCaptures {
        OpenCaptures {
            open: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        }
    }

    /// Capture `id` on `stream` allocated (kept once, however often it allocates).
    pub fn note(&self, stream: usize, id: u64) {
        if let Ok(mut v) = self.open.lock() {
            if !v.iter().any(|(_, i)| *i == id) {
                v.push((stream, id));
                self.count.store(v.len(), Ordering::Relaxed);
            }
        }
    }

    /// Finds the captures that ended, `capture_of(stream)` being the capture a stream is part of
    /// now (asked without the lock held: a call into CUDA), calls `end` with each and forgets
    /// them.
    pub fn retire(&self, capture_of: impl Fn(usize) -> Option<u64>, mut end: impl FnMut(u64)) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let open: Vec<(usize, u64)> = self.open.lock().map(|v| v.clone()).unwrap_or_default();
        let ended: Vec<u64> = open
            .iter()
            .filter(|(stream, id)| capture_of(*stream) != Some(*id))
            .map(|(_, id)| *id)
            .collect();
        if ended.is_empty() {
            return;
        }
        for id in &ended {
            end(*id);
        }
        if let Ok(mut v) = self.open.lock() {
            v.retain(|(_, id)| !ended.contains(id));
            self.count.store(v.len(), Ordering::Relaxed);
        }
    }
}

impl Default for OpenCaptures {
    fn default() -> OpenCaptures {
        OpenCaptures::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn ended(c: &OpenCaptures, capture_of: impl Fn(usize) -> Option<u64>) -> Vec<u64> {
        let mut v = Vec::new();
        c.retire(capture_of, |id| v.push(id));
        v
    }

    #[test]
    fn nothing_is_asked_while_no_capture_is_open() {
        let c = OpenCaptures::new();
        let asked = Cell::new(0);
        let v = ended(&c, |_| {
            asked.set(asked.get() + 1);
            None
        });
        assert!(v.is_empty());
        assert_eq!(asked.get(), 0);
    }

    #[test]
    fn a_capture_ends_once_when_its_stream_no_longer_runs_it() {
        let c = OpenCaptures::new();
        c.note(7, 100);
        c.note(7, 100);
        c.note(9, 200);
        // Both still capturing.
        assert!(ended(&c, |s| Some(if s == 7 { 100 } else { 200 })).is_empty());
        // Stream 7 ended its capture (or began another): only 100 ends.
        assert_eq!(ended(&c, |s| (s == 9).then_some(200)), [100]);
        assert!(ended(&c, |s| (s == 9).then_some(200)).is_empty());
        assert_eq!(ended(&c, |s| (s == 7).then_some(300)), [200]);
        let asked = Cell::new(0);
        ended(&c, |_| {
            asked.set(asked.get() + 1);
            None
        });
        assert_eq!(asked.get(), 0, "every capture retired");
    }
}
