//! The HTTP/2 engine (hyper): one exchange of an HTTP/2 client, or of any client of an HTTP/2
//! upstream (`--upstream-http2`), forwarded through hyper-util's pooling client with the rules of
//! `common`. No protocol switch happens here, so `Upgrade` stays hop-by-hop and a 101 is a 502.

use super::common::{self, classify, describe, error_json, Proxy};
use super::failure::ProxyFailure;
use super::tap::{lock, Mirror, Pending, ProxyBody, RequestTap, ResponseTap, Unsent};
use super::timing::WriteClock;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::sync::Arc;

fn error_response(status: u16, kind: &str, msg: &str) -> Response<ProxyBody> {
    let body = error_json(status, kind, msg);
    let mut r = Response::new(ProxyBody::Right(body.into()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Finishes an exchange that got no usable response head and answers the client.
fn fail(pending: Pending, f: ProxyFailure, msg: &str) -> Response<ProxyBody> {
    pending.end(Some(f), false);
    error_response(f.status().0, f.as_str(), msg)
}

/// Reads the body of a request that never reached the upstream, so the tap records its prompt:
/// at most `max` bytes beyond what was already read, for at most
/// [`common::UNSENT_BODY_WAIT`]. The client is answered with an error right after.
async fn read_for_record(mut body: RequestTap, max: usize) {
    use http_body_util::BodyExt;
    let deadline = tokio::time::Instant::now() + common::UNSENT_BODY_WAIT;
    let mut seen = 0usize;
    while seen <= max {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => seen += f.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
}

/// Whether hyper gave up because of the client's request body (it broke off or failed).
fn user_body(e: &(dyn std::error::Error + 'static)) -> bool {
    common::chain(e).any(|s| {
        let h = s.downcast_ref::<hyper::Error>();
        h.is_some_and(|h| h.is_user() || h.is_body_write_aborted())
    })
}

/// The upstream request target (absolute: the pooling client takes origin-form from it).
fn target(p: &Proxy, pq: &str) -> Result<Uri, http::Error> {
    Uri::builder()
        .scheme(p.scheme.clone())
        .authority(p.authority.clone())
        .path_and_query(format!("{}{pq}", p.base_path))
        .build()
}

/// Forwards one request and returns the (tapped) response. `client` is the client
/// connection's write clock (forwarding delay).
pub(crate) async fn handle(
    p: Arc<Proxy>,
    req: Request<Incoming>,
    client: Arc<WriteClock>,
) -> Result<Response<ProxyBody>, Infallible> {
    let arrival = tokio::time::Instant::now();
    p.stats
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (mut parts, body) = req.into_parts();
    if let Some(e) = common::refused(&parts, &p.via) {
        return Ok(error_response(e.status(), common::refusal(e).0, e.reason()));
    }
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let ex = p
        .recorder
        .exchange(arrival.into_std(), parts.method.as_str(), &pq);
    let (mut pending, cap) = Pending::new(ex, &p.recorder, &p.stats, p.capture_max);
    let uri = match target(&p, &pq) {
        Ok(u) => u,
        Err(e) => {
            pending.end(Some(ProxyFailure::Other), false);
            let msg = format!("cannot forward {pq:?}: {e}");
            return Ok(error_response(400, "bad_request", &msg));
        }
    };
    common::strip_hop_by_hop(&mut parts.headers);
    // The client sets `Host` (HTTP/1.1) or `:authority` (HTTP/2) from the target.
    parts.headers.remove(header::HOST);
    parts.headers.append(header::VIA, p.via.clone());
    parts.uri = uri;
    parts.version = if p.http2_upstream {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    let unsent = Unsent::default();
    let mirror = p.shadow.as_ref().map(|sh| Mirror {
        shadow: sh.clone(),
        method: parts.method.as_str().to_string(),
        path: pq.clone(),
    });
    let tap = RequestTap::new(
        body,
        cap.clone(),
        p.capture_max,
        p.stats.clone(),
        Some(unsent.clone()),
        mirror,
    );
    let up = Request::from_parts(parts, tap);
    let (headers_deadline, total_deadline) = p.deadlines(arrival);
    let resp = match tokio::time::timeout_at(headers_deadline, p.client.request(up)).await {
        Err(_) => {
            return Ok(fail(
                pending,
                ProxyFailure::TimeoutHeaders,
                common::NO_HEADERS,
            ));
        }
        Ok(Err(e)) => {
            let f = classify(e.is_connect(), user_body(&e), &e);
            let msg = describe(&e);
            if f.is_upstream_fault() {
                tracing::warn!("upstream request failed ({f}): {msg}");
            }
            let left = lock(&unsent).take();
            if let Some(body) = left {
                let tap = RequestTap::new(body, cap, p.capture_max, p.stats.clone(), None, None);
                read_for_record(tap, p.capture_max).await;
            }
            return Ok(fail(pending, f, &format!("upstream: {msg}")));
        }
        Ok(Ok(resp)) => resp,
    };
    let (mut parts, body) = resp.into_parts();
    if common::head_size(&parts.headers) > common::MAX_RESPONSE_HEAD {
        return Ok(fail(
            pending,
            ProxyFailure::UpstreamClosed,
            common::HEAD_TOO_LARGE,
        ));
    }
    let after = arrival.elapsed();
    p.stats.headers_latency.observe(after);
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
        let msg = "upstream: unrequested 101 switching protocols";
        return Ok(fail(pending, ProxyFailure::UpstreamClosed, msg));
    }
    common::strip_hop_by_hop(&mut parts.headers);
    let tap = ResponseTap::new(body, pending, p.idle_timeout, total_deadline, client);
    Ok(Response::from_parts(parts, ProxyBody::Left(tap)))
}
