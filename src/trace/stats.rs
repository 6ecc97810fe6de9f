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

use super::{Request, Trace};
use crate::metrics::np_percentile_sorted as percentile_sorted;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// mean / p50 / p90 / p99 / max of a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Dist {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub(crate) p90: f64,
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

/// How many values a distribution keeps exactly; past it, the rest go into a histogram.
pub(crate) const EXACT_VALUES: usize = 1 << 23;
/// How many distinct hash ids are tracked exactly; past it, a Bloom filter of [`BLOOM_BITS`].
pub(crate) const EXACT_IDS: usize = 1 << 23;

/// A distribution's values (integers: tokens or µs): exact up to a cap (numpy's percentiles),
/// then a histogram of 3 significant digits (percentiles within 0.1 %); count, mean and max stay
/// exact.
struct Values {
    cap: usize,
    exact: Vec<u32>,
    hist: Option<hdrhistogram::Histogram<u64>>,
    count: u64,
    sum: u64,
    max: u32,
}

impl Values {
    fn new(cap: usize) -> Values {
        Values {
            cap,
            exact: Vec::new(),
            hist: None,
            count: 0,
            sum: 0,
            max: 0,
        }
    }

    fn push(&mut self, v: u64) {
        let v = v.min(u32::MAX as u64) as u32;
        (self.count, self.sum, self.max) = (self.count + 1, self.sum + v as u64, self.max.max(v));
        match &mut self.hist {
            Some(h) => h.saturating_record(v as u64),
            None if self.exact.len() < self.cap => self.exact.push(v),
            None => {
                let mut h = hdrhistogram::Histogram::new_with_max(u32::MAX as u64, 3)
                    .expect("a histogram of u32 values, 3 significant digits");
                for x in self.exact.drain(..).chain([v]) {
                    h.saturating_record(x as u64);
                }
                self.exact = Vec::new();
                self.hist = Some(h);
            }
        }
    }

    /// The distribution, values divided by `div`; true when its percentiles are approximate.
    fn dist(self, div: f64) -> (Dist, bool) {
        let Some(h) = self.hist else {
            return (
                Dist::of(self.exact.iter().map(|&v| v as f64 / div).collect()),
                false,
            );
        };
        let q = |p: f64| h.value_at_quantile(p) as f64 / div;
        let d = Dist {
            count: self.count,
            mean: self.sum as f64 / self.count as f64 / div,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            max: self.max as f64 / div,
        };
        (d, true)
    }
}

/// Bits of the Bloom filter that replaces the exact id set past [`EXACT_IDS`] (256 MiB).
pub(crate) const BLOOM_BITS: u64 = 1 << 31;
/// Bit positions per id in the Bloom filter.
const BLOOM_K: u32 = 4;

/// The hash ids seen: an exact set up to a cap; past it, a Bloom filter of fixed size (every id
/// of the set moved in). A filter may take an unseen id for a seen one, never the reverse, so past
/// the cap the prefix figures can only over-count, by about the filter's false-positive rate
/// (reported); the distinct count is the ids the filter had not seen.
struct IdSet {
    cap: usize,
    bloom_bits: u64,
    set: HashSet<u64>,
    bloom: Option<Vec<u64>>,
    distinct: u64,
}

impl IdSet {
    fn new(cap: usize, bloom_bits: u64) -> IdSet {
        IdSet {
            cap,
            bloom_bits,
            set: HashSet::new(),
            bloom: None,
            distinct: 0,
        }
    }

    /// The filter's bit positions of `id` (double hashing of one 128-bit hash).
    fn bits(bloom_bits: u64, id: u64) -> impl Iterator<Item = u64> {
        let h = xxhash_rust::xxh3::xxh3_128(&id.to_le_bytes());
        let (a, b) = (h as u64, (h >> 64) as u64 | 1);
        (0..BLOOM_K as u64).map(move |i| a.wrapping_add(i.wrapping_mul(b)) % bloom_bits)
    }

    fn contains(&self, id: u64) -> bool {
        match &self.bloom {
            None => self.set.contains(&id),
            Some(f) => {
                Self::bits(self.bloom_bits, id).all(|i| f[(i / 64) as usize] >> (i % 64) & 1 == 1)
            }
        }
    }

    fn insert(&mut self, id: u64) {
        let Some(f) = &mut self.bloom else {
            self.distinct += u64::from(self.set.insert(id));
            if self.set.len() > self.cap {
                self.move_into_filter();
            }
            return;
        };
        let mut new = false;
        for i in Self::bits(self.bloom_bits, id) {
            let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
            new |= f[w] & m == 0;
            f[w] |= m;
        }
        self.distinct += u64::from(new);
    }

    fn move_into_filter(&mut self) {
        let mut f = vec![0u64; self.bloom_bits.div_ceil(64) as usize];
        for &id in &self.set {
            for i in Self::bits(self.bloom_bits, id) {
                f[(i / 64) as usize] |= 1 << (i % 64);
            }
        }
        self.set = HashSet::new();
        self.bloom = Some(f);
    }

    /// The filter's false-positive rate now (its share of set bits, to the power k); `None`
    /// while the set is exact.
    fn false_positive_rate(&self) -> Option<f64> {
        let f = self.bloom.as_ref()?;
        let ones: u64 = f.iter().map(|w| w.count_ones() as u64).sum();
        Some((ones as f64 / self.bloom_bits as f64).powi(BLOOM_K as i32))
    }
}

/// Prefix-reuse figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Reuse {
    pub block_size: u32,
    pub block_references: u64,
    pub(crate) distinct_blocks: u64,
    pub block_reuse: f64,
    pub mean_prefix_hit_rate: f64,
    /// (cache size in blocks, hit rate), when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lru_blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lru_hit_rate: Option<f64>,
    /// Past the exact id set's bound: the Bloom filter's false-positive rate, about as much as
    /// `block_reuse` and `mean_prefix_hit_rate` may over-count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) false_positive_rate: Option<f64>,
}

/// Latency recorded in the trace (recorded traces only), in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Recorded {
    pub(crate) responses: u64,
    pub(crate) ttft_ms: Dist,
    pub(crate) itl_ms: Dist,
    pub e2e_ms: Dist,
    /// Error kind → count (HTTP statuses ≥ 400 count as `http_<status>`).
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) cancelled: u64,
    /// Responses longer than the recorder's capture cap ([`crate::trace::Response::past_cap`]):
    /// counted past it, not read.
    pub past_capture_cap: u64,
    /// Exchanges that completed ([`crate::trace::Response::completed`]): the only ones in
    /// `ttft_ms`, `itl_ms` and `e2e_ms` (the rule `compare` draws its recorded side by).
    pub completed: u64,
    /// E2E of completed whole (non-streamed) bodies, apart from the streamed `e2e_ms`, as a
    /// replay reports them; absent when there were none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) non_streamed_e2e_ms: Option<Dist>,
}

/// Everything `inspect` reports. Field names are the `--json` schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TraceStats {
    pub requests: u64,
    pub duration_s: f64,
    pub mean_rate_rps: f64,
    /// Most arrivals within any 1-second window.
    pub(crate) peak_rate_rps: u64,
    pub isl: Dist,
    pub osl: Dist,
    pub reuse: Reuse,
    pub(crate) sessions: u64,
    /// Turns per session (sessions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) turns: Option<Dist>,
    /// endpoint → count
    pub(crate) endpoints: BTreeMap<String, u64>,
    /// model → count (requests without a model are not counted)
    pub(crate) models: BTreeMap<String, u64>,
    /// Side requests left out of every statistic above: `METHOD path` → count.
    pub(crate) auxiliary: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Recorded>,
    /// Figures estimated to keep memory bounded on a very large trace (docs/inspect-json.md):
    /// `isl`, `osl`, `ttft_ms`, `itl_ms`, `e2e_ms` (percentiles from a histogram),
    /// `distinct_blocks` (the ids in a Bloom filter: block reuse and prefix hit rate may
    /// over-count by `reuse.false_positive_rate`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) approximate: Vec<&'static str>,
}

/// Most blocks `inspect --cache-blocks` simulates an LRU cache of (4 Mi: about 256 MiB, the
/// cache's table allocated up front).
pub(crate) const MAX_CACHE_BLOCKS: u64 = 1 << 22;

/// Options for [`compute`].
#[derive(Debug, Clone, Default)]
pub struct StatsOptions {
    /// Also simulate an LRU cache of this many blocks (at most [`MAX_CACHE_BLOCKS`]: more is
    /// taken as that many).
    pub cache_blocks: Option<u64>,
    /// Prefix figures at this many tokens per block ([`super::filter::rechunk`]).
    pub block_size: Option<u32>,
}

/// Computes the statistics of a trace's workload; auxiliary requests are only counted.
pub fn compute(trace: &Trace, opts: &StatsOptions) -> TraceStats {
    let mut acc = StatsAcc::new(&trace.header, opts);
    for r in &trace.requests {
        acc.push(r);
    }
    let mut stats = acc.finish();
    let arrivals = || {
        trace
            .requests
            .iter()
            .filter(|r| r.is_workload())
            .map(|r| r.arrival_us)
    };
    if arrivals().zip(arrivals().skip(1)).any(|(a, b)| b < a) {
        stats.peak_rate_rps = peak_of(arrivals().collect());
    }
    stats
}

/// [`compute`] one request at a time, for a stream in arrival order. Memory is bounded: 4 bytes
/// per value of each distribution (lengths, recorded latencies and inter-token gaps) up to
/// [`EXACT_VALUES`], then a histogram; the distinct hash ids up to [`EXACT_IDS`], then a Bloom
/// filter of [`BLOOM_BITS`]; the LRU's `--cache-blocks`; one counter per session and per endpoint and
/// model; the arrivals of the last second (the peak rate assumes pushes in arrival order).
pub(crate) struct StatsAcc {
    block_size: u32,
    /// `--block-size`: the prefix figures' ids re-chunked.
    rechunk: Option<super::filter::Rechunk>,
    cache: Option<(u64, lru::LruCache<u64, ()>)>,
    n: u64,
    first: Option<u64>,
    last: u64,
    /// Arrivals of the last second.
    window: std::collections::VecDeque<u64>,
    peak: u64,
    isl: Values,
    osl: Values,
    seen: IdSet,
    refs: u64,
    hit_sum: f64,
    with_ids: u64,
    lru_hits: u64,
    turns: BTreeMap<String, u64>,
    endpoints: BTreeMap<String, u64>,
    models: BTreeMap<String, u64>,
    auxiliary: BTreeMap<String, u64>,
    rec: Recorded,
    ttft_us: Values,
    e2e_us: Values,
    whole_e2e_us: Values,
    itl_us: Values,
}

impl StatsAcc {
    pub(crate) fn new(header: &super::TraceHeader, opts: &StatsOptions) -> StatsAcc {
        Self::bounded(header, opts, EXACT_VALUES, (EXACT_IDS, BLOOM_BITS))
    }

    /// [`StatsAcc::new`] with other bounds (tests).
    fn bounded(
        header: &super::TraceHeader,
        opts: &StatsOptions,
        values: usize,
        (ids, bloom_bits): (usize, u64),
    ) -> StatsAcc {
        let rechunk = opts
            .block_size
            .filter(|&b| b != header.block_size)
            .and_then(|b| super::filter::Rechunk::new(header, b).ok());
        let block_size = opts.block_size.filter(|_| rechunk.is_some());
        let block_size = block_size.unwrap_or(header.block_size);
        let cache = opts.cache_blocks.map(|cap| {
            let n = std::num::NonZeroUsize::new(cap.min(MAX_CACHE_BLOCKS) as usize);
            (
                cap,
                lru::LruCache::new(n.unwrap_or(std::num::NonZeroUsize::MIN)),
            )
        });
        StatsAcc {
            block_size,
            rechunk,
            cache,
            n: 0,
            first: None,
            last: 0,
            window: Default::default(),
            peak: 0,
            isl: Values::new(values),
            osl: Values::new(values),
            seen: IdSet::new(ids, bloom_bits),
            refs: 0,
            hit_sum: 0.0,
            with_ids: 0,
            lru_hits: 0,
            turns: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            models: BTreeMap::new(),
            auxiliary: BTreeMap::new(),
            rec: Recorded::default(),
            ttft_us: Values::new(values),
            e2e_us: Values::new(values),
            whole_e2e_us: Values::new(values),
            itl_us: Values::new(values),
        }
    }

    pub(crate) fn push(&mut self, r: &Request) {
        if !r.is_workload() {
            *self.auxiliary.entry(r.route()).or_default() += 1;
            return;
        }
        self.n += 1;
        self.first.get_or_insert(r.arrival_us);
        self.arrival(r.arrival_us);
        self.last = r.arrival_us;
        // Lengths are at most 10^7 tokens (every importer's limit): u32 holds them exactly.
        self.isl.push(r.input_tokens);
        self.osl.push(r.output_tokens);
        match &mut self.rechunk {
            Some(rc) => {
                let ids = rc.ids(r.input_tokens, &r.hash_ids);
                self.reuse(&ids);
            }
            None => self.reuse(&r.hash_ids),
        }
        *self
            .endpoints
            .entry(r.endpoint.as_str().to_string())
            .or_default() += 1;
        if let Some(m) = &r.model {
            *self.models.entry(m.clone()).or_default() += 1;
        }
        if let Some(sess) = &r.session {
            *self.turns.entry(sess.id.clone()).or_default() += 1;
        }
        self.recorded(r);
    }

    /// The peak rate: arrivals within 1 s of the newest.
    fn arrival(&mut self, at: u64) {
        self.window.push_back(at);
        while self
            .window
            .front()
            .is_some_and(|&lo| at.saturating_sub(lo) >= 1_000_000)
        {
            self.window.pop_front();
        }
        self.peak = self.peak.max(self.window.len() as u64);
    }

    fn reuse(&mut self, ids: &[u64]) {
        if let Some((_, lru)) = &mut self.cache {
            let mut leading = true;
            for h in ids {
                leading &= lru.get(h).is_some();
                self.lru_hits += u64::from(leading);
            }
            for h in ids {
                lru.put(*h, ());
            }
        }
        if ids.is_empty() {
            return;
        }
        self.with_ids += 1;
        self.refs += ids.len() as u64;
        let lead = ids.iter().take_while(|&&h| self.seen.contains(h)).count();
        self.hit_sum += lead as f64 / ids.len() as f64;
        for &h in ids {
            self.seen.insert(h);
        }
    }

    fn recorded(&mut self, r: &Request) {
        let Some(resp) = &r.response else { return };
        let rec = &mut self.rec;
        rec.responses += 1;
        // Recorded latencies in µs (u32 holds 71 minutes; longer ones count as that), of the
        // exchanges that completed only: a cancel or a failure is counted, not timed.
        rec.completed += u64::from(resp.completed());
        if let Some((ttft, e2e)) = resp.streamed_latency_us() {
            self.ttft_us.push(ttft);
            self.e2e_us.push(e2e);
            // ITL between successive content events (those carrying tokens), as vLLM pools them.
            let mut prev = None;
            for e in resp.events.iter().filter(|e| e.tokens > 0) {
                if let Some(p) = prev {
                    self.itl_us.push(e.offset_us.saturating_sub(p));
                }
                prev = Some(e.offset_us);
            }
        }
        if let Some(e2e) = resp.whole_body_e2e_us() {
            self.whole_e2e_us.push(e2e);
        }
        if let Some(kind) = &resp.error {
            *rec.errors.entry(kind.clone()).or_default() += 1;
        } else if resp.status >= 400 {
            *rec.errors
                .entry(format!("http_{}", resp.status))
                .or_default() += 1;
        }
        rec.cancelled += u64::from(resp.cancelled);
        rec.past_capture_cap += u64::from(resp.past_cap.is_some());
    }

    pub(crate) fn finish(self) -> TraceStats {
        let n = self.n;
        let span_us = self.last.saturating_sub(self.first.unwrap_or(0));
        let duration_s = span_us as f64 / 1e6;
        let peak = self.peak;
        let mut approximate = Vec::new();
        let mut dist = |v: Values, div: f64, name: &'static str| {
            let (d, approx) = v.dist(div);
            if approx {
                approximate.push(name);
            }
            d
        };
        let (isl, osl) = (dist(self.isl, 1.0, "isl"), dist(self.osl, 1.0, "osl"));
        let recorded = (self.rec.responses > 0).then(|| Recorded {
            ttft_ms: dist(self.ttft_us, 1e3, "ttft_ms"),
            itl_ms: dist(self.itl_us, 1e3, "itl_ms"),
            e2e_ms: dist(self.e2e_us, 1e3, "e2e_ms"),
            non_streamed_e2e_ms: (self.whole_e2e_us.count > 0)
                .then(|| dist(self.whole_e2e_us, 1e3, "non_streamed_e2e_ms")),
            ..self.rec
        });
        let false_positive_rate = self.seen.false_positive_rate();
        if false_positive_rate.is_some() {
            approximate.push("distinct_blocks");
        }
        let distinct = self.seen.distinct;
        let refs = self.refs;
        let reuse = Reuse {
            block_size: self.block_size,
            block_references: refs,
            distinct_blocks: distinct,
            block_reuse: if refs > 0 {
                1.0 - distinct as f64 / refs as f64
            } else {
                0.0
            },
            mean_prefix_hit_rate: match self.with_ids {
                0 => 0.0,
                w => self.hit_sum / w as f64,
            },
            lru_blocks: self.cache.as_ref().map(|c| c.0),
            lru_hit_rate: self.cache.as_ref().map(|c| match (c.0, refs) {
                (0, _) | (_, 0) => 0.0,
                _ => self.lru_hits as f64 / refs as f64,
            }),
            false_positive_rate,
        };
        TraceStats {
            requests: n,
            duration_s,
            mean_rate_rps: if span_us > 0 {
                n as f64 / duration_s
            } else {
                0.0
            },
            peak_rate_rps: peak,
            isl,
            osl,
            reuse,
            sessions: self.turns.len() as u64,
            turns: (!self.turns.is_empty())
                .then(|| Dist::of(self.turns.values().map(|&v| v as f64).collect())),
            endpoints: self.endpoints,
            models: self.models,
            auxiliary: self.auxiliary,
            recorded,
            approximate,
        }
    }
}

/// Most arrivals within any 1-second window.
fn peak_of(mut arrivals: Vec<u64>) -> u64 {
    arrivals.sort_unstable();
    let (mut peak, mut lo) = (0u64, 0usize);
    for hi in 0..arrivals.len() {
        while arrivals[hi] - arrivals[lo] >= 1_000_000 {
            lo += 1;
        }
        peak = peak.max((hi - lo + 1) as u64);
    }
    peak
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
#[cfg(test)]
pub(crate) fn vllm_prefix_cache(
    trace: &Trace,
    order: impl IntoIterator<Item = usize>,
    block_tokens: u32,
    server_block: u32,
) -> (u64, u64) {
    let mut c = CacheSim::new(block_tokens, server_block, usize::MAX);
    for r in order.into_iter().filter_map(|i| trace.requests.get(i)) {
        c.add(r);
    }
    (c.hits, c.queries)
}

/// Most trie nodes a [`CacheSim`] holds (about 50 bytes each).
pub(crate) const PREFIX_NODES: usize = 2 << 20;

/// [`vllm_prefix_cache`] one request at a time, in send order (memory: a trie node per distinct
/// id prefix, at most `max_nodes`; past them no prefix is added, so the hits counted are a lower
/// bound and `full` says so).
pub(crate) struct CacheSim {
    max_nodes: usize,
    pub(crate) full: bool,
    block_tokens: u64,
    server_block: u64,
    /// A trie of id prefixes; `covered[node]` = the most tokens an earlier request computed
    /// through that node.
    child: std::collections::HashMap<(usize, u64), usize>,
    covered: Vec<u64>,
    pub(crate) hits: u64,
    pub(crate) queries: u64,
    /// The hits at each of [`SERVER_BLOCKS`] (the server may publish its own block size).
    pub(crate) hits_at: [u64; SERVER_BLOCKS.len()],
}

/// Server KV block sizes the hits are also counted at, so that a block size the server
/// publishes (vLLM's `vllm:cache_config_info`) can be judged without a second pass.
pub(crate) const SERVER_BLOCKS: [u64; 7] = [1, 16, 32, 64, 128, 256, 512];

impl CacheSim {
    pub(crate) fn new(block_tokens: u32, server_block: u32, max_nodes: usize) -> CacheSim {
        CacheSim {
            max_nodes,
            full: false,
            block_tokens: u64::from(block_tokens.max(1)),
            server_block: u64::from(server_block.max(1)),
            child: Default::default(),
            covered: vec![0],
            hits: 0,
            queries: 0,
            hits_at: [0; SERVER_BLOCKS.len()],
        }
    }

    /// Counts `r`'s queries and hits, then adds its prefix.
    pub(crate) fn add(&mut self, r: &Request) {
        let (t, b) = (self.block_tokens, self.server_block);
        let len = r.input_tokens;
        self.queries += len;
        let mut node = 0;
        let mut p = 0;
        for h in &r.hash_ids {
            match self.child.get(&(node, *h)) {
                Some(&n) => {
                    node = n;
                    p = self.covered[n];
                }
                None => break,
            }
        }
        let p = p.min(len);
        let hit = |b: u64| ((p / b) * b).min(((len - 1) / b) * b);
        if len > 0 {
            self.hits += hit(b);
            for (h, &b) in self.hits_at.iter_mut().zip(&SERVER_BLOCKS) {
                *h += hit(b);
            }
        }
        let mut node = 0;
        for (k, h) in r.hash_ids.iter().enumerate() {
            let upto = ((k as u64 + 1) * t).min(len);
            let next = self.covered.len();
            let n = match self.child.get(&(node, *h)) {
                Some(&n) => n,
                None if next > self.max_nodes => {
                    self.full = true;
                    break;
                }
                None => {
                    self.child.insert((node, *h), next);
                    self.covered.push(0);
                    next
                }
            };
            self.covered[n] = self.covered[n].max(upto);
            node = n;
            if upto == len {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

    /// Past its node bound the prefix trie stops growing: the hits counted are a lower bound of
    /// the unbounded count, and it says so.
    #[test]
    fn a_full_prefix_trie_counts_a_lower_bound_and_says_so() {
        let reqs: Vec<Request> = (0..2000u64)
            .map(|k| Request {
                input_tokens: 64,
                hash_ids: vec![k % 7, k % 13, k],
                ..Default::default()
            })
            .collect();
        let run = |max_nodes| {
            let mut c = CacheSim::new(16, 16, max_nodes);
            reqs.iter().for_each(|r| c.add(r));
            c
        };
        let (all, few) = (run(usize::MAX), run(50));
        assert!(!all.full && few.full);
        assert!(few.covered.len() <= 51 && all.covered.len() > 2000);
        assert_eq!(few.queries, all.queries);
        assert!(
            few.hits <= all.hits && few.hits > 0,
            "{} of {}",
            few.hits,
            all.hits
        );
    }

    /// Past both bounds (here small: 2,000 values, 10,000 exact ids then a 4 Mibit filter, on the
    /// 12,031-row Mooncake conversation trace with 182,790 distinct ids) memory stays within them,
    /// the estimates stay close to the exact figures (over-counting at most by the reported
    /// false-positive rate), and count, mean and max stay exact.
    #[test]
    fn past_the_bounds_memory_stays_bounded_and_estimates_hold() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("traces/mooncake_conversation.trace.zst");
        let (t, _) = crate::trace::native::read_file(&path).unwrap();
        let opts = StatsOptions::default();
        let exact = compute(&t, &opts);
        assert!(exact.approximate.is_empty());
        let mut acc = StatsAcc::bounded(&t.header, &opts, 2_000, (10_000, 1 << 22));
        for r in &t.requests {
            acc.push(r);
            assert!(acc.seen.set.len() <= 10_000 && acc.isl.exact.len() <= 2_000);
        }
        assert_eq!(acc.seen.bloom.as_ref().map(Vec::len), Some(1 << 16));
        let est = acc.finish();
        assert_eq!(est.approximate, ["isl", "osl", "distinct_blocks"]);
        let near = |a: f64, b: f64, rel: f64| (a - b).abs() <= rel * b.abs();
        for (e, x) in [(&est.isl, &exact.isl), (&est.osl, &exact.osl)] {
            assert_eq!((e.count, e.max), (x.count, x.max));
            assert!(near(e.mean, x.mean, 1e-12), "{e:?} {x:?}");
            for (a, b) in [(e.p50, x.p50), (e.p90, x.p90), (e.p99, x.p99)] {
                assert!(near(a, b, 0.002), "{e:?} {x:?}");
            }
        }
        let (e, x) = (&est.reuse, &exact.reuse);
        assert_eq!(e.block_references, x.block_references);
        let fpr = e.false_positive_rate.unwrap();
        assert!(fpr > 0.0 && fpr < 0.002, "{fpr}");
        assert!(e.distinct_blocks <= x.distinct_blocks);
        assert!(
            near(e.distinct_blocks as f64, x.distinct_blocks as f64, fpr),
            "{e:?} {x:?}"
        );
        for (a, b) in [
            (e.block_reuse, x.block_reuse),
            (e.mean_prefix_hit_rate, x.mean_prefix_hit_rate),
        ] {
            assert!(a >= b && a - b <= fpr, "{e:?} {x:?}");
        }
    }

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
        let big = StatsOptions {
            cache_blocks: Some(100),
            ..Default::default()
        };
        let hit = compute(&t, &big).reuse.lru_hit_rate.unwrap();
        assert!((hit - 2.0 / 8.0).abs() < 1e-12);
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
        assert_eq!(r.completed, 1);
    }

    /// `inspect`'s recorded E2E and `compare`'s recorded side draw one population: exchanges
    /// that completed (a cancel, an error kind or a status of 400 or more is counted, not timed).
    #[test]
    fn inspect_and_compare_time_the_same_recorded_exchanges() {
        use crate::report::load::recorded_requests;
        use crate::report::run::Metric;
        use crate::trace::{Event, Response};
        let mut t = trace(&[(0, &[]), (10, &[]), (20, &[]), (30, &[]), (40, &[])]);
        let streamed = |end: u64, cancelled: bool, status: u16| Response {
            status,
            ttft_us: Some(5_000),
            events: vec![
                Event {
                    offset_us: 5_000,
                    tokens: 1,
                },
                Event {
                    offset_us: end,
                    tokens: 1,
                },
            ],
            end_us: Some(end),
            cancelled,
            ..Default::default()
        };
        t.requests[0].response = Some(Box::new(streamed(40_000, false, 200)));
        t.requests[1].response = Some(Box::new(streamed(12_000_000, true, 200)));
        t.requests[2].response = Some(Box::new(streamed(9_000_000, false, 500)));
        t.requests[3].response = Some(Box::new(Response {
            status: 0,
            error: Some("upstream_connect".into()),
            end_us: Some(7_000_000),
            ..Default::default()
        }));
        t.requests[4].response = Some(Box::new(streamed(60_000, false, 200)));
        let rec = compute(&t, &StatsOptions::default()).recorded.unwrap();
        assert_eq!((rec.completed, rec.e2e_ms.count), (2, 2));
        assert_eq!(
            rec.e2e_ms.max, 60.0,
            "no cancelled or failed exchange timed"
        );
        let work: Vec<_> = t.requests.iter().collect();
        let mut e2e = recorded_requests(&work).samples_ms(Metric::E2el);
        e2e.sort_by(f64::total_cmp);
        assert_eq!(e2e, [40.0, 60.0]);
        assert_eq!(Dist::of(e2e), rec.e2e_ms);
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
