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
use std::sync::atomic::{AtomicBool, Ordering};
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

    /// Dials a new socket (connect timeout and TLS as configured). The first dial of the
    /// process that fails is warned about ([`warn_unreachable`]).
    pub(crate) async fn connect(&self) -> Result<ClientStream, BoxError> {
        match self.connector.clone().call(self.dst.clone()).await {
            Ok(s) => Ok(s.into_inner()),
            Err(e) => {
                warn_unreachable(&self.dst, &*e);
                Err(e)
            }
        }
    }
}

/// Set once a failed dial of the upstream has been warned about.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Warns, once per process, that the upstream `dst` takes no connection (`why`), so that a
/// recorder started in front of a server that is not up says so at its first request rather
/// than only answering 502s. Nothing is dialled for it: the upstream sees no extra connection.
fn warn_unreachable(dst: &Uri, why: &dyn std::error::Error) {
    if WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let dst = crate::sys::userinfo::redact(&dst.to_string());
    eprintln!("{}", unreachable_line(&dst, why));
}

fn unreachable_line(dst: &str, why: &dyn std::error::Error) -> String {
    let mut why_text = why.to_string();
    let mut src = why.source();
    while let Some(s) = src {
        why_text = format!("{why_text}: {s}");
        src = s.source();
    }
    format!(
        "retrace record: warning: the upstream {dst} does not answer ({why_text}); serving goes on, and requests get a 502 or 504 until it answers"
    )
}
