//! The HTTP/1.1 upstream connection pool of one I/O thread: hyper's bare client connections,
//! for requests that come through hyper's server (HTTP/2 clients, and every client with
//! `--h1-engine hyper`; HTTP/1.1 clients otherwise use `rawpool` through `h1`).
//!
//! Each I/O thread owns one [`H1Pool`]: a stack of idle keep-alive connections (most recently used
//! first, so the warm ones are reused and the cold ones age out) to the one upstream. A request
//! takes an idle connection that is ready, or dials a new one through
//! [`super::upstream::Connector`] (plain or TLS, connect timeout); when the pooled connection
//! turns out to have been closed before the request was written, the request is sent once more on
//! a fresh connection. The response tap gives the connection back when the response ended
//! cleanly ([`Pooled::release`]); on any error or cancellation it is dropped, which closes it so
//! the server stops generating. Idle connections older than the idle timeout are closed when the
//! pool is next used. Compared with hyper-util's general pooling client this does no per-request
//! key hashing, no checkout futures and no per-request task spawn, which matters at tens of
//! thousands of requests per second. HTTP/2 upstreams still use that client (see `upstream`).
//! This module does not rewrite requests or know about recording.

use super::tap::RequestTap;
use super::timing::{ReadClock, ReadStamped};
use super::upstream::{Connector, UpstreamIo};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower_service::Service as _;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no response head.
#[derive(Debug)]
pub enum SendError {
    /// Dialing (TCP, TLS) failed or timed out.
    Connect(BoxError),
    /// The connection failed while sending the request or reading the head.
    Request(hyper::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(_) => f.write_str("connecting to the upstream failed"),
            SendError::Request(_) => f.write_str("the upstream request failed"),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Connect(e) => Some(&**e),
            SendError::Request(e) => Some(e),
        }
    }
}

struct Idle {
    tx: SendRequest<RequestTap>,
    clock: Arc<ReadClock>,
    since: Instant,
}

/// Idle keep-alive connections to the upstream, for one I/O thread.
pub struct H1Pool {
    connector: Connector,
    /// `scheme://authority` the connector dials.
    dst: Uri,
    builder: http1::Builder,
    idle: Mutex<VecDeque<Idle>>,
    idle_timeout: Duration,
}

/// A connection lent to one exchange.
pub struct Pooled {
    tx: SendRequest<RequestTap>,
    pub clock: Arc<ReadClock>,
    pool: Arc<H1Pool>,
}

impl Pooled {
    /// Gives the connection back after a response that ended cleanly.
    pub fn release(self) {
        if self.tx.is_closed() {
            return;
        }
        let mut idle = self.pool.lock();
        idle.push_back(Idle {
            tx: self.tx,
            clock: self.clock,
            since: Instant::now(),
        });
    }
}

impl H1Pool {
    pub fn new(connector: Connector, dst: Uri, idle_timeout: Duration) -> Self {
        H1Pool {
            connector,
            dst,
            builder: http1::Builder::new(),
            idle: Mutex::new(VecDeque::new()),
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection that can take a request now.
    fn checkout(&self) -> Option<(SendRequest<RequestTap>, Arc<ReadClock>)> {
        let mut idle = self.lock();
        let now = Instant::now();
        while idle
            .front()
            .is_some_and(|c| now.duration_since(c.since) > self.idle_timeout || c.tx.is_closed())
        {
            idle.pop_front();
        }
        let mut busy = Vec::new();
        let mut found = None;
        while let Some(c) = idle.pop_back() {
            if c.tx.is_closed() {
                continue;
            }
            if c.tx.is_ready() {
                found = Some((c.tx, c.clock));
                break;
            }
            // Still finishing its previous exchange: keep it for later.
            busy.push(c);
        }
        idle.extend(busy.into_iter().rev());
        found
    }

    async fn connect(&self) -> Result<(SendRequest<RequestTap>, Arc<ReadClock>), SendError> {
        let io: UpstreamIo = self
            .connector
            .clone()
            .call(self.dst.clone())
            .await
            .map_err(SendError::Connect)?;
        let clock = Arc::new(ReadClock::default());
        let (tx, conn) = self
            .builder
            .handshake(ReadStamped::new(io, clock.clone()))
            .await
            .map_err(SendError::Request)?;
        tokio::spawn(async move {
            // With upgrades: after a 101 the socket goes to the tunnel (see `proxy`).
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("upstream connection: {e}");
            }
        });
        Ok((tx, clock))
    }

    /// Sends `req` (origin-form target, `Host` set) and waits for the response head.
    /// Sends `req` on a pooled or fresh connection. When no connection could be made the error
    /// comes back with the request, its body unread (the recorder still wants its prompt).
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<RequestTap>,
    ) -> Result<(Response<Incoming>, Pooled), (SendError, Option<Request<RequestTap>>)> {
        if let Some((mut tx, clock)) = self.checkout() {
            match tx.try_send_request(req).await {
                Ok(resp) => {
                    let p = Pooled {
                        tx,
                        clock,
                        pool: self.clone(),
                    };
                    return Ok((resp, p));
                }
                Err(mut e) => match e.take_message() {
                    // Closed before the request was written: once more on a fresh connection.
                    Some(r) => req = r,
                    None => return Err((SendError::Request(e.into_error()), None)),
                },
            }
        }
        let (mut tx, clock) = match self.connect().await {
            Ok(c) => c,
            Err(e) => return Err((e, Some(req))),
        };
        let resp = tx
            .send_request(req)
            .await
            .map_err(|e| (SendError::Request(e), None))?;
        Ok((
            resp,
            Pooled {
                tx,
                clock,
                pool: self.clone(),
            },
        ))
    }
}
