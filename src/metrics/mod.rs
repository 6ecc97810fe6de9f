//! Client-side serving metrics exactly as `vllm bench serve` defines them, from per-request samples.
//!
//! [`StreamClock`] applies vLLM's per-stream timing rules message by message (domain.md §3):
//! TTFT is the first SSE message with a non-empty `choices` array minus the send time; each later
//! such message adds one ITL gap; E2EL ends at the last content message on `/v1/completions` and at
//! the last message of any kind (the usage chunk included) on chat, where every message also moves
//! the "previous message" mark that ITL gaps are measured from. [`Sample`] is one finished request;
//! [`summarize`] turns samples into vLLM's statistics: mean, median, population std and linearly
//! interpolated percentiles, computed from the exact samples with numpy's own arithmetic (pairwise
//! summation, its percentile interpolation), in seconds then scaled to ms as vLLM does, so the
//! numbers match `vllm bench serve` on the same timings bit for bit. TPOT per request is
//! (E2EL − TTFT)/(output_tokens − 1) when output_tokens > 1; ITL is pooled over requests;
//! throughputs divide by the run duration; input/output tokens count successful requests only.
//! [`Collector`] folds samples in as they finish; past [`SCALAR_BOUND`] requests its statistics
//! come from running aggregates instead (docs/replay.md#memory).
//!
//! [`Histograms`] holds the same distributions as HdrHistograms (µs, 3 significant digits; drift and
//! client queue in ns) and serialises them in the V2 format, base64, so result files from shards
//! merge and compare exactly. This module is pure: no clock, no I/O, no async.

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Which API the stream came from (the rules differ, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

/// vLLM's timing rules for one stream, applied incrementally. Times are ns offsets on one clock.
#[derive(Debug, Clone)]
pub(crate) struct StreamClock {
    api: Api,
    send_ns: u64,
    first_ns: Option<u64>,
    recent_ns: Option<u64>,
    itls_ns: Vec<u64>,
    usage_tokens: Option<u64>,
    chunk_tokens: u64,
}

impl StreamClock {
    pub(crate) fn new(api: Api, send_ns: u64) -> StreamClock {
        StreamClock {
            api,
            send_ns,
            first_ns: None,
            recent_ns: None,
            itls_ns: Vec::new(),
            usage_tokens: None,
            chunk_tokens: 0,
        }
    }

    /// One SSE message (not `[DONE]`) that arrived at `at_ns`: whether its `choices` array was
    /// non-empty, how many tokens it carried, and its `usage.completion_tokens` if any.
    pub(crate) fn on_message(
        &mut self,
        at_ns: u64,
        has_choices: bool,
        tokens: u32,
        usage: Option<u64>,
    ) {
        self.chunk_tokens += u64::from(tokens);
        if has_choices {
            match self.first_ns {
                None => self.first_ns = Some(at_ns),
                Some(_) => {
                    let prev = self.recent_ns.unwrap_or(at_ns);
                    self.itls_ns.push(at_ns.saturating_sub(prev));
                }
            }
            self.recent_ns = Some(at_ns);
        } else {
            // vLLM reads usage only from a message without choices.
            if let Some(u) = usage {
                self.usage_tokens = Some(u);
            }
            if self.api == Api::Chat {
                self.recent_ns = Some(at_ns);
            }
        }
        if has_choices && usage.is_some() && self.usage_tokens.is_none() {
            // Some servers put usage on the last content chunk; keep it as a fallback count.
            self.usage_tokens = usage;
        }
    }

    /// TTFT from the send time, once a content message arrived.
    pub(crate) fn ttft_ns(&self) -> Option<u64> {
        self.first_ns.map(|f| f.saturating_sub(self.send_ns))
    }

    /// E2EL from the send time (see the module docs for which message ends it).
    pub(crate) fn e2el_ns(&self) -> Option<u64> {
        self.first_ns?;
        self.recent_ns.map(|r| r.saturating_sub(self.send_ns))
    }

    #[cfg(test)]
    pub(crate) fn itls_ns(&self) -> &[u64] {
        &self.itls_ns
    }

    pub(crate) fn into_itls(self) -> Vec<u64> {
        self.itls_ns
    }

    /// Output tokens: the usage chunk's `completion_tokens`, else the tokens counted in chunks.
    pub(crate) fn output_tokens(&self) -> u64 {
        self.usage_tokens.unwrap_or(self.chunk_tokens)
    }

    /// Whether the count came from the server's usage chunk.
    #[cfg(test)]
    pub(crate) fn has_usage(&self) -> bool {
        self.usage_tokens.is_some()
    }
}

/// The server's own per-request report (vLLM's `metrics`, llama.cpp's `timings`), ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerTimes {
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    /// The prompt's length as the server counted it (`usage.prompt_tokens`), when it said.
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens the server took from its prefix cache (llama.cpp's `cache_n`).
    pub cached_tokens: Option<u64>,
}

/// Client TTFT − server queue − server TTFT (any one unit): the time neither server figure
/// covers. A server that reports no queue time (llama.cpp) has its queue wait in it.
pub(crate) fn unattributed(client_ttft: f64, queue: Option<f64>, server_ttft: f64) -> f64 {
    client_ttft - queue.unwrap_or(0.0) - server_ttft
}

/// The per-request prefix-cache hits the server reported (`cached_tokens`), over the requests
/// that reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct ServerCache {
    pub(crate) requests: u64,
    pub(crate) cached_tokens: u64,
    /// Their prompt tokens (the server's count where it said, else what was sent).
    pub(crate) prompt_tokens: u64,
}

impl ServerCache {
    pub(crate) fn hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }
}

/// Why a request failed. [`Failure::as_str`] is its name in result files and error counts
/// (`errors_by_kind`, the `errors` array).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failure {
    /// The server answered with this non-2xx status (`http_<status>`).
    Http(u16),
    /// The TCP connect or TLS handshake failed.
    Connect,
    /// The connection broke mid-response, or the framing was bad.
    Reset,
    /// An SSE message that is not a JSON object.
    MalformedStream,
    /// The server sent an error object in the stream.
    StreamError,
    /// The stream ended without a content message.
    NoContent,
    /// No byte for the idle timeout.
    TimeoutIdle,
    /// The request exceeded the total timeout.
    TimeoutTotal,
    /// The replayer itself could not run the request.
    Local,
    /// Cut where the client cancelled it in the recording (after the recorded events, or at
    /// the recorded end when none came): the replay did what was recorded, the target did not
    /// fail.
    CancelledAsRecorded,
    /// The run was interrupted (SIGINT, SIGTERM) before the request ended: cut in flight, or
    /// released and not sent.
    Interrupted,
}

impl Failure {
    /// The wire name: `http_503`, `connect`, `reset`, `malformed_stream`, `stream_error`,
    /// `no_content`, `timeout_idle`, `timeout_total`, `local`, `cancelled_as_recorded`,
    /// `interrupted`.
    pub(crate) fn as_str(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed(match self {
            Failure::Http(status) => return format!("http_{status}").into(),
            Failure::Connect => "connect",
            Failure::Reset => "reset",
            Failure::MalformedStream => "malformed_stream",
            Failure::StreamError => "stream_error",
            Failure::NoContent => "no_content",
            Failure::TimeoutIdle => "timeout_idle",
            Failure::TimeoutTotal => "timeout_total",
            Failure::Local => "local",
            Failure::CancelledAsRecorded => "cancelled_as_recorded",
            Failure::Interrupted => "interrupted",
        })
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// One finished request: its [`Scalars`] (read and written through it: `sample.ttft_ns`), its
/// ITL values and its error's text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub scalars: Scalars,
    pub itls_ns: Vec<u64>,
    /// Human-readable detail of the error (first bytes of an error body, the I/O error).
    pub error_detail: Option<String>,
}

impl std::ops::Deref for Sample {
    type Target = Scalars;
    fn deref(&self) -> &Scalars {
        &self.scalars
    }
}

impl std::ops::DerefMut for Sample {
    fn deref_mut(&mut self) -> &mut Scalars {
        &mut self.scalars
    }
}

/// A finished request's fixed-size part (a [`Sample`] less its ITL values and error detail),
/// kept for the requests of a run up to its bound: the per-request figures vLLM's statistics are
/// computed from. Times are ns offsets from the run's t0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scalars {
    pub input_tokens: u64,
    /// Output tokens (usage chunk, else counted); 0 for a failure without output.
    pub output_tokens: u64,
    /// When the schedule wanted the request sent.
    pub intended_ns: u64,
    /// When the dispatcher released it (dispatch drift = dispatched − intended).
    pub dispatched_ns: u64,
    /// Time spent waiting for a `--max-concurrency` slot after the release (0 without a limit):
    /// the client queue.
    pub slot_wait_ns: u64,
    /// When it was handed to the connection (after any slot wait). vLLM's latencies start here.
    /// 0 when the request failed before it could be sent.
    pub sent_ns: u64,
    /// First content message, from `sent_ns`.
    pub ttft_ns: Option<u64>,
    /// End-to-end latency from `sent_ns`.
    pub e2el_ns: Option<u64>,
    /// When the request finished (last byte, or failure).
    pub end_ns: u64,
    /// Why it failed; `None` = success (or no content: see [`Scalars::ok`]).
    pub error: Option<Failure>,
    pub server: ServerTimes,
    /// The response came whole, not as a stream: its first "token" is its end. It stays out of
    /// TTFT, TPOT, ITL and E2EL (vLLM, which always streams, has no such requests) and is
    /// reported apart, E2EL only ([`Summary::non_streamed_e2el`]).
    pub non_streamed: bool,
}

impl Scalars {
    pub(crate) fn ok(&self) -> bool {
        self.error.is_none() && self.ttft_ns.is_some()
    }
    /// Send drift: how late the request was actually sent, less the time it waited for a
    /// concurrency slot (sent − slot wait − intended; negative = early). It is the dispatcher's
    /// lateness plus the hand-over to the request's task and the request's serialisation. A
    /// request that failed before it was sent counts its dispatch drift.
    pub(crate) fn drift_ns(&self) -> i64 {
        if self.sent_ns >= self.dispatched_ns && self.sent_ns > 0 {
            self.sent_ns.saturating_sub(self.slot_wait_ns) as i64 - self.intended_ns as i64
        } else {
            self.dispatch_drift_ns()
        }
    }
    /// The dispatcher's own lateness: release − intended.
    pub(crate) fn dispatch_drift_ns(&self) -> i64 {
        self.dispatched_ns as i64 - self.intended_ns as i64
    }
    /// Client queue: time waiting for a concurrency slot.
    pub(crate) fn client_queue_ns(&self) -> u64 {
        self.slot_wait_ns
    }
    /// TPOT in seconds, per vLLM (only when more than one output token).
    pub(crate) fn tpot_s(&self) -> Option<f64> {
        let (t, e) = (self.ttft_ns?, self.e2el_ns?);
        (self.output_tokens > 1)
            .then(|| (ns_to_s(e) - ns_to_s(t)) / (self.output_tokens - 1) as f64)
    }
}

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

/// Statistics of one metric, in ms.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stats {
    pub count: usize,
    pub mean: f64,
    pub(crate) median: f64,
    pub(crate) std: f64,
    pub min: f64,
    pub max: f64,
    /// (percentile, value) in the order asked.
    pub(crate) percentiles: Vec<(f64, f64)>,
}

impl Stats {
    /// As `{count, mean_ms, median_ms, std_ms, min_ms, max_ms, pP_ms}` (the result file's
    /// sessions and probes sections).
    pub(crate) fn to_json_ms(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("count".into(), self.count.into());
        for (k, v) in [
            ("mean_ms", self.mean),
            ("median_ms", self.median),
            ("std_ms", self.std),
            ("min_ms", self.min),
            ("max_ms", self.max),
        ] {
            m.insert(k.into(), serde_json::json!(v));
        }
        for (p, v) in &self.percentiles {
            m.insert(
                format!("p{}_ms", percentile_label(*p)),
                serde_json::json!(v),
            );
        }
        serde_json::Value::Object(m)
    }

    /// From samples in seconds (vLLM computes in seconds and scales to ms afterwards).
    pub(crate) fn from_seconds(values: &[f64], percentiles: &[f64]) -> Stats {
        let mut sorted = values.to_vec();
        // Values equal under total_cmp are the same bits, so an unstable sort gives the same.
        sorted.sort_unstable_by(f64::total_cmp);
        Stats {
            count: values.len(),
            mean: np_mean(values) * 1000.0,
            median: np_median_sorted(&sorted) * 1000.0,
            std: np_std(values) * 1000.0,
            min: sorted.first().copied().unwrap_or(0.0) * 1000.0,
            max: sorted.last().copied().unwrap_or(0.0) * 1000.0,
            percentiles: percentiles
                .iter()
                .map(|&p| (p, np_percentile_sorted(&sorted, p) * 1000.0))
                .collect(),
        }
    }

    /// From a histogram of values `per_ms` to the ms (1000 for µs), to its 3 significant digits.
    pub(crate) fn from_histogram(h: &Histogram<u64>, per_ms: f64, percentiles: &[f64]) -> Stats {
        let ms = |v: f64| v / per_ms;
        let q = |x: f64| match h.is_empty() {
            true => 0.0,
            false => ms(h.value_at_quantile(x) as f64),
        };
        let (min, max) = match h.is_empty() {
            true => (0.0, 0.0),
            false => (ms(h.min() as f64), ms(h.max() as f64)),
        };
        Stats {
            count: h.len() as usize,
            mean: ms(h.mean()),
            median: q(0.5),
            std: ms(h.stdev()),
            min,
            max,
            percentiles: percentiles.iter().map(|&p| (p, q(p / 100.0))).collect(),
        }
    }

    pub(crate) fn percentile(&self, p: f64) -> Option<f64> {
        self.percentiles
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, v)| *v)
    }
}

/// How vLLM names a percentile in keys and labels: `99`, `99.9`.
pub(crate) fn percentile_label(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// Everything a run measured, summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub completed: u64,
    pub failed: u64,
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    pub(crate) output_throughput: f64,
    pub(crate) total_token_throughput: f64,
    /// Successful requests meeting every SLO (the collector's `Slo`), per second; `None` when no
    /// SLO was given.
    pub request_goodput: Option<f64>,
    /// vLLM's `max_concurrent_requests`: successful requests active in the busiest whole second
    /// (`Collector::per_second_peaks`).
    pub(crate) max_concurrent_requests: u64,
    /// vLLM's `max_output_tokens_per_s`: content messages in the busiest whole second.
    pub(crate) max_output_tokens_per_s: f64,
    /// Peak requests in flight at one instant (sent, not finished; failures included).
    pub peak_in_flight: u64,
    pub ttft: Stats,
    pub tpot: Stats,
    pub itl: Stats,
    pub e2el: Stats,
    /// Successful requests answered whole, not streamed (in the counts and throughputs, not in
    /// TTFT, TPOT, ITL or E2EL: [`Scalars::non_streamed`]), and their E2EL.
    pub(crate) non_streamed: u64,
    pub(crate) non_streamed_e2el: Stats,
    /// TTFT and E2EL measured from the intended send time (free of coordinated omission).
    pub ttft_from_intended: Stats,
    pub(crate) e2el_from_intended: Stats,
    /// Send drift ([`Scalars::drift_ns`]) of every request; negative = early.
    pub drift: Stats,
    /// The dispatcher's part of it (released − intended) of every request.
    pub dispatch_drift: Stats,
    /// Time waiting for a concurrency slot of every request.
    pub client_queue: Stats,
    /// Successful requests whose server reported per-request metrics.
    pub server_reported: u64,
    pub server_queue: Stats,
    pub server_ttft: Stats,
    /// [`unattributed`], for requests with a server TTFT.
    pub unattributed: Stats,
    /// `None` when no request reported cached tokens.
    pub(crate) server_cache: Option<ServerCache>,
    /// Failures by kind.
    pub errors: BTreeMap<String, u64>,
    /// The run held more ITL values than [`ITL_BOUND`]: `itl` is from the HdrHistogram and
    /// `max_output_tokens_per_s` counts whole seconds of the run clock.
    pub(crate) itl_from_histogram: bool,
    /// The run measured more requests than [`SCALAR_BOUND`]: every statistic but the counts
    /// and totals is from running aggregates (mean, std, min and max exact by running sums,
    /// median and percentiles from HdrHistograms), and the peaks count buckets of the run clock
    /// (docs/replay.md#memory). Implies `itl_from_histogram`.
    pub(crate) scalars_from_histogram: bool,
}

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
struct Overlaps {
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
    fn bytes(&self) -> usize {
        (self.starts.capacity() + self.ends.capacity()) * std::mem::size_of::<u32>()
    }
}

/// What [`Collector`] folds from every request, whatever the run's length.
#[derive(Debug, Clone)]
struct Totals {
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
    active_per_s: Overlaps,
    /// Every request from send to end by 1 ms of the run clock, the width doubling past 2^20
    /// buckets (the peak in flight).
    in_flight: Overlaps,
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
    totals: Totals,
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
    fn per_second_peaks(&self) -> (f64, u64) {
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
pub struct Slo {
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
fn max_concurrency<'a>(samples: impl Iterator<Item = &'a Scalars>) -> u64 {
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

/// The run's distributions as HdrHistograms.
#[derive(Debug, Clone)]
pub struct Histograms {
    /// name → histogram; units in the name (`ttft_us`, `drift_abs_ns`, ...).
    pub(crate) by_name: BTreeMap<String, Histogram<u64>>,
}

impl Default for Histograms {
    /// Empty: `ttft_us`, `tpot_us`, `itl_us`, `e2el_us` (up to an hour), `drift_abs_ns`,
    /// `client_queue_ns` (up to an hour).
    fn default() -> Histograms {
        const HOUR_US: u64 = 3_600_000_000;
        const HOUR_NS: u64 = 3_600_000_000_000;
        let hist = |high| Histogram::new_with_bounds(1, high, 3).expect("valid static bounds");
        let mut h = BTreeMap::new();
        for name in ["ttft_us", "tpot_us", "itl_us", "e2el_us"] {
            h.insert(name.to_string(), hist(HOUR_US));
        }
        for name in ["drift_abs_ns", "client_queue_ns"] {
            h.insert(name.to_string(), hist(HOUR_NS));
        }
        Histograms { by_name: h }
    }
}

impl Histograms {
    /// The histograms of `samples` (see [`Histograms::record`]).
    pub fn from_samples(samples: &[Sample]) -> Histograms {
        let mut h = Histograms::default();
        for s in samples {
            h.record(&s.scalars, &s.itls_ns);
        }
        h
    }

    /// Adds one request: its drift and client queue always, its latencies when it succeeded.
    pub(crate) fn record(&mut self, s: &Scalars, itls_ns: &[u64]) {
        let h = &mut self.by_name;
        fn rec(h: &mut BTreeMap<String, Histogram<u64>>, name: &str, v: u64) {
            if let Some(hist) = h.get_mut(name) {
                hist.saturating_record(v.max(1));
            }
        }
        rec(h, "drift_abs_ns", s.drift_ns().unsigned_abs());
        rec(h, "client_queue_ns", s.client_queue_ns());
        if !s.ok() || s.non_streamed {
            return;
        }
        if let Some(t) = s.ttft_ns {
            rec(h, "ttft_us", t / 1000);
        }
        if let Some(e) = s.e2el_ns {
            rec(h, "e2el_us", e / 1000);
        }
        if let Some(t) = s.tpot_s() {
            rec(h, "tpot_us", (t * 1e6).round() as u64);
        }
        if let Some(hist) = h.get_mut("itl_us") {
            // One lookup per request, not per token.
            for &i in itls_ns {
                hist.saturating_record((i / 1000).max(1));
            }
        }
    }

    /// name → base64 of the V2 serialisation.
    pub(crate) fn encode(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut ser = V2Serializer::new();
        for (name, h) in &self.by_name {
            let mut buf = Vec::new();
            if ser.serialize(h, &mut buf).is_ok() {
                out.insert(
                    name.clone(),
                    base64::engine::general_purpose::STANDARD.encode(&buf),
                );
            }
        }
        out
    }

    /// Decodes one histogram written by [`Histograms::encode`].
    pub fn decode(b64: &str) -> Result<Histogram<u64>, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| format!("histogram is not base64: {e}"))?;
        Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| format!("histogram is not HdrHistogram V2: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A completions stream: send at 0, content at 50, 60, 70 ms, usage chunk at 75 ms.
    #[test]
    fn completions_rules_ignore_usage_chunk_for_e2el() {
        let mut c = StreamClock::new(Api::Completions, 0);
        c.on_message(50 * MS, true, 1, None);
        c.on_message(60 * MS, true, 1, None);
        c.on_message(70 * MS, true, 1, None);
        c.on_message(75 * MS, false, 0, Some(3));
        assert_eq!(c.ttft_ns(), Some(50 * MS));
        assert_eq!(c.itls_ns(), &[10 * MS, 10 * MS]);
        assert_eq!(c.e2el_ns(), Some(70 * MS));
        assert_eq!(c.output_tokens(), 3);
    }

    /// A chat stream: role chunk (empty content, non-empty choices) at 20 ms is the first token by
    /// vLLM's rule; the usage chunk ends E2EL.
    #[test]
    fn chat_rules_role_chunk_is_ttft_usage_ends_e2el() {
        let mut c = StreamClock::new(Api::Chat, 5 * MS);
        c.on_message(20 * MS, true, 0, None);
        c.on_message(50 * MS, true, 1, None);
        c.on_message(60 * MS, true, 1, None);
        c.on_message(64 * MS, false, 0, Some(2));
        assert_eq!(c.ttft_ns(), Some(15 * MS));
        assert_eq!(c.itls_ns(), &[30 * MS, 10 * MS]);
        assert_eq!(c.e2el_ns(), Some(59 * MS));
        assert_eq!(c.output_tokens(), 2);
    }

    #[test]
    fn no_content_means_no_ttft() {
        let mut c = StreamClock::new(Api::Completions, 0);
        c.on_message(10 * MS, false, 0, Some(0));
        assert_eq!(c.ttft_ns(), None);
        assert_eq!(c.e2el_ns(), None);
    }

    #[test]
    fn without_usage_tokens_are_counted() {
        let mut c = StreamClock::new(Api::Completions, 0);
        c.on_message(1, true, 1, None);
        c.on_message(2, true, 2, None);
        assert_eq!(c.output_tokens(), 3);
        assert!(!c.has_usage());
    }

    #[test]
    fn non_streamed_requests_are_counted_apart_with_their_e2el_only() {
        let streamed = sample(0, 50 * MS, &[10 * MS, 10 * MS], 3);
        let mut whole = sample(MS, 200 * MS, &[], 3);
        whole.non_streamed = true;
        let c = Collector::from_samples(&[streamed, whole]);
        let s = c.summary(1.0, &[50.0, 99.0]);
        assert_eq!((s.completed, s.non_streamed), (2, 1));
        assert_eq!((s.ttft.count, s.tpot.count, s.e2el.count), (1, 1, 1));
        assert!((s.ttft.mean - 50.0).abs() < 1e-9, "{}", s.ttft.mean);
        assert!((s.e2el.mean - 70.0).abs() < 1e-9, "{}", s.e2el.mean);
        assert!((s.non_streamed_e2el.mean - 200.0).abs() < 1e-9);
        assert_eq!(s.total_output_tokens, 6, "both count in the totals");
        let ttft_hist = &c.histograms().by_name["ttft_us"];
        assert_eq!(ttft_hist.len(), 1, "nor in the histograms");
    }

    fn sample(send: u64, ttft: u64, itl: &[u64], out: u64) -> Sample {
        let e2el = ttft + itl.iter().sum::<u64>();
        Sample {
            scalars: Scalars {
                input_tokens: 100,
                output_tokens: out,
                intended_ns: send,
                dispatched_ns: send,
                sent_ns: send,
                ttft_ns: Some(ttft),
                e2el_ns: Some(e2el),
                end_ns: send + e2el,
                ..Default::default()
            },
            itls_ns: itl.to_vec(),
            ..Default::default()
        }
    }

    /// Send drift is the actual send's lateness without the slot wait; the client queue is the
    /// slot wait alone; a request that never went out keeps its dispatch drift.
    #[test]
    fn drift_and_client_queue_split_the_send_delay() {
        let s = Scalars {
            intended_ns: 1_000,
            dispatched_ns: 1_010,
            slot_wait_ns: 500,
            sent_ns: 1_540,
            ..Default::default()
        };
        assert_eq!(s.dispatch_drift_ns(), 10);
        assert_eq!(s.drift_ns(), 40, "10 dispatcher + 30 hand-over");
        assert_eq!(s.client_queue_ns(), 500);
        let early = Scalars {
            intended_ns: 1_000,
            dispatched_ns: 990,
            sent_ns: 995,
            ..Default::default()
        };
        assert_eq!(early.drift_ns(), -5);
        assert_eq!(early.client_queue_ns(), 0);
        let unsent = Scalars {
            intended_ns: 1_000,
            dispatched_ns: 1_020,
            ..Default::default()
        };
        assert_eq!(unsent.drift_ns(), 20);
    }

    #[test]
    fn tpot_and_pooled_itl() {
        let a = sample(0, 50 * MS, &[10 * MS, 10 * MS, 10 * MS], 4);
        let b = sample(0, 30 * MS, &[20 * MS], 2);
        let c = sample(0, 40 * MS, &[], 1); // one token: no TPOT, no ITL
        let s = summarize(&[a, b, c], 1.0, &[50.0]);
        assert_eq!(s.completed, 3);
        assert_eq!(s.tpot.count, 2);
        assert!((s.tpot.mean - 15.0).abs() < 1e-9, "{}", s.tpot.mean);
        assert_eq!(s.itl.count, 4);
        assert!((s.itl.mean - 12.5).abs() < 1e-9);
        assert!((s.ttft.mean - 40.0).abs() < 1e-9);
        assert_eq!(s.total_output_tokens, 7);
        assert!((s.output_throughput - 7.0).abs() < 1e-12);
    }

    #[test]
    fn failures_are_counted_by_kind_and_excluded_from_latency() {
        let ok = sample(0, 50 * MS, &[10 * MS], 2);
        let bad = Sample {
            scalars: Scalars {
                error: Some(Failure::Http(500)),
                ..Default::default()
            },
            ..Default::default()
        };
        let bad2 = Sample {
            scalars: Scalars {
                error: Some(Failure::Reset),
                ttft_ns: Some(MS),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = summarize(&[ok, bad.clone(), bad, bad2], 2.0, &[99.0]);
        assert_eq!((s.completed, s.failed), (1, 3));
        assert_eq!(s.errors["http_500"], 2);
        assert_eq!(s.errors["reset"], 1);
        assert_eq!(s.ttft.count, 1);
        assert_eq!(s.total_input_tokens, 100);
        assert!((s.request_throughput - 0.5).abs() < 1e-12);
    }

    #[test]
    fn intended_time_latency_includes_queue_and_drift() {
        let mut a = sample(10 * MS, 50 * MS, &[], 1);
        a.intended_ns = 0;
        a.dispatched_ns = MS;
        a.slot_wait_ns = 8 * MS;
        let s = summarize(&[a], 1.0, &[]);
        assert!((s.ttft.mean - 50.0).abs() < 1e-9);
        assert!((s.ttft_from_intended.mean - 60.0).abs() < 1e-9);
        // Sent at 10 ms after an 8 ms slot wait: 2 ms late, 1 ms of it the dispatcher's.
        assert!((s.drift.mean - 2.0).abs() < 1e-9);
        assert!((s.dispatch_drift.mean - 1.0).abs() < 1e-9);
        assert!((s.client_queue.mean - 8.0).abs() < 1e-9);
    }

    #[test]
    fn server_breakdown() {
        let mut a = sample(0, 50 * MS, &[], 1);
        a.server = ServerTimes {
            queue_ms: Some(5.0),
            ttft_ms: Some(30.0),
            prompt_tokens: None,
            cached_tokens: None,
        };
        let b = sample(0, 40 * MS, &[], 1);
        let s = summarize(&[a, b], 1.0, &[]);
        assert_eq!(s.server_reported, 1);
        assert!((s.unattributed.mean - 15.0).abs() < 1e-9);
        assert_eq!(s.server_cache, None);
    }

    /// llama.cpp reports a server TTFT and cached tokens but no queue time: the queue wait
    /// stays in the unattributed remainder, and the per-request hits add up.
    #[test]
    fn server_breakdown_without_queue_time() {
        let mut a = sample(0, 50 * MS, &[], 1);
        a.input_tokens = 100;
        a.server = ServerTimes {
            ttft_ms: Some(20.0),
            prompt_tokens: Some(48),
            cached_tokens: Some(47),
            ..Default::default()
        };
        let mut b = sample(0, 40 * MS, &[], 1);
        b.input_tokens = 48;
        b.server = ServerTimes {
            ttft_ms: Some(10.0),
            cached_tokens: Some(0),
            ..Default::default()
        };
        let s = summarize(&[a, b], 1.0, &[]);
        assert_eq!(s.server_reported, 2);
        assert_eq!(s.server_queue.count, 0);
        assert!((s.unattributed.mean - 30.0).abs() < 1e-9);
        let c = s.server_cache.unwrap();
        assert_eq!((c.requests, c.cached_tokens, c.prompt_tokens), (2, 47, 96));
        assert_eq!(c.hit_rate(), Some(47.0 / 96.0));
    }

    #[test]
    fn numpy_percentiles_median_std() {
        let v = [1.0, 2.0, 3.0, 4.0];
        let st = Stats::from_seconds(&v, &[0.0, 25.0, 50.0, 99.0, 100.0]);
        // np.percentile([1,2,3,4], [0,25,50,99,100]) = 1, 1.75, 2.5, 3.97, 4
        let want = [1.0, 1.75, 2.5, 3.97, 4.0];
        for ((_, got), w) in st.percentiles.iter().zip(want) {
            assert!((got / 1000.0 - w).abs() < 1e-12, "{got} {w}");
        }
        assert_eq!(st.median, 2500.0);
        // np.std([1,2,3,4]) = 1.118033988749895
        assert!((st.std / 1000.0 - 1.118033988749895).abs() < 1e-15);
        let empty = Stats::from_seconds(&[], &[99.0]);
        assert_eq!((empty.mean, empty.percentiles[0].1), (0.0, 0.0));
    }

    #[test]
    fn pairwise_sum_matches_numpy_on_long_arrays() {
        // Values from numpy 2.4: np.sum([0.1]*1000) and np.sum([0.1*i + 1e-3*(i%7) for i in
        // range(1000)]); a naive loop gives 99.9999999999986 and 49952.99699999996.
        assert_eq!(np_sum(&[0.1; 1000]), 100.00000000000001);
        let v: Vec<f64> = (0..1000)
            .map(|i| 0.1 * i as f64 + 1e-3 * (i % 7) as f64)
            .collect();
        assert_eq!(np_sum(&v), 49952.997);
    }

    /// vLLM's own result file: recomputing its statistics from its per-request arrays must give
    /// its numbers exactly.
    #[test]
    fn matches_real_vllm_bench_serve_result() {
        let raw = include_str!("../../fixtures/vllm/bench_serve_result_timed_trace.json");
        let v: serde_json::Value = serde_json::from_str(raw).unwrap();
        let arr = |k: &str| -> Vec<f64> {
            v[k].as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let ttfts = arr("ttfts");
        let lat = arr("latencies");
        let outs = arr("output_lens");
        let itls: Vec<f64> = v["itls"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|a| a.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
            .collect();
        let tpots: Vec<f64> = (0..ttfts.len())
            .filter(|&i| outs[i] > 1.0)
            .map(|i| (lat[i] - ttfts[i]) / (outs[i] - 1.0))
            .collect();
        for (name, vals) in [("ttft", &ttfts), ("tpot", &tpots), ("itl", &itls)] {
            let s = Stats::from_seconds(vals, &[99.0]);
            let key = |k: &str| v[format!("{k}_{name}_ms")].as_f64().unwrap();
            assert_eq!(s.mean, key("mean"), "mean {name}");
            assert_eq!(s.median, key("median"), "median {name}");
            assert_eq!(s.std, key("std"), "std {name}");
            assert_eq!(s.percentiles[0].1, key("p99"), "p99 {name}");
        }
    }

    #[test]
    fn histograms_round_trip_and_merge() {
        let a = sample(0, 50 * MS, &[10 * MS; 9], 10);
        let h = Histograms::from_samples(std::slice::from_ref(&a));
        let enc = h.encode();
        let mut back = Histograms::decode(&enc["itl_us"]).unwrap();
        assert_eq!(back.len(), 9);
        assert_eq!(back.value_at_quantile(0.5), back.highest_equivalent(10_000));
        let other = Histograms::decode(&Histograms::from_samples(&[a]).encode()["itl_us"]).unwrap();
        back.add(&other).unwrap();
        assert_eq!(back.len(), 18);
        assert!(Histograms::decode("not base64!").is_err());
    }

    #[test]
    fn goodput_counts_requests_meeting_every_slo() {
        let fast = sample(0, 40 * MS, &[10 * MS], 2); // ttft 40, tpot 10, e2el 50
        let slow_tpot = sample(0, 40 * MS, &[30 * MS], 2); // tpot 30
        let one_token = sample(0, 45 * MS, &[], 1); // tpot counts as 0
        let all = [fast, slow_tpot, one_token];
        let good_requests = |slo: Slo| {
            let mut c = Collector::new(ITL_BOUND, SCALAR_BOUND, slo);
            for (i, s) in all.iter().enumerate() {
                c.add(i, s);
            }
            let per_s = c.summary(2.0, &[]).request_goodput.unwrap();
            (per_s * 2.0) as u64
        };
        let slo = |t, p, e| Slo {
            ttft_ms: t,
            tpot_ms: p,
            e2el_ms: e,
        };
        assert_eq!(good_requests(slo(Some(50.0), None, None)), 3);
        assert_eq!(good_requests(slo(Some(50.0), Some(20.0), None)), 2);
        assert_eq!(good_requests(slo(None, Some(20.0), Some(46.0))), 1);
        assert_eq!(good_requests(slo(Some(10.0), None, None)), 0);
    }

    /// Past its ITL bound the collector lets the ITL values go: it then holds only the
    /// per-request part, its ITL statistics come from the histogram (and it says so); requests
    /// finishing in any order give the same statistics as samples in schedule order.
    #[test]
    fn itl_values_past_the_bound_are_let_go_and_itl_stats_come_from_the_histogram() {
        let n = 2_000u64;
        let samples: Vec<Sample> = (0..n)
            .map(|i| sample(i * MS, (40 + i % 7) * MS, &[(10 + i % 3) * MS; 50], 51))
            .collect();
        let exact = Collector::from_samples(&samples);
        assert!(!exact.itl_from_histogram());
        let mut bounded = Collector::new(10_000, SCALAR_BOUND, Slo::default());
        for (i, s) in samples.iter().enumerate().rev() {
            bounded.add(i, s);
        }
        assert!(bounded.itl_from_histogram());
        let per_request =
            std::mem::size_of::<Option<Scalars>>() + std::mem::size_of::<(usize, u32)>();
        // the per-request part (grown by doubling), the in-flight peak's milliseconds and the
        // peaks' seconds, nothing that grows with tokens
        let t = &bounded.totals;
        let clock = t.in_flight.bytes() + t.active_per_s.bytes();
        let fixed = (n as usize).next_power_of_two() * per_request + clock;
        assert!(exact.retained_bytes() >= fixed + 100_000 * 8);
        assert!(
            bounded.retained_bytes() <= fixed + 1024,
            "{}",
            bounded.retained_bytes()
        );
        let p = [50.0, 99.0];
        let (a, b) = (exact.summary(3.0, &p), bounded.summary(3.0, &p));
        assert_eq!(a, summarize(&samples, 3.0, &p));
        assert_eq!(b.itl.count, a.itl.count);
        let near = |x: f64, y: f64| (x - y).abs() <= 1e-3 * y;
        assert!(
            near(b.itl.mean, a.itl.mean),
            "{} {}",
            b.itl.mean,
            a.itl.mean
        );
        assert!(near(b.itl.percentiles[1].1, a.itl.percentiles[1].1));
        assert_eq!(
            (&b.ttft, &b.tpot, &b.e2el, &b.drift),
            (&a.ttft, &a.tpot, &a.e2el, &a.drift)
        );
        assert_eq!(b.max_concurrent_requests, a.max_concurrent_requests);
        assert_eq!(b.total_output_tokens, a.total_output_tokens);
        // tokens 1 ms apart at most 51 per request, requests 1 ms apart: the run-clock peak is
        // within one request's tokens of vLLM's
        assert!((b.max_output_tokens_per_s - a.max_output_tokens_per_s).abs() <= 51.0);
    }

    /// Request `i` of a synthetic run: sends every 0.2 ms (repeating every `period` requests),
    /// early and late dispatches and sends, slot waits, failures of three kinds, server times
    /// that leave a negative unattributed remainder, cached tokens.
    fn synthetic(i: u64, period: u64) -> Sample {
        let r = |k: u64| (i.wrapping_add(k).wrapping_mul(2_654_435_761) >> 7) % 1_000_003;
        let intended = MS + (i % period) * 200_000;
        let dispatched = intended + r(1) % MS - 300_000;
        let slot_wait = if i % 4 == 0 { r(2) * 5 } else { 0 };
        let sent = dispatched + slot_wait + r(3) % 100_000;
        let error = match (i % 17, i % 29) {
            (3, _) => Some(Failure::Http(503)),
            (_, 5) => Some(Failure::Reset),
            _ => None,
        };
        let content = error.is_none() && i % 31 != 7;
        let ttft = 20 * MS + r(4) * 200;
        let itls: Vec<u64> = (0..1 + r(5) % 8).map(|k| 5 * MS + r(6 + k) * 10).collect();
        let e2el = ttft + itls.iter().sum::<u64>();
        let server = ServerTimes {
            queue_ms: (i % 3 == 0).then(|| (r(20) % 10) as f64 + 0.123),
            ttft_ms: (i % 3 != 1).then(|| ttft as f64 / 1e6 - 5.0 + (r(21) % 10) as f64),
            prompt_tokens: None,
            cached_tokens: (i % 5 == 0).then(|| r(22) % 100),
        };
        Sample {
            scalars: Scalars {
                input_tokens: 100 + r(7) % 1000,
                output_tokens: itls.len() as u64 + 1,
                intended_ns: intended,
                dispatched_ns: dispatched,
                slot_wait_ns: slot_wait,
                sent_ns: sent,
                ttft_ns: (error == Some(Failure::Reset) || content).then_some(ttft),
                e2el_ns: content.then_some(e2el),
                end_ns: sent + e2el,
                error,
                server,
                non_streamed: i % 11 == 3,
            },
            itls_ns: if content && i % 11 != 3 {
                itls
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }

    /// The same requests through a collector holding them all and one holding `bound`.
    fn exact_and_bounded(samples: &[Sample], bound: usize, slo: Slo) -> (Collector, Collector) {
        let mut exact = Collector::new(ITL_BOUND, usize::MAX, slo);
        let mut bounded = Collector::new(ITL_BOUND, bound, slo);
        for (i, s) in samples.iter().enumerate() {
            exact.add(i, s);
            bounded.add(i, s);
        }
        (exact, bounded)
    }

    /// `b` from aggregates agrees with the exact `a`: count, min and max exactly, mean and std
    /// to float rounding, median and percentiles to the histograms' 3 significant digits.
    fn assert_agrees(name: &str, a: &Stats, b: &Stats) {
        assert_eq!((b.count, b.min, b.max), (a.count, a.min, a.max), "{name}");
        let close = |x: f64, y: f64, rel: f64| (x - y).abs() <= rel * y.abs().max(1e-3);
        assert!(
            close(b.mean, a.mean, 1e-9),
            "{name} mean {} {}",
            b.mean,
            a.mean
        );
        assert!(close(b.std, a.std, 1e-9), "{name} std {} {}", b.std, a.std);
        assert!(
            close(b.median, a.median, 1e-3),
            "{name} {} {}",
            b.median,
            a.median
        );
        for ((p, x), (_, y)) in b.percentiles.iter().zip(&a.percentiles) {
            assert!(close(*x, *y, 1e-3), "{name} p{p}: {x} {y}");
        }
    }

    /// Past the request bound every figure comes from the aggregates folded in `add`: counts,
    /// totals, errors and goodput exactly, the statistics within the histograms' precision,
    /// the peaks from buckets of the run clock.
    #[test]
    fn a_run_past_the_request_bound_agrees_with_the_exact_summary() {
        let samples: Vec<Sample> = (0..50_000).map(|i| synthetic(i, u64::MAX)).collect();
        let slo = Slo {
            ttft_ms: Some(150.0),
            tpot_ms: Some(12.0),
            e2el_ms: None,
        };
        let (exact, bounded) = exact_and_bounded(&samples, 1_000, slo);
        assert!(!exact.scalars_from_histogram() && bounded.scalars_from_histogram());
        let p = [1.0, 10.0, 50.0, 90.0, 99.0, 99.9];
        let (a, b) = (exact.summary(12.5, &p), bounded.summary(12.5, &p));
        assert!(!a.scalars_from_histogram && b.scalars_from_histogram && b.itl_from_histogram);
        let counts = |s: &Summary| {
            let totals = (
                s.total_input_tokens,
                s.total_output_tokens,
                s.server_reported,
            );
            let goodput = s.request_goodput.map(f64::to_bits);
            (
                s.completed,
                s.failed,
                totals,
                s.errors.clone(),
                s.server_cache,
                goodput,
            )
        };
        assert_eq!(counts(&b), counts(&a));
        assert_eq!(a.errors.len(), 3, "{:?}", a.errors);
        assert!(a.request_goodput.unwrap() > 0.0 && a.unattributed.min < 0.0);
        for (name, x, y) in [
            ("ttft", &a.ttft, &b.ttft),
            ("tpot", &a.tpot, &b.tpot),
            ("e2el", &a.e2el, &b.e2el),
            (
                "ttft_from_intended",
                &a.ttft_from_intended,
                &b.ttft_from_intended,
            ),
            (
                "e2el_from_intended",
                &a.e2el_from_intended,
                &b.e2el_from_intended,
            ),
            ("drift", &a.drift, &b.drift),
            ("dispatch_drift", &a.dispatch_drift, &b.dispatch_drift),
            ("client_queue", &a.client_queue, &b.client_queue),
            ("server_queue", &a.server_queue, &b.server_queue),
            ("server_ttft", &a.server_ttft, &b.server_ttft),
            ("unattributed", &a.unattributed, &b.unattributed),
        ] {
            assert_agrees(name, x, y);
        }
        let near = |x: f64, y: f64| (x - y).abs() <= 1e-3 * y;
        assert!(
            near(b.itl.mean, a.itl.mean) && near(b.itl.percentiles[4].1, a.itl.percentiles[4].1)
        );
        // Whole seconds of the run clock against seconds from the first send (1 ms apart), and
        // the busiest millisecond against the busiest instant: at most 5 sends more.
        let within = |x: f64, y: f64, by: f64| (x - y).abs() <= by * y;
        assert!(within(
            b.max_output_tokens_per_s,
            a.max_output_tokens_per_s,
            0.01
        ));
        let (bc, ac) = (
            b.max_concurrent_requests as f64,
            a.max_concurrent_requests as f64,
        );
        assert!(within(bc, ac, 0.01), "{bc} {ac}");
        assert!((a.peak_in_flight..=a.peak_in_flight + 5).contains(&b.peak_in_flight));
        assert_eq!(bounded.drift(&p), b.drift);
    }

    /// Past the bound the collector holds nothing per request: what it keeps is the same for
    /// 20,000 requests as for 50,000 over the same span of the run clock, and small.
    #[test]
    fn retained_bytes_past_the_request_bound_do_not_grow_with_requests() {
        let held = |n: u64| {
            let mut c = Collector::new(ITL_BOUND, 1_000, Slo::default());
            for i in 0..n {
                c.add(i as usize, &synthetic(i, 10_000));
            }
            assert!(c.held().is_none() && c.itl_from_histogram());
            c.retained_bytes()
        };
        let (some, more) = (held(20_000), held(50_000));
        assert_eq!(some, more);
        assert!(more < 64 << 10, "{more}");
        let under = Collector::from_samples(&[synthetic(0, 1)]);
        assert!(under.held().is_some_and(|h| h.len() == 1));
    }

    /// Negative values (early sends) past the bound keep their sign: percentiles below zero,
    /// above it, and of a run early throughout.
    #[test]
    fn negative_drift_past_the_request_bound_comes_out_right() {
        let early = |us: i64| {
            let intended = 10 * MS;
            let sent = (intended as i64 + us * 1000) as u64;
            Sample {
                scalars: Scalars {
                    intended_ns: intended,
                    dispatched_ns: sent,
                    sent_ns: sent,
                    end_ns: sent + MS,
                    ..Default::default()
                },
                ..Default::default()
            }
        };
        let p = [1.0, 25.0, 50.0, 75.0, 99.0];
        for (lo, hi) in [(-5_000, 5_000), (-9_000, -1_000)] {
            let samples: Vec<Sample> = (0..50_000).map(|i| early(lo + i % (hi - lo + 1))).collect();
            let (exact, bounded) = exact_and_bounded(&samples, 1_000, Slo::default());
            let (a, b) = (exact.drift(&p), bounded.drift(&p));
            assert_agrees("drift", &a, &b);
            assert_agrees(
                "dispatch",
                &exact.summary(1.0, &p).dispatch_drift,
                &bounded.summary(1.0, &p).dispatch_drift,
            );
            assert_eq!((b.min, b.max), (lo as f64 / 1000.0, hi as f64 / 1000.0));
            assert!(b.percentiles[0].1 < 0.0 && (b.percentiles[4].1 > 0.0) == (hi > 0));
        }
    }

    #[test]
    fn max_concurrency_counts_overlaps() {
        let mut a = sample(0, 10, &[], 1);
        a.end_ns = 100;
        let mut b = sample(50, 10, &[], 1);
        b.end_ns = 150;
        let mut c = sample(100, 10, &[], 1);
        c.end_ns = 200;
        assert_eq!(max_concurrency([a.scalars, b.scalars, c.scalars].iter()), 2);
    }

    /// vLLM's buckets: whole seconds from the first send; a request counts in every second it
    /// touches, each content message in its own second.
    #[test]
    fn per_second_peaks_follow_vllm_buckets() {
        let s = 1_000_000_000;
        // sent at 0 s: first token at 0.5 s, then 0.2 s gaps: 0.7, 0.9, 1.1; ends 1.1 s
        let a = sample(0, s / 2, &[s / 5, s / 5, s / 5], 4);
        // sent at 0.95 s, one token at 1.05 s, ends 1.05 s
        let b = sample(95 * s / 100, s / 10, &[], 1);
        let peaks = |s: &[Sample]| Collector::from_samples(s).per_second_peaks();
        assert_eq!(peaks(&[a, b]), (3.0, 2));
        assert_eq!(peaks(&[]), (0.0, 0));
    }

    /// The requests of real `vllm bench serve` runs (their `--save-detailed` arrays), summarised
    /// by us, give the peaks and statistics vLLM wrote for them.
    #[test]
    fn summary_of_real_vllm_requests_matches_its_result() {
        for text in [
            include_str!("../../fixtures/vllm/bench_serve_result_timed_trace.json"),
            include_str!("../../fixtures/vllm/bench_serve_result_random.json"),
        ] {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            let ns = |x: &serde_json::Value| (x.as_f64().unwrap() * 1e9).round() as u64;
            let col = |k: &str| v[k].as_array().unwrap().clone();
            let (starts, ttfts, lats, itls) = (
                col("start_times"),
                col("ttfts"),
                col("latencies"),
                col("itls"),
            );
            let samples: Vec<Sample> = (0..starts.len())
                .map(|i| {
                    let sent = ns(&starts[i]);
                    Sample {
                        scalars: Scalars {
                            input_tokens: v["input_lens"][i].as_u64().unwrap(),
                            output_tokens: v["output_lens"][i].as_u64().unwrap(),
                            intended_ns: sent,
                            dispatched_ns: sent,
                            sent_ns: sent,
                            ttft_ns: Some(ns(&ttfts[i])),
                            e2el_ns: Some(ns(&lats[i])),
                            end_ns: sent + ns(&lats[i]),
                            ..Default::default()
                        },
                        itls_ns: itls[i].as_array().unwrap().iter().map(ns).collect(),
                        ..Default::default()
                    }
                })
                .collect();
            let sum = summarize(&samples, v["duration"].as_f64().unwrap(), &[99.0]);
            let peak_tokens = v["max_output_tokens_per_s"].as_f64().unwrap();
            assert_eq!(sum.max_output_tokens_per_s, peak_tokens);
            assert_eq!(sum.max_concurrent_requests, v["max_concurrent_requests"]);
            for (ours, key) in [
                (sum.ttft.mean, "mean_ttft_ms"),
                (sum.tpot.mean, "mean_tpot_ms"),
            ] {
                let theirs = v[key].as_f64().unwrap();
                assert!((ours - theirs).abs() < 1e-6, "{key}: {ours} vs {theirs}");
            }
        }
    }

    #[test]
    fn percentile_labels() {
        assert_eq!(percentile_label(99.0), "99");
        assert_eq!(percentile_label(99.9), "99.9");
    }
}
