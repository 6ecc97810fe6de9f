//! `retrace record` at its bounds: request heads too large for either engine, responses longer
//! than the capture cap, file names (several recorders on one `--out`, a prefix too long for
//! the file system) and the drain deadline.
//!
//! Servers run in-process on 127.0.0.1:0; child processes run under a memory and a time limit.

use super::support::{self, ChanBody, OutputWithin as _};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retrace::record::{self, RecordConfig, RecordStats};
use retrace::trace::{native, InputCount, Request as TraceRequest};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

// ---------- a scripted upstream ----------

/// What the upstream answers a request with: the response head; the body is fed through the
/// sender it is handed (ends when the sender is dropped).
type Script = Arc<dyn Fn(&http::request::Parts, mpsc::Sender<Bytes>) -> Response<()> + Send + Sync>;

/// An HTTP/1.1 upstream on 127.0.0.1:0 that answers every request with `script`; the paths of
/// the requests it received (in order) are in the returned list.
async fn upstream(
    script: impl Fn(&http::request::Parts, mpsc::Sender<Bytes>) -> Response<()> + Send + Sync + 'static,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let script: Script = Arc::new(script);
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            let (script, seen) = (script.clone(), s2.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (script, seen) = (script.clone(), seen.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        seen.lock().unwrap().push(parts.uri.path().to_string());
                        let _ = body.collect().await;
                        let (tx, rx) = mpsc::channel(64);
                        let (head, ()) = script(&parts, tx).into_parts();
                        Ok::<_, Infallible>(Response::from_parts(head, ChanBody(rx)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn sse_head() -> Response<()> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(())
        .unwrap()
}

/// A recorder in front of `up` writing into `dir`, with `tweak` applied to the defaults.
async fn recorder(
    up: SocketAddr,
    dir: &Path,
    tweak: impl FnOnce(&mut RecordConfig),
) -> support::Recorder {
    let mut cfg = RecordConfig::new(&format!("http://{up}"), dir).unwrap();
    cfg.flush_every = Duration::from_millis(50);
    cfg.block_size = 16;
    tweak(&mut cfg);
    support::spawn_recorder(cfg).await
}

/// Stops a recorder and reads every record it wrote (each file read clean).
async fn stop(r: support::Recorder) -> (RecordStats, Vec<TraceRequest>) {
    let stats = support::stop_recorder(r.stop, r.task).await;
    let mut recs = Vec::new();
    for f in &stats.files {
        let (t, rep) = native::read_file(f).unwrap();
        assert!(rep.is_clean(), "{}", rep.summary());
        recs.extend(t.requests);
    }
    recs.sort_by_key(|r| r.arrival_us);
    (stats, recs)
}

// ---------- request heads ----------

/// `n` header fields of about 1000 bytes each (hex digits, as a token or a cookie carries).
fn big_headers(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|k| {
            let v: String = (0..63)
                .map(|j| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&[k as u8, j as u8])))
                .collect::<String>()[..1000]
                .to_string();
            (format!("x-pad-{k}"), v)
        })
        .collect()
}

fn with_headers(uri: &str, headers: &[(String, String)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method("POST").uri(uri);
    for (k, v) in headers {
        b = b.header(k, v);
    }
    b.body(Full::new(Bytes::from_static(b"{}"))).unwrap()
}

/// Over HTTP/2, a request head over the limit HTTP/1.1 has (64 KiB) is a 431 on its own stream,
/// with the JSON error an HTTP/1.1 client gets for it; a head under it is forwarded, and another
/// stream of the same connection, in flight all along, completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_request_heads_over_the_limit_are_431_on_their_stream_and_the_connection_lives() {
    // `/slow` sends one event, then its last when the test says so.
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let (up, seen) = upstream(move |p, tx| {
        if p.uri.path() == "/slow" {
            let mut release = release_rx.clone();
            tokio::spawn(async move {
                let _ = tx.send(Bytes::from_static(b"data: {\"a\":1}\n\n")).await;
                let _ = release.wait_for(|r| *r).await;
                let _ = tx.send(Bytes::from_static(b"data: {\"a\":2}\n\n")).await;
            });
            return sse_head();
        }
        let _ = tx.try_send(Bytes::from_static(b"ok"));
        Response::new(())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(up, dir.path(), |_| {}).await;
    let tcp = tokio::net::TcpStream::connect(rec.addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let limit = Duration::from_secs(20);
    let base = format!("http://{}", rec.addr);

    let mut s = send.clone();
    let slow = tokio::time::timeout(
        limit,
        s.send_request(with_headers(&format!("{base}/slow"), &[])),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(slow.status(), StatusCode::OK);
    let mut slow = slow.into_body();
    let first = tokio::time::timeout(limit, slow.frame()).await.unwrap();
    assert!(
        first.unwrap().unwrap().is_data(),
        "the first event is through"
    );

    // About 60 KB of fields: forwarded. About 100 KB: refused on its stream.
    let mut s = send.clone();
    let ok = tokio::time::timeout(
        limit,
        s.send_request(with_headers(&format!("{base}/small"), &big_headers(60))),
    )
    .await
    .expect("answer in time")
    .expect("an answer, not a connection error");
    assert_eq!(ok.status(), StatusCode::OK);
    let mut s = send.clone();
    let big = tokio::time::timeout(
        limit,
        s.send_request(with_headers(&format!("{base}/big"), &big_headers(100))),
    )
    .await
    .expect("answer in time")
    .expect("an answer, not a connection error");
    assert_eq!(big.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let body = tokio::time::timeout(limit, big.into_body().collect())
        .await
        .unwrap()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
    assert_eq!(v["error"]["type"], "request_header_too_large", "{v}");

    // The stream in flight completes on the same connection, which takes new streams.
    release_tx.send_replace(true);
    let rest = tokio::time::timeout(limit, slow.collect())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&rest.to_bytes()[..], b"data: {\"a\":2}\n\n");
    let mut s = send.clone();
    let again = tokio::time::timeout(
        limit,
        s.send_request(with_headers(&format!("{base}/again"), &[])),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(*seen.lock().unwrap(), ["/slow", "/small", "/again"]);

    // An HTTP/1.1 client gets the same answer to the same head.
    let tcp = tokio::net::TcpStream::connect(rec.addr).await.unwrap();
    let (mut s1, c1) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(c1);
    let h1 = tokio::time::timeout(
        limit,
        s1.send_request(with_headers(&format!("{base}/big"), &big_headers(100))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(h1.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let body = tokio::time::timeout(limit, h1.into_body().collect())
        .await
        .unwrap()
        .unwrap();
    let v1: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
    assert_eq!(v1["error"]["type"], v["error"]["type"]);

    drop(send);
    conn.abort();
    let (_, recs) = stop(rec).await;
    let paths: Vec<&str> = recs.iter().map(|r| r.endpoint.as_str()).collect();
    assert_eq!(paths, ["/slow", "/small", "/again"]);
}

// ---------- file names ----------

/// A trace writer into `dir` as a recorder starting at `t0_unix_us` has (so two writers given
/// the same one start in the same second), closing a frame every 20 ms.
fn writer(
    dir: &Path,
    t0_unix_us: i64,
) -> (
    record::writer::Recorder,
    record::writer::WriterHandle,
    Arc<record::counters::ProxyCounters>,
    Instant,
) {
    let t0 = Instant::now();
    let header = retrace::trace::TraceHeader {
        t0_unix_us: Some(t0_unix_us),
        ..retrace::trace::TraceHeader::imported(16, true, "test")
    };
    let files = record::writer::FileOptions {
        dir: dir.to_path_buf(),
        name: "rec".into(),
        rotate_bytes: 1 << 30,
        rotate_every: Duration::from_secs(3600),
        flush_every: Duration::from_millis(20),
        space: None,
    };
    let extractor = record::extract::Extractor {
        hasher: retrace::trace::hash::BlockHasher::xxh3(),
        block_size: 16,
        tokenizer: record::prompt::TextTokenizer::Approx,
        bodies: record::Bodies::None,
    };
    let stats = Arc::new(record::counters::ProxyCounters::default());
    let (rec, handle) = record::writer::spawn(
        64,
        1 << 20,
        files,
        header,
        extractor,
        None,
        t0,
        stats.clone(),
    )
    .unwrap();
    (rec, handle, stats, t0)
}

/// Waits until the writer has written or lost `want` records (at most 30 s: a hang).
fn wait_handled(stats: &record::counters::ProxyCounters, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let handled = || stats.records_written.load(Relaxed) + stats.records_lost_io.load(Relaxed);
    while handled() < want {
        assert!(Instant::now() < deadline, "{} of {want} records", handled());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Recorders started in the same second on one `--out` take different file names at once: a
/// name whose `.partial` another holds, or that another has closed, is passed over, so no
/// record is lost to a taken name and no closed file is replaced.
#[test]
fn recorders_started_in_one_second_on_one_out_take_their_own_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let t0_unix_us = 1_764_000_000_000_000;
    let (a, a_close, a_stats, t0) = writer(dir.path(), t0_unix_us);
    let (b, b_close, b_stats, _) = writer(dir.path(), t0_unix_us);
    // A opens the first name and holds it open; B, started in the same second, records too.
    a.submit(a.exchange(t0, "GET", "/a"));
    wait_handled(&a_stats, 1);
    b.submit(b.exchange(t0, "GET", "/b"));
    wait_handled(&b_stats, 1);
    // A closes its file; a third recorder of the same second starts after that.
    let mut files = a_close.close(None);
    let (c, c_close, c_stats, _) = writer(dir.path(), t0_unix_us);
    c.submit(c.exchange(t0, "GET", "/c"));
    wait_handled(&c_stats, 1);
    files.extend(b_close.close(None));
    files.extend(c_close.close(None));

    for s in [&a_stats, &b_stats, &c_stats] {
        assert_eq!(s.records_lost_io.load(Relaxed), 0);
        assert_eq!(s.write_errors.load(Relaxed), 0);
    }
    files.sort();
    files.dedup();
    assert_eq!(files.len(), 3, "{files:?}");
    let mut paths = Vec::new();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        assert!(files.contains(&f), "{} is not a closed trace", f.display());
        let (t, _) = native::read_file(&f).unwrap();
        paths.extend(t.requests.iter().map(|r| r.endpoint.as_str().to_string()));
    }
    paths.sort();
    assert_eq!(paths, ["/a", "/b", "/c"]);
}

/// A `--name` too long for the file system under `--out` stops `record` at start-up with an
/// error naming `--name`, before anything is served.
#[test]
fn a_name_too_long_for_the_file_system_fails_at_start_up_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let name = "n".repeat(300);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args([
        "record",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
    ])
    .arg("--out")
    .arg(&out)
    .args(["--admin", "none", "--name", &name]);
    support::under_memory_limit(&mut cmd, support::MEMORY_LIMIT);
    let o = cmd.output_within(Duration::from_secs(60)).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("--name"), "{err}");
    assert!(err.contains("cannot be created"), "{err}");
    assert!(!err.contains("listening on"), "nothing is served: {err}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "no file left");
}

/// The start-up probe of `--name` (a file of the longest name, created and removed) that a
/// recorder starting at the same moment holds does not stop another recorder on the same
/// `--out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_starts_beside_the_name_probe_of_another() {
    let (up, _) = upstream(|_, _| Response::new(())).await;
    let dir = tempfile::tempdir().unwrap();
    let probe = dir
        .path()
        .join("retrace-00000000T000000Z-9999999999.trace.zst.partial");
    std::fs::write(&probe, b"").unwrap();
    let rec = recorder(up, dir.path(), |_| {}).await;
    let (stats, _) = stop(rec).await;
    assert!(stats.drained);
    assert!(probe.exists(), "another recorder's probe is left alone");
}

// ---------- the drain ----------

/// At the drain deadline the exchanges still in flight are cut and the trace is closed: a cut
/// record whose input length is an estimate keeps it, and the proxy asks the upstream's
/// `/tokenize` (which here never answers) nothing more after the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_cut_by_the_drain_deadline_keep_their_estimate_without_asking_the_upstream() {
    let (up, seen) = upstream(|p, tx| {
        if p.uri.path() == "/tokenize" {
            // Never answered: the body waits for a chunk that never comes.
            tokio::spawn(async move { tx.closed().await });
            return Response::new(());
        }
        tokio::spawn(async move {
            let _ = tx
                .send(Bytes::from_static(
                    b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
                ))
                .await;
            tx.closed().await;
        });
        sse_head()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(up, dir.path(), |c| {
        c.drain_timeout = Duration::from_millis(300)
    })
    .await;
    let body = r#"{"model":"m","prompt":"a text prompt of some words","stream":true}"#;
    let req = Request::post(format!("http://{}/v1/completions", rec.addr))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .unwrap()
        .unwrap();
    let mut resp = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(20), resp.frame())
        .await
        .unwrap();
    assert!(first.unwrap().unwrap().is_data(), "the stream is in flight");

    let (stats, recs) = stop(rec).await;
    assert!(!stats.drained);
    assert_eq!(stats.files.len(), 1, "the trace is closed");
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    let resp = r.response.as_ref().unwrap();
    assert_eq!(resp.error.as_deref(), Some("drain_deadline"));
    assert_eq!(r.input_count, InputCount::Estimated);
    assert_eq!(
        *seen.lock().unwrap(),
        ["/v1/completions"],
        "nothing asked after the deadline"
    );
}

// ---------- responses past the capture cap ----------

/// A completion stream of `n` one-token events sent ten to a chunk, then a usage event and
/// `[DONE]`.
fn long_stream(n: usize, tx: mpsc::Sender<Bytes>) {
    tokio::spawn(async move {
        let ev = "data: {\"choices\":[{\"index\":0,\"text\":\" tok\"}]}\n\n";
        for _ in 0..n / 10 {
            if tx.send(Bytes::from(ev.repeat(10))).await.is_err() {
                return;
            }
        }
        let usage = format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{n}}}}}\n\ndata: [DONE]\n\n"
        );
        let _ = tx.send(Bytes::from(usage)).await;
    });
}

/// A response longer than `--capture-max` keeps counting past it: every event is in the record,
/// timed where it ended, the usage at the end gives the output length, and the record says it
/// ran past the cap (which `inspect` counts); over HTTP/1.1 and HTTP/2 alike. Past the timing
/// bound (a quarter of the cap in events) the count stops, and the record says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_longer_than_capture_max_keeps_its_event_count_timing_and_usage() {
    const N: usize = 3000;
    let (up, _) = upstream(|_, tx| {
        long_stream(N, tx);
        sse_head()
    })
    .await;
    for (cap, http2) in [(64 << 10, false), (64 << 10, true), (4 << 10, false)] {
        let dir = tempfile::tempdir().unwrap();
        let rec = recorder(up, dir.path(), |c| c.capture_max = cap).await;
        let body = r#"{"model":"m","prompt":[1,2,3],"stream":true,"max_tokens":3000}"#;
        let req = Request::post(format!("http://{}/v1/completions", rec.addr))
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .http2_only(http2)
            .build_http();
        let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
            .await
            .unwrap()
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        assert!(got.len() > cap, "the stream is longer than the cap");
        let (_, recs) = stop(rec).await;
        let (r, case) = (&recs[0], format!("cap {cap}, http2 {http2}"));
        let resp = r.response.as_ref().unwrap();
        assert_eq!(resp.error, None, "{case}");
        assert_eq!(r.output_tokens, N as u64, "{case}: the usage past the cap");
        let past = resp.past_cap.expect("marked as past the cap");
        let offsets: Vec<u64> = resp.events.iter().map(|e| e.offset_us).collect();
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{case}");
        assert!(resp.end_us.unwrap() >= *offsets.last().unwrap(), "{case}");
        let last = resp.events.last().unwrap();
        assert_eq!(last.tokens, 0, "{case}: the usage event is read");
        if cap == 64 << 10 {
            assert!(!past.stopped, "{case}");
            assert_eq!(resp.events.len(), N + 1, "{case}: every event");
            let captured = resp.events.len() as u64 - past.events;
            assert!(captured > 0 && captured < N as u64 / 2, "{case}: {past:?}");
            let tokens: u64 = resp.events.iter().map(|e| u64::from(e.tokens)).sum();
            assert_eq!(tokens, N as u64, "{case}");
        } else {
            assert!(past.stopped, "{case}");
            // At most a quarter of the cap in events past it, and the last one.
            assert_eq!(past.events, (cap / 4) as u64 + 1, "{case}");
        }
        let trace = retrace::trace::Trace {
            header: retrace::trace::TraceHeader::imported(16, true, "test"),
            requests: recs.clone(),
        };
        let st = retrace::trace::stats::compute(&trace, &Default::default());
        assert_eq!(st.recorded.unwrap().past_capture_cap, 1, "{case}");
    }
}

/// `inspect` says how many recorded responses ran past the capture cap, in text and JSON.
#[test]
fn inspect_counts_responses_past_the_capture_cap() {
    let dir = tempfile::tempdir().unwrap();
    let resp = |past_cap| retrace::trace::Response {
        status: 200,
        events: vec![retrace::trace::Event {
            offset_us: 10,
            tokens: 1,
        }],
        end_us: Some(20),
        past_cap,
        ..Default::default()
    };
    let requests = [None, Some(retrace::trace::PastCap::default())]
        .into_iter()
        .map(|p| TraceRequest {
            output_tokens: 1,
            response: Some(Box::new(resp(p))),
            ..Default::default()
        })
        .collect();
    let trace = retrace::trace::Trace {
        header: retrace::trace::TraceHeader::imported(16, true, "test"),
        requests,
    };
    let path = dir.path().join("t.trace.zst");
    std::fs::write(&path, native::write_bytes(&trace, Default::default())).unwrap();
    for json in [false, true] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
        cmd.arg("inspect").arg(&path);
        if json {
            cmd.arg("--json");
        }
        support::under_memory_limit(&mut cmd, support::MEMORY_LIMIT);
        let o = cmd.output_within(Duration::from_secs(60)).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8(o.stdout).unwrap();
        match json {
            false => assert!(out.contains("past the capture cap: 1 "), "{out}"),
            true => {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                assert_eq!(v["stats"]["recorded"]["past_capture_cap"], 1, "{out}");
            }
        }
    }
}
