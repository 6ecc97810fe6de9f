//! The mock's counters and histograms, and their Prometheus text rendering for `GET /metrics`.
//!
//! Names, labels (`engine="0"`, `model_name`) and buckets follow vLLM 0.32, so dashboards and
//! retrace's own before/after scrapes read the mock like a real server: request gauges, KV usage,
//! prefix-cache queries/hits (tokens), prompt/generation token counters, TTFT/ITL/E2E/queue
//! histograms. The mock adds `retrace_mock_emit_lateness_seconds` (actual minus scheduled time at
//! which each SSE event was handed to the HTTP connection), which makes its own timing accuracy
//! checkable, plus quantile gauges of it. Updates are lock-free atomics except the lateness
//! HdrHistogram (one uncontended mutex per event). This module does not decide what is counted.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

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
#[derive(Debug)]
pub struct Histo {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histo {
    fn new(bounds: &'static [f64]) -> Self {
        Histo {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, secs: f64) {
        let secs = secs.max(0.0);
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.sum_ns.fetch_add((secs * 1e9) as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cum}.0");
        }
        let n = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {n}.0");
        let _ = writeln!(out, "{name}_count{{{labels}}} {n}.0");
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum:?}");
    }
}

/// Quantiles of emission lateness, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatenessSummary {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

/// Everything `/metrics` shows.
#[derive(Debug)]
pub struct Stats {
    pub model: String,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    /// `kv_cache_usage_perc` as f64 bits.
    pub kv_usage_bits: AtomicU64,
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub success_stop: AtomicU64,
    pub success_length: AtomicU64,
    pub aborted: AtomicU64,
    pub faults_injected: AtomicU64,
    /// `realtime` was asked for but the OS refused it.
    pub realtime_failed: std::sync::atomic::AtomicBool,
    pub ttft: Histo,
    pub itl: Histo,
    pub e2e: Histo,
    pub queue: Histo,
    lateness: Mutex<hdrhistogram::Histogram<u64>>,
    /// Engine-side: time the engine thread handed an event over minus its deadline.
    dispatch: Mutex<hdrhistogram::Histogram<u64>>,
}

impl Stats {
    pub fn new(model: &str) -> Self {
        Stats {
            model: model.to_string(),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            kv_usage_bits: AtomicU64::new(0f64.to_bits()),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success_stop: AtomicU64::new(0),
            success_length: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            faults_injected: AtomicU64::new(0),
            realtime_failed: std::sync::atomic::AtomicBool::new(false),
            ttft: Histo::new(TTFT_BUCKETS),
            itl: Histo::new(ITL_BUCKETS),
            e2e: Histo::new(E2E_BUCKETS),
            queue: Histo::new(TTFT_BUCKETS),
            lateness: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("static histogram bounds are valid"),
            ),
            dispatch: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("static histogram bounds are valid"),
            ),
        }
    }

    /// Records one event's emission lateness (negative values, i.e. early, count as 0).
    pub fn record_lateness(&self, nanos: i128) {
        let us = (nanos.max(0) / 1000) as u64;
        if let Ok(mut h) = self.lateness.lock() {
            h.saturating_record(us.max(1));
        }
    }

    /// Records the engine thread's own lateness in handing an event over.
    pub fn record_dispatch(&self, nanos: u128) {
        if let Ok(mut h) = self.dispatch.lock() {
            h.saturating_record(((nanos / 1000) as u64).max(1));
        }
    }

    /// Engine-side dispatch lateness (the part of the emission lateness that is the clock's).
    pub fn dispatch_lateness(&self) -> LatenessSummary {
        summarize(&self.dispatch)
    }

    pub fn lateness(&self) -> LatenessSummary {
        summarize(&self.lateness)
    }
}

fn summarize(m: &Mutex<hdrhistogram::Histogram<u64>>) -> LatenessSummary {
    let h = match m.lock() {
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

impl Stats {
    pub fn set_kv_usage(&self, frac: f64) {
        self.kv_usage_bits.store(frac.to_bits(), Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let labels = format!(
            "engine=\"0\",model_name=\"{}\"",
            self.model.replace('"', "'")
        );
        let mut out = String::with_capacity(8192);
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v:?}"
            );
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            self.running.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            self.waiting.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            f64::from_bits(self.kv_usage_bits.load(Relaxed)),
        );
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {v}.0"
            );
        };
        counter(
            &mut out,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_queries.load(Relaxed),
        );
        counter(
            &mut out,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            self.prefix_hits.load(Relaxed),
        );
        counter(
            &mut out,
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            self.prompt_tokens.load(Relaxed),
        );
        let hits = self.prefix_hits.load(Relaxed);
        let prompt = self.prompt_tokens.load(Relaxed);
        let _ = writeln!(
            out,
            "# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.\n# TYPE vllm:prompt_tokens_by_source_total counter"
        );
        for (src, v) in [
            ("local_compute", prompt.saturating_sub(hits)),
            ("local_cache_hit", hits),
            ("external_kv_transfer", 0),
        ] {
            let _ = writeln!(
                out,
                "vllm:prompt_tokens_by_source_total{{{labels},source=\"{src}\"}} {v}.0"
            );
        }
        counter(
            &mut out,
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local prefix cache hits).",
            hits,
        );
        counter(
            &mut out,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            self.generation_tokens.load(Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter"
        );
        for (reason, v) in [
            ("stop", &self.success_stop),
            ("length", &self.success_length),
            ("abort", &self.aborted),
        ] {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {}.0",
                v.load(Relaxed)
            );
        }
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &labels,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &labels,
        );
        self.queue.render(
            &mut out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &labels,
        );
        counter(
            &mut out,
            "retrace_mock_faults_injected",
            "Faults injected by the mock (status, stall, reset, slow headers).",
            self.faults_injected.load(Relaxed),
        );
        // Lateness: buckets and quantiles from the HdrHistogram.
        if let Ok(h) = self.lateness.lock() {
            let name = "retrace_mock_emit_lateness_seconds";
            let _ = writeln!(
                out,
                "# HELP {name} SSE event emission lateness: time handed to the connection minus scheduled time.\n# TYPE {name} histogram"
            );
            for &b in LATENESS_BUCKETS_US {
                let c = h.count_between(0, b);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels},le=\"{:?}\"}} {c}.0",
                    b as f64 / 1e6
                );
            }
            let n = h.len();
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {n}.0");
            let _ = writeln!(out, "{name}_count{{{labels}}} {n}.0");
            let sum = h.mean() * n as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{{labels}}} {sum:?}");
            let q = "retrace_mock_emit_lateness_quantile_seconds";
            let d = self.dispatch_lateness();
            let dq = "retrace_mock_dispatch_lateness_quantile_seconds";
            let _ = writeln!(
                out,
                "# HELP {dq} Quantiles of the engine clock's lateness in handing events over (part of the emit lateness).\n# TYPE {dq} gauge"
            );
            for (p, v) in [
                ("0.5", d.p50_us),
                ("0.99", d.p99_us),
                ("0.999", d.p999_us),
                ("1", d.max_us),
            ] {
                let _ = writeln!(
                    out,
                    "{dq}{{{labels},quantile=\"{p}\"}} {:?}",
                    v as f64 / 1e6
                );
            }
            let _ = writeln!(
                out,
                "# HELP {q} Quantiles of SSE event emission lateness since start.\n# TYPE {q} gauge"
            );
            for p in [0.5, 0.99, 0.999, 1.0] {
                let v = if n == 0 { 0 } else { h.value_at_quantile(p) };
                let _ = writeln!(out, "{q}{{{labels},quantile=\"{p}\"}} {:?}", v as f64 / 1e6);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_and_cumulative_buckets() {
        let s = Stats::new("m");
        s.prefix_queries.fetch_add(2081, Relaxed);
        s.ttft.observe(0.03);
        s.ttft.observe(0.07);
        s.record_lateness(300_000);
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
        assert_eq!(s.lateness().count, 1);
        assert!((299..=301).contains(&s.lateness().p99_us));
    }
}
