//! Forwarding one request: rewrite the target, drop hop-by-hop headers, send upstream, tap bodies.
//!
//! Every method and path is forwarded to the upstream's scheme and authority (with its base path
//! prepended). Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it names,
//! `Keep-Alive`, `Proxy-Connection`, `TE` other than `trailers`, `Transfer-Encoding`, `Upgrade`)
//! are removed both ways; `Host` is replaced by the upstream authority; everything else, bodies
//! included, passes untouched. Errors before the response head become OpenAI-style JSON errors
//! (`502` for a refused or broken upstream, `504` for a connect or response-header timeout) and
//! are recorded with their kind. This is hyper's path (HTTP/2 clients or upstreams, and
//! `--h1-engine hyper`); `h1` applies the same rules to raw HTTP/1.1 heads. A protocol switch
//! (`Connection: upgrade` + `Upgrade`, not `h2c`) from an HTTP/1.1 client towards an HTTP/1.1
//! upstream keeps those two headers; a `101` answer goes to the client and both connections are
//! taken over with hyper's upgrade API (`hyper::upgrade::on`) and joined by a `tunnel`; any
//! other answer is an ordinary response. HTTP/2 clients cannot ask for one (extended CONNECT,
//! RFC 8441, is not supported) and an HTTP/2 upstream cannot grant one: there `Upgrade` stays
//! hop-by-hop. An unrequested 101 is a 502. This module does not accept connections (see
//! `server`) and does not parse bodies.

use super::pool::{H1Pool, Pooled, SendError};
use super::server::Drain;
use super::stats::Stats;
use super::tap::{Pending, ProxyBody, RequestTap, ResponseTap};
use super::timing::WriteClock;
use super::upstream::UpstreamClient;
use super::writer::Recorder;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How requests reach the upstream.
pub enum Upstream {
    /// HTTP/1.1 (plain or TLS): this I/O thread's own pool of bare hyper connections.
    H1(Arc<H1Pool>),
    /// HTTP/2 (`--upstream-http2`): hyper-util's pooling client (one multiplexed connection).
    Client(Box<UpstreamClient>),
}

/// Per-request forwarding settings and shared handles.
pub struct Proxy {
    pub upstream: Upstream,
    pub scheme: Scheme,
    pub authority: Authority,
    /// `Host` sent upstream (the upstream authority).
    pub host: HeaderValue,
    /// Upstream base path without a trailing slash ("" for none).
    pub base_path: String,
    pub http2_upstream: bool,
    pub recorder: Recorder,
    pub stats: Arc<Stats>,
    pub headers_timeout: Duration,
    pub idle_timeout: Duration,
    pub total_timeout: Option<Duration>,
    pub capture_max: usize,
    /// This I/O thread's raw upstream sockets for the own HTTP/1.1 loop (`--h1-engine own`
    /// with an HTTP/1.1 upstream); `None`: every client goes through hyper.
    pub raw: Option<super::rawpool::RawPool>,
}

/// Whether a header name is hop-by-hop by itself (without being named in `Connection`).
fn is_hop_by_hop(n: &HeaderName) -> bool {
    n == header::CONNECTION
        || n == header::TRANSFER_ENCODING
        || n == header::UPGRADE
        || n == header::TRAILER
        || n == header::TE
        || n.as_str() == "keep-alive"
        || n.as_str() == "proxy-connection"
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1) in place.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages carry none: one pass over the names, no lookups.
    if !h.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TRAILER,
    ] {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
    let te_trailers = h
        .get_all(header::TE)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.contains("trailers")));
    h.remove(header::TE);
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// The `Upgrade` values of a request that asks to switch protocols: `Connection` names `upgrade`
/// and `Upgrade` names at least one protocol, none of them `h2c` (an HTTP/2 upgrade would hide the
/// requests inside from the recorder). `None`: not a switch the proxy forwards.
pub fn upgrade_request(h: &HeaderMap) -> Option<Vec<HeaderValue>> {
    let named = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !named {
        return None;
    }
    let values: Vec<HeaderValue> = h.get_all(header::UPGRADE).iter().cloned().collect();
    let mut any = false;
    for v in &values {
        for t in v.to_str().ok()?.split(',').map(str::trim) {
            if t.eq_ignore_ascii_case("h2c") {
                return None;
            }
            any |= !t.is_empty();
        }
    }
    any.then_some(values)
}

/// Puts a switch's `Upgrade` values back after [`strip_hop_by_hop`], with `Connection: upgrade`.
fn keep_upgrade(h: &mut HeaderMap, values: Vec<HeaderValue>) {
    for v in values {
        h.append(header::UPGRADE, v);
    }
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

/// The OpenAI-style JSON error body the proxy answers with.
pub fn error_json(status: u16, kind: &str, msg: &str) -> String {
    serde_json::json!({
        "error": {
            "message": format!("retrace record: {msg}"),
            "type": kind,
            "code": status,
        }
    })
    .to_string()
}

fn error_response(status: StatusCode, kind: &str, msg: &str) -> Response<ProxyBody> {
    let body = error_json(status.as_u16(), kind, msg);
    let mut r = Response::new(ProxyBody::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Names what went wrong before the response head.
pub fn classify(is_connect: bool, e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut timed_out = false;
    let mut user_body = false;
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            timed_out |= io.kind() == std::io::ErrorKind::TimedOut;
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            user_body |= h.is_user() || h.is_body_write_aborted();
        }
        timed_out |= s.to_string().contains("timed out");
        src = s.source();
    }
    if is_connect {
        if timed_out {
            "timeout_connect"
        } else {
            "upstream_connect"
        }
    } else if user_body {
        "client_body"
    } else {
        "upstream_closed"
    }
}

pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// How long a request that never reached the upstream may take to hand over the rest of its body
/// for the record, before the client gets its error.
const UNSENT_BODY_WAIT: Duration = Duration::from_secs(2);

/// Reads the body of a request that never reached the upstream, so the tap records its prompt:
/// at most `max` bytes beyond what was already read, for at most [`UNSENT_BODY_WAIT`]. The
/// client is answered with an error right after; nothing is forwarded.
async fn read_for_record(mut body: RequestTap, max: usize) {
    use http_body_util::BodyExt;
    let deadline = tokio::time::Instant::now() + UNSENT_BODY_WAIT;
    let mut seen = 0usize;
    while seen <= max {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => seen += f.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
}

impl Proxy {
    /// The upstream request target: origin-form for our HTTP/1 pool (with `Host` set
    /// separately), absolute for the pooling client.
    fn target(&self, pq: &str) -> Result<Uri, http::Error> {
        let pq = if self.base_path.is_empty() {
            pq.to_string()
        } else {
            format!("{}{pq}", self.base_path)
        };
        match self.upstream {
            Upstream::H1(_) => Uri::builder().path_and_query(pq).build(),
            Upstream::Client(_) => Uri::builder()
                .scheme(self.scheme.clone())
                .authority(self.authority.clone())
                .path_and_query(pq)
                .build(),
        }
    }

    /// Forwards one request and returns the (tapped) response. `client` is the client
    /// connection's write clock (forwarding delay); `drain` the drain signal a tunnel watches
    /// (`None`: this connection cannot switch protocols, e.g. HTTP/2).
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        client: Option<Arc<WriteClock>>,
        drain: Option<Drain>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let arrival = tokio::time::Instant::now();
        self.stats
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (mut parts, body) = req.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let mut ex = self
            .recorder
            .exchange(arrival.into_std(), parts.method.as_str(), &pq);
        // The exchange's (reused) capture buffer goes to the request tap and comes back at the end.
        let cap = Arc::new(Mutex::new(std::mem::take(&mut ex.request)));
        let mut pending = Pending::new(
            ex,
            cap.clone(),
            self.recorder.clone(),
            self.stats.clone(),
            self.capture_max,
        );
        let uri = match self.target(&pq) {
            Ok(u) => u,
            Err(e) => {
                pending.finish(Some("other"));
                return Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("cannot forward {pq:?}: {e}"),
                ));
            }
        };
        // A protocol switch needs HTTP/1.1 on both hops and the client connection's upgrade.
        let switch = match (&self.upstream, &drain) {
            (Upstream::H1(_), Some(_)) if parts.version == Version::HTTP_11 => {
                upgrade_request(&parts.headers)
            }
            _ => None,
        };
        let switch = switch.and_then(|v| {
            parts
                .extensions
                .remove::<hyper::upgrade::OnUpgrade>()
                .map(|on| (v, on))
        });
        strip_hop_by_hop(&mut parts.headers);
        let client_upgrade = switch.map(|(values, on)| {
            keep_upgrade(&mut parts.headers, values);
            on
        });
        match self.upstream {
            Upstream::H1(_) => {
                parts.headers.insert(header::HOST, self.host.clone());
            }
            Upstream::Client(_) => {
                parts.headers.remove(header::HOST);
            }
        }
        parts.uri = uri;
        parts.version = if self.http2_upstream {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let up = Request::from_parts(
            parts,
            RequestTap::new(body, cap, self.capture_max, self.stats.clone()),
        );
        let total_deadline = self.total_timeout.map(|t| arrival + t);
        let headers_deadline = match total_deadline {
            Some(t) => t.min(arrival + self.headers_timeout),
            None => arrival + self.headers_timeout,
        };
        let sent = async {
            match &self.upstream {
                Upstream::H1(pool) => match pool.send(up).await {
                    Ok((resp, conn)) => Ok((resp, Some(conn))),
                    Err((e, unsent)) => {
                        let connect = matches!(e, SendError::Connect(_));
                        Err((
                            connect,
                            Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
                            unsent,
                        ))
                    }
                },
                Upstream::Client(c) => match c.request(up).await {
                    Ok(resp) => Ok((resp, None)),
                    Err(e) => Err((e.is_connect(), Box::new(e) as _, None)),
                },
            }
        };
        let res = tokio::time::timeout_at(headers_deadline, sent).await;
        match res {
            Err(_) => {
                pending.finish(Some("timeout_headers"));
                Ok(error_response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "timeout_headers",
                    "upstream sent no response headers within the timeout",
                ))
            }
            Ok(Err((connect, e, unsent))) => {
                let kind = classify(connect, &*e);
                let msg = describe(&*e);
                tracing::warn!("upstream request failed ({kind}): {msg}");
                if let Some(req) = unsent {
                    read_for_record(req.into_body(), self.capture_max).await;
                }
                pending.finish(Some(kind));
                let status = if kind == "timeout_connect" {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                Ok(error_response(status, kind, &format!("upstream: {msg}")))
            }
            Ok(Ok((resp, conn))) => {
                let (mut parts, body) = resp.into_parts();
                let after = arrival.elapsed();
                self.stats.headers_latency.observe(after);
                if let Some(ex) = pending.exchange() {
                    ex.status = parts.status.as_u16();
                    ex.headers_after = Some(after);
                    if let Some(v) = parts
                        .headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                    {
                        ex.content_type.push_str(v);
                    }
                }
                if parts.status == StatusCode::SWITCHING_PROTOCOLS {
                    let (Some(client_up), Some(up_up), Some(drain)) = (
                        client_upgrade,
                        parts.extensions.remove::<hyper::upgrade::OnUpgrade>(),
                        drain,
                    ) else {
                        drop(conn);
                        pending.finish(Some("upstream_closed"));
                        return Ok(error_response(
                            StatusCode::BAD_GATEWAY,
                            "upstream_closed",
                            "upstream: unrequested 101 switching protocols",
                        ));
                    };
                    let values: Vec<HeaderValue> = parts
                        .headers
                        .get_all(header::UPGRADE)
                        .iter()
                        .cloned()
                        .collect();
                    strip_hop_by_hop(&mut parts.headers);
                    keep_upgrade(&mut parts.headers, values);
                    drop(body);
                    tokio::spawn(tunnel(
                        client_up,
                        up_up,
                        conn,
                        pending,
                        drain,
                        self.stats.clone(),
                    ));
                    return Ok(Response::from_parts(parts, ProxyBody::Full(None)));
                }
                strip_hop_by_hop(&mut parts.headers);
                let tap = ResponseTap::new(
                    body,
                    pending,
                    self.idle_timeout,
                    total_deadline,
                    conn,
                    client,
                );
                Ok(Response::from_parts(parts, ProxyBody::Tap(tap)))
            }
        }
    }
}

/// Once the 101 went to the client, joins the two upgraded connections (hyper hands them over
/// when the heads are through) until the tunnel ends, then records the exchange. The upstream
/// connection is never pooled again.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    conn: Option<Pooled>,
    pending: Pending,
    mut drain: Drain,
    stats: Arc<Stats>,
) {
    let (c, u) = tokio::join!(client, upstream);
    drop(conn);
    match (c, u) {
        (Ok(c), Ok(u)) => {
            let mut c = hyper_util::rt::TokioIo::new(c);
            let mut u = hyper_util::rt::TokioIo::new(u);
            let end = super::tunnel::run(
                &mut c,
                &mut u,
                Vec::new(),
                Vec::new(),
                Some(&mut drain),
                &stats,
            )
            .await;
            super::tunnel::record(pending, &end);
        }
        // The client left before the switch was through.
        (Err(_), _) => pending.end(None, true),
        (Ok(_), Err(_)) => pending.end(Some("upstream_reset"), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, x-foo"));
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers, deflate"));
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, vec!["authorization", "content-type", "te"]);
        assert_eq!(h["te"], "trailers");
    }

    #[test]
    fn protocol_switches_are_recognised_and_kept() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("sec-websocket-key", HeaderValue::from_static("k"));
        let v = upgrade_request(&h).unwrap();
        strip_hop_by_hop(&mut h);
        keep_upgrade(&mut h, v);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["sec-websocket-key"], "k");
        for (conn, up) in [
            ("keep-alive", "websocket"),
            ("upgrade", ""),
            ("Upgrade, HTTP2-Settings", "h2c"),
        ] {
            let mut h = HeaderMap::new();
            h.insert("connection", HeaderValue::from_static(conn));
            h.insert("upgrade", HeaderValue::from_static(up));
            assert!(upgrade_request(&h).is_none(), "{conn} / {up}");
        }
    }
}
