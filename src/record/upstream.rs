//! Dialing the upstream (plain TCP or rustls) for both engines, and hyper-util's pooling client
//! for the HTTP/2 one. TLS trusts `--upstream-ca` when given, else the system bundle
//! ([`crate::sys::tls`]); ALPN offers `h2` only with `--upstream-http2`, else `http/1.1`.

use super::tap::RequestTap;
use crate::sys::netio::ClientStream;
use crate::wire::BoxError;
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_rustls::TlsConnector;

pub(crate) type UpstreamClient = Client<Connector, RequestTap>;

/// Dials the upstream.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

impl Connection for ClientStream {
    fn connected(&self) -> Connected {
        match self {
            ClientStream::Plain(s) => s.connected(),
            ClientStream::Tls(s) if s.get_ref().1.alpn_protocol() == Some(b"h2") => {
                s.get_ref().0.connected().negotiated_h2()
            }
            ClientStream::Tls(s) => s.get_ref().0.connected(),
        }
    }
}

/// The upstream socket as hyper's I/O.
pub(crate) type UpstreamIo = TokioIo<ClientStream>;

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
                (false, _) => Ok(TokioIo::new(ClientStream::Plain(tcp.into_inner()))),
                (true, None) => Err("https upstream without a TLS configuration".into()),
                (true, Some(tls)) => {
                    let name = rustls::pki_types::ServerName::try_from(
                        host.trim_start_matches('[')
                            .trim_end_matches(']')
                            .to_string(),
                    )
                    .map_err(|e| format!("upstream host {host:?}: {e}"))?;
                    let s = tls.connect(name, tcp.into_inner()).await?;
                    Ok(TokioIo::new(ClientStream::Tls(Box::new(s))))
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
pub(crate) fn connector(o: &UpstreamOptions) -> anyhow::Result<Connector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(o.connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    let tls = if o.https {
        let alpn: &[&[u8]] = if o.http2 { &[b"h2"] } else { &[b"http/1.1"] };
        let cfg = crate::sys::tls::client_config(o.ca.as_deref(), "--upstream-ca", alpn)?;
        Some(TlsConnector::from(cfg))
    } else {
        None
    };
    Ok(Connector { http, tls })
}
