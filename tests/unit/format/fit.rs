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
