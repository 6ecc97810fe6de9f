//! AIPerf 0.13 exports in `compare`, `report` and `merge`, through the real binary: the real
//! per-request and aggregate exports of one AIPerf run (fixtures/aiperf/), against each other,
//! against a retrace replay of the same trace, rendered in headless Chromium, merged, and the
//! errors for truncated or foreign files.

use crate::compare::{check_rendered, open_headless, shots_dir};
use crate::support::{self, OutputWithin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fx(name: &str) -> PathBuf {
    support::repo("fixtures/aiperf").join(name)
}

fn retrace(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(args)
        .output_within(support::CHILD_LIMIT)
        .unwrap()
}

fn p(s: &str) -> &Path {
    Path::new(s)
}

fn compare_json(base: &Path, cand: &Path) -> Value {
    let out = retrace(&[p("compare"), base, cand, p("--format"), p("json")]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn row<'a>(v: &'a Value, key: &str) -> &'a Value {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key}"))
}

fn notes(v: &Value) -> String {
    v["notes"].to_string()
}

#[test]
fn aiperf_aggregate_is_not_refused_as_missing_field_requests() {
    // was: `profile_export_aiperf.json:908: missing field 'requests' at line 908 column 1`
    let agg = fx("profile_export_aiperf.json");
    let recs = fx("profile_export.jsonl");
    let v = compare_json(&agg, &recs);
    assert_eq!(v["baseline"]["kind"], "AIPerf aggregate export");
    assert_eq!(v["candidate"]["kind"], "AIPerf per-request export");
    assert_eq!(v["baseline"]["requests"], 13.0);
    // the aggregate's own statistics against ours from the same run's records: equal
    for key in [
        "mean_ttft_ms",
        "p99_ttft_ms",
        "median_tpot_ms",
        "p90_itl_ms",
        "mean_e2el_ms",
    ] {
        let (b, c) = (
            row(&v, key)["baseline"].as_f64(),
            row(&v, key)["candidate"].as_f64(),
        );
        let (b, c) = (b.unwrap(), c.unwrap());
        assert!((b - c).abs() <= 1e-6 * b.abs(), "{key}: {b} vs {c}");
        // no samples on the aggregate's side: no interval, no verdict
        assert_eq!(row(&v, key)["verdict"], "unknown", "{key}");
    }
    // Throughputs: the aggregate's as AIPerf wrote them (its profiling span), the records'
    // over vLLM's duration (first send to last response): 0.5 % apart on this run.
    for key in ["request_throughput", "output_throughput"] {
        let (b, c) = (
            row(&v, key)["baseline"].as_f64().unwrap(),
            row(&v, key)["candidate"].as_f64().unwrap(),
        );
        assert!(b < c && (c - b) / b < 0.01, "{key}: {b} vs {c}");
    }
    assert_eq!(
        row(&v, "request_throughput")["baseline"],
        18.142682436600712
    );
    let n = notes(&v);
    assert!(
        n.contains("AIPerf aggregate export") && n.contains("no CDF, significance or paired"),
        "{n}"
    );
    assert!(v["paired"].is_null());
}

#[test]
fn compare_page_of_an_aggregate_says_no_data_instead_of_empty_charts() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("cmp.html");
    let (agg, recs) = (fx("profile_export_aiperf.json"), fx("profile_export.jsonl"));
    let out = retrace(&[p("compare"), &agg, &recs, p("--html"), &page]);
    assert_eq!(out.status.code(), Some(0));
    let doms = open_headless(&page, &shots_dir().join("compare-aiperf-aggregate.png"));
    check_rendered(&doms, &["table-compare"], &[]);
    let dom = doms.join("\n");
    if !dom.is_empty() {
        assert!(!dom.contains("id=\"chart-"), "a chart without data");
        assert!(dom.contains(">no data: a side has neither"), "no-data line");
    }
}

#[test]
fn compare_of_two_aiperf_per_request_exports_pairs_their_requests() {
    let recs = fx("profile_export.jsonl");
    let v = compare_json(&recs, &recs);
    assert_eq!(v["paired"]["n"], 13);
    assert_eq!(row(&v, "mean_ttft_ms")["abs_change"], 0.0);
    assert_eq!(row(&v, "failure_rate")["baseline"], 0.0);
    // the workload: AIPerf's lengths, as the server counted them
    assert_eq!(v["workload"]["baseline"]["requests"], 13);
}

#[test]
fn compare_of_an_aiperf_export_against_a_retrace_replay_of_its_trace() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("retrace.json");
    let trace = fx("mooncake_input.jsonl");
    let out = retrace(&[
        p("replay"),
        &trace,
        p("--result-json"),
        &result,
        p("--detailed"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = compare_json(&fx("profile_export.jsonl"), &result);
    assert_eq!(v["candidate"]["kind"], "retrace result");
    for key in [
        "mean_ttft_ms",
        "p99_itl_ms",
        "mean_tpot_ms",
        "median_e2el_ms",
    ] {
        assert!(row(&v, key)["baseline"].as_f64().unwrap() > 0.0, "{key}");
        assert!(row(&v, key)["candidate"].as_f64().unwrap() > 0.0, "{key}");
    }
    assert_eq!(v["workload"]["baseline"]["requests"], 13);
    assert_eq!(v["workload"]["candidate"]["requests"], 13);
    // paired only when both sent the same input lengths; AIPerf's are the server's count (one
    // token more than the trace's in the fixture), and the comparison then says why not
    match v["paired"]["n"].as_u64() {
        Some(n) => assert_eq!(n, 13),
        None => assert!(
            notes(&v).contains("did not replay the same requests"),
            "{}",
            notes(&v)
        ),
    }
    // against the aggregate: its statistics, no significance
    let v = compare_json(&result, &fx("profile_export_aiperf.json"));
    assert_eq!(row(&v, "p99_ttft_ms")["verdict"], "unknown");
    assert!(row(&v, "p99_ttft_ms")["candidate"].as_f64().unwrap() > 20.0);
    // the trace against AIPerf's replay of it: fidelity
    let v = compare_json(&trace, &fx("profile_export.jsonl"));
    assert_eq!(v["workload"]["fidelity"]["paired"], 13);
}

#[test]
fn report_of_aiperf_exports_renders_without_empty_charts() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("aiperf.html");
    let out = retrace(&[p("report"), &fx("profile_export.jsonl"), p("-o"), &html]);
    assert_eq!(out.status.code(), Some(0));
    let doms = open_headless(&html, &shots_dir().join("report-aiperf.png"));
    check_rendered(
        &doms,
        &[
            "table-percentiles",
            "chart-cdf-ttft",
            "chart-cdf-tpot",
            "chart-cdf-itl",
            "chart-cdf-e2el",
            "chart-timeline",
            "chart-throughput",
            "chart-isl",
            "chart-osl",
        ],
        &[],
    );
    let dom = doms.join("\n");
    if !dom.is_empty() {
        assert!(dom.contains("data-rows=\"13\""), "timeline rows");
        assert!(!dom.contains("class=\"no-data\""), "an empty chart");
        // no server figures in an AIPerf export: no breakdown drawn
        assert!(!dom.contains("id=\"chart-breakdown\""));
    }

    // the aggregate: its statistics in the table, no chart, and what is missing said
    let out = retrace(&[
        p("report"),
        &fx("profile_export_aiperf.json"),
        p("-o"),
        &html,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("aiperf.unavailable") && page.contains("no per-request"));
    let doms = open_headless(&html, &shots_dir().join("report-aiperf-aggregate.png"));
    check_rendered(&doms, &["table-summary", "table-percentiles"], &[]);
    let dom = doms.join("\n");
    if !dom.is_empty() {
        assert!(!dom.contains("id=\"chart-"), "a chart without data");
        assert!(!dom.contains("class=\"no-data\""));
        // the TTFT row: AIPerf's mean 21.46 ms
        assert!(dom.contains("21.46"), "TTFT row");
    }
}

#[test]
fn merge_of_aiperf_exports_and_its_refusal_of_aggregates() {
    let dir = tempfile::tempdir().unwrap();
    let all = std::fs::read_to_string(fx("profile_export.jsonl")).unwrap();
    let (mut a, mut b) = (String::new(), String::new());
    for (i, line) in all.lines().enumerate() {
        let half = if i < 5 { &mut a } else { &mut b };
        half.push_str(line);
        half.push('\n');
    }
    let (pa, pb, merged) = (
        dir.path().join("a.jsonl"),
        dir.path().join("b.jsonl"),
        dir.path().join("merged.jsonl"),
    );
    std::fs::write(&pa, a).unwrap();
    std::fs::write(&pb, b).unwrap();
    let out = retrace(&[p("merge"), &pa, &pb, p("-o"), &merged]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("13 records"));
    // the merged export is the whole run again
    let v = compare_json(&fx("profile_export.jsonl"), &merged);
    assert_eq!(v["paired"]["n"], 13);
    assert_eq!(row(&v, "mean_ttft_ms")["abs_change"], 0.0);

    // another file holding the same requests: refused by their ids
    let pa_copy = dir.path().join("a-copy.jsonl");
    std::fs::copy(&pa, &pa_copy).unwrap();
    for (inputs, want) in [
        (
            vec![pa.clone(), fx("profile_export_aiperf.json")],
            "per-request profile_export.jsonl files instead",
        ),
        (
            vec![pa.clone(), pa_copy.clone()],
            "each request counts once",
        ),
        (vec![pa.clone(), pa.clone()], "given twice"),
    ] {
        let mut args: Vec<&Path> = vec![p("merge")];
        args.extend(inputs.iter().map(PathBuf::as_path));
        args.extend([p("-o"), merged.as_path()]);
        let out = retrace(&args);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(inputs[1].to_str().unwrap()) && err.contains(want),
            "{err}"
        );
    }
}

#[test]
fn truncated_or_foreign_exports_are_input_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let recs = std::fs::read(fx("profile_export.jsonl")).unwrap();
    let agg = std::fs::read(fx("profile_export_aiperf.json")).unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "cut.jsonl",
            &recs[..recs.len() - 100],
            "line 13: truncated record",
        ),
        (
            "cut.json",
            &agg[..agg.len() - 100],
            "AIPerf aggregate export: truncated",
        ),
        (
            "foreign.json",
            br#"{"benchmark": "other", "results": [1, 2]}"#,
            "not a retrace result, a vllm bench serve result, an AIPerf export, or a trace",
        ),
    ];
    for (name, data, want) in cases {
        let f = dir.path().join(name);
        std::fs::write(&f, data).unwrap();
        for cmd in ["compare", "report"] {
            let out = match cmd {
                "compare" => retrace(&[p(cmd), &f, &fx("profile_export.jsonl")]),
                _ => retrace(&[p(cmd), &f, p("-o"), &dir.path().join("x.html")]),
            };
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(f.to_str().unwrap()) && err.contains(want),
                "{cmd} {name}: {err}"
            );
        }
    }
}
