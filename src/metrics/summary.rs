use super::*;

/// Statistics of one metric, in ms.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
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
#[derive(Debug, Clone, Default, PartialEq)]
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
