//! The admin endpoint on its own listener: `GET /metrics` (Prometheus text) and `GET /healthz`
//! (503 while the trace writer cannot write).

use super::counters::ProxyCounters;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::net::TcpListener;

async fn handle(
    stats: Arc<ProxyCounters>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, ctype, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            stats.render(),
        ),
        (&Method::GET, "/healthz") if stats.writer_failing.load(Relaxed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "failing: trace files cannot be written (records are lost)\n".to_string(),
        ),
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics or /healthz\n".to_string(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    Ok(r)
}

/// Serves the admin endpoint until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, stats: Arc<ProxyCounters>) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(stats.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
