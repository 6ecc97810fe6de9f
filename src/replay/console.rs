//! The replay's console report: vLLM's `Serving Benchmark Result` block, then retrace's sections.
//!
//! The first block reproduces `vllm bench serve`'s layout exactly (rows `{:<40} {:<10}`, section
//! rules centred in 50 columns, TTFT/TPOT/ITL with mean, median and each chosen percentile), so it
//! can be read side by side with vLLM's. The sections after it are ours: failures by kind (and the
//! first distinct error messages), latency
//! from the intended send time, send drift (and the dispatcher's part of it), client queue, and
//! the server-side TTFT breakdown (client TTFT = server queue + server TTFT + unattributed).
//! Renders to a `String`; printing is the caller's business.

use crate::metrics::{percentile_label, Stats, Summary};
use crate::replay::outcome::FirstError;
use crate::result::RunInfo;
use std::fmt::Write as _;

// vLLM's `{:<40} {:<10}` (and `{:<10.2f}`): the value padded to 10 columns, trailing spaces
// included.
fn vrow(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{:<40} {:<10}", label, value);
}

fn vrowf(out: &mut String, label: &str, value: f64) {
    let _ = writeln!(out, "{:<40} {:<10.2}", label, value);
}

// Our rows: vLLM's columns without the trailing padding.
fn row(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let line = format!("{:<40} {:<10}", label, value);
    let _ = writeln!(out, "{}", line.trim_end());
}

fn rowf(out: &mut String, label: &str, value: f64) {
    let line = format!("{:<40} {:<10.2}", label, value);
    let _ = writeln!(out, "{}", line.trim_end());
}

fn rule(out: &mut String, title: &str, fill: char) {
    let _ = writeln!(out, "{}", center(title, fill));
}

fn center(title: &str, fill: char) -> String {
    let n = title.chars().count();
    if n >= 50 {
        return title.to_string();
    }
    let pad = 50 - n;
    let left = pad / 2;
    let f = fill.to_string();
    format!("{}{}{}", f.repeat(left), title, f.repeat(pad - left))
}

fn metric(out: &mut String, title: &str, short: &str, s: &Stats) {
    rule(out, title, '-');
    vrowf(out, &format!("Mean {short} (ms):"), s.mean);
    vrowf(out, &format!("Median {short} (ms):"), s.median);
    for (p, v) in &s.percentiles {
        vrowf(out, &format!("P{} {short} (ms):", percentile_label(*p)), *v);
    }
}

/// vLLM's block, byte for byte in `vllm bench serve` 0.32's layout and row order (default
/// `--percentile-metrics`: TTFT, TPOT, ITL); `probes`: the result's `probes` summary.
pub(crate) fn vllm_block(
    sum: &Summary,
    info: &RunInfo,
    probes: Option<&serde_json::Value>,
) -> String {
    let mut out = String::new();
    rule(&mut out, " Serving Benchmark Result ", '=');
    vrow(&mut out, "Successful requests:", sum.completed);
    vrow(&mut out, "Failed requests:", sum.failed);
    if let Some(c) = info.max_concurrency {
        vrow(&mut out, "Maximum request concurrency:", c);
    }
    if let Some(r) = info.traffic.configured_rate() {
        vrowf(&mut out, "Request rate configured (RPS):", r);
    }
    vrowf(&mut out, "Benchmark duration (s):", sum.duration_s);
    vrow(&mut out, "Total input tokens:", sum.total_input_tokens);
    vrow(&mut out, "Total generated tokens:", sum.total_output_tokens);
    let rows = [
        ("Request throughput (req/s):", Some(sum.request_throughput)),
        ("Request goodput (req/s):", sum.request_goodput),
        (
            "Output token throughput (tok/s):",
            Some(sum.output_throughput),
        ),
        (
            "Peak output token throughput (tok/s):",
            Some(sum.max_output_tokens_per_s),
        ),
        (
            "Peak concurrent requests:",
            Some(sum.max_concurrent_requests as f64),
        ),
        (
            "Total token throughput (tok/s):",
            Some(sum.total_token_throughput),
        ),
    ];
    for (label, v) in rows {
        if let Some(v) = v {
            vrowf(&mut out, label, v);
        }
    }
    if let Some(p) = probes {
        vllm_probe_rows(&mut out, p);
    }
    metric(&mut out, "Time to First Token", "TTFT", &sum.ttft);
    metric(
        &mut out,
        "Time per Output Token (excl. 1st token)",
        "TPOT",
        &sum.tpot,
    );
    metric(&mut out, "Inter-token Latency", "ITL", &sum.itl);
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

/// vLLM's `Probe Requests` rows (only when a probe completed, as vLLM).
fn vllm_probe_rows(out: &mut String, p: &serde_json::Value) {
    let keys = crate::result::vllm_probe_keys(p);
    let count = |k: &str| keys.get(k).and_then(serde_json::Value::as_u64);
    let Some(done) = count("probe_completed") else {
        return;
    };
    rule(out, "Probe Requests", '-');
    vrow(out, "Probe requests completed:", done);
    vrow(
        out,
        "Probe requests failed:",
        count("probe_failed").unwrap_or(0),
    );
    for (label, k) in [
        ("Median probe E2EL (ms):", "probe_median_e2el_ms"),
        ("P99 probe E2EL (ms):", "probe_p99_e2el_ms"),
        ("Max probe E2EL (ms):", "probe_max_e2el_ms"),
    ] {
        vrowf(out, label, keys[k].as_f64().unwrap_or(0.0));
    }
}

fn brief(out: &mut String, label: &str, s: &Stats) {
    brief_line(out, label, [s.mean, s.median, s.max], s.percentile(99.0));
}

/// `label  mean M median M[ p99 P] max M`, ms.
fn brief_line(out: &mut String, label: &str, [mean, median, max]: [f64; 3], p99: Option<f64>) {
    let p99 = p99.map_or(String::new(), |v| format!(" p99 {v:.3}"));
    let _ = writeln!(
        out,
        "{label:<40} mean {mean:.3} median {median:.3}{p99} max {max:.3}"
    );
}

/// The `--sessions` section: turn ordering and drift from the recorded arrivals.
pub(crate) fn sessions_section(r: &crate::replay::plan::turns::SessionReport) -> String {
    let mut out = String::new();
    rule(&mut out, "Session ordering (--sessions)", '-');
    row(&mut out, "Sessions:", r.sessions);
    row(&mut out, "Turns:", r.turns);
    row(
        &mut out,
        "Turns released by their predecessor:",
        r.dependent_turns,
    );
    row(
        &mut out,
        "  after a failed predecessor:",
        r.released_after_failure,
    );
    if r.dependent_turns > 0 {
        brief(&mut out, "Drift from recorded arrival (ms):", &r.drift);
    }
    out
}

/// The `--scrape-metrics` section, from the result's `server_metrics` object.
pub(crate) fn server_metrics_section(v: &serde_json::Value) -> String {
    let mut out = String::new();
    rule(&mut out, "Server metrics (--scrape-metrics)", '-');
    let num = |x: &serde_json::Value| x.as_f64();
    let or_na =
        |x: Option<f64>, prec: usize| x.map_or("n/a".to_string(), |x| format!("{x:.prec$}"));
    row(
        &mut out,
        "Scrapes (failed):",
        format!("{} ({})", v["scrapes"], v["failed_scrapes"]),
    );
    if let Some(e) = v["last_error"].as_str() {
        row(&mut out, "  last error:", e);
    }
    match (v["family"].as_str(), v["seen_names"].as_array()) {
        (Some(f), _) => row(&mut out, "Server metrics family:", f),
        (None, Some(seen)) if !seen.is_empty() => {
            let seen: Vec<&str> = seen.iter().filter_map(|x| x.as_str()).collect();
            row(&mut out, "Server metrics family:", "none known");
            let _ = writeln!(
                out,
                "  (no vLLM, SGLang or llama.cpp names, so every server figure is n/a; saw {})",
                seen.join(", ")
            );
        }
        _ => {}
    }
    let unexposed = |k: &str| {
        v["unexposed"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == k))
    };
    let pc = &v["prefix_cache"];
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{:.2} %", x * 100.0));
    row(
        &mut out,
        "Prefix cache hit rate, achieved:",
        format!(
            "{} ({} / {} tokens)",
            pct(num(&pc["hit_rate"])),
            or_na(num(&pc["hits"]), 0),
            or_na(num(&pc["queries"]), 0)
        ),
    );
    row(
        &mut out,
        &format!(
            "  theoretical (block {}):",
            pc["server_block_size"].as_u64().unwrap_or(0)
        ),
        format!(
            "{} ({} / {} tokens)",
            pct(num(&pc["theoretical_hit_rate"])),
            pc["theoretical_hits"],
            pc["theoretical_queries"]
        ),
    );
    if let (Some(a), Some(t)) = (num(&pc["hit_rate"]), num(&pc["theoretical_hit_rate"])) {
        if a > t + 1e-9 {
            let _ = writeln!(
                out,
                "  (above theoretical: a cache warm from an earlier run, other traffic on the server, or failed requests, which theory counts)"
            );
        } else if a + 1e-9 < t {
            let _ = writeln!(
                out,
                "  (below theoretical: eviction, concurrent prefills, failed requests, or another block size)"
            );
        }
    }
    row(
        &mut out,
        "Peak running / waiting requests:",
        format!(
            "{} / {}",
            or_na(num(&v["peak_running"]), 0),
            or_na(num(&v["peak_waiting"]), 0)
        ),
    );
    let kv = match unexposed("kv_cache_usage") {
        true => "n/a (not exposed)".to_string(),
        false => pct(num(&v["peak_kv_cache_usage"])),
    };
    row(&mut out, "Peak KV-cache usage:", kv);
    if let Some(t) = num(&v["mean_server_ttft_ms"]) {
        row(
            &mut out,
            "Mean TTFT, server histogram (ms):",
            format!("{t:.2}"),
        );
    }
    out
}

/// The `--probe-request-rate` section, from the result's `probes` object.
pub(crate) fn probes_section(v: &serde_json::Value) -> String {
    let mut out = String::new();
    rule(&mut out, "Probe requests (--probe-request-rate)", '-');
    row(
        &mut out,
        "Probes sent / completed / failed:",
        format!("{} / {} / {}", v["sent"], v["completed"], v["failed"]),
    );
    for (label, key) in [("Probe TTFT (ms):", "ttft"), ("Probe E2EL (ms):", "e2el")] {
        let s = &v[key];
        let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
        let stats = [f("mean_ms"), f("median_ms"), f("max_ms")];
        brief_line(&mut out, label, stats, s["p99_ms"].as_f64());
    }
    out
}

/// Our instant peak, told apart from vLLM's per-second one printed above it.
fn peak_rows(out: &mut String, peak_in_flight: u64) {
    row(out, "Peak requests in flight (instant):", peak_in_flight);
    let _ = writeln!(
        out,
        "  (sent, not yet ended, at one instant, failures included; vLLM's \"Peak concurrent\n   requests\" above counts the successes active at any time in the busiest whole second)"
    );
}

/// Our sections, after vLLM's block; `first_errors`: the first distinct failure messages.
pub(crate) fn extra_sections(
    sum: &Summary,
    max_drift_ms: Option<f64>,
    first_errors: &[FirstError],
    bodies_late: u64,
) -> String {
    let mut out = String::new();
    rule(&mut out, " retrace: beyond vLLM ", '=');
    if !sum.errors.is_empty() {
        let _ = writeln!(out, "Failures by kind:");
    }
    for (kind, n) in &sum.errors {
        row(&mut out, &format!("  {kind}:"), n);
    }
    if sum.errors.contains_key("http_401") || sum.errors.contains_key("http_403") {
        let _ = writeln!(out, "  ({})", crate::replay::http::target::KEY_HINT);
    }
    if !first_errors.is_empty() {
        let _ = writeln!(out, "First error messages:");
    }
    for e in first_errors {
        let _ = writeln!(out, "  {} ({}): {}", e.kind, e.count, e.message);
    }
    peak_rows(&mut out, sum.peak_in_flight);
    if sum.scalars_from_histogram {
        let _ = writeln!(
            out,
            "Statistics above from running aggregates (percentiles to 3 significant digits): more than {} requests",
            crate::metrics::SCALAR_BOUND
        );
    } else if sum.itl_from_histogram {
        let _ = writeln!(
            out,
            "ITL above from the HdrHistogram (3 significant digits): more than {} ITL values",
            crate::metrics::ITL_BOUND
        );
    }
    rule(&mut out, "End-to-end Latency", '-');
    rowf(&mut out, "Mean E2EL (ms):", sum.e2el.mean);
    rowf(&mut out, "Median E2EL (ms):", sum.e2el.median);
    for (p, v) in &sum.e2el.percentiles {
        rowf(
            &mut out,
            &format!("P{} E2EL (ms):", percentile_label(*p)),
            *v,
        );
    }
    if sum.non_streamed > 0 {
        rule(&mut out, "Non-streamed (not in TTFT/TPOT/ITL/E2EL)", '-');
        row(&mut out, "Non-streamed requests:", sum.non_streamed);
        brief(&mut out, "E2EL (ms):", &sum.non_streamed_e2el);
    }
    rule(
        &mut out,
        "From intended send time (no coord. omission)",
        '-',
    );
    brief(&mut out, "TTFT (ms):", &sum.ttft_from_intended);
    brief(&mut out, "E2EL (ms):", &sum.e2el_from_intended);
    rule(&mut out, "Send drift (actual - intended)", '-');
    brief(&mut out, "Drift (ms):", &sum.drift);
    brief(&mut out, "  of which dispatcher (ms):", &sum.dispatch_drift);
    if bodies_late > 0 {
        row(&mut out, "Bodies built late (sent late):", bodies_late);
    }
    if let Some(d) = max_drift_ms {
        let p99 = sum.drift.percentile(99.0).unwrap_or(sum.drift.max);
        let verdict = if p99 <= d {
            "ok"
        } else {
            "EXCEEDED: run invalid"
        };
        row(&mut out, &format!("Limit p99 <= {d} ms:"), verdict);
    }
    rule(&mut out, "Client queue (waiting for a slot)", '-');
    brief(&mut out, "Client queue (ms):", &sum.client_queue);
    rule(&mut out, "Server-side TTFT breakdown", '-');
    if sum.server_reported == 0 {
        let _ = writeln!(
            out,
            "(the server sent no per-request metrics; vLLM: --enable-per-request-metrics; llama.cpp sends `timings`)"
        );
    } else {
        row(
            &mut out,
            "Requests with server metrics:",
            sum.server_reported,
        );
        rowf(&mut out, "Mean client TTFT (ms):", sum.ttft.mean);
        if sum.server_queue.count > 0 {
            rowf(
                &mut out,
                "  = mean server queue (ms):",
                sum.server_queue.mean,
            );
        } else {
            row(&mut out, "  = mean server queue (ms):", "n/a");
        }
        rowf(&mut out, "  + mean server TTFT (ms):", sum.server_ttft.mean);
        rowf(
            &mut out,
            "  + mean unattributed (ms):",
            sum.unattributed.mean,
        );
        if sum.server_queue.count == 0 {
            let _ = writeln!(
                out,
                "  (no queue time reported: a wait in the server's queue is in unattributed)"
            );
        }
    }
    if let Some(c) = sum.server_cache {
        row(
            &mut out,
            "Prompt tokens from server cache:",
            format!(
                "{} / {} ({:.2} %)",
                c.cached_tokens,
                c.prompt_tokens,
                c.hit_rate().unwrap_or(0.0) * 100.0
            ),
        );
    }
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

/// `--shadow`: each shadow's own report after the target's, then the sides side by side (mean
/// TTFT and E2EL, failures) and how to pair them request by request.
pub(crate) fn shadows(
    out: &crate::replay::Outcome,
    result_json: Option<&std::path::Path>,
) -> String {
    let mut s = String::new();
    if out.shadows.is_empty() {
        return s;
    }
    for side in &out.shadows {
        let _ = writeln!(s);
        rule(&mut s, &format!(" {}: {} ", side.name, side.url), '#');
        s.push_str(&side.outcome.report);
    }
    let _ = writeln!(s);
    rule(
        &mut s,
        " retrace: the sides, sent at the same instants ",
        '=',
    );
    let side = |s: &mut String, name: &str, m: &Summary| {
        let _ = writeln!(
            s,
            "{name:<24} mean TTFT {:>9.2} ms   mean E2EL {:>10.2} ms   failed {}",
            m.ttft.mean, m.e2el.mean, m.failed
        );
    };
    side(&mut s, "target", &out.summary);
    for sd in &out.shadows {
        side(&mut s, &sd.name, &sd.outcome.summary);
    }
    if let Some(p) = result_json {
        let _ = writeln!(
            s,
            "Paired per request: retrace compare --shadow {}",
            p.display()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{summarize, Sample};

    /// Our instant peak is labelled as such and told apart from vLLM's per-second peak.
    #[test]
    fn the_two_peaks_are_told_apart() {
        let mut sum = summarize(&[Sample::default()], 1.0, &[99.0]);
        sum.peak_in_flight = 7;
        let ours = extra_sections(&sum, None, &[], 0);
        let row = ours
            .lines()
            .find(|l| l.starts_with("Peak requests in flight (instant):"))
            .unwrap_or_else(|| panic!("{ours}"));
        assert!(row.ends_with(" 7"), "{row}");
        assert!(ours.contains("at one instant, failures included"), "{ours}");
        assert!(ours.contains("busiest whole second"), "{ours}");
    }

    /// A summary past the request bound says its statistics are from running aggregates.
    #[test]
    fn statistics_from_running_aggregates_are_named() {
        let mut sum = summarize(&[Sample::default()], 1.0, &[99.0]);
        let line = "Statistics above from running aggregates";
        assert!(!extra_sections(&sum, None, &[], 0).contains(line));
        sum.scalars_from_histogram = true;
        assert!(extra_sections(&sum, None, &[], 0).contains(line));
    }

    #[test]
    fn centred_rules_match_vllm() {
        assert_eq!(
            center(" Serving Benchmark Result ", '='),
            "============ Serving Benchmark Result ============"
        );
        assert_eq!(
            center("Time per Output Token (excl. 1st token)", '-'),
            "-----Time per Output Token (excl. 1st token)------"
        );
    }

    /// vLLM's own numbers of a real `vllm bench serve` run (its `--save-result` file), rendered
    /// by us, give that run's console block row by row, trailing padding included
    /// (fixtures/vllm/bench_serve_console_block.txt, tools/bench/vllm_console_fixture.sh).
    #[test]
    fn block_matches_real_vllm_block_row_by_row() {
        let real = include_str!("../../fixtures/vllm/bench_serve_console_block.txt");
        let v: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/vllm/bench_serve_result_random.json"
        ))
        .unwrap();
        let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}"));
        let u = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}"));
        let mut sum = summarize(&[Sample::default()], 0.0, &[50.0, 90.0, 99.0]);
        sum.completed = u("completed");
        sum.failed = u("failed");
        sum.duration_s = f("duration");
        sum.total_input_tokens = u("total_input_tokens");
        sum.total_output_tokens = u("total_output_tokens");
        sum.request_throughput = f("request_throughput");
        sum.request_goodput = v["request_goodput"].as_f64();
        sum.output_throughput = f("output_throughput");
        sum.total_token_throughput = f("total_token_throughput");
        sum.max_output_tokens_per_s = f("max_output_tokens_per_s");
        sum.max_concurrent_requests = u("max_concurrent_requests");
        let st = |m: &str| Stats {
            count: 1,
            mean: f(&format!("mean_{m}_ms")),
            median: f(&format!("median_{m}_ms")),
            std: 0.0,
            min: 0.0,
            max: 0.0,
            percentiles: [50.0, 90.0, 99.0]
                .map(|p| (p, f(&format!("p{p}_{m}_ms"))))
                .to_vec(),
        };
        (sum.ttft, sum.tpot, sum.itl) = (st("ttft"), st("tpot"), st("itl"));
        let mut info = crate::result::tests::info();
        info.max_concurrency = Some(u("max_concurrency") as usize);
        info.traffic.request_rate = v["request_rate"].clone();
        let probes = serde_json::json!({
            "completed": v["probe_completed"], "failed": v["probe_failed"],
            "e2el": {"median_ms": v["probe_median_e2el_ms"], "p99_ms": v["probe_p99_e2el_ms"],
                     "max_ms": v["probe_max_e2el_ms"]},
        });
        let ours = vllm_block(&sum, &info, Some(&probes));
        let (ours, real): (Vec<&str>, Vec<&str>) = (ours.lines().collect(), real.lines().collect());
        for (i, (o, r)) in ours.iter().zip(&real).enumerate() {
            assert_eq!(o, r, "row {i}");
        }
        assert_eq!(ours.len(), real.len(), "rows");
    }
}
