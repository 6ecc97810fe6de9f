//! Accepting client connections: HTTP/1.1 and HTTP/2 (h2c by preface, or ALPN over TLS).
//!
//! Takes an already-bound listener (invariant 6). Each connection is served by hyper-util's auto
//! builder, which detects the HTTP/2 preface on plain TCP; with `--tls-cert/--tls-key` the TLS
//! handshake (rustls, ALPN `h2` then `http/1.1`) comes first. When the shutdown future resolves it
//! stops accepting, asks every connection to finish gracefully (HTTP/1 keep-alive off, HTTP/2
//! GOAWAY) and waits for in-flight exchanges up to the drain timeout. Connections are served on
//! a fixed set of single-threaded I/O runtimes (thread per core, like nginx's workers). It does not forward requests
//! itself (see `proxy`).

use super::proxy::Proxy;
use super::timing::{WriteClock, WriteStamped};
use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Builds the TLS acceptor from PEM files; errors name the flag and file.
pub fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs = crate::tls::load_certs(cert).context("--tls-cert")?;
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

fn http_builder() -> Builder<TokioExecutor> {
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
    builder
}

/// An accepted connection handed to an I/O thread.
struct Conn {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    watcher: Watcher,
}

/// Serves until `shutdown` resolves, then drains for at most `drain`. Returns whether every
/// connection finished within the drain timeout.
///
/// Connections are accepted here and dealt round-robin to one single-threaded runtime per entry
/// of `proxies` (each with its own upstream pool), so a connection, its upstream connection and
/// its body taps live on one thread: no work stealing and no cross-thread wake-ups per chunk.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    proxies: Vec<Arc<Proxy>>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<bool> {
    let builder = http_builder();
    let graceful = GracefulShutdown::new();
    let mut workers = Vec::with_capacity(proxies.len());
    for (k, proxy) in proxies.into_iter().enumerate() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Conn>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (builder, tls) = (builder.clone(), tls.clone());
        let join = std::thread::Builder::new()
            .name(format!("retrace-io-{k}"))
            .spawn(move || {
                rt.block_on(async move {
                    while let Some(c) = rx.recv().await {
                        match tokio::net::TcpStream::from_std(c.tcp) {
                            Ok(tcp) => {
                                tokio::spawn(serve_conn(
                                    tcp,
                                    c.peer,
                                    c.watcher,
                                    builder.clone(),
                                    proxy.clone(),
                                    tls.clone(),
                                ));
                            }
                            Err(e) => tracing::warn!("connection from {}: {e}", c.peer),
                        }
                    }
                });
                // Dropping the runtime drops connections still open after the drain; their taps
                // record them as cancelled.
                drop(rt);
            })?;
        workers.push((tx, join));
    }
    tokio::pin!(shutdown);
    let mut next = 0usize;
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
        let tcp = match tcp.into_std() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("connection from {peer}: {e}");
                continue;
            }
        };
        let conn = Conn {
            tcp,
            peer,
            watcher: graceful.watcher(),
        };
        if workers[next % workers.len()].0.send(conn).is_err() {
            tracing::error!("an I/O thread has stopped; connection from {peer} dropped");
        }
        next = next.wrapping_add(1);
    }
    drop(listener);
    let drained = tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_ok();
    let joins: Vec<_> = workers.into_iter().map(|(_tx, j)| j).collect();
    let _ = tokio::task::spawn_blocking(move || {
        for j in joins {
            let _ = j.join();
        }
    })
    .await;
    Ok(drained)
}

async fn serve_conn(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    watcher: Watcher,
    builder: Builder<TokioExecutor>,
    proxy: Arc<Proxy>,
    tls: Option<TlsAcceptor>,
) {
    let clock = Arc::new(WriteClock::new(proxy.stats.clone()));
    let svc = {
        let clock = clock.clone();
        service_fn(move |req| proxy.clone().handle(req, Some(clock.clone())))
    };
    let res = match tls {
        None => {
            watcher
                .watch(builder.serve_connection(WriteStamped::new(TokioIo::new(tcp), clock), svc))
                .await
        }
        Some(acc) => {
            let s = match tokio::time::timeout(Duration::from_secs(10), acc.accept(tcp)).await {
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
                .watch(builder.serve_connection(WriteStamped::new(TokioIo::new(s), clock), svc))
                .await
        }
    };
    if let Err(e) = res {
        tracing::debug!("connection from {peer}: {e}");
    }
}
