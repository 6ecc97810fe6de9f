//! The replayer's own HTTP/1.1 client exchange (`--http-client own`): one request on one pooled
//! socket, owned by the request's task.
//!
//! A [`RawConn`] is a plain TCP or tokio-rustls stream plus one read buffer reused for the
//! connection's life. [`send`] takes a connection from the [`Pool`] (LIFO; a fresh one when none
//! is idle), writes the whole request (head and body serialized into one buffer by the caller, so
//! it is one write), and reads until the response head parses ([`h1wire::parse_response_head`],
//! interim 1xx heads skipped). A request that fails on a reused connection before any response
//! byte (the server closed it while idle) is retried once on a fresh connection, like hyper's
//! pool. The body bytes already read stay in the buffer; the caller then reads the body itself
//! with [`RawConn::read`] and [`h1wire::BodyDecoder`], so no task hand-over, no per-frame
//! allocation. No timeouts here (the caller races this against its timers) and no SSE or metrics.

use super::pool::{IoStamps, Pool, SendError};
use crate::h1wire::{self, Framing, ResponseHead};
use crate::netio::ClientStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Initial read buffer per connection; grows only for a response head longer than this.
const READ_BUF: usize = 16 << 10;

/// One keep-alive connection of the own client.
pub struct RawConn {
    io: ClientStream,
    /// Read buffer; `buf[start..filled]` holds bytes read but not yet consumed.
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    pub stamps: Option<Arc<IoStamps>>,
}

impl RawConn {
    pub fn new(io: ClientStream, stamps: Option<Arc<IoStamps>>) -> RawConn {
        RawConn {
            io,
            buf: vec![0; READ_BUF],
            start: 0,
            filled: 0,
            stamps,
        }
    }

    /// No sign that the server closed the idle connection (readable EOF, an error or
    /// unsolicited bytes all mean it is unusable). Never blocks.
    pub fn looks_open(&mut self) -> bool {
        !self.io.is_closed()
    }

    /// Bytes read but not yet consumed.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.filled]
    }

    /// Marks all pending bytes consumed.
    pub fn consume_all(&mut self) {
        self.start = 0;
        self.filled = 0;
    }

    /// One socket read appended to the pending bytes; `Ok(0)` is the server's close.
    pub async fn read(&mut self) -> std::io::Result<usize> {
        if self.start == self.filled {
            self.start = 0;
            self.filled = 0;
        } else if self.filled == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
            } else {
                let n = (self.buf.len() * 2).min(h1wire::MAX_HEAD + READ_BUF);
                self.buf.resize(n.max(self.buf.len() + 1), 0);
            }
        }
        let dst = &mut self.buf[self.filled..];
        let n = self.io.read(dst).await?;
        self.filled += n;
        if let Some(st) = &self.stamps {
            if n > 0 {
                st.last_read_ns.store(crate::stamps::now_ns(), Relaxed);
            }
        }
        Ok(n)
    }

    async fn write_all(&mut self, wire: &[u8]) -> std::io::Result<()> {
        self.io.write_all(wire).await?;
        self.io.flush().await?;
        if let Some(st) = &self.stamps {
            st.last_write_ns.store(crate::stamps::now_ns(), Relaxed);
        }
        Ok(())
    }

    /// Reads until a final response head; its bytes are consumed, body bytes stay pending.
    /// `Err((got_bytes, why))`.
    async fn read_head(&mut self) -> Result<ResponseHead, (bool, String)> {
        let mut any = false;
        loop {
            match h1wire::parse_response_head(self.pending(), false) {
                Ok(Some(h)) => {
                    self.start += h.len;
                    if (100..200).contains(&h.status) {
                        continue;
                    }
                    return Ok(h);
                }
                Ok(None) => {}
                Err(e) => return Err((true, format!("invalid response head: {}", e.reason()))),
            }
            match self.read().await {
                Ok(0) => {
                    return Err((
                        any,
                        "connection closed before a complete response head".into(),
                    ))
                }
                Ok(_) => any = true,
                Err(e) => return Err((any, format!("reading the response head: {e}"))),
            }
        }
    }
}

/// Writes `wire` (a whole request) on a pooled connection and reads the response head; retries
/// once on a fresh connection when a reused one fails before any response byte. The returned
/// connection goes back with [`Pool::checkin_raw`] only if its body was read exactly to the end
/// and the head allows reuse.
pub async fn send(pool: &Pool, wire: &[u8]) -> Result<(RawConn, ResponseHead), SendError> {
    for attempt in 0..2 {
        let (mut conn, reused) = match pool.take_raw() {
            Some(c) if attempt == 0 => (c, true),
            _ => (pool.connect_raw().await.map_err(SendError::Connect)?, false),
        };
        if let Err(e) = conn.write_all(wire).await {
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

/// Whether a connection whose body ended cleanly may carry another request.
pub fn reusable(head: &ResponseHead, conn: &RawConn) -> bool {
    head.reusable && head.body != Framing::Close && conn.pending().is_empty()
}
