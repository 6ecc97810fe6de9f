//! `retrace record` at scale (scaled down for CI): many HTTP/2 (h2c) client streams multiplexed on
//! one connection, each proxied on its own pooled HTTP/1.1 upstream connection, all byte-identical
//! and all in the trace; and upstream keep-alive reuse.
//!
//! The 10,000-stream version is the benchmark `tools/bench/bench_record_h2.sh` (numbers in
//! `tools/bench/bench_record.md`); this test asserts correctness only, never timing.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retrace::record::{self, RecordConfig};
use retrace::trace::native;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

const EVENTS: usize = 8;

use crate::support::ChanBody;

/// The SSE chunks the upstream sends for request `k` (distinct per request).
fn chunks_for(k: u64) -> Vec<Bytes> {
    let mut v: Vec<Bytes> = (0..EVENTS)
        .map(|j| {
            Bytes::from(format!(
                "data: {{\"id\":\"cmpl-{k}\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\" t{j}-{k}\",\"finish_reason\":null}}]}}\n\n"
            ))
        })
        .collect();
    v.push(Bytes::from(format!(
        "data: {{\"id\":\"cmpl-{k}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":4,\"completion_tokens\":{EVENTS}}}}}\n\ndata: [DONE]\n\n"
    )));
    v
}

/// An upstream that streams `chunks_for(id)` (id from the request's first prompt token), one
/// chunk every 10 ms, and counts the connections it accepted.
async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let (addr, conns, _) = upstream_with(|_| {}).await;
    (addr, conns)
}

/// [`upstream`] with its HTTP/1 connection settings changed by `tweak`; also counts the
/// connections it has closed.
async fn upstream_with(
    tweak: impl Fn(&mut hyper::server::conn::http1::Builder) + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
    let tweak = Arc::new(tweak);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let (c2, closed2) = (conns.clone(), closed.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            c2.fetch_add(1, Ordering::Relaxed);
            let (tweak, closed) = (tweak.clone(), closed2.clone());
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let k = v["prompt"][0].as_u64().unwrap();
                    let (tx, rx) = mpsc::channel::<Bytes>(4);
                    tokio::spawn(async move {
                        for c in chunks_for(k) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            if tx.send(c).await.is_err() {
                                return;
                            }
                        }
                    });
                    let mut resp = hyper::Response::new(ChanBody(rx));
                    resp.headers_mut()
                        .insert("content-type", "text/event-stream".parse().unwrap());
                    Ok::<_, Infallible>(resp)
                });
                let mut b = hyper::server::conn::http1::Builder::new();
                tweak(&mut b);
                let _ = b.serve_connection(TokioIo::new(tcp), svc).await;
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, conns, closed)
}

/// Raises the soft open-file limit towards the hard limit (the test holds ~2 sockets per stream).
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on RLIMIT_NOFILE with a valid, initialised struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

struct Proxy {
    addr: SocketAddr,
    admin: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<record::RecordStats>>,
    _dir: tempfile::TempDir,
}

async fn proxy(upstream: SocketAddr, io_threads: usize) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new(&format!("http://{upstream}"), dir.path().join("out")).unwrap();
    cfg.flush_every = Duration::from_millis(100);
    cfg.io_threads = io_threads;
    // Request bodies in the trace, so the test can tell which stream each record is.
    cfg.bodies = record::Bodies::Request;
    let super::support::Recorder {
        addr,
        admin,
        stop,
        task,
    } = super::support::spawn_recorder(cfg).await;
    Proxy {
        addr,
        admin,
        stop,
        task,
        _dir: dir,
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .trim()
        .parse()
        .unwrap()
}

async fn admin_metrics(admin: SocketAddr) -> String {
    let c = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let r = c
        .get(format!("http://{admin}/metrics").parse().unwrap())
        .await
        .unwrap();
    String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn body_for(k: u64) -> Bytes {
    Bytes::from(format!(
        "{{\"model\":\"m\",\"prompt\":[{k},1,2,3],\"max_tokens\":{EVENTS},\"stream\":true}}"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_client_500_streams_are_byte_identical_and_all_recorded() {
    const STREAMS: u64 = 500;
    raise_fd_limit();
    let (up, up_conns) = upstream().await;
    let p = proxy(up, 2).await;
    // h2c with prior knowledge: every stream multiplexed on one client connection.
    let c = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let url = format!("http://{}/v1/completions", p.addr);
    let mut tasks = Vec::new();
    for k in 0..STREAMS {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let req = Request::post(url)
                .header("content-type", "application/json")
                .body(Full::new(body_for(k)))
                .unwrap();
            let resp = c.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((k, status, body))
        }));
    }
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
    .await
    .expect("every stream completes within 60 s");
    let mut ok = 0;
    for r in all {
        let (k, status, body) = r.expect("stream completes");
        assert_eq!(status, 200, "stream {k}");
        assert_eq!(body, chunks_for(k).concat(), "stream {k} is byte-identical");
        ok += 1;
    }
    assert_eq!(ok, STREAMS);
    // The proxy saw one client connection but fanned out to pooled upstream connections.
    let upstream_conns = up_conns.load(Ordering::Relaxed);
    assert!((1..=STREAMS).contains(&upstream_conns), "{upstream_conns}");

    let m = admin_metrics(p.admin).await;
    assert_eq!(metric(&m, "retrace_record_requests_total"), STREAMS as f64);
    // Every forwarded chunk got a forwarding-delay observation or shared one with a later chunk
    // written in the same syscall.
    let fwd = metric(&m, "retrace_record_forward_delay_seconds_count");
    assert!(fwd >= 1.0, "{fwd}");

    let _ = p.stop.send(());
    let stats = tokio::time::timeout(Duration::from_secs(30), p.task)
        .await
        .expect("proxy stops")
        .unwrap()
        .unwrap();
    assert_eq!(stats.records_dropped, 0);
    assert_eq!(stats.records_written, STREAMS);
    let mut recs = Vec::new();
    for f in &stats.files {
        let (t, rep) = native::read_file(f).unwrap();
        assert!(
            rep.corrupt.is_empty() && rep.truncated_at.is_none(),
            "{rep:?}"
        );
        assert_eq!(rep.dropped_by_writer, 0);
        recs.extend(t.requests);
    }
    assert_eq!(recs.len() as u64, STREAMS, "no stream is lost in the trace");
    let mut ids = Vec::new();
    for r in &recs {
        let resp = r.response.as_ref().expect("response recorded");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.error, None);
        assert!(!resp.cancelled);
        // EVENTS token events, then the usage chunk (an event without tokens).
        assert_eq!(resp.events.len(), EVENTS + 1, "{:?}", resp.events);
        let tokens: u64 = resp.events.iter().map(|e| u64::from(e.tokens)).sum();
        assert_eq!(tokens, EVENTS as u64);
        assert_eq!(r.output_tokens, EVENTS as u64);
        assert_eq!(r.input_tokens, 4);
        let body: serde_json::Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        ids.push(body["prompt"][0].as_u64().unwrap());
    }
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..STREAMS).collect::<Vec<_>>(),
        "each stream recorded once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_requests_reuse_one_pooled_upstream_connection() {
    let (up, up_conns) = upstream().await;
    let p = proxy(up, 1).await;
    let c = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for k in 0..20 {
        let req = Request::post(format!("http://{}/v1/completions", p.addr))
            .body(Full::new(body_for(k)))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, chunks_for(k).concat());
    }
    assert_eq!(up_conns.load(Ordering::Relaxed), 1, "keep-alive upstream");
    let _ = p.stop.send(());
    let stats = p.task.await.unwrap().unwrap();
    assert_eq!(stats.records_written, 20);
}

/// Upstreams that close connections (after every response, or when idle) never cost a client
/// request: the pool drops closed connections and dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_closing_connections_costs_no_request() {
    for (name, close_each) in [("no keep-alive", true), ("idle close", false)] {
        let (up, up_conns, up_closed) = upstream_with(move |b| {
            if close_each {
                b.keep_alive(false);
            } else {
                // Closes a kept-alive connection when no next request head arrives in 50 ms.
                b.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_millis(50));
            }
        })
        .await;
        let p = proxy(up, 1).await;
        let c = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        for k in 0..5 {
            // Each request after the first goes out once the upstream has closed the
            // connection the proxy's pool still holds.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while up_closed.load(Ordering::SeqCst) < k {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{name}: upstream closed"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let req = Request::post(format!("http://{}/v1/completions", p.addr))
                .body(Full::new(body_for(k)))
                .unwrap();
            let resp = c.request(req).await.unwrap();
            assert_eq!(resp.status(), 200, "{name}: request {k}");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, chunks_for(k).concat(), "{name}: request {k}");
        }
        assert_eq!(
            up_conns.load(Ordering::Relaxed),
            5,
            "{name}: one connection each"
        );
        let m = admin_metrics(p.admin).await;
        for kind in ["upstream_connect", "upstream_closed", "upstream_reset"] {
            let v = metric(
                &m,
                &format!("retrace_record_upstream_errors_total{{kind=\"{kind}\"}}"),
            );
            assert_eq!(v, 0.0, "{name}: {kind}");
        }
        let _ = p.stop.send(());
        let stats = p.task.await.unwrap().unwrap();
        assert_eq!(stats.records_written, 5, "{name}");
    }
}
