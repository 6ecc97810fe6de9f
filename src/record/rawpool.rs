//! Idle upstream sockets of the `h1` engine, pooled per I/O thread, most recently used first and
//! with no buffers or tasks attached. Sockets idle past the idle timeout or closed by the
//! upstream (a non-blocking read probe) are skipped at checkout and reaped every second, so none
//! stay in CLOSE-WAIT; a socket comes back only after a response that ended cleanly.

use super::tap::lock;
use super::upstream::Connector;
use crate::sys::netio::ClientStream;
use crate::wire::BoxError;
use http::Uri;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tower_service::Service as _;

/// Idle upstream sockets of one I/O thread.
pub(crate) struct RawPool {
    connector: Connector,
    /// `scheme://authority` the connector dials.
    dst: Uri,
    idle: Mutex<VecDeque<(ClientStream, Instant)>>,
    idle_timeout: Duration,
}

impl RawPool {
    pub(crate) fn new(connector: Connector, dst: Uri, idle_timeout: Duration) -> Self {
        RawPool {
            connector,
            dst,
            idle: Mutex::new(VecDeque::new()),
            idle_timeout,
        }
    }

    /// The most recently used idle socket that is still open, if any.
    pub(crate) fn checkout(&self) -> Option<ClientStream> {
        let mut idle = lock(&self.idle);
        let now = Instant::now();
        while idle
            .front()
            .is_some_and(|(_, since)| now.duration_since(*since) > self.idle_timeout)
        {
            idle.pop_front();
        }
        while let Some((mut up, _)) = idle.pop_back() {
            if !up.is_closed() {
                return Some(up);
            }
        }
        None
    }

    /// Drops idle sockets the upstream closed or that idled longer than the idle timeout.
    pub(crate) fn reap(&self) {
        let now = Instant::now();
        let fresh = |since: &Instant| now.duration_since(*since) <= self.idle_timeout;
        lock(&self.idle).retain_mut(|(up, since)| fresh(since) && !up.is_closed());
    }

    /// Gives back a socket whose last response ended cleanly.
    pub(crate) fn checkin(&self, up: ClientStream) {
        lock(&self.idle).push_back((up, Instant::now()));
    }

    /// Dials a new socket (connect timeout and TLS as configured).
    pub(crate) async fn connect(&self) -> Result<ClientStream, BoxError> {
        Ok(self
            .connector
            .clone()
            .call(self.dst.clone())
            .await?
            .into_inner())
    }
}
