//! The replayer's HTTP/1.1 connection pool: keep-alive connections to one target, opened ahead.
//!
//! Each in-flight stream needs its own HTTP/1.1 connection. Opening hundreds at the instant a burst
//! is due overflows the server's accept queue (SYNs dropped, a 1 s retransmit added to TTFT), and
//! charges connection setup to the first requests. So the pool can be warmed before the clock
//! starts ([`Pool::warm`], a bounded number of connects at a time), hands out idle connections
//! LIFO, opens a new one when none is idle, and takes a connection back only after its response was
//! read to the end. [`Pool::exchange`] writes a request and reads its response head; a request that
//! fails on a reused connection before any response byte (the server closed it while idle) is
//! retried once on a fresh connection, as browsers do. `https://` targets get rustls (ALPN
//! `http/1.1`, trust roots from `--target-ca` or the system bundle, see [`crate::sys::tls`]); the TLS
//! handshake is part of the connect, so warming takes it off the clock too. [`Pool::get`] is the
//! small GET of `/v1/models` and scrapes. No scheduling and no measuring here.

use crate::replay::http::h1conn::{RawConn, SendError};
use crate::replay::http::target::Target;
use crate::sys::netio::ClientStream;
use crate::wire::h1::{self, BodyDecoder, ResponseHead};
use hyper::header::{HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use hyper::HeaderMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Why a connection to the target could not be opened: the TCP connect or the TLS handshake.
#[derive(Debug, thiserror::Error)]
#[error("{stage} {addr}: {source}")]
pub(crate) struct ConnectError {
    stage: &'static str,
    addr: SocketAddr,
    source: std::io::Error,
}

impl ConnectError {
    /// What went wrong, in words: `connection refused at 127.0.0.1:1`.
    pub(crate) fn reason(&self) -> String {
        match self.source.kind() {
            std::io::ErrorKind::ConnectionRefused => format!("connection refused at {}", self.addr),
            std::io::ErrorKind::TimedOut => {
                format!(
                    "no answer from {} within {} s",
                    self.addr,
                    REACH_LIMIT.as_secs()
                )
            }
            _ => match self.certificate_hint() {
                Some(hint) => format!("{self}: {hint}"),
                None => self.to_string(),
            },
        }
    }

    /// What to do about a certificate the handshake refused, when that is why it failed.
    fn certificate_hint(&self) -> Option<&'static str> {
        use rustls::CertificateError as C;
        let e = self.source.get_ref()?.downcast_ref::<rustls::Error>()?;
        let rustls::Error::InvalidCertificate(c) = e else {
            return None;
        };
        // webpki's reason, which rustls passes on as an opaque error.
        let ca_as_leaf = format!("{c:?}").contains("CaUsedAsEndEntity");
        Some(match c {
            _ if ca_as_leaf => "the target serves a CA certificate as its own (a self-signed CA): serve a leaf certificate signed by that CA, and pass the CA with --target-ca FILE",
            C::UnknownIssuer => "the target's certificate is not signed by a CA this replay trusts: pass the CA that signed it with --target-ca FILE (PEM)",
            C::NotValidForName | C::NotValidForNameContext { .. } => "the target's certificate is not valid for the host name in --target: use the name it was issued for",
            C::Expired | C::ExpiredContext { .. } => "the target's certificate has expired",
            _ => return None,
        })
    }
}

/// How long [`Pool::reach`] waits for the first connection.
const REACH_LIMIT: Duration = Duration::from_secs(30);

/// A pool of connections to one address.
pub(crate) struct Pool {
    addr: SocketAddr,
    /// TLS connector and server name for `https://` targets.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    host: HeaderValue,
    /// Reads are stamped with the kernel's receive time (plain TCP).
    kernel_rx: bool,
    /// Idle connections, LIFO.
    idle: Mutex<Vec<RawConn>>,
    /// Reader threads for plain response bodies.
    readers: Option<crate::replay::http::reader::Readers>,
}

impl Pool {
    /// A pool for `target` (its `host:port` resolved once); `ca` is `--target-ca`.
    pub(crate) async fn new(target: &Target, ca: Option<&Path>) -> Result<Pool, String> {
        let authority = target.authority.as_str();
        let tls = if target.tls {
            let cfg = crate::sys::tls::client_config(ca, "--target-ca", &[b"http/1.1"])
                .map_err(|e| format!("{e:#}"))?;
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| format!("{:?} is not a TLS server name: {e}", target.host))?;
            Some((tokio_rustls::TlsConnector::from(cfg), name))
        } else {
            None
        };
        let addr = tokio::net::lookup_host(authority)
            .await
            .map_err(|e| format!("cannot resolve {authority}: {e}"))?
            .next()
            .ok_or_else(|| format!("{authority} resolves to no address"))?;
        let host = HeaderValue::from_str(authority)
            .map_err(|_| format!("{authority:?} is not a valid Host header"))?;
        Ok(Pool {
            addr,
            tls,
            host,
            kernel_rx: false,
            idle: Mutex::new(Vec::new()),
            readers: None,
        })
    }

    /// Stamp reads with the kernel's receive time (plain TCP targets).
    pub(crate) fn with_kernel_rx(mut self, on: bool) -> Pool {
        self.kernel_rx = on;
        self
    }

    /// Reads plain response bodies on `n` reader threads ([`crate::replay::http::reader`]); 0: on the requests'
    /// tasks. TLS bodies always stay on the tasks. `batch` ([`crate::replay::http::reader::Readers::start`])
    /// applies only with kernel stamps (were the kernel to refuse one socket its stamps, that
    /// socket's reads would count from the read, up to `batch` late; Linux TCP sockets always
    /// accept them).
    pub(crate) fn with_readers(mut self, n: usize, batch: Duration) -> std::io::Result<Pool> {
        let batch = if self.kernel_rx {
            batch
        } else {
            Duration::ZERO
        };
        self.readers = if n > 0 && self.tls.is_none() {
            Some(crate::replay::http::reader::Readers::start(n, batch)?)
        } else {
            None
        };
        Ok(self)
    }

    /// The reader threads, if bodies are read on them.
    pub(crate) fn readers(&self) -> Option<&crate::replay::http::reader::Readers> {
        self.readers.as_ref()
    }

    /// What the responses' arrival instants are: `"kernel"` (plain TCP with kernel stamps; a
    /// read the kernel did not stamp falls back to its own instant) or `"read"`.
    pub(crate) fn rx_stamp(&self) -> &'static str {
        if self.kernel_rx && self.tls.is_none() {
            "kernel"
        } else {
            "read"
        }
    }

    /// Plain `http://` (no TLS wrapping of connections).
    pub(crate) fn is_plain(&self) -> bool {
        self.tls.is_none()
    }

    /// The `Host` header value (`host:port`).
    pub(crate) fn host(&self) -> &[u8] {
        self.host.as_bytes()
    }

    /// Opens a connection: TCP (`TCP_NODELAY`), then TLS for `https://`.
    pub(crate) async fn connect(&self) -> Result<RawConn, ConnectError> {
        let addr = self.addr;
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| ConnectError {
                stage: "connect",
                addr,
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let io = match &self.tls {
            Some((connector, name)) => ClientStream::Tls(Box::new(
                connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|source| ConnectError {
                        stage: "TLS handshake with",
                        addr,
                        source,
                    })?,
            )),
            None => ClientStream::Plain(stream),
        };
        Ok(RawConn::new(io, self.kernel_rx))
    }

    /// Opens one connection (kept idle for the run), within 30 s: whether the target can be
    /// reached at all.
    pub(crate) async fn reach(&self) -> Result<(), ConnectError> {
        let conn = tokio::time::timeout(REACH_LIMIT, self.connect())
            .await
            .map_err(|_| ConnectError {
                stage: "connect",
                addr: self.addr,
                source: std::io::ErrorKind::TimedOut.into(),
            })??;
        self.checkin(conn);
        Ok(())
    }

    /// The most recently used idle connection that the server has not visibly closed.
    pub(crate) fn take(&self) -> Option<RawConn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(mut c) = idle.pop() {
            if c.looks_open() {
                return Some(c);
            }
        }
        None
    }

    /// Returns a connection whose last response was read exactly to its end.
    pub(crate) fn checkin(&self, conn: RawConn) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
    }

    /// Opens up to `n` connections, at most `parallel` connects at a time; returns how many opened.
    pub(crate) async fn warm(&self, n: usize, parallel: usize) -> usize {
        let mut opened = 0;
        let mut left = n;
        while left > 0 {
            let k = left.min(parallel.max(1));
            let mut ok = 0;
            for c in join_all((0..k).map(|_| self.connect()))
                .await
                .into_iter()
                .flatten()
            {
                self.checkin(c);
                ok += 1;
            }
            opened += ok;
            if ok == 0 {
                break;
            }
            left -= k;
        }
        opened
    }

    /// Writes `wire` (a whole request) on a pooled connection and reads the response head;
    /// retries once on a fresh connection when a reused one fails before any response byte.
    /// `present`: a pooled connection on which the first `n` bytes of `wire` were already
    /// written (by the dispatcher, [`RawConn::try_send`]); the rest is written here. The
    /// connection goes back with [`Pool::checkin`] only if its body was read exactly to the end
    /// and the head allows reuse.
    pub(crate) async fn exchange(
        &self,
        wire: &[u8],
        mut present: Option<(RawConn, usize)>,
    ) -> Result<(RawConn, ResponseHead), SendError> {
        for attempt in 0..2 {
            let (mut conn, reused, done) = match (attempt, present.take()) {
                (0, Some((c, n))) => (c, true, n.min(wire.len())),
                (0, None) => match self.take() {
                    Some(c) => (c, true, 0),
                    None => (
                        self.connect()
                            .await
                            .map_err(|e| SendError::Connect(e.to_string()))?,
                        false,
                        0,
                    ),
                },
                _ => (
                    self.connect()
                        .await
                        .map_err(|e| SendError::Connect(e.to_string()))?,
                    false,
                    0,
                ),
            };
            if let Err(e) = conn.write_all(&wire[done..]).await {
                if reused {
                    continue;
                }
                return Err(SendError::Reset(format!("writing the request: {e}")));
            }
            match conn.read_head().await {
                Ok(h) => return Ok((conn, h)),
                Err((false, _)) if reused => continue,
                Err((_, why)) => return Err(SendError::Reset(why)),
            }
        }
        Err(SendError::Reset(
            "connection closed twice before a response".into(),
        ))
    }

    /// `GET path` with `headers`, the whole exchange within `limit`: the status and the body (at
    /// most `max_body` bytes, else an error). For `/v1/models` and metric scrapes.
    pub(crate) async fn get(
        &self,
        path: &str,
        headers: &HeaderMap,
        limit: Duration,
        max_body: usize,
    ) -> Result<(u16, Vec<u8>), String> {
        self.call("GET", path, headers, None, limit, max_body).await
    }

    /// [`Pool::get`] with any method and an optional JSON body (e.g. `POST /tokenize`).
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        json: Option<&[u8]>,
        limit: Duration,
        max_body: usize,
    ) -> Result<(u16, Vec<u8>), String> {
        let mut wire = Vec::new();
        let fields = headers
            .iter()
            .filter(|(k, _)| *k != HOST && *k != CONTENT_LENGTH && *k != TRANSFER_ENCODING)
            .map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes()))
            .chain(json.map(|_| (&b"content-type"[..], &b"application/json"[..])));
        h1::write_request(
            method,
            path,
            self.host(),
            fields,
            json.unwrap_or(b""),
            &mut wire,
        );
        let exchange = async {
            let (mut conn, head) = self.exchange(&wire, None).await.map_err(|e| match e {
                SendError::Connect(e) | SendError::Reset(e) => e,
            })?;
            let mut body = BodyDecoder::new(head.body);
            let mut out = Vec::new();
            loop {
                let used = body
                    .feed(conn.pending(), |p| out.extend_from_slice(p))
                    .map_err(|e| e.to_string())?;
                let extra = used < conn.pending().len();
                conn.consume_all();
                if out.len() > max_body {
                    return Err(format!("the body is longer than {max_body} bytes"));
                }
                if body.is_done() {
                    if head.reusable && !extra {
                        self.checkin(conn);
                    }
                    return Ok((head.status, out));
                }
                match conn.read().await {
                    Ok(0) => match body.at_eof() {
                        None => return Ok((head.status, out)),
                        Some(why) => return Err(why.to_string()),
                    },
                    Ok(_) => {}
                    Err(e) => return Err(format!("reading the body: {e}")),
                }
            }
        };
        tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| format!("timed out after {} s", limit.as_secs_f64()))?
    }
}

/// Awaits all futures concurrently (a tiny join_all without the futures crate).
async fn join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<_> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(e: rustls::Error) -> ConnectError {
        ConnectError {
            stage: "TLS handshake with",
            addr: "127.0.0.1:8443".parse().unwrap(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }
    }

    #[test]
    fn a_refused_certificate_says_what_to_do() {
        use rustls::CertificateError as C;
        let r = refused(rustls::Error::InvalidCertificate(C::UnknownIssuer)).reason();
        assert!(
            r.contains("--target-ca FILE") && r.contains("127.0.0.1:8443"),
            "{r}"
        );
        // webpki's CaUsedAsEndEntity reaches rustls as an opaque error.
        #[derive(Debug)]
        struct CaUsedAsEndEntity;
        impl std::fmt::Display for CaUsedAsEndEntity {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("CaUsedAsEndEntity")
            }
        }
        impl std::error::Error for CaUsedAsEndEntity {}
        let other = rustls::OtherError(std::sync::Arc::new(CaUsedAsEndEntity));
        let r = refused(rustls::Error::InvalidCertificate(C::Other(other))).reason();
        assert!(
            r.contains("serve a leaf certificate") && r.contains("--target-ca"),
            "{r}"
        );
        let r = refused(rustls::Error::DecryptError).reason();
        assert!(!r.contains("--target-ca"), "{r}");
    }
}
