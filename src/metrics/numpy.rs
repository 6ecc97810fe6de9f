pub(crate) fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// numpy's pairwise summation (`np.add.reduce` over a contiguous float64 array).
pub(crate) fn np_sum(a: &[f64]) -> f64 {
    const BLOCK: usize = 128;
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for &x in a {
            res += x;
        }
        res
    } else if n <= BLOCK {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for k in 0..8 {
                r[k] += a[i + k];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        np_sum(&a[..n2]) + np_sum(&a[n2..])
    }
}

/// `np.mean` (0 for an empty slice, as vLLM's `np.mean(x or 0)`).
pub(crate) fn np_mean(a: &[f64]) -> f64 {
    if a.is_empty() {
        return 0.0;
    }
    np_sum(a) / a.len() as f64
}

/// `np.std` (population).
pub(crate) fn np_std(a: &[f64]) -> f64 {
    if a.is_empty() {
        return 0.0;
    }
    let m = np_mean(a);
    let sq: Vec<f64> = a
        .iter()
        .map(|x| {
            let d = x - m;
            d * d
        })
        .collect();
    (np_sum(&sq) / a.len() as f64).sqrt()
}

/// `np.percentile(a, p)` with the default linear method, on an already sorted slice.
pub(crate) fn np_percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return 0.0;
    }
    let q = p / 100.0;
    // numpy: virtual index = n*q + (alpha + q*(1 - alpha - beta)) - 1 with alpha = beta = 1,
    // i.e. n*q + (1 - q) - 1, evaluated in that order.
    let v = n as f64 * q + (1.0 - q) - 1.0;
    let last = (n - 1) as f64;
    if v <= 0.0 {
        return sorted[0];
    }
    if v >= last {
        return sorted[n - 1];
    }
    let lo = v.floor();
    let g = v - lo;
    let a = sorted[lo as usize];
    let b = sorted[(lo as usize + 1).min(n - 1)];
    let diff = b - a;
    if g >= 0.5 {
        b - diff * (1.0 - g)
    } else {
        a + diff * g
    }
}

/// `np.median`.
pub(crate) fn np_median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => np_mean(&[sorted[n / 2 - 1], sorted[n / 2]]),
    }
}
