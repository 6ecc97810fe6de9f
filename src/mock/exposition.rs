//! The mock's counters and histograms, and their Prometheus text for `GET /metrics`: vLLM 0.32's
//! names, labels (`engine="0"`, `model_name`) and buckets, plus the mock's own emission lateness
//! (docs/mock.md, "/metrics"). This module does not decide what is counted.

use crate::wire::prom::{Kind, PromWriter};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const LATENESS_BUCKETS_US: &[u64] = &[25, 50, 100, 250, 500, 1000, 2000, 5000, 10000, 100000];

/// A fixed-bucket histogram of seconds.
#[derive(Debug, Default)]
pub(crate) struct Histo {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histo {
    fn new(bounds: &'static [f64]) -> Self {
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        Histo {
            bounds,
            counts,
            ..Histo::default()
        }
    }

    pub(crate) fn observe(&self, secs: f64) {
        let secs = secs.max(0.0);
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.sum_ns.fetch_add((secs * 1e9) as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }
}

/// Quantiles of emission lateness, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatenessSummary {
    pub count: u64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

/// An HdrHistogram of lateness, in microseconds.
#[derive(Debug)]
pub(crate) struct Lateness(Mutex<hdrhistogram::Histogram<u64>>);

impl Default for Lateness {
    fn default() -> Self {
        let h = hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3);
        Lateness(Mutex::new(h.expect("static histogram bounds are valid")))
    }
}

impl Lateness {
    /// Records one lateness (early counts as 0).
    pub(crate) fn record(&self, late: Duration) {
        if let Ok(mut h) = self.0.lock() {
            h.saturating_record((late.as_micros() as u64).max(1));
        }
    }

    pub(crate) fn summary(&self) -> LatenessSummary {
        let h = match self.0.lock() {
            Ok(h) => h.clone(),
            Err(_) => return LatenessSummary::default(),
        };
        if h.is_empty() {
            return LatenessSummary::default();
        }
        LatenessSummary {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// Everything `/metrics` shows.
#[derive(Debug, Default)]
pub(crate) struct EngineCounters {
    pub(crate) model: String,
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    /// `kv_cache_usage_perc` as f64 bits.
    pub(crate) kv_usage_bits: AtomicU64,
    pub(crate) prefix_queries: AtomicU64,
    pub(crate) prefix_hits: AtomicU64,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) generation_tokens: AtomicU64,
    pub(crate) success_stop: AtomicU64,
    pub(crate) success_length: AtomicU64,
    pub(crate) aborted: AtomicU64,
    pub(crate) faults_injected: AtomicU64,
    /// `realtime` was asked for but the OS refused it.
    pub(crate) realtime_failed: std::sync::atomic::AtomicBool,
    pub(crate) ttft: Histo,
    pub(crate) itl: Histo,
    pub(crate) e2e: Histo,
    pub(crate) queue: Histo,
    /// Each SSE event's bytes handed to the socket minus its scheduled time.
    pub(crate) lateness: Lateness,
    /// Engine-side: time the engine thread handed an event over minus its deadline (the
    /// engine clock's part of `lateness`).
    pub(crate) dispatch: Lateness,
}

impl EngineCounters {
    pub(crate) fn new(model: &str) -> Self {
        EngineCounters {
            model: model.to_string(),
            ttft: Histo::new(TTFT_BUCKETS),
            itl: Histo::new(ITL_BUCKETS),
            e2e: Histo::new(E2E_BUCKETS),
            queue: Histo::new(TTFT_BUCKETS),
            ..EngineCounters::default()
        }
    }

    /// Puts the calling thread under SCHED_FIFO when `realtime`; a refusal is remembered.
    pub(crate) fn go_realtime(&self, realtime: bool) {
        if realtime && !crate::sys::thread_timing::realtime() {
            self.realtime_failed.store(true, Relaxed);
        }
    }

    pub(crate) fn set_kv_usage(&self, frac: f64) {
        self.kv_usage_bits.store(frac.to_bits(), Relaxed);
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut x = Exposition {
            w: PromWriter::with_capacity(8192),
            // A double quote in the model's name shows as `'`.
            model: self.model.replace('"', "'"),
        };
        let n = |a: &AtomicU64| a.load(Relaxed) as f64;
        let (hits, prompt) = (n(&self.prefix_hits), n(&self.prompt_tokens));
        let kv = f64::from_bits(self.kv_usage_bits.load(Relaxed));
        x.gauge(
            "vllm:num_requests_running Number of requests in model execution batches.",
            n(&self.running),
        );
        x.gauge(
            "vllm:num_requests_waiting Number of requests waiting to be processed.",
            n(&self.waiting),
        );
        x.gauge(
            "vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            kv,
        );
        x.counter("vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.", n(&self.prefix_queries));
        x.counter(
            "vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
            hits,
        );
        x.counter(
            "vllm:prompt_tokens_total Number of prefill tokens processed.",
            prompt,
        );
        x.family(
            Kind::Counter,
            "vllm:prompt_tokens_by_source_total Number of prompt tokens by source.",
            "source",
            &[
                ("local_compute", (prompt - hits).max(0.0)),
                ("local_cache_hit", hits),
                ("external_kv_transfer", 0.0),
            ],
        );
        x.counter("vllm:prompt_tokens_cached_total Number of cached prompt tokens (local prefix cache hits).", hits);
        x.counter(
            "vllm:generation_tokens_total Number of generation tokens processed.",
            n(&self.generation_tokens),
        );
        x.family(
            Kind::Counter,
            "vllm:request_success_total Count of successfully processed requests.",
            "finished_reason",
            &[
                ("stop", n(&self.success_stop)),
                ("length", n(&self.success_length)),
                ("abort", n(&self.aborted)),
            ],
        );
        x.histo(
            &self.ttft,
            "vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        );
        x.histo(
            &self.itl,
            "vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.",
        );
        x.histo(
            &self.e2e,
            "vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.",
        );
        x.histo(
            &self.queue,
            "vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.",
        );
        x.counter("retrace_mock_faults_injected_total Faults injected by the mock (status, stall, reset, slow headers).", n(&self.faults_injected));
        self.render_lateness(&mut x);
        x.w.finish()
    }

    /// The emission lateness histogram and quantiles, and the engine clock's quantiles.
    fn render_lateness(&self, x: &mut Exposition) {
        if let Ok(h) = self.lateness.0.lock() {
            let buckets = LATENESS_BUCKETS_US
                .iter()
                .map(|&b| (b as f64 / 1e6, h.count_between(0, b)));
            let sum = h.mean() * h.len() as f64 / 1e6;
            x.histogram("retrace_mock_emit_lateness_seconds SSE event emission lateness: time handed to the connection minus scheduled time.", buckets, h.len(), sum);
        }
        let v = quantiles(self.dispatch.summary());
        x.family(Kind::Gauge, "retrace_mock_dispatch_lateness_quantile_seconds Quantiles of the engine clock's lateness in handing events over (part of the emit lateness).", "quantile", &v);
        let v = quantiles(self.lateness.summary());
        x.family(Kind::Gauge, "retrace_mock_emit_lateness_quantile_seconds Quantiles of SSE event emission lateness since start.", "quantile", &v);
    }
}

/// Rows of a quantile gauge in seconds.
fn quantiles(l: LatenessSummary) -> [(&'static str, f64); 4] {
    let us = [l.p50_us, l.p99_us, l.p999_us, l.max_us];
    let q = ["0.5", "0.99", "0.999", "1"];
    [0, 1, 2, 3].map(|i| (q[i], us[i] as f64 / 1e6))
}

/// The mock's exposition: each family is named by `"NAME HELP TEXT"`, each sample carries
/// `engine="0",model_name=...`, values are written as vLLM writes them (`2081.0`).
struct Exposition {
    w: PromWriter,
    model: String,
}

impl Exposition {
    /// `# HELP` and `# TYPE`; returns the name.
    fn head<'a>(&mut self, kind: Kind, name_help: &'a str) -> &'a str {
        let (name, help) = name_help.split_once(' ').unwrap_or((name_help, ""));
        self.w.family(name, kind, help);
        name
    }

    /// One family with a sample per row (the value of label `label`, value).
    fn family(&mut self, kind: Kind, name_help: &str, label: &str, rows: &[(&str, f64)]) {
        let name = self.head(kind, name_help);
        for &(l, v) in rows {
            let labels = [
                ("engine", "0"),
                ("model_name", self.model.as_str()),
                (label, l),
            ];
            self.w.sample(name, &labels, format_args!("{v:?}"));
        }
    }

    /// One family of one sample.
    fn single(&mut self, kind: Kind, name_help: &str, v: f64) {
        let name = self.head(kind, name_help);
        let labels = [("engine", "0"), ("model_name", self.model.as_str())];
        self.w.sample(name, &labels, format_args!("{v:?}"));
    }

    fn gauge(&mut self, name_help: &str, v: f64) {
        self.single(Kind::Gauge, name_help, v);
    }

    fn counter(&mut self, name_help: &str, v: f64) {
        self.single(Kind::Counter, name_help, v);
    }

    fn histo(&mut self, h: &Histo, name_help: &str) {
        let mut cum = 0;
        let buckets = h.bounds.iter().zip(&h.counts).map(|(b, c)| {
            cum += c.load(Relaxed);
            (*b, cum)
        });
        let sum = h.sum_ns.load(Relaxed) as f64 / 1e9;
        self.histogram(name_help, buckets, h.count.load(Relaxed), sum);
    }

    /// A histogram from its cumulative `(upper bound, count)` buckets.
    fn histogram(
        &mut self,
        name_help: &str,
        buckets: impl Iterator<Item = (f64, u64)>,
        n: u64,
        sum: f64,
    ) {
        let name = self.head(Kind::Histogram, name_help);
        let l = [("engine", "0"), ("model_name", self.model.as_str())];
        for (b, c) in buckets {
            self.w
                .bucket(name, &l, format_args!("{b:?}"), format_args!("{c}.0"));
        }
        self.w.bucket(name, &l, "+Inf", format_args!("{n}.0"));
        self.w.count(name, &l, format_args!("{n}.0"));
        self.w.sum(name, &l, format_args!("{sum:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_and_cumulative_buckets() {
        let s = EngineCounters::new("m");
        s.prefix_queries.fetch_add(2081, Relaxed);
        s.ttft.observe(0.03);
        s.ttft.observe(0.07);
        s.lateness.record(Duration::from_micros(300));
        let txt = s.render();
        assert!(
            txt.contains("vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 2081.0")
        );
        assert!(txt.contains(
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"0.04\"} 1.0"
        ));
        assert!(txt.contains(
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"0.08\"} 2.0"
        ));
        assert!(txt.contains("retrace_mock_emit_lateness_seconds_count"));
        assert_eq!(s.lateness.summary().count, 1);
        assert!((299..=301).contains(&s.lateness.summary().p99_us));
    }
}
