//! A distribution as sorted distinct values with counts: the common form of per-request samples
//! and of an HdrHistogram's recorded buckets, so statistics, CDFs and bootstrap resampling work the
//! same on both.
//!
//! Per-request samples up to [`EXACT_MAX`] distinct values are kept exactly; larger sets are
//! grouped on a log grid of 0.1 % relative width (finer than HdrHistogram's 3 significant digits)
//! so a bootstrap resample stays cheap for millions of samples: it draws each sample's bucket when
//! there are few samples per bucket, else the bucket counts from a multinomial by conditional
//! binomials (one draw per bucket). Point statistics of a comparison are computed from the exact
//! samples elsewhere; this module does not know about metrics or files.

use hdrhistogram::Histogram;
use rand::Rng;
use rand_distr::{Binomial, Distribution};

/// Above this many distinct sample values, samples are grouped on the log grid.
pub(crate) const EXACT_MAX: usize = 4096;
const GRID: f64 = 1.001;

/// Sorted distinct values (ms) and their counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Weighted {
    pub(crate) values: Vec<f64>,
    pub(crate) counts: Vec<u64>,
}

/// mean and the p50/p90/p99 of a distribution.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Quad {
    pub(crate) mean: f64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
}

impl Quad {
    pub(crate) fn get(&self, stat: Stat) -> f64 {
        match stat {
            Stat::Mean => self.mean,
            Stat::Median => self.p50,
            Stat::P90 => self.p90,
            Stat::P99 => self.p99,
        }
    }
}

/// The statistics a comparison reports per latency metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stat {
    Mean,
    Median,
    P90,
    P99,
}

impl Stat {
    pub(crate) const ALL: [Stat; 4] = [Stat::Mean, Stat::Median, Stat::P90, Stat::P99];
    /// Key prefix as in vLLM's keys: `mean`, `median`, `p90`, `p99`.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Stat::Mean => "mean",
            Stat::Median => "median",
            Stat::P90 => "p90",
            Stat::P99 => "p99",
        }
    }
}

impl Weighted {
    /// From exact samples (any order; NaN dropped).
    pub(crate) fn from_samples(v: &[f64]) -> Weighted {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        s.sort_by(f64::total_cmp);
        let mut w = Weighted::default();
        for x in s {
            w.push(x, 1);
        }
        if w.values.len() > EXACT_MAX {
            w = w.grouped();
        }
        w
    }

    /// Appends `c` samples of `v`, the largest value so far (an equal one adds to its count).
    fn push(&mut self, v: f64, c: u64) {
        match (self.values.last(), self.counts.last_mut()) {
            (Some(&last), Some(n)) if last == v => *n += c,
            _ => {
                self.values.push(v);
                self.counts.push(c);
            }
        }
    }

    /// Groups values on the log grid (bucket value = count-weighted mean of its members).
    fn grouped(&self) -> Weighted {
        let mut out = Weighted::default();
        let mut cur: Option<(i64, f64, u64)> = None;
        let key = |x: f64| {
            if x <= 0.0 {
                i64::MIN + (x * 1e6) as i64 // non-positive values kept apart, ordered
            } else {
                (x.ln() / GRID.ln()).floor() as i64
            }
        };
        for (&x, &c) in self.values.iter().zip(&self.counts) {
            let k = key(x);
            match &mut cur {
                Some((ck, sum, n)) if *ck == k => {
                    *sum += x * c as f64;
                    *n += c;
                }
                _ => {
                    if let Some((_, sum, n)) = cur.take() {
                        out.push(sum / n as f64, n);
                    }
                    cur = Some((k, x * c as f64, c));
                }
            }
        }
        if let Some((_, sum, n)) = cur {
            out.push(sum / n as f64, n);
        }
        out
    }

    /// From an HdrHistogram whose unit times `unit_ms` is milliseconds (each bucket at its
    /// median-equivalent value).
    pub(crate) fn from_histogram(h: &Histogram<u64>, unit_ms: f64) -> Weighted {
        let mut w = Weighted::default();
        for it in h.iter_recorded() {
            let v = h.median_equivalent(it.value_iterated_to()) as f64 * unit_ms;
            w.push(v, it.count_at_value());
        }
        w
    }

    pub(crate) fn n(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// mean and linear-interpolated (numpy) percentiles of the expanded sample.
    pub(crate) fn quad(&self) -> Quad {
        quad_of(&self.values, &self.counts)
    }

    /// Percentile `q` (0..=100), numpy's linear interpolation over the expanded sample.
    pub(crate) fn percentile(&self, q: f64) -> f64 {
        percentiles_of(&self.values, &self.counts, &[q])[0]
    }

    /// A bootstrap resample: new counts over the same values, same total. Draws `n` bucket
    /// indices directly when that is cheaper than one binomial per bucket.
    pub(crate) fn resample<R: Rng>(&self, rng: &mut R) -> Vec<u64> {
        let total = self.n();
        let mut out = vec![0u64; self.counts.len()];
        if total == 0 {
            return out;
        }
        if (total as usize) <= self.counts.len() * 8 {
            let cum = cumulative(&self.counts);
            for _ in 0..total {
                let r = rng.random_range(0..total);
                out[cum.partition_point(|&c| c <= r)] += 1;
            }
            return out;
        }
        let mut left_n = total;
        let mut left_w = total;
        for (i, &c) in self.counts.iter().enumerate() {
            if left_n == 0 {
                break;
            }
            if c == left_w {
                out[i] = left_n;
                break;
            }
            let p = c as f64 / left_w as f64;
            let k = Binomial::new(left_n, p.clamp(0.0, 1.0)).map_or(0, |b| b.sample(rng));
            out[i] = k;
            left_n -= k;
            left_w -= c;
        }
        out
    }

    /// `points` (x, F(x)) pairs of the empirical CDF, evenly spaced in probability, for charts.
    pub(crate) fn cdf_points(&self, points: usize) -> Vec<(f64, f64)> {
        let n = self.n();
        if n == 0 {
            return Vec::new();
        }
        let qs: Vec<f64> = (0..=points)
            .map(|i| 100.0 * i as f64 / points as f64)
            .collect();
        let vals = percentiles_of(&self.values, &self.counts, &qs);
        vals.into_iter()
            .zip(qs)
            .map(|(v, q)| (v, q / 100.0))
            .collect()
    }
}

/// mean, p50, p90, p99 over `values` with `counts`.
pub(crate) fn quad_of(values: &[f64], counts: &[u64]) -> Quad {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return Quad::default();
    }
    let sum: f64 = values.iter().zip(counts).map(|(v, &c)| v * c as f64).sum();
    let p = percentiles_of(values, counts, &[50.0, 90.0, 99.0]);
    Quad {
        mean: sum / n as f64,
        p50: p[0],
        p90: p[1],
        p99: p[2],
    }
}

/// Running totals of `counts`.
fn cumulative(counts: &[u64]) -> Vec<u64> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            *acc += c;
            Some(*acc)
        })
        .collect()
}

/// Linear-interpolated percentiles (ascending `qs` for one pass; any order works).
pub(crate) fn percentiles_of(values: &[f64], counts: &[u64], qs: &[f64]) -> Vec<f64> {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return vec![0.0; qs.len()];
    }
    // value at 0-based rank r of the expanded sample
    let cum = cumulative(counts);
    let at = |r: u64| -> f64 {
        let i = cum.partition_point(|&c| c <= r);
        values[i.min(values.len() - 1)]
    };
    qs.iter()
        .map(|&q| {
            let pos = (q / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as u64;
            let hi = pos.ceil() as u64;
            let (a, b) = (at(lo), at(hi));
            a + (b - a) * (pos - lo as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::np_percentile_sorted as percentile_sorted;
    use rand::SeedableRng;

    #[test]
    fn percentiles_match_numpy_on_exact_samples() {
        let v = vec![5.0, 1.0, 3.0, 3.0, 10.0, 7.5, 2.0];
        let w = Weighted::from_samples(&v);
        let mut s = v.clone();
        s.sort_by(f64::total_cmp);
        for q in [0.0, 10.0, 50.0, 90.0, 99.0, 100.0] {
            assert!(
                (w.percentile(q) - percentile_sorted(&s, q)).abs() < 1e-12,
                "q={q}"
            );
        }
        assert!((w.quad().mean - v.iter().sum::<f64>() / 7.0).abs() < 1e-12);
    }

    #[test]
    fn grouping_keeps_percentiles_within_grid_width() {
        let v: Vec<f64> = (1..=20_000).map(|i| i as f64 * 0.37).collect();
        let w = Weighted::from_samples(&v);
        assert!(w.values.len() < 20_000 / 2, "grouped: {}", w.values.len());
        assert_eq!(w.n(), 20_000);
        let exact = percentile_sorted(&v, 99.0);
        assert!((w.percentile(99.0) / exact - 1.0).abs() < 0.002);
    }

    #[test]
    fn resample_keeps_total_and_support() {
        let w = Weighted::from_samples(&[1.0, 2.0, 2.0, 3.0, 9.0]);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for _ in 0..50 {
            let c = w.resample(&mut rng);
            assert_eq!(c.iter().sum::<u64>(), 5);
            assert_eq!(c.len(), w.values.len());
        }
        // the multinomial path (many samples, few buckets): total kept, shares about right
        let many = Weighted {
            values: vec![1.0, 2.0, 3.0],
            counts: vec![10_000, 30_000, 60_000],
        };
        let c = many.resample(&mut rng);
        assert_eq!(c.iter().sum::<u64>(), 100_000);
        assert!((c[2] as f64 / 1e5 - 0.6).abs() < 0.01, "{c:?}");
    }

    #[test]
    fn histogram_buckets_become_weights() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for v in [1000, 1000, 2000, 50_000] {
            h.record(v).unwrap();
        }
        let w = Weighted::from_histogram(&h, 1e-3);
        assert_eq!(w.n(), 4);
        assert_eq!(w.values.len(), 3);
        assert!((w.values[0] - 1.0).abs() < 0.01);
        assert!((w.values[2] - 50.0).abs() < 0.05);
    }
}
