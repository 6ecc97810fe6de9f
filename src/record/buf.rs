//! The byte buffer the `h1` engine and the tunnel read into (its methods are `#[inline]`: they
//! are on the per-read path of another module).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// A byte buffer read from the front: the data is `v[start..]`.
#[derive(Default)]
pub(crate) struct Buf {
    pub(crate) v: Vec<u8>,
    pub(crate) start: usize,
}

impl Buf {
    #[inline]
    pub(crate) fn new(v: Vec<u8>, cap: usize) -> Self {
        let mut v = v;
        if v.capacity() < cap {
            v.reserve_exact(cap - v.len());
        }
        Buf { v, start: 0 }
    }

    #[inline]
    pub(crate) fn data(&self) -> &[u8] {
        &self.v[self.start..]
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.v.len() - self.start
    }

    #[inline]
    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start >= self.v.len() {
            self.v.clear();
            self.start = 0;
        }
    }

    #[inline]
    pub(crate) fn clear(&mut self) {
        self.v.clear();
        self.start = 0;
    }

    /// Moves the data to the front and makes room for at least one more byte, growing the
    /// capacity only up to `limit`. Returns whether there is room.
    #[inline]
    pub(crate) fn make_room(&mut self, limit: usize) -> bool {
        if self.v.len() < self.v.capacity() {
            return true;
        }
        if self.start > 0 {
            self.v.drain(..self.start);
            self.start = 0;
            return true;
        }
        let cap = self.v.capacity();
        if cap >= limit {
            return false;
        }
        self.v.reserve_exact((cap * 2).clamp(1024, limit) - cap);
        true
    }

    /// Reads once into the free capacity (which must not be empty).
    pub(crate) fn poll_read_from<R: AsyncRead + Unpin + ?Sized>(
        &mut self,
        r: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let len = self.v.len();
        let mut rb = ReadBuf::uninit(self.v.spare_capacity_mut());
        ready!(Pin::new(r).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: `ReadBuf` guarantees its first `filled().len()` bytes were initialised, and
        // they are the `n` bytes right after the vector's current length.
        unsafe { self.v.set_len(len + n) };
        Poll::Ready(Ok(n))
    }
}
