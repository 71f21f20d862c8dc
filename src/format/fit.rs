//! Linear fits of growth samples: shared by the shim (which fits its step history when it writes
//! a dump) and the readers (which fit `growth.tracked` of dumps written before the fit was
//! stored). Plain arithmetic on `(step, bytes)` points.

/// Fewest samples a trend is fitted from.
pub const MIN_SAMPLES: usize = 4;
/// Smallest coefficient of determination for growth to count as steady ("monotone-ish": a leak
/// grows every step; a working set that rises and falls does not).
pub const MIN_R_SQUARED: f64 = 0.9;

/// A least-squares line through points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Bytes per unit of x.
    pub slope: f64,
    /// Coefficient of determination (0 for a flat series).
    pub r2: f64,
    /// Points fitted.
    pub n: usize,
}

/// The least-squares line through `points`; `None` for fewer than two points or a single x.
pub fn line(points: &[(u64, u64)]) -> Option<Fit> {
    let n = points.len();
    if n < 2 {
        return None;
    }
    let x0 = points[0].0 as f64;
    let mx = points.iter().map(|p| p.0 as f64 - x0).sum::<f64>() / n as f64;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n as f64;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for p in points {
        let dx = p.0 as f64 - x0 - mx;
        let dy = p.1 as f64 - my;
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy > 0.0 {
        (sxy * sxy) / (sxx * syy)
    } else {
        0.0
    };
    Some(Fit { slope, r2, n })
}

/// `Some` only for steady growth: at least [`MIN_SAMPLES`] points, a positive slope and
/// R² ≥ [`MIN_R_SQUARED`].
pub fn growing(points: &[(u64, u64)]) -> Option<Fit> {
    if points.len() < MIN_SAMPLES {
        return None;
    }
    line(points).filter(|f| f.slope > 0.0 && f.r2 >= MIN_R_SQUARED)
}

/// Steady growth that lasts up to the newest point: where the series changed course last, the
/// stretch from there to the end, when that stretch is [`growing`]. The change point comes from
/// a two-segment least-squares fit (any line before it, a line after it) chosen by BIC against
/// one line for the whole series, so a flat start (healthy steps before a leak began, a loading
/// phase) is cut off without cutting noise-level wiggles out of a steady leak, and a series that
/// grew and then stopped ends in a flat stretch that does not grow. Returns the fit and the
/// index of the stretch's first point.
pub fn growing_suffix(points: &[(u64, u64)]) -> Option<(Fit, usize)> {
    let mut start = change_point(points);
    // A growth that only changed pace at the change point (a program slowed by a busy machine,
    // a leak that sped up) began before it: the stretch goes back over every earlier segment
    // that grew at a comparable rate, as long as the whole still grows steadily. A flat start or
    // a load far steeper than what follows stays cut off.
    while start > 0 {
        let (Some(before), Some(after)) = (line(&points[..start]), line(&points[start..])) else {
            break;
        };
        let comparable = before.slope > 0.0
            && after.slope > 0.0
            && before.slope * SAME_GROWTH_PACE >= after.slope
            && before.slope <= after.slope * SAME_GROWTH_PACE;
        let earlier = change_point(&points[..start]);
        if !comparable || growing(&points[earlier..]).is_none() {
            break;
        }
        start = earlier;
    }
    growing(&points[start..]).map(|f| (f, start))
}

/// Two stretches of growth whose rates differ by less than this factor are one growth.
const SAME_GROWTH_PACE: f64 = 4.0;

/// Where the series changed course last: the first point of the second segment of the best
/// two-segment fit, when BIC prefers it to one line; 0 otherwise.
fn change_point(points: &[(u64, u64)]) -> usize {
    let n = points.len();
    if n < 2 + MIN_SAMPLES {
        return 0;
    }
    let total_sse = sse(points);
    // An exact fit has zero error; a floor relative to the series' spread keeps the logarithm
    // finite without favouring either model.
    let floor = 1e-9 * (total_sse + 1.0);
    let bic = |sse: f64, params: f64| {
        n as f64 * ((sse + floor) / n as f64).ln() + params * (n as f64).ln()
    };
    let mut best = (bic(total_sse, 2.0), 0usize);
    for k in 2..=n - MIN_SAMPLES {
        let b = bic(sse(&points[..k]) + sse(&points[k..]), 5.0);
        if b < best.0 {
            best = (b, k);
        }
    }
    best.1
}

/// Squared error of the least-squares line through `points` (0 for fewer than three).
fn sse(points: &[(u64, u64)]) -> f64 {
    let Some(f) = line(points) else { return 0.0 };
    let n = points.len() as f64;
    let x0 = points[0].0 as f64;
    let mx = points.iter().map(|p| p.0 as f64 - x0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    points
        .iter()
        .map(|p| {
            let predicted = my + f.slope * (p.0 as f64 - x0 - mx);
            let e = p.1 as f64 - predicted;
            e * e
        })
        .sum()
}
