//! Dialing the upstream server (plain TCP or TLS with rustls) and hyper-util's pooling client.
//!
//! [`Connector`] is a `tower_service::Service<Uri>` used by the own loop's raw pool (`rawpool`)
//! and by hyper-util's pooling client (hyper's path, HTTP/1.1 or HTTP/2 upstream; tests use it
//! as a client too): it dials with
//! a connect timeout and TCP_NODELAY, and for `https` upstreams wraps the stream in rustls, trusting
//! `--upstream-ca` (PEM) when given, else the system bundle (`SSL_CERT_FILE`, then the usual
//! Debian/Red Hat paths; see [`crate::tls`]). ALPN offers `http/1.1` only, unless HTTP/2 upstream was asked for. It
//! does not know about recording.

use crate::netio::ClientStream;
use crate::record::tap::RequestTap;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_rustls::TlsConnector;

pub type UpstreamClient = Client<Connector, RequestTap>;

/// Dials the upstream.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

/// A plain or TLS connection to the upstream, as hyper's I/O: the shared
/// [`crate::netio::ClientStream`] (also what the own HTTP/1.1 loop's raw pool holds) plus
/// whether TLS negotiated HTTP/2.
pub struct UpstreamIo {
    io: TokioIo<ClientStream>,
    h2: bool,
}

impl UpstreamIo {
    /// The socket itself (the raw pool drives it without hyper).
    pub fn into_inner(self) -> ClientStream {
        self.io.into_inner()
    }
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self.io.inner() {
            ClientStream::Plain(s) => s.connected(),
            ClientStream::Tls(s) if self.h2 => s.get_ref().0.connected().negotiated_h2(),
            ClientStream::Tls(s) => s.get_ref().0.connected(),
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let is_https = dst.scheme_str() == Some("https");
            let host = dst.host().unwrap_or("").to_string();
            let tcp = http.call(dst).await.map_err(BoxError::from)?;
            match (is_https, tls) {
                (false, _) => Ok(UpstreamIo {
                    io: TokioIo::new(ClientStream::Plain(tcp.into_inner())),
                    h2: false,
                }),
                (true, None) => Err("https upstream without a TLS configuration".into()),
                (true, Some(tls)) => {
                    let name = rustls::pki_types::ServerName::try_from(
                        host.trim_start_matches('[')
                            .trim_end_matches(']')
                            .to_string(),
                    )
                    .map_err(|e| format!("upstream host {host:?}: {e}"))?;
                    let s = tls.connect(name, tcp.into_inner()).await?;
                    let h2 = s.get_ref().1.alpn_protocol() == Some(b"h2");
                    Ok(UpstreamIo {
                        io: TokioIo::new(ClientStream::Tls(Box::new(s))),
                        h2,
                    })
                }
            }
        })
    }
}

/// Options for [`build`].
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    pub connect_timeout: Duration,
    pub ca: Option<std::path::PathBuf>,
    pub https: bool,
    pub http2: bool,
    pub pool_idle: Duration,
}

/// Builds the pooling client (generic over the request body so tests can reuse it as a client).
pub fn build<B>(o: &UpstreamOptions) -> anyhow::Result<Client<Connector, B>>
where
    B: http_body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let connector = connector(o)?;
    let mut b = Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(o.pool_idle)
        .pool_max_idle_per_host(usize::MAX)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .timer(hyper_util::rt::TokioTimer::new());
    if o.http2 {
        b.http2_only(true);
    }
    Ok(b.build(connector))
}

/// The dialer for `o`: plain TCP (connect timeout, TCP_NODELAY, keepalive), TLS for https.
pub fn connector(o: &UpstreamOptions) -> anyhow::Result<Connector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(o.connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let tls = if o.https {
        let alpn: &[&[u8]] = if o.http2 { &[b"h2"] } else { &[b"http/1.1"] };
        let cfg = crate::tls::client_config(o.ca.as_deref(), "--upstream-ca", alpn)?;
        Some(TlsConnector::from(cfg))
    } else {
        None
    };
    Ok(Connector { http, tls })
}
