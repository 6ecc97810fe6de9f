//! A client socket that is plain TCP or rustls over TCP, as one `AsyncRead + AsyncWrite` type:
//! the recorder's upstream connections (dialed by `record::upstream`, held by hyper through
//! `UpstreamIo` or raw by `record::rawpool`) and the replayer's own HTTP/1.1 client
//! (`replay::h1client`) all hold one. It also tells whether an idle socket was closed by
//! its peer without blocking. It does not dial or configure TLS (see `tls`, and the two callers).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A plain or TLS client socket.
pub enum ClientStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

impl ClientStream {
    /// Whether the peer closed (or wrote unasked bytes on) this idle socket. Never blocks.
    pub(crate) fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Ready means EOF, an error, or a byte nobody asked for: unusable either way.
        Pin::new(self).poll_read(&mut cx, &mut buf).is_ready()
    }
}
