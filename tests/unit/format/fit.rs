//! Unit tests of `dump::fit` (src/format/fit.rs).

use dump::fit::*;

fn pts(ys: &[u64]) -> Vec<(u64, u64)> {
    ys.iter()
        .enumerate()
        .map(|(i, &y)| (i as u64 + 1, y))
        .collect()
}

#[test]
fn growing_table() {
    let mib = 1u64 << 20;
    // (samples, growing?, slope when growing)
    let cases: &[(&[u64], bool, f64)] = &[
        (
            &[0, 96 * mib, 192 * mib, 288 * mib],
            true,
            96.0 * mib as f64,
        ), // exact linear
        (&[0, 96 * mib, 192 * mib], false, 0.0), // too few samples
        (&[5, 5, 5, 5, 5], false, 0.0),          // flat
        (&[400, 300, 200, 100], false, 0.0),     // shrinking
        (&[0, 100, 0, 100, 0, 100], false, 0.0), // oscillating
        (&[0, 110, 190, 310, 400, 490], true, 98.0), // noisy but steady
        (&[0, 0, 0, 0, 0, 1000], false, 0.0),    // one jump: R² 0.71
    ];
    for (ys, want, slope) in cases {
        let f = growing(&pts(ys));
        assert_eq!(f.is_some(), *want, "{ys:?}: {f:?}");
        if let Some(f) = f {
            assert!((f.slope - slope).abs() < 1.0, "{ys:?}: {f:?}");
            assert!(f.r2 >= MIN_R_SQUARED);
        }
    }
}

#[test]
fn the_suffix_starts_where_steady_growth_starts() {
    // 30 healthy steps, then 20 steps that each keep 100 bytes more: the whole series fits a
    // line badly (R² < 0.9), the growing tail exactly.
    let mut ys = vec![1000u64; 30];
    ys.extend((1..=20).map(|i| 1000 + 100 * i));
    let all = line(&pts(&ys)).unwrap();
    assert!(all.r2 < MIN_R_SQUARED, "{all:?}");
    let (f, start) = growing_suffix(&pts(&ys)).unwrap();
    assert!((f.slope - 100.0).abs() < 1e-3, "{f:?}");
    // The last flat sample (step 30) starts the line as well as the first rising one.
    assert!((29..=30).contains(&start), "{start}");
    // Growth that stopped: a rise, then a long flat tail, reaches the end with no rise.
    let mut stopped: Vec<u64> = (0..20).map(|i| 100 * i).collect();
    stopped.extend(vec![1900; 20]);
    assert!(growing_suffix(&pts(&stopped)).is_none());
    assert!(growing_suffix(&pts(&[1, 2])).is_none());
    // A steady leak with noise keeps all of its samples.
    let noisy: Vec<u64> = (0..64u64)
        .map(|i| 1_000_000 + i * 10_000 + [0, 3000, 1000, 4000, 2000][i as usize % 5])
        .collect();
    let (f, start) = growing_suffix(&pts(&noisy)).unwrap();
    assert_eq!(start, 0, "{f:?}");
    assert!((f.slope - 10_000.0).abs() < 200.0, "{f:?}");
}

/// (ms, bytes) of a series that adds `per` bytes every `every` ms, from `from`.
fn steady(n: usize, t0: u64, every: u64, b0: u64, per: u64) -> Vec<(u64, u64)> {
    (0..n as u64)
        .map(|i| (t0 + i * every, b0 + i * per))
        .collect()
}

#[test]
fn a_flat_start_is_cut_off_and_a_growth_that_changed_pace_is_one_growth() {
    // Flat for 10 points, then growing: the growth starts at the change.
    let mut flat_then_leak = steady(10, 0, 100, 1 << 30, 0);
    flat_then_leak.extend(steady(10, 1000, 100, (1 << 30) + (48 << 20), 48 << 20));
    let (_, start) = growing_suffix(&flat_then_leak).unwrap();
    assert!((9..=10).contains(&start), "{start}");
    // The same leak, slowed to half its pace for its last 8 points (a starved program): one
    // growth from its first point, not the last 8 alone.
    let mut slowed = steady(20, 0, 100, 0, 48 << 20);
    let (t, b) = *slowed.last().unwrap();
    slowed.extend(steady(8, t + 200, 200, b + (48 << 20), 48 << 20));
    let (f, start) = growing_suffix(&slowed).unwrap();
    assert_eq!(start, 0, "{f:?}");
    // A load twenty times steeper than the leak after it stays cut off.
    let mut load_then_leak = steady(6, 0, 100, 0, 960 << 20);
    let (t, b) = *load_then_leak.last().unwrap();
    load_then_leak.extend(steady(14, t + 100, 100, b + (48 << 20), 48 << 20));
    let (_, start) = growing_suffix(&load_then_leak).unwrap();
    assert!(start >= 5, "{start}");
}
