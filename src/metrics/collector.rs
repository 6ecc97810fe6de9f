use super::*;

/// How many ITL values a run keeps exactly (8 bytes each, at most 128 MiB): beyond them the ITL
/// statistics come from the `itl_us` HdrHistogram ([`Collector::itl_from_histogram`]).
pub(crate) const ITL_BOUND: usize = 16 << 20;

/// How many requests a run keeps exactly (their [`Scalars`] and ITL index, 176 bytes each, at
/// most 352 MiB): beyond them every statistic comes from running aggregates
/// ([`Collector::scalars_from_histogram`], docs/replay.md#memory).
pub(crate) const SCALAR_BOUND: usize = 2 << 20;

/// The latest second of the run clock the token peak counts (48 days; a run is at most 30).
const MAX_SECOND: u64 = 1 << 22;

/// The distributions of [`Summary`] taken from each request (ITL aside), in the order of
/// [`values`].
const DISTS: usize = 12;
const DRIFT: usize = 5;

/// Request `s`'s value in each distribution of [`Summary`], in seconds (`None`: not in it):
/// TTFT, TPOT, E2EL, TTFT and E2EL from intended (streamed requests), then of every request its
/// drift, dispatch drift and client queue, then the server's queue, TTFT and the unattributed
/// remainder (its TTFT part streamed only), then the E2EL of non-streamed requests.
fn values(s: &Scalars) -> [Option<f64>; DISTS] {
    let ok = |v: Option<f64>| v.filter(|_| s.ok());
    let streamed = |v: Option<f64>| ok(v).filter(|_| !s.non_streamed);
    let from_int = |v: Option<u64>| {
        v.map(|v| ns_to_s(s.sent_ns.saturating_add(v).saturating_sub(s.intended_ns)))
    };
    let sv = &s.server;
    let queue = sv.queue_ms.map(|q| q / 1000.0);
    let un = match (s.ttft_ns, sv.ttft_ms) {
        (Some(c), Some(t)) => Some(unattributed(ns_to_s(c), queue, t / 1000.0)),
        _ => None,
    };
    [
        streamed(s.ttft_ns.map(ns_to_s)),
        streamed(s.tpot_s()),
        streamed(s.e2el_ns.map(ns_to_s)),
        streamed(from_int(s.ttft_ns)),
        streamed(from_int(s.e2el_ns)),
        Some(s.drift_ns() as f64 / 1e9),
        Some(s.dispatch_drift_ns() as f64 / 1e9),
        Some(ns_to_s(s.client_queue_ns())),
        ok(queue),
        ok(sv.ttft_ms.map(|t| t / 1000.0)),
        streamed(un),
        ok(s.e2el_ns.map(ns_to_s)).filter(|_| s.non_streamed),
    ]
}

/// One distribution folded value by value: count, mean and squared deviations (Welford), min
/// and max, in seconds, and the magnitudes of its values ≥ 0 and < 0 as HdrHistograms (ns, 3
/// significant digits).
#[derive(Debug, Clone)]
struct Running {
    n: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
    pos: Histogram<u64>,
    neg: Histogram<u64>,
}

impl Running {
    fn new() -> Running {
        let h = || Histogram::new(3).expect("3 significant digits are valid");
        Running {
            n: 0,
            mean: 0.0,
            m2: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            pos: h(),
            neg: h(),
        }
    }

    fn add(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
        self.min = self.min.min(x);
        self.max = self.max.max(x);
        let h = if x < 0.0 {
            &mut self.neg
        } else {
            &mut self.pos
        };
        // Auto-resizing: it fails only past 2^62 ns (146 years), which no run measures.
        let _ = h.record(((x.abs() * 1e9).round() as u64).min(1 << 62));
    }

    /// The `k`-th smallest value (from 1), s, at the histograms' precision.
    fn at_rank(&self, k: u64) -> f64 {
        let nth = |h: &Histogram<u64>, k: u64| {
            let mut seen = 0;
            for v in h.iter_recorded() {
                seen += v.count_at_value();
                if seen >= k {
                    return h.median_equivalent(v.value_iterated_to()) as f64 / 1e9;
                }
            }
            h.max() as f64 / 1e9
        };
        let below = self.neg.len();
        let v = match k <= below {
            true => -nth(&self.neg, below - k + 1),
            false => nth(&self.pos, k - below),
        };
        v.clamp(self.min, self.max)
    }

    /// As [`Stats::from_seconds`] gives them: percentiles interpolated as numpy's between the
    /// values at the neighbouring ranks.
    fn stats(&self, percentiles: &[f64]) -> Stats {
        if self.n == 0 {
            return Stats::from_seconds(&[], percentiles);
        }
        let pct = |p: f64| {
            let v = (self.n - 1) as f64 * p / 100.0;
            let (lo, g) = (v.floor(), v - v.floor());
            let a = self.at_rank(lo as u64 + 1);
            let b = self.at_rank((lo as u64 + 2).min(self.n));
            (a + (b - a) * g) * 1000.0
        };
        Stats {
            count: self.n as usize,
            mean: self.mean * 1000.0,
            median: pct(50.0),
            std: (self.m2 / self.n as f64).sqrt() * 1000.0,
            min: self.min * 1000.0,
            max: self.max * 1000.0,
            percentiles: percentiles.iter().map(|&p| (p, pct(p))).collect(),
        }
    }
}

/// Requests counted in every bucket of the run clock they overlap, kept as counts of starts and
/// ends per bucket (two counters per request, not one per bucket). At most `cap` buckets: past
/// them the width doubles (neighbours merged, exact at the new width).
#[derive(Debug, Clone)]
pub(super) struct Overlaps {
    width_ns: u64,
    cap: u64,
    starts: Vec<u32>,
    ends: Vec<u32>,
}

impl Overlaps {
    fn new(width_ns: u64, cap: u64) -> Overlaps {
        Overlaps {
            width_ns,
            cap,
            starts: Vec::new(),
            ends: Vec::new(),
        }
    }

    fn add(&mut self, from_ns: u64, to_ns: u64) {
        let to_ns = to_ns.max(from_ns);
        while to_ns / self.width_ns >= self.cap {
            self.width_ns *= 2;
            for v in [&mut self.starts, &mut self.ends] {
                *v = v.chunks(2).map(|c| c.iter().sum()).collect();
            }
        }
        let (a, b) = (from_ns / self.width_ns, to_ns / self.width_ns);
        if self.starts.len() <= b as usize {
            self.starts.resize(b as usize + 1, 0);
            self.ends.resize(b as usize + 1, 0);
        }
        self.starts[a as usize] += 1;
        self.ends[b as usize] += 1;
    }

    /// The most requests overlapping one bucket.
    fn peak(&self) -> u64 {
        let (mut level, mut max) = (0u64, 0u64);
        for (s, e) in self.starts.iter().zip(&self.ends) {
            level += u64::from(*s);
            max = max.max(level);
            level -= u64::from(*e);
        }
        max
    }

    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        (self.starts.capacity() + self.ends.capacity()) * std::mem::size_of::<u32>()
    }
}

/// What [`Collector`] folds from every request, whatever the run's length.
#[derive(Debug, Clone)]
pub(super) struct Totals {
    requests: u64,
    completed: u64,
    input_tokens: u64,
    output_tokens: u64,
    errors: BTreeMap<Failure, u64>,
    server_reported: u64,
    cache: ServerCache,
    /// Successful requests meeting the collector's SLO.
    good: u64,
    dists: [Running; DISTS],
    /// Successful requests by whole second of the run clock (vLLM's concurrency peak).
    pub(super) active_per_s: Overlaps,
    /// Every request from send to end by 1 ms of the run clock, the width doubling past 2^20
    /// buckets (the peak in flight).
    pub(super) in_flight: Overlaps,
}

impl Totals {
    fn new() -> Totals {
        Totals {
            requests: 0,
            completed: 0,
            input_tokens: 0,
            output_tokens: 0,
            errors: BTreeMap::new(),
            server_reported: 0,
            cache: ServerCache::default(),
            good: 0,
            dists: std::array::from_fn(|_| Running::new()),
            active_per_s: Overlaps::new(1_000_000_000, MAX_SECOND),
            in_flight: Overlaps::new(1_000_000, 1 << 20),
        }
    }

    fn add(&mut self, s: &Scalars, slo: &Slo) {
        self.requests += 1;
        for (d, v) in self.dists.iter_mut().zip(values(s)) {
            if let Some(v) = v {
                d.add(v);
            }
        }
        self.in_flight.add(s.sent_ns, s.end_ns);
        if !s.ok() {
            *self
                .errors
                .entry(s.error.unwrap_or(Failure::NoContent))
                .or_insert(0) += 1;
            return;
        }
        self.completed += 1;
        self.input_tokens = self.input_tokens.saturating_add(s.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(s.output_tokens);
        self.good += u64::from(!slo.is_empty() && slo.met_by(s));
        let sv = &s.server;
        if sv.queue_ms.is_some() || sv.ttft_ms.is_some() {
            self.server_reported += 1;
        }
        if let Some(c) = sv.cached_tokens {
            self.cache.requests += 1;
            self.cache.cached_tokens += c;
            self.cache.prompt_tokens += sv.prompt_tokens.unwrap_or(s.input_tokens);
        }
        let e2el = s.e2el_ns.unwrap_or(0);
        self.active_per_s
            .add(s.sent_ns, s.sent_ns.saturating_add(e2el));
    }
}

/// Per request, by schedule index, while the run holds at most the bound: its scalars and where
/// its ITL values are.
#[derive(Debug, Clone, Default)]
struct Held {
    scalars: Vec<Option<Scalars>>,
    /// Where each request's ITL values start in `itls`, and how many it has.
    itl_at: Vec<(usize, u32)>,
    /// ITL values (ns) of successful requests, in the order they finished; `None` once they
    /// would have gone over the ITL bound.
    itls: Option<Vec<u64>>,
}

impl Held {
    fn add(&mut self, index: usize, sc: Scalars, itls_ns: &[u64], itl_bound: usize) {
        if self.scalars.len() <= index {
            self.scalars.resize(index + 1, None);
            self.itl_at.resize(index + 1, (0, 0));
        }
        self.scalars[index] = Some(sc);
        if !sc.ok() {
            return;
        }
        if let Some(v) = &mut self.itls {
            let n = itls_ns.len();
            match u32::try_from(n) {
                Ok(k) if v.len() + n <= itl_bound => {
                    self.itl_at[index] = (v.len(), k);
                    v.extend_from_slice(itls_ns);
                }
                _ => self.itls = None,
            }
        }
    }

    /// Request `i`'s ITL values, ns (none once they were let go).
    fn itls_ns(&self, i: usize) -> &[u64] {
        match (&self.itls, self.itl_at.get(i)) {
            (Some(v), Some(&(at, n))) => &v[at..at + n as usize],
            _ => &[],
        }
    }

    fn ok(&self) -> impl Iterator<Item = (usize, &Scalars)> {
        let held = self.scalars.iter().enumerate();
        held.filter_map(|(i, s)| s.as_ref().filter(|s| s.ok()).map(|s| (i, s)))
    }
}

/// A run's finished requests, folded in as each completes, by schedule index. Always: the
/// counts and totals, running aggregates of every distribution, the histograms, and content
/// messages per whole second of the run clock. While the run holds at most its bound of
/// requests (and of ITL values), also each request's [`Scalars`] (index-aligned, so the
/// statistics see requests in schedule order as vLLM does) and ITL values, from which the
/// statistics are then computed exactly.
#[derive(Debug, Clone)]
pub(crate) struct Collector {
    held: Option<Held>,
    itl_bound: usize,
    scalar_bound: usize,
    slo: Slo,
    hist: Histograms,
    tokens_per_s: Vec<u64>,
    pub(super) totals: Totals,
}

impl Collector {
    /// Keeping at most `itl_bound` ITL values and requests below index `scalar_bound`
    /// exactly; goodput counts the requests meeting `slo`.
    pub(crate) fn new(itl_bound: usize, scalar_bound: usize, slo: Slo) -> Collector {
        Collector {
            held: Some(Held {
                itls: Some(Vec::new()),
                ..Held::default()
            }),
            itl_bound,
            scalar_bound,
            slo,
            hist: Histograms::default(),
            tokens_per_s: Vec::new(),
            totals: Totals::new(),
        }
    }

    /// `samples`, each at its position.
    pub(crate) fn from_samples(samples: &[Sample]) -> Collector {
        let mut c = Collector::new(ITL_BOUND, SCALAR_BOUND, Slo::default());
        for (i, s) in samples.iter().enumerate() {
            c.add(i, s);
        }
        c
    }

    /// Folds in the sample of request `index`.
    pub(crate) fn add(&mut self, index: usize, s: &Sample) {
        let sc = s.scalars;
        self.totals.add(&sc, &self.slo);
        self.hist.record(&sc, &s.itls_ns);
        if index >= self.scalar_bound {
            self.held = None;
        }
        if let Some(h) = &mut self.held {
            h.add(index, sc, &s.itls_ns, self.itl_bound);
        }
        if sc.ok() {
            self.count_tokens(&sc, &s.itls_ns);
        }
    }

    /// Content messages by whole second of the run clock.
    fn count_tokens(&mut self, sc: &Scalars, itls_ns: &[u64]) {
        let mut t = sc.sent_ns.saturating_add(sc.ttft_ns.unwrap_or(0));
        for g in std::iter::once(0).chain(itls_ns.iter().copied()) {
            t = t.saturating_add(g);
            let second = t / 1_000_000_000;
            if second < MAX_SECOND {
                let b = second as usize;
                if self.tokens_per_s.len() <= b {
                    self.tokens_per_s.resize(b + 1, 0);
                }
                self.tokens_per_s[b] += 1;
            }
        }
    }

    /// Requests folded in.
    pub(crate) fn requests(&self) -> u64 {
        self.totals.requests
    }

    /// Every request's scalars by index, while the run held them (see [`SCALAR_BOUND`]).
    pub(crate) fn held(&self) -> Option<&[Option<Scalars>]> {
        self.held.as_ref().map(|h| h.scalars.as_slice())
    }

    pub(crate) fn histograms(&self) -> &Histograms {
        &self.hist
    }

    /// The ITL values went over the bound and were let go: ITL statistics come from the `itl_us`
    /// histogram and the token peak from whole seconds of the run clock.
    pub(crate) fn itl_from_histogram(&self) -> bool {
        self.held.as_ref().is_none_or(|h| h.itls.is_none())
    }

    /// The requests went over the bound and were let go: see [`Summary::scalars_from_histogram`].
    pub(crate) fn scalars_from_histogram(&self) -> bool {
        self.held.is_none()
    }

    /// Bytes this collector holds for the run's requests (histograms aside: their size is set by
    /// the range of values, not by their number).
    #[cfg(test)]
    pub(crate) fn retained_bytes(&self) -> usize {
        use std::mem::size_of;
        let held = self.held.as_ref().map_or(0, |h| {
            h.scalars.capacity() * size_of::<Option<Scalars>>()
                + h.itl_at.capacity() * size_of::<(usize, u32)>()
                + h.itls
                    .as_ref()
                    .map_or(0, |v| v.capacity() * size_of::<u64>())
        });
        held + self.tokens_per_s.capacity() * size_of::<u64>()
            + self.totals.active_per_s.bytes()
            + self.totals.in_flight.bytes()
    }

    /// Distribution `d` of [`values`]: exact from the held requests, else from its aggregate.
    fn distribution(&self, d: usize, percentiles: &[f64]) -> Stats {
        match &self.held {
            Some(h) => {
                let v = h.scalars.iter().flatten().filter_map(|s| values(s)[d]);
                let v: Vec<f64> = v.collect();
                Stats::from_seconds(&v, percentiles)
            }
            None => self.totals.dists[d].stats(percentiles),
        }
    }

    /// The send drift of every request ([`Summary::drift`]).
    pub(crate) fn drift(&self, percentiles: &[f64]) -> Stats {
        self.distribution(DRIFT, percentiles)
    }

    fn itl(&self, p: &[f64]) -> Stats {
        match self.held.as_ref().filter(|h| h.itls.is_some()) {
            Some(h) => {
                let v: Vec<f64> = h
                    .ok()
                    .flat_map(|(i, _)| h.itls_ns(i).iter().map(|&n| ns_to_s(n)))
                    .collect();
                Stats::from_seconds(&v, p)
            }
            None => match self.hist.by_name.get("itl_us") {
                Some(h) => Stats::from_histogram(h, 1000.0, p),
                None => Stats::from_seconds(&[], p),
            },
        }
    }

    /// The summary; `duration_s` is first dispatch to last completion.
    pub(crate) fn summary(&self, duration_s: f64, percentiles: &[f64]) -> Summary {
        let t = &self.totals;
        let p = percentiles;
        let [ttft, tpot, e2el, ttft_i, e2el_i, drift, dispatch_drift, queue, sq, st, un, whole] =
            std::array::from_fn(|d| self.distribution(d, p));
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let errors = t.errors.iter();
        let errors = errors.map(|(k, n)| (k.as_str().into_owned(), *n)).collect();
        let (max_output_tokens_per_s, max_concurrent_requests) = self.per_second_peaks();
        let peak_in_flight = match &self.held {
            Some(h) => max_concurrency(h.scalars.iter().flatten()),
            None => t.in_flight.peak(),
        };
        let goodput = !self.slo.is_empty() && duration_s > 0.0;
        Summary {
            completed: t.completed,
            failed: t.requests - t.completed,
            duration_s,
            total_input_tokens: t.input_tokens,
            total_output_tokens: t.output_tokens,
            request_throughput: per_s(t.completed as f64),
            output_throughput: per_s(t.output_tokens as f64),
            total_token_throughput: per_s((t.input_tokens + t.output_tokens) as f64),
            request_goodput: goodput.then(|| t.good as f64 / duration_s),
            max_concurrent_requests,
            max_output_tokens_per_s,
            peak_in_flight,
            ttft,
            tpot,
            itl: self.itl(p),
            e2el,
            non_streamed: whole.count as u64,
            non_streamed_e2el: whole,
            ttft_from_intended: ttft_i,
            e2el_from_intended: e2el_i,
            drift,
            dispatch_drift,
            client_queue: queue,
            server_reported: t.server_reported,
            server_queue: sq,
            server_ttft: st,
            unattributed: un,
            server_cache: (t.cache.requests > 0).then_some(t.cache),
            errors,
            itl_from_histogram: self.itl_from_histogram(),
            scalars_from_histogram: self.scalars_from_histogram(),
        }
    }

    /// vLLM's per-second peaks over successful requests, in its float arithmetic: whole seconds
    /// from the first send; each content message (first token, then one per ITL gap) counts in
    /// its second, and a request counts in every second from its send to its end. Returns (most
    /// messages in one second, most requests in one second). Once the ITL values were let go,
    /// messages are counted in whole seconds of the run clock instead, and once the requests
    /// were, requests too.
    pub(super) fn per_second_peaks(&self) -> (f64, u64) {
        let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
        let Some(h) = &self.held else {
            return (
                max(&self.tokens_per_s) as f64,
                self.totals.active_per_s.peak(),
            );
        };
        let start = |s: &Scalars| ns_to_s(s.sent_ns);
        let end = |s: &Scalars| start(s) + s.e2el_ns.map_or(0.0, ns_to_s);
        let Some(t0) = h.ok().map(|(_, s)| start(s)).min_by(f64::total_cmp) else {
            return (0.0, 0);
        };
        let last = h.ok().map(|(_, s)| end(s)).fold(t0, f64::max);
        let n = (last - t0).ceil() as usize + 1;
        let (mut tokens, mut active) = (vec![0u64; n], vec![0u64; n]);
        for (i, s) in h.ok() {
            let mut t = start(s) + s.ttft_ns.map_or(0.0, ns_to_s);
            let gaps = h.itls_ns(i).iter().map(|&g| ns_to_s(g));
            for g in std::iter::once(0.0).chain(gaps) {
                t += g;
                if let Some(b) = tokens.get_mut((t - t0) as usize) {
                    *b += 1;
                }
            }
            let (a, b) = ((start(s) - t0) as usize, (end(s) - t0) as usize);
            for c in active.iter_mut().take(b + 1).skip(a) {
                *c += 1;
            }
        }
        let tokens = match h.itls {
            Some(_) => max(&tokens),
            None => max(&self.tokens_per_s),
        };
        (tokens as f64, max(&active))
    }
}

/// Summarises `samples`; `duration_s` is first dispatch to last completion.
pub fn summarize(samples: &[Sample], duration_s: f64, percentiles: &[f64]) -> Summary {
    Collector::from_samples(samples).summary(duration_s, percentiles)
}

/// Service-level objectives for goodput, in ms (vLLM's `--goodput ttft:MS tpot:MS e2el:MS`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Slo {
    pub(crate) ttft_ms: Option<f64>,
    pub(crate) tpot_ms: Option<f64>,
    pub(crate) e2el_ms: Option<f64>,
}

impl Slo {
    pub(crate) fn is_empty(&self) -> bool {
        *self == Slo::default()
    }

    /// Whether successful request `s` meets every given objective, as vLLM counts it (a request
    /// with one output token has TPOT 0 for this check).
    pub(crate) fn met_by(&self, s: &Scalars) -> bool {
        let ttft = s.ttft_ns.map_or(0.0, ns_to_s) * 1000.0;
        let e2el = s.e2el_ns.map_or(0.0, ns_to_s) * 1000.0;
        let tpot = s.tpot_s().unwrap_or(0.0) * 1000.0;
        self.ttft_ms.is_none_or(|m| ttft <= m)
            && self.tpot_ms.is_none_or(|m| tpot <= m)
            && self.e2el_ms.is_none_or(|m| e2el <= m)
    }
}

/// Peak number of requests between send and end at the same time.
pub(super) fn max_concurrency<'a>(samples: impl Iterator<Item = &'a Scalars>) -> u64 {
    let mut ev: Vec<(u64, i8)> = Vec::new();
    for s in samples {
        ev.push((s.sent_ns, 1));
        ev.push((s.end_ns.max(s.sent_ns), -1));
    }
    // ends before starts at the same instant
    ev.sort_unstable();
    let (mut cur, mut max) = (0i64, 0i64);
    for (_, d) in ev {
        cur += i64::from(d);
        max = max.max(cur);
    }
    max as u64
}
