//! Trace statistics for `inspect`: rates, length distributions, prefix reuse, sessions, and the
//! recorded latency summary. Pure computation over a [`Trace`]; rendering lives in the caller.
//!
//! Definitions (also in `docs/inspect-json.md`):
//! - `block_reuse`: fraction of all hash-id references whose id appeared earlier in the trace
//!   (an unbounded cache); `1 - distinct / references`.
//! - `mean_prefix_hit_rate`: per request, the number of *leading* ids already seen before it,
//!   divided by its number of ids; averaged over requests that have ids (AIPerf's "cache hit rate").
//! - `lru_hit_rate`: the same leading-prefix rule against an LRU cache of N blocks, as hit blocks
//!   over all block references.
//! - Percentiles are linear-interpolated over exact samples with numpy's arithmetic
//!   ([`crate::metrics::np_percentile_sorted`], as vLLM reports).

use super::Trace;
use crate::metrics::np_percentile_sorted as percentile_sorted;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// mean / p50 / p90 / p99 / max of a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Dist {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    pub fn of(mut v: Vec<f64>) -> Dist {
        if v.is_empty() {
            return Dist::default();
        }
        v.sort_by(f64::total_cmp);
        Dist {
            count: v.len() as u64,
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: percentile_sorted(&v, 50.0),
            p90: percentile_sorted(&v, 90.0),
            p99: percentile_sorted(&v, 99.0),
            max: *v.last().unwrap_or(&0.0),
        }
    }
}

/// Prefix-reuse figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Reuse {
    pub block_size: u32,
    pub block_references: u64,
    pub distinct_blocks: u64,
    pub block_reuse: f64,
    pub mean_prefix_hit_rate: f64,
    /// (cache size in blocks, hit rate), when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lru_blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lru_hit_rate: Option<f64>,
}

/// Latency recorded in the trace (recorded traces only), in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Recorded {
    pub responses: u64,
    pub ttft_ms: Dist,
    pub itl_ms: Dist,
    pub e2e_ms: Dist,
    /// Error kind → count (HTTP statuses ≥ 400 count as `http_<status>`).
    pub errors: BTreeMap<String, u64>,
    pub cancelled: u64,
}

/// Everything `inspect` reports. Field names are the `--json` schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TraceStats {
    pub requests: u64,
    pub duration_s: f64,
    pub mean_rate_rps: f64,
    /// Most arrivals within any 1-second window.
    pub peak_rate_rps: u64,
    pub isl: Dist,
    pub osl: Dist,
    pub reuse: Reuse,
    pub sessions: u64,
    /// Turns per session (sessions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<Dist>,
    /// endpoint → count
    pub endpoints: BTreeMap<String, u64>,
    /// model → count (requests without a model are not counted)
    pub models: BTreeMap<String, u64>,
    /// Side requests left out of every statistic above: `METHOD path` → count.
    pub auxiliary: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Recorded>,
}

/// Options for [`compute`].
#[derive(Debug, Clone, Default)]
pub struct StatsOptions {
    /// Also simulate an LRU cache of this many blocks.
    pub cache_blocks: Option<u64>,
    /// Prefix figures at this many tokens per block ([`super::filter::rechunk`]).
    pub block_size: Option<u32>,
}

/// Computes the statistics of a trace's workload; auxiliary requests are only counted.
pub fn compute(trace: &Trace, opts: &StatsOptions) -> TraceStats {
    let mut auxiliary: BTreeMap<String, u64> = BTreeMap::new();
    for r in trace.requests.iter().filter(|r| !r.is_workload()) {
        *auxiliary.entry(r.route()).or_default() += 1;
    }
    if auxiliary.is_empty() {
        return compute_workload(trace, opts);
    }
    let workload = Trace {
        header: trace.header.clone(),
        requests: trace
            .requests
            .iter()
            .filter(|r| r.is_workload())
            .cloned()
            .collect(),
    };
    TraceStats {
        auxiliary,
        ..compute_workload(&workload, opts)
    }
}

fn compute_workload(trace: &Trace, opts: &StatsOptions) -> TraceStats {
    let reqs = &trace.requests;
    let rechunked;
    let reuse_of = match opts.block_size {
        Some(b) if b != trace.header.block_size => {
            let mut t = trace.clone();
            // the caller checked `b` (inspect refuses 0)
            let _ = super::filter::rechunk(&mut t, b);
            rechunked = t;
            &rechunked
        }
        _ => trace,
    };
    let n = reqs.len() as u64;
    let span_us = trace.span_us();
    let duration_s = span_us as f64 / 1e6;
    // Peak: sliding 1 s window over sorted arrivals.
    let mut arrivals: Vec<u64> = reqs.iter().map(|r| r.arrival_us).collect();
    arrivals.sort_unstable();
    let mut peak = 0u64;
    let mut lo = 0usize;
    for hi in 0..arrivals.len() {
        while arrivals[hi] - arrivals[lo] >= 1_000_000 {
            lo += 1;
        }
        peak = peak.max((hi - lo + 1) as u64);
    }
    let mut s = TraceStats {
        requests: n,
        duration_s,
        mean_rate_rps: if span_us > 0 {
            n as f64 / duration_s
        } else {
            0.0
        },
        peak_rate_rps: peak,
        isl: Dist::of(reqs.iter().map(|r| r.input_tokens as f64).collect()),
        osl: Dist::of(reqs.iter().map(|r| r.output_tokens as f64).collect()),
        reuse: reuse(reuse_of, opts.cache_blocks),
        ..Default::default()
    };
    let mut turns: BTreeMap<&str, u64> = BTreeMap::new();
    for r in reqs {
        *s.endpoints
            .entry(r.endpoint.as_str().to_string())
            .or_default() += 1;
        if let Some(m) = &r.model {
            *s.models.entry(m.clone()).or_default() += 1;
        }
        if let Some(sess) = &r.session {
            *turns.entry(sess.id.as_str()).or_default() += 1;
        }
    }
    s.sessions = turns.len() as u64;
    if !turns.is_empty() {
        s.turns = Some(Dist::of(turns.values().map(|&v| v as f64).collect()));
    }
    s.recorded = recorded(trace);
    s
}

fn reuse(trace: &Trace, cache_blocks: Option<u64>) -> Reuse {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut refs = 0u64;
    let mut hit_sum = 0f64;
    let mut with_ids = 0u64;
    for r in &trace.requests {
        if r.hash_ids.is_empty() {
            continue;
        }
        with_ids += 1;
        refs += r.hash_ids.len() as u64;
        let lead = r.hash_ids.iter().take_while(|h| seen.contains(h)).count();
        hit_sum += lead as f64 / r.hash_ids.len() as f64;
        seen.extend(r.hash_ids.iter().copied());
    }
    let distinct = seen.len() as u64;
    let mut out = Reuse {
        block_size: trace.header.block_size,
        block_references: refs,
        distinct_blocks: distinct,
        block_reuse: if refs > 0 {
            1.0 - distinct as f64 / refs as f64
        } else {
            0.0
        },
        mean_prefix_hit_rate: if with_ids > 0 {
            hit_sum / with_ids as f64
        } else {
            0.0
        },
        ..Default::default()
    };
    if let Some(cap) = cache_blocks {
        out.lru_blocks = Some(cap);
        out.lru_hit_rate = Some(lru_hit_rate(trace, cap));
    }
    out
}

/// Leading-prefix hit rate against an LRU cache of `cap` blocks (0 = no cache).
pub fn lru_hit_rate(trace: &Trace, cap: u64) -> f64 {
    let Some(cap) = std::num::NonZeroUsize::new(cap.min(usize::MAX as u64) as usize) else {
        return 0.0;
    };
    let mut lru: lru::LruCache<u64, ()> = lru::LruCache::new(cap);
    let (mut hits, mut refs) = (0u64, 0u64);
    for r in &trace.requests {
        refs += r.hash_ids.len() as u64;
        let mut leading = true;
        for h in &r.hash_ids {
            let present = lru.get(h).is_some();
            leading &= present;
            if leading {
                hits += 1;
            }
        }
        for h in &r.hash_ids {
            lru.put(*h, ());
        }
    }
    if refs == 0 {
        0.0
    } else {
        hits as f64 / refs as f64
    }
}

/// The prefix-cache counters an ideal vLLM would report for `trace`'s requests sent one after
/// another in `order` (unbounded cache, each request computed before the next is scheduled):
/// `(hits, queries)` in tokens, by vLLM's rule (domain.md §4): for a request of L prompt tokens
/// whose first P tokens were computed by earlier requests, `hits = min(floor(P/B)*B,
/// floor((L-1)/B)*B)` and `queries = L`, with B = `server_block`. P comes from the hash ids:
/// each id stands for `block_tokens` tokens (the last block of a request may be partial, a prefix
/// of the full one), ids are chained (equal ids at equal positions after an equal prefix mean
/// equal tokens), so P is the longest id-prefix shared with any earlier request, in tokens,
/// capped by both lengths. Concurrent requests and eviction only lower the real count.
pub fn vllm_prefix_cache(
    trace: &Trace,
    order: impl IntoIterator<Item = usize>,
    block_tokens: u32,
    server_block: u32,
) -> (u64, u64) {
    use std::collections::HashMap;
    let t = u64::from(block_tokens.max(1));
    let b = u64::from(server_block.max(1));
    // A trie of id prefixes; `covered[node]` = the most tokens an earlier request computed
    // through that node.
    let mut child: HashMap<(usize, u64), usize> = HashMap::new();
    let mut covered: Vec<u64> = vec![0];
    let (mut hits, mut queries) = (0u64, 0u64);
    for i in order {
        let Some(r) = trace.requests.get(i) else {
            continue;
        };
        let len = r.input_tokens;
        queries += len;
        let mut node = 0;
        let mut p = 0;
        for h in &r.hash_ids {
            match child.get(&(node, *h)) {
                Some(&n) => {
                    node = n;
                    p = covered[n];
                }
                None => break,
            }
        }
        let p = p.min(len);
        if len > 0 {
            hits += ((p / b) * b).min(((len - 1) / b) * b);
        }
        let mut node = 0;
        for (k, h) in r.hash_ids.iter().enumerate() {
            let upto = ((k as u64 + 1) * t).min(len);
            let next = covered.len();
            let n = *child.entry((node, *h)).or_insert(next);
            if n == next {
                covered.push(0);
            }
            covered[n] = covered[n].max(upto);
            node = n;
            if upto == len {
                break;
            }
        }
    }
    (hits, queries)
}

fn recorded(trace: &Trace) -> Option<Recorded> {
    let mut rec = Recorded::default();
    let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    for r in &trace.requests {
        let Some(resp) = &r.response else { continue };
        rec.responses += 1;
        if let Some(t) = resp.ttft_us {
            ttft.push(t as f64 / 1e3);
        }
        if let Some(e) = resp.end_us {
            e2e.push(e as f64 / 1e3);
        }
        // ITL between successive content events (those carrying tokens), as vLLM pools them.
        let content: Vec<u64> = resp
            .events
            .iter()
            .filter(|e| e.tokens > 0)
            .map(|e| e.offset_us)
            .collect();
        itl.extend(content.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e3));
        if let Some(kind) = &resp.error {
            *rec.errors.entry(kind.clone()).or_default() += 1;
        } else if resp.status >= 400 {
            *rec.errors
                .entry(format!("http_{}", resp.status))
                .or_default() += 1;
        }
        rec.cancelled += u64::from(resp.cancelled);
    }
    if rec.responses == 0 {
        return None;
    }
    rec.ttft_ms = Dist::of(ttft);
    rec.itl_ms = Dist::of(itl);
    rec.e2e_ms = Dist::of(e2e);
    Some(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

    fn trace(rows: &[(u64, &[u64])]) -> Trace {
        Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: rows
                .iter()
                .map(|(t, h)| Request {
                    arrival_us: *t,
                    input_tokens: h.len() as u64 * 512,
                    hash_ids: h.to_vec(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// The trie agrees with the pairwise definition (longest shared prefix with any earlier
    /// request) on random chained traces, partial blocks included.
    #[test]
    fn vllm_prefix_cache_matches_the_pairwise_rule() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..50 {
            let (t, b) = (rng.random_range(1..40u64), rng.random_range(1..20u32));
            let mut reqs = Vec::new();
            for _ in 0..rng.random_range(1..25) {
                let n = rng.random_range(0..6u64);
                // few distinct ids: prefixes are shared often
                let ids: Vec<u64> = (0..n).map(|k| k * 10 + rng.random_range(0..2)).collect();
                let len = if n == 0 {
                    rng.random_range(0..50)
                } else {
                    (n - 1) * t + rng.random_range(1..=t)
                };
                reqs.push(Request {
                    input_tokens: len,
                    hash_ids: ids,
                    ..Default::default()
                });
            }
            let tr = Trace {
                header: crate::trace::TraceHeader::imported(t as u32, true, "t"),
                requests: reqs,
            };
            let bb = u64::from(b);
            let mut want = 0;
            for (k, r) in tr.requests.iter().enumerate() {
                let mut p = 0;
                for e in &tr.requests[..k] {
                    let common = r
                        .hash_ids
                        .iter()
                        .zip(&e.hash_ids)
                        .take_while(|(x, y)| x == y)
                        .count() as u64;
                    p = p.max((common * t).min(r.input_tokens).min(e.input_tokens));
                }
                if r.input_tokens > 0 {
                    want += ((p / bb) * bb).min(((r.input_tokens - 1) / bb) * bb);
                }
            }
            let (hits, queries) = vllm_prefix_cache(&tr, 0..tr.requests.len(), t as u32, b);
            assert_eq!(hits, want);
            assert_eq!(
                queries,
                tr.requests.iter().map(|r| r.input_tokens).sum::<u64>()
            );
        }
    }

    #[test]
    fn reuse_definitions() {
        let t = trace(&[(0, &[0, 1, 2]), (10, &[0, 1, 3]), (20, &[4, 1])]);
        let s = compute(
            &t,
            &StatsOptions {
                cache_blocks: Some(1),
                ..Default::default()
            },
        );
        assert_eq!(s.reuse.block_references, 8);
        assert_eq!(s.reuse.distinct_blocks, 5);
        assert!((s.reuse.block_reuse - 3.0 / 8.0).abs() < 1e-12);
        // request 2: 2 of 3 leading hits; request 3: 0 leading (4 is new, 1 does not count)
        assert!((s.reuse.mean_prefix_hit_rate - (0.0 + 2.0 / 3.0 + 0.0) / 3.0).abs() < 1e-12);
        // LRU of one block: only the last touched block survives, never a leading hit here
        assert_eq!(s.reuse.lru_hit_rate, Some(0.0));
        assert!((lru_hit_rate(&t, 100) - 2.0 / 8.0).abs() < 1e-12);
    }

    #[test]
    fn recorded_latency_summary() {
        use crate::trace::{Event, Response};
        let mut t = trace(&[(0, &[]), (10, &[]), (20, &[])]);
        let ev = |o: u64, n: u32| Event {
            offset_us: o,
            tokens: n,
        };
        t.requests[0].response = Some(Box::new(Response {
            status: 200,
            ttft_us: Some(50_000),
            // role-only chunk (0 tokens) is not part of ITL
            events: vec![ev(50_000, 0), ev(50_000, 1), ev(60_000, 1), ev(80_000, 1)],
            end_us: Some(80_000),
            ..Default::default()
        }));
        t.requests[1].response = Some(Box::new(Response {
            status: 503,
            end_us: Some(1_000),
            ..Default::default()
        }));
        t.requests[2].response = Some(Box::new(Response {
            status: 200,
            error: Some("upstream_reset".into()),
            cancelled: true,
            ..Default::default()
        }));
        let r = compute(&t, &StatsOptions::default()).recorded.unwrap();
        assert_eq!(r.responses, 3);
        assert_eq!(r.ttft_ms.count, 1);
        assert_eq!(r.ttft_ms.mean, 50.0);
        assert_eq!(r.itl_ms.count, 2);
        assert_eq!(r.itl_ms.mean, 15.0);
        assert_eq!(r.e2e_ms.max, 80.0);
        assert_eq!(r.errors.get("http_503"), Some(&1));
        assert_eq!(r.errors.get("upstream_reset"), Some(&1));
        assert_eq!(r.cancelled, 1);
    }

    #[test]
    fn rates_and_percentiles() {
        let t = trace(&[(0, &[]), (100_000, &[]), (900_000, &[]), (5_000_000, &[])]);
        let s = compute(&t, &StatsOptions::default());
        assert_eq!(s.peak_rate_rps, 3);
        assert!((s.mean_rate_rps - 0.8).abs() < 1e-12);
        assert_eq!(percentile_sorted(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert!((percentile_sorted(&[1.0, 2.0, 3.0, 4.0], 99.0) - 3.97).abs() < 1e-12);
    }
}
