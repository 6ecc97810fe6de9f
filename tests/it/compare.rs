//! `retrace compare` and `retrace report` end to end: two real replays against the test server
//! (TTFT 20 ms vs 400 ms) compared with `--fail-on` and exit codes from the real binary, the real
//! vLLM result fixture, a trace against its replay (fidelity), and the HTML report opened in
//! headless Chromium (no script error, the expected charts, the page's own checks of
//! `report_check.js`: labels inside their charts, no silent empty chart, timeline hover).

use crate::support::{self, OutputWithin, ServerConfig};
use clap::Parser;
use retrace::cli::{Cli, Command};
use retrace::replay;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::time::Duration;

fn bin() -> Proc {
    Proc::new(env!("CARGO_BIN_EXE_retrace"))
}

/// A Mooncake trace of `n` requests 10 ms apart, two shared prefixes.
fn trace(dir: &Path, n: usize) -> PathBuf {
    let mut s = String::new();
    for i in 0..n {
        let h = if i % 2 == 0 { "[0, 1]" } else { "[0, 2]" };
        s.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": 6, \"hash_ids\": {h}}}\n",
            i * 10,
            600 + i % 5
        ));
    }
    let p = dir.join("trace.jsonl");
    std::fs::write(&p, s).unwrap();
    p
}

/// Replays `trace` against a test server with the given TTFT; returns the result file.
async fn replay_to(trace: &Path, ttft_ms: u64, out: &Path) {
    let srv = support::start(ServerConfig {
        ttft: Duration::from_millis(ttft_ms),
        itl: Duration::from_millis(4),
        server_metrics: true,
        ..Default::default()
    })
    .await;
    let cli = Cli::try_parse_from([
        "retrace",
        "replay",
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--result-json",
        out.to_str().unwrap(),
        "--detailed",
    ])
    .unwrap();
    let Command::Replay(a) = cli.command else {
        unreachable!()
    };
    let o = replay::replay(a.config().unwrap()).await.unwrap();
    assert_eq!(o.summary.failed, 0, "{:?}", o.summary.errors);
}

struct Runs {
    _dir: tempfile::TempDir,
    trace: PathBuf,
    fast: PathBuf,
    fast2: PathBuf,
    slow: PathBuf,
}

fn runs() -> Runs {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), 40);
    let (fast, fast2, slow) = (
        dir.path().join("fast.json"),
        dir.path().join("fast2.json"),
        dir.path().join("slow.json"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        replay_to(&t, 20, &fast).await;
        replay_to(&t, 20, &fast2).await;
        replay_to(&t, 400, &slow).await;
    });
    Runs {
        _dir: dir,
        trace: t,
        fast,
        fast2,
        slow,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn compare_two_replays_gates_with_exit_codes() {
    let r = runs();
    // A 20 → 400 ms TTFT regression trips the rule: exit 1, message on stderr.
    let out = bin()
        .args(["compare", s(&r.fast), s(&r.slow)])
        .args([
            "--fail-on",
            "median_ttft_ms>+10%,failure_rate>0.01",
            "--format",
            "json",
        ])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FAIL median_ttft_ms>+10%") && err.contains("1 of 2"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed"], true);
    // The verdict object: counts and the gate with the rule that tripped it.
    let verdict = &v["verdict"];
    assert!(verdict["worse"].as_u64().unwrap() >= 1, "{verdict}");
    assert_eq!(verdict["gate"]["result"], "fail", "{verdict}");
    assert_eq!(verdict["gate"]["failing"][0]["rule"], "median_ttft_ms>+10%");
    let line = verdict["line"].as_str().unwrap();
    assert!(line.contains("; gate: FAIL (median_ttft_ms +"), "{line}");
    let row = row_of(&v, "median_ttft_ms").unwrap();
    assert_eq!(row["verdict"], "worse", "{row}");
    assert!(row["rel_change"].as_f64().unwrap() > 0.5, "{row}");
    // Same trace replayed twice: paired comparison with the ratio around 400/20 (a busy
    // machine adds to both sides; the slow side waits 400 ms whatever the load).
    let p = &v["paired"];
    assert_eq!(p["n"], 40);
    assert!(p["geo_mean_ratio"].as_f64().unwrap() > 1.5, "{p}");
    assert_eq!(p["significant"], true);
    // Server-side metrics are compared too.
    assert!(v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["key"] == "mean_server_ttft_ms"));

    // With a noise run, each row carries |noise - baseline| (its size depends on the machine's
    // load, so only its presence is checked here; the suppression logic has unit tests).
    let out = bin()
        .args(["compare", s(&r.fast), s(&r.slow), "--noise", s(&r.fast2)])
        .args(["--format", "json"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["noise"][0]["path"]
        .as_str()
        .unwrap()
        .ends_with("fast2.json"));
    assert!(v["rows"][0]["noise"].as_f64().is_some(), "{}", v["rows"][0]);

    // The baseline against the same run under another name passes the same gate: exit 0 (a
    // rerun's own latency depends on the machine's load, so the test holds the numbers).
    let same = r.fast.with_file_name("fast-copy.json");
    std::fs::copy(&r.fast, &same).unwrap();
    let out = bin()
        .args(["compare", s(&r.fast), s(&same)])
        .args(["--fail-on", "median_ttft_ms>+100%,failure_rate>0.01"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ok median_ttft_ms>+100%"), "{text}");
    // The verdict line comes first.
    let first = text.lines().next().unwrap();
    assert!(first.ends_with("; gate: PASS (2 rules)"), "{first}");

    // A rule on p99 of 40 requests (1,000 needed) cannot be judged: exit 4, saying so.
    let out = bin()
        .args(["compare", s(&r.fast), s(&r.fast2)])
        .args(["--fail-on", "p99_ttft_ms>+100%"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(
        text.lines().next().unwrap().contains("NOT JUDGED"),
        "{text}"
    );

    // A bad rule is a usage error: exit 2, naming the rule.
    let out = bin()
        .args([
            "compare",
            s(&r.fast),
            s(&r.slow),
            "--fail-on",
            "p99_ttft>+10%",
        ])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`p99_ttft>+10%`") && err.contains("unknown metric"),
        "{err}"
    );

    // A missing input is an input error: exit 2, naming the file.
    let out = bin()
        .args(["compare", s(&r.fast), "/nonexistent/cand.json"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/cand.json"));

    // Markdown for PR comments.
    let out = bin()
        .args(["compare", s(&r.fast), s(&r.slow), "--format", "markdown"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.contains("| median TTFT (ms) |") && md.contains("**worse**"),
        "{md}"
    );
    // Markdown opens with the verdict line too; no gate part without --fail-on.
    let first = md.lines().next().unwrap();
    assert!(
        first.starts_with("**") && first.contains(" worse, "),
        "{first}"
    );
    assert!(!first.contains("gate"), "{first}");

    // Fidelity: the trace against its replay.
    let v = compare_json(s(&r.trace), s(&r.fast));
    let f = &v["workload"]["fidelity"];
    assert_eq!(f["paired"], 40);
    assert_eq!(f["isl_exact"], 1.0);
    assert_eq!(f["osl_exact"], 1.0);
    // Faithful, unless this loaded machine sent late, which the verdict must then say alone.
    assert!(
        f["schedule_error_ms"]["p99"].as_f64().unwrap() <= 1.0,
        "{f}"
    );
    assert_eq!(f["faithful"], f["sent_on_time"], "{f}");
    assert_eq!(v["workload"]["isl_ks"]["d"], 0.0);
}

/// A result written before the vLLM keys were complete (`backend: "retrace"`, `endpoint_type:
/// completions`, no `queue_times`, ...) is still read by `compare` and `report`.
#[test]
fn compare_and_report_read_an_old_format_result() {
    let old = support::repo("fixtures/replay/result_old_format.json");
    let v = compare_json(s(&old), s(&old));
    let row = |k: &str| row_of(&v, k);
    assert_eq!(row("p99_ttft_ms").unwrap()["baseline"], 50.0);
    assert_eq!(v["verdict"]["worse"], 0);
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("old.html");
    let out = bin()
        .args(["report", s(&old), "-o", s(&page)])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let page = std::fs::read_to_string(&page).unwrap();
    // its per-request arrays give the timeline of both requests
    assert!(
        page.contains("\"timeline\":{") && page.contains("\"total\":2"),
        "no timeline"
    );
}

#[test]
fn compare_reads_the_real_vllm_result() {
    let f = support::repo("fixtures/vllm/bench_serve_result_timed_trace.json");
    let v = compare_json(s(&f), s(&f));
    let row = |k: &str| row_of(&v, k).unwrap_or_else(|| panic!("no row {k}"));
    // vLLM's own keys are taken as they are.
    assert_eq!(row("p99_ttft_ms")["baseline"], 332.3862868500283);
    assert_eq!(row("mean_tpot_ms")["baseline"], 3.436652837868452);
    assert_eq!(row("request_throughput")["baseline"], 5.020492972875191);
    // p90 is not among its keys: computed from its per-request arrays.
    assert!(row("p90_ttft_ms")["baseline"].as_f64().is_some());
    assert_eq!(row("mean_ttft_ms")["verdict"], "same");
    assert_eq!(v["paired"]["n"], 30);
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// Runs headless Chromium (killed after [`support::CHILD_LIMIT`]) on `page` with the check script
/// `tests/it/report_check.js` appended: the dumped DOM at 1400 and 800 px wide, and a 1400 px
/// screenshot with the check's hovers shown. Empty when RETRACE_SKIP_BROWSER=1 and no chromium.
pub(crate) fn open_headless(page: &Path, screenshot: &Path) -> Vec<String> {
    use support::OutputWithin;
    let Some(chrome) = chromium() else {
        if std::env::var("RETRACE_SKIP_BROWSER").is_ok_and(|v| v == "1") {
            return Vec::new();
        }
        panic!(
            "chromium not found on PATH: the HTML report browser test needs it \
             (`apt-get install -y chromium`, as .ci/run does), or set RETRACE_SKIP_BROWSER=1 to skip it explicitly"
        );
    };
    let html = std::fs::read_to_string(page).unwrap();
    let at = html.rfind("</body>").expect("a page body");
    let checked = page.with_extension("checked.html");
    let check = include_str!("report_check.js");
    let body = format!("{}<script>{check}</script>\n{}", &html[..at], &html[at..]);
    std::fs::write(&checked, body).unwrap();
    let url = format!("file://{}", checked.display());
    let run = |extra: &[&str]| {
        let profile = tempfile::tempdir().unwrap();
        let out = Proc::new(&chrome)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(&url)
            .output_within(support::CHILD_LIMIT)
            .expect("chromium runs");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let doms = ["1400,1000", "800,1000"]
        .map(|w| run(&[&format!("--window-size={w}"), "--dump-dom"]))
        .to_vec();
    run(&[
        "--window-size=1400,2600",
        &format!("--screenshot={}", screenshot.display()),
    ]);
    assert!(
        std::fs::metadata(screenshot).is_ok_and(|m| m.len() > 10_000),
        "no screenshot at {}",
        screenshot.display()
    );
    doms
}

pub(crate) fn shots_dir() -> PathBuf {
    let d = support::repo("target/report-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The page rendered without a script error, has the charts `ids`, and its checks (labels inside
/// their charts, no silent empty chart, `must` findings such as the timeline hover) all passed,
/// at each width.
pub(crate) fn check_rendered(doms: &[String], ids: &[&str], must: &[&str]) {
    if doms.is_empty() {
        support::say_skipped(
            "the browser checks",
            "RETRACE_SKIP_BROWSER=1 and no chromium",
        );
        return;
    }
    for dom in doms {
        assert!(
            !dom.contains(" data-render-error=\""),
            "script error: {}",
            dom.split("id=\"render-error\">").nth(1).unwrap_or("")
        );
        assert!(
            dom.contains("id=\"render-ok\""),
            "charts did not finish rendering"
        );
        for id in ids {
            assert!(dom.contains(&format!("id=\"{id}\"")), "missing #{id}");
        }
        let found = dom
            .rsplit("<pre id=\"retrace-check\"")
            .next()
            .and_then(|s| s.split_once('>'))
            .and_then(|(_, s)| s.split_once("</pre>"))
            .map(|(s, _)| {
                s.replace("&quot;", "\"")
                    .replace("&gt;", ">")
                    .replace("&lt;", "<")
                    .replace("&amp;", "&")
            })
            .expect("the check script's findings");
        assert!(!found.contains("FAIL"), "page checks failed:\n{found}");
        for m in must {
            assert!(
                found.contains(m),
                "no `{m}` among the page checks:\n{found}"
            );
        }
    }
}

#[test]
fn html_report_and_compare_page_render_in_headless_chromium() {
    let r = runs();
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let out = bin()
        .args(["report", s(&r.slow), "-o", s(&html)])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doms = open_headless(&html, &shots_dir().join("report.png"));
    check_rendered(
        &doms,
        &[
            "headline",
            "verdict-line",
            "card-ok",
            "card-failed",
            "card-req-s",
            "card-tok-s",
            "card-ttft",
            "card-itl",
            "card-e2el",
            "card-drift",
            "chart-ttft-over-time",
            "details",
            "table-summary",
            "table-percentiles",
            "table-intended",
            "chart-cdf-ttft",
            "chart-cdf-itl",
            "chart-cdf-e2el",
            "chart-timeline",
            "chart-throughput",
            "chart-concurrency",
            "chart-isl",
            "chart-osl",
            "chart-breakdown",
        ],
        &[
            "ok #headline first, 8 headline cards above the fold",
            "ok each chart's series in distinct colours",
            "ok whole run: hovering request #",
            "ok Shift+drag pans the zoomed timeline",
            "ok double-click resets the timeline",
            "request ids shown",
            "ok zoomed: hovering request #",
            "ok CDF hover reads",
            // every client-queue value is 0: no empty 0..1 chart
            "ok #chart-cdf-client_queue says \"no data: every value is 0 ms\"",
        ],
    );
    for dom in &doms {
        // every request drawn in the timeline
        assert!(dom.contains("data-rows=\"40\""), "timeline rows");
        // the test server reports per-request metrics: server queue depth is drawn
        assert!(dom.contains("server queue*"), "server queue series");
    }

    let page = dir.path().join("cmp.html");
    let out = bin()
        .args([
            "compare",
            s(&r.fast),
            s(&r.slow),
            "--noise",
            s(&r.fast2),
            "--fail-on",
            "failure_rate>0.5",
            "--html",
            s(&page),
        ])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doms = open_headless(&page, &shots_dir().join("compare.png"));
    check_rendered(
        &doms,
        &[
            "verdict",
            "verdict-line",
            "gate",
            "table-compare",
            "chart-cdf-ttft",
            "chart-cdf-tpot",
            "chart-paired",
            "chart-cdf-isl",
            "chart-cdf-osl",
        ],
        &["ok #verdict first", "ok CDF hover reads \"baseline p"],
    );
    let html_text = std::fs::read_to_string(&page).unwrap();
    assert!(
        html_text.contains("\"gate\":\"pass\""),
        "the gate's result in the page"
    );

    // The report of the real vLLM result (no server metrics: no breakdown chart, no error).
    let f = support::repo("fixtures/vllm/bench_serve_result_timed_trace.json");
    let out = bin()
        .args(["report", s(&f), "-o", s(&html)])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doms = open_headless(&html, &shots_dir().join("report-vllm.png"));
    check_rendered(
        &doms,
        &["chart-timeline", "chart-cdf-ttft"],
        &["ok whole run: hovering request #"],
    );
}

/// vLLM users' spelling of the timeline thresholds works; the page colours gaps by it.
#[test]
fn report_takes_vllms_timeline_itl_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("r.html");
    let f = support::repo("fixtures/vllm/bench_serve_result_timed_trace.json");
    let out = bin()
        .args(["report", s(&f), "-o", s(&html)])
        .args(["--timeline-itl-thresholds", "10,20"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("\"thresholds\":[10.0,20.0]"),
        "thresholds not in the page"
    );
}

/// `--percentiles` picks the tables' columns; a bad list is an error naming the flag.
#[test]
fn report_takes_its_percentiles() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("r.html");
    let f = support::repo("fixtures/vllm/bench_serve_result_timed_trace.json");
    let out = bin()
        .args(["report", s(&f), "-o", s(&html), "--percentiles", "50,99.9"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("\"percentile_head\":[\"metric (ms)\",\"n\",\"mean\",\"std\",\"p50\",\"p99.9\",\"max\"]"),
        "table head not in the page"
    );
    for bad in ["50,101", "", "1,2,3,4,5,6,7,8,9,10,11,12,13"] {
        let out = bin()
            .args(["report", s(&f), "-o", s(&html), "--percentiles", bad])
            .output_within(support::CHILD_LIMIT)
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--percentiles {bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--percentiles"), "{err}");
    }
}

#[test]
fn report_of_a_bad_file_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.json");
    std::fs::write(&p, "{\"completed\": \"many\", \"duration\": 1}").unwrap();
    let out = bin()
        .args(["report", s(&p), "-o", s(&dir.path().join("x.html"))])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.json") && err.contains("completed"),
        "{err}"
    );
}

#[test]
fn replay_writes_its_html_report() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(support::start(ServerConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), 5);
    let html = dir.path().join("run.html");
    let out = bin()
        .args(["replay", s(&t), "--target", &srv.url(), "--detailed"])
        .args(["--report-html", s(&html)])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    // the timeline data of all 5 requests is in the page
    assert!(
        page.contains("\"timeline\":{") && page.contains("\"total\":5"),
        "no timeline"
    );
}

#[test]
fn compare_two_traces_is_a_workload_comparison() {
    let a = support::repo("traces/mooncake_conversation_1k.jsonl");
    let b = support::repo("traces/azure_conv_100.csv");
    let v = compare_json(s(&a), s(&b));
    assert_eq!(v["rows"].as_array().unwrap().len(), 0);
    let w = &v["workload"];
    assert_eq!(w["baseline"]["requests"], 1000);
    assert_eq!(w["candidate"]["requests"], 100);
    // Mooncake conversation prompts are far longer than Azure's: the KS test sees it.
    assert!(w["isl_ks"]["d"].as_f64().unwrap() > 0.5);
    assert!(w["isl_ks"]["p_value"].as_f64().unwrap() < 1e-6);
    assert!(w["baseline"]["reuse"]["block_reuse"].as_f64().unwrap() > 0.1);
    // bursty arrivals on a ~3 s grid
    assert!(w["baseline"]["gap_cv"].as_f64().unwrap() > 1.0);
    assert!(w["fidelity"].is_null());
}

/// `retrace compare A B --format json`, which must succeed.
fn compare_json(a: &str, b: &str) -> serde_json::Value {
    let out = bin()
        .args(["compare", a, b, "--format", "json"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The row of metric `key` in compare's JSON.
fn row_of(v: &serde_json::Value, key: &str) -> Option<serde_json::Value> {
    let rows = v["rows"].as_array().unwrap();
    rows.iter().find(|r| r["key"] == key).cloned()
}
