//! The one comparable model of a run that `compare`, `report` and `merge` work on ([`Run`]),
//! whatever file it was read from ([`super::load`], [`super::aiperf`]): its scalars by vLLM key,
//! its per-request arrays ([`Requests`]) and its distributions ([`Metric`], [`Weighted`]).

use super::weighted::Weighted;
pub use crate::result::Requests;
use crate::trace::Trace;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a file turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `retrace replay --result-json`.
    Retrace,
    /// `vllm bench serve --save-result`.
    Vllm,
    /// A recorded (or imported) trace.
    Trace,
    /// AIPerf's per-request `profile_export.jsonl`.
    Aiperf,
    /// AIPerf's aggregate `profile_export_aiperf.json`: its statistics only.
    AiperfAggregate,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Retrace => "retrace result",
            Kind::Vllm => "vllm bench serve result",
            Kind::Trace => "trace",
            Kind::Aiperf => "AIPerf per-request export",
            Kind::AiperfAggregate => "AIPerf aggregate export",
        }
    }
}

/// A latency metric, named as in vLLM's keys (`mean_<name>_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    Ttft,
    Tpot,
    Itl,
    E2el,
    ClientQueue,
    ServerQueue,
    ServerTtft,
    Unattributed,
}

impl Metric {
    pub(crate) const ALL: [Metric; 8] = [
        Metric::Ttft,
        Metric::Tpot,
        Metric::Itl,
        Metric::E2el,
        Metric::ClientQueue,
        Metric::ServerQueue,
        Metric::ServerTtft,
        Metric::Unattributed,
    ];

    /// Key fragment: `ttft`, `client_queue`, ...
    pub(crate) fn key(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Tpot => "tpot",
            Metric::Itl => "itl",
            Metric::E2el => "e2el",
            Metric::ClientQueue => "client_queue",
            Metric::ServerQueue => "server_queue",
            Metric::ServerTtft => "server_ttft",
            Metric::Unattributed => "unattributed",
        }
    }

    /// Measured on streamed requests only (a whole body has no first token of its own).
    pub(crate) fn streamed_only(self) -> bool {
        matches!(
            self,
            Metric::Ttft | Metric::Tpot | Metric::Itl | Metric::E2el | Metric::Unattributed
        )
    }

    /// A part of client TTFT (client TTFT = server queue + server TTFT + unattributed time).
    pub(crate) fn part_of_ttft(self) -> bool {
        matches!(
            self,
            Metric::ServerQueue | Metric::ServerTtft | Metric::Unattributed
        )
    }

    /// Human label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Metric::Ttft => "TTFT",
            Metric::Tpot => "TPOT",
            Metric::Itl => "ITL",
            Metric::E2el => "E2EL",
            Metric::ClientQueue => "client queue",
            Metric::ServerQueue => "server queue",
            Metric::ServerTtft => "server TTFT",
            Metric::Unattributed => "unattributed server time",
        }
    }

    /// The histogram retrace results store for this metric, and its unit in ms.
    pub(super) fn histogram(self) -> Option<(&'static str, f64)> {
        match self {
            Metric::Ttft => Some(("ttft_us", 1e-3)),
            Metric::Tpot => Some(("tpot_us", 1e-3)),
            Metric::Itl => Some(("itl_us", 1e-3)),
            Metric::E2el => Some(("e2el_us", 1e-3)),
            Metric::ClientQueue => Some(("client_queue_ns", 1e-6)),
            _ => None,
        }
    }
}

impl Requests {
    /// The samples of one metric in ms (successful requests; ITL pooled), like vLLM.
    pub(crate) fn samples_ms(&self, m: Metric) -> Vec<f64> {
        self.samples_ms_of(m, 0..self.len())
    }

    /// [`Requests::samples_ms`] of the requests `which` only (indices below [`Requests::len`]).
    pub(crate) fn samples_ms_of(
        &self,
        m: Metric,
        which: impl IntoIterator<Item = usize>,
    ) -> Vec<f64> {
        let mut out = Vec::new();
        for i in which.into_iter().filter(|&i| i < self.len()) {
            let whole = self.non_streamed.get(i).copied().unwrap_or(false);
            let ok = self.ok(i) && !(whole && m.streamed_only());
            match m {
                Metric::Ttft if ok => out.extend(self.ttft_s[i].map(|v| v * 1e3)),
                Metric::E2el if ok => out.extend(self.latency_s[i].map(|v| v * 1e3)),
                Metric::Tpot if ok => {
                    if let (Some(t), Some(l)) = (self.ttft_s[i], self.latency_s[i]) {
                        if self.output_lens[i] > 1 {
                            out.push((l - t) / (self.output_lens[i] - 1) as f64 * 1e3);
                        }
                    }
                }
                Metric::Itl if ok => out.extend(self.itls_s[i].iter().map(|v| v * 1e3)),
                Metric::ClientQueue => out.extend(self.client_queue_s[i].map(|v| v * 1e3)),
                Metric::ServerQueue if ok => out.extend(self.server_queue_s[i].map(|v| v * 1e3)),
                Metric::ServerTtft if ok => out.extend(self.server_ttft_s[i].map(|v| v * 1e3)),
                Metric::Unattributed if ok => {
                    if let (Some(t), Some(q), Some(s)) = (
                        self.ttft_s[i],
                        self.server_queue_s[i],
                        self.server_ttft_s[i],
                    ) {
                        out.push((t - q - s) * 1e3);
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// One input, ready to compare or report.
#[derive(Debug, Clone)]
pub struct Run {
    pub(crate) path: PathBuf,
    pub(crate) kind: Kind,
    /// Top-level numbers under their vLLM (or retrace) key names.
    pub scalars: BTreeMap<String, f64>,
    /// Top-level strings worth showing (model, target, trace, date, ...).
    pub(crate) info: BTreeMap<String, String>,
    pub requests: Option<Requests>,
    /// Whole histograms (retrace results), in ms.
    pub(crate) hists: BTreeMap<Metric, Weighted>,
    /// The trace itself, when the input was one.
    pub(crate) trace: Option<Trace>,
    /// `server_metrics.series` of a retrace result (`--scrape-metrics`): `{t, running, waiting,
    /// kv_cache_usage, ...}` columns, seconds from t0; not validated beyond being an object.
    pub(crate) server_series: Option<serde_json::Value>,
    /// Flattened scalar leaves of a retrace result's `sessions`, `probes` and `server_metrics`
    /// objects (`probes.ttft.p99`, ...; the time series excluded), in file order, for the report;
    /// an AIPerf export's notes (`aiperf.*`).
    pub(crate) sections: Vec<(String, Value)>,
    /// Which requests of its trace a retrace replay sent (its result's `selection`).
    pub(crate) selection: Option<crate::trace::select::Selection>,
}

impl Run {
    /// File name for labels.
    pub(crate) fn label(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into(),
        )
    }

    /// The samples of a metric in ms, when the input has per-request data.
    pub fn samples_ms(&self, m: Metric) -> Option<Vec<f64>> {
        let r = self.requests.as_ref()?;
        let v = r.samples_ms(m);
        (!v.is_empty()).then_some(v)
    }

    /// The distribution of a metric: from per-request samples when present (exact), else from the
    /// stored histogram.
    pub(crate) fn dist(&self, m: Metric) -> Option<Weighted> {
        match self.samples_ms(m) {
            Some(v) => Some(Weighted::from_samples(&v)),
            None => self.hists.get(&m).cloned().filter(|w| w.n() > 0),
        }
    }

    pub fn scalar(&self, key: &str) -> Option<f64> {
        self.scalars.get(key).copied()
    }

    /// Requests counted (completed + failed).
    pub(crate) fn total_requests(&self) -> Option<f64> {
        Some(self.scalar("completed")? + self.scalar("failed").unwrap_or(0.0))
    }
}

/// `completed`, `failed`, `duration` (first send to last end) and vLLM's throughputs over it, from
/// per-request data.
pub(crate) fn add_totals(r: &Requests, scalars: &mut BTreeMap<String, f64>) {
    let completed = (0..r.len()).filter(|&i| r.ok(i)).count();
    scalars.insert("completed".into(), completed as f64);
    scalars.insert("failed".into(), (r.len() - completed) as f64);
    let end = (0..r.len()).map(|i| r.end_s(i)).fold(0.0, f64::max);
    if end > 0.0 {
        scalars.insert("duration".into(), end);
        let ok = || (0..r.len()).filter(|&i| r.ok(i));
        let out: u64 = ok().map(|i| r.output_lens[i]).sum();
        let inp: u64 = ok().map(|i| r.input_lens[i]).sum();
        scalars.insert("request_throughput".into(), completed as f64 / end);
        scalars.insert("output_throughput".into(), out as f64 / end);
        scalars.insert("total_token_throughput".into(), (inp + out) as f64 / end);
    }
}
