//! `retrace record` and HTTP/1.1 protocol switches (`Connection: upgrade`, e.g. WebSocket), : a plain-tokio upstream answers `101` to an upgrade request and then echoes
//! bytes; through the recorder the client sees the 101 head and the echoes both ways, the half
//! close, and the trace holds the exchange (status 101, no payload, no credentials). A refused
//! upgrade (426) is an ordinary response on a connection that carries on; an unrequested 101 is a
//! 502; a draining proxy cuts an open tunnel just before its drain deadline; TLS on both hops
//! (close_notify as the half close) works the same.

use retrace::record::{self, RecordConfig, RecordStats};
use retrace::trace::{native, Endpoint, Request as TraceRequest};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(10);
const WS_REQUEST: &str = "GET /v1/realtime?token=SECRET-QUERY HTTP/1.1\r\nHost: proxy\r\n\
    Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
    Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer sk-SECRET-AUTH\r\n\r\n";

/// One request head as the upstream saw it: request line and lower-cased header names.
#[derive(Debug, Clone)]
struct Seen {
    line: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A plain-tokio upstream. Per request: `/v1/realtime` with `Upgrade: websocket` gets a 101
/// (plus a greeting in the same write), then every byte is echoed until the client's end of
/// stream, answered with `bye` and a close; `/refuse` gets a 426 with a body; `/switch` gets a
/// 101 whatever it asked; anything else a small JSON 200. Keep-alive otherwise.
async fn upstream() -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    upstream_with(None).await
}

/// [`upstream`], over TLS when given an acceptor.
async fn upstream_with(
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let seen = s2.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => serve_upstream(tcp, seen).await,
                    Some(acc) => {
                        if let Ok(s) = acc.accept(tcp).await {
                            serve_upstream(s, seen).await
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Serves one upstream connection (see [`upstream`]).
async fn serve_upstream<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_head(&mut s, &mut buf).await else {
            return;
        };
        seen.lock().unwrap().push(req.clone());
        let path = req.line.split(' ').nth(1).unwrap_or("").to_string();
        let ws = req.get("upgrade") == Some("websocket");
        if (path.starts_with("/v1/realtime") && ws) || path == "/switch" {
            let head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\nhello";
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            echo(s, buf).await;
            return;
        }
        let resp = if path == "/refuse" {
            "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             content-type: text/plain\r\ncontent-length: 15\r\n\r\nupgrade refused"
                .to_string()
        } else {
            let b = format!("{{\"path\":\"{path}\"}}");
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
                b.len()
            )
        };
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Echoes bytes (`pending` first) until end of stream, then says `bye` and closes.
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, pending: Vec<u8>) {
    if !pending.is_empty() && s.write_all(&pending).await.is_err() {
        return;
    }
    let mut b = [0u8; 4096];
    loop {
        match tokio::time::timeout(T, s.read(&mut b)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => {
                if s.write_all(&b[..n]).await.is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
    let _ = s.write_all(b"bye").await;
    let _ = s.shutdown().await;
}

/// A parsed head's fields as (lower-case name, value) pairs.
fn lowercase_headers(h: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    h.iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).to_string(),
            )
        })
        .collect()
}

/// Reads one request head (no bodies in these tests); `buf` keeps what follows it.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Option<Seen> {
    loop {
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Request::new(&mut h);
        if let Ok(httparse::Status::Complete(n)) = r.parse(buf) {
            let seen = Seen {
                line: format!("{} {}", r.method.unwrap(), r.path.unwrap()),
                headers: lowercase_headers(r.headers),
            };
            buf.drain(..n);
            return Some(seen);
        }
        let mut tmp = [0u8; 4096];
        let n = tokio::time::timeout(T, s.read(&mut tmp)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// A response head as the client saw it, and the bytes read past it.
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_more<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> usize {
    let mut tmp = [0u8; 4096];
    let n = tokio::time::timeout(T, s.read(&mut tmp))
        .await
        .expect("read within the timeout")
        .unwrap_or(0);
    buf.extend_from_slice(&tmp[..n]);
    n
}

async fn read_response_head<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Head {
    loop {
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut h);
        if let Ok(httparse::Status::Complete(n)) = r.parse(buf) {
            let head = Head {
                status: r.code.unwrap(),
                headers: lowercase_headers(r.headers),
            };
            buf.drain(..n);
            return head;
        }
        assert!(
            read_more(s, buf).await > 0,
            "connection closed before a head"
        );
    }
}

/// Reads exactly `n` bytes (some may already be in `buf`).
async fn read_n<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>, n: usize) -> Vec<u8> {
    while buf.len() < n {
        assert!(read_more(s, buf).await > 0, "connection closed early");
    }
    buf.drain(..n).collect()
}

/// Reads a Content-Length response body.
async fn read_body<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>, h: &Head) -> Vec<u8> {
    let len: usize = h.get("content-length").unwrap().parse().unwrap();
    read_n(s, buf, len).await
}

struct Rec {
    addr: SocketAddr,
    admin: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<RecordStats>>,
    dir: tempfile::TempDir,
}

async fn start(upstream: SocketAddr, drain: Duration) -> Rec {
    start_with(&format!("http://{upstream}"), drain, |_| {}).await
}

async fn start_with(upstream: &str, drain: Duration, tweak: impl FnOnce(&mut RecordConfig)) -> Rec {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new(upstream, dir.path().join("out")).unwrap();
    cfg.flush_every = Duration::from_millis(100);
    cfg.io_threads = 1;
    cfg.drain_timeout = drain;
    cfg.bodies = record::Bodies::Full;
    tweak(&mut cfg);
    let super::support::Recorder {
        addr,
        admin,
        stop,
        task,
    } = super::support::spawn_recorder(cfg).await;
    Rec {
        addr,
        admin,
        stop,
        task,
        dir,
    }
}

impl Rec {
    async fn metrics(&self) -> String {
        let mut s = TcpStream::connect(self.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(T, s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&out).to_string()
    }

    /// Stops the proxy; the records (by arrival), the stats and the decompressed trace bytes.
    async fn stop(self) -> (Vec<TraceRequest>, RecordStats, Vec<u8>) {
        let stats = super::support::stop_recorder(self.stop, self.task).await;
        let mut recs = Vec::new();
        let mut raw = Vec::new();
        for f in &stats.files {
            recs.extend(native::read_file(f).unwrap().0.requests);
            raw.extend(zstd::stream::decode_all(std::fs::read(f).unwrap().as_slice()).unwrap());
        }
        recs.sort_by_key(|r| r.arrival_us);
        drop(self.dir);
        (recs, stats, raw)
    }
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_is_tunnelled_both_ways_and_recorded_without_payload() {
    let (up, seen) = upstream().await;
    seen.lock().unwrap().clear();
    let rec = start(up, Duration::from_secs(5)).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    // The first frame goes with the request, before the 101 (allowed once the switch is
    // granted): it must reach the upstream after the head, not be taken for a request.
    let mut first = WS_REQUEST.as_bytes().to_vec();
    first.extend_from_slice(b"EARLY-PAYLOAD");
    c.write_all(&first).await.unwrap();
    let mut buf = Vec::new();
    let h = read_response_head(&mut c, &mut buf).await;
    assert_eq!(h.status, 101);
    assert_eq!(h.get("upgrade"), Some("websocket"));
    assert!(
        h.get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("upgrade")),
        "{:?}",
        h.headers
    );
    assert_eq!(
        h.get("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    // The greeting the upstream sent with its head, then the early bytes echoed.
    assert_eq!(read_n(&mut c, &mut buf, 5).await, b"hello");
    assert_eq!(read_n(&mut c, &mut buf, 13).await, b"EARLY-PAYLOAD");
    // Several round trips of arbitrary bytes (a frame-like binary blob, some large).
    let mut sent = 13u64;
    for k in 0..6u32 {
        let msg: Vec<u8> = (0..(1 + k * 7919))
            .map(|i| (i.wrapping_mul(31) ^ k) as u8)
            .collect();
        c.write_all(&msg).await.unwrap();
        sent += msg.len() as u64;
        assert_eq!(
            read_n(&mut c, &mut buf, msg.len()).await,
            msg,
            "round trip {k}"
        );
    }
    // Half close: the client is done sending; the upstream still answers, then closes.
    c.shutdown().await.unwrap();
    assert_eq!(read_n(&mut c, &mut buf, 3).await, b"bye");
    assert_eq!(read_more(&mut c, &mut buf).await, 0, "EOF after the tunnel");

    // The upstream saw the switch asked for, and the credentials (the proxy is transparent).
    let s = seen.lock().unwrap()[0].clone();
    assert!(s.line.starts_with("GET /v1/realtime?token="));
    assert_eq!(s.get("upgrade"), Some("websocket"));
    assert!(
        s.get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("upgrade")),
        "{:?}",
        s.headers
    );
    assert_eq!(s.get("sec-websocket-key"), Some("dGhlIHNhbXBsZSBub25jZQ=="));
    assert_eq!(s.get("authorization"), Some("Bearer sk-SECRET-AUTH"));

    // /metrics counts the upgrade and the tunnel's bytes (the tunnel has closed).
    let mut m = rec.metrics().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&m, "retrace_record_tunnels_open") != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = rec.metrics().await;
    }
    assert_eq!(metric(&m, "retrace_record_upgrades_total"), 1);
    assert_eq!(metric(&m, "retrace_record_tunnels_open"), 0);
    assert_eq!(
        metric(
            &m,
            "retrace_record_tunnel_bytes_total{direction=\"to_upstream\"}"
        ),
        sent
    );
    assert_eq!(
        metric(
            &m,
            "retrace_record_tunnel_bytes_total{direction=\"to_client\"}"
        ),
        // The greeting came with the 101 head; echoes; bye.
        5 + sent + 3
    );

    let (recs, _, raw) = rec.stop().await;
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r.endpoint, Endpoint::Other("/v1/realtime".into()));
    let resp = r.response.as_ref().unwrap();
    assert_eq!(resp.status, 101);
    assert_eq!(resp.error, None);
    assert!(!resp.cancelled);
    let headers = resp.headers_us.expect("time to the 101 head");
    let end = resp.end_us.expect("the tunnel's end");
    assert!(end >= headers, "{end} < {headers}");
    assert!(resp.events.is_empty() && resp.ttft_us.is_none());
    // --bodies full keeps the (empty) request and response bodies, never the tunnel's.
    assert!(resp.body.as_deref().is_none_or(|b| b.is_empty()));
    assert!(r.body.as_deref().is_none_or(|b| b.is_empty()));
    assert_eq!((r.input_tokens, r.output_tokens), (0, 0));
    let hay = String::from_utf8_lossy(&raw);
    for secret in ["SECRET", "EARLY-PAYLOAD", "hello", "bye"] {
        assert!(!hay.contains(secret), "{secret:?} reached the trace");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_is_an_ordinary_response_and_the_connection_carries_on() {
    let (up, seen) = upstream().await;
    seen.lock().unwrap().clear();
    let rec = start(up, Duration::from_secs(5)).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(
        b"GET /refuse HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let h = read_response_head(&mut c, &mut buf).await;
    assert_eq!(h.status, 426);
    assert_eq!(read_body(&mut c, &mut buf, &h).await, b"upgrade refused");
    assert!(!h.get("connection").is_some_and(|v| v.contains("close")));
    // The next keep-alive request on the same connection.
    c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let h = read_response_head(&mut c, &mut buf).await;
    assert_eq!(h.status, 200);
    assert_eq!(
        read_body(&mut c, &mut buf, &h).await,
        br#"{"path":"/v1/models"}"#
    );
    // An h2c upgrade is not forwarded (the recorder must keep seeing the requests): an
    // ordinary request upstream, an ordinary answer.
    c.write_all(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
    )
    .await
    .unwrap();
    let h = read_response_head(&mut c, &mut buf).await;
    assert_eq!(h.status, 200);
    read_body(&mut c, &mut buf, &h).await;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[0].get("upgrade"), Some("websocket"));
        assert_eq!(seen[1].get("upgrade"), None);
        assert_eq!(seen[2].get("upgrade"), None);
        assert_eq!(seen[2].get("http2-settings"), None);
    }
    // After ordinary exchanges, the same client connection (and the pooled upstream one)
    // can still switch.
    c.write_all(WS_REQUEST.as_bytes()).await.unwrap();
    assert_eq!(read_response_head(&mut c, &mut buf).await.status, 101);
    assert_eq!(read_n(&mut c, &mut buf, 5).await, b"hello");
    c.write_all(b"ping").await.unwrap();
    assert_eq!(read_n(&mut c, &mut buf, 4).await, b"ping");
    drop(c);
    let (recs, _, _) = rec.stop().await;
    let statuses: Vec<u16> = recs
        .iter()
        .map(|r| r.response.as_ref().unwrap().status)
        .collect();
    assert_eq!(statuses, [426, 200, 200, 101]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrequested_101_is_a_bad_gateway() {
    let (up, _) = upstream().await;
    let rec = start(up, Duration::from_secs(5)).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(b"GET /switch HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let h = read_response_head(&mut c, &mut buf).await;
    assert_eq!(h.status, 502);
    let body = String::from_utf8(read_body(&mut c, &mut buf, &h).await).unwrap();
    assert!(body.contains("101"), "{body}");
    drop(c);
    let (recs, _, _) = rec.stop().await;
    assert_eq!(recs.len(), 1);
    assert_eq!(
        recs[0].response.as_ref().unwrap().error.as_deref(),
        Some("upstream_closed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_proxy_keeps_a_tunnel_until_just_before_its_deadline() {
    let (up, _) = upstream().await;
    let drain = Duration::from_millis(1500);
    let rec = start(up, drain).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(WS_REQUEST.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(read_response_head(&mut c, &mut buf).await.status, 101);
    assert_eq!(read_n(&mut c, &mut buf, 5).await, b"hello");
    let stopping = Instant::now();
    let addr = rec.addr;
    let stop = tokio::spawn(rec.stop());
    // Still working while the proxy drains: it has stopped accepting (its listener is gone).
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "the proxy kept accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.write_all(b"still there?").await.unwrap();
    assert_eq!(read_n(&mut c, &mut buf, 12).await, b"still there?");
    // Cut a little before the deadline: the client sees the end.
    while read_more(&mut c, &mut buf).await > 0 {}
    let cut = stopping.elapsed();
    assert!(
        cut >= Duration::from_millis(1000) && cut < Duration::from_secs(8),
        "cut after {cut:?}"
    );
    let (recs, _, _) = tokio::time::timeout(Duration::from_secs(20), stop)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recs.len(), 1);
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(resp.status, 101);
    assert_eq!(resp.error.as_deref(), Some("drain_deadline"));
    assert!(!resp.cancelled);
}

fn repo(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_works_over_tls_on_both_hops() {
    let acc = record::server::tls_acceptor(
        &repo("fixtures/tls/cert.pem"),
        &repo("fixtures/tls/key.pem"),
    )
    .unwrap();
    let (up, seen) = upstream_with(Some(acc)).await;
    let client_tls = tokio_rustls::TlsConnector::from(
        retrace::sys::tls::client_config(Some(&repo("fixtures/tls/ca.pem")), "ca", &[b"http/1.1"])
            .unwrap(),
    );
    let rec = start_with(
        &format!("https://localhost:{}", up.port()),
        Duration::from_secs(5),
        |c| {
            c.tls = Some((repo("fixtures/tls/cert.pem"), repo("fixtures/tls/key.pem")));
            c.upstream_ca = Some(repo("fixtures/tls/ca.pem"));
        },
    )
    .await;
    let tcp = TcpStream::connect(rec.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut c = client_tls.connect(name, tcp).await.unwrap();
    c.write_all(WS_REQUEST.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let h = read_response_head(&mut c, &mut buf).await;
    assert_eq!(h.status, 101);
    assert_eq!(read_n(&mut c, &mut buf, 5).await, b"hello");
    for k in 0..3u8 {
        let msg = vec![k; 20_000];
        c.write_all(&msg).await.unwrap();
        assert_eq!(read_n(&mut c, &mut buf, msg.len()).await, msg);
    }
    // A TLS half close (close_notify) is passed on; the upstream answers and closes.
    c.shutdown().await.unwrap();
    assert_eq!(read_n(&mut c, &mut buf, 3).await, b"bye");
    assert_eq!(read_more(&mut c, &mut buf).await, 0);
    assert_eq!(
        seen.lock().unwrap().last().unwrap().get("upgrade"),
        Some("websocket")
    );
    let (recs, _, _) = rec.stop().await;
    assert_eq!(recs.len(), 1);
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!((resp.status, resp.error.as_deref()), (101, None));
}
