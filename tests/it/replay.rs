//! `retrace replay` end to end against the test SSE server: metrics with known timings, failures by
//! kind, prompts on the wire (exact lengths, shared prefixes, determinism), the result file, flag
//! validation, and the `--max-drift-ms` exit status.

use crate::support::{self, OutputWithin, ServerConfig};
use retrace::replay::{self};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_timings_give_vllm_metrics() {
    let srv = support::start(ServerConfig {
        ttft: Duration::from_millis(40),
        itl: Duration::from_millis(8),
        server_metrics: true,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(
        dir.path(),
        &[
            (0, 600, 10, &[0, 1]),
            (20, 700, 10, &[0, 2]),
            (40, 512, 10, &[3]),
            (60, 100, 1, &[4]),
        ],
    );
    let out = dir.path().join("r.json");
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--result-json",
        out.to_str().unwrap(),
        "--detailed",
        "--percentiles",
        "50,99",
        "--goodput",
        "ttft:10000",
        "tpot:10000",
    ])
    .unwrap();
    let o = replay::replay(cfg).await.unwrap();
    let s = &o.summary;
    assert_eq!((s.completed, s.failed), (4, 0), "{:?}", s.errors);
    assert_eq!(s.total_input_tokens, 600 + 700 + 512 + 100);
    assert_eq!(s.total_output_tokens, 31);
    // The definitions hold however loaded the machine: TTFT ≥ the server's 40 ms; a 10-token
    // stream ends no sooner than 40 + 9 × 8 ms after its send (the server's own instants);
    // TPOT = (E2EL − TTFT)/(n − 1) is at least the mean ITL of these equal streams, as E2EL
    // ends at or after the last token. (A late read can bunch tokens, so no ITL floor holds.)
    assert!(s.ttft.mean >= 40.0, "ttft {}", s.ttft.mean);
    let e2el_floor = (3.0 * (40.0 + 9.0 * 8.0) + 40.0) / 4.0;
    assert!(s.e2el.mean >= e2el_floor - 0.5, "e2el {}", s.e2el.mean);
    assert_eq!(
        s.itl.count, 27,
        "9 gaps for each 10-token stream, none for 1 token"
    );
    assert_eq!(s.tpot.count, 3, "no TPOT for a one-token request");
    assert!(
        s.tpot.mean >= s.itl.mean - 1e-6,
        "tpot {} itl {}",
        s.tpot.mean,
        s.itl.mean
    );
    assert_eq!(s.server_reported, 4);
    assert!((s.server_queue.mean - 2.0).abs() < 1e-9);
    assert!((s.server_ttft.mean - 35.0).abs() < 1e-9);
    // client TTFT (≥ 40) − queue (2) − server TTFT (35) ≥ 3 ms
    assert!(s.unattributed.mean >= 3.0 - 1e-9, "{}", s.unattributed.mean);
    assert!(o
        .report
        .starts_with("============ Serving Benchmark Result ============\n"));
    assert!(o.report.contains("P50 TTFT (ms):"));
    assert!(o.report.contains("Request goodput (req/s):"));
    assert!(
        (s.request_goodput.unwrap() - s.request_throughput).abs() < 1e-9,
        "all meet loose SLOs"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["completed"], 4);
    assert_eq!(v["input_lens"], serde_json::json!([600, 700, 512, 100]));
    assert_eq!(v["output_lens"], serde_json::json!([10, 10, 10, 1]));
    assert_eq!(v["itls"][0].as_array().unwrap().len(), 9);
    assert_eq!(v["server_queue_times"][0], 0.002);
    let starts: Vec<f64> = v["intended_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(starts, [0.0, 0.02, 0.04, 0.06]);
    assert!(v["p50_ttft_ms"].as_f64().is_some());
    assert!(v["histograms"]["ttft_us"].as_str().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_by_kind_and_the_run_completes() {
    let srv = support::start(ServerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    // max_tokens selects the fault: 2 → 500, 3 → reset, 4 → malformed, 5 → stream error.
    let trace = support::mooncake(
        dir.path(),
        &[
            (0, 10, 6, &[0]),
            (5, 10, 2, &[1]),
            (10, 10, 3, &[2]),
            (15, 10, 4, &[3]),
            (20, 10, 5, &[4]),
            (25, 10, 6, &[5]),
        ],
    );
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--model",
        "x",
    ])
    .unwrap();
    let o = replay::replay(cfg).await.unwrap();
    let s = &o.summary;
    assert_eq!((s.completed, s.failed), (2, 4));
    for kind in ["http_500", "reset", "malformed_stream", "stream_error"] {
        assert_eq!(s.errors.get(kind), Some(&1), "{kind}: {:?}", s.errors);
    }
    assert_eq!(s.total_output_tokens, 12, "failed requests add no tokens");
    assert!(o.report.contains("http_500:"));
}

/// A target that stops listening after the setup: its refused connections are failures of the
/// run (`connect`), not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_a_failure_not_an_error() {
    // The listener takes the one connection that checks the target, then closes it and goes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let gone = std::thread::spawn(move || drop(listener.accept()));
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 3, &[0]), (1, 10, 3, &[1])]);
    let url = format!("http://127.0.0.1:{port}");
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &url,
        "--model",
        "m",
        "--warm-connections",
        "0",
    ])
    .unwrap();
    let mut p = replay::prepare(&cfg).await.unwrap();
    gone.join().unwrap(); // the listener is gone before the clock starts
    let ran = replay::execute(&cfg, &mut p, Default::default())
        .await
        .unwrap();
    let o = replay::assemble(&cfg, &p, ran).unwrap();
    assert_eq!(o.summary.failed, 2);
    assert_eq!(
        o.summary.errors.get("connect"),
        Some(&2),
        "{:?}",
        o.summary.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_on_the_wire_are_exact_shared_and_deterministic() {
    let srv = quick_server().await;
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(
        dir.path(),
        &[
            (0, 1000, 6, &[0, 1]),
            (30, 1100, 6, &[0, 1, 2]),
            (60, 300, 6, &[5]),
        ],
    );
    let run = |seed: &'static str| {
        let (t, u) = (trace.clone(), srv.url());
        async move {
            let cfg =
                support::replay_config(&[t.to_str().unwrap(), "--target", &u, "--seed", seed])
                    .unwrap();
            replay::replay(cfg).await.unwrap()
        }
    };
    // The server may see the three requests in any order on a busy machine: each run's prompts are
    // told apart by their lengths (all different).
    let runs = |prompts: &[serde_json::Value]| -> Vec<Vec<Vec<u64>>> {
        prompts
            .chunks(3)
            .map(|run| {
                let mut r: Vec<Vec<u64>> = run
                    .iter()
                    .map(|p| {
                        let ids = p.as_array().unwrap().iter();
                        ids.map(|x| x.as_u64().unwrap()).collect()
                    })
                    .collect();
                r.sort_by_key(|p| [1000, 1100, 300].iter().position(|&n| n == p.len()));
                r
            })
            .collect()
    };
    run("7").await;
    let first = runs(&srv.prompts.lock().unwrap())[0].clone();
    assert_eq!(first.len(), 3);
    assert_eq!(
        first.iter().map(Vec::len).collect::<Vec<_>>(),
        [1000, 1100, 300]
    );
    assert_eq!(
        first[0][..1000],
        first[1][..1000],
        "ids 0,1 shared: 1000-token prefix"
    );
    assert_ne!(first[0][..300], first[2][..300]);
    assert!(first.iter().flatten().all(|&t| (16..4096).contains(&t)));
    run("7").await;
    run("8").await;
    let all = runs(&srv.prompts.lock().unwrap());
    assert_eq!(all.len(), 3);
    assert_eq!(all[0], all[1], "same seed, same prompts");
    assert!(
        (0..3).all(|k| all[0][k] != all[2][k]),
        "another seed, other prompts"
    );
    // The model came from GET /v1/models.
    assert!(srv.requests.load(std::sync::atomic::Ordering::Relaxed) >= 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_queues_and_reports_client_queue_time() {
    let srv = support::start(ServerConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(
        dir.path(),
        &[(0, 10, 6, &[0]), (0, 10, 6, &[1]), (0, 10, 6, &[2])],
    );
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--model",
        "m",
        "--max-concurrency",
        "1",
        "--limit",
        "2",
        "--detailed",
    ])
    .unwrap();
    let o = replay::replay(cfg).await.unwrap();
    let s = &o.summary;
    assert_eq!((s.completed, s.failed), (2, 0), "--limit 2: {:?}", s.errors);
    assert_eq!(s.peak_in_flight, 1);
    let col = |k: &str| -> Vec<f64> {
        let v = o.result[k].as_array().unwrap_or_else(|| panic!("{k}"));
        v.iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (start, latency, queue) = (
        col("start_times"),
        col("latencies"),
        col("client_queue_times"),
    );
    let (intended, drift) = (col("intended_times"), col("drifts"));
    // The second request waited in the client queue and was sent only when the first ended.
    let (first, second) = if start[0] <= start[1] { (0, 1) } else { (1, 0) };
    assert!(queue[second] > 0.0, "queue {queue:?}");
    assert!(
        start[second] >= start[first] + latency[first] - 1e-6,
        "sent {start:?}, latencies {latency:?}"
    );
    // Latency from the intended time includes the queue: ≥ queue + the server's 30 ms TTFT.
    assert!(
        s.ttft_from_intended.max >= s.client_queue.max + 29.0,
        "{:?} {:?}",
        s.ttft_from_intended,
        s.client_queue
    );
    // Send drift leaves the slot wait out: the queued request was not "late" by its wait.
    for i in 0..2 {
        let want = start[i] - queue[i] - intended[i];
        assert!(
            (drift[i] - want).abs() < 1e-6,
            "request {i}: drift {drift:?} want {want}"
        );
    }
    assert!(
        s.dispatch_drift.max <= s.drift.max + 1e-9,
        "{:?}",
        s.dispatch_drift
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speed_compresses_the_schedule() {
    let srv = quick_server().await;
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 6, &[0]), (400, 10, 6, &[1])]);
    let out = dir.path().join("r.json");
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--model",
        "m",
        "--speed",
        "4",
        "--detailed",
        "--result-json",
        out.to_str().unwrap(),
    ])
    .unwrap();
    let o = replay::replay(cfg).await.unwrap();
    assert_eq!(o.summary.completed, 2);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["intended_times"], serde_json::json!([0.0, 0.1]));
    // Never sent before the compressed schedule's time (how late is a benchmark's business).
    let starts = v["start_times"].as_array().unwrap();
    assert!(starts[1].as_f64().unwrap() >= 0.1, "{starts:?}");
    assert_eq!(v["speed"], 4.0);
}

#[test]
fn invalid_flags_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["t", "--speed", "0"], "--speed"),
        (&["t", "--speed", "nan"], "--speed"),
        (&["t", "--max-concurrency", "0"], "--max-concurrency"),
        (&["t", "--percentiles", "50,abc"], "--percentiles"),
        (&["t", "--percentiles", "101"], "--percentiles"),
        (&["t", "--extra-body", "[1]"], "--extra-body"),
        (&["t", "--extra-body", "{"], "--extra-body"),
        // With a tokenizer, chat needs text mode (without one, the target makes the text).
        (
            &["t", "--endpoint", "chat", "--tokenizer", "a.json"],
            "--endpoint chat",
        ),
        (&["t", "--header", "novalue"], "--header"),
        (
            &["t", "--api-key-env", "RETRACE_TEST_SURELY_UNSET_VAR"],
            "--api-key-env",
        ),
        (&["t", "--max-drift-ms=-1"], "--max-drift-ms"),
        (&["t", "--timeout-s", "0"], "--timeout-s"),
        (&["t", "--goodput", "ttft=5"], "--goodput"),
        (&["t", "--goodput", "itl:5"], "--goodput"),
        // The dispatcher only sleeps: its spin window and SCHED_FIFO are gone from the CLI.
        (&["t", "--spin-us", "50"], "--spin-us"),
        (&["t", "--realtime"], "--realtime"),
        (&["t", "--reader-threads", "many"], "--reader-threads"),
        (&["t", "--reader-threads", "65"], "--reader-threads"),
        (&["t", "--read-batch-us", "6000"], "--read-batch-us"),
    ];
    for (args, flag) in cases {
        let e = support::replay_config(args).unwrap_err().to_string();
        assert!(e.contains(flag), "{args:?}: {e}");
    }
    let e =
        support::replay_config(&["t", "--tokenizer", "a.json", "--vocab-size", "5"]).unwrap_err();
    assert!(e.to_string().contains("--vocab-size"), "{e}");
    assert!(support::replay_config(&["t", "--endpoint", "bogus"]).is_err());
    // Reader threads: one per CPU up to 4 by default, 0 for none; a 500 µs batch window.
    let cfg = support::replay_config(&["t"]).unwrap();
    assert!(
        (1..=4).contains(&cfg.tuning.reader_threads),
        "{}",
        cfg.tuning.reader_threads
    );
    assert_eq!(cfg.tuning.read_batch, std::time::Duration::from_micros(500));
    let cfg = support::replay_config(&["t", "--reader-threads", "0", "--read-batch-us", "0"]);
    let cfg = cfg.unwrap();
    assert_eq!(
        (cfg.tuning.reader_threads, cfg.tuning.read_batch),
        (0, std::time::Duration::ZERO)
    );
}

#[test]
fn api_key_is_never_written() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(support::start(ServerConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 6, &[0])]);
    let out = dir.path().join("r.json");
    let o = std::process::Command::new(bin)
        .args(["replay", trace.to_str().unwrap(), "--target", &srv.url()])
        .args([
            "--api-key-env",
            "RETRACE_TEST_KEY",
            "--detailed",
            "--result-json",
        ])
        .arg(&out)
        .env("RETRACE_TEST_KEY", "sk-very-secret-123")
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let all = format!(
        "{}{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        std::fs::read_to_string(&out).unwrap()
    );
    assert!(!all.contains("sk-very-secret"), "secret leaked");
    assert!(all.contains("Serving Benchmark Result"));
}

#[test]
fn drift_limit_sets_exit_status() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(support::start(ServerConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 6, &[0]), (5, 10, 6, &[1])]);
    let run = |limit: &str| {
        std::process::Command::new(bin)
            .args(["replay", trace.to_str().unwrap(), "--target", &srv.url()])
            .args(["--max-drift-ms", limit])
            .output_within(support::CHILD_LIMIT)
            .unwrap()
    };
    // Any real dispatch is at least some nanoseconds late: a zero limit is always exceeded.
    let strict = run("0");
    assert_eq!(
        strict.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&strict.stderr)
    );
    assert!(String::from_utf8_lossy(&strict.stdout).contains("RUN INVALID"));
    let lax = run("10000");
    assert_eq!(
        lax.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&lax.stderr)
    );
}

/// `--target` with nothing listening: a plain message saying the target could not be reached,
/// exit 2, with or without `--model` (it used to end in "(or give --model)").
#[test]
fn target_not_listening_says_it_could_not_be_reached() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    // Bind then drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 3, &[0])]);
    let url = format!("http://127.0.0.1:{port}");
    for model in [&[][..], &["--model", "m"][..]] {
        let o = std::process::Command::new(bin)
            .args(["replay", trace.to_str().unwrap(), "--target", &url])
            .args(model)
            .output_within(support::CHILD_LIMIT)
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{model:?}: {err}");
        let want = format!(
            "retrace: error: --target {url}: the target could not be reached (connection refused at 127.0.0.1:{port})\n"
        );
        assert_eq!(err, want, "{model:?}");
        assert!(
            o.stdout.is_empty(),
            "{model:?}: nothing measured, nothing printed"
        );
    }
}

/// Runs `retrace replay TRACE --target URL ARGS...` to its end.
fn replay_child(trace: &Path, url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(["replay", trace.to_str().unwrap(), "--target", url])
        .args(args)
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

/// `--model nope`: every request got 404. The run exits 5 and the console shows the server's
/// message (it used to exit 0 with the message only in the JSON); a run where only some
/// requests failed still exits 0.
#[test]
fn run_where_every_request_failed_exits_5_with_the_server_messages() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let cfg = retrace::mock::MockConfig {
        fixed_timing: Some((1.0, 1.0)),
        ..Default::default()
    };
    let mock = rt.block_on(retrace::mock::start(listener, cfg)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 3, &[0]), (1, 10, 3, &[1])]);
    let url = format!("http://{}", mock.addr);
    let (code, out, err) = replay_child(&trace, &url, &["--model", "nope"]);
    assert_eq!(code, Some(5), "{err}");
    assert!(
        out.contains("First error messages:\n  http_404 (2): {"),
        "{out}"
    );
    assert!(out.contains("The model `nope` does not exist."), "{out}");
    assert!(
        out.contains("RUN FAILED: all 2 requests failed (exit 5)"),
        "{out}"
    );
    let (code, out, err) = replay_child(&trace, &url, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("First error messages") && !out.contains("RUN FAILED"));
    rt.block_on(mock.shutdown());
    // One of two requests fails (the test server answers max_tokens 2 with a 500).
    let srv = rt.block_on(support::start(ServerConfig::default()));
    let trace = support::mooncake(dir.path(), &[(0, 10, 6, &[0]), (1, 10, 2, &[1])]);
    let (code, out, err) = replay_child(&trace, &srv.url(), &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("First error messages:\n  http_500 (1): "),
        "{out}"
    );
    assert!(!out.contains("RUN FAILED"), "{out}");
}

/// A recording whose every request failed (404: the model is gone), replayed faithfully: each
/// fails again the same way, which is what was asked for, so the run exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_failures_that_fail_again_the_same_way_do_not_fail_the_run() {
    use retrace::trace::{Request, Response, Trace, TraceHeader};
    let body = br#"{"model":"gone","prompt":[20,21,22],"max_tokens":2,"stream":true}"#;
    let failed = |at: u64| Request {
        arrival_us: at,
        input_tokens: 3,
        output_tokens: 2,
        body: Some(body.to_vec()),
        response: Some(Box::new(Response {
            status: 404,
            error: Some("http_404".into()),
            ..Default::default()
        })),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("failed.trace.zst");
    let trace = Trace {
        header: TraceHeader::imported(16, true, "test"),
        requests: vec![failed(0), failed(1_000)],
    };
    retrace::trace::native::write_file(&path, &trace, Default::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = retrace::mock::MockConfig {
        fixed_timing: Some((1.0, 1.0)),
        ..Default::default()
    };
    let mock = retrace::mock::start(listener, cfg).await.unwrap();
    let url = format!("http://{}", mock.addr);
    let args = [path.to_str().unwrap(), "--target", &url];
    let o = replay::replay(support::replay_config(&args).unwrap())
        .await
        .unwrap();
    assert_eq!(o.summary.errors.get("http_404"), Some(&2), "{}", o.report);
    assert_eq!(o.result["recorded_outcomes"]["failed_again_same_way"], 2);
    assert!(!o.all_failed, "{}", o.report);
    mock.shutdown().await;
    // Against a target that fails them some other way (the test server answers max_tokens 2
    // with a 500), the run failed.
    let srv = support::start(ServerConfig::default()).await;
    let url = srv.url();
    let args = [path.to_str().unwrap(), "--target", &url, "--model", "m"];
    let o = replay::replay(support::replay_config(&args).unwrap())
        .await
        .unwrap();
    assert_eq!(o.summary.errors.get("http_500"), Some(&2), "{}", o.report);
    assert!(o.all_failed, "{}", o.report);
}

/// vLLM's prefix-cache hit rule (domain.md §4) applied to a Mooncake trace replayed in order with
/// an unbounded cache: P = the longest prefix shared with an earlier request, in tokens.
fn theoretical_hits(rows: &[(u64, u64, Vec<u64>)], block: u64, kv_block: u64) -> u64 {
    let mut total = 0;
    for (k, (len, _, ids)) in rows.iter().enumerate() {
        let mut p = 0;
        for (elen, _, eids) in &rows[..k] {
            let common = ids.iter().zip(eids).take_while(|(a, b)| a == b).count() as u64;
            p = p.max((common * block).min(*len).min(*elen));
        }
        total += ((p / kv_block) * kv_block).min(((len - 1) / kv_block) * kv_block);
    }
    total
}

fn prom_counter(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_on_the_mock_equal_the_theoretical_count() {
    let raw = include_str!("../../fixtures/replay/mooncake_conversation_30.jsonl");
    let rows: Vec<(u64, u64, Vec<u64>)> = raw
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = v["hash_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            (
                v["input_length"].as_u64().unwrap(),
                v["output_length"].as_u64().unwrap(),
                ids,
            )
        })
        .collect();
    // Re-timed 25 ms apart with 2-token outputs, one at a time: admission order is the trace
    // order however late a request goes out.
    let dir = tempfile::tempdir().unwrap();
    let retimed: Vec<(u64, u64, u64, &[u64])> = rows
        .iter()
        .enumerate()
        .map(|(i, (len, _, ids))| (i as u64 * 25, *len, 2, ids.as_slice()))
        .collect();
    let trace = support::mooncake(dir.path(), &retimed);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = retrace::mock::MockConfig {
        fixed_timing: Some((1.0, 1.0)),
        ..Default::default()
    };
    let kv_block = u64::from(cfg.block_size);
    let mock = retrace::mock::start(listener, cfg).await.unwrap();
    let url = format!("http://{}", mock.addr);
    let args = [
        trace.to_str().unwrap(),
        "--target",
        &url,
        "--max-concurrency",
        "1",
    ];
    let o = replay::replay(support::replay_config(&args).unwrap())
        .await
        .unwrap();
    assert_eq!(
        (o.summary.completed, o.summary.failed),
        (30, 0),
        "{:?}",
        o.summary.errors
    );
    let text = mock.metrics_text();
    let want = theoretical_hits(&rows, 512, kv_block);
    assert!(want > 10_000, "the slice shares prefixes: {want}");
    assert_eq!(prom_counter(&text, "vllm:prefix_cache_hits"), want);
    assert_eq!(
        prom_counter(&text, "vllm:prefix_cache_queries"),
        rows.iter().map(|r| r.0).sum::<u64>()
    );
    mock.shutdown().await;
}

#[test]
fn no_target_replays_against_the_embedded_mock() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(
        dir.path(),
        &[
            (0, 600, 5, &[0, 1]),
            (10, 700, 5, &[0, 2]),
            (20, 300, 5, &[3]),
        ],
    );
    let out = dir.path().join("r.json");
    let o = std::process::Command::new(bin)
        .args(["replay", trace.to_str().unwrap(), "--result-json"])
        .arg(&out)
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["completed"], 3);
    assert_eq!(v["total_output_tokens"], 15);
    assert_eq!(v["target"], "embedded-mock");
    assert_eq!(v["model_id"], "mock-llama");
    assert_eq!(
        v["server_reported"], 3,
        "the embedded mock sends per-request metrics"
    );
}

/// A byte-level word tokenizer (`Ġaa`..`Ġzh` plus specials), written as a tokenizer.json.
pub(super) fn word_tokenizer(dir: &Path) -> PathBuf {
    let pairs = (b'a'..=b'z')
        .flat_map(|a| (b'a'..=b'h').map(move |b| format!("{}{}", a as char, b as char)));
    tokenizer_of_words(dir, pairs)
}

/// A word-level HF tokenizer.json in `dir` of `<s>`, `</s>`, `<unk>` and each of `words` after a
/// space, numbered in that order.
pub(super) fn tokenizer_of_words(dir: &Path, words: impl Iterator<Item = String>) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<s>".into(), 0.into());
    vocab.insert("</s>".into(), 1.into());
    vocab.insert("<unk>".into(), 2.into());
    for (id, w) in (3u32..).zip(words) {
        vocab.insert(format!("Ġ{w}"), id.into());
    }
    let special = |id: u32, s: &str| {
        serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<s>"), special(1, "</s>")],
        "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, json.to_string()).unwrap();
    p
}

/// Chat end to end: text prompts that re-encode exactly, the role chunk counts as the first token
/// (vLLM's rule), the usage chunk ends E2EL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_text_mode_end_to_end() {
    let srv = support::start(ServerConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(10),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let tok = word_tokenizer(dir.path());
    let trace = support::mooncake(dir.path(), &[(0, 600, 6, &[0, 1]), (20, 700, 6, &[0, 2])]);
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--endpoint",
        "chat",
        "--prompt-mode",
        "text",
        "--tokenizer",
        tok.to_str().unwrap(),
    ])
    .unwrap();
    let o = replay::replay(cfg).await.unwrap();
    let s = &o.summary;
    assert_eq!((s.completed, s.failed), (2, 0), "{:?}", s.errors);
    assert_eq!(o.result["inexact_prompts"], 0);
    assert_eq!(o.result["endpoint"], "chat");
    assert_eq!(o.result["endpoint_type"], "openai-chat");
    // The role chunk arrives at 30 ms, content every 10 ms after: 6 ITL gaps per request.
    assert_eq!(s.itl.count, 12);
    assert!(s.ttft.mean >= 30.0, "{}", s.ttft.mean);
    let prompts = srv.prompts.lock().unwrap().clone();
    let text = |i: usize| prompts[i][0]["content"].as_str().unwrap().to_string();
    assert_eq!(
        text(0).split(' ').count(),
        601,
        "600 words after a leading space"
    );
    let (a, b) = (text(0), text(1));
    let shared: Vec<&str> = a.split(' ').take(513).collect();
    assert_eq!(
        shared,
        b.split(' ').take(513).collect::<Vec<_>>(),
        "block 0 shared"
    );
}

/// `--dry-run` plans without sending: overlaying 3 copies triples the requests; shards partition.
#[test]
fn dry_run_shows_shaped_schedule() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let trace = super::support::repo("traces/mooncake_conversation_1k.jsonl");
    let run = |extra: &[&str]| -> String {
        let out = std::process::Command::new(bin)
            .arg("replay")
            .arg(&trace)
            .args([
                "--dry-run",
                "--limit",
                "1000000",
                "--target",
                "http://127.0.0.1:9",
            ])
            .args(extra)
            .output_within(support::CHILD_LIMIT)
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let planned = |s: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with("Planned requests:"))
            .and_then(|l| l.split_whitespace().last())
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(planned(&run(&[])), 1000);
    assert_eq!(planned(&run(&["--overlay", "3"])), 3000);
    let shards: u64 = (0..3)
        .map(|i| planned(&run(&["--shard", &format!("{i}/3")])))
        .sum();
    assert_eq!(shards, 1000);
    let bad = std::process::Command::new(bin)
        .arg("replay")
        .arg(&trace)
        .args(["--dry-run", "--ramp-up", "linear"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--ramp-up-start-rps"));
}

/// A TLS terminator for tests: accepts TLS on 127.0.0.1:0 with the fixture certificate and relays
/// each connection's plaintext to `backend`.
async fn tls_front(backend: std::net::SocketAddr) -> u16 {
    let acc = retrace::record::server::tls_acceptor(
        &support::repo("fixtures/tls/cert.pem"),
        &support::repo("fixtures/tls/key.pem"),
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acc = acc.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acc.accept(s).await else {
                    return;
                };
                let Ok(mut up) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_target_with_private_ca() {
    let srv = support::start(ServerConfig::default()).await;
    let port = tls_front(srv.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 100, 6, &[0]), (10, 200, 7, &[0, 1])]);
    let url = format!("https://localhost:{port}");
    let ca = support::repo("fixtures/tls/ca.pem");
    // Trusting the private CA: every request completes over TLS; the model comes from /v1/models.
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &url,
        "--target-ca",
        ca.to_str().unwrap(),
        "--detailed",
    ])
    .unwrap();
    let o = replay::replay(cfg).await.unwrap();
    assert_eq!(
        (o.summary.completed, o.summary.failed),
        (2, 0),
        "{}",
        o.result["errors"]
    );
    assert_eq!(o.summary.total_output_tokens, 13);
    // Trusting something else (the leaf, which is no CA): the handshake fails before the run.
    let leaf = support::repo("fixtures/tls/cert.pem");
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &url,
        "--target-ca",
        leaf.to_str().unwrap(),
        "--model",
        "m",
    ])
    .unwrap();
    let e = replay::replay(cfg)
        .await
        .err()
        .expect("an untrusted certificate");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("could not be reached (TLS handshake with"),
        "{msg}"
    );
    assert!(
        msg.contains("not signed by a CA this replay trusts") && msg.contains("--target-ca FILE"),
        "the error says what to do: {msg}"
    );
    // A CA path that does not exist is a clear error naming the flag.
    let cfg = support::replay_config(&[
        trace.to_str().unwrap(),
        "--target",
        &url,
        "--target-ca",
        "/nonexistent/ca.pem",
        "--model",
        "m",
    ])
    .unwrap();
    let e = replay::replay(cfg).await.err().expect("missing CA file");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("--target-ca") && msg.contains("/nonexistent/ca.pem"),
        "{msg}"
    );
}

/// The idle and total timeouts after the response head (and before it) are failures of their own
/// kind, with bodies read on the reader threads and on the tasks: the mock stalls on request
/// (`x-mock-fault`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_responses_fail_by_idle_or_total_timeout_on_both_body_paths() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = retrace::mock::MockConfig {
        fixed_timing: Some((1.0, 1.0)),
        ..Default::default()
    };
    let mock = retrace::mock::start(listener, cfg).await.unwrap();
    let url = format!("http://{}", mock.addr);
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 6, &[0]), (5, 10, 6, &[1])]);
    let cases: [(&str, &str, &str, &str); 4] = [
        ("stall-mid=2:1500", "0.3", "30", "timeout_idle"),
        ("stall-mid=2:1500", "30", "0.4", "timeout_total"),
        ("slow-headers=1500", "0.3", "30", "timeout_idle"),
        ("slow-headers=1500", "30", "0.4", "timeout_total"),
    ];
    // Bodies are read on the reader threads by default, on the tasks with 0.
    for readers in ["auto", "0"] {
        for (fault, idle, total, kind) in cases {
            let header = format!("x-mock-fault={fault}");
            let cfg = support::replay_config(&[
                trace.to_str().unwrap(),
                "--target",
                &url,
                "--header",
                &header,
                "--idle-timeout-s",
                idle,
                "--timeout-s",
                total,
                "--reader-threads",
                readers,
            ])
            .unwrap();
            let client = format!("readers {readers}");
            let o = replay::replay(cfg).await.unwrap();
            let s = &o.summary;
            assert_eq!(
                (s.completed, s.failed),
                (0, 2),
                "{client} {fault}: {:?}",
                s.errors
            );
            assert_eq!(
                s.errors.get(kind),
                Some(&2),
                "{client} {fault}: {:?}",
                s.errors
            );
        }
    }
    mock.shutdown().await;
}

/// A trace whose bodies are many times the builder's window replays with at most the window's
/// bytes built ahead, every body built once and freed by the end (counted by the builder's
/// byte accounting of live bodies, not by timing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_far_larger_than_the_body_window_replays_with_bodies_freed() {
    use std::sync::atomic::Ordering::Relaxed;
    let srv = quick_server().await;
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = (0..4).collect();
    let rows: Vec<(u64, u64, u64, &[u64])> =
        (0..300u64).map(|k| (k * 2, 2000, 6, &ids[..])).collect();
    let trace = support::mooncake(dir.path(), &rows);
    let mut cfg = support::replay_cfg(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--model",
        "m",
        "--speed",
        "4",
    ]);
    let max_bytes = 64 << 10;
    cfg.tuning.window = replay::plan::body::Limits {
        lead: Duration::from_millis(20),
        max_bytes,
    };
    let mut p = replay::prepare(&cfg).await.unwrap();
    let ran = replay::execute(&cfg, &mut p, Default::default())
        .await
        .unwrap();
    let st = p.builder_stats();
    let (built, bodies) = (st.built.load(Relaxed), st.peak_live_bodies.load(Relaxed));
    let (held, peak) = (
        st.peak_held_bytes.load(Relaxed),
        st.peak_live_bytes.load(Relaxed),
    );
    let out = replay::assemble(&cfg, &p, ran).unwrap();
    assert_eq!(built, 300, "{}", out.report);
    assert_eq!(st.live_bytes.load(Relaxed), 0, "every body freed");
    let per = peak / bodies.max(1);
    assert!(per > 8_000, "bodies of 2000 token ids: {per} bytes");
    assert!(held <= max_bytes + per, "window held {held} bytes");
    assert!(
        300 * per > 20 * max_bytes,
        "the trace is far larger than the window"
    );
    assert_eq!(out.summary.completed, 300, "{}", out.report);
    let bb = &out.result["body_builder"];
    assert_eq!(bb["peak_bytes"], peak as u64);
}

/// `--result-json` is opened before the run: a path that cannot be written fails before any
/// request is sent (a run that later uses up its open files still has its file), and a result
/// file already there stays whole until the new one replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_json_is_opened_before_the_run() {
    use std::sync::atomic::Ordering::Relaxed;
    let srv = support::start(ServerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &[(0, 10, 6, &[0])]);
    let cfg = |out: &Path| {
        let (t, u, o) = (trace.to_str().unwrap(), srv.url(), out.to_str().unwrap());
        support::replay_config(&[t, "--target", &u, "--result-json", o]).unwrap()
    };
    let bad = dir.path().join("no-such-dir").join("result.json");
    let Err(err) = replay::replay(cfg(&bad)).await else {
        panic!("an unwritable --result-json ran");
    };
    assert!(format!("{err:#}").contains("--result-json"), "{err:#}");
    assert_eq!(srv.requests.load(Relaxed), 0, "nothing was sent");

    let good = dir.path().join("result.json");
    std::fs::write(&good, "an older result").unwrap();
    replay::replay(cfg(&good)).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&good).unwrap()).unwrap();
    assert_eq!(v["completed"], 1, "{v}");
    let temporaries = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".partial")
        })
        .count();
    assert_eq!(temporaries, 0, "no temporary file left beside the result");
}

/// A test server that answers in 1 ms per token.
async fn quick_server() -> support::TestServer {
    support::start(ServerConfig {
        ttft: Duration::from_millis(1),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await
}

/// A replay left with nothing to send fails with its own exit code (6) and says why: every
/// request left out, or a trace without requests (every row malformed, skipped). Nothing is
/// sent, no target is needed.
#[test]
fn a_replay_with_nothing_to_send_exits_6_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    // Rows with no prompt and no body: nothing to rebuild.
    let trace = support::mooncake(dir.path(), &[(0, 0, 3, &[]), (1, 0, 3, &[])]);
    let result = dir.path().join("run.json");
    let r = result.to_str().unwrap();
    let (code, _, err) = replay_child(&trace, "http://127.0.0.1:9", &["--result-json", r]);
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("nothing to send: left out 2 of 2 requests: 2 empty_prompt"),
        "{err}"
    );
    assert!(err.contains("(exit 6)"), "{err}");
    assert!(
        !result.exists(),
        "no result file for a run that did not run"
    );
    // Every row malformed, skipped with --skip-bad: no request at all.
    let bad = dir.path().join("bad.jsonl");
    let row =
        "{\"timestamp\": 0, \"input_length\": \"ten\", \"output_length\": 1, \"hash_ids\": []}\n";
    std::fs::write(&bad, row.repeat(3)).unwrap();
    let (code, _, err) = replay_child(&bad, "http://127.0.0.1:9", &["--skip-bad"]);
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("the trace holds no requests (3 malformed rows skipped)"),
        "{err}"
    );
}

/// More than 10% of the workload left out (requests that cannot be rebuilt, malformed rows
/// skipped) makes the run invalid: exit 3, `valid: false` with the reason in the result file,
/// `RUN INVALID` on the console; at most 10% is a valid run. `--skip-bad` skips and counts
/// malformed rows (without it the first one stops the replay, naming its line).
#[test]
fn leaving_out_more_than_a_tenth_of_the_workload_is_an_invalid_run() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let cfg = retrace::mock::MockConfig {
        fixed_timing: Some((1.0, 1.0)),
        ..Default::default()
    };
    let mock = rt.block_on(retrace::mock::start(listener, cfg)).unwrap();
    let url = format!("http://{}", mock.addr);
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("run.json");
    let r = result.to_str().unwrap();
    let read = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap()
    };
    // 2 of 10 rows have no prompt: 20% left out.
    let rows: Vec<(u64, u64, u64, &[u64])> = (0..10)
        .map(|k| (k, if k % 5 == 1 { 0 } else { 10 }, 2, &[][..]))
        .collect();
    let trace = support::mooncake(dir.path(), &rows);
    let (code, out, err) = replay_child(&trace, &url, &["--result-json", r]);
    assert_eq!(code, Some(3), "{err}");
    let why = "2 of 10 workload requests left out (20.0%, more than 10%";
    assert!(out.contains(&format!("RUN INVALID: {why}")), "{out}");
    let v = read();
    assert_eq!(v["valid"], false);
    assert!(v["invalid_reason"].as_str().unwrap().contains(why), "{v}");
    assert_eq!(v["left_out_workload"]["left_out"], 2);
    assert_eq!(v["left_out_workload"]["workload"], 10);
    assert_eq!(v["left_out"]["empty_prompt"], 2);
    assert_eq!(v["completed"], 8);
    // 1 of 10: valid.
    let rows: Vec<(u64, u64, u64, &[u64])> = (0..10)
        .map(|k| (k, if k == 3 { 0 } else { 10 }, 2, &[][..]))
        .collect();
    let trace = support::mooncake(dir.path(), &rows);
    let (code, out, err) = replay_child(&trace, &url, &["--result-json", r]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("RUN INVALID"), "{out}");
    assert_eq!(read()["valid"], true);
    // A malformed row: an error naming its line, unless --skip-bad.
    let rows: Vec<(u64, u64, u64, &[u64])> = (0..12).map(|k| (k, 10, 2, &[][..])).collect();
    let trace = support::mooncake(dir.path(), &rows);
    let mut text = std::fs::read_to_string(&trace).unwrap();
    text.insert_str(0, "{\"timestamp\": 0, \"input_length\": \"ten\"}\n");
    std::fs::write(&trace, text).unwrap();
    let (code, _, err) = replay_child(&trace, &url, &["--result-json", r]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(":1: "), "{err}");
    assert!(
        err.contains("--skip-bad skips and counts malformed rows"),
        "{err}"
    );
    let (code, _, err) = replay_child(&trace, &url, &["--skip-bad", "--result-json", r]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("13 rows read (1 malformed, skipped) with --skip-bad; the first at line 1"),
        "{err}"
    );
    let v = read();
    assert_eq!(v["completed"], 12);
    assert_eq!(v["left_out_workload"]["malformed_rows"], 1);
    assert_eq!(v["left_out_workload"]["workload"], 13);
    rt.block_on(mock.shutdown());
}
