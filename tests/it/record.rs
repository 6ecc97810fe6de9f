//! `retrace record`: pass-through exactness, recorded contents, privacy, and every fault.
//!
//! Each test runs scripted upstreams and the proxy in-process on 127.0.0.1:0.

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retrace::record::{self, RecordConfig, RecordStats};
use retrace::trace::hash::BlockHasher;
use retrace::trace::{native, HashScheme, Request as TraceRequest};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use super::support::repo;

// ---------- a scripted upstream ----------

use super::support::ChanBody;

/// What the upstream does with a request.
#[derive(Clone)]
enum Reply {
    /// Stream these chunks, sleeping `delay` before each.
    Chunks {
        ctype: &'static str,
        chunks: Vec<Bytes>,
        delay: Duration,
    },
    /// Answer `{"len": body length, "xxh3": hash}` (JSON) with a known length.
    Digest,
    /// Send the request body back.
    Echo,
    /// A non-streamed completion whose usage echoes the prompt length and `max_tokens`.
    Completion,
    /// Send one chunk every `every` until the client goes away; then signal `gone`.
    Endless {
        every: Duration,
        gone: mpsc::UnboundedSender<()>,
    },
    /// Send these chunks, then stay silent for `stall` while keeping the stream open.
    Stall { chunks: Vec<Bytes>, stall: Duration },
    /// Wait this long before sending the response head.
    SlowHead(Duration),
    /// Send 64 KiB chunks as fast as the proxy takes them (up to 256 MiB), counting bytes sent.
    Flood(Arc<std::sync::atomic::AtomicU64>),
}

type Script = Arc<dyn Fn(&http::request::Parts) -> Reply + Send + Sync>;

struct Upstream {
    addr: SocketAddr,
    /// Headers of every request received.
    seen: Arc<Mutex<Vec<HeaderMap>>>,
}

async fn reply(
    script: Script,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    req: Request<Incoming>,
) -> Result<Response<ChanBody>, Infallible> {
    let (parts, body) = req.into_parts();
    seen.lock().unwrap().push(parts.headers.clone());
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let mut resp = Response::new(ChanBody(rx));
    match script(&parts) {
        Reply::Chunks {
            ctype,
            chunks,
            delay,
        } => {
            resp.headers_mut()
                .insert("content-type", ctype.parse().unwrap());
            tokio::spawn(async move {
                for c in chunks {
                    tokio::time::sleep(delay).await;
                    if tx.send(c).await.is_err() {
                        return;
                    }
                }
            });
        }
        Reply::Digest => {
            let d = format!(
                r#"{{"len":{},"xxh3":{}}}"#,
                body.len(),
                xxhash_rust::xxh3::xxh3_64(&body)
            );
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            resp.headers_mut()
                .insert("content-length", d.len().to_string().parse().unwrap());
            let _ = tx.try_send(Bytes::from(d));
        }
        Reply::Completion => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let d = serde_json::json!({
                "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": v["prompt"].as_array().map_or(0, |a| a.len()),
                    "completion_tokens": v["max_tokens"].as_u64().unwrap_or(0),
                }
            })
            .to_string();
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            let _ = tx.try_send(Bytes::from(d));
        }
        Reply::Echo => {
            resp.headers_mut()
                .insert("content-length", body.len().to_string().parse().unwrap());
            let _ = tx.try_send(body);
        }
        Reply::Endless { every, gone } => {
            resp.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            tokio::spawn(async move {
                for k in 0..500 {
                    let c = Bytes::from(format!(
                        "data: {{\"choices\":[{{\"index\":0,\"text\":\"t{k}\"}}]}}\n\n"
                    ));
                    if tx.send(c).await.is_err() {
                        let _ = gone.send(());
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            });
        }
        Reply::SlowHead(d) => {
            tokio::time::sleep(d).await;
            let _ = tx.try_send(Bytes::from_static(b"late"));
        }
        Reply::Flood(sent) => {
            tokio::spawn(async move {
                let chunk = Bytes::from(vec![b'x'; 64 << 10]);
                for _ in 0..4096 {
                    if tx.send(chunk.clone()).await.is_err() {
                        return;
                    }
                    sent.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        Reply::Stall { chunks, stall } => {
            resp.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            tokio::spawn(async move {
                for c in chunks {
                    let _ = tx.send(c).await;
                }
                tokio::time::sleep(stall).await;
                drop(tx);
            });
        }
    }
    Ok(resp)
}

async fn upstream(
    script: impl Fn(&http::request::Parts) -> Reply + Send + Sync + 'static,
) -> Upstream {
    upstream_with(None, script).await
}

async fn upstream_with(
    tls: Option<tokio_rustls::TlsAcceptor>,
    script: impl Fn(&http::request::Parts) -> Reply + Send + Sync + 'static,
) -> Upstream {
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
            let script = script.clone();
            let seen = s2.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| reply(script.clone(), seen.clone(), req));
                let b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = match tls {
                    None => b.serve_connection(TokioIo::new(tcp), svc).await,
                    Some(acc) => {
                        let Ok(s) = acc.accept(tcp).await else { return };
                        b.serve_connection(TokioIo::new(s), svc).await
                    }
                };
            });
        }
    });
    Upstream { addr, seen }
}

// ---------- the proxy under test ----------

struct Rec {
    addr: SocketAddr,
    admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<RecordStats>>,
    dir: tempfile::TempDir,
}

async fn start(upstream: &str, tweak: impl FnOnce(&mut RecordConfig, &std::path::Path)) -> Rec {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new(upstream, dir.path().join("out")).unwrap();
    cfg.flush_every = Duration::from_millis(100);
    cfg.block_size = 16;
    cfg.drain_timeout = Duration::from_secs(5);
    tweak(&mut cfg, dir.path());
    let super::support::Recorder {
        addr,
        admin,
        stop: tx,
        task,
    } = super::support::spawn_recorder(cfg).await;
    Rec {
        addr,
        admin,
        stop: Some(tx),
        task,
        dir,
    }
}

impl Rec {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the proxy and reads every record it wrote.
    async fn stop(
        mut self,
    ) -> (
        RecordStats,
        Vec<TraceRequest>,
        Vec<native::ReadReport>,
        tempfile::TempDir,
    ) {
        let stats = super::support::stop_recorder(self.stop.take().unwrap(), self.task).await;
        let mut recs = Vec::new();
        let mut reports = Vec::new();
        for f in &stats.files {
            let (t, rep) = native::read_file(f).unwrap();
            recs.extend(t.requests);
            reports.push(rep);
        }
        recs.sort_by_key(|r| r.arrival_us);
        (stats, recs, reports, self.dir)
    }

    async fn metrics(&self) -> String {
        let (st, _, body) = fetch(
            &format!("http://{}/metrics", self.admin),
            "GET",
            Bytes::new(),
            &[],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        String::from_utf8(body.unwrap()).unwrap()
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

/// Polls the admin `/metrics` until `name` is at least `want`: the writer thread runs at nice 10
/// and is the first to starve on a busy machine, so its counters are waited for, not slept on.
/// Panics after 30 s (a hang, not a slow machine).
async fn wait_metric(rec: &Rec, name: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = metric(&rec.metrics().await, name);
        if v >= want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} stayed at {v}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Recorded arrivals are causal: the proxy saw request `k` after its client sent it and before
/// the client had the whole response. `got_ms[k]` is row `k`'s exported timestamp (ms from the
/// first recorded arrival, rounded), `sent[k]` and `done[k]` the client's own instants (seconds
/// from any common origin). This holds however loaded the machine is.
fn assert_causal_arrivals(got_ms: &[f64], sent: &[f64], done: &[f64]) {
    let first = (0..got_ms.len())
        .min_by(|&a, &b| got_ms[a].total_cmp(&got_ms[b]))
        .unwrap();
    assert_eq!(got_ms[first], 0.0);
    for k in 0..got_ms.len() {
        let lo = (sent[k] - done[first]) * 1000.0 - 1.0;
        let hi = (done[k] - sent[first]) * 1000.0 + 1.0;
        assert!(
            (lo..=hi).contains(&got_ms[k]),
            "row {k}: recorded arrival {} ms is outside [{lo:.1}, {hi:.1}] ms, between the client's send and its response",
            got_ms[k]
        );
    }
}

/// The `retrace record` child of a test, killed when the test ends (also on a failed assert).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------- a client ----------

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends a request; returns status, headers and the body (or the error that broke it).
async fn fetch(
    url: &str,
    method: &str,
    body: Bytes,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Result<Vec<u8>, String>) {
    fetch_with(&client(), url, method, body, headers).await
}

async fn fetch_with<C>(
    c: &Client<C, Full<Bytes>>,
    url: &str,
    method: &str,
    body: Bytes,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Result<Vec<u8>, String>)
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        c.request(b.body(Full::new(body)).unwrap()),
    )
    .await
    .expect("response head in time")
    .expect("response head");
    let (parts, body) = resp.into_parts();
    let got = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("body in time")
        .map(|c| c.to_bytes().to_vec())
        .map_err(|e| e.to_string());
    (parts.status, parts.headers, got)
}

/// Splits an SSE file into its events (each keeps its blank-line terminator).
fn sse_events(raw: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < raw.len() {
        if raw[i] == b'\n' && raw[i + 1] == b'\n' {
            out.push(Bytes::copy_from_slice(&raw[start..i + 2]));
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    if start < raw.len() {
        out.push(Bytes::copy_from_slice(&raw[start..]));
    }
    out
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(repo(&format!("fixtures/vllm/{name}"))).unwrap()
}

/// The streamed part of the per-request-metrics sample (with the `metrics` object).
fn metrics_stream() -> Vec<u8> {
    let txt = String::from_utf8(fixture("per_request_metrics_example.txt")).unwrap();
    let mut s = String::new();
    for l in txt.lines().filter(|l| l.starts_with("data: ")) {
        s.push_str(l);
        s.push_str("\n\n");
    }
    s.into_bytes()
}

const SSE: &str = "text/event-stream; charset=utf-8";

// ---------- tests ----------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_is_byte_exact_for_real_vllm_streams_and_bodies() {
    let files = [
        "chat_stream.sse",
        "completions_text_stream.sse",
        "completions_tokenids_stream.sse",
        "return_token_ids_stream.sse",
    ];
    let up = upstream(move |p| {
        let path = p.uri.path().to_string();
        if let Some(name) = path.strip_prefix("/sse/") {
            let raw = fixture(name);
            // Event by event, and once more cut at odd byte positions.
            let chunks = if p.uri.query() == Some("odd") {
                raw.chunks(37).map(Bytes::copy_from_slice).collect()
            } else {
                sse_events(&raw)
            };
            Reply::Chunks {
                ctype: SSE,
                chunks,
                delay: Duration::from_millis(3),
            }
        } else if path == "/v1/completions" {
            let txt = String::from_utf8(fixture("per_request_metrics_example.txt")).unwrap();
            Reply::Chunks {
                ctype: "application/json",
                chunks: vec![Bytes::from(txt.lines().nth(2).unwrap().to_string())],
                delay: Duration::ZERO,
            }
        } else {
            Reply::Echo
        }
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    let direct = format!("http://{}", up.addr);
    let mut paths: Vec<String> = files.iter().map(|f| format!("/sse/{f}")).collect();
    paths.extend(files.iter().map(|f| format!("/sse/{f}?odd")));
    paths.push("/v1/completions".into());
    paths.push("/anything/else?x=1".into());
    for p in &paths {
        let body = Bytes::from_static(br#"{"model":"tiny-llama","prompt":[1,2,3]}"#);
        let (s1, h1, b1) = fetch(&format!("{direct}{p}"), "POST", body.clone(), &[]).await;
        let (s2, h2, b2) = fetch(&rec.url(p), "POST", body, &[]).await;
        assert_eq!(s1, s2, "{p}");
        assert_eq!(h1.get("content-type"), h2.get("content-type"), "{p}");
        let (b1, b2) = (b1.unwrap(), b2.unwrap());
        assert!(!b1.is_empty());
        assert_eq!(b1, b2, "bytes through the proxy differ from direct for {p}");
    }
    // The same through HTTP/2 (h2c prior knowledge) from the client.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let want = fixture("chat_stream.sse");
    let (s, _, b) = fetch_with(
        &h2,
        &rec.url("/sse/chat_stream.sse"),
        "POST",
        Bytes::from_static(b"{}"),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b.unwrap(), want);

    let (stats, recs, reports, _d) = rec.stop().await;
    assert_eq!(stats.requests as usize, paths.len() + 1);
    assert_eq!(recs.len(), paths.len() + 1);
    assert!(reports.iter().all(|r| r.is_clean()));
    // The chat stream: a role-only first event counts for TTFT (vLLM's rule), 3 tokens in all.
    let chat: Vec<_> = recs
        .iter()
        .filter(|r| r.endpoint.as_str() == "/sse/chat_stream.sse")
        .collect();
    assert_eq!(
        chat.len(),
        3,
        "by event, at odd cuts (query not recorded), over HTTP/2"
    );
    for r in chat {
        let resp = r.response.as_ref().unwrap();
        assert_eq!(resp.events.len(), 5, "4 choice events + usage");
        assert_eq!(resp.ttft_us, Some(resp.events[0].offset_us));
        assert_eq!(r.output_tokens, 3);
        assert_eq!(resp.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_trace_holds_events_ttft_usage_metrics_and_exact_hashes() {
    let up = upstream(|_| Reply::Chunks {
        ctype: SSE,
        chunks: sse_events(&metrics_stream()),
        delay: Duration::from_millis(20),
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    let prompt: Vec<u32> = (0..100).map(|k| k * 7 % 4096).collect();
    let body = serde_json::json!({
        "model": "tiny-llama", "prompt": prompt, "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}, "temperature": 0.5, "ignore_eos": true
    })
    .to_string();
    let (s, _, b) = fetch(&rec.url("/v1/completions"), "POST", Bytes::from(body), &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b.unwrap(), metrics_stream());
    let (stats, recs, _, _d) = rec.stop().await;
    assert_eq!(stats.records_written, 1);
    let r = &recs[0];
    assert_eq!(r.model.as_deref(), Some("tiny-llama"));
    assert_eq!(r.input_tokens, 100);
    assert_eq!(r.hash_ids, BlockHasher::xxh3().chain(&prompt, 16, true));
    assert_eq!(r.hash_ids.len(), 7);
    assert_eq!(r.params.max_tokens, Some(3));
    assert_eq!(r.params.include_usage, Some(true));
    assert_eq!(r.params.ignore_eos, Some(true));
    assert_eq!(r.output_tokens, 3);
    assert!(r.body.is_none(), "no prompt text by default");
    let resp = r.response.as_ref().unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.error, None);
    assert!(!resp.cancelled);
    let toks: Vec<u32> = resp.events.iter().map(|e| e.tokens).collect();
    assert_eq!(toks, vec![1, 1, 1, 0], "3 text events then the usage chunk");
    let hd = resp.headers_us.unwrap();
    let tf = resp.ttft_us.unwrap();
    let en = resp.end_us.unwrap();
    assert!(hd <= tf && tf <= en, "{hd} {tf} {en}");
    assert!(tf >= 20_000, "first event came after a 20 ms delay: {tf}");
    // The upstream sleeps 20 ms before each chunk: event k cannot be seen before (k + 1) × 20
    // ms, however late a loaded machine reads it (a lower bound, never a gap).
    for (k, e) in resp.events.iter().enumerate() {
        let planned = 20_000 * (k as u64 + 1);
        assert!(
            e.offset_us >= planned,
            "event {k} at {} µs, sent at {planned} µs",
            e.offset_us
        );
    }
    assert_eq!(resp.usage.unwrap().prompt_tokens, 7);
    let m = resp.server_metrics.as_ref().unwrap();
    assert!((m.queue_time_ms.unwrap() - 0.026880000064011256).abs() < 1e-9);
    assert!(m.time_to_first_token_ms.is_some() && m.mean_itl_ms.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_reach_the_trace_and_hmac_keys_the_hashes() {
    let up = upstream(|_| Reply::Chunks {
        ctype: SSE,
        chunks: sse_events(&fixture("completions_tokenids_stream.sse")),
        delay: Duration::ZERO,
    })
    .await;
    let key = b"trace-sharing-secret";
    let rec = start(&format!("http://{}", up.addr), |c, dir| {
        let kf = dir.join("hash.key");
        std::fs::write(&kf, b"trace-sharing-secret\n").unwrap();
        let args = super::support::cli(&[
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://x:1",
            "--out",
            "o",
            "--hash-key-file",
            kf.to_str().unwrap(),
            "--bodies",
            "full",
        ]);
        let retrace::cli::Command::Record(a) = args.command else {
            unreachable!()
        };
        let parsed = a.config().unwrap();
        c.hash_key = parsed.hash_key;
        c.bodies = parsed.bodies;
    })
    .await;
    let prompt: Vec<u32> = (1..=40).collect();
    let body = serde_json::json!({"model":"m","prompt":prompt,"stream":true}).to_string();
    let secrets = [
        ("authorization", "Bearer sk-SECRET-AUTH-1234"),
        ("api-key", "SECRET-APIKEY-5678"),
        ("x-api-key", "SECRET-XAPIKEY-9012"),
        ("cookie", "session=SECRET-COOKIE-3456"),
    ];
    let (s, _, b) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from(body.clone()),
        &secrets,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.is_ok());
    // Some APIs take the key in the query string.
    let (s, _, _) = fetch(
        &rec.url("/v1/models?key=SECRET-QUERY-7777"),
        "GET",
        Bytes::new(),
        &secrets,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    // The upstream got the credentials (the proxy is transparent) ...
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen[0]["authorization"], "Bearer sk-SECRET-AUTH-1234");
    assert_eq!(seen[0]["cookie"], "session=SECRET-COOKIE-3456");
    let (_, recs, _, d) = rec.stop().await;
    // ... the trace did not, even with --bodies full.
    let mut raw = Vec::new();
    for e in std::fs::read_dir(d.path().join("out")).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        raw.extend(zstd::stream::decode_all(bytes.as_slice()).unwrap());
    }
    assert!(!raw.is_empty());
    let hay = String::from_utf8_lossy(&raw);
    assert!(
        !hay.contains("SECRET"),
        "a credential leaked into the trace"
    );
    assert!(hay.contains("hmac-sha256"));
    assert_eq!(recs[1].endpoint.as_str(), "/v1/models");
    let r = &recs[0];
    assert_eq!(
        r.body.as_deref(),
        Some(body.as_bytes()),
        "--bodies full keeps the prompt"
    );
    assert_eq!(
        r.response.as_ref().unwrap().body.as_deref(),
        Some(fixture("completions_tokenids_stream.sse").as_slice())
    );
    assert_eq!(r.hash_ids, BlockHasher::hmac(key).chain(&prompt, 16, true));
    assert_ne!(r.hash_ids, BlockHasher::xxh3().chain(&prompt, 16, true));
    let (t, _) = native::read_file(
        &std::fs::read_dir(d.path().join("out"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    assert_eq!(t.header.hash_scheme, HashScheme::HmacSha256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_requests_sharing_a_conversation_prefix_share_hash_ids() {
    let up = upstream(|_| Reply::Chunks {
        ctype: "application/json",
        chunks: vec![Bytes::from_static(
            br#"{"choices":[{"message":{"content":"ok"}}]}"#,
        )],
        delay: Duration::ZERO,
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |c, _| c.block_size = 8).await;
    let sys = "You are a careful assistant who answers in full sentences. ".repeat(4);
    let turn1 = serde_json::json!({"model":"m","messages":[
        {"role":"system","content":sys},{"role":"user","content":"What is a KV cache?"}]});
    let turn2 = serde_json::json!({"messages":[
        {"content":sys,"role":"system"},{"role":"user","content":"What is a KV cache?"},
        {"role":"assistant","content":"A cache of attention keys and values."},
        {"role":"user","content":"And prefix caching?"}],"model":"m"});
    for b in [&turn1, &turn2] {
        let (s, _, _) = fetch(
            &rec.url("/v1/chat/completions"),
            "POST",
            Bytes::from(b.to_string()),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, recs, _, _d) = rec.stop().await;
    let (a, b) = (&recs[0].hash_ids, &recs[1].hash_ids);
    assert!(a.len() >= 4 && b.len() > a.len(), "{} {}", a.len(), b.len());
    // Every full block of turn 1 is shared; only its partial tail may differ.
    let full = a.len() - 1;
    assert_eq!(&b[..full], &a[..full]);
    assert_eq!(recs[1].endpoint, retrace::trace::Endpoint::Chat);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_gives_502_json_and_is_recorded() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let rec = start(&format!("http://{dead}"), |_, _| {}).await;
    let (s, h, b) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from_static(br#"{"prompt":[1]}"#),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert_eq!(h["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&b.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "upstream_connect");
    assert_eq!(v["error"]["code"], 502);
    let m = rec.metrics().await;
    assert_eq!(
        metric(
            &m,
            "retrace_record_upstream_errors_total{kind=\"upstream_connect\"}"
        ),
        1.0
    );
    let (st, _, hz) = fetch(
        &format!("http://{}/healthz", rec.admin),
        "GET",
        Bytes::new(),
        &[],
    )
    .await;
    assert_eq!((st, hz.unwrap()), (StatusCode::OK, b"ok\n".to_vec()));
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(resp.status, 0, "no response head came from upstream");
    assert_eq!(resp.error.as_deref(), Some("upstream_connect"));
    assert_eq!(recs[0].endpoint, retrace::trace::Endpoint::Completions);
    // The prompt is recorded although no upstream ever read it.
    assert_eq!(recs[0].input_tokens, 1);
    assert_eq!(recs[0].hash_ids.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_the_same_502_for_an_http2_client_and_its_prompt_is_recorded() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let rec = start(&format!("http://{dead}"), |_, _| {}).await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let (s, h, b) = fetch_with(
        &h2,
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from_static(br#"{"prompt":[1]}"#),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert_eq!(h["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&b.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "upstream_connect");
    assert_eq!(v["error"]["code"], 502);
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(
        (resp.status, resp.error.as_deref()),
        (0, Some("upstream_connect"))
    );
    // The body hyper's client never sent is read for the record.
    assert_eq!(recs[0].input_tokens, 1);
}

/// Reads a request head (and whatever follows it in the same reads) from a raw socket; false
/// when the peer closed first.
async fn read_head(s: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 65536];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_stream_breaks_the_client_stream_and_is_recorded() {
    // A raw upstream that sends two events of a chunked SSE response, then resets the connection.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut s, _) = l.accept().await.unwrap();
        if !read_head(&mut s).await {
            return;
        }
        let ev = "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n";
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..2 {
            s.write_all(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes())
                .await
                .unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        #[allow(deprecated)] // zero linger: drop sends a RST at once, nothing blocks
        s.set_linger(Some(Duration::ZERO)).unwrap();
        drop(s);
    });
    let rec = start(&format!("http://{addr}"), |_, _| {}).await;
    let (s, _, b) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from_static(br#"{"prompt":"hi","stream":true}"#),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        b.is_err(),
        "the client must see a broken stream, not a clean end"
    );
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(resp.error.as_deref(), Some("upstream_reset"));
    assert_eq!(resp.events.len(), 2);
    assert!(!resp.cancelled);
}

/// A raw upstream that answers one request with two SSE events and `data: [DONE]`, and holds
/// back the chunked body's last chunk (uvicorn writes it apart, as real vLLM does); the
/// receiver says whether the proxy closed the connection (within 20 s).
async fn upstream_holding_its_last_chunk() -> (SocketAddr, oneshot::Receiver<bool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (closed_tx, closed_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        if !read_head(&mut s).await {
            return;
        }
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        let ev = "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n";
        for e in [ev, ev, "data: [DONE]\n\n"] {
            s.write_all(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes())
                .await
                .unwrap();
            s.flush().await.unwrap();
        }
        // Read to the end: the request body may come after the head (hyper's client writes
        // them apart), and must not end the wait.
        let until_closed = async {
            let mut buf = [0u8; 1024];
            while let Ok(1..) = s.read(&mut buf).await {}
        };
        let closed = tokio::time::timeout(Duration::from_secs(20), until_closed).await;
        let _ = closed_tx.send(closed.is_ok());
    });
    (addr, closed_rx)
}

/// After the client left at `[DONE]`: the proxy closed the upstream connection (when `closed`
/// is given), and the record is of a completed stream of two events.
async fn recorded_whole(rec: Rec, closed: Option<oneshot::Receiver<bool>>) {
    if let Some(closed) = closed {
        let closed = tokio::time::timeout(Duration::from_secs(20), closed)
            .await
            .expect("the upstream connection closed in time")
            .unwrap();
        assert!(closed, "the proxy closes the upstream connection");
    }
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert!(!resp.cancelled, "the client had the whole stream");
    assert_eq!((resp.status, resp.error.as_deref()), (200, None));
    assert_eq!(resp.events.len(), 2);
}

/// A client that stops reading at `data: [DONE]` and closes (the openai SDK does) before the
/// upstream's last chunk of the chunked body arrives got the whole stream: recorded as
/// completed, not as a cancel the replay would repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_after_done_is_not_recorded_as_cancelled() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, closed) = upstream_holding_its_last_chunk().await;
    let rec = start(&format!("http://{addr}"), |_, _| {}).await;
    let mut c = tokio::net::TcpStream::connect(rec.addr).await.unwrap();
    let body = r#"{"prompt":"hi","stream":true}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 65536];
    while !seen.windows(12).any(|w| w == b"data: [DONE]") {
        let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
            .await
            .expect("the stream in time")
            .unwrap();
        assert!(n > 0, "the stream ended before [DONE]");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(c);
    recorded_whole(rec, Some(closed)).await;
}

/// The same over HTTP/2: the client cancels its stream once it read `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_gone_after_done_is_not_recorded_as_cancelled() {
    let (addr, closed) = upstream_holding_its_last_chunk().await;
    let rec = start(&format!("http://{addr}"), |_, _| {}).await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::post(rec.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"prompt":"hi","stream":true}"#,
        )))
        .unwrap();
    let read = async {
        let mut body = h2.request(req).await.expect("a response head").into_body();
        let mut seen = Vec::new();
        while !seen.windows(12).any(|w| w == b"data: [DONE]") {
            let f = body.frame().await.expect("a frame before [DONE]").unwrap();
            if let Ok(d) = f.into_data() {
                seen.extend_from_slice(&d);
            }
        }
        // Dropping the body cancels the stream (RST_STREAM).
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the stream in time");
    drop(h2);
    recorded_whole(rec, Some(closed)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_gone_mid_stream_closes_upstream_and_is_recorded_as_cancelled() {
    let (gone_tx, mut gone_rx) = mpsc::unbounded_channel();
    let up = upstream(move |_| Reply::Endless {
        every: Duration::from_millis(20),
        gone: gone_tx.clone(),
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    {
        let c = client();
        let req = Request::post(rec.url("/v1/completions"))
            .body(Full::new(Bytes::from_static(
                br#"{"prompt":[1,2],"stream":true}"#,
            )))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        let mut body = resp.into_body();
        for _ in 0..3 {
            let f = body.frame().await.unwrap().unwrap();
            assert!(f.is_data());
        }
        // Dropping the body and the client closes the connection mid-stream.
    }
    tokio::time::timeout(Duration::from_secs(10), gone_rx.recv())
        .await
        .expect("the upstream saw its stream cancelled")
        .unwrap();
    wait_metric(&rec, "retrace_record_client_cancelled_total", 1.0).await;
    let m = rec.metrics().await;
    assert_eq!(metric(&m, "retrace_record_client_cancelled_total"), 1.0);
    assert_eq!(metric(&m, "retrace_record_in_flight"), 0.0);
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert!(resp.cancelled);
    assert!(resp.events.len() >= 3);
    assert_eq!(resp.error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_non_json_bodies_are_forwarded_untouched_and_recorded() {
    let up = upstream(|_| Reply::Echo).await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    let bodies: [&[u8]; 3] = [
        b"{\"prompt\": [1, 2",
        b"\xff\xfe binary \x00 junk",
        br#"{"prompt":{"nested":1}}"#,
    ];
    for b in bodies {
        let (s, _, got) = fetch(
            &rec.url("/v1/completions"),
            "POST",
            Bytes::copy_from_slice(b),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(got.unwrap(), b);
    }
    wait_metric(&rec, "retrace_record_parse_failures_total", 3.0).await;
    let m = rec.metrics().await;
    assert_eq!(metric(&m, "retrace_record_parse_failures_total"), 3.0);
    let (_, recs, _, _d) = rec.stop().await;
    assert_eq!(recs.len(), 3);
    for r in &recs {
        assert_eq!(
            r.response.as_ref().unwrap().error.as_deref(),
            Some("request_parse")
        );
        assert_eq!(r.response.as_ref().unwrap().status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_body_is_forwarded_whole_with_capture_capped() {
    let up = upstream(|_| Reply::Digest).await;
    let rec = start(&format!("http://{}", up.addr), |c, _| {
        c.capture_max = 1 << 20
    })
    .await;
    let mut big = br#"{"model":"m","prompt":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 20 << 20));
    big.extend(br#""}"#);
    let want = format!(
        r#"{{"len":{},"xxh3":{}}}"#,
        big.len(),
        xxhash_rust::xxh3::xxh3_64(&big)
    );
    let (s, _, got) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from(big.clone()),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(String::from_utf8(got.unwrap()).unwrap(), want);
    let m = rec.metrics().await;
    assert!(metric(&m, "retrace_record_request_bytes_total") >= big.len() as f64);
    let (_, recs, _, _d) = rec.stop().await;
    let r = &recs[0];
    assert_eq!(
        r.response.as_ref().unwrap().error.as_deref(),
        Some("request_parse")
    );
    assert!(r.body.is_none());
}

async fn healthz(rec: &Rec) -> (StatusCode, String) {
    let url = format!("http://{}/healthz", rec.admin);
    let (st, _, b) = fetch(&url, "GET", Bytes::new(), &[]).await;
    (st, String::from_utf8(b.unwrap()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_dir_lost_after_start_keeps_traffic_flowing_and_healthz_says_so() {
    let up = upstream(|_| Reply::Echo).await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    assert_eq!(healthz(&rec).await, (StatusCode::OK, "ok\n".into()));
    // The directory becomes a regular file: the first trace file cannot be opened.
    let out = rec.dir.path().join("out");
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::write(&out, b"a file, not a directory").unwrap();
    for k in 0..5 {
        let b = format!(r#"{{"prompt":[{k}]}}"#);
        let (s, _, got) = fetch(
            &rec.url("/v1/completions"),
            "POST",
            Bytes::from(b.clone()),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(got.unwrap(), b.as_bytes());
    }
    wait_metric(&rec, "retrace_record_records_lost_io_total", 5.0).await;
    let m = rec.metrics().await;
    assert!(metric(&m, "retrace_record_write_errors_total") >= 1.0);
    assert_eq!(metric(&m, "retrace_record_records_lost_io_total"), 5.0);
    let (st, body) = healthz(&rec).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (stats, recs, _, _d) = rec.stop().await;
    assert!(recs.is_empty() && stats.files.is_empty());
    assert_eq!(stats.requests, 5);
    assert!(stats.write_errors >= 1);
}

/// Starts a recorder writing to `out`; returns its start-up error.
async fn start_error(out: &std::path::Path) -> String {
    let cfg = RecordConfig::new("http://127.0.0.1:9", out).unwrap();
    let r = super::support::spawn_recorder(cfg).await;
    let res = tokio::time::timeout(Duration::from_secs(20), r.task).await;
    format!("{:#}", res.expect("refused at once").unwrap().unwrap_err())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_out_is_refused_at_start_up_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for out in [file.clone(), file.join("traces")] {
        let e = start_error(&out).await;
        assert!(e.contains(&format!("--out {}", out.display())), "{e}");
        assert!(e.contains("cannot be written"), "{e}");
    }
    // A read-only directory, refused by the binary at start-up. Root may write any directory, so
    // as root the recorder runs as `nobody` (a directory it cannot write, however run).
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ro = dir.path().join("read-only");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args([
        "record",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
    ])
    .args(["--admin", "none", "--out"])
    .arg(&ro);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(65534).gid(65534);
    }
    let o =
        super::support::OutputWithin::output_within(&mut cmd, super::support::CHILD_LIMIT).unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains(&format!("--out {}", ro.display())), "{e}");
    assert!(e.contains("cannot be written"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_file_is_readable_up_to_its_last_closed_frame() {
    let up = upstream(|_| Reply::Echo).await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    let send = |k: u32| {
        let url = rec.url("/v1/completions");
        async move {
            let b = format!(r#"{{"prompt":[{k},{k}]}}"#);
            let (s, _, _) = fetch(&url, "POST", Bytes::from(b), &[]).await;
            assert_eq!(s, StatusCode::OK);
        }
    };
    for k in 0..3 {
        send(k).await;
    }
    // The first three are in closed frames before the other two are sent.
    wait_metric(&rec, "retrace_record_records_written_total", 3.0).await;
    for k in 3..5 {
        send(k).await;
    }
    wait_metric(&rec, "retrace_record_records_written_total", 5.0).await;
    // While the proxy still runs, as after a kill -9: only the .partial file exists.
    let out = rec.dir.path().join("out");
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(names.len(), 1);
    let partial = &names[0];
    let fname = partial.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        fname.starts_with("retrace-") && fname.ends_with("-0001.trace.zst.partial"),
        "{fname}"
    );
    let data = std::fs::read(partial).unwrap();
    let (t, rep) = native::read_bytes("partial", &data).unwrap();
    assert!(rep.is_clean(), "{}", rep.summary());
    assert_eq!(t.requests.len(), 5);
    // Cut inside the last frame: the earlier frames survive (the first three at least; the
    // last two may share a frame or not), the last frame's records are lost.
    let (t2, rep2) = native::read_bytes("cut", &data[..data.len() - 5]).unwrap();
    assert!(rep2.truncated_at.is_some());
    assert!((3..5).contains(&t2.requests.len()), "{}", rep2.summary());
    let (stats, recs, _, d) = rec.stop().await;
    assert_eq!(recs.len(), 5);
    let left: Vec<_> = std::fs::read_dir(d.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1);
    assert!(
        !left[0].to_str().unwrap().ends_with(".partial"),
        "closed files are renamed"
    );
    assert_eq!(stats.files.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_cuts_a_stalled_stream_and_records_it() {
    let up = upstream(|_| Reply::Stall {
        chunks: vec![Bytes::from_static(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
        )],
        stall: Duration::from_secs(5),
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |c, _| {
        c.idle_timeout = Duration::from_millis(300)
    })
    .await;
    let (s, _, b) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from_static(br#"{"prompt":"x"}"#),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.is_err(), "a cut stream must not look complete");
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(resp.error.as_deref(), Some("timeout_idle"));
    assert_eq!(resp.events.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_by_size_closes_and_renames_files() {
    let up = upstream(|_| Reply::Echo).await;
    let rec = start(&format!("http://{}", up.addr), |c, _| c.rotate_bytes = 1).await;
    for k in 0..3 {
        let _ = fetch(
            &rec.url("/v1/completions"),
            "POST",
            Bytes::from(format!(r#"{{"prompt":[{k}]}}"#)),
            &[],
        )
        .await;
        // Each record in its own frame, so each closes a file.
        wait_metric(
            &rec,
            "retrace_record_records_written_total",
            f64::from(k + 1),
        )
        .await;
    }
    let (stats, recs, _, _d) = rec.stop().await;
    assert_eq!(recs.len(), 3);
    assert_eq!(stats.files.len(), 3, "{:?}", stats.files);
    for (k, f) in stats.files.iter().enumerate() {
        assert!(f
            .to_str()
            .unwrap()
            .ends_with(&format!("-{:04}.trace.zst", k + 1)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_in_flight_streams_finish() {
    let chunks: Vec<Bytes> = (0..8)
        .map(|k| Bytes::from(format!("data: {{\"choices\":[{{\"text\":\"{k}\"}}]}}\n\n")))
        .collect();
    let want: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
    let up = upstream(move |_| Reply::Chunks {
        ctype: SSE,
        chunks: chunks.clone(),
        delay: Duration::from_millis(40),
    })
    .await;
    let mut rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    let url = rec.url("/v1/completions");
    let inflight = tokio::spawn(async move {
        fetch(&url, "POST", Bytes::from_static(br#"{"prompt":[1]}"#), &[]).await
    });
    // Stop once the upstream holds the request: its 8 chunks then take 320 ms to come.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while up.seen.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "request reached upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = rec.stop.take().unwrap().send(());
    let (s, _, b) = inflight.await.unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b.unwrap(), want);
    let stats = rec.task.await.unwrap().unwrap();
    assert!(stats.drained);
    let (t, _) = native::read_file(&stats.files[0]).unwrap();
    let resp = t.requests[0].response.as_ref().unwrap();
    assert_eq!(resp.events.len(), 8);
    assert!(!resp.cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_termination_with_alpn_h2_and_http1() {
    let up = upstream(|_| Reply::Chunks {
        ctype: SSE,
        chunks: sse_events(&fixture("chat_stream.sse")),
        delay: Duration::from_millis(1),
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |c, _| {
        c.tls = Some((repo("fixtures/tls/cert.pem"), repo("fixtures/tls/key.pem")));
    })
    .await;
    for http2 in [false, true] {
        let c: Client<_, Full<Bytes>> =
            record::upstream::build(&record::upstream::UpstreamOptions {
                connect_timeout: Duration::from_secs(5),
                ca: Some(repo("fixtures/tls/ca.pem")),
                https: true,
                http2,
                pool_idle: Duration::from_secs(5),
            })
            .unwrap();
        let url = format!("https://localhost:{}/v1/chat/completions", rec.addr.port());
        let (s, _, b) = fetch_with(
            &c,
            &url,
            "POST",
            Bytes::from_static(br#"{"messages":[]}"#),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::OK, "http2={http2}");
        assert_eq!(b.unwrap(), fixture("chat_stream.sse"));
    }
    let (_, recs, _, _d) = rec.stop().await;
    assert_eq!(recs.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_round_trip_keeps_prefix_structure_lengths_and_timing() {
    // Token-id prompts built from a real Mooncake slice (same id -> same block), sent on the
    // trace's schedule at 4x speed, recorded, exported to Mooncake: the same structure comes back.
    let src = std::fs::read_to_string(repo("fixtures/vllm/bench_serve_input_trace.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = src
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let up = upstream(|_| Reply::Completion).await;
    let rec = start(&format!("http://{}", up.addr), |c, _| c.block_size = 512).await;
    let ts0 = rows[0]["timestamp"].as_u64().unwrap();
    let speed = 4;
    let t0 = tokio::time::Instant::now();
    // The client's own send and response instants per row (s from t0).
    let (mut sent, mut done) = (Vec::new(), Vec::new());
    for r in &rows {
        let ids: Vec<u64> = r["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let len = r["input_length"].as_u64().unwrap() as usize;
        let mut prompt: Vec<u32> = ids
            .iter()
            .flat_map(|&h| {
                (0..512u32)
                    .map(move |j| ((h as u32).wrapping_mul(7919).wrapping_add(j * 31)) % 50_000)
            })
            .collect();
        prompt.truncate(len);
        let body =
            serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": r["output_length"]})
                .to_string();
        let due = (r["timestamp"].as_u64().unwrap() - ts0) / speed;
        tokio::time::sleep_until(t0 + Duration::from_millis(due)).await;
        sent.push(t0.elapsed().as_secs_f64());
        let (s, _, _) = fetch(&rec.url("/v1/completions"), "POST", Bytes::from(body), &[]).await;
        done.push(t0.elapsed().as_secs_f64());
        assert_eq!(s, StatusCode::OK);
    }
    let (_, recs, _, _d) = rec.stop().await;
    assert_eq!(recs.len(), rows.len());
    let trace = retrace::trace::Trace {
        header: retrace::trace::TraceHeader::imported(512, true, "test"),
        requests: recs,
    };
    let mut out = Vec::new();
    retrace::trace::mooncake::write(&trace, &mut out).unwrap();
    let got: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let src_ids: Vec<Vec<u64>> = rows
        .iter()
        .map(|r| {
            r["hash_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect()
        })
        .collect();
    // A partial tail block is other tokens than the full block of the same id (this slice had its
    // lengths cut), so an exact recording tells them apart: key each id by its block length.
    let mut keys = std::collections::HashMap::new();
    let want_ids: Vec<Vec<u64>> = src_ids
        .iter()
        .zip(&rows)
        .map(|(ids, r)| {
            let len = r["input_length"].as_u64().unwrap();
            ids.iter()
                .enumerate()
                .map(|(k, &h)| {
                    let blen = (len - 512 * k as u64).min(512);
                    let next = keys.len() as u64;
                    *keys.entry((h, blen)).or_insert(next)
                })
                .collect()
        })
        .collect();
    for (k, (g, r)) in got.iter().zip(&rows).enumerate() {
        let gi: Vec<u64> = g["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(gi, want_ids[k], "row {k}: prefix structure");
        assert_eq!(g["input_length"], r["input_length"], "row {k}");
        assert_eq!(g["output_length"], r["output_length"], "row {k}");
    }
    // Sent one after another, so recorded in that order: row k is the k-th arrival.
    let got_ms: Vec<f64> = got
        .iter()
        .map(|g| g["timestamp"].as_u64().unwrap() as f64)
        .collect();
    assert_causal_arrivals(&got_ms, &sent, &done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_writer_queue_drops_records_not_traffic_and_the_trace_says_so() {
    let up = upstream(|_| Reply::Echo).await;
    // A byte budget of 1: any exchange with a captured body is dropped at the queue.
    let rec = start(&format!("http://{}", up.addr), |c, _| c.queue_bytes = 1).await;
    for k in 0..3 {
        let b = format!(r#"{{"prompt":[{k}]}}"#);
        let (s, _, got) = fetch(
            &rec.url("/v1/completions"),
            "POST",
            Bytes::from(b.clone()),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(got.unwrap(), b.as_bytes());
    }
    let (s, _, _) = fetch(&rec.url("/v1/models"), "GET", Bytes::new(), &[]).await;
    assert_eq!(s, StatusCode::OK);
    let m = rec.metrics().await;
    assert_eq!(metric(&m, "retrace_record_records_dropped_total"), 3.0);
    let (stats, recs, reports, _d) = rec.stop().await;
    assert_eq!(stats.records_dropped, 3);
    assert_eq!(recs.len(), 1, "the bodiless exchange fits the budget");
    assert_eq!(
        reports[0].dropped_by_writer, 3,
        "frame headers carry the dropped count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_upstream_with_private_ca_over_http1_and_http2() {
    let acc = record::server::tls_acceptor(
        &repo("fixtures/tls/cert.pem"),
        &repo("fixtures/tls/key.pem"),
    )
    .unwrap();
    let up = upstream_with(Some(acc), |_| Reply::Chunks {
        ctype: SSE,
        chunks: sse_events(&fixture("completions_text_stream.sse")),
        delay: Duration::from_millis(1),
    })
    .await;
    for http2 in [false, true] {
        let rec = start(&format!("https://localhost:{}", up.addr.port()), |c, _| {
            c.upstream_ca = Some(repo("fixtures/tls/ca.pem"));
            c.upstream_http2 = http2;
        })
        .await;
        let (s, _, b) = fetch(
            &rec.url("/v1/completions"),
            "POST",
            Bytes::from_static(br#"{"prompt":"x","stream":true}"#),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::OK, "http2={http2}");
        assert_eq!(b.unwrap(), fixture("completions_text_stream.sse"));
        let (_, recs, _, _d) = rec.stop().await;
        assert_eq!(recs[0].response.as_ref().unwrap().error, None);
    }
    // Trusting another CA (here: the leaf itself, which is no CA) the upstream is refused, recorded.
    let rec = start(&format!("https://localhost:{}", up.addr.port()), |c, _| {
        c.upstream_ca = Some(repo("fixtures/tls/cert.pem"));
    })
    .await;
    let (s, _, _) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from_static(b"{}"),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    let (_, recs, _, _d) = rec.stop().await;
    assert_eq!(
        recs[0].response.as_ref().unwrap().error.as_deref(),
        Some("upstream_connect")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_header_and_total_timeouts_are_visible_and_recorded() {
    let up = upstream(|p| {
        if p.uri.path() == "/slow-head" {
            Reply::SlowHead(Duration::from_secs(3))
        } else {
            Reply::Endless {
                every: Duration::from_millis(20),
                gone: mpsc::unbounded_channel().0,
            }
        }
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |c, _| {
        c.headers_timeout = Duration::from_millis(300);
        c.total_timeout = Some(Duration::from_millis(600));
    })
    .await;
    let (s, _, b) = fetch(&rec.url("/slow-head"), "POST", Bytes::new(), &[]).await;
    assert_eq!(s, StatusCode::GATEWAY_TIMEOUT);
    let v: serde_json::Value = serde_json::from_slice(&b.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "timeout_headers");
    // A stream that would run for 10 s is cut at the total timeout, visibly.
    let (s, _, b) = fetch(
        &rec.url("/v1/completions"),
        "POST",
        Bytes::from_static(br#"{"prompt":"x"}"#),
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.is_err());
    let (_, recs, _, _d) = rec.stop().await;
    let errs: Vec<_> = recs
        .iter()
        .map(|r| r.response.as_ref().unwrap().error.clone().unwrap())
        .collect();
    assert_eq!(errs, vec!["timeout_headers", "timeout_total"]);
    let end = recs[1].response.as_ref().unwrap().end_us.unwrap();
    assert!(
        (600_000..5_000_000).contains(&end),
        "cut near 600 ms, got {end} µs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_pushes_back_on_the_upstream_instead_of_buffering() {
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let s2 = sent.clone();
    let up = upstream(move |_| Reply::Flood(s2.clone())).await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    let c = client();
    let resp = c
        .request(
            Request::post(rec.url("/v1/completions"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut got = 0u64;
    while got < (1 << 20) {
        got += body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .map_or(0, |d| d.len() as u64);
    }
    // The client stops reading; the upstream can only fill socket and proxy buffers: wait
    // until it stalls (no byte more over three polls in a row), or 20 s.
    let pushed = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let (mut last, mut still) = (0, 0);
        while still < 3 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = sent.load(std::sync::atomic::Ordering::Relaxed);
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        last
    };
    assert!(
        pushed < 64 << 20,
        "upstream pushed {pushed} bytes past a stalled client"
    );
    // Reading resumes and everything flows again.
    while got < pushed + (8 << 20) {
        got += body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .map_or(0, |d| d.len() as u64);
    }
    drop(body);
    let (_, recs, _, _d) = rec.stop().await;
    let r = recs[0].response.as_ref().unwrap();
    assert!(r.cancelled);
}

#[test]
fn kill_9_leaves_the_partial_trace_readable_up_to_its_last_frame() {
    // The real binary, with the flag names of the CLI contract.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(upstream(|_| Reply::Echo));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("traces");
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_retrace"))
            .args([
                "record",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--upstream",
                &format!("http://{}", up.addr),
            ])
            .arg("--out")
            .arg(&out)
            .args(["--admin", "none", "--name", "prod"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    rt.block_on(async {
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for k in 0..4 {
            let (s, _, _) = fetch(
                &url,
                "POST",
                Bytes::from(format!(r#"{{"prompt":[{k}]}}"#)),
                &[],
            )
            .await;
            assert_eq!(s, StatusCode::OK);
        }
        // The one-second frame interval closes a frame holding all four.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let n = std::fs::read_dir(&out).ok().and_then(|d| {
                let f = d.filter_map(Result::ok).next()?.path();
                let data = std::fs::read(f).ok()?;
                Some(native::read_bytes("partial", &data).ok()?.0.requests.len())
            });
            if n == Some(4) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "records in the file: {n:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    child.0.kill().unwrap(); // SIGKILL
    super::support::wait_within(&mut child.0, super::support::CHILD_LIMIT);
    let files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("prod-") && name.ends_with(".trace.zst.partial"),
        "{name}"
    );
    let (t, rep) = native::read_file(&files[0]).unwrap();
    assert_eq!(t.requests.len(), 4, "{}", rep.summary());
    assert_eq!(t.header.hash_scheme, HashScheme::Xxh3);
    assert_eq!(t.header.block_size, 512);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_use_the_hf_tokenizer_when_given() {
    let up = upstream(|_| Reply::Chunks {
        ctype: "application/json",
        // The server's usage disagrees on purpose: an exact tokenizer count wins.
        chunks: vec![Bytes::from_static(
            br#"{"choices":[{"text":"x"}],"usage":{"prompt_tokens":99,"completion_tokens":1}}"#,
        )],
        delay: Duration::ZERO,
    })
    .await;
    let rec = start(&format!("http://{}", up.addr), |c, _| {
        c.tokenizer = Some(repo("fixtures/tokenizer/wordlevel.json"));
        c.block_size = 4;
    })
    .await;
    let text = "The KV cache stores keys and values of attention . the cache";
    let body = serde_json::json!({"model":"m","prompt":text}).to_string();
    let (s, _, _) = fetch(&rec.url("/v1/completions"), "POST", Bytes::from(body), &[]).await;
    assert_eq!(s, StatusCode::OK);
    let (_, recs, _, _d) = rec.stop().await;
    let ids: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 3];
    assert_eq!(recs[0].input_tokens, 12);
    assert_eq!(recs[0].hash_ids, BlockHasher::xxh3().chain(&ids, 4, true));
    assert_eq!(recs[0].output_tokens, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_gone_before_the_response_head_is_recorded_as_cancelled() {
    let up = upstream(|_| Reply::SlowHead(Duration::from_secs(3))).await;
    let rec = start(&format!("http://{}", up.addr), |_, _| {}).await;
    // HTTP/2: dropping the request future resets the stream, and the proxy drops its handler.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::post(rec.url("/v1/completions"))
        .body(Full::new(Bytes::from_static(br#"{"prompt":[1,2,3]}"#)))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_millis(300), h2.request(req)).await;
    assert!(r.is_err(), "the upstream holds its head for 3 s");
    drop(h2);
    let mut in_flight = 1.0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        in_flight = metric(&rec.metrics().await, "retrace_record_in_flight");
        if in_flight == 0.0 {
            break;
        }
    }
    assert_eq!(in_flight, 0.0);
    let (_, recs, _, _d) = rec.stop().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert!(resp.cancelled);
    assert_eq!(resp.status, 0);
    assert_eq!(recs[0].input_tokens, 3, "the body had reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_through_the_proxy_into_the_mock_round_trips_to_mooncake() {
    // The issue's round trip, with the real replayer and the real mock: replay a Mooncake slice
    // (token-id prompts) through `record` into `mock`, export the recording to Mooncake JSONL.
    let src_path = repo("fixtures/vllm/bench_serve_input_trace.jsonl");
    let src = std::fs::read_to_string(&src_path).unwrap();
    let rows: Vec<serde_json::Value> = src
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mock = retrace::mock::start(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        retrace::mock::MockConfig {
            fixed_timing: Some((2.0, 1.0)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let rec = start(&format!("http://{}", mock.addr), |c, _| c.block_size = 512).await;
    let args = super::support::cli(&[
        "replay",
        src_path.to_str().unwrap(),
        "--target",
        &format!("http://{}", rec.addr),
        "--speed",
        "4",
        "--detailed",
    ]);
    let retrace::cli::Command::Replay(a) = args.command else {
        unreachable!()
    };
    let o = retrace::replay::replay(a.config().unwrap()).await.unwrap();
    assert_eq!(
        (o.summary.completed, o.summary.failed),
        (30, 0),
        "{:?}",
        o.summary.errors
    );
    let (_, recs, _, _d) = rec.stop().await;
    mock.shutdown().await;
    // The replayer may ask other endpoints first (e.g. /v1/models): keep the completions.
    let recs: Vec<_> = recs
        .into_iter()
        .filter(|r| r.endpoint == retrace::trace::Endpoint::Completions)
        .collect();
    assert_eq!(recs.len(), rows.len());
    let trace = retrace::trace::Trace {
        header: retrace::trace::TraceHeader::imported(512, true, "test"),
        requests: recs,
    };
    let mut out = Vec::new();
    retrace::trace::mooncake::write(&trace, &mut out).unwrap();
    let got: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Rows are matched by (input, output) length, unique in this slice: on a loaded machine two
    // sends can reach the proxy out of order, which changes the export's row order and id
    // numbering but not the structure. The export's ids are renumbered in source order below.
    let got: Vec<&serde_json::Value> = rows
        .iter()
        .map(|r| {
            got.iter()
                .find(|g| {
                    g["input_length"] == r["input_length"]
                        && g["output_length"] == r["output_length"]
                })
                .unwrap_or_else(|| panic!("no recorded row for {r}"))
        })
        .collect();
    let mut renumber = std::collections::HashMap::new();
    // Same structure, keyed by block length: this slice's lengths were cut, so a partial tail
    // block is other tokens than the full block of the same id (see the round trip test above).
    let mut keys = std::collections::HashMap::new();
    for (k, (g, r)) in got.iter().zip(&rows).enumerate() {
        let len = r["input_length"].as_u64().unwrap();
        let want: Vec<u64> = r["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(b, h)| {
                let blen = (len - 512 * b as u64).min(512);
                let next = keys.len() as u64;
                *keys.entry((h.as_u64().unwrap(), blen)).or_insert(next)
            })
            .collect();
        let gi: Vec<u64> = g["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let next = renumber.len() as u64;
                *renumber.entry(v.as_u64().unwrap()).or_insert(next)
            })
            .collect();
        assert_eq!(gi, want, "row {k}: prefix structure");
        assert_eq!(g["input_length"], r["input_length"], "row {k}");
        assert_eq!(g["output_length"], r["output_length"], "row {k}");
    }
    // The replayer's own send instant and latency of each row (matched by lengths too).
    let res = &o.result;
    let col = |name: &str| -> Vec<f64> {
        res[name]
            .as_array()
            .unwrap_or_else(|| panic!("{name} in the detailed result"))
            .iter()
            .map(|v| v.as_f64().unwrap_or(0.0))
            .collect()
    };
    let (ins, outs, starts, lats) = (
        col("input_lens"),
        col("output_lens"),
        col("start_times"),
        col("latencies"),
    );
    let (mut sent, mut done) = (Vec::new(), Vec::new());
    for r in &rows {
        let (i, o) = (
            r["input_length"].as_f64().unwrap(),
            r["output_length"].as_f64().unwrap(),
        );
        let j = (0..ins.len())
            .find(|&j| ins[j] == i && outs[j] == o)
            .unwrap_or_else(|| panic!("no replayed request for {r}"));
        sent.push(starts[j]);
        done.push(starts[j] + lats[j]);
    }
    let got_ms: Vec<f64> = got
        .iter()
        .map(|g| g["timestamp"].as_u64().unwrap() as f64)
        .collect();
    assert_causal_arrivals(&got_ms, &sent, &done);
}

#[test]
fn drain_deadline_is_recorded_as_drain_deadline() {
    // Streams that outlive --drain-timeout at SIGINT: each record says drain_deadline (not a
    // client cancellation), the log gives their number, and the process exits soon after.
    const N: usize = 50;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (gone_tx, _gone) = mpsc::unbounded_channel();
    let up = rt.block_on(upstream(move |_| Reply::Endless {
        every: Duration::from_millis(50),
        gone: gone_tx.clone(),
    }));
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("traces");
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_retrace"))
            .args(["record", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &format!("http://{}", up.addr)])
            .arg("--out")
            .arg(&out)
            .args(["--admin", "none", "--drain-timeout", "1s"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    let streams: Vec<_> = rt.block_on(async {
        wait_listening(port).await;
        let s: Vec<_> = (0..N)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    fetch(&url, "POST", Bytes::from_static(br#"{"prompt":[1]}"#), &[]).await
                })
            })
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while up.seen.lock().unwrap().len() < N {
            assert!(tokio::time::Instant::now() < deadline, "streams started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s
    });
    let signalled = std::time::Instant::now();
    super::support::send_signal(&child.0, libc::SIGINT);
    let status = super::support::wait_within(&mut child.0, super::support::CHILD_LIMIT);
    let took = signalled.elapsed();
    assert!(status.success(), "{status}");
    let mut log = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(
        log.contains(&format!("with {N} exchanges in flight")),
        "{log}"
    );
    assert!(took < Duration::from_secs(5), "exit {took:?} after SIGINT");
    for s in streams {
        let (st, _, body) = rt.block_on(s).unwrap();
        assert_eq!(st, StatusCode::OK);
        assert!(body.is_err(), "a cut stream must not look complete");
    }
    let mut recs = Vec::new();
    for e in std::fs::read_dir(&out).unwrap() {
        recs.extend(native::read_file(&e.unwrap().path()).unwrap().0.requests);
    }
    assert_eq!(recs.len(), N);
    for r in &recs {
        let resp = r.response.as_ref().unwrap();
        assert_eq!(resp.error.as_deref(), Some("drain_deadline"));
        assert!(!resp.cancelled);
    }
    eprintln!("exit {took:?} after SIGINT with a 1 s drain");
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn wait_listening(port: u16) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "record listens");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn upstream_pointing_at_the_proxy_itself_is_a_508_with_bounded_fds() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let me = format!("127.0.0.1:{port}");
    let child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_retrace"))
            .args([
                "record",
                "--listen",
                &me,
                "--upstream",
                &format!("http://{me}"),
            ])
            .arg("--out")
            .arg(dir.path().join("traces"))
            .args(["--admin", "none", "--io-threads", "1"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let url = format!("http://{me}/v1/completions");
    rt.block_on(async {
        wait_listening(port).await;
        let before = open_fds(pid);
        for _ in 0..50 {
            let (st, _, body) = fetch(&url, "POST", Bytes::from_static(b"{}"), &[]).await;
            assert_eq!(st.as_u16(), 508);
            let v: serde_json::Value = serde_json::from_slice(&body.unwrap()).unwrap();
            assert_eq!(v["error"]["type"], "loop_detected");
        }
        // Each request looped once: its sockets close, they do not pile up.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while open_fds(pid) > before + 8 {
            let n = open_fds(pid);
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} fds, {before} before"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[test]
fn record_prints_where_it_listens_forwards_and_writes() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("traces");
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_retrace"))
            .args(["record", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", "http://127.0.0.1:9/base", "--name", "prod"])
            .arg("--out")
            .arg(&out)
            .args(["--admin", "none"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_listening(port));
    super::support::send_signal(&child.0, libc::SIGINT);
    assert!(super::support::wait_within(&mut child.0, super::support::CHILD_LIMIT).success());
    let mut log = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    let want = format!(
        "retrace record: listening on 127.0.0.1:{port}, forwarding to http://127.0.0.1:9/base, writing {}",
        out.join("prod-*.trace.zst").display()
    );
    assert!(log.lines().next().is_some_and(|l| l == want), "{log}");
}

/// A recorder in front of an upstream that takes no connection serves on: the first request
/// gets a 502 and a warning naming the upstream, once; SIGINT still ends it cleanly.
#[test]
fn an_upstream_that_does_not_answer_is_warned_about_once_and_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_held, port) = super::support::refusing_port();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args(["record", "--listen", "127.0.0.1:0", "--admin", "none"])
        .args(["--upstream", &format!("http://127.0.0.1:{port}"), "--out"])
        .arg(dir.path());
    let mut rec = super::support::Running::spawn(&mut cmd).unwrap();
    let limit = std::time::Duration::from_secs(30);
    rec.wait_for("the listening line", limit, |e| e.contains("listening on "));
    let err = rec.stderr();
    let at = err
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("{err}"))
        .to_string();
    let ask = || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&at).unwrap();
        s.set_read_timeout(Some(limit)).unwrap();
        s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        reply
    };
    let reply = ask();
    assert!(reply.starts_with("HTTP/1.1 502"), "{reply}");
    let warning = format!("warning: the upstream http://127.0.0.1:{port}/ does not answer");
    rec.wait_for("the warning", limit, |e| e.contains(&warning));
    assert!(!rec.ended(), "{}", rec.stderr());
    let reply = ask();
    assert!(reply.starts_with("HTTP/1.1 502"), "{reply}");
    rec.signal(libc::SIGINT);
    let o = rec.wait_within(limit).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err.matches(&warning).count(), 1, "{err}");
    assert!(err.contains("serving goes on"), "{err}");
}
