//! Accepting client connections: HTTP/1.1 and HTTP/2 (h2c by preface, or ALPN over TLS).
//!
//! Takes an already-bound listener (invariant 6). Each connection is served by hyper-util's auto
//! builder, which detects the HTTP/2 preface on plain TCP; with `--tls-cert/--tls-key` the TLS
//! handshake (rustls, ALPN `h2` then `http/1.1`) comes first. When the shutdown future resolves it
//! stops accepting, asks every connection to finish gracefully (HTTP/1 keep-alive off, HTTP/2
//! GOAWAY) and waits for in-flight exchanges up to the drain timeout. It does not forward requests
//! itself (see `proxy`).

use super::proxy::Proxy;
use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Builds the TLS acceptor from PEM files; errors name the flag and file.
pub fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs = super::upstream::load_certs(cert).context("--tls-cert")?;
    let key_pem = std::fs::read(key).with_context(|| format!("--tls-key {}", key.display()))?;
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .with_context(|| format!("--tls-key {}: not PEM", key.display()))?
        .with_context(|| format!("--tls-key {}: no private key found", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS server configuration")?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .context("--tls-cert/--tls-key do not form a usable certificate and key")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

/// Serves until `shutdown` resolves, then drains for at most `drain`. Returns whether every
/// connection finished within the drain timeout.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> bool {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(Some(10_000));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let proxy = proxy.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| proxy.clone().handle(req));
            let res = match tls {
                None => {
                    watcher
                        .watch(builder.serve_connection(TokioIo::new(tcp), svc))
                        .await
                }
                Some(acc) => {
                    let s = match tokio::time::timeout(Duration::from_secs(10), acc.accept(tcp))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!("TLS handshake with {peer} failed: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("TLS handshake with {peer} timed out");
                            return;
                        }
                    };
                    watcher
                        .watch(builder.serve_connection(TokioIo::new(s), svc))
                        .await
                }
            };
            if let Err(e) = res {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
    drop(listener);
    tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_ok()
}
