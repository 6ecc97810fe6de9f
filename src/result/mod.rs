//! The replay result file (`--result-json`): vLLM's keys, ours, and whole histograms.
//!
//! One JSON object. Schema `retrace.replay/1` (documented in `docs/result-format.md`, held by the
//! snapshot test below):
//!
//! - **vLLM keys**: every key `vllm bench serve --save-result --save-detailed` (0.32) writes for
//!   a text-generation run, same name, unit and meaning, `generated_texts` aside (no response
//!   text is kept): `date`, `backend` and `endpoint_type` (vLLM's backend name), `label`,
//!   `model_id`, `tokenizer_id`, `num_prompts`, the traffic keys ([`Traffic`]), `max_concurrency`,
//!   `duration` (s, first dispatch to last completion), `completed`, `failed`, tokens,
//!   throughputs, `request_goodput` (null without `--goodput`), `max_output_tokens_per_s`,
//!   `max_concurrent_requests` (vLLM's per-second peaks), `rtfx`, `probe_*` (with probes), and
//!   for each metric `M` in `ttft`, `tpot`, `itl`, `e2el`: `mean_M_ms`, `median_M_ms`,
//!   `std_M_ms`, `pP_M_ms` for every `--percentiles` value P (`p99`, `p99.9`).
//! - **ours**: `schema`, `retrace_version`, `endpoint`, `peak_in_flight`, `trace`, `target` (URL only; headers and keys are never
//!   written), `speed`, `seed`, `block_size`, `prompt_mode`, `drift_limit_ms` (`--max-drift-ms`), `valid` (false
//!   when p99 drift exceeded it), `invalid_reason`, `errors_by_kind` ({kind: count}), and the same
//!   mean/median/std/pP/min/max family for `ttft_from_intended`, `e2el_from_intended` (latency from
//!   the intended send time, free of coordinated omission), `drift` (send drift: actual send −
//!   intended − client queue, i.e. the dispatcher's lateness plus the hand-over to the request's
//!   task; negative = early), `client_queue` (waiting for a concurrency slot), `server_queue`, `server_ttft` (vLLM
//!   per-request `metrics`, when the server sent them) and `unattributed` (client TTFT − server queue
//!   − server TTFT), `non_streamed_e2el` (requests answered whole, kept out of TTFT, TPOT, ITL and
//!   E2EL; only when there were some), plus `server_reported` (requests with server metrics), `server_prefix_cache`
//!   (per-request cached tokens, when the server reported them) and `inexact_prompts`.
//! - **histograms**: `{name: base64 HdrHistogram V2}` for `ttft_us`, `tpot_us`, `itl_us`,
//!   `e2el_us`, `drift_abs_ns`, `client_queue_ns` (successful requests; drift/queue of all).
//! - **with `--detailed`**, index-aligned per-request arrays in seconds like vLLM's: `input_lens`,
//!   `output_lens`, `ttfts` (0 when none), `itls` (lists), `latencies` (E2EL, 0 when none),
//!   `start_times` (actual send, s from t0), `queue_times` (actual − intended send), `errors`
//!   ("" on success, else `kind: detail`), `server_queue_times`, `server_ttfts` (null where unknown), and ours: `intended_times`,
//!   `drifts`, `client_queue_times`.
//!
//! This module builds the result ([`ReplayResult`]); it does not print or write files. Its
//! sidecar ([`sidecar`]) and the bounds its values are read within ([`bounds`]) live beside it.

pub(crate) mod bounds;
pub(crate) mod merge;
pub(crate) mod read;
mod requests;
pub mod sidecar;

pub use requests::Requests;

use crate::metrics::{ns_to_s, percentile_label, Failure, Histograms, Sample, Stats, Summary};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most shadows a replay takes (as `record --shadow`), so the most shadow results beside one.
pub(crate) const MAX_SHADOWS: usize = 4;

/// Shadow `k`'s (1-based) result file beside the target's: `base.json` → `base.shadow-1.json`.
pub(crate) fn shadow_result_path(primary: &Path, k: usize) -> PathBuf {
    beside(primary, &format!("shadow-{k}"))
}

/// The control's result file beside the target's: `base.json` → `base.control.json`.
pub(crate) fn control_result_path(primary: &Path) -> PathBuf {
    beside(primary, "control")
}

/// `primary` with `.tag` before its extension.
fn beside(primary: &Path, tag: &str) -> PathBuf {
    let stem = primary.file_stem().unwrap_or_default().to_string_lossy();
    let name = match primary.extension() {
        Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{tag}"),
    };
    primary.with_file_name(name)
}

/// Schema identifier written into every result.
pub(crate) const SCHEMA: &str = "retrace.replay/1";

/// Run facts that are not measurements (keys of the result as they are).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunInfo {
    pub date: String,
    pub trace: String,
    pub target: String,
    #[serde(rename = "model_id")]
    pub model: String,
    /// The API of the measured requests: `completions`, `chat` or `mixed` (ours; vLLM's
    /// `endpoint_type` is derived from it).
    pub endpoint: String,
    /// `--tokenizer`'s path (vLLM's `tokenizer_id`), null without one.
    pub tokenizer_id: Option<String>,
    /// vLLM's `--label`; retrace has none, so null as vLLM writes without one.
    pub label: Option<String>,
    #[serde(flatten)]
    pub traffic: Traffic,
    pub speed: f64,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub block_size: u32,
    pub prompt_mode: String,
    /// `--max-drift-ms`, when given.
    pub drift_limit_ms: Option<f64>,
    /// `--shard I/N`, when given (`retrace merge` refuses a repeated or foreign shard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    pub valid: bool,
    pub invalid_reason: Option<String>,
    pub inexact_prompts: u64,
}

/// vLLM's traffic keys: `request_rate` (a number, `"inf"`, or our `"trace"`: the trace's own
/// timing), `burstiness`, and with a ramp `ramp_up_strategy`, `ramp_up_start_rps`,
/// `ramp_up_end_rps`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Traffic {
    pub(crate) request_rate: Value,
    pub(crate) burstiness: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ramp_up_strategy: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ramp_up_start_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ramp_up_end_rps: Option<f64>,
}

impl Traffic {
    /// From `--request-rate`/`--burstiness`/`--ramp-up` (`None`: the trace's timing).
    pub fn of(arrivals: Option<&crate::trace::shape::Arrivals>) -> Traffic {
        use crate::trace::shape::Arrivals;
        let rate = |r: f64| {
            if r.is_finite() {
                json!(r)
            } else {
                json!("inf")
            }
        };
        let none = Traffic {
            request_rate: json!("trace"),
            burstiness: 1.0,
            ramp_up_strategy: None,
            ramp_up_start_rps: None,
            ramp_up_end_rps: None,
        };
        match arrivals {
            None => none,
            Some(Arrivals::Rate {
                rate: r,
                burstiness,
            }) => Traffic {
                request_rate: rate(*r),
                burstiness: *burstiness,
                ..none
            },
            Some(Arrivals::Ramp {
                exponential,
                start,
                end,
                burstiness,
            }) => Traffic {
                request_rate: json!("inf"),
                burstiness: *burstiness,
                ramp_up_strategy: Some(if *exponential {
                    "exponential"
                } else {
                    "linear"
                }),
                ramp_up_start_rps: Some(*start),
                ramp_up_end_rps: Some(*end),
            },
        }
    }

    /// The configured rate vLLM prints as `Request rate configured (RPS)` (finite rates only).
    pub(crate) fn configured_rate(&self) -> Option<f64> {
        self.request_rate.as_f64()
    }
}

/// vLLM's backend name for our API label (`endpoint_type` and `backend`).
pub(crate) fn vllm_backend(endpoint: &str) -> &str {
    match endpoint {
        "completions" => "openai",
        "chat" => "openai-chat",
        other => other,
    }
}

/// Writes `s` as vLLM's `mean_/median_/std_/pP_{name}_ms` keys; `extra` adds `min_`, `max_` and
/// `count_` (also used by `retrace merge`).
pub(crate) fn put_stats(m: &mut Map<String, Value>, name: &str, s: &Stats, extra: bool) {
    m.insert(format!("mean_{name}_ms"), json!(s.mean));
    m.insert(format!("median_{name}_ms"), json!(s.median));
    m.insert(format!("std_{name}_ms"), json!(s.std));
    for (p, v) in &s.percentiles {
        m.insert(format!("p{}_{name}_ms", percentile_label(*p)), json!(v));
    }
    if extra {
        m.insert(format!("min_{name}_ms"), json!(s.min));
        m.insert(format!("max_{name}_ms"), json!(s.max));
        m.insert(format!("count_{name}"), json!(s.count));
    }
}

/// One replay's result, serialised once ([`ReplayResult::to_value`]); the keys are the module
/// docs' (serde_json sorts them).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReplayResult {
    pub(crate) schema: &'static str,
    pub(crate) retrace_version: &'static str,
    /// vLLM's backend name: `openai` (completions), `openai-chat`, or `mixed`.
    pub(crate) backend: String,
    /// The same as `backend`, as vLLM writes it.
    pub(crate) endpoint_type: String,
    pub(crate) num_prompts: usize,
    #[serde(flatten)]
    pub(crate) info: RunInfo,
    pub(crate) duration: f64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) total_input_tokens: u64,
    pub(crate) total_output_tokens: u64,
    pub(crate) request_throughput: f64,
    pub(crate) request_goodput: Option<f64>,
    pub(crate) output_throughput: f64,
    pub(crate) total_token_throughput: f64,
    pub(crate) max_concurrent_requests: u64,
    pub(crate) max_output_tokens_per_s: f64,
    /// vLLM's inverse real-time factor of audio input: 0 (no audio).
    pub(crate) rtfx: f64,
    /// Ours: peak requests in flight at one instant.
    pub(crate) peak_in_flight: u64,
    /// The statistics families (`mean_ttft_ms`, `p99_drift_ms`, `count_client_queue`, ...).
    #[serde(flatten)]
    pub(crate) stats: Map<String, Value>,
    pub(crate) errors_by_kind: BTreeMap<String, u64>,
    pub(crate) server_reported: u64,
    /// Per-request prefix-cache hits the server reported (llama.cpp `timings.cache_n`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_prefix_cache: Option<Value>,
    pub(crate) histograms: BTreeMap<String, String>,
    /// `--detailed`: the per-request arrays inline ([`arrays`]) ...
    #[serde(flatten)]
    pub(crate) detailed: Option<Map<String, Value>>,
    /// ... or the name of the sidecar file holding them (beside the result file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) requests_file: Option<String>,
    /// ITL statistics from the histogram: the run had more ITL values than it keeps exactly.
    pub(crate) itl_from_histogram: bool,
    /// Every statistic from running aggregates: the run measured more requests than it keeps.
    pub(crate) scalars_from_histogram: bool,
    /// `--sessions`: replay's session report (`SessionReport::to_json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sessions: Option<Value>,
    /// `--scrape-metrics`'s summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_metrics: Option<Value>,
    /// `--probe-request-rate`'s summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) probes: Option<Value>,
    /// How the run was measured (a real replay always has it).
    #[serde(flatten)]
    pub(crate) run: Option<RunExtras>,
    /// What was sent of a recording (a real replay always has it).
    #[serde(flatten)]
    pub(crate) selected: Option<SentOfRecording>,
}

/// One measured request's element of every per-request array (`--detailed`), under the array's
/// name: the result's arrays are these rows by schedule index (inline), or the lines of its
/// sidecar file ([`crate::result::sidecar`]).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RequestRow {
    pub(crate) input_lens: u64,
    pub(crate) output_lens: u64,
    /// 0 when none.
    pub(crate) ttfts: f64,
    pub(crate) itls: Vec<f64>,
    /// E2EL, 0 when none.
    pub(crate) latencies: f64,
    /// Actual send, from t0.
    pub(crate) start_times: f64,
    /// vLLM's: actual send − intended send (slot wait and send drift together).
    pub(crate) queue_times: f64,
    /// "" on success, else `kind: detail`.
    pub(crate) errors: String,
    pub(crate) server_queue_times: Option<f64>,
    pub(crate) server_ttfts: Option<f64>,
    /// The prompt's length as the server counted it (`usage.prompt_tokens`), null where unknown.
    pub(crate) server_input_lens: Option<u64>,
    /// Prompt tokens the server took from its cache (the array exists when some request
    /// reported them, null elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_cached_tokens: Option<u64>,
    pub(crate) intended_times: f64,
    pub(crate) drifts: f64,
    pub(crate) client_queue_times: f64,
    /// A recorded trace's: the request's recorded failure, null when it succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) recorded_errors: Option<Option<String>>,
    /// `true` for a request answered whole, not streamed (null elsewhere; the array is written
    /// only when there was one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) non_streamed: Option<bool>,
}

impl RequestRow {
    /// `recorded`: the recorded failure, for a recorded trace.
    pub(crate) fn of(x: &Sample, recorded: Option<Option<String>>) -> RequestRow {
        let opt_s = |v: Option<u64>| v.map_or(0.0, ns_to_s);
        RequestRow {
            input_lens: x.input_tokens,
            output_lens: x.output_tokens,
            ttfts: opt_s(x.ttft_ns),
            itls: x.itls_ns.iter().map(|&n| ns_to_s(n)).collect(),
            latencies: opt_s(x.e2el_ns),
            start_times: ns_to_s(x.sent_ns),
            queue_times: ns_to_s(x.sent_ns.max(x.dispatched_ns).saturating_sub(x.intended_ns)),
            errors: match (&x.error, &x.error_detail) {
                (None, _) if x.ok() => String::new(),
                (None, _) => Failure::NoContent.to_string(),
                (Some(k), Some(d)) => format!("{k}: {d}"),
                (Some(k), None) => k.to_string(),
            },
            server_queue_times: x.server.queue_ms.map(|v| v / 1000.0),
            server_ttfts: x.server.ttft_ms.map(|v| v / 1000.0),
            server_input_lens: x.server.prompt_tokens,
            server_cached_tokens: x.server.cached_tokens,
            intended_times: ns_to_s(x.intended_ns),
            drifts: x.scalars.drift_ns() as f64 / 1e9,
            client_queue_times: ns_to_s(x.slot_wait_ns),
            recorded_errors: recorded,
            non_streamed: x.non_streamed.then_some(true),
        }
    }
}

/// `rows` (by schedule index) as the result's index-aligned arrays.
pub(crate) fn arrays(rows: impl IntoIterator<Item = RequestRow>) -> Map<String, Value> {
    let rows: Vec<RequestRow> = rows.into_iter().collect();
    let mut cols = crate::result::sidecar::Columns::new(rows.len());
    for (i, r) in rows.into_iter().enumerate() {
        if let Ok(Value::Object(m)) = serde_json::to_value(r) {
            cols.put(i, m);
        }
    }
    cols.into_map()
}

impl ReplayResult {
    /// The result of a run of `num_prompts` measured requests, without per-request arrays.
    pub(crate) fn new(
        info: &RunInfo,
        sum: &Summary,
        hist: &Histograms,
        num_prompts: usize,
    ) -> ReplayResult {
        let mut stats = Map::new();
        for (name, s) in [
            ("ttft", &sum.ttft),
            ("tpot", &sum.tpot),
            ("itl", &sum.itl),
            ("e2el", &sum.e2el),
        ] {
            put_stats(&mut stats, name, s, false);
        }
        for (name, s) in [
            ("ttft_from_intended", &sum.ttft_from_intended),
            ("e2el_from_intended", &sum.e2el_from_intended),
            ("drift", &sum.drift),
            ("client_queue", &sum.client_queue),
            ("server_queue", &sum.server_queue),
            ("server_ttft", &sum.server_ttft),
            ("unattributed", &sum.unattributed),
        ] {
            put_stats(&mut stats, name, s, true);
        }
        if sum.non_streamed > 0 {
            put_stats(
                &mut stats,
                "non_streamed_e2el",
                &sum.non_streamed_e2el,
                true,
            );
        }
        let backend = vllm_backend(&info.endpoint).to_string();
        ReplayResult {
            schema: SCHEMA,
            retrace_version: env!("CARGO_PKG_VERSION"),
            endpoint_type: backend.clone(),
            backend,
            num_prompts,
            info: info.clone(),
            duration: sum.duration_s,
            completed: sum.completed,
            failed: sum.failed,
            total_input_tokens: sum.total_input_tokens,
            total_output_tokens: sum.total_output_tokens,
            request_throughput: sum.request_throughput,
            request_goodput: sum.request_goodput,
            output_throughput: sum.output_throughput,
            total_token_throughput: sum.total_token_throughput,
            max_concurrent_requests: sum.max_concurrent_requests,
            max_output_tokens_per_s: sum.max_output_tokens_per_s,
            rtfx: 0.0,
            peak_in_flight: sum.peak_in_flight,
            stats,
            errors_by_kind: sum.errors.clone(),
            server_reported: sum.server_reported,
            server_prefix_cache: sum.server_cache.map(|c| {
                json!({"requests": c.requests, "cached_tokens": c.cached_tokens,
                    "prompt_tokens": c.prompt_tokens, "hit_rate": c.hit_rate()})
            }),
            histograms: hist.encode(),
            detailed: None,
            requests_file: None,
            itl_from_histogram: sum.itl_from_histogram,
            scalars_from_histogram: sum.scalars_from_histogram,
            sessions: None,
            server_metrics: None,
            probes: None,
            run: None,
            selected: None,
        }
    }

    /// The result as one JSON object (with vLLM's `probe_*` keys when probes completed).
    pub(crate) fn to_value(&self) -> Value {
        let mut v =
            serde_json::to_value(self).unwrap_or_else(|e| json!({ "error": e.to_string() }));
        if let (Some(m), Some(p)) = (v.as_object_mut(), &self.probes) {
            m.extend(vllm_probe_keys(p));
        }
        v
    }
}

/// vLLM's `probe_completed`, `probe_failed`, `probe_{median,p99,max}_e2el_ms` from our `probes`
/// summary; none when no probe completed (as vLLM).
pub(crate) fn vllm_probe_keys(p: &Value) -> Map<String, Value> {
    let mut m = Map::new();
    if p["completed"].as_u64().unwrap_or(0) == 0 {
        return m;
    }
    m.insert("probe_completed".into(), p["completed"].clone());
    m.insert("probe_failed".into(), p["failed"].clone());
    for (k, s) in [
        ("median", "median_ms"),
        ("p99", "p99_ms"),
        ("max", "max_ms"),
    ] {
        m.insert(format!("probe_{k}_e2el_ms"), p["e2el"][s].clone());
    }
    m
}

/// The result of `samples` (all of them measured) as JSON; `detailed` adds the arrays inline.
pub fn build(
    info: &RunInfo,
    sum: &Summary,
    hist: &Histograms,
    samples: &[Sample],
    detailed: bool,
) -> Value {
    let mut r = ReplayResult::new(info, sum, hist, samples.len());
    r.detailed = detailed.then(|| arrays(samples.iter().map(|s| RequestRow::of(s, None))));
    r.to_value()
}

/// How the run was measured and what ran beside it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunExtras {
    /// `--start-at`, as displayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) start_at: Option<String>,
    /// `kernel` or `read` (see [`crate::replay::http::pool::Pool::rx_stamp`]).
    pub(crate) rx_stamp: &'static str,
    /// Reader threads and their batch window; null when bodies were read on the tasks.
    pub(crate) body_readers: Option<BodyReaders>,
    pub(crate) client_cpu: ClientCpu,
    pub(crate) body_builder: BodyBuilder,
}

/// The body builder ([`crate::replay::plan::body`]): its window and whether it kept ahead.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct BodyBuilder {
    pub(crate) lead_s: f64,
    pub(crate) window_mib: f64,
    /// Bodies ready only after their deadline.
    pub(crate) late: u64,
    /// Least time from a body being ready to its deadline, during the run (null: all were
    /// built before the clock started).
    pub(crate) min_lead_ms: Option<f64>,
    /// Most body bytes alive at once (built and not yet freed, in flight included).
    pub(crate) peak_bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct BodyReaders {
    pub(crate) threads: usize,
    pub(crate) batch_us: u64,
}

/// The replayer's CPU time before the clock and during the run, seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ClientCpu {
    pub(crate) setup_s: f64,
    pub(crate) run_s: f64,
    /// The embedded mock ran in this process (its CPU is in the figures).
    pub(crate) embedded_target: bool,
}

/// What the replay sent of a recording, and how it compares with the recording.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SentOfRecording {
    /// `--include-aux`, `--skip-recorded-failures`.
    pub(crate) selection: Value,
    /// Requests left out, by reason.
    pub(crate) left_out: Value,
    /// `METHOD path` → requests sent.
    pub(crate) requests_by_endpoint: BTreeMap<String, u64>,
    /// Side requests sent (`--include-aux`): `{sent, ok, errors}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) auxiliary: Option<Value>,
    /// Recorded against replayed outcomes (recorded traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) recorded_outcomes: Option<Value>,
    /// Requests cut where the client cancelled them in the recording (recorded traces):
    /// `{count, rule}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cancelled_as_recorded: Option<Value>,
    /// The workload left out: `{left_out, workload, share, malformed_rows, limit}`.
    pub(crate) left_out_workload: Value,
    /// Text prompts made by the target's `/tokenize` and `/detokenize`, when used:
    /// `{prompts, exact, calls, failed_calls, gave_up, first_error}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_text: Option<Value>,
    /// How `--tokenizer`'s text prompts were fitted to the target (its template overhead), or
    /// why not (the tokenizer does not match the target's), when text prompts were synthesised.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tokenizer_fit: Option<String>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use crate::metrics::{summarize, Scalars, ServerTimes};

    #[test]
    fn shadow_results_sit_beside_the_targets() {
        let p = Path::new("out/base.json");
        assert_eq!(
            shadow_result_path(p, 1),
            Path::new("out/base.shadow-1.json")
        );
        assert_eq!(
            shadow_result_path(Path::new("r"), 2),
            Path::new("r.shadow-2")
        );
        assert_eq!(control_result_path(p), Path::new("out/base.control.json"));
        assert_eq!(control_result_path(Path::new("r")), Path::new("r.control"));
    }

    const MS: u64 = 1_000_000;

    pub(crate) fn samples() -> Vec<Sample> {
        vec![
            Sample {
                scalars: Scalars {
                    input_tokens: 100,
                    output_tokens: 3,
                    intended_ns: 0,
                    dispatched_ns: 10_000,
                    slot_wait_ns: 10_000,
                    sent_ns: 20_000,
                    ttft_ns: Some(50 * MS),
                    e2el_ns: Some(70 * MS),
                    end_ns: 70 * MS + 20_000,
                    server: ServerTimes {
                        queue_ms: Some(1.0),
                        ttft_ms: Some(40.0),
                        prompt_tokens: None,
                        cached_tokens: None,
                    },
                    ..Default::default()
                },
                itls_ns: vec![10 * MS, 10 * MS],
                ..Default::default()
            },
            Sample {
                scalars: Scalars {
                    input_tokens: 200,
                    intended_ns: 5 * MS,
                    dispatched_ns: 5 * MS,
                    sent_ns: 5 * MS,
                    end_ns: 6 * MS,
                    error: Some(crate::metrics::Failure::Http(500)),
                    ..Default::default()
                },
                error_detail: Some("boom".into()),
                ..Default::default()
            },
        ]
    }

    /// A fixed run description for tests (also used by `result::merge`'s tests).
    pub(crate) fn info() -> RunInfo {
        RunInfo {
            date: "20260101-000000".into(),
            trace: "t.jsonl".into(),
            target: "http://127.0.0.1:1".into(),
            model: "m".into(),
            endpoint: "completions".into(),
            tokenizer_id: None,
            label: None,
            traffic: Traffic::of(None),
            speed: 1.0,
            max_concurrency: None,
            seed: 0,
            block_size: 512,
            prompt_mode: "token-ids".into(),
            drift_limit_ms: None,
            shard: None,
            valid: true,
            invalid_reason: None,
            inexact_prompts: 0,
        }
    }

    /// The schema contract: key names and value types. A change here is a format change: bump
    /// SCHEMA and update docs/result-format.md.
    #[test]
    fn schema_snapshot() {
        let s = samples();
        let sum = summarize(&s, 0.1, &[50.0, 99.0]);
        let h = Histograms::from_samples(&s);
        let mut v = build(&info(), &sum, &h, &s, true);
        // The optional sections (`--sessions`, `--scrape-metrics`) are part of the contract.
        let r = crate::replay::plan::turns::SessionReport {
            sessions: 2,
            turns: 5,
            dependent_turns: 3,
            released_after_failure: 1,
            drift: Stats::from_seconds(&[0.010, -0.002, 0.030], &[50.0, 99.0]),
        };
        v["sessions"] = r.to_json();
        let point = |t_s: f64, x: f64| crate::replay::scrape::Point {
            t_s,
            running: Some(x),
            waiting: Some(0.0),
            kv_usage: Some(x / 8.0),
            hits: Some(100.0 * x),
            queries: Some(1000.0 * x),
            prompt_tokens: Some(1000.0 * x),
            generation_tokens: None,
            ..Default::default()
        };
        let series = crate::replay::scrape::Series {
            url: "http://127.0.0.1:1/metrics".into(),
            points: vec![point(-0.02, 0.0), point(1.0, 2.0), point(1.5, 3.0)],
            before_ok: true,
            after_ok: true,
            family: Some(&crate::replay::scrape::FAMILIES[0]),
            ..Default::default()
        };
        let theory = crate::replay::scrape::Theory {
            hits: 320,
            queries: 3000,
            server_block_size: 16,
            lower_bound: false,
            hits_at: None,
        };
        v["server_metrics"] = crate::replay::scrape::summarize(&series, &theory);
        v["probes"] = crate::replay::probe::summarize(2.0, &s[..1], 0.5, &[50.0, 99.0]);
        let probe_keys = vllm_probe_keys(&v["probes"]);
        v.as_object_mut().unwrap().extend(probe_keys);
        // histograms are binary blobs: check they decode, snapshot only their names
        let hist = v["histograms"].as_object_mut().unwrap();
        for (_, b64) in hist.iter_mut() {
            assert!(Histograms::decode(b64.as_str().unwrap()).is_ok());
            *b64 = json!("<base64>");
        }
        insta::assert_json_snapshot!(v);
    }

    /// Every key of real `vllm bench serve --save-result --save-detailed` files (a timed trace;
    /// a random run with --max-concurrency, --goodput, three percentiles and probes) is in ours,
    /// with the same JSON type; `generated_texts` aside (no response text is kept).
    #[test]
    fn result_keys_are_a_superset_of_real_vllm_keys() {
        let s = samples();
        let percentiles = [50.0, 90.0, 99.0];
        let sum = summarize(&s, 0.1, &percentiles);
        let mut r = ReplayResult::new(&info(), &sum, &Histograms::from_samples(&s), s.len());
        r.detailed = Some(arrays(s.iter().map(|x| RequestRow::of(x, None))));
        r.probes = Some(crate::replay::probe::summarize(
            2.0,
            &s[..1],
            0.5,
            &[50.0, 99.0],
        ));
        let ours = r.to_value();
        let kind = |v: &Value| std::mem::discriminant(v);
        for real in [
            include_str!("../../fixtures/vllm/bench_serve_result_timed_trace.json"),
            include_str!("../../fixtures/vllm/bench_serve_result_random.json"),
        ] {
            let real: Value = serde_json::from_str(real).unwrap();
            let mut missing = Vec::new();
            for (k, v) in real.as_object().unwrap() {
                match ours.get(k) {
                    None => missing.push(k.as_str()),
                    // vLLM's own request_rate is a number or "inf"
                    Some(o) if !o.is_null() && !v.is_null() && k != "request_rate" => {
                        assert_eq!(kind(o), kind(v), "{k}: ours {o}, vLLM's {v}")
                    }
                    Some(_) => {}
                }
            }
            assert_eq!(missing, ["generated_texts"]);
        }
    }

    /// vLLM's names for the API, and its traffic keys from our shaping flags.
    #[test]
    fn backend_and_traffic_keys_follow_vllm() {
        use crate::trace::shape::Arrivals;
        assert_eq!(vllm_backend("completions"), "openai");
        assert_eq!(vllm_backend("chat"), "openai-chat");
        let t = Traffic::of(Some(&Arrivals::Rate {
            rate: 20.0,
            burstiness: 0.5,
        }));
        assert_eq!((t.request_rate.clone(), t.burstiness), (json!(20.0), 0.5));
        assert_eq!(t.configured_rate(), Some(20.0));
        let inf = Traffic::of(Some(&Arrivals::Rate {
            rate: f64::INFINITY,
            burstiness: 1.0,
        }));
        assert_eq!(
            (&inf.request_rate, inf.configured_rate()),
            (&json!("inf"), None)
        );
        let trace = Traffic::of(None);
        assert_eq!(
            (&trace.request_rate, trace.configured_rate()),
            (&json!("trace"), None)
        );
        let ramp = serde_json::to_value(Traffic::of(Some(&Arrivals::Ramp {
            exponential: false,
            start: 1.0,
            end: 5.0,
            burstiness: 1.0,
        })))
        .unwrap();
        assert_eq!(ramp["ramp_up_strategy"], "linear");
        assert_eq!(ramp["ramp_up_end_rps"], 5.0);
    }

    /// vLLM's `queue_times` is the whole delay from the intended send (slot wait + drift); ours,
    /// `client_queue_times`, the slot wait alone.
    #[test]
    fn queue_times_are_vllms_and_client_queue_times_ours() {
        let s = samples();
        let sum = summarize(&s, 0.1, &[99.0]);
        let v = build(&info(), &sum, &Histograms::from_samples(&s), &s, true);
        assert_eq!(v["queue_times"][0], 20e-6);
        assert_eq!(v["client_queue_times"][0], 10e-6);
    }

    #[test]
    fn vllm_keys_present_without_detail() {
        let s = samples();
        let sum = summarize(&s, 0.1, &[99.0]);
        let v = build(&info(), &sum, &Histograms::from_samples(&s), &s, false);
        for k in [
            "completed",
            "failed",
            "duration",
            "mean_ttft_ms",
            "median_ttft_ms",
            "std_ttft_ms",
            "p99_ttft_ms",
            "p99_itl_ms",
            "mean_tpot_ms",
            "mean_e2el_ms",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "max_concurrent_requests",
            "max_output_tokens_per_s",
            "burstiness",
            "rtfx",
            "tokenizer_id",
            "label",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert!(v.get("ttfts").is_none());
        assert_eq!(v["completed"], 1);
        assert_eq!(v["errors_by_kind"]["http_500"], 1);
    }
}
