//! What the report page says first, and its tables of figures: the verdict (valid or not, and
//! why, as the replay's console decides), the headline cards, the percentile table (with std, at
//! the percentiles `report --percentiles` chose), latency from the intended send time and send
//! drift, and human labels for the result file's raw keys. Everything from the loaded
//! [`Run`]; nothing is read from files here.

use super::load::{Metric, Requests, Run};
use super::render::num;
use super::weighted::Weighted;
use crate::metrics::percentile_label;
use serde_json::{json, Value};

/// `report --percentiles` when not given.
pub(crate) const DEFAULT_PERCENTILES: [f64; 5] = [50.0, 90.0, 95.0, 99.0, 99.9];
/// Most percentiles a report shows (the flag's budget).
pub(crate) const MAX_PERCENTILES: usize = 12;

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A distribution's figures: count, mean, population std, the chosen percentiles, max.
struct Figures {
    n: Option<f64>,
    mean: f64,
    std: Option<f64>,
    pcts: Vec<Option<f64>>,
    max: Option<f64>,
}

impl Figures {
    fn of(w: &Weighted, ps: &[f64]) -> Figures {
        let n = w.n() as f64;
        let mean = w
            .values
            .iter()
            .zip(&w.counts)
            .map(|(v, c)| v * *c as f64)
            .sum::<f64>()
            / n;
        let var = w
            .values
            .iter()
            .zip(&w.counts)
            .map(|(v, c)| (v - mean).powi(2) * *c as f64)
            .sum::<f64>()
            / n;
        Figures {
            n: Some(n),
            mean,
            std: Some(var.sqrt()),
            pcts: ps.iter().map(|&p| Some(w.percentile(p))).collect(),
            max: Some(w.percentile(100.0)),
        }
    }

    /// From the file's own statistics of `key` (`mean_ttft_ms`, `p99_ttft_ms`, ...): the
    /// percentiles it does not hold are unknown.
    fn of_file(run: &Run, key: &str, ps: &[f64]) -> Option<Figures> {
        let k = |s: &str| run.scalar(&format!("{s}_{key}_ms"));
        let pct = |p: f64| match p {
            50.0 => k("median").or_else(|| k("p50")),
            _ => k(&format!("p{}", percentile_label(p))),
        };
        Some(Figures {
            n: run.scalar(&format!("count_{key}")),
            mean: k("mean")?,
            std: k("std"),
            pcts: ps.iter().map(|&p| pct(p)).collect(),
            max: k("max"),
        })
    }

    fn row(&self, label: String) -> Value {
        let mut row = vec![json!(label), json!(self.n), json!(r3(self.mean))];
        row.push(json!(self.std.map(r3)));
        row.extend(self.pcts.iter().map(|p| json!(p.map(r3))));
        row.push(json!(self.max.map(r3)));
        Value::Array(row)
    }
}

/// The table's head: `metric (ms)`, `n`, `mean`, `std`, `p50`, ..., `max`.
pub(crate) fn table_head(ps: &[f64]) -> Value {
    let mut head = vec![
        "metric (ms)".to_string(),
        "n".into(),
        "mean".into(),
        "std".into(),
    ];
    head.extend(ps.iter().map(|&p| format!("p{}", percentile_label(p))));
    head.push("max".into());
    json!(head)
}

/// The percentile table of the latency metrics and their CDFs.
pub(crate) fn percentile_table(
    run: &Run,
    ps: &[f64],
    cdf: impl Fn(&Weighted) -> Value,
) -> (Value, Value) {
    let mut rows = Vec::new();
    let mut cdfs = Vec::new();
    for m in Metric::ALL {
        let Some(w) = run.dist(m) else {
            // an aggregate (AIPerf's): its own statistics, no CDF
            rows.extend(Figures::of_file(run, m.key(), ps).map(|f| f.row(m.label().into())));
            continue;
        };
        let approx = run.samples_ms(m).is_none();
        let label = format!("{}{}", m.label(), if approx { " ~" } else { "" });
        rows.push(Figures::of(&w, ps).row(label));
        cdfs.push(json!({"key": m.key(), "label": m.label(), "pts": cdf(&w)}));
    }
    (Value::Array(rows), Value::Array(cdfs))
}

/// Latency from the intended send time and send drift, in ms, from per-request arrays: TTFT and
/// E2EL from intended (streamed requests that succeeded), drift = actual send − intended −
/// client queue (every request), as the replay's summary defines them.
fn intended_samples(q: &Requests) -> Option<[Vec<f64>; 3]> {
    let intended = q.intended_s.as_ref()?;
    let mut out: [Vec<f64>; 3] = Default::default();
    for (i, &at) in intended.iter().enumerate().take(q.len()) {
        let late = q.start_s[i] - at;
        let whole = q.non_streamed.get(i).copied().unwrap_or(false);
        if q.ok(i) && !whole {
            out[0].extend(q.ttft_s[i].map(|t| (t + late) * 1e3));
            out[1].extend(q.latency_s[i].map(|t| (t + late) * 1e3));
        }
        let queued = q.client_queue_s.get(i).copied().flatten().unwrap_or(0.0);
        out[2].push((late - queued) * 1e3);
    }
    Some(out)
}

const INTENDED: [(&str, &str); 3] = [
    ("ttft_from_intended", "TTFT from intended send"),
    ("e2el_from_intended", "E2EL from intended send"),
    ("drift", "send drift (actual - intended - client queue)"),
];

/// The rows of latency from the intended send time and send drift: exact from per-request
/// arrays, else the file's own statistics; empty for inputs that have neither.
pub(crate) fn intended_table(run: &Run, ps: &[f64]) -> Value {
    let samples = run.requests.as_ref().and_then(intended_samples);
    let rows = INTENDED.iter().enumerate().filter_map(|(k, (key, label))| {
        let f = match &samples {
            Some(s) if !s[k].is_empty() => Figures::of(&Weighted::from_samples(&s[k]), ps),
            _ => Figures::of_file(run, key, ps)?,
        };
        Some(f.row(label.to_string()))
    });
    Value::Array(rows.collect())
}

/// p99 send drift in ms: from per-request arrays, else the file's `p99_drift_ms`.
fn drift_p99(run: &Run) -> Option<f64> {
    let s = run.requests.as_ref().and_then(intended_samples);
    match s {
        Some(s) if !s[2].is_empty() => Some(Weighted::from_samples(&s[2]).percentile(99.0)),
        _ => run.scalar("p99_drift_ms"),
    }
}

/// A section's leaf (`server_metrics.prefix_cache.hit_rate`) as a number.
fn section_num(run: &Run, key: &str) -> Option<f64> {
    run.sections
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.as_f64())
}

/// The verdict line: `{state, text}`, `state` one of `valid`, `invalid`, `failed`, `unknown`.
/// A retrace result is invalid for the reasons its replay wrote (a signal, p99 send drift over
/// `--max-drift-ms`, more than 10% of the workload left out); failed when no request succeeded.
pub(crate) fn verdict(run: &Run) -> Value {
    let completed = run.scalar("completed").unwrap_or(0.0);
    let failed = run.scalar("failed").unwrap_or(0.0);
    let drift = drift_p99(run).map(|d| format!("p99 send drift {} ms", num(d)));
    let limit = run.scalar("drift_limit_ms");
    if run.kind != super::load::Kind::Retrace {
        let what = match run.kind {
            super::load::Kind::Trace => "a trace: it was not replayed, so it has no validity to judge",
            _ => "not a retrace result: it records no send drift or interruption to judge validity by",
        };
        return json!({"state": "unknown", "text": format!("Validity unknown: {what}.")});
    }
    if completed == 0.0 && failed > 0.0 {
        return json!({"state": "failed", "text": format!("Run failed: all {} requests failed.", num(failed))});
    }
    if let Some(why) = run.info.get("valid").filter(|v| *v == "false").map(|_| {
        run.info
            .get("invalid_reason")
            .cloned()
            .unwrap_or_else(|| "the result says so and gives no reason".into())
    }) {
        return json!({"state": "invalid", "text": format!("Run invalid: {why}.")});
    }
    if run.info.get("valid").map(String::as_str) != Some("true") {
        return json!({"state": "unknown", "text": "Validity unknown: the result does not say whether the run was valid."});
    }
    let mut why = vec!["not interrupted, at most 10% of the workload left out".to_string()];
    match (drift, limit) {
        (Some(d), Some(l)) => why.push(format!("{d} within --max-drift-ms {}", num(l))),
        (Some(d), None) => why.push(format!("{d} (no --max-drift-ms limit)")),
        _ => {}
    }
    if failed > 0.0 {
        why.push(format!(
            "{} of {} requests failed",
            num(failed),
            num(completed + failed)
        ));
    }
    json!({"state": "valid", "text": format!("Valid run: {}.", why.join("; "))})
}

/// p50 and p99 of a metric in ms: from its distribution, else the file's statistics.
fn p50_p99(run: &Run, m: Metric) -> Option<(f64, f64)> {
    if let Some(w) = run.dist(m) {
        return Some((w.percentile(50.0), w.percentile(99.0)));
    }
    let k = |s: &str| run.scalar(&format!("{s}_{}_ms", m.key()));
    Some((k("median")?, k("p99")?))
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The headline cards: `{id, label, value, sub}`, only those the input has figures for.
pub(crate) fn cards(run: &Run) -> Value {
    let mut out = Vec::new();
    let mut card = |id: &str, label: &str, value: String, sub: Option<String>| {
        out.push(json!({"id": id, "label": label, "value": value, "sub": sub}));
    };
    let (ok, failed) = (run.scalar("completed"), run.scalar("failed"));
    let total = run.total_requests();
    if let Some(ok) = ok {
        card(
            "ok",
            "requests ok",
            num(ok),
            total.map(|t| format!("of {}", num(t))),
        );
    }
    if let Some(f) = failed {
        let share = total
            .filter(|t| *t > 0.0)
            .map(|t| format!("{} of all", pct(f / t)));
        card("failed", "failed", num(f), share);
    }
    if let Some(r) = run.scalar("request_throughput") {
        let d = run.scalar("duration").map(|d| format!("over {} s", num(d)));
        card("req-s", "req/s", num(r), d);
    }
    if let Some(t) = run.scalar("output_throughput") {
        card("tok-s", "output tok/s", num(t), None);
    }
    for (m, id) in [
        (Metric::Ttft, "ttft"),
        (Metric::Itl, "itl"),
        (Metric::E2el, "e2el"),
    ] {
        if let Some((p50, p99)) = p50_p99(run, m) {
            let label = format!("{} p50 / p99 (ms)", m.label());
            card(id, &label, format!("{} / {}", num(p50), num(p99)), None);
        }
    }
    if let Some(g) = run.scalar("request_goodput") {
        card(
            "goodput",
            "goodput req/s",
            num(g),
            Some("meeting every --goodput SLO".into()),
        );
    }
    if let Some(d) = drift_p99(run) {
        let limit = run
            .scalar("drift_limit_ms")
            .map(|l| format!("limit {} ms", num(l)));
        card("drift", "send drift p99 (ms)", num(d), limit);
    }
    let hit = section_num(run, "server_metrics.prefix_cache.hit_rate");
    let theory = section_num(run, "server_metrics.prefix_cache.theoretical_hit_rate");
    if let Some(h) = hit {
        let sub = theory.map(|t| format!("theoretical {}", pct(t)));
        card("prefix-cache", "prefix-cache hit rate", pct(h), sub);
    }
    Value::Array(out)
}

/// Labels of the raw keys the report lists in its folded section.
const LABELS: [(&str, &str); 43] = [
    ("completed", "requests completed"),
    ("failed", "requests failed"),
    ("duration", "duration (s)"),
    ("request_throughput", "request throughput (req/s)"),
    ("output_throughput", "output throughput (tok/s)"),
    ("total_token_throughput", "total token throughput (tok/s)"),
    ("max_concurrent_requests", "max concurrent requests"),
    ("request_goodput", "request goodput (req/s)"),
    ("server_reported", "requests with server metrics"),
    ("model_id", "model"),
    ("target", "target"),
    ("trace", "trace"),
    ("date", "date (UTC)"),
    ("valid", "valid"),
    ("invalid_reason", "why invalid"),
    ("source", "source"),
    ("server_metrics.url", "scraped /metrics URL"),
    ("server_metrics.interval_s", "scrape interval (s)"),
    ("server_metrics.family", "server family"),
    ("server_metrics.scrapes", "scrapes"),
    ("server_metrics.failed_scrapes", "failed scrapes"),
    ("server_metrics.last_error", "last scrape error"),
    ("server_metrics.bad_lines", "exposition lines skipped"),
    ("server_metrics.before_ok", "scrape before the run ok"),
    ("server_metrics.after_ok", "scrape after the run ok"),
    (
        "server_metrics.prefix_cache.hits",
        "prefix-cache hits (tokens)",
    ),
    (
        "server_metrics.prefix_cache.queries",
        "prefix-cache queries (tokens)",
    ),
    (
        "server_metrics.prefix_cache.hit_rate",
        "prefix-cache hit rate, achieved",
    ),
    (
        "server_metrics.prefix_cache.server_block_size",
        "server KV block size (tokens)",
    ),
    (
        "server_metrics.prefix_cache.server_block_size_from",
        "server block size from",
    ),
    (
        "server_metrics.prefix_cache.theoretical_hits",
        "prefix-cache hits, theoretical (tokens)",
    ),
    (
        "server_metrics.prefix_cache.theoretical_queries",
        "prefix-cache queries, theoretical (tokens)",
    ),
    (
        "server_metrics.prefix_cache.theoretical_hit_rate",
        "prefix-cache hit rate, theoretical",
    ),
    (
        "server_metrics.prefix_cache.theoretical_lower_bound",
        "theoretical hits a lower bound",
    ),
    ("server_metrics.prompt_tokens", "server prompt tokens"),
    (
        "server_metrics.generation_tokens",
        "server generated tokens",
    ),
    (
        "server_metrics.peak_running",
        "server peak running requests",
    ),
    (
        "server_metrics.peak_waiting",
        "server peak waiting requests",
    ),
    (
        "server_metrics.peak_kv_cache_usage",
        "server peak KV-cache usage",
    ),
    (
        "server_metrics.mean_server_ttft_ms",
        "server mean TTFT (ms, its histogram)",
    ),
    ("sessions.sessions", "sessions"),
    ("sessions.turns", "session turns"),
    (
        "sessions.dependent_turns",
        "turns released by their predecessor",
    ),
];

/// A raw key's human label: the table's, else the key with its separators as spaces
/// (`probes.ttft.p99_ms` → `probes ttft p99 ms`).
pub(crate) fn human_label(key: &str) -> String {
    match LABELS.iter().find(|(k, _)| *k == key) {
        Some((_, l)) => l.to_string(),
        None => key.replace(['.', '_'], " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::tests::synth_run;

    fn card<'a>(cards: &'a Value, id: &str) -> Option<&'a Value> {
        cards.as_array().unwrap().iter().find(|c| c["id"] == id)
    }

    /// The std column is the population std; each chosen percentile gets its column.
    #[test]
    fn figures_have_population_std_and_the_chosen_percentiles() {
        let w = Weighted::from_samples(&[1.0, 2.0, 3.0, 4.0]);
        let f = Figures::of(&w, &[50.0, 99.9]);
        assert_eq!(f.mean, 2.5);
        assert!((f.std.unwrap() - 1.25f64.sqrt()).abs() < 1e-12);
        // numpy's linear interpolation: position 0.999 × 3 between 3 and 4
        assert_eq!(f.pcts[0], Some(2.5));
        assert!((f.pcts[1].unwrap() - 3.997).abs() < 1e-12, "{:?}", f.pcts);
        assert_eq!(table_head(&[50.0, 99.9])[5], "p99.9");
    }

    /// From intended = the latency plus how late the send was; drift takes the client queue off.
    #[test]
    fn intended_latency_and_drift_come_from_the_arrays() {
        let mut run = synth_run(2, 80.0, 1);
        let q = run.requests.as_mut().unwrap();
        q.start_s = vec![1.0, 2.0];
        q.intended_s = Some(vec![0.990, 2.0]);
        q.ttft_s = vec![Some(0.100), Some(0.200)];
        q.client_queue_s = vec![Some(0.004), None];
        let s = intended_samples(run.requests.as_ref().unwrap()).unwrap();
        let near = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
        assert!(near(&s[0], &[110.0, 200.0]), "{:?}", s[0]);
        assert!(near(&s[2], &[6.0, 0.0]), "{:?}", s[2]);
        let rows = intended_table(&run, &[50.0]);
        assert_eq!(rows.as_array().unwrap().len(), 3);
        assert_eq!(rows[2][0], "send drift (actual - intended - client queue)");
    }

    /// Without arrays, the file's own statistics: the percentiles it lacks are unknown.
    #[test]
    fn intended_rows_fall_back_on_the_files_statistics() {
        let mut run = synth_run(2, 80.0, 1);
        run.requests = None;
        for (k, v) in [
            ("mean_drift_ms", 0.2),
            ("std_drift_ms", 0.1),
            ("p99_drift_ms", 0.9),
        ] {
            run.scalars.insert(k.into(), v);
        }
        let rows = intended_table(&run, &[50.0, 99.0]);
        assert_eq!(
            rows,
            json!([[
                "send drift (actual - intended - client queue)",
                null,
                0.2,
                0.1,
                null,
                0.9,
                null
            ]])
        );
        assert_eq!(card(&cards(&run), "drift").unwrap()["value"], "0.9000");
    }

    #[test]
    fn verdict_says_why_a_run_is_invalid_or_valid() {
        let mut run = synth_run(10, 80.0, 1);
        run.kind = crate::report::load::Kind::Retrace;
        run.info.insert("valid".into(), "false".into());
        run.info.insert(
            "invalid_reason".into(),
            "p99 send drift 9.000 ms exceeds --max-drift-ms 5".into(),
        );
        let v = verdict(&run);
        assert_eq!(v["state"], "invalid");
        assert_eq!(
            v["text"],
            "Run invalid: p99 send drift 9.000 ms exceeds --max-drift-ms 5."
        );
        run.info.insert("valid".into(), "true".into());
        run.scalars.insert("drift_limit_ms".into(), 5.0);
        run.scalars.insert("p99_drift_ms".into(), 1.0);
        let v = verdict(&run);
        assert_eq!(v["state"], "valid");
        assert!(
            v["text"]
                .as_str()
                .unwrap()
                .contains("within --max-drift-ms 5"),
            "{v}"
        );
        run.scalars.insert("completed".into(), 0.0);
        run.scalars.insert("failed".into(), 10.0);
        assert_eq!(verdict(&run)["state"], "failed");
        run.kind = crate::report::load::Kind::Vllm;
        assert_eq!(verdict(&run)["state"], "unknown");
    }

    /// Goodput and the prefix-cache card appear only when the run has them.
    #[test]
    fn goodput_and_prefix_cache_cards_only_when_measured() {
        let mut run = synth_run(10, 80.0, 1);
        let c = cards(&run);
        assert!(card(&c, "goodput").is_none() && card(&c, "prefix-cache").is_none());
        assert!(card(&c, "ttft").unwrap()["label"]
            .as_str()
            .unwrap()
            .ends_with("(ms)"));
        run.scalars.insert("request_goodput".into(), 3.5);
        run.sections
            .push(("server_metrics.prefix_cache.hit_rate".into(), json!(0.0359)));
        run.sections.push((
            "server_metrics.prefix_cache.theoretical_hit_rate".into(),
            json!(0.0412),
        ));
        let c = cards(&run);
        assert_eq!(card(&c, "goodput").unwrap()["value"], "3.50");
        let p = card(&c, "prefix-cache").unwrap();
        assert_eq!(
            (&p["value"], &p["sub"]),
            (&json!("3.6%"), &json!("theoretical 4.1%"))
        );
    }

    #[test]
    fn raw_keys_get_human_labels() {
        assert_eq!(
            human_label("server_metrics.prefix_cache.hit_rate"),
            "prefix-cache hit rate, achieved"
        );
        assert_eq!(human_label("probes.ttft.p99_ms"), "probes ttft p99 ms");
    }
}
