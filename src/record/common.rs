//! What both engines share (`h1`, and `proxy` for HTTP/2), in the manner of pingora's
//! `proxy_common.rs`: per-I/O-thread settings, the drain signal, header rules on header maps
//! (the hop-by-hop list is [`crate::wire::h1::is_hop_by_hop`] for raw heads too), deadlines,
//! failure classification and the JSON error body.

use super::counters::ProxyCounters;
use super::failure::ProxyFailure;
use super::rawpool::RawPool;
use super::upstream::UpstreamClient;
use super::writer::Recorder;
use crate::wire::h1::HeadError;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The drain signal: `None` while serving; once the proxy drains, the instant at which upgraded
/// tunnels are cut (a little before the drain deadline, so their records say so instead of the
/// runtime dropping them). Every receiver is dropped when its connection or tunnel ends.
pub(crate) type Drain = watch::Receiver<Option<Instant>>;

/// Largest response head accepted from the upstream, on both paths (bytes).
pub(crate) const MAX_RESPONSE_HEAD: usize = crate::wire::h1::MAX_HEAD;
/// Largest request head accepted from a client, by both engines (bytes, as HTTP/1.1 writes
/// it); a larger one, or one of more than [`crate::wire::h1::MAX_HEADERS`] fields, is a 431.
pub(crate) const MAX_REQUEST_HEAD: usize = crate::wire::h1::MAX_HEAD;
/// The header list HTTP/2 connections decode (`SETTINGS_MAX_HEADER_LIST_SIZE`): room enough
/// that a head over [`MAX_REQUEST_HEAD`] is decoded and answered 431 on its own stream (h2
/// itself answers 431 above this; its decoder gives the connection up at several times it).
pub(crate) const H2_HEADER_LIST: u32 = 4 * MAX_REQUEST_HEAD as u32;
/// The message of the 502 for a response head over [`MAX_RESPONSE_HEAD`].
pub(crate) const HEAD_TOO_LARGE: &str = "response head from upstream too large";
/// The message of the 504 for [`ProxyFailure::TimeoutHeaders`].
pub(crate) const NO_HEADERS: &str = "upstream sent no response headers within the timeout";
/// How long a request that reached no upstream may take to hand over the rest of its body for
/// the record, before the client gets its error.
pub(crate) const UNSENT_BODY_WAIT: Duration = Duration::from_secs(2);

/// Forwarding settings and shared handles of one I/O thread.
pub(crate) struct Proxy {
    pub(crate) recorder: Recorder,
    pub(crate) stats: Arc<ProxyCounters>,
    pub(crate) scheme: Scheme,
    pub(crate) authority: Authority,
    /// `Host` sent upstream by the own loop (the upstream authority).
    pub(crate) host: HeaderValue,
    /// Upstream base path without a trailing slash ("" for none).
    pub(crate) base_path: String,
    pub(crate) http2_upstream: bool,
    pub(crate) headers_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) total_timeout: Option<Duration>,
    pub(crate) capture_max: usize,
    /// Raw upstream sockets of the own HTTP/1.1 loop; `None` with an HTTP/2 upstream (then every
    /// client is served by hyper).
    pub(crate) raw: Option<RawPool>,
    /// hyper-util's pooling client (HTTP/1.1 or HTTP/2 upstream) for exchanges hyper serves.
    pub(crate) client: UpstreamClient,
    /// The `Via` entry added to forwarded requests ([`via_entry`]).
    pub(crate) via: HeaderValue,
    /// The shadow side, with `--shadow`.
    pub(crate) shadow: Option<Arc<super::shadow::Shadower>>,
}

impl Proxy {
    /// The response-header deadline (never past the total one) and the total deadline of an
    /// exchange that arrived at `arrival`.
    pub(crate) fn deadlines(&self, arrival: Instant) -> (Instant, Option<Instant>) {
        let total = self.total_timeout.map(|t| arrival + t);
        let headers = arrival + self.headers_timeout;
        (total.map_or(headers, |t| t.min(headers)), total)
    }
}

/// This proxy's `Via` entry (RFC 9110 §7.6.3), `1.1 retrace-<random id>`: a request that arrives
/// carrying it went round a loop (an `--upstream` pointing back at the proxy) and is refused.
pub(crate) fn via_entry() -> HeaderValue {
    let v = format!("1.1 retrace-{:016x}", rand::random::<u64>());
    HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("1.1 retrace"))
}

/// Why a request head cannot be forwarded (the rules [`crate::wire::h1`] applies to raw heads):
/// over [`MAX_REQUEST_HEAD`] or [`crate::wire::h1::MAX_HEADERS`] fields (431), two `Host` fields
/// (400), or our `Via` entry (508, a loop).
pub(crate) fn refused(head: &http::request::Parts, via: &HeaderValue) -> Option<HeadError> {
    let h = &head.headers;
    if h.len() > crate::wire::h1::MAX_HEADERS || request_head_size(head) > MAX_REQUEST_HEAD {
        return Some(HeadError::TooLarge);
    }
    if h.get_all(header::HOST).iter().count() > 1 {
        return Some(HeadError::Malformed("more than one host header"));
    }
    let ours = |v: &HeaderValue| crate::wire::h1::via_names(v.as_bytes(), via.as_bytes());
    h.get_all(header::VIA)
        .iter()
        .any(ours)
        .then_some(HeadError::Loop)
}

/// The error kind and reason phrase of a refused request head.
pub(crate) fn refusal(e: HeadError) -> (&'static str, &'static str) {
    match e {
        HeadError::TooLarge => (
            "request_header_too_large",
            "Request Header Fields Too Large",
        ),
        HeadError::Malformed(_) => ("bad_request", "Bad Request"),
        HeadError::Loop => ("loop_detected", "Loop Detected"),
    }
}

/// The OpenAI-style JSON error body the proxy answers with.
pub(crate) fn error_json(status: u16, kind: &str, msg: &str) -> String {
    serde_json::json!({
        "error": {
            "message": format!("retrace record: {msg}"),
            "type": kind,
            "code": status,
        }
    })
    .to_string()
}

/// Names a failure to reach the upstream before the response head: `is_connect` when dialing
/// failed; `user_body` when the client's own body broke the request.
pub(crate) fn classify(
    is_connect: bool,
    user_body: bool,
    e: &(dyn std::error::Error + 'static),
) -> ProxyFailure {
    let timed_out = chain(e).any(|s| {
        let io = s.downcast_ref::<std::io::Error>();
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || s.to_string().contains("timed out")
    });
    match (is_connect, timed_out, user_body) {
        (true, true, _) => ProxyFailure::TimeoutConnect,
        (true, false, _) => ProxyFailure::UpstreamConnect,
        (false, _, true) => ProxyFailure::ClientBody,
        (false, _, false) => ProxyFailure::UpstreamClosed,
    }
}

/// An error and its sources, outermost first.
pub(crate) fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |s| s.source())
}

/// An error and its chain of sources, `: `-joined.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let parts: Vec<String> = chain(e).map(ToString::to_string).collect();
    parts.join(": ")
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1) in place, keeping `TE: trailers`. A message
/// with `Transfer-Encoding` also loses its `Content-Length` (RFC 9112 §6.3: the transfer coding
/// wins, and the next hop frames the body itself).
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages carry none: one pass over the names, no lookups.
    if !h.keys().any(|n| crate::wire::h1::is_hop_by_hop(n.as_str())) {
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
    if h.remove(header::TRANSFER_ENCODING).is_some() {
        h.remove(header::CONTENT_LENGTH);
    }
    let te_trailers = h
        .get_all(header::TE)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.contains("trailers")));
    let hop: Vec<HeaderName> = h
        .keys()
        .filter(|n| crate::wire::h1::is_hop_by_hop(n.as_str()))
        .cloned()
        .collect();
    for n in hop {
        h.remove(n);
    }
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// The size of a head's fields as HTTP/1.1 writes them (`name: value\r\n`).
pub(crate) fn head_size(h: &HeaderMap) -> usize {
    h.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum()
}

/// The size of a request head as HTTP/1.1 writes it: request line, `Host` (from an HTTP/2
/// `:authority`), fields and the blank line.
fn request_head_size(head: &http::request::Parts) -> usize {
    let target = head.uri.path_and_query().map_or(1, |pq| pq.as_str().len());
    let host = match head.headers.contains_key(header::HOST) {
        true => 0,
        false => head.uri.authority().map_or(0, |a| a.as_str().len() + 8),
    };
    head.method.as_str().len() + 1 + target + 11 + host + head_size(&head.headers) + 2
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
        h.insert("content-length", HeaderValue::from_static("3"));
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
    fn connect_failures_are_timeouts_or_refusals() {
        let t = std::io::Error::new(std::io::ErrorKind::TimedOut, "x");
        assert_eq!(classify(true, false, &t), ProxyFailure::TimeoutConnect);
        let r = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(classify(true, false, &r), ProxyFailure::UpstreamConnect);
        assert_eq!(classify(false, false, &r), ProxyFailure::UpstreamClosed);
        assert_eq!(classify(false, true, &r), ProxyFailure::ClientBody);
    }
}
