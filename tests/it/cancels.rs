//! Client cancels and upstream failures in a recording. Recorded through the proxy in front of
//! the mock: streams read whole, one the client cancels after 2 events, one it cancels before
//! the first token, one the upstream answers 500. The replay against a fresh mock cuts both
//! cancels where they were recorded (the mock counts two aborts), `compare` calls it faithful
//! and names the cancels and the failure apart, and `inspect`'s and `compare`'s recorded E2E
//! are drawn from the same exchanges.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use retrace::mock::MockConfig;
use retrace::record::{Bodies, RecordConfig};
use retrace::report::run::Metric;
use retrace::wire::sse::SseParser;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

use super::real_traffic::{compare_files, read_trace};
use super::support::{replay_cfg, spawn_recorder, stop_recorder};

/// The mock: first token after 300 ms, then one every 20 ms.
async fn slow_mock() -> retrace::mock::MockHandle {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = MockConfig {
        fixed_timing: Some((300.0, 20.0)),
        ..Default::default()
    };
    retrace::mock::start(l, cfg).await.unwrap()
}

/// How a test client treats its stream.
#[derive(Clone, Copy)]
enum Client {
    /// Reads it to the end.
    Whole,
    /// Goes away after this many SSE events.
    CancelAfterEvents(usize),
    /// Goes away after this long, before any event.
    CancelAfter(Duration),
}

/// One streamed completion on a connection of its own; the status.
async fn request(addr: SocketAddr, max_tokens: u32, how: Client, fault: Option<&str>) -> u16 {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let body = json!({"model": "mock-llama", "prompt": [21, 22, 23, 24, 25, 26], "max_tokens": max_tokens,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let mut req = http::Request::post("/v1/completions")
        .header("host", "m")
        .header("content-type", "application/json");
    if let Some(f) = fault {
        req = req.header("x-mock-fault", f);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let send = tx.send_request(req);
    let resp = match how {
        Client::CancelAfter(d) => match tokio::time::timeout(d, send).await {
            Ok(r) => r.unwrap(),
            Err(_) => {
                conn.abort();
                return 0;
            }
        },
        _ => send.await.unwrap(),
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut events = 0;
    let mut parser = SseParser::default();
    let cut = async {
        while let Some(Ok(f)) = body.frame().await {
            if let Some(d) = f.data_ref() {
                parser.feed(d, |_| events += 1);
            }
            if matches!(how, Client::CancelAfterEvents(n) if events >= n) {
                return;
            }
        }
    };
    match how {
        Client::CancelAfter(d) => {
            let _ = tokio::time::timeout(d, cut).await;
        }
        _ => cut.await,
    }
    drop(body);
    drop(tx);
    conn.abort();
    status
}

async fn aborts(addr: SocketAddr) -> f64 {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get("/metrics")
        .header("host", "m")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let body = tx.send_request(req).await.unwrap().into_body();
    let text = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let name =
        r#"vllm:request_success_total{engine="0",model_name="mock-llama",finished_reason="abort"}"#;
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_cancels_are_replayed_as_cancels_and_compare_names_them_apart() {
    let dir = tempfile::tempdir().unwrap();
    let up = slow_mock().await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.bodies = Bodies::Request;
    cfg.block_size = 16;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    let plan: [(u64, u32, Client, Option<&str>); 6] = [
        (0, 5, Client::Whole, None),
        (40, 40, Client::CancelAfterEvents(2), None),
        (80, 5, Client::Whole, None),
        (
            120,
            40,
            Client::CancelAfter(Duration::from_millis(120)),
            None,
        ),
        (160, 5, Client::Whole, Some("status=500")),
        (200, 5, Client::Whole, None),
    ];
    let t0 = tokio::time::Instant::now();
    let tasks: Vec<_> = plan
        .iter()
        .map(|&(at, max_tokens, how, fault)| {
            let addr = rec.addr;
            let fault = fault.map(str::to_string);
            tokio::spawn(async move {
                tokio::time::sleep_until(t0 + Duration::from_millis(at)).await;
                request(addr, max_tokens, how, fault.as_deref()).await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(statuses[4], 500, "{statuses:?}");
    // Let the proxy see the last cancel before it stops.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;

    let (path, trace) = read_trace(&dir.path().join("rec"));
    assert_eq!(trace.requests.len(), 6);
    let resp = |i: usize| trace.requests[i].response.as_deref().unwrap();
    let recorded_events = resp(1).events.len();
    assert!(
        resp(1).cancelled && (2..40).contains(&recorded_events),
        "{:?}",
        resp(1)
    );
    assert!(
        resp(3).cancelled && resp(3).events.is_empty(),
        "{:?}",
        resp(3)
    );
    assert_eq!(resp(4).status, 500);
    for i in [0, 2, 5] {
        assert!(resp(i).completed(), "{i}: {:?}", resp(i));
    }

    // The replay against a fresh mock: both cancels are cut where they were, so the server sees
    // two aborts; nothing else is cut.
    let target = slow_mock().await;
    let result = dir.path().join("replay.json");
    let url = format!("http://{}", target.addr);
    let args = [
        path.to_str().unwrap(),
        "--target",
        &url,
        "--detailed",
        "--result-json",
        result.to_str().unwrap(),
    ];
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        retrace::replay::replay(replay_cfg(&args)),
    )
    .await
    .expect("replay ends")
    .unwrap();
    let r = &out.result;
    // The mock notices a closed connection at once; give it a moment to count.
    let t1 = std::time::Instant::now();
    while aborts(target.addr).await < 2.0 && t1.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(aborts(target.addr).await, 2.0, "the server saw both cuts");
    target.shutdown().await;
    assert_eq!(
        r["cancelled_as_recorded"]["count"], 2,
        "{}",
        r["cancelled_as_recorded"]
    );
    let errors: Vec<String> = serde_json::from_value(r["errors"].clone()).unwrap();
    for (i, e) in errors.iter().enumerate() {
        let cut = e.starts_with("cancelled_as_recorded");
        assert_eq!(cut, i == 1 || i == 3, "{i}: {errors:?}");
    }
    let o = &r["recorded_outcomes"];
    assert_eq!(
        o["newly_failed"], 0,
        "a cut is not a failure of the target: {o}"
    );
    let itls: Vec<Vec<f64>> = serde_json::from_value(r["itls"].clone()).unwrap();
    assert!(
        itls[1].len() < recorded_events,
        "cut after the recorded {recorded_events} events: {:?}",
        itls[1]
    );
    assert_eq!(r["completed"], Value::from(4), "{}", r["completed"]);

    // compare RECORDING REPLAY: faithful, the cancels and the failure named apart.
    let (cmp, f) = compare_files(&path, &result);
    assert_eq!(f.recorded_apart["cancelled"].first, [1, 3], "{f:?}");
    assert_eq!(f.recorded_apart["http_500"].first, [4], "{f:?}");
    assert!(f.replay_failed.is_empty(), "{f:?}");
    assert_eq!(f.completed_both, 3);
    assert_eq!((f.isl_exact, f.osl_exact), (1.0, 1.0), "{f:?}");
    super::support::assert_faithful_or_sent_late(&f);
    let text =
        retrace::report::render::render(&cmp, &[], retrace::report::render::RenderFormat::Text);
    assert!(!text.contains("lengths differ"), "{text}");
    assert!(
        text.contains("Cancels and failures apart") && text.contains("cancelled 2 (requests 1, 3)"),
        "{text}"
    );

    // One rule for recorded latency: inspect's E2E is compare's recorded E2EL.
    let inspected = retrace::trace::stats::compute(&trace, &Default::default())
        .recorded
        .unwrap();
    assert_eq!((inspected.completed, inspected.e2e_ms.count), (3, 3));
    let recorded = retrace::report::load::load(&path).unwrap();
    let e2el = recorded.samples_ms(Metric::E2el).unwrap();
    // The same samples (compare reads them in seconds, inspect in ms: equal to rounding).
    let (c, i) = (retrace::trace::stats::Dist::of(e2el), &inspected.e2e_ms);
    assert_eq!(c.count, i.count);
    for (a, b) in [
        (c.mean, i.mean),
        (c.p50, i.p50),
        (c.p99, i.p99),
        (c.max, i.max),
    ] {
        assert!((a - b).abs() < 1e-6, "compare {c:?}, inspect {i:?}");
    }
    assert!(inspected.e2e_ms.max < 2_000.0, "{:?}", inspected.e2e_ms);
}
