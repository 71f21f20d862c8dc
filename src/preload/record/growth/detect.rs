//! Step detection for programs that mark no steps: a pure state machine fed with the
//! occurrences of one watched allocation site (the *anchor*), the site's distance to its previous
//! occurrence in allocations being the *gap*.
//!
//! A training step repeats the same allocations, so the anchor's gaps repeat as a cycle: a site
//! allocated once per step has one gap per cycle (the step's length); a site allocated in every
//! layer has several (`2, 2, 2, 2, 2, 10` for five layers and the rest of the step). The step is
//! the *whole* cycle: [`find_cycle`] looks for the shortest run of gaps that repeats
//! [`CYCLE_REPEATS`] times back to back at the end of the gap history, and a step is counted only
//! when the anchor completes that cycle again. A cycle learnt too early (five equal layer gaps
//! look like a cycle of one gap until the step's own gap appears) is replaced as soon as the
//! history shows the longer one; a cycle that stops matching ([`MAX_MISSES`] gaps in a row) is
//! dropped. An anchor that shows no cycle is given up for another site.

use std::collections::VecDeque;

/// Fewest allocations in a detected step: a site that allocates back to back (gap 1) is a loop
/// that only allocates (loading weights, growing a cache), not a step with working memory.
pub const DETECT_MIN_PERIOD: u64 = 2;
/// How long a new anchor is waited for, in allocations, at first: an anchor not seen again in
/// time is a one-off site (weights loaded once), and the site of the allocation at hand is
/// watched instead. Each such move doubles the wait, up to [`DETECT_MAX_PERIOD`], so a long step
/// is found too, after a few moves.
pub const DETECT_FIRST_WINDOW: u64 = 16;
/// Most allocations in a detected step (the longest wait for the anchor).
pub const DETECT_MAX_PERIOD: u64 = 1 << 16;
/// Times a cycle of gaps must occur back to back before it counts: twice happens by chance, a
/// loop repeats.
pub const CYCLE_REPEATS: usize = 4;
/// Most anchor occurrences in one cycle (a per-layer anchor in a model of this many layers).
pub const MAX_CYCLE_GAPS: usize = 256;
/// Gaps remembered: enough to confirm the longest cycle.
pub const GAP_HISTORY: usize = MAX_CYCLE_GAPS * CYCLE_REPEATS;
/// Gaps in a row that differ from the learnt cycle (and show no longer one) before the cycle
/// is dropped: one odd step (a logging allocation, a checkpoint) does not lose the steps.
pub const MAX_MISSES: u32 = 4;
/// Gaps seen at an anchor without any cycle before it is given up for another site.
pub const GIVE_UP_GAPS: usize = 64;
/// A confirmed cycle's anchor is waited for at least this many periods before the cycle is
/// lost (see `Detector::patience` for how long at most).
pub const DETECT_LOST_PERIODS: u64 = 8;

/// No anchor yet.
pub const NO_ANCHOR: u64 = u64::MAX;

/// What one occurrence changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing to sample.
    None,
    /// A cycle was confirmed (or replaced by a longer one): steps start now, at step 1; earlier
    /// samples described something else.
    Detected,
    /// The anchor completed its cycle: one more step.
    Step,
    /// The cycle was lost (the anchor stopped or stopped matching): no steps any more.
    Lost,
}

/// The detector's answer to the hot path: which site to watch and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    pub anchor: u64,
    /// Sequence number from which the anchor counts as not seen in time.
    pub deadline: u64,
    pub event: Event,
}

#[derive(Debug)]
pub struct Detector<S: Copy> {
    anchor: u64,
    /// A representative stack of the anchor, for naming it.
    pub anchor_stack: S,
    /// Sequence number of the anchor's last occurrence.
    pub last_seq: u64,
    /// Sequence number at which the anchor was taken.
    taken_seq: u64,
    gaps: VecDeque<u64>,
    /// The confirmed cycle of gaps; empty while learning.
    cycle: Vec<u64>,
    /// Index in `cycle` of the gap expected next.
    pos: usize,
    /// Allocations per step (the cycle's sum).
    pub period: u64,
    misses: u32,
    /// The anchor last given up: not taken again at once.
    rejected: u64,
    /// How long a new anchor is waited for (doubles at each move).
    window: u64,
    /// Steps counted since the cycle was confirmed.
    pub steps: u64,
}

impl<S: Copy> Detector<S> {
    pub fn new(empty: S) -> Self {
        Detector {
            anchor: NO_ANCHOR,
            anchor_stack: empty,
            last_seq: 0,
            taken_seq: 0,
            gaps: VecDeque::new(),
            cycle: Vec::new(),
            pos: 0,
            period: 0,
            misses: 0,
            rejected: NO_ANCHOR,
            window: DETECT_FIRST_WINDOW,
            steps: 0,
        }
    }

    /// True while a cycle is confirmed.
    pub fn detected(&self) -> bool {
        !self.cycle.is_empty()
    }

    /// An allocation at site `key` (the anchor, or any site once the anchor's deadline passed)
    /// with sequence number `seq`.
    pub fn observe(&mut self, key: u64, stack: S, seq: u64) -> Watch {
        if key != self.anchor {
            return self.move_anchor(key, stack, seq);
        }
        let gap = seq.saturating_sub(self.last_seq);
        self.last_seq = seq;
        if self.gaps.len() == GAP_HISTORY {
            self.gaps.pop_front();
        }
        self.gaps.push_back(gap);
        if self.detected() {
            return self.follow(gap, seq);
        }
        if let Some(cycle) = find_cycle(&self.gaps) {
            self.confirm(cycle);
            return self.watch(seq, Event::Detected);
        }
        if self.gaps.len() >= GIVE_UP_GAPS {
            // No cycle at this site: give it up for the next other site.
            self.rejected = key;
            self.anchor = NO_ANCHOR;
            return Watch {
                anchor: NO_ANCHOR,
                deadline: seq + 1,
                event: Event::None,
            };
        }
        // Wait at least two of the last gap for the next occurrence.
        let wait = self
            .window
            .max(gap.saturating_mul(2))
            .min(DETECT_MAX_PERIOD);
        Watch {
            anchor: key,
            deadline: seq.saturating_add(wait),
            event: Event::None,
        }
    }

    /// A gap while a cycle is confirmed.
    fn follow(&mut self, gap: u64, seq: u64) -> Watch {
        if gap == self.cycle[self.pos] {
            self.misses = 0;
        } else {
            // The history may show that the cycle learnt was part of a longer one.
            if let Some(longer) = find_cycle(&self.gaps).filter(|c| c.len() > self.cycle.len()) {
                self.confirm(longer);
                return self.watch(seq, Event::Detected);
            }
            self.misses += 1;
            if self.misses >= MAX_MISSES {
                self.lose();
                return Watch {
                    anchor: self.anchor,
                    deadline: seq.saturating_add(self.window),
                    event: Event::Lost,
                };
            }
        }
        self.pos += 1;
        let event = if self.pos == self.cycle.len() {
            self.pos = 0;
            self.steps += 1;
            Event::Step
        } else {
            Event::None
        };
        self.watch(seq, event)
    }

    fn confirm(&mut self, cycle: Vec<u64>) {
        self.period = cycle.iter().sum();
        self.cycle = cycle;
        self.pos = 0;
        self.misses = 0;
        self.steps = 1;
        // The next search, should this cycle end, starts with short waits again.
        self.window = DETECT_FIRST_WINDOW;
    }

    fn lose(&mut self) {
        self.cycle.clear();
        self.gaps.clear();
        self.period = 0;
        self.steps = 0;
        self.misses = 0;
    }

    fn watch(&self, seq: u64, event: Event) -> Watch {
        Watch {
            anchor: self.anchor,
            deadline: seq.saturating_add(DETECT_LOST_PERIODS.saturating_mul(self.period.max(1))),
            event,
        }
    }

    /// How long a confirmed cycle's anchor may be absent before the cycle is lost: eight
    /// periods, or four times the span over which the anchor has been seen, whichever is
    /// longer, up to [`DETECT_MAX_PERIOD`].
    ///
    /// The cycle learnt first is often one layer's, and a backward pass runs many layers'
    /// length without that site; losing the cycle there moved the anchor and cleared the gaps,
    /// so the whole step was never seen four times and the detector relearnt the layer at every
    /// step. A site seen across a whole forward pass is waited for through a backward pass of
    /// twice its length, and an anchor followed for many steps through an evaluation pass
    /// between them; weights loaded layer by layer (a cycle that ends for good) are given up
    /// after a few times their loading.
    fn patience(&self) -> u64 {
        let span = self.last_seq.saturating_sub(self.taken_seq);
        DETECT_LOST_PERIODS
            .saturating_mul(self.period)
            .max(span.saturating_mul(4))
            .min(DETECT_MAX_PERIOD)
    }

    /// The anchor was not seen in time (or none is set): watch `key` instead, unless a
    /// confirmed cycle's anchor is still within its [`patience`](Self::patience); then it is
    /// waited for again, twice as long each time (each expiry is one locked call).
    fn move_anchor(&mut self, key: u64, stack: S, seq: u64) -> Watch {
        let absent = seq.saturating_sub(self.last_seq);
        let patience = self.patience();
        if self.detected() && absent < patience {
            return Watch {
                anchor: self.anchor,
                deadline: self.last_seq + absent.saturating_mul(2).min(patience),
                event: Event::None,
            };
        }
        let lost = self.detected();
        if lost {
            self.lose();
        }
        let event = if lost { Event::Lost } else { Event::None };
        if key == self.rejected && self.anchor == NO_ANCHOR {
            // Just given up: look again a few allocations later.
            return Watch {
                anchor: NO_ANCHOR,
                deadline: seq + 16,
                event,
            };
        }
        let window = self.window;
        self.anchor = key;
        self.anchor_stack = stack;
        self.last_seq = seq;
        self.taken_seq = seq;
        self.gaps.clear();
        self.window = (window * 2).min(DETECT_MAX_PERIOD);
        Watch {
            anchor: key,
            deadline: seq.saturating_add(window),
            event,
        }
    }
}

/// The shortest cycle of gaps that the newest gaps repeat [`CYCLE_REPEATS`] times back to back,
/// whose steps have between [`DETECT_MIN_PERIOD`] and [`DETECT_MAX_PERIOD`] allocations.
/// Shortest: a cycle repeated twice is also a cycle of double length; the step is the shortest
/// run that repeats.
pub fn find_cycle(gaps: &VecDeque<u64>) -> Option<Vec<u64>> {
    let n = gaps.len();
    let newest = *gaps.back()?;
    // The shortest repeating run; its period decides (a run of 1-gaps repeated is still a
    // back-to-back loop, however many of them are taken together).
    let p = (1..=MAX_CYCLE_GAPS.min(n / CYCLE_REPEATS)).find(|&p| {
        // Quick refusal: the newest gap must equal the one a cycle earlier.
        gaps[n - 1 - p] == newest && {
            let window = p * CYCLE_REPEATS;
            (n - window + p..n).all(|i| gaps[i] == gaps[i - p])
        }
    })?;
    let cycle: Vec<u64> = gaps.range(n - p..).copied().collect();
    let period: u64 = cycle.iter().sum();
    (DETECT_MIN_PERIOD..=DETECT_MAX_PERIOD)
        .contains(&period)
        .then_some(cycle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds a stream of site keys (one allocation each) to a detector as the hot path does:
    /// only the anchor's occurrences, and any allocation once the deadline passed.
    struct Feed {
        d: Detector<()>,
        watch: Watch,
        seq: u64,
        events: Vec<(u64, Event)>,
    }

    impl Feed {
        fn new() -> Feed {
            Feed {
                d: Detector::new(()),
                watch: Watch {
                    anchor: NO_ANCHOR,
                    deadline: 0,
                    event: Event::None,
                },
                seq: 0,
                events: Vec::new(),
            }
        }
        fn alloc(&mut self, key: u64) {
            self.seq += 1;
            if key == self.watch.anchor || self.seq >= self.watch.deadline {
                self.watch = self.d.observe(key, (), self.seq);
                if self.watch.event != Event::None {
                    self.events.push((self.seq, self.watch.event));
                }
            }
        }
        fn steps(&self) -> usize {
            self.events.iter().filter(|e| e.1 == Event::Step).count()
        }
    }

    #[test]
    fn a_once_per_step_site_gives_one_step_per_cycle() {
        let mut f = Feed::new();
        for _ in 0..20 {
            f.alloc(1);
            f.alloc(2);
            f.alloc(3);
        }
        assert!(f.d.detected());
        assert_eq!(f.d.period, 3);
        // Confirmed after 4 equal gaps (the 5th occurrence), then one step per occurrence.
        assert_eq!(f.events[0].1, Event::Detected);
        assert_eq!(f.steps(), 15);
        assert_eq!(f.d.steps, 16);
    }

    #[test]
    fn a_layer_loop_is_not_taken_for_the_step() {
        // Each step: 6 layers of (weight, activation) then a loss and an update: the layer
        // site recurs with gaps 2,2,2,2,2 then 4. The step is the whole cycle of 16 allocations.
        let mut f = Feed::new();
        for _ in 0..64 {
            for _ in 0..6 {
                f.alloc(10);
                f.alloc(11);
            }
            f.alloc(20);
            f.alloc(21);
            f.alloc(22);
            f.alloc(23);
        }
        assert!(f.d.detected());
        assert_eq!(f.d.period, 16, "the step, not the layer");
        // A short cycle may be learnt first; the longer one replaces it within a few steps and
        // steps are then counted once per real step: at most 64, at least 55.
        assert!(
            (55..=64).contains(&(f.d.steps as usize)),
            "{} steps for 64 real ones; events {:?}",
            f.d.steps,
            &f.events[..f.events.len().min(12)]
        );
    }

    #[test]
    fn one_site_back_to_back_is_not_a_step() {
        let mut f = Feed::new();
        for _ in 0..500 {
            f.alloc(5);
        }
        assert!(!f.d.detected());
        assert!(f.events.is_empty());
    }

    #[test]
    fn a_step_of_a_a_b_is_found_at_either_site() {
        let mut f = Feed::new();
        for _ in 0..40 {
            f.alloc(1);
            f.alloc(1);
            f.alloc(2);
        }
        assert!(f.d.detected());
        assert_eq!(f.d.period, 3);
    }

    #[test]
    fn one_odd_step_keeps_the_cycle_and_a_new_phase_loses_it() {
        let mut f = Feed::new();
        for i in 0..30 {
            f.alloc(1);
            f.alloc(2);
            if i == 20 {
                f.alloc(99); // a checkpoint's allocation, once
            }
        }
        assert!(f.d.detected(), "{:?}", f.events);
        assert!(!f.events.iter().any(|e| e.1 == Event::Lost));
        // Another phase: the anchor stops for good.
        for _ in 0..200 {
            f.alloc(7);
            f.alloc(8);
            f.alloc(9);
        }
        assert!(f.events.iter().any(|e| e.1 == Event::Lost));
        // ... and the new phase's cycle is learnt.
        assert!(f.d.detected());
        assert_eq!(f.d.period, 3);
    }

    /// One step of a layered model as the allocator sees it: `layers` layers of `per_layer`
    /// allocations from the same lines (sites 100..), then a backward pass of `backward`
    /// allocations and an update of 3, each from its own site.
    fn layered_step(f: &mut Feed, layers: u64, per_layer: u64, backward: u64) {
        for _ in 0..layers {
            for site in 0..per_layer {
                f.alloc(100 + site);
            }
        }
        for site in 0..backward + 3 {
            f.alloc(1000 + site);
        }
    }

    #[test]
    fn a_layered_model_whose_backward_outlasts_eight_layers_keeps_one_step() {
        // 12 layers of 6, a backward of 72: the layer's cycle (6 allocations) is learnt first,
        // the backward then runs 12 of those cycles without the anchor. The step (147
        // allocations) must be found and kept, not relearnt at every step.
        let mut f = Feed::new();
        for _ in 0..120 {
            layered_step(&mut f, 12, 6, 72);
        }
        assert!(
            f.d.detected(),
            "{:?}",
            &f.events[f.events.len().saturating_sub(8)..]
        );
        assert_eq!(f.d.period, 12 * 6 + 72 + 3, "the whole step, not the layer");
        let count = |e: Event| f.events.iter().filter(|x| x.1 == e).count();
        assert_eq!(
            count(Event::Lost),
            0,
            "{:?}",
            &f.events[..f.events.len().min(40)]
        );
        assert!(
            count(Event::Detected) <= 2,
            "{:?}",
            &f.events[..f.events.len().min(40)]
        );
        // Once the step is learnt (within its first few), one step per real step.
        assert!(
            (110..=120).contains(&(f.d.steps as usize)),
            "{} steps counted since the last detection, for 120 real ones",
            f.d.steps
        );
    }

    #[test]
    fn a_pause_without_the_anchor_keeps_the_steps() {
        // Training, an evaluation pass of 2,000 allocations from other sites, training again:
        // the steps go on counting in the same cycle (a leak's trend spans the pause).
        let mut f = Feed::new();
        for _ in 0..30 {
            layered_step(&mut f, 4, 3, 20);
        }
        let before = f.d.steps;
        for i in 0..2000 {
            f.alloc(5000 + i % 7);
        }
        for _ in 0..30 {
            layered_step(&mut f, 4, 3, 20);
        }
        assert!(f.d.detected());
        assert_eq!(f.d.period, 4 * 3 + 23);
        assert!(
            !f.events.iter().any(|e| e.1 == Event::Lost),
            "{:?}",
            f.events
        );
        assert!(f.d.steps >= before + 29, "{} then {}", before, f.d.steps);
    }

    #[test]
    fn weights_loaded_layer_by_layer_give_way_to_the_training_steps() {
        // 48 layers of 7 parameters from the same lines (a cycle of 7 that ends for good), then
        // steps of 10 allocations: the loading cycle is given up after at most four times its
        // span and the steps are found soon after.
        let mut f = Feed::new();
        for _ in 0..48 {
            for site in 0..7 {
                f.alloc(100 + site);
            }
        }
        let loaded = f.seq;
        for _ in 0..400 {
            for site in 0..10 {
                f.alloc(200 + site);
            }
        }
        assert!(f.d.detected());
        assert_eq!(f.d.period, 10);
        let lost = f
            .events
            .iter()
            .find(|e| e.1 == Event::Lost)
            .expect("loading cycle lost");
        assert!(
            lost.0 <= loaded * 5,
            "lost at {} after loading {}",
            lost.0,
            loaded
        );
        let found = f.events.iter().rfind(|e| e.1 == Event::Detected).unwrap();
        assert!(
            found.0 < lost.0 + 200,
            "training found at {}, lost at {}",
            found.0,
            lost.0
        );
    }

    #[test]
    fn cycles_need_four_repeats() {
        let g = |v: &[u64]| find_cycle(&v.iter().copied().collect());
        assert_eq!(g(&[3, 3, 3, 3]), Some(vec![3]));
        assert_eq!(g(&[3, 3, 3]), None);
        assert_eq!(g(&[1, 1, 1, 1, 1]), None, "period 1 is no step");
        assert_eq!(g(&[1, 2, 1, 2, 1, 2, 1, 2]), Some(vec![1, 2]));
        assert_eq!(g(&[2, 1, 2, 1, 2, 1, 2]), None);
        assert_eq!(g(&[]), None);
    }
}
