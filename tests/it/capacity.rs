//! `retrace capacity` against mocks in this process whose saturation point is known: the
//! continuous-batching engine with a fixed step cost and a cap on running sequences serves at
//! most `max_num_seqs / (output_tokens · step)` requests per second, and a trace of evenly spaced
//! arrivals queues only past that rate. A dead target, an SLO never met and one always met each
//! give their stated exit code and result.

use retrace::mock::{CostModel, MockConfig, MockHandle};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::support::{mooncake, under_memory_limit, Running, CHILD_LIMIT, MEMORY_LIMIT};

/// Evenly spaced arrivals: `n` requests `gap_ms` apart, 16 prompt tokens, `out` output tokens,
/// each its own hash id.
fn even(dir: &Path, n: u64, gap_ms: u64, out: u64) -> PathBuf {
    let rows: Vec<(u64, u64, u64, Vec<u64>)> =
        (0..n).map(|i| (i * gap_ms, 16, out, vec![i + 1])).collect();
    let rows: Vec<(u64, u64, u64, &[u64])> = rows
        .iter()
        .map(|(t, i, o, h)| (*t, *i, *o, h.as_slice()))
        .collect();
    mooncake(dir, &rows)
}

fn start(rt: &tokio::runtime::Runtime, cfg: MockConfig) -> MockHandle {
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        retrace::mock::start(l, cfg).await.unwrap()
    })
}

/// The engine serving at most 8 sequences, each step 20 ms whatever it holds: with 10 output
/// tokens a request holds a slot for 10 steps (200 ms), so it serves at most 40 requests/s.
fn batching_mock(rt: &tokio::runtime::Runtime) -> MockHandle {
    start(
        rt,
        MockConfig {
            max_num_seqs: 8,
            cost: CostModel {
                request_overhead_ms: 0.0,
                step_overhead_ms: 20.0,
                prefill_token_ms: 0.0,
                seq_ms: 0.0,
                context_token_ms: 0.0,
            },
            ..Default::default()
        },
    )
}

fn fixed_mock(rt: &tokio::runtime::Runtime, ttft_ms: f64) -> MockHandle {
    start(
        rt,
        MockConfig {
            fixed_timing: Some((ttft_ms, 1.0)),
            ..Default::default()
        },
    )
}

/// How one test's search runs: its SLO, and its steps' length and warm-up.
struct Steps<'a> {
    slo: &'a str,
    step: &'a str,
    warmup: &'a str,
}

fn capacity(trace: &Path, target: &str, result: &Path, s: Steps, args: &[&str]) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.arg("capacity")
        .arg(trace)
        .args(["--target", target, "--result-json"])
        .arg(result)
        .args(["--slo", s.slo, "--step", s.step, "--warmup", s.warmup])
        .args(args);
    Running::spawn(under_memory_limit(&mut cmd, MEMORY_LIMIT)).unwrap()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The sum of the mock's `/metrics` samples of `family`.
fn counter(m: &MockHandle, family: &str) -> f64 {
    m.metrics_text()
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn url(m: &MockHandle) -> String {
    format!("http://{}", m.addr)
}

#[test]
fn the_answer_brackets_a_known_saturation_point() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = batching_mock(&rt);
    let dir = tempfile::tempdir().unwrap();
    // 10 requests/s for 20 s: the mock's 40 requests/s is 4× the trace. A step of 4 s (warm-up
    // included) absorbs a slight overload: a queue growing at δ requests/s adds δ·4 s / 40 to
    // the last TTFTs, which stay within 300 ms (from about 40 ms, two 20 ms steps) while
    // δ ≤ 2.6 requests/s. So the SLO holds up to 4.26× over steps this short (ever closer to 4×
    // as steps grow: 4.01× over the default 70 s).
    let trace = even(dir.path(), 200, 100, 10);
    let result = dir.path().join("cap.json");
    let run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "p99_ttft_ms<=300",
            step: "3s",
            warmup: "1s",
        },
        &["--precision", "0.1", "--scrape-metrics"],
    );
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let r = read_json(&result);
    assert_eq!(r["schema"], "retrace.capacity/1");
    let lo = r["capacity"]["speed"].as_f64().unwrap();
    let steps = r["steps"].as_array().unwrap();
    let hi = steps
        .iter()
        .filter(|s| s["slo_met"] == false)
        .filter_map(|s| s["speed"].as_f64())
        .fold(f64::INFINITY, f64::min);
    // Past the truth the queue grows without bound: no step above it can meet the SLO. Below
    // it, a loaded machine slows the mock's steps, so the knee may show early, never late.
    assert!(
        lo <= 4.26 * 1.05,
        "answer {lo}× above the truth 4.26×: {stdout}"
    );
    assert!(
        hi > lo && hi - lo <= 0.1 * lo + 1e-9,
        "bracket {lo}..{hi}: {stdout}"
    );
    assert!(
        hi >= 4.0 * 0.75,
        "knee at {hi}×, far below the truth 4×: {stdout}"
    );
    assert_eq!(r["capacity"]["at_least"], false);
    assert_eq!(r["capacity"]["limited_by"], "p99_ttft_ms");
    assert!(
        stdout.contains(&format!("capacity: {lo}× the recorded traffic")),
        "{stdout}"
    );
    assert!(stdout.contains("limited by p99 TTFT"), "{stdout}");
    // the mock's gauges: its queue builds, its 8 running sequences are the limit
    assert!(
        stdout.contains("why: waiting queue grows from "),
        "{stdout}"
    );
    assert!(
        stdout.contains("running requests capped at 8 while others wait: batch-bound"),
        "{stdout}"
    );
    assert!(
        r["capacity"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("batch-bound")),
        "{r}"
    );
    // the met boundary was run twice (--repeats 2)
    let runs_at_lo = steps
        .iter()
        .filter(|s| s["speed"].as_f64() == Some(lo))
        .count();
    assert!(runs_at_lo >= 2, "{stdout}");
    // a step far past the knee was given up before its end
    assert!(
        steps.iter().any(|s| s["not_met_because"]
            .as_str()
            .is_some_and(|w| w.starts_with("given up"))),
        "{stdout}"
    );
    // each step holds a whole replay result, which compare, report and merge read
    for s in steps {
        let step = &s["result"];
        assert_eq!(step["schema"], "retrace.replay/1");
        assert_eq!(step["speed"].as_f64(), s["speed"].as_f64());
        retrace::report::load::from_value(Path::new("step.json"), step).unwrap();
    }
    assert!(stderr.contains("step 1 at 1×"), "{stderr}");
    rt.block_on(mock.shutdown());
    report_renders(&result, dir.path());
}

/// `retrace report` of a capacity file: latency and throughput against offered load (with the
/// SLO line and the knee) and the steps' table, drawn in headless Chromium with the page checks.
fn report_renders(result: &Path, dir: &Path) {
    use super::compare::{check_rendered, open_headless, shots_dir};
    use super::support::OutputWithin;
    let html = dir.join("capacity.html");
    let out = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .arg("report")
        .arg(result)
        .arg("-o")
        .arg(&html)
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    for needle in [
        "\"page\":\"capacity\"",
        "\"knee\":",
        "\"slo_lines\":[{\"name\":\"SLO p99_ttft_ms\\u003c=300\"",
    ] {
        assert!(page.contains(needle), "missing {needle}");
    }
    let doms = open_headless(&html, &shots_dir().join("capacity.png"));
    check_rendered(
        &doms,
        &[
            "capacity-answer",
            "chart-capacity-latency",
            "chart-capacity-throughput",
            "table-capacity-steps",
        ],
        &["ok empty charts say \"no data\""],
    );
    // compare names a capacity file and says what to give it instead
    let out = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .arg("compare")
        .arg(result)
        .arg(result)
        .output_within(CHILD_LIMIT)
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a capacity result: give one of its steps' results"),
        "{err}"
    );
}

#[test]
fn the_warm_up_is_sent_and_not_measured() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = fixed_mock(&rt, 5.0);
    let dir = tempfile::tempdir().unwrap();
    // 20 requests/s; a step of 1 s after 1 s of warm-up at 1×: 20 sent in each
    let trace = even(dir.path(), 100, 50, 2);
    let result = dir.path().join("cap.json");
    let run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "p99_ttft_ms<=1000",
            step: "1s",
            warmup: "1s",
        },
        &["--speeds", "1"],
    );
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = read_json(&result);
    let s = &r["steps"][0];
    assert_eq!(s["warmup_requests"], 20);
    assert_eq!(s["result"]["num_prompts"], 20, "{s}");
    assert_eq!(s["copies"], 1);
    rt.block_on(mock.shutdown());
}

#[test]
fn a_short_trace_is_extended_with_copies_that_share_no_prefix() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = fixed_mock(&rt, 5.0);
    let dir = tempfile::tempdir().unwrap();
    // 10 requests over 0.5 s; at 2× a 2 s stretch needs 4 s of trace: 8 copies
    let rows: Vec<(u64, u64, u64, &[u64])> =
        (0..10).map(|i| (i * 50, 1024, 2, &[0u64, 1][..])).collect();
    let trace = mooncake(dir.path(), &rows);
    let result = dir.path().join("cap.json");
    let run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "failure_rate<=0",
            step: "1s",
            warmup: "1s",
        },
        &["--speeds", "2"],
    );
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = read_json(&result);
    let s = &r["steps"][0];
    assert_eq!(s["copies"], 8, "{s}");
    // 10 requests a 0.5 s copy, 40 requests/s at 2×: 80 sent over 2 s, 40 in the warm-up
    assert_eq!(s["warmup_requests"], 40, "{s}");
    assert_eq!(s["result"]["num_prompts"], 40, "{s}");
    // Every request of a copy shares its 1,024-token prefix; no copy shares it with another:
    // one miss per copy, and each of the other 72 requests hits 1,008 tokens (63 of the mock's
    // 16-token blocks: vLLM never hits a prompt's last block).
    let hits = counter(&mock, "vllm:prefix_cache_hits_total");
    assert_eq!(hits, 72.0 * 1008.0);
    rt.block_on(mock.shutdown());
}

#[test]
fn an_slo_always_met_says_at_least_the_highest_speed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = fixed_mock(&rt, 5.0);
    let dir = tempfile::tempdir().unwrap();
    let trace = even(dir.path(), 40, 100, 2);
    let result = dir.path().join("cap.json");
    let run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "p99_ttft_ms<=2000",
            step: "1s",
            warmup: "0s",
        },
        &["--max-speed", "4"],
    );
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let r = read_json(&result);
    assert_eq!(r["capacity"]["speed"], 4.0);
    assert_eq!(r["capacity"]["at_least"], true);
    assert!(
        stdout.contains("capacity: at least 4× the recorded traffic"),
        "{stdout}"
    );
    let speeds: Vec<f64> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["speed"].as_f64().unwrap())
        .collect();
    assert_eq!(speeds, [1.0, 2.0, 4.0, 4.0]);
    rt.block_on(mock.shutdown());
}

#[test]
fn an_slo_never_met_says_so_and_exits_7() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = fixed_mock(&rt, 50.0);
    let dir = tempfile::tempdir().unwrap();
    let trace = even(dir.path(), 40, 100, 2);
    let result = dir.path().join("cap.json");
    let run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "p99_ttft_ms<=10",
            step: "2s",
            warmup: "0s",
        },
        &["--min-speed", "0.5"],
    );
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}");
    let r = read_json(&result);
    assert_eq!(r["capacity"]["speed"], Value::Null);
    assert!(
        stdout.contains("was not met at any speed tried"),
        "{stdout}"
    );
    let speeds: Vec<f64> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["speed"].as_f64().unwrap())
        .collect();
    assert_eq!(speeds, [1.0, 0.5]);
    // every request misses 10 ms: the first step is given up long before its 2 s
    assert!(r["steps"][0]["not_met_because"]
        .as_str()
        .unwrap()
        .starts_with("given up"));
    rt.block_on(mock.shutdown());
}

#[test]
fn a_target_that_dies_mid_search_keeps_the_steps_done() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = fixed_mock(&rt, 5.0);
    let dir = tempfile::tempdir().unwrap();
    let trace = even(dir.path(), 40, 100, 2);
    let result = dir.path().join("cap.json");
    let mut run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "p99_ttft_ms<=2000",
            step: "1s",
            warmup: "0s",
        },
        &[],
    );
    run.wait_for("the second step", CHILD_LIMIT, |e| e.contains("step 2 at"));
    rt.block_on(mock.shutdown());
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the search stopped after"), "{stderr}");
    let r = read_json(&result);
    let steps = r["steps"].as_array().unwrap();
    assert!(!steps.is_empty(), "{r}");
    assert_eq!(steps[0]["slo_met"], true);
}

#[test]
fn a_speed_that_needs_too_many_copies_is_refused_within_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let trace = even(dir.path(), 2, 1, 2);
    let result = dir.path().join("cap.json");
    // no target is reached: the plan is refused before anything is sent
    let run = capacity(
        &trace,
        "http://127.0.0.1:9",
        &result,
        Steps {
            slo: "p99_ttft_ms<=1",
            step: "86400s",
            warmup: "10s",
        },
        &["--speeds", "1000000"],
    );
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("copies of the trace"), "{stderr}");
}

/// The trace of 10 requests over 0.5 s sharing a 1,024-token prefix (two 512-token hash ids).
fn shared_prefix(dir: &Path) -> PathBuf {
    let rows: Vec<(u64, u64, u64, &[u64])> =
        (0..10).map(|i| (i * 50, 1024, 2, &[0u64, 1][..])).collect();
    mooncake(dir, &rows)
}

#[test]
fn steps_never_share_prompts_and_reset_prefix_cache_reaches_the_mock() {
    let dir = tempfile::tempdir().unwrap();
    let trace = shared_prefix(dir.path());
    // Steps of 1 s at 1× (20 requests in 2 copies of the trace) and 2× (40 in 4). Every copy,
    // in any step, has its own hash ids: its first request misses and the other 9 can hit 1,008
    // tokens (63 blocks of 16), with or without a reset between the steps. A prompt shared with
    // an earlier copy or step would make a copy's first request hit too. On a loaded machine a
    // request can arrive before its copy's first has been prefilled and miss as well, so the
    // bound is exact only from above. The mock answers the reset (no warning); its emptying is
    // the cache's unit test.
    let hits = |reset: bool| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mock = fixed_mock(&rt, 5.0);
        let result = dir.path().join(format!("cap-{reset}.json"));
        let mut args = vec!["--speeds", "1,2"];
        if reset {
            args.push("--reset-prefix-cache");
        }
        let steps = Steps {
            slo: "failure_rate<=0",
            step: "1s",
            warmup: "0s",
        };
        let out = capacity(&trace, &url(&mock), &result, steps, &args)
            .wait_within(CHILD_LIMIT)
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(!stderr.contains("reset_prefix_cache"), "{stderr}");
        let copies: Vec<u64> = read_json(&result)["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["copies"].as_u64().unwrap())
            .collect();
        assert_eq!(copies, [2, 4]);
        let h = counter(&mock, "vllm:prefix_cache_hits_total") / 1008.0;
        rt.block_on(mock.shutdown());
        h
    };
    for reset in [false, true] {
        let h = hits(reset);
        assert!(
            h.fract() == 0.0 && h > 0.0 && h <= 6.0 * 9.0,
            "reset {reset}: {h} hits of 1,008 tokens, expected whole hits, at most 6 copies x 9"
        );
    }
}

#[test]
fn a_target_without_reset_prefix_cache_is_named_once_and_the_search_goes_on() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(super::support::start(Default::default()));
    let dir = tempfile::tempdir().unwrap();
    // 8 output tokens: the test server's fault modes answer 2 to 5
    let trace = even(dir.path(), 20, 100, 8);
    let result = dir.path().join("cap.json");
    let target = format!("http://{}", srv.addr);
    let out = capacity(
        &trace,
        &target,
        &result,
        Steps {
            slo: "failure_rate<=0",
            step: "1s",
            warmup: "0s",
        },
        &["--speeds", "1,2", "--reset-prefix-cache"],
    )
    .wait_within(CHILD_LIMIT)
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let says = "answered POST /reset_prefix_cache with HTTP 404; the steps share its prefix cache";
    assert_eq!(stderr.matches(says).count(), 1, "{stderr}");
    assert_eq!(read_json(&result)["steps"].as_array().unwrap().len(), 2);
}

#[test]
fn sigint_halts_the_running_step_keeps_it_and_exits_130() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = fixed_mock(&rt, 5.0);
    let dir = tempfile::tempdir().unwrap();
    let trace = even(dir.path(), 600, 100, 2);
    let result = dir.path().join("cap.json");
    let mut run = capacity(
        &trace,
        &url(&mock),
        &result,
        Steps {
            slo: "p99_ttft_ms<=2000",
            step: "50s",
            warmup: "0s",
        },
        &[],
    );
    run.wait_for("the first step", CHILD_LIMIT, |e| e.contains("step 1 at"));
    // the signal goes once the step has had a request answered
    let answered = || counter(&mock, "vllm:request_success_total");
    run.wait_for("an answered request", CHILD_LIMIT, |_| answered() > 0.0);
    run.signal(libc::SIGINT);
    let out = run.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let r = read_json(&result);
    let steps = r["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{r}");
    assert_eq!(steps[0]["not_met_because"], "interrupted");
    assert_eq!(
        r["capacity"]["speed"],
        Value::Null,
        "a halted step judges nothing"
    );
    rt.block_on(mock.shutdown());
}
