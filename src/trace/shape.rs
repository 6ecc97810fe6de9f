//! Workload shaping: pure transforms of a trace's arrivals for "what if" replays.
//!
//! Looping and overlaying map a whole [`Trace`]; the rest take one arrival at a time
//! ([`GapCap`], [`Retimer`], [`shard_of`]), so a streamed replay plan applies them as it reads
//! (`replay::source` puts them in order). A schedule stays a pure function of trace + options.
//! Offered: looping (`--loop K`), overlaying time-shifted copies (`--overlay K`, ids kept or made distinct),
//! capping idle gaps (`--max-gap`), replacing the trace's timing by a synthetic arrival process
//! (`--request-rate R --burstiness B`, gamma gaps with shape B and mean 1/R exactly as vLLM draws
//! them, or a linear/exponential ramp between two rates), and deterministic sharding
//! (`--shard I/N`, sessions kept whole). Everything random is drawn from a seeded ChaCha RNG.
//! No I/O, no clocks.

use super::{HashScheme, Request, Trace};
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};

/// A synthetic arrival process that replaces the trace's own timing.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrivals {
    /// Gamma-distributed gaps with `shape = burstiness`, mean `1/rate` (burstiness 1 = Poisson).
    /// `rate = inf` sends everything at t0.
    Rate { rate: f64, burstiness: f64 },
    /// The rate moves from `start` to `end` requests/s over the run (vLLM's ramp-up): request `i`
    /// of `n` draws its gap at `start + (end-start)·p` (linear) or `start·(end/start)^p`
    /// (exponential), `p = i/(n-1)`.
    Ramp {
        exponential: bool,
        start: f64,
        end: f64,
        burstiness: f64,
    },
}

/// A synthetic arrival process, one request at a time: the arrivals of requests `0, 1, ...` of
/// `n` in turn (they replace the recorded ones, order kept).
pub(crate) struct Retimer {
    arrivals: Arrivals,
    rng: rand_chacha::ChaCha8Rng,
    n: usize,
    k: usize,
    t: f64,
}

fn gamma(rate: f64, b: f64) -> Result<Gamma<f64>, String> {
    Gamma::new(b, 1.0 / (rate * b)).map_err(|e| format!("rate {rate}, burstiness {b}: {e}"))
}

impl Retimer {
    /// Checks the process's numbers; `n` is how many requests it re-times (a ramp spreads over it).
    pub(crate) fn new(arrivals: &Arrivals, seed: u64, n: usize) -> Result<Retimer, String> {
        let check = |name: &str, v: f64| match v.is_finite() && v > 0.0 {
            true => Ok(()),
            false => Err(format!("{name} must be a positive number, got {v}")),
        };
        match *arrivals {
            Arrivals::Rate { rate, burstiness } => {
                check("burstiness", burstiness)?;
                if rate.is_nan() || rate <= 0.0 {
                    return Err(format!("request rate must be positive, got {rate}"));
                }
            }
            Arrivals::Ramp {
                start,
                end,
                burstiness,
                ..
            } => {
                check("burstiness", burstiness)?;
                check("ramp-up start rate", start)?;
                check("ramp-up end rate", end)?;
            }
        }
        Ok(Retimer {
            arrivals: arrivals.clone(),
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            n,
            k: 0,
            t: 0.0,
        })
    }

    /// The next request's arrival, µs.
    pub(crate) fn next_arrival(&mut self) -> Result<u64, String> {
        let k = self.k;
        self.k += 1;
        let (rate, burstiness) = match self.arrivals {
            Arrivals::Rate { rate, .. } if rate.is_infinite() => return Ok(0),
            Arrivals::Rate { rate, burstiness } => (rate, burstiness),
            Arrivals::Ramp {
                exponential,
                start,
                end,
                burstiness,
            } => {
                let p = k as f64 / (self.n.max(2) - 1) as f64;
                let rate = match exponential {
                    true => start * (end / start).powf(p),
                    false => start + (end - start) * p,
                };
                (rate, burstiness)
            }
        };
        if k > 0 {
            self.t += gamma(rate, burstiness)?.sample(&mut self.rng);
        }
        Ok((self.t * 1e6).round() as u64)
    }
}

/// Every idle gap between successive arrivals capped at `max_gap_us`, one arrival at a time, in
/// arrival order.
pub(crate) struct GapCap {
    max_gap_us: u64,
    prev: Option<(u64, u64)>,
}

impl GapCap {
    pub(crate) fn new(max_gap_us: u64) -> GapCap {
        GapCap {
            max_gap_us,
            prev: None,
        }
    }

    /// The capped arrival of the next request, which arrived at `arrival_us`.
    pub(crate) fn arrival(&mut self, arrival_us: u64) -> u64 {
        let out = match self.prev {
            None => arrival_us,
            Some((p_in, p_out)) => p_out + arrival_us.saturating_sub(p_in).min(self.max_gap_us),
        };
        self.prev = Some((arrival_us, out));
        out
    }
}

pub(crate) fn distinct_id(scheme: HashScheme, id: u64, copy: u64, stride: u64) -> u64 {
    match scheme {
        // Dense ids stay dense: copy k uses k*stride + id.
        HashScheme::Dense => copy.wrapping_mul(stride).wrapping_add(id),
        _ => xxhash_rust::xxh3::xxh3_64_with_seed(&id.to_le_bytes(), copy),
    }
}

fn copy_of(r: &Request, k: u64, offset: u64, distinct: Option<(HashScheme, u64)>) -> Request {
    let mut c = r.clone();
    c.arrival_us = r.arrival_us + offset;
    if let Some((scheme, stride)) = distinct {
        for h in &mut c.hash_ids {
            *h = distinct_id(scheme, *h, k, stride);
        }
    }
    if let Some(s) = &mut c.session {
        s.id = format!("{}#{k}", s.id);
    }
    c
}

pub(crate) fn stride(trace: &Trace) -> u64 {
    trace
        .requests
        .iter()
        .flat_map(|r| r.hash_ids.iter())
        .max()
        .map_or(0, |m| m.saturating_add(1))
}

/// Repeats the trace `k` times back to back; each repeat starts one mean inter-arrival gap after
/// the previous one's last arrival. Hash ids are kept (later loops hit what earlier ones cached);
/// with `distinct: Some(first)`, copy `i` gets the hash ids of copy number `first + i`, as
/// [`overlay`]'s copies get theirs (number 0 keeps the trace's): no copy shares a cached prefix
/// with another, nor with copies numbered before `first`.
pub(crate) fn repeat(trace: &mut Trace, k: u32, distinct: Option<u64>) {
    let first = distinct.unwrap_or(0);
    if (k <= 1 && first == 0) || trace.requests.is_empty() {
        return;
    }
    let k = k.max(1);
    let d = distinct.map(|_| (trace.header.hash_scheme, stride(trace)));
    let span = trace.span_us();
    let n = trace.requests.len() as u64;
    let gap = if n > 1 { span / (n - 1) } else { 1_000_000 };
    let period = span + gap.max(1);
    let orig = std::mem::take(&mut trace.requests);
    trace.requests.reserve_exact(orig.len() * k as usize);
    for i in 0..u64::from(k) {
        trace.requests.extend(
            orig.iter()
                .map(|r| copy_of(r, first + i, i * period, d.filter(|_| first + i > 0))),
        );
        if i == 0 {
            // the first copy keeps its session ids as they were
            for (c, o) in trace.requests.iter_mut().zip(&orig) {
                c.session = o.session.clone();
            }
        }
    }
}

/// Overlays `k` copies of the trace, copy `i` shifted by `i/k` of its span, raising load while
/// keeping burst shape. With `distinct`, each copy gets its own hash ids (no cross-copy reuse).
pub(crate) fn overlay(trace: &mut Trace, k: u32, distinct: bool) {
    if k <= 1 || trace.requests.is_empty() {
        return;
    }
    let span = trace.span_us();
    let d = distinct.then(|| (trace.header.hash_scheme, stride(trace)));
    let orig = std::mem::take(&mut trace.requests);
    trace.requests.reserve_exact(orig.len() * k as usize);
    for i in 0..u64::from(k) {
        let off = span * i / u64::from(k);
        trace.requests.extend(orig.iter().map(|r| {
            let mut c = copy_of(r, i, off, d.filter(|_| i > 0));
            if i == 0 {
                c.session = r.session.clone();
            }
            c
        }));
    }
    trace.requests.sort_by_key(|r| r.arrival_us);
}

/// Parses `I/N` (0-based shard index I of N).
pub(crate) fn parse_shard(s: &str) -> Result<(u32, u32), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("shard `{s}` must look like I/N, e.g. 0/4"))?;
    let i: u32 = i
        .trim()
        .parse()
        .map_err(|_| format!("shard index `{i}` is not a number"))?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("shard count `{n}` is not a number"))?;
    if n == 0 || i >= n {
        return Err(format!("shard `{s}`: need 0 <= I < N"));
    }
    Ok((i, n))
}

/// Which shard of `n` a request belongs to: by session id when it has one (sessions stay whole),
/// else by its index in the trace. Deterministic across processes.
pub(crate) fn shard_of(r: &Request, index: usize, n: u32) -> u32 {
    let h = match &r.session {
        Some(s) => xxhash_rust::xxh3::xxh3_64(s.id.as_bytes()),
        None => xxhash_rust::xxh3::xxh3_64(&(index as u64).to_le_bytes()),
    };
    (h % u64::from(n)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Session, TraceHeader};

    fn trace(n: usize, step: u64) -> Trace {
        Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: (0..n)
                .map(|k| Request {
                    arrival_us: k as u64 * step,
                    hash_ids: vec![0, k as u64 + 1],
                    session: Some(Session {
                        id: format!("s{}", k % 7),
                        turn: (k / 7) as u32,
                        think_us: None,
                    }),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn retime(t: &mut Trace, arrivals: &Arrivals, seed: u64) -> Result<(), String> {
        let mut re = Retimer::new(arrivals, seed, t.requests.len())?;
        for r in &mut t.requests {
            r.arrival_us = re.next_arrival()?;
        }
        Ok(())
    }

    fn cap_gaps(t: &mut Trace, max_gap_us: u64) {
        let mut cap = GapCap::new(max_gap_us);
        for r in &mut t.requests {
            r.arrival_us = cap.arrival(r.arrival_us);
        }
    }

    fn shard(t: &mut Trace, i: u32, n: u32) {
        let mut k = 0;
        t.requests.retain(|r| {
            k += 1;
            shard_of(r, k - 1, n) == i
        });
    }

    fn gaps_s(t: &Trace) -> Vec<f64> {
        t.requests
            .windows(2)
            .map(|w| (w[1].arrival_us - w[0].arrival_us) as f64 / 1e6)
            .collect()
    }

    fn mean_cv(v: &[f64]) -> (f64, f64) {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64;
        (m, var.sqrt() / m)
    }

    #[test]
    fn gamma_gaps_have_the_asked_mean_and_cv() {
        // Gamma(shape B): CV = 1/sqrt(B). 20,000 gaps: standard errors well under the tolerances.
        for (rate, b) in [(10.0, 1.0), (50.0, 0.25), (5.0, 4.0)] {
            let mut t = trace(20_001, 0);
            retime(
                &mut t,
                &Arrivals::Rate {
                    rate,
                    burstiness: b,
                },
                42,
            )
            .unwrap();
            let (m, cv) = mean_cv(&gaps_s(&t));
            assert!(
                (m * rate - 1.0).abs() < 0.05,
                "rate {rate} b {b}: mean gap {m}"
            );
            let want = 1.0 / b.sqrt();
            assert!(
                (cv - want).abs() / want < 0.06,
                "rate {rate} b {b}: cv {cv} want {want}"
            );
        }
    }

    #[test]
    fn retime_is_reproducible_from_seed() {
        let a = Arrivals::Rate {
            rate: 3.0,
            burstiness: 1.0,
        };
        let (mut x, mut y, mut z) = (trace(100, 0), trace(100, 0), trace(100, 0));
        retime(&mut x, &a, 1).unwrap();
        retime(&mut y, &a, 1).unwrap();
        retime(&mut z, &a, 2).unwrap();
        assert_eq!(x, y);
        assert_ne!(x, z);
        let mut inf = trace(5, 9);
        retime(
            &mut inf,
            &Arrivals::Rate {
                rate: f64::INFINITY,
                burstiness: 1.0,
            },
            0,
        )
        .unwrap();
        assert!(inf.requests.iter().all(|r| r.arrival_us == 0));
        assert!(retime(
            &mut inf,
            &Arrivals::Rate {
                rate: 0.0,
                burstiness: 1.0
            },
            0
        )
        .is_err());
        assert!(retime(
            &mut inf,
            &Arrivals::Rate {
                rate: 1.0,
                burstiness: -1.0
            },
            0
        )
        .is_err());
    }

    #[test]
    fn ramp_rates_rise() {
        for exponential in [false, true] {
            let mut t = trace(4001, 0);
            let a = Arrivals::Ramp {
                exponential,
                start: 2.0,
                end: 200.0,
                burstiness: 1.0,
            };
            retime(&mut t, &a, 3).unwrap();
            let g = gaps_s(&t);
            let (first, _) = mean_cv(&g[..400]);
            let (last, _) = mean_cv(&g[g.len() - 400..]);
            assert!(first > 5.0 * last, "exp={exponential}: {first} vs {last}");
            // the last gaps are drawn near 200 req/s
            assert!((last * 200.0 - 1.0).abs() < 0.35, "{last}");
        }
    }

    #[test]
    fn cap_gaps_only_shortens_long_gaps() {
        let mut t = trace(3, 0);
        for (r, at) in t.requests.iter_mut().zip([0, 100, 10_000_100]) {
            r.arrival_us = at;
        }
        cap_gaps(&mut t, 1_000);
        let at: Vec<u64> = t.requests.iter().map(|r| r.arrival_us).collect();
        assert_eq!(at, vec![0, 100, 1_100]);
    }

    #[test]
    fn loop_and_overlay() {
        let mut t = trace(4, 1_000);
        repeat(&mut t, 3, None);
        assert_eq!(t.requests.len(), 12);
        assert_eq!(t.requests[4].arrival_us, 4_000);
        assert_eq!(t.requests[4].hash_ids, t.requests[0].hash_ids);
        assert!(t
            .requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us));

        let mut o = trace(4, 1_000);
        overlay(&mut o, 2, true);
        assert_eq!(o.requests.len(), 8);
        let copies: Vec<_> = o
            .requests
            .iter()
            .filter(|r| r.session.as_ref().unwrap().id.ends_with("#1"))
            .collect();
        assert_eq!(copies.len(), 4);
        assert_eq!(copies[0].arrival_us, 1_500);
        // distinct ids: the shared id 0 became 0 + stride in copy 1
        assert_eq!(copies[0].hash_ids[0], 5);
        let mut same = trace(4, 1_000);
        overlay(&mut same, 2, false);
        assert!(same.requests.iter().all(|r| r.hash_ids[0] == 0));
    }

    #[test]
    fn distinct_loops_keep_reuse_inside_each_copy_and_share_nothing_across() {
        let mut t = trace(4, 1_000);
        repeat(&mut t, 3, Some(0));
        assert_eq!(t.requests.len(), 12);
        assert_eq!(t.requests[4].arrival_us, 4_000);
        // the first copy keeps its ids; each later copy its own, the shared root 0 included
        assert_eq!(t.requests[0].hash_ids, vec![0, 1]);
        let roots: Vec<u64> = (0..3).map(|c| t.requests[c * 4].hash_ids[0]).collect();
        assert_eq!(roots, vec![0, 5, 10]);
        for (copy, root) in t.requests.chunks(4).zip(&roots) {
            assert!(
                copy.iter().all(|r| r.hash_ids[0] == *root),
                "reuse kept in copy {root}"
            );
        }
        // numbered from 3: none shares an id with the copies 0 to 2 above
        let mut later = trace(4, 1_000);
        repeat(&mut later, 1, Some(3));
        assert_eq!(later.requests.len(), 4);
        assert!(later.requests.iter().all(|r| r.hash_ids[0] == 15));
    }

    #[test]
    fn shards_partition_and_keep_sessions_whole() {
        let t = trace(500, 10);
        let mut seen = 0;
        for i in 0..3 {
            let mut s = t.clone();
            shard(&mut s, i, 3);
            seen += s.requests.len();
            for r in &s.requests {
                let id = &r.session.as_ref().unwrap().id;
                assert!(t
                    .requests
                    .iter()
                    .filter(|x| &x.session.as_ref().unwrap().id == id)
                    .all(|x| s.requests.contains(x)));
            }
        }
        assert_eq!(seen, 500);
        assert_eq!(parse_shard("1/4").unwrap(), (1, 4));
        assert!(parse_shard("4/4").is_err());
        assert!(parse_shard("x").unwrap_err().contains("I/N"));
    }
}
