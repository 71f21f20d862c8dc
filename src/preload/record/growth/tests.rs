use super::history::sample_spacing;
use super::model::*;
use super::*;
use dump::model::{Frame, Growth};
use oomshim_host::ledger::{Allocation, Api};
use oomshim_host::ledger::{Ledger, StackId};

const MIB: u64 = 1 << 20;

/// Native stacks are their own site in these tests; Python stack ids 1000.. stand for lines
/// (id / 10: two Python stacks of one line, as `Linear.forward` and `GELU.forward` under it).
fn keyer(native: StackId, python: StackId) -> SiteKey {
    if python != StackId::EMPTY {
        SiteKey::PyLine(python.0 / 10, 0)
    } else {
        SiteKey::Native(native)
    }
}

/// Frames naming a native stack: stacks 100..=199 are all `helper` (one function reached by
/// different paths), others `fn<id>`.
fn namer(pairs: &[StackPair]) -> Vec<Vec<Frame>> {
    pairs
        .iter()
        .map(|&(native, python)| {
            let name = if python != StackId::EMPTY {
                format!("line{}", python.0 / 10)
            } else if (100..200).contains(&native.0) {
                "helper".to_string()
            } else {
                format!("fn{}", native.0)
            };
            vec![Frame {
                address: format!("{:#x}", native.0),
                function: Some(name),
                file: Some("prog.c".into()),
                line: Some(1),
                ..Frame::default()
            }]
        })
        .collect()
}

/// A ledger and a tracker fed allocations as `record_alloc` feeds them.
struct Run {
    ledger: Ledger,
    t: Tracker,
    next_addr: usize,
}

impl Run {
    fn new() -> Run {
        Run {
            ledger: Ledger::new(),
            t: Tracker::new(),
            next_addr: 1 << 20,
        }
    }
    fn alloc_py(&mut self, site: u32, py: u32, bytes: u64) -> usize {
        self.next_addr += 4096;
        // At time 0: no time bucket ever closes after the first.
        record(&self.ledger, &self.t, self.next_addr, (site, py), bytes, 0);
        self.next_addr
    }
    fn alloc(&mut self, site: u32, bytes: u64) -> usize {
        self.alloc_py(site, 0, bytes)
    }
    fn free(&mut self, addr: usize) {
        self.ledger.take(addr);
    }
    fn mark(&mut self, source: StepSource) -> u64 {
        self.t.step(&self.ledger, &keyer, source, None)
    }
    fn growth(&self) -> Option<Growth> {
        self.t
            .analyse(Some(1 << 30), &self.ledger, &keyer, 0, namer)
    }
    /// One training step: the leak (site 1) and working memory (site 2) freed at once.
    fn step(&mut self) {
        self.alloc(1, 96 * MIB);
        let w = self.alloc(2, 32 * MIB);
        self.free(w);
    }
}

/// Records an allocation of `bytes` at `(native, python)` stacks, made `ms` into the run, as
/// `record_alloc` does: into the ledger, then the tracker's hot path.
fn record(ledger: &Ledger, t: &Tracker, addr: usize, stacks: (u32, u32), bytes: u64, ms: u64) {
    let a = Allocation {
        bytes,
        api: Api::CudaMalloc,
        device: 0,
        stream: 0,
        thread: 1,
        time_ns: ms * 1_000_000,
        seq: ledger.next_seq(),
        stack: StackId(stacks.0),
        py_stack: StackId(stacks.1),
    };
    ledger.record_alloc(addr, a);
    t.on_alloc(ledger, &keyer, &a);
}

/// An allocation of `bytes` at native site `stack`, made `ms` into the run.
fn at(ledger: &Ledger, t: &Tracker, addr: usize, stack: u32, bytes: u64, ms: u64) {
    record(ledger, t, addr, (stack, 0), bytes, ms);
}

#[test]
fn without_steps_growth_is_fitted_from_the_allocations_own_times_until_a_step_mark() {
    let ledger = Ledger::new();
    let t = Tracker::new();
    assert!(t.bucket_due(0), "the first allocation samples at once");
    let t = Tracker::new();
    // Site 7 keeps 8 MiB every 30 ms for 2.7 s; site 9 one 100 MiB block at the start.
    at(&ledger, &t, 1 << 30, 9, 100 * MIB, 0);
    for i in 0..90u64 {
        at(&ledger, &t, (i as usize + 1) << 20, 7, 8 * MIB, 10 + i * 30);
    }
    let now = 2_700 * 1_000_000;
    let g = t
        .analyse(Some(1 << 30), &ledger, &keyer, now, namer)
        .unwrap();
    assert_eq!(g.unit, "second");
    assert_eq!(g.steps.as_deref(), Some("timeline"));
    assert_eq!(g.current, 2);
    let f = g.fit.as_ref().expect("a steady growth");
    // 8 MiB per 30 ms is 266.7 MiB a second.
    let rate = 8.0 * MIB as f64 / 0.030;
    assert!(
        (f.bytes_per_step as f64 - rate).abs() < rate * 0.05,
        "{f:?}"
    );
    assert!(f.r_squared > 0.97, "{f:?}");
    assert_eq!(g.sites[0].stack[0].function.as_deref(), Some("fn7"));
    assert!(g.sites[0].share.unwrap() > 0.95, "{:?}", g.sites);
    assert!(g
        .sites
        .iter()
        .all(|s| s.stack[0].function.as_deref() != Some("fn9")));
    let tl = g.timeline.as_ref().unwrap();
    assert_eq!(tl.age_ms, 2_700);
    assert!((2_000..=2_700).contains(&tl.span_ms), "{tl:?}");
    assert!(tl.allocations >= 60 && tl.allocations <= 91, "{tl:?}");
    assert_eq!((tl.freed, tl.freed_all), (0, 0));
    assert!(tl.quiet_ms <= 40, "{tl:?}");
    // The once-a-second samples (frees counted) saw the same growth the timeline kept.
    let k = tl.kept_check.expect("samples at seconds 0, 1 and 2");
    assert!(
        k.actual_bytes > 0 && k.actual_bytes as u64 >= k.kept_bytes / 2,
        "{k:?}"
    );
    // The tracked series is shown at whole seconds, ending now.
    assert_eq!(g.tracked.first().unwrap().step, 0);
    assert_eq!(g.tracked.last().unwrap().step, 2);
    assert_eq!(
        g.tracked.last().unwrap().bytes,
        100 * MIB + 90 * 8 * MIB,
        "all that is live"
    );
    // A step mark ends the timeline: growth is per step from then on (one sample yet).
    assert_eq!(t.step(&ledger, &keyer, StepSource::Program, None), 1);
    assert!(!t.bucket_due(u64::MAX - 1));
    assert!(t.analyse(None, &ledger, &keyer, now, namer).is_none());
}

#[test]
fn a_cache_that_evicts_as_it_adds_is_no_growth_by_its_samples() {
    let ledger = Ledger::new();
    let t = Tracker::new();
    // 16 slots of 8 MiB, one replaced every 30 ms, for 6 s: 128 MiB all along.
    let mut slots: Vec<Option<usize>> = vec![None; 16];
    for i in 0..200u64 {
        let slot = (i % 16) as usize;
        if let Some(addr) = slots[slot].take() {
            ledger.take(addr);
        }
        let addr = (i as usize + 1) << 20;
        at(&ledger, &t, addr, 7, 8 * MIB, i * 30);
        slots[slot] = Some(addr);
    }
    let g = t
        .analyse(None, &ledger, &keyer, 6_000 * 1_000_000, namer)
        .unwrap();
    let tl = g.timeline.as_ref().unwrap();
    assert_eq!(tl.freed_all, 200 - 16);
    // Whatever the live allocations' times suggest, the samples saw no growth.
    if let Some(k) = tl.kept_check {
        assert!(
            k.actual_bytes <= 0 || (k.actual_bytes as u64) < k.kept_bytes / 2,
            "{k:?}"
        );
    }
    assert!(
        tl.span_ms * 2 < tl.age_ms,
        "recent allocations only: {tl:?}"
    );
}

#[test]
fn a_spike_killed_early_is_a_timeline_of_its_first_second() {
    let ledger = Ledger::new();
    let t = Tracker::new();
    for i in 0..20u64 {
        at(&ledger, &t, (i as usize + 1) << 20, 3, 32 * MIB, i * 20);
    }
    let g = t
        .analyse(None, &ledger, &keyer, 600 * 1_000_000, namer)
        .unwrap();
    let tl = g.timeline.as_ref().unwrap();
    assert_eq!(tl.age_ms, 600);
    // Its growth as it was (20 allocations over 0.4 s), then 0.2 s quiet before the end.
    assert_eq!(tl.allocations, 20, "{tl:?}");
    assert!((180..=240).contains(&tl.quiet_ms), "{tl:?}");
    let f = g.fit.as_ref().expect("the spike's growth");
    assert!(f.bytes_per_step > 1 << 30, "{f:?}");
    assert_eq!(g.tracked.last().unwrap().bytes, 640 * MIB);
    assert_eq!(g.sites[0].stack[0].function.as_deref(), Some("fn3"));
}

#[test]
fn ring_and_site_bounds() {
    let ledger = Ledger::new();
    let t = Tracker::new();
    for i in 0..(RING as u64 + 10) {
        for s in 0..(MAX_SITES as u32 + 20) {
            ledger.record_alloc(
                ((i as usize) << 32) + ((s as usize + 1) << 12),
                Allocation {
                    bytes: 1 + s as u64,
                    api: Api::CudaMalloc,
                    device: 0,
                    stream: 0,
                    thread: 1,
                    time_ns: 0,
                    seq: 1,
                    stack: StackId(1000 + s),
                    py_stack: StackId::EMPTY,
                },
            );
        }
        t.step(&ledger, &keyer, StepSource::Program, None);
    }
    let h = t.lock().unwrap();
    let marked = &h.marked[StepSource::Program as usize];
    assert_eq!(marked.sites.len(), MAX_SITES);
    assert!(marked.sites.values().all(|s| s.samples.len() <= RING));
    assert_eq!(marked.totals.len(), RING);
    // The smallest sites are the ones left out.
    assert!(!marked.sites.contains_key(&SiteKey::Native(StackId(1000))));
    drop(h);
    let g = t.analyse(Some(1 << 30), &ledger, &keyer, 0, namer).unwrap();
    assert_eq!(g.unit, "step");
    assert_eq!(g.steps.as_deref(), Some("marked"));
    assert_eq!(g.current, RING as u64 + 10);
    assert_eq!(g.sites.len(), MAX_REPORTED);
    // The largest site grows by its size every step.
    assert_eq!(g.sites[0].bytes_per_step, MAX_SITES as u64 + 20);
}

#[test]
fn a_repeating_step_is_detected_and_the_process_growth_fitted() {
    let mut r = Run::new();
    for _ in 0..4 {
        r.step();
    }
    assert_eq!(
        r.growth().and_then(|g| g.steps),
        Some("timeline".to_string()),
        "not confirmed yet: growth over time"
    );
    for _ in 4..20 {
        r.step();
    }
    let g = r.growth().expect("growth");
    assert_eq!(g.unit, "step");
    assert_eq!(g.steps.as_deref(), Some("detected"));
    let d = g.detected.as_ref().unwrap();
    assert_eq!(d.period, 2);
    assert_eq!(d.steps, 16, "steps 5..=20 counted from the confirmation");
    assert_eq!(d.freeing_intervals, d.intervals);
    assert_eq!(d.intervals, g.samples - 1);
    assert_eq!(d.allocations_since_last_step, 1, "the transient allocation");
    let fit = g.fit.as_ref().unwrap();
    assert_eq!(fit.bytes_per_step, 96 * MIB);
    assert_eq!(g.sites.len(), 1, "the working memory does not grow");
    assert_eq!(g.sites[0].bytes_per_step, 96 * MIB);
    assert_eq!(g.sites[0].share, Some(1.0));
    assert_eq!(g.sites[0].grouped_by.as_deref(), Some("native"));
    // A marked step wins for good: the marked history is what dumps show once it has two
    // samples, and no detected samples are taken after a mark.
    r.mark(StepSource::Program);
    r.step();
    r.mark(StepSource::Program);
    let g = r.growth().unwrap();
    assert_eq!(g.steps.as_deref(), Some("marked"));
    assert!(g.detected.is_none());
    for _ in 0..10 {
        r.step();
    }
    assert_eq!(
        r.growth().unwrap().samples,
        2,
        "no detected samples after a mark"
    );
}

#[test]
fn a_loop_that_only_allocates_one_site_is_not_a_step() {
    // Loading weights, growing a cache: the same site back to back (gap 1).
    let mut r = Run::new();
    for _ in 0..500 {
        r.alloc(5, 64 * MIB);
    }
    assert_eq!(
        r.growth().and_then(|g| g.steps),
        Some("timeline".to_string()),
        "no steps: growth over time"
    );
}

#[test]
fn a_leak_spread_over_many_stacks_is_the_process_growing() {
    // Every step leaks 1 MiB at each of 40 distinct stacks (a recursive helper reached by 40
    // paths: stacks 100..140 all name `helper`) and 2 MiB at `fn7`; nothing else grows.
    let mut r = Run::new();
    for step in 0..30u32 {
        for k in 0..40 {
            r.alloc(100 + k, MIB);
        }
        r.alloc(7, 2 * MIB);
        let w = r.alloc(8, 64 * MIB);
        r.free(w);
        r.mark(StepSource::Optimizer);
        let _ = step;
    }
    let g = r.growth().unwrap();
    assert_eq!(g.steps.as_deref(), Some("optimizer"));
    assert_eq!(g.fit.as_ref().unwrap().bytes_per_step, 42 * MIB);
    // The 40 stacks are one site by name, with 40/42 of the growth.
    assert_eq!(g.sites[0].bytes_per_step, 40 * MIB);
    assert_eq!(
        g.sites[0].stack[0].function.as_deref(),
        Some("helper"),
        "{:?}",
        g.sites[0]
    );
    assert!((g.sites[0].share.unwrap() - 40.0 / 42.0).abs() < 0.01);
    assert_eq!(g.sites[1].bytes_per_step, 2 * MIB);
}

#[test]
fn python_stacks_of_one_line_are_one_site() {
    // Two Python stacks (ids 50 and 51: `Linear.forward` and `GELU.forward`) under one line of
    // the program (line 5) each keep 8 MiB a step; a Python-less allocation keeps 4 MiB.
    let mut r = Run::new();
    for _ in 0..10 {
        r.alloc_py(1, 50, 8 * MIB);
        r.alloc_py(2, 51, 8 * MIB);
        r.alloc(3, 4 * MIB);
        r.mark(StepSource::Program);
    }
    let g = r.growth().unwrap();
    assert_eq!(g.sites[0].bytes_per_step, 16 * MIB);
    assert_eq!(g.sites[0].grouped_by.as_deref(), Some("python_line"));
    assert_eq!(g.sites[1].bytes_per_step, 4 * MIB);
}

#[test]
fn an_evaluation_phase_is_measured_by_its_forward_passes() {
    let mut r = Run::new();
    // Training: a forward pass and an optimizer step each step, nothing kept.
    for _ in 0..10 {
        let a = r.alloc(1, 64 * MIB);
        r.mark(StepSource::Forward);
        r.free(a);
        r.mark(StepSource::Optimizer);
    }
    let g = r.growth().unwrap();
    assert_eq!(
        g.steps.as_deref(),
        Some("optimizer"),
        "training: optimizer steps"
    );
    assert!(g.fit.is_none(), "nothing grows");
    // Evaluation without inference mode: every forward pass keeps 32 MiB of predictions.
    for _ in 0..12 {
        r.alloc(2, 32 * MIB);
        r.mark(StepSource::Forward);
    }
    let g = r.growth().unwrap();
    assert_eq!(g.steps.as_deref(), Some("forward"));
    let fit = g.fit.as_ref().unwrap();
    assert_eq!(fit.bytes_per_step, 32 * MIB);
    assert!(fit.samples >= 12, "{fit:?}");
    assert_eq!(g.sites[0].stack[0].function.as_deref(), Some("fn2"));
}

#[test]
fn a_leak_that_starts_late_is_fitted_from_where_it_starts() {
    let mut r = Run::new();
    for _ in 0..30 {
        r.step_without_leak();
        r.mark(StepSource::Program);
    }
    for _ in 0..20 {
        r.step();
        r.mark(StepSource::Program);
    }
    let g = r.growth().unwrap();
    let fit = g.fit.as_ref().unwrap();
    assert_eq!(fit.bytes_per_step, 96 * MIB);
    assert!((20..=22).contains(&fit.samples), "{fit:?}");
    assert!(fit.r_squared > 0.99);
}

#[test]
fn weights_loaded_before_the_first_step_are_no_growth() {
    let mut r = Run::new();
    for i in 0..50 {
        r.alloc(10 + i, 256 * MIB); // the model, loaded once
    }
    for _ in 0..10 {
        let a = r.alloc(1, 64 * MIB);
        r.free(a);
        r.mark(StepSource::Optimizer);
    }
    let g = r.growth().unwrap();
    assert!(g.fit.is_none(), "{:?}", g.fit);
    assert!(g.sites.is_empty());
}

impl Run {
    fn step_without_leak(&mut self) {
        let w = self.alloc(2, 32 * MIB);
        self.free(w);
    }
}

#[test]
fn detected_samples_cost_at_most_a_few_visits_per_allocation() {
    let mut r = Run::new();
    // 4000 live allocations first (a model, each from its own site: no cycle to hold on to),
    // then short steps.
    for i in 0..4000 {
        r.alloc(100 + i, 4096);
    }
    for _ in 0..1000 {
        r.step();
    }
    let h = r.t.lock().unwrap();
    // ~2000 allocations in detected steps; a sample needs (live - 1024) / 4 ≥ 744
    // allocations since the last: a handful of samples, not one per step.
    assert!(
        h.auto.samples >= 2 && h.auto.samples <= 4,
        "{}",
        h.auto.samples
    );
    drop(h);
    assert_eq!(sample_spacing(SAMPLE_FREE_LIVE), 1);
    assert_eq!(sample_spacing(SAMPLE_FREE_LIVE + 4 * 100), 100);
}

#[test]
fn request_sizes_ring_and_summary() {
    let mut r = Run::new();
    assert!(r.t.request_sizes().is_none());
    for i in 0..(sizes::SIZE_RING as u64 + 100) {
        // 3 of every 4 requests are 2 MiB; every 4th has a size of its own (dynamic).
        let bytes = if i % 4 == 3 {
            3 * MIB + i * 512
        } else {
            2 * MIB
        };
        let a = r.alloc(1, bytes);
        r.free(a);
    }
    let s = r.t.request_sizes().unwrap();
    assert_eq!(
        s.window,
        sizes::SIZE_RING as u64,
        "bounded to the most recent"
    );
    assert_eq!(
        s.top[0],
        dump::model::SizeCount {
            bytes: 2 * MIB,
            count: 3072
        }
    );
    assert_eq!(s.distinct, 1 + 1024);
    assert_eq!((s.large, s.distinct_large), (4096, 1025));
    assert_eq!(s.large_bytes, sizes::LARGE_REQUEST_BYTES);
    assert_eq!(s.top.len(), sizes::TOP_SIZES);
    let bins: u64 = s.bins.iter().map(|b| b.count).sum();
    assert_eq!(bins, 4096);
}

#[test]
fn a_cache_that_grows_with_the_shapes_is_no_growth_of_live_tensors() {
    // Under preload the tracked bytes are torch's segments: a run whose batches get longer
    // grows its cache every step, while torch's live tensors at every step end stay the same.
    let mut r = Run::new();
    for step in 1..=12u64 {
        r.alloc(1, step * 64 * MIB); // a new, larger segment; the old ones stay cached
        r.t.step(
            &r.ledger,
            &keyer,
            StepSource::Optimizer,
            Some(live(512 * MIB, Some(40))),
        );
    }
    let g = r.growth().unwrap();
    assert_eq!(g.framework_live.len(), 12);
    assert!(g.fit.is_none(), "{:?}", g.fit);
    // A real leak: the live tensors grow too.
    let mut r = Run::new();
    for step in 1..=12u64 {
        r.alloc(1, 64 * MIB);
        r.t.step(
            &r.ledger,
            &keyer,
            StepSource::Optimizer,
            Some(live(step * 64 * MIB, Some(40 + step))),
        );
    }
    let fit = r.growth().unwrap().fit.unwrap();
    assert_eq!(fit.of.as_deref(), Some("framework_live"));
    assert_eq!(fit.bytes_per_step, 64 * MIB);
    // The framework's tensor count over the fitted stretch, not the shim's segments.
    let c = fit.live_allocations.unwrap();
    assert_eq!((c.last - c.first, c.last), (fit.samples - 1, 52));
    assert!(r.t.growing(StepSource::Optimizer, MIB));
    assert!(
        !r.t.growing(StepSource::Program, MIB),
        "no marks of that source"
    );
}

fn live(bytes: u64, allocations: Option<u64>) -> super::FrameworkLive {
    super::FrameworkLive { bytes, allocations }
}

#[test]
fn the_fit_carries_the_live_allocations_of_its_first_and_last_sample() {
    // Tracked: one buffer replaced by a larger one each step (inputs of growing shape): the
    // bytes grow, one allocation is live throughout.
    let mut r = Run::new();
    let mut prev = None;
    for step in 1..=10u64 {
        let p = r.alloc(1, step * 64 * MIB);
        if let Some(old) = prev.replace(p) {
            r.free(old);
        }
        r.t.step(&r.ledger, &keyer, StepSource::Program, None);
    }
    let fit = r.growth().unwrap().fit.unwrap();
    assert_eq!(fit.bytes_per_step, 64 * MIB);
    assert_eq!(
        fit.live_allocations.map(|c| (c.first, c.last)),
        Some((1, 1))
    );
    // A count missing from one mark leaves the framework's series without counts.
    let mut r = Run::new();
    for step in 1..=8u64 {
        r.alloc(1, 64 * MIB);
        let count = (step != 5).then_some(step);
        r.t.step(
            &r.ledger,
            &keyer,
            StepSource::Optimizer,
            Some(live(step * 64 * MIB, count)),
        );
    }
    let fit = r.growth().unwrap().fit.unwrap();
    assert_eq!(fit.of.as_deref(), Some("framework_live"));
    assert_eq!(fit.live_allocations, None, "{fit:?}");
    // torch's cudaMallocAsync backend counts bytes but no allocations: no count.
    assert_eq!(super::FrameworkLive::new(64 * MIB, 0).allocations, None);
    assert_eq!(super::FrameworkLive::new(0, 0).allocations, Some(0));
    assert_eq!(
        super::FrameworkLive::new(64 * MIB, u64::MAX).allocations,
        None
    );
    assert_eq!(super::FrameworkLive::new(64 * MIB, 3).allocations, Some(3));
}
