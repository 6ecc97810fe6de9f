//! One request → one [`Sample`]: send a prepared body, time every SSE message, classify failures.
//!
//! Uses hyper 1 HTTP/1.1 connections from the replayer's own keep-alive [`Pool`] (one connection
//! per in-flight stream, reused afterwards, `TCP_NODELAY`, warmed before the clock starts; a
//! connection goes back to the pool only after its response was read to the end). Each body frame is timestamped once on arrival and fed to the
//! SSE splitter; every complete message goes through [`crate::openai::parse_chunk`] and vLLM's
//! timing rules ([`StreamClock`]). A failure never ends the run: it becomes a sample with an error
//! kind — `http_<status>` (with the first bytes of the body as detail), `connect`, `reset`
//! (connection broken mid-response), `malformed_stream` (an SSE message that is not a JSON object),
//! `stream_error` (the server sent an error object in the stream), `no_content` (the stream ended
//! without a content message), `timeout_idle` (no byte for `idle_timeout`), `timeout_total`.
//! `http://` and `https://` targets (TLS in [`Pool`]); this module does not schedule or aggregate.

use crate::metrics::{Sample, ServerTimes, StreamClock};
use crate::openai::parse_chunk;
use crate::sse::SseParser;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{HeaderMap, Method, Uri};
use std::time::{Duration, Instant};

use super::pool::{Pool, SendError};
use super::request::BuiltRequest;

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port`.
    pub authority: String,
    /// The host alone (TLS server name).
    pub host: String,
    /// `https://`: connections are wrapped in TLS.
    pub tls: bool,
    /// Base path prefix (no trailing slash; usually empty).
    pub base_path: String,
    /// Headers sent with every request (auth included; never printed).
    pub headers: HeaderMap,
}

impl Target {
    /// Parses `--target` (`http://` or `https://`).
    pub fn parse(url: &str, headers: HeaderMap) -> Result<Target, String> {
        Target::parse_as(url, headers, "--target")
    }

    /// Parses a server URL given by `flag` (named in errors).
    pub fn parse_as(url: &str, headers: HeaderMap, flag: &str) -> Result<Target, String> {
        let url = url.trim_end_matches('/');
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{flag} {url:?} is not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(format!(
                    "{flag} {url:?}: give a URL like http://127.0.0.1:8000"
                ))
            }
        };
        let Some(auth) = uri.authority() else {
            return Err(format!("{flag} {url:?} has no host"));
        };
        let authority = match auth.port_u16() {
            Some(_) => auth.as_str().to_string(),
            None => format!("{}:{}", auth.host(), if tls { 443 } else { 80 }),
        };
        let host = auth
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        // A target given as .../v1 keeps working: paths we add start with /v1.
        let path = uri.path().trim_end_matches('/');
        let base_path = path.strip_suffix("/v1").unwrap_or(path).to_string();
        Ok(Target {
            authority,
            host,
            tls,
            base_path,
            headers,
        })
    }

    /// The origin-form request target for `path`.
    pub fn uri(&self, path: &str) -> Result<Uri, String> {
        format!("{}{}", self.base_path, path)
            .parse()
            .map_err(|e| format!("bad request URI: {e}"))
    }

    /// `http://authority/base` for display (no headers).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority, self.base_path)
    }
}

/// Per-request limits.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// No byte (headers or body) for this long → `timeout_idle`.
    pub idle: Duration,
    /// The whole request took longer → `timeout_total`.
    pub total: Duration,
}

fn ns_since(t0: Instant) -> u64 {
    Instant::now().saturating_duration_since(t0).as_nanos() as u64
}

/// What the dispatcher knows about a request before it is sent.
#[derive(Debug, Clone, Copy)]
pub struct SendTimes {
    pub intended_ns: u64,
    pub dispatched_ns: u64,
}

/// Sends `req` now and measures it. `sent_ns` is taken immediately before handing the request
/// to the connection pool.
pub async fn execute(
    pool: &Pool,
    target: &Target,
    req: &BuiltRequest,
    times: SendTimes,
    t0: Instant,
    timeouts: Timeouts,
) -> Sample {
    let mut sample = Sample {
        input_tokens: req.input_tokens,
        intended_ns: times.intended_ns,
        dispatched_ns: times.dispatched_ns,
        ..Default::default()
    };
    let fail = |mut s: Sample, kind: &str, detail: String| {
        s.error = Some(kind.to_string());
        s.error_detail = Some(detail);
        s.end_ns = ns_since(t0);
        s
    };
    let uri = match target.uri(&req.path) {
        Ok(u) => u,
        Err(e) => return fail(sample, "local", e),
    };
    let make = || {
        let mut b = hyper::Request::builder()
            .method(Method::POST)
            .uri(uri.clone());
        if let Some(h) = b.headers_mut() {
            h.extend(target.headers.clone());
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        b.body(Full::new(req.body.clone()))
            .map_err(|e| e.to_string())
    };
    sample.sent_ns = ns_since(t0);
    let stamp_sent = crate::stamps::now_ns();
    let deadline = tokio::time::Instant::now() + timeouts.total;
    let resp = tokio::select! {
        r = pool.send(make) => r,
        _ = tokio::time::sleep(timeouts.idle) => return fail(sample, "timeout_idle", "no response headers".into()),
        _ = tokio::time::sleep_until(deadline) => return fail(sample, "timeout_total", "no response headers".into()),
    };
    let (resp, conn) = match resp {
        Ok(r) => r,
        Err(SendError::Connect(e)) => return fail(sample, "connect", e),
        Err(SendError::Reset(e)) => return fail(sample, "reset", e),
    };
    let status = resp.status();
    let is_sse = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("event-stream"));
    // Diagnostic stamps: [sent, request written, response head read, first content read
    // from the socket, first content seen here].
    let mut stamps = conn.stamps.as_ref().map(|st| {
        let mut v = vec![
            stamp_sent,
            st.last_write_ns.load(std::sync::atomic::Ordering::Relaxed),
            st.last_read_ns.load(std::sync::atomic::Ordering::Relaxed),
        ];
        v.reserve(2);
        (st.port, v)
    });
    let mut body = resp.into_body();
    if !status.is_success() {
        let mut text = Vec::new();
        while text.len() < 2048 {
            let f = tokio::select! {
                f = body.frame() => f,
                _ = tokio::time::sleep(timeouts.idle) => None,
            };
            match f {
                Some(Ok(fr)) => {
                    if let Ok(d) = fr.into_data() {
                        text.extend_from_slice(&d);
                    }
                }
                _ => break,
            }
        }
        text.truncate(2048);
        let detail = String::from_utf8_lossy(&text).into_owned();
        return fail(sample, &format!("http_{}", status.as_u16()), detail);
    }
    let mut clock = StreamClock::new(req.api, sample.sent_ns);
    let mut parser = SseParser::default();
    let mut whole = Vec::new();
    let mut err: Option<(String, String)> = None;
    let mut server = ServerTimes::default();
    let mut handle =
        |data: &[u8], at: u64, clock: &mut StreamClock, err: &mut Option<(String, String)>| {
            match parse_chunk(data) {
                Ok(info) => {
                    if let Some(e) = info.error {
                        err.get_or_insert(("stream_error".into(), e));
                        return;
                    }
                    if let Some(m) = info.metrics {
                        server.queue_ms = m.queue_time_ms.or(server.queue_ms);
                        server.ttft_ms = m.time_to_first_token_ms.or(server.ttft_ms);
                    }
                    let usage = info.usage.map(|u| u.completion_tokens);
                    clock.on_message(at, info.has_choices, info.tokens, usage);
                }
                Err(e) => {
                    err.get_or_insert(("malformed_stream".into(), e));
                }
            }
        };
    let mut clean_end = false;
    // Two timers for the whole body, not two per frame: the idle timer is re-armed only when
    // it fires and data came since (lazily), so a streamed event costs no timer operations.
    let total_sleep = tokio::time::sleep_until(deadline);
    tokio::pin!(total_sleep);
    let idle_sleep = tokio::time::sleep(timeouts.idle);
    tokio::pin!(idle_sleep);
    let mut last_data = Instant::now();
    loop {
        let frame = tokio::select! {
            biased;
            f = body.frame() => f,
            _ = &mut idle_sleep => {
                let due = tokio::time::Instant::from_std(last_data + timeouts.idle);
                if due > tokio::time::Instant::now() {
                    idle_sleep.as_mut().reset(due);
                    continue;
                }
                err.get_or_insert(("timeout_idle".into(), "no data for the idle timeout".into()));
                break;
            }
            _ = &mut total_sleep => {
                err.get_or_insert(("timeout_total".into(), "request exceeded the total timeout".into()));
                break;
            }
        };
        last_data = Instant::now();
        let at = last_data.saturating_duration_since(t0).as_nanos() as u64;
        match frame {
            None => {
                clean_end = true;
                break;
            }
            Some(Err(e)) => {
                err.get_or_insert(("reset".into(), error_chain(&e)));
                break;
            }
            Some(Ok(fr)) => {
                let Ok(data) = fr.into_data() else { continue };
                if !is_sse {
                    whole.extend_from_slice(&data);
                    continue;
                }
                parser.feed_raw(&data, |ev| match ev {
                    Ok(ev) if ev.is_done() => {}
                    Ok(ev) => handle(ev.data, at, &mut clock, &mut err),
                    Err(e) => {
                        err.get_or_insert(("malformed_stream".into(), format!("{e:?}")));
                    }
                });
                if let Some((_, v)) = &mut stamps {
                    if v.len() == 3 && clock.ttft_ns().is_some() {
                        let read = conn.stamps.as_ref().map_or(0, |st| {
                            st.last_read_ns.load(std::sync::atomic::Ordering::Relaxed)
                        });
                        v.push(read);
                        v.push(crate::stamps::now_ns());
                    }
                }
                if err.is_some() {
                    break;
                }
            }
        }
    }
    let end = ns_since(t0);
    if let Some((port, v)) = stamps {
        crate::stamps::record("replay", port, v);
    }
    if clean_end {
        pool.checkin(conn);
    }
    if err.is_none() {
        if is_sse {
            if let Some(ev) = parser.finish() {
                match ev {
                    Ok(ev) if ev.is_done() => {}
                    Ok(ev) => handle(ev.data.as_bytes(), end, &mut clock, &mut err),
                    Err(e) => err = Some(("malformed_stream".into(), format!("{e:?}"))),
                }
            }
        } else {
            handle(&whole, end, &mut clock, &mut err);
        }
    }
    sample.end_ns = end;
    sample.server = server;
    sample.output_tokens = clock.output_tokens();
    sample.ttft_ns = clock.ttft_ns();
    sample.e2el_ns = clock.e2el_ns();
    if err.is_none() && sample.ttft_ns.is_none() {
        err = Some((
            "no_content".into(),
            "the response ended without a content message".into(),
        ));
    }
    sample.itls_ns = clock.into_itls();
    if let Some((kind, detail)) = err {
        sample.error = Some(kind);
        sample.error_detail = Some(detail);
    }
    sample
}

/// Asks the target for its first model (`GET /v1/models`), as `vllm bench serve` does.
pub async fn first_model(pool: &Pool, target: &Target) -> Result<String, String> {
    let uri = target.uri("/v1/models")?;
    let make = || {
        let mut b = hyper::Request::builder()
            .method(Method::GET)
            .uri(uri.clone());
        if let Some(h) = b.headers_mut() {
            h.extend(target.headers.clone());
        }
        b.body(Full::new(Bytes::new())).map_err(|e| e.to_string())
    };
    let (resp, conn) = tokio::time::timeout(Duration::from_secs(30), pool.send(make))
        .await
        .map_err(|_| "GET /v1/models timed out".to_string())?
        .map_err(|e| format!("GET /v1/models at {}: {e:?}", target.url()))?;
    let status = resp.status();
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
        .await
        .map_err(|_| "GET /v1/models timed out".to_string())?
        .map_err(|e| format!("GET /v1/models: {e}"))?
        .to_bytes();
    pool.checkin(conn);
    if !status.is_success() {
        return Err(format!("GET /v1/models answered HTTP {status}"));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("GET /v1/models: not JSON: {e}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "GET /v1/models listed no model; give --model".to_string())
}

/// Parses one `--header K=V` (or `K: V`).
pub fn parse_header(s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (k, v) = s
        .split_once('=')
        .or_else(|| s.split_once(':'))
        .ok_or_else(|| format!("--header {s:?}: expected K=V"))?;
    let name = HeaderName::from_bytes(k.trim().as_bytes())
        .map_err(|_| format!("--header {s:?}: {k:?} is not a header name"))?;
    let value = HeaderValue::from_str(v.trim())
        .map_err(|_| format!("--header {s:?}: the value is not a valid header value"))?;
    Ok((name, value))
}

/// An error and its sources, `: `-joined (hyper's top-level messages alone are vague).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_urls() {
        let t = Target::parse("https://example.org/v1/", HeaderMap::new()).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str(), t.tls),
            ("example.org:443", "example.org", true)
        );
        assert_eq!(
            (t.base_path.as_str(), t.url()),
            ("", "https://example.org:443".to_string())
        );
        let t = Target::parse("http://[::1]:8000/proxy", HeaderMap::new()).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str(), t.tls),
            ("[::1]:8000", "::1", false)
        );
        assert_eq!(t.uri("/v1/models").unwrap().path(), "/proxy/v1/models");
        let t = Target::parse("http://localhost", HeaderMap::new()).unwrap();
        assert_eq!(t.authority, "localhost:80");
        for bad in ["ftp://x", "localhost:8000", "http:///v1"] {
            let e = Target::parse(bad, HeaderMap::new()).expect_err(bad);
            assert!(e.contains("--target"), "{e}");
        }
    }
}
