//! `retrace record`'s HTTP/1.1 forwarding at the wire level, with raw sockets on both sides:
//! pipelining, chunked request bodies, `Expect: 100-continue`, HEAD, 204, close-delimited
//! responses, refused heads (400/431), an upstream that says `Connection: close`, and raw chunk
//! framing passed through byte for byte. HTTP/1.1 clients of an HTTP/1.1 upstream are served by
//! retrace's own loop (`record::h1`).

use retrace::record::{self, RecordConfig, RecordStats};
use retrace::trace::{native, Request as TraceRequest};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(10);

/// What the raw upstream sends for one request: pieces written with a short pause between
/// them, then whether it closes the connection.
struct Answer {
    pieces: Vec<Vec<u8>>,
    close: bool,
}

type Script = Arc<dyn Fn(&str, &str, &[u8]) -> Answer + Send + Sync>;

/// A raw HTTP/1.1 upstream: per request (Content-Length or chunked body read whole), the script
/// says what bytes to send back. Counts accepted connections.
async fn raw_upstream(
    script: impl Fn(&str, &str, &[u8]) -> Answer + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicU64::new(0));
    let c2 = conns.clone();
    let script: Script = Arc::new(script);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c2.fetch_add(1, Ordering::Relaxed);
            let script = script.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some((method, path, body)) = read_request(&mut s, &mut buf).await else {
                        return;
                    };
                    let a = script(&method, &path, &body);
                    for p in a.pieces {
                        if s.write_all(&p).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if a.close {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns)
}

/// Reads one request (head and body) off a raw socket; `buf` keeps bytes read past it.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, String, Vec<u8>)> {
    loop {
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Request::new(&mut h);
        if let Ok(httparse::Status::Complete(n)) = r.parse(buf) {
            let method = r.method.unwrap().to_string();
            let path = r.path.unwrap().to_string();
            let get = |name: &str| {
                r.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).to_string())
            };
            let chunked = get("transfer-encoding").is_some_and(|v| v.contains("chunked"));
            let len: usize = get("content-length").map_or(0, |v| v.parse().unwrap());
            buf.drain(..n);
            let body = if chunked {
                read_chunked(s, buf).await?
            } else {
                while buf.len() < len {
                    read_more(s, buf).await?;
                }
                buf.drain(..len).collect()
            };
            return Some((method, path, body));
        }
        read_more(s, buf).await?;
    }
}

/// Reads until the proxy closes the connection: panics if it is still open after [`T`] (a
/// timeout is not an end of the body).
async fn read_to_eof(s: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>) {
    let mut tmp = [0u8; 8192];
    loop {
        match tokio::time::timeout(T, s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&tmp[..n]),
            Err(_) => panic!("the proxy did not close the connection within {T:?}"),
        }
    }
}

async fn read_more(s: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>) -> Option<()> {
    let mut tmp = [0u8; 8192];
    let n = tokio::time::timeout(T, s.read(&mut tmp)).await.ok()?.ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&tmp[..n]);
    Some(())
}

/// Decodes a chunked body from `buf` (reading more as needed) with the library's decoder.
async fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut d = retrace::wire::h1::ChunkedDecoder::new();
    let mut out = Vec::new();
    loop {
        let n = d.feed(buf, |a, b| out.extend_from_slice(&buf[a..b])).ok()?;
        buf.drain(..n);
        if d.is_done() {
            return Some(out);
        }
        read_more(s, buf).await?;
    }
}

/// A response as the client saw it.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    /// The body bytes as they came on the wire (chunk framing included).
    raw_body: Vec<u8>,
    /// The payload (chunked framing removed).
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response from the proxy; `head_request` says the request was HEAD.
async fn read_response(
    s: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    head_request: bool,
) -> Resp {
    loop {
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut h);
        if let Ok(httparse::Status::Complete(n)) = r.parse(buf) {
            let status = r.code.unwrap();
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).to_string(),
                    )
                })
                .collect();
            buf.drain(..n);
            let mut resp = Resp {
                status,
                headers,
                raw_body: Vec::new(),
                body: Vec::new(),
            };
            if (100..200).contains(&status) || status == 204 || status == 304 || head_request {
                return resp;
            }
            if resp
                .header("transfer-encoding")
                .is_some_and(|v| v.contains("chunked"))
            {
                let mut d = retrace::wire::h1::ChunkedDecoder::new();
                loop {
                    let mut body = Vec::new();
                    let k = d
                        .feed(buf, |a, b| body.extend_from_slice(&buf[a..b]))
                        .unwrap();
                    resp.body.extend(body);
                    resp.raw_body.extend(buf.drain(..k));
                    if d.is_done() {
                        return resp;
                    }
                    read_more(s, buf).await.expect("chunked body complete");
                }
            } else if let Some(len) = resp.header("content-length") {
                let len: usize = len.parse().unwrap();
                while buf.len() < len {
                    read_more(s, buf).await.expect("whole body");
                }
                resp.body = buf.drain(..len).collect();
            } else {
                read_to_eof(s, buf).await;
                resp.body = std::mem::take(buf);
            }
            resp.raw_body = resp.body.clone();
            return resp;
        }
        read_more(s, buf).await.expect("a response head");
    }
}

/// Whether the proxy closed the connection (EOF) within `within`: a long wait to see a close
/// (a loaded machine is slow, never wrong), a short one to see that none comes.
async fn closed(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

struct Rec {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<RecordStats>>,
    _dir: tempfile::TempDir,
}

async fn start(upstream: SocketAddr) -> Rec {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new(&format!("http://{upstream}"), dir.path().join("out")).unwrap();
    cfg.flush_every = Duration::from_millis(100);
    cfg.block_size = 16;
    cfg.io_threads = 1;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(record::run_with_admin(l, None, cfg, async move {
        let _ = rx.await;
    }));
    Rec {
        addr,
        stop,
        task,
        _dir: dir,
    }
}

impl Rec {
    async fn records(self) -> Vec<TraceRequest> {
        let stats = super::support::stop_recorder(self.stop, self.task).await;
        let mut recs = Vec::new();
        for f in &stats.files {
            recs.extend(native::read_file(f).unwrap().0.requests);
        }
        recs.sort_by_key(|r| r.arrival_us);
        recs
    }
}

fn ok(body: &[u8], extra: &str) -> Vec<u8> {
    let mut v = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body);
    v
}

/// Echoes the request body; `/path` with its method as JSON for bodiless requests.
fn echo(method: &str, path: &str, body: &[u8]) -> Answer {
    let b = if body.is_empty() {
        format!("{{\"method\":\"{method}\",\"path\":\"{path}\"}}").into_bytes()
    } else {
        body.to_vec()
    };
    Answer {
        pieces: vec![ok(&b, "")],
        close: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_on_one_connection_come_back_in_order() {
    let (up, _) = raw_upstream(echo).await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    // Three requests in one write: two with bodies, one without.
    let mut wire = Vec::new();
    for (k, body) in [r#"{"prompt":[1]}"#, "", r#"{"prompt":[3,3]}"#]
        .iter()
        .enumerate()
    {
        let method = if body.is_empty() { "GET" } else { "POST" };
        wire.extend(
            format!(
                "{method} /v1/completions?k={k} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .bytes(),
        );
    }
    c.write_all(&wire).await.unwrap();
    let mut buf = Vec::new();
    let r1 = read_response(&mut c, &mut buf, false).await;
    let r2 = read_response(&mut c, &mut buf, false).await;
    let r3 = read_response(&mut c, &mut buf, false).await;
    assert_eq!(r1.body, br#"{"prompt":[1]}"#);
    assert_eq!(r2.body, br#"{"method":"GET","path":"/v1/completions?k=1"}"#);
    assert_eq!(r3.body, br#"{"prompt":[3,3]}"#);
    // The connection carries on.
    c.write_all(b"GET /again HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let r4 = read_response(&mut c, &mut buf, false).await;
    assert_eq!(r4.status, 200);
    let recs = rec.records().await;
    assert_eq!(recs.len(), 4);
    assert_eq!(recs[0].input_tokens, 1);
    assert_eq!(recs[2].input_tokens, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_body_streams_through_and_is_recorded_decoded() {
    let (up, _) = raw_upstream(echo).await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let parts = [r#"{"prompt":"#, "[1,2,", "3,4]", "}"];
    for p in parts {
        c.write_all(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.write_all(b"0\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let r = read_response(&mut c, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, parts.concat().as_bytes());
    let recs = rec.records().await;
    assert_eq!(recs[0].input_tokens, 4, "the decoded prompt");
    assert_eq!(recs[0].response.as_ref().unwrap().error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_forwarded_before_the_body() {
    // The upstream answers 100 Continue to an Expect request, then reads the body.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        if read_more(&mut s, &mut buf).await.is_none() {
                            return;
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    buf.drain(..end);
                    assert!(head.contains("expect: 100-continue"), "{head}");
                    s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
                    while buf.len() < 5 {
                        if read_more(&mut s, &mut buf).await.is_none() {
                            return;
                        }
                    }
                    let body: Vec<u8> = buf.drain(..5).collect();
                    s.write_all(&ok(&body, "")).await.unwrap();
                }
            });
        }
    });
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let interim = read_response(&mut c, &mut buf, false).await;
    assert_eq!(interim.status, 100, "the client is told to go on");
    c.write_all(b"hello").await.unwrap();
    let r = read_response(&mut c, &mut buf, false).await;
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    let recs = rec.records().await;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].response.as_ref().unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_and_204_responses_have_no_body_and_keep_the_connection() {
    let (up, conns) = raw_upstream(|method, path, _| {
        let pieces = if path == "/empty" {
            vec![b"HTTP/1.1 204 No Content\r\nx-why: nothing\r\n\r\n".to_vec()]
        } else {
            assert_eq!(method, "HEAD");
            // A HEAD answer announces the length of the body it does not send.
            vec![b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1234\r\n\r\n"
                .to_vec()]
        };
        Answer {
            pieces,
            close: false,
        }
    })
    .await;
    let before = conns.load(Ordering::Relaxed);
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..2 {
        c.write_all(b"HEAD /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut c, &mut buf, true).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some("1234"));
        c.write_all(b"DELETE /empty HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut c, &mut buf, false).await;
        assert_eq!(r.status, 204);
        assert_eq!(r.header("x-why"), Some("nothing"));
    }
    assert!(buf.is_empty(), "no stray body bytes");
    assert!(
        !closed(&mut c, Duration::from_millis(300)).await,
        "keep-alive"
    );
    assert_eq!(
        conns.load(Ordering::Relaxed) - before,
        1,
        "one upstream connection reused"
    );
    let recs = rec.records().await;
    let st: Vec<u16> = recs
        .iter()
        .map(|r| r.response.as_ref().unwrap().status)
        .collect();
    assert_eq!(st, vec![200, 204, 200, 204]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_delimited_response_is_forwarded_then_the_client_connection_closes() {
    let (up, _) = raw_upstream(|_, _, _| Answer {
        pieces: vec![
            b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n".to_vec(),
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n".to_vec(),
            b"data: {\"choices\":[{\"text\":\"b\"}]}\n\n".to_vec(),
        ],
        close: true,
    })
    .await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 14\r\n\r\n{\"prompt\":[1]}",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let r = read_response(&mut c, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(
        r.body,
        b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n"
    );
    let recs = rec.records().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(
        resp.error, None,
        "the close ends a close-delimited body cleanly"
    );
    assert!(!resp.cancelled);
    assert_eq!(resp.events.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_heads_are_refused_and_the_connection_closed() {
    let (up, conns) = raw_upstream(echo).await;
    let rec = start(up).await;
    for (wire, status) in [
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            b"POST / HTTP/1.1\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
            400,
        ),
        (
            {
                let mut v = b"GET / HTTP/1.1\r\nx-big: ".to_vec();
                v.extend(std::iter::repeat_n(b'a', 70 << 10));
                v
            },
            431,
        ),
    ] {
        let mut c = TcpStream::connect(rec.addr).await.unwrap();
        // The proxy may answer and close before the whole oversized head is written.
        let _ = c.write_all(&wire).await;
        let mut buf = Vec::new();
        let r = read_response(&mut c, &mut buf, false).await;
        assert_eq!(r.status, status);
        assert_eq!(r.header("connection"), Some("close"));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], status);
        assert!(
            closed(&mut c, Duration::from_secs(30)).await,
            "closed after {status}"
        );
    }
    assert_eq!(
        conns.load(Ordering::Relaxed),
        0,
        "nothing reached the upstream"
    );
    assert!(rec.records().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connection_close_is_handled_per_hop() {
    // Every upstream answer says Connection: close and closes: the client's connection stays open.
    let (up, conns) = raw_upstream(|_, _, body| Answer {
        pieces: vec![ok(body, "connection: close\r\n")],
        close: true,
    })
    .await;
    let before = conns.load(Ordering::Relaxed);
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    let mut buf = Vec::new();
    for k in 0..3 {
        let b = format!(r#"{{"prompt":[{k}]}}"#);
        c.write_all(
            format!(
                "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{b}",
                b.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let r = read_response(&mut c, &mut buf, false).await;
        assert_eq!(r.status, 200, "request {k}");
        assert_eq!(r.body, b.as_bytes());
        assert_ne!(r.header("connection"), Some("close"), "hop-by-hop");
    }
    assert_eq!(conns.load(Ordering::Relaxed) - before, 3);
    let recs = rec.records().await;
    assert_eq!(recs.len(), 3);
    assert!(recs
        .iter()
        .all(|r| r.response.as_ref().unwrap().error.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_framing_passes_through_byte_for_byte() {
    // Odd chunk sizes, upper-case hex, an extension and a trailer: the client gets these bytes.
    let p1 = "data: {\"choices\":[{\"i\":1}]}\n\n";
    let (a, b) = ("data: {", "\"choices\":[{\"i\":2}]}\n\n");
    let framing: Vec<Vec<u8>> = vec![
        format!("{:X};name=val\r\n{p1}\r\n", p1.len()).into_bytes(),
        format!("{:X}\r\n{a}", a.len()).into_bytes(),
        format!("\r\n{:X}\r\n{b}\r\n", b.len()).into_bytes(),
        b"0\r\nx-trailer: done\r\n\r\n".to_vec(),
    ];
    let raw: Vec<u8> = framing.concat();
    let f2 = framing.clone();
    let (up, _) = raw_upstream(move |_, _, _| {
        let mut pieces =
            vec![b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()];
        pieces.extend(f2.clone());
        Answer {
            pieces,
            close: false,
        }
    })
    .await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..2 {
        c.write_all(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 14\r\n\r\n{\"prompt\":[1]}",
        )
        .await
        .unwrap();
        let r = read_response(&mut c, &mut buf, false).await;
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert_eq!(r.raw_body, raw, "chunk framing changed on the way");
    }
    let recs = rec.records().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(resp.error, None);
    assert_eq!(
        resp.events.len(),
        2,
        "the decoded payload reached the capture"
    );
}

/// A bulk answer (larger than the upstream read buffer's first size, which grows once a read
/// fills it) comes back byte for byte, whole and chunked, twice on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_response_passes_byte_for_byte_as_the_read_buffer_grows() {
    let bulk: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let b2 = bulk.clone();
    let (up, _) = raw_upstream(move |_, path, _| {
        let pieces = if path == "/chunked" {
            let mut v = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            for c in b2.chunks(100_000) {
                v.extend(format!("{:x}\r\n", c.len()).as_bytes());
                v.extend_from_slice(c);
                v.extend(b"\r\n");
            }
            v.extend(b"0\r\n\r\n");
            vec![v]
        } else {
            vec![ok(&b2, "")]
        };
        Answer {
            pieces,
            close: false,
        }
    })
    .await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    let mut buf = Vec::new();
    for path in ["/whole", "/chunked", "/whole"] {
        let req = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}");
        c.write_all(req.as_bytes()).await.unwrap();
        let r = read_response(&mut c, &mut buf, false).await;
        assert_eq!(r.status, 200);
        assert!(r.body == bulk, "{path}: the body changed on the way");
    }
    let recs = rec.records().await;
    assert_eq!(recs.len(), 3);
    assert!(recs
        .iter()
        .all(|r| r.response.as_ref().unwrap().error.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_client_gets_a_decoded_body_and_a_close() {
    let (up, _) = raw_upstream(|_, _, _| Answer {
        pieces: vec![
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
            b"6\r\n world\r\n0\r\n\r\n".to_vec(),
        ],
        close: false,
    })
    .await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(b"GET /v1/models HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let r = read_response(&mut c, &mut buf, false).await;
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(r.body, b"hello world");
    assert_eq!(rec.records().await.len(), 1);
}

#[test]
fn the_h1_engine_flag_is_gone() {
    use clap::Parser as _;
    let args = |extra: &[&'static str]| {
        let mut v = vec![
            "retrace",
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:1",
            "--out",
            "o",
        ];
        v.extend_from_slice(extra);
        retrace::cli::Cli::try_parse_from(v)
    };
    // The same command line without the flag parses: the refusal below is the flag's.
    assert!(args(&[]).is_ok(), "{:?}", args(&[]).err());
    let e = args(&["--h1-engine", "hyper"]).unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
    assert!(e.to_string().contains("--h1-engine"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_serves_again_after_the_idle_release() {
    let (up, conns) = raw_upstream(echo).await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    let mut buf = Vec::new();
    for k in 0..2 {
        // Past the one-second idle release in between.
        if k > 0 {
            tokio::time::sleep(Duration::from_millis(1300)).await;
        }
        let b = format!(r#"{{"prompt":[{k}]}}"#);
        c.write_all(
            format!(
                "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{b}",
                b.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let r = read_response(&mut c, &mut buf, false).await;
        assert_eq!((r.status, r.body), (200, b.into_bytes()));
    }
    assert_eq!(
        conns.load(Ordering::Relaxed),
        1,
        "the upstream socket was pooled"
    );
    assert_eq!(rec.records().await.len(), 2);
}

/// One POST through the proxy from an HTTP/2 client (h2c prior knowledge): status, headers,
/// body.
async fn h2_post(
    proxy: SocketAddr,
    body: impl Into<bytes::Bytes>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::{BodyExt, Full};
    let c: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let req = http::Request::post(format!("http://{proxy}/v1/completions"))
        .body(Full::new(body.into()))
        .unwrap();
    let resp = tokio::time::timeout(T, c.request(req))
        .await
        .unwrap()
        .unwrap();
    let (parts, b) = resp.into_parts();
    let b = tokio::time::timeout(T, b.collect()).await.unwrap().unwrap();
    (parts.status.as_u16(), parts.headers, b.to_bytes().to_vec())
}

/// One POST through the proxy from an HTTP/1.1 client on a fresh connection.
async fn h1_post(proxy: SocketAddr, body: &str) -> Resp {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    let wire = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(wire.as_bytes()).await.unwrap();
    read_response(&mut c, &mut Vec::new(), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_beside_chunked_is_dropped_for_http1_and_http2_clients() {
    // RFC 9112 §6.3: Transfer-Encoding wins; the client must get the whole body.
    let (up, _) = raw_upstream(|_, _, _| Answer {
        pieces: vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
            b"6\r\n world\r\n0\r\n\r\n".to_vec(),
        ],
        close: false,
    })
    .await;
    let rec = start(up).await;
    let r = h1_post(rec.addr, r#"{"prompt":[1]}"#).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), None, "{:?}", r.headers);
    assert_eq!(r.body, b"hello world");
    let (status, headers, body) = h2_post(rec.addr, r#"{"prompt":[1]}"#).await;
    assert_eq!(status, 200);
    assert_ne!(
        headers.get("content-length").map(|v| v.as_bytes()),
        Some(&b"3"[..]),
        "{headers:?}"
    );
    assert_eq!(body, b"hello world");
    let recs = rec.records().await;
    assert_eq!(recs.len(), 2);
    for r in &recs {
        let resp = r.response.as_ref().unwrap();
        assert_eq!((resp.status, resp.error.as_deref()), (200, None));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_kb_response_head_is_a_502_for_http1_and_http2_clients() {
    let (up, _) = raw_upstream(|_, _, _| {
        let mut head = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', 200 << 10));
        head.extend_from_slice(b"\r\ncontent-length: 2\r\n\r\nok");
        Answer {
            pieces: vec![head],
            close: false,
        }
    })
    .await;
    let rec = start(up).await;
    let check = |status: u16, body: &[u8]| {
        assert_eq!(status, 502);
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["error"]["type"], "upstream_closed");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("response head from upstream too large"),
            "{msg}"
        );
    };
    let r = h1_post(rec.addr, r#"{"prompt":[1]}"#).await;
    check(r.status, &r.body);
    let (status, _, body) = h2_post(rec.addr, r#"{"prompt":[1]}"#).await;
    check(status, &body);
    let recs = rec.records().await;
    assert_eq!(recs.len(), 2);
    for r in &recs {
        let resp = r.response.as_ref().unwrap();
        assert_eq!(resp.status, 0, "no usable head came from upstream");
        assert_eq!(resp.error.as_deref(), Some("upstream_closed"));
    }
}

/// An upstream that answers every request `400` as soon as its head is in (or, `silent`, not at
/// all), then closes without reading the body (as servers do on errors).
async fn early_400_upstream(silent: bool) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    if read_more(&mut s, &mut buf).await.is_none() {
                        return;
                    }
                }
                let body = br#"{"object":"error","message":"too long","type":"BadRequestError","code":400}"#;
                let mut head = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                head.extend_from_slice(body);
                if !silent {
                    let _ = s.write_all(&head).await;
                }
                // Dropped with the body unread: the kernel resets the connection.
            });
        }
    });
    addr
}

/// A 20k-token completion request body.
fn big_prompt() -> String {
    let ids: Vec<String> = (0..20_000)
        .map(|k| (10_000 + k % 40_000).to_string())
        .collect();
    format!(
        r#"{{"model":"m","prompt":[{}],"max_tokens":1}}"#,
        ids.join(",")
    )
}

/// Sends one POST of `body` on a fresh connection and reads the answer while still writing.
async fn post_while_writing(addr: SocketAddr, body: String) -> Resp {
    let c = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = c.into_split();
    let wire = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // The proxy may stop reading once the answer is out: a failed write is fine. The write half
    // stays open until the answer is read (a half-close would mean the client left).
    let w = tokio::spawn(async move {
        let _ = wr.write_all(wire.as_bytes()).await;
        wr
    });
    let r = read_response(&mut rd, &mut Vec::new(), false).await;
    drop(w.await);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_before_the_body_is_read_gets_its_answer_through() {
    let up = early_400_upstream(false).await;
    let rec = start(up).await;
    let body = big_prompt();
    let tasks: Vec<_> = (0..20)
        .map(|_| tokio::spawn(post_while_writing(rec.addr, body.clone())))
        .collect();
    let check = |status: u16, body: &[u8]| {
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(body));
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["message"], "too long", "the upstream's own answer");
    };
    for t in tasks {
        let r = t.await.unwrap();
        check(r.status, &r.body);
    }
    let (status, _, b) = h2_post(rec.addr, body).await;
    check(status, &b);
    // Larger than both hops' socket buffers together: the upstream cannot have had it whole.
    let huge = format!(r#"{{"prompt":"{}"}}"#, "a".repeat(12 << 20));
    let r = post_while_writing(rec.addr, huge).await;
    check(r.status, &r.body);
    let recs = rec.records().await;
    assert_eq!(recs.len(), 22);
    for r in &recs {
        let resp = r.response.as_ref().unwrap();
        assert_eq!(resp.status, 400);
        // Written whole into the socket before the upstream closed, or not.
        let e = resp.error.as_deref();
        assert!(
            matches!(e, Some("http_400" | "request_body_unsent")),
            "{e:?}"
        );
    }
    let last = recs.last().unwrap().response.as_ref().unwrap();
    assert_eq!(last.error.as_deref(), Some("request_body_unsent"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_unanswered_mid_body_is_a_502_with_the_prompt_recorded() {
    let up = early_400_upstream(true).await;
    let rec = start(up).await;
    let r = post_while_writing(rec.addr, big_prompt()).await;
    assert_eq!(r.status, 502);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["type"], "upstream_closed");
    let recs = rec.records().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(
        (resp.status, resp.error.as_deref()),
        (0, Some("upstream_closed"))
    );
    // The part never forwarded is read from the client for the record.
    assert_eq!(recs[0].input_tokens, 20_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_chunk_in_the_same_read_as_the_head_forwards_the_valid_event_then_cuts() {
    // Head, one valid event and a bad chunk-size line, in one write.
    let event = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
    let valid = format!("{:x}\r\n{event}", event.len());
    let mut wire =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    wire.extend_from_slice(format!("{valid}\r\nzz\r\nbad\r\n").as_bytes());
    let (up, _) = raw_upstream(move |_, _, _| Answer {
        pieces: vec![wire.clone()],
        close: false,
    })
    .await;
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 14\r\n\r\n{\"prompt\":[1]}",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    read_to_eof(&mut c, &mut got).await;
    let got = String::from_utf8_lossy(&got).to_string();
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got:?}");
    assert!(
        got.ends_with(&valid),
        "the valid event reached the client: {got:?}"
    );
    assert!(!got.contains("zz"), "nothing past the valid bytes: {got:?}");
    let recs = rec.records().await;
    let resp = recs[0].response.as_ref().unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.error.as_deref(), Some("upstream_framing"));
    assert_eq!(resp.events.len(), 1, "the valid event is recorded");
}

/// Open sockets of the upstream listening on `port`, other than its listener and those in
/// TIME-WAIT (both sides closed): while the proxy holds a socket the upstream closed, the
/// upstream's side stays in FIN-WAIT-2 (Linux: /proc/net/tcp).
fn upstream_half_closed(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = f.get(1).and_then(|r| r.rsplit(':').next());
            local.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
                && !matches!(f.get(3), Some(&"0A") | Some(&"06"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_sockets_closed_by_the_upstream_are_reaped() {
    // The upstream answers keep-alive, and closes a connection idle for 300 ms; no request
    // follows that would check the pooled sockets out.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let conns = Arc::new(AtomicU64::new(0));
    let c2 = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c2.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let idle = Duration::from_millis(300);
                while let Ok(Some(_)) =
                    tokio::time::timeout(idle, read_request(&mut s, &mut buf)).await
                {
                    if s.write_all(&ok(b"{}", "")).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let rec = start(up).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut c = TcpStream::connect(rec.addr).await.unwrap();
        c.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        clients.push(c);
    }
    for c in &mut clients {
        let mut buf = Vec::new();
        assert_eq!(read_response(c, &mut buf, false).await.status, 200);
    }
    assert!(conns.load(Ordering::Relaxed) >= 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while upstream_half_closed(up.port()) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} upstream sockets still held open by the proxy",
            upstream_half_closed(up.port())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(clients);
    rec.records().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_content_lengths_go_out_once_and_two_hosts_are_a_400() {
    // The upstream keeps the raw request head it got and answers with two equal lengths.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let (head_tx, head_rx) = oneshot::channel::<String>();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            read_more(&mut s, &mut buf).await.unwrap();
        }
        let _ = head_tx.send(String::from_utf8_lossy(&buf).to_string());
        let resp = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nContent-Length: 2\r\n\r\nhi";
        s.write_all(resp).await.unwrap();
        let _ = read_more(&mut s, &mut buf).await;
    });
    let rec = start(up).await;
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let r = read_response(&mut c, &mut buf, false).await;
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hi"[..]));
    let lengths = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    assert_eq!(lengths.count(), 1, "{:?}", r.headers);
    let head = head_rx.await.unwrap();
    assert_eq!(
        head.to_ascii_lowercase()
            .matches("content-length: 3\r\n")
            .count(),
        1,
        "{head}"
    );
    let mut c = TcpStream::connect(rec.addr).await.unwrap();
    c.write_all(b"GET /v1/models HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    assert_eq!(read_response(&mut c, &mut buf, false).await.status, 400);
    rec.records().await;
}
