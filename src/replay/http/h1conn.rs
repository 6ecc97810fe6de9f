//! The replayer's own HTTP/1.1 client connection: one plain TCP or tokio-rustls stream plus one
//! read buffer reused for the connection's life ([`RawConn`]).
//!
//! The request is written in one write ([`RawConn::write_all`], or started by the dispatcher
//! with [`RawConn::try_send`]); [`RawConn::read_head`] reads until the response head parses
//! ([`h1::parse_response_head`], interim 1xx heads skipped). The body bytes already read stay
//! in the buffer; the caller reads the body itself with [`RawConn::read`] and
//! [`h1::BodyDecoder`] (no task hand-over, no per-frame allocation), or, on plain TCP, takes
//! the socket off the runtime ([`RawConn::detach`]) for a reader thread ([`crate::replay::http::reader`]),
//! which reads it with [`RawConn::read_now`] and hands it back ([`RawConn::attach`]). Each read
//! notes when its bytes reached this host ([`RawConn::last_rx`]): the kernel's receive stamp on
//! plain TCP sockets opened with stamping on ([`crate::sys::rxstamp`]), else the instant the read
//! returned (TLS). No pooling, timeouts, SSE or metrics here.

use crate::sys::netio::ClientStream;
use crate::wire::h1::{self, ResponseHead};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a request could not get a response head.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The TCP connect or TLS handshake failed.
    Connect(String),
    /// The connection broke before a response head.
    Reset(String),
}

/// Initial read buffer per connection; grows only for a response head longer than this.
const READ_BUF: usize = 16 << 10;

/// A connection's read buffer; `buf[start..filled]` holds bytes read but not yet consumed.
struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    filled: usize,
}

impl ReadBuf {
    /// Room for the next read after the pending bytes (compacted first, or the buffer grown
    /// when it is full of them).
    fn spare(&mut self) -> &mut [u8] {
        if self.start == self.filled {
            self.start = 0;
            self.filled = 0;
        } else if self.filled == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
            } else {
                let n = (self.buf.len() * 2).min(h1::MAX_HEAD + READ_BUF);
                self.buf.resize(n.max(self.buf.len() + 1), 0);
            }
        }
        &mut self.buf[self.filled..]
    }
}

/// One keep-alive connection of the own client. `I` is its socket: the runtime's
/// [`ClientStream`], or a plain [`std::net::TcpStream`] while a reader thread reads the body
/// ([`RawConn::detach`], [`RawConn::attach`]).
pub(crate) struct RawConn<I = ClientStream> {
    io: I,
    rb: ReadBuf,
    /// Reads of a plain socket ask the kernel when their bytes arrived.
    kernel_rx: bool,
    last_rx: Instant,
}

impl<I> RawConn<I> {
    /// When the bytes of the latest read reached this host (see the module doc).
    pub(crate) fn last_rx(&self) -> Instant {
        self.last_rx
    }

    /// Bytes read but not yet consumed.
    pub(crate) fn pending(&self) -> &[u8] {
        &self.rb.buf[self.rb.start..self.rb.filled]
    }

    /// Marks all pending bytes consumed.
    pub(crate) fn consume_all(&mut self) {
        self.rb.start = 0;
        self.rb.filled = 0;
    }

    /// The socket, and the rest of the connection around no socket.
    fn split(self) -> (I, RawConn<()>) {
        let RawConn {
            io,
            rb,
            kernel_rx,
            last_rx,
        } = self;
        let rest = RawConn {
            io: (),
            rb,
            kernel_rx,
            last_rx,
        };
        (io, rest)
    }

    /// `n` bytes were read into the buffer's spare room; they reached this host at `at`.
    fn commit(&mut self, n: usize, at: Instant) {
        self.rb.filled += n;
        self.last_rx = at;
    }
}

impl RawConn<()> {
    /// This connection around socket `io`.
    fn join<J>(self, io: J) -> RawConn<J> {
        RawConn {
            io,
            rb: self.rb,
            kernel_rx: self.kernel_rx,
            last_rx: self.last_rx,
        }
    }
}

impl RawConn {
    /// `kernel_rx`: stamp reads with the kernel's receive time (plain TCP only; turns the
    /// socket's `SO_TIMESTAMPNS` on).
    pub(crate) fn new(io: ClientStream, kernel_rx: bool) -> RawConn {
        let kernel_rx = match &io {
            ClientStream::Plain(s) => kernel_rx && crate::sys::rxstamp::enable(s.as_raw_fd()),
            ClientStream::Tls(_) => false,
        };
        RawConn {
            io,
            rb: ReadBuf {
                buf: vec![0; READ_BUF],
                start: 0,
                filled: 0,
            },
            kernel_rx,
            last_rx: Instant::now(),
        }
    }

    /// Plain TCP: a reader thread can take it ([`RawConn::detach`]).
    pub(crate) fn is_plain(&self) -> bool {
        matches!(self.io, ClientStream::Plain(_))
    }

    /// The plain socket taken off the runtime's reactor, with its buffer and pending bytes, for
    /// a reader thread ([`crate::replay::http::reader`]). A TLS connection cannot be detached (an error:
    /// check [`RawConn::is_plain`] first). On an error the connection is gone.
    pub(crate) fn detach(self) -> std::io::Result<RawConn<std::net::TcpStream>> {
        match self.split() {
            (ClientStream::Plain(s), rest) => Ok(rest.join(s.into_std()?)),
            (ClientStream::Tls(_), _) => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "a TLS connection stays on the runtime",
            )),
        }
    }

    /// No sign that the server closed the idle connection (readable EOF, an error or
    /// unsolicited bytes all mean it is unusable). Never blocks.
    pub(crate) fn looks_open(&mut self) -> bool {
        !self.io.is_closed()
    }

    /// One socket read appended to the pending bytes; `Ok(0)` is the server's close.
    pub(crate) async fn read(&mut self) -> std::io::Result<usize> {
        let dst = self.rb.spare();
        let (n, at) = match &mut self.io {
            ClientStream::Plain(s) if self.kernel_rx => {
                // SAFETY: viewing initialised bytes as MaybeUninit is sound; the kernel writes
                // only initialised bytes into them.
                let dst = unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) };
                let fd = s.as_raw_fd();
                loop {
                    s.readable().await?;
                    match crate::sys::rxstamp::try_recv(s, fd, dst) {
                        Ok(r) => break r,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            io => {
                let n = io.read(dst).await?;
                (n, Instant::now())
            }
        };
        self.commit(n, at);
        Ok(n)
    }

    /// One non-blocking vectored write of `head` then `body` on a plain socket, from any thread
    /// (the dispatcher's): how many bytes went out. `WouldBlock` when the kernel took nothing;
    /// TLS connections always answer `WouldBlock` (their records are written by the request's
    /// task).
    pub(crate) fn try_send(&mut self, head: &[u8], body: &[u8]) -> std::io::Result<usize> {
        match &self.io {
            ClientStream::Plain(s) => send_now(
                s,
                &[std::io::IoSlice::new(head), std::io::IoSlice::new(body)],
            ),
            ClientStream::Tls(_) => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }

    pub(super) async fn write_all(&mut self, wire: &[u8]) -> std::io::Result<()> {
        // Nothing left (the dispatcher's `try_send` wrote it all): no zero-length send.
        if wire.is_empty() {
            return Ok(());
        }
        let mut done = 0;
        if let ClientStream::Plain(s) = &self.io {
            match send_now(s, &[std::io::IoSlice::new(wire)]) {
                Ok(n) => done = n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if done < wire.len() {
            self.io.write_all(&wire[done..]).await?;
            self.io.flush().await?;
        }
        Ok(())
    }

    /// Reads until a final response head; its bytes are consumed, body bytes stay pending.
    /// `Err((got_bytes, why))`.
    pub(super) async fn read_head(&mut self) -> Result<ResponseHead, (bool, String)> {
        let mut any = false;
        loop {
            match h1::parse_response_head(self.pending(), false) {
                Ok(Some(h)) => {
                    self.rb.start += h.len;
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

/// One non-blocking send straight to a plain socket, whatever tokio last saw of its
/// writability: tokio's own writes wait until its reactor has seen the socket writable, which
/// for a socket just put back on the reactor ([`RawConn::attach`]) takes the reactor's next
/// turn (milliseconds in a large burst). A short or `WouldBlock` answer leaves the
/// rest to tokio's writes, which then wait for writability as usual.
fn send_now(s: &tokio::net::TcpStream, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
    loop {
        match socket2::SockRef::from(s).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

impl RawConn<std::net::TcpStream> {
    /// The socket (for the reader thread's registration).
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.io.as_raw_fd()
    }

    /// One non-blocking read appended to the pending bytes: how many bytes, and whether they
    /// filled the room there was (then more may be waiting; a shorter read drained the
    /// socket). `Ok((0, _))` is the server's close; `WouldBlock` when nothing was there.
    pub(crate) fn read_now(&mut self) -> std::io::Result<(usize, bool)> {
        let fd = self.io.as_raw_fd();
        let kernel_rx = self.kernel_rx;
        let dst = self.rb.spare();
        let room = dst.len();
        let (n, at) = loop {
            let r = if kernel_rx {
                // SAFETY: as in `RawConn::read`.
                let dst = unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) };
                crate::sys::rxstamp::recv(fd, dst)
            } else {
                std::io::Read::read(&mut self.io, dst).map(|n| (n, Instant::now()))
            };
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        self.commit(n, at);
        Ok((n, n == room))
    }

    /// Back on the runtime's reactor (call from within the runtime).
    pub(crate) fn attach(self) -> std::io::Result<RawConn> {
        let (io, rest) = self.split();
        Ok(rest.join(ClientStream::Plain(tokio::net::TcpStream::from_std(io)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    async fn pair(kernel_rx: bool) -> (RawConn, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (s, _) = l.accept().await.unwrap();
        (RawConn::new(ClientStream::Plain(c), kernel_rx), s)
    }

    /// Bytes that waited in the socket while the replayer was busy count from when they
    /// arrived, not from the late read (`--rx-stamp kernel`); with `read`, from the read.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_late_read_keeps_the_instant_the_bytes_arrived() {
        let mut late = Duration::ZERO;
        // The kernel turns packet stamps on a moment after the first socket asks: a few tries.
        for _ in 0..20 {
            let (mut conn, mut server) = pair(true).await;
            server.write_all(b"data: {}\n\n").await.unwrap();
            // The replayer is busy (this thread blocks, nothing reads) for 100 ms.
            std::thread::sleep(Duration::from_millis(100));
            let n = conn.read().await.unwrap();
            let read_at = Instant::now();
            assert_eq!(conn.pending(), b"data: {}\n\n");
            assert_eq!(n, 10);
            assert!(conn.last_rx() <= read_at);
            late = read_at - conn.last_rx();
            if late >= Duration::from_millis(80) {
                break;
            }
        }
        assert!(
            late >= Duration::from_millis(80),
            "stamped only {late:?} before the read"
        );

        let (mut conn, mut server) = pair(false).await;
        server.write_all(b"x").await.unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Unstamped, the arrival is the read's own instant: after the bytes were waiting.
        let before_read = Instant::now();
        assert_eq!(conn.read().await.unwrap(), 1);
        assert!(conn.last_rx() >= before_read);
        // The peer's close still reads as 0 on the stamped path.
        let (mut conn, server) = pair(true).await;
        drop(server);
        assert_eq!(conn.read().await.unwrap(), 0);
    }

    /// A detached connection (a reader thread's) keeps its pending bytes, reads without the
    /// runtime with the same arrival stamps, says when a read filled its room, and goes back
    /// on the runtime able to write and read again.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_detached_connection_reads_stamped_and_comes_back() {
        let mut late = Duration::ZERO;
        for _ in 0..20 {
            let (mut conn, mut server) = pair(true).await;
            server
                .write_all(b"HTTP/1.1 200 OK\r\n\r\nab")
                .await
                .unwrap();
            conn.read_head().await.unwrap();
            assert_eq!(conn.pending(), b"ab");
            let mut d = conn.detach().unwrap();
            assert_eq!(d.pending(), b"ab", "pending bytes travel with the socket");
            assert_eq!(
                d.read_now().unwrap_err().kind(),
                std::io::ErrorKind::WouldBlock
            );
            server.write_all(b"cd").await.unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let (n, more) = d.read_now().unwrap();
            let read_at = Instant::now();
            assert_eq!((n, more), (2, false));
            assert_eq!(d.pending(), b"abcd");
            late = read_at - d.last_rx();
            let mut conn = d.attach().unwrap();
            conn.consume_all();
            conn.write_all(b"again").await.unwrap();
            let mut got = [0u8; 5];
            tokio::io::AsyncReadExt::read_exact(&mut server, &mut got)
                .await
                .unwrap();
            assert_eq!(&got, b"again");
            server.write_all(b"e").await.unwrap();
            assert_eq!(conn.read().await.unwrap(), 1);
            assert_eq!(conn.pending(), b"e");
            if late >= Duration::from_millis(80) {
                break;
            }
        }
        assert!(
            late >= Duration::from_millis(80),
            "stamped only {late:?} before the read"
        );
        // A read that fills the room says so; the close reads as 0.
        let (conn, mut server) = pair(true).await;
        let mut d = conn.detach().unwrap();
        let big = vec![b'x'; READ_BUF + 100];
        server.write_all(&big).await.unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (n, more) = d.read_now().unwrap();
        assert_eq!((n, more), (READ_BUF, true));
        d.consume_all();
        assert_eq!(d.read_now().unwrap(), (100, false));
        drop(server);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(d.read_now().unwrap().0, 0);
    }
}
