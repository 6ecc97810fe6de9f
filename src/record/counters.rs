//! Live counters of the recording proxy (relaxed atomics: the forwarding path pays an
//! uncontended add) and their Prometheus text rendering.

use super::failure::ProxyFailure;
use crate::wire::prom::{Kind, PromWriter};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the latency buckets.
const BUCKETS: [f64; 17] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// Upper bounds (seconds) of the per-chunk forwarding delay buckets (10 µs to 1 s).
const FINE_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 1.0,
];

/// A cumulative-bucket latency histogram (buckets from 10 µs to 1 s when `FINE`).
#[derive(Debug, Default)]
pub(crate) struct Histogram<const FINE: bool = false> {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl<const FINE: bool> Histogram<FINE> {
    fn bounds(&self) -> &'static [f64] {
        if FINE {
            FINE_BUCKETS
        } else {
            &BUCKETS
        }
    }

    pub(crate) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let bounds = self.bounds();
        let k = bounds.iter().position(|b| s <= *b).unwrap_or(bounds.len());
        self.counts[k].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, name: &str, help: &str, w: &mut PromWriter) {
        w.family(name, Kind::Histogram, help);
        let (bounds, mut cum) = (self.bounds(), 0u64);
        for (k, b) in bounds.iter().enumerate() {
            cum += self.counts[k].load(Relaxed);
            w.bucket(name, &[], b, cum);
        }
        cum += self.counts[bounds.len()].load(Relaxed);
        w.bucket(name, &[], "+Inf", cum);
        w.sum(name, &[], self.sum_ns.load(Relaxed) as f64 / 1e9);
        w.count(name, &[], self.count.load(Relaxed));
    }
}

/// Why a shadow copy has no measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// `--shadow-max-in-flight` copies were running.
    InFlight = 0,
    /// The shadows' byte budget was spent.
    Bytes,
    /// The request body was over `--capture-max`, so no copy of it was kept.
    BodyOverCap,
    /// The primary's record went out before the copy ended (the byte budget).
    Budget,
    /// The proxy was draining.
    Draining,
}

impl Skip {
    /// The reason's name (trace records, `/metrics` labels).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Skip::InFlight => "in_flight",
            Skip::Bytes => "bytes",
            Skip::BodyOverCap => "body_over_cap",
            Skip::Budget => "budget",
            Skip::Draining => "draining",
        }
    }

    pub(crate) const ALL: [Skip; 5] = [
        Skip::InFlight,
        Skip::Bytes,
        Skip::BodyOverCap,
        Skip::Budget,
        Skip::Draining,
    ];
}

/// The counters of one shadow target.
#[derive(Debug, Default)]
pub(crate) struct ShadowCounters {
    pub(crate) mirrored: AtomicU64,
    pub(crate) skipped: [AtomicU64; Skip::ALL.len()],
    /// Copies that ended with a failure kind or a status of 400 or more.
    pub(crate) failed: AtomicU64,
}

/// All counters of one proxy instance.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    pub(crate) requests: AtomicU64,
    pub(crate) in_flight: AtomicI64,
    pub(crate) responses_by_class: [AtomicU64; 6],
    pub(crate) request_bytes: AtomicU64,
    pub(crate) response_bytes: AtomicU64,
    pub(crate) upstream_errors: [AtomicU64; ProxyFailure::COUNTED.len()],
    pub(crate) client_cancelled: AtomicU64,
    /// Records dropped because the writer queue was full.
    pub(crate) records_dropped: AtomicU64,
    /// Records lost because the trace file could not be written.
    pub records_lost_io: AtomicU64,
    pub records_written: AtomicU64,
    pub write_errors: AtomicU64,
    pub(crate) parse_failures: AtomicU64,
    pub(crate) files_closed: AtomicU64,
    pub(crate) headers_latency: Histogram,
    pub(crate) ttft: Histogram,
    pub(crate) duration: Histogram,
    /// Per forwarded chunk: upstream socket read → client socket write completed.
    pub(crate) forward_delay: Histogram<true>,
    /// Exchanges switched to another protocol (101) and tunnelled.
    pub(crate) upgrades: AtomicU64,
    pub(crate) tunnels_open: AtomicI64,
    pub(crate) tunnel_bytes_to_upstream: AtomicU64,
    pub(crate) tunnel_bytes_to_client: AtomicU64,
    /// The drain deadline passed: exchanges still open end as [`ProxyFailure::DrainDeadline`].
    pub(crate) drain_cut: AtomicBool,
    /// The writer's last write or open failed (no frame written since).
    pub(crate) writer_failing: AtomicBool,
    /// The proxy's own `POST /tokenize` requests (`servertok`): counted, failed; and estimated
    /// input lengths written without asking (bounds, upstream off, recording ended).
    pub(crate) upstream_tokenize_ok: AtomicU64,
    pub(crate) upstream_tokenize_failed: AtomicU64,
    pub(crate) upstream_tokenize_skipped: AtomicU64,
    /// Per shadow target, by index (set when the proxy shadows).
    pub(crate) shadows: std::sync::OnceLock<Vec<ShadowCounters>>,
    /// Shadow copies running now, and the budget bytes they and their waiting primaries hold.
    pub(crate) shadow_in_flight: AtomicU64,
    pub(crate) shadow_bytes: AtomicU64,
}

impl ProxyCounters {
    /// Counts a failure (a kind `/metrics` does not list is not counted).
    pub(crate) fn upstream_error(&self, f: ProxyFailure) {
        if let Some(k) = ProxyFailure::COUNTED.iter().position(|x| *x == f) {
            self.upstream_errors[k].fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn response_status(&self, status: u16) {
        let class = usize::from(status / 100).min(5);
        self.responses_by_class[class].fetch_add(1, Relaxed);
    }

    /// Prometheus text exposition (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut w = PromWriter::with_capacity(4096);
        let mut counter = |name: &str, help: &str, v: u64| {
            w.family(name, Kind::Counter, help);
            w.sample(name, &[], v);
        };
        counter(
            "retrace_record_requests_total",
            "Requests received from clients.",
            self.requests.load(Relaxed),
        );
        counter(
            "retrace_record_upstream_tokenize_skipped_total",
            "Estimated input lengths written without asking the upstream (rate or in-flight bound, upstream without /tokenize).",
            self.upstream_tokenize_skipped.load(Relaxed),
        );
        counter(
            "retrace_record_request_bytes_total",
            "Request body bytes forwarded upstream.",
            self.request_bytes.load(Relaxed),
        );
        counter(
            "retrace_record_response_bytes_total",
            "Response body bytes forwarded to clients.",
            self.response_bytes.load(Relaxed),
        );
        counter(
            "retrace_record_client_cancelled_total",
            "Responses the client abandoned before their end.",
            self.client_cancelled.load(Relaxed),
        );
        counter(
            "retrace_record_records_dropped_total",
            "Records dropped because the writer queue was full (traffic was not slowed).",
            self.records_dropped.load(Relaxed),
        );
        counter(
            "retrace_record_records_lost_io_total",
            "Records lost because the trace file could not be written.",
            self.records_lost_io.load(Relaxed),
        );
        counter(
            "retrace_record_records_written_total",
            "Records written to trace files.",
            self.records_written.load(Relaxed),
        );
        counter(
            "retrace_record_write_errors_total",
            "Errors creating, writing or closing trace files.",
            self.write_errors.load(Relaxed),
        );
        counter(
            "retrace_record_parse_failures_total",
            "Request bodies that could not be parsed as an OpenAI request (forwarded untouched).",
            self.parse_failures.load(Relaxed),
        );
        counter(
            "retrace_record_files_closed_total",
            "Trace files closed (fsynced and renamed).",
            self.files_closed.load(Relaxed),
        );
        counter(
            "retrace_record_upgrades_total",
            "Exchanges the upstream switched to another protocol (101, e.g. WebSocket), tunnelled.",
            self.upgrades.load(Relaxed),
        );
        let name = "retrace_record_tunnel_bytes_total";
        w.family(
            name,
            Kind::Counter,
            "Bytes carried by upgraded tunnels (never parsed or stored).",
        );
        let to_upstream = self.tunnel_bytes_to_upstream.load(Relaxed);
        w.sample(name, &[("direction", "to_upstream")], to_upstream);
        let to_client = self.tunnel_bytes_to_client.load(Relaxed);
        w.sample(name, &[("direction", "to_client")], to_client);
        let name = "retrace_record_tunnels_open";
        w.family(name, Kind::Gauge, "Upgraded tunnels open now.");
        w.sample(name, &[], self.tunnels_open.load(Relaxed));
        let name = "retrace_record_in_flight";
        w.family(name, Kind::Gauge, "Requests currently being proxied.");
        w.sample(name, &[], self.in_flight.load(Relaxed));
        let name = "retrace_record_responses_total";
        let help = "Responses sent to clients by status class.";
        w.family(name, Kind::Counter, help);
        for (k, c) in self.responses_by_class.iter().enumerate() {
            let class = if k == 0 {
                "none".to_string()
            } else {
                format!("{k}xx")
            };
            w.sample(name, &[("class", &class)], c.load(Relaxed));
        }
        let name = "retrace_record_upstream_errors_total";
        w.family(name, Kind::Counter, "Failed exchanges by error kind.");
        for (k, f) in ProxyFailure::COUNTED.iter().enumerate() {
            let n = self.upstream_errors[k].load(Relaxed);
            w.sample(name, &[("kind", f.as_str())], n);
        }
        self.headers_latency.render(
            "retrace_record_upstream_headers_seconds",
            "Time from request arrival to upstream response headers.",
            &mut w,
        );
        self.ttft.render(
            "retrace_record_ttft_seconds",
            "Time from request arrival to the first SSE event with non-empty choices.",
            &mut w,
        );
        self.duration.render(
            "retrace_record_duration_seconds",
            "Time from request arrival to the end of the response (upgraded tunnels not included).",
            &mut w,
        );
        self.forward_delay.render(
            "retrace_record_forward_delay_seconds",
            "Per forwarded response chunk: from the upstream socket read to the completed write to the client socket (the proxy's own added latency).",
            &mut w,
        );
        let name = "retrace_record_upstream_tokenize_total";
        w.family(name, Kind::Counter, "The proxy's own POST /tokenize requests (estimated input lengths counted by the upstream).");
        let ok = self.upstream_tokenize_ok.load(Relaxed);
        w.sample(name, &[("result", "ok")], ok);
        let failed = self.upstream_tokenize_failed.load(Relaxed);
        w.sample(name, &[("result", "failed")], failed);
        if let Some(shadows) = self.shadows.get() {
            render_shadows(shadows, &mut w);
            let name = "retrace_record_shadow_in_flight";
            w.family(name, Kind::Gauge, "Shadow copies running now.");
            w.sample(name, &[], self.shadow_in_flight.load(Relaxed));
            let name = "retrace_record_shadow_bytes";
            let help = "Bytes shadowing holds now: copies' bodies and captures, and primaries waiting for their copies.";
            w.family(name, Kind::Gauge, help);
            w.sample(name, &[], self.shadow_bytes.load(Relaxed));
        }
        w.finish()
    }
}

/// The shadow targets' counters, labelled by target index.
fn render_shadows(shadows: &[ShadowCounters], w: &mut PromWriter) {
    let name = "retrace_record_shadow_mirrored_total";
    w.family(
        name,
        Kind::Counter,
        "Requests copied to each shadow target.",
    );
    for (k, c) in shadows.iter().enumerate() {
        let k = k.to_string();
        w.sample(name, &[("shadow", &k)], c.mirrored.load(Relaxed));
    }
    let name = "retrace_record_shadow_skipped_total";
    let help = "Copies not sent, or whose measurement was given up, by reason.";
    w.family(name, Kind::Counter, help);
    for (k, c) in shadows.iter().enumerate() {
        let k = k.to_string();
        for (r, why) in Skip::ALL.iter().enumerate() {
            let n = c.skipped[r].load(Relaxed);
            w.sample(name, &[("shadow", &k), ("reason", why.as_str())], n);
        }
    }
    let name = "retrace_record_shadow_failed_total";
    let help = "Copies that failed (a failure kind, or a status of 400 or more).";
    w.family(name, Kind::Counter, help);
    for (k, c) in shadows.iter().enumerate() {
        let k = k.to_string();
        w.sample(name, &[("shadow", &k)], c.failed.load(Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_buckets() {
        let s = ProxyCounters::default();
        s.requests.fetch_add(3, Relaxed);
        s.upstream_error(ProxyFailure::UpstreamConnect);
        s.upstream_error(ProxyFailure::Other);
        s.upstream_error(ProxyFailure::DrainDeadline);
        s.headers_latency.observe(Duration::from_micros(700));
        s.headers_latency.observe(Duration::from_millis(20));
        let t = s.render();
        assert!(t.contains("retrace_record_requests_total 3\n"), "{t}");
        assert!(t.contains("retrace_record_upstream_errors_total{kind=\"upstream_connect\"} 1"));
        assert!(t.contains("retrace_record_upstream_errors_total{kind=\"other\"} 1"));
        assert!(t.contains("retrace_record_upstream_headers_seconds_bucket{le=\"0.0005\"} 0"));
        assert!(t.contains("retrace_record_upstream_headers_seconds_bucket{le=\"0.001\"} 1"));
        assert!(t.contains("retrace_record_upstream_headers_seconds_bucket{le=\"0.025\"} 2"));
        assert!(t.contains("retrace_record_upstream_headers_seconds_count 2"));
    }
}
