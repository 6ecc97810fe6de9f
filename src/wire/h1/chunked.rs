use super::*;

/// A malformed chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad chunked framing: {}", self.0)
    }
}

impl std::error::Error for ChunkError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum St {
    #[default]
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// The LF that must end a framing line.
pub(super) fn lf(b: u8, expected: &'static str) -> Result<(), ChunkError> {
    (b == b'\n').then_some(()).ok_or(ChunkError(expected))
}

/// Follows chunked framing incrementally: where the body ends and which bytes are payload.
#[derive(Debug, Clone, Default)]
pub struct ChunkedDecoder {
    pub(super) st: St,
    pub(super) size: u64,
    pub(super) digits: u8,
    pub(super) line: u32,
    pub(super) trailers: u32,
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The terminating chunk and trailer section have been seen.
    pub fn is_done(&self) -> bool {
        self.st == St::Done
    }

    /// Consumes framing bytes from `buf`, calling `payload(start, end)` for each range of
    /// payload bytes (indices into `buf`), and stops right after the end of the body. Returns
    /// how many bytes of `buf` belong to the body.
    pub fn feed(
        &mut self,
        buf: &[u8],
        mut payload: impl FnMut(usize, usize),
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < buf.len() {
            if self.st == St::Data {
                let n = (buf.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                payload(i, i + n);
                i += n;
                self.size -= n as u64;
                if self.size == 0 {
                    self.st = St::DataCr;
                }
                continue;
            }
            let b = buf[i];
            i += 1;
            match self.st {
                St::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if self.digits == 16 {
                            return Err(ChunkError("chunk size too large"));
                        }
                        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self.size << 4 | d;
                        self.digits += 1;
                    }
                    b';' | b' ' | b'\t' if self.digits > 0 => {
                        self.st = St::Ext;
                        self.line = 0;
                    }
                    b'\r' if self.digits > 0 => self.st = St::SizeLf,
                    b'\n' if self.digits > 0 => self.size_line_end(),
                    _ => return Err(ChunkError("invalid chunk size")),
                },
                St::Ext => match b {
                    b'\r' => self.st = St::SizeLf,
                    b'\n' => self.size_line_end(),
                    _ => {
                        self.line += 1;
                        if self.line > MAX_CHUNK_LINE {
                            return Err(ChunkError("chunk extension too long"));
                        }
                    }
                },
                St::SizeLf => {
                    lf(b, "expected LF after chunk size")?;
                    self.size_line_end();
                }
                St::DataCr => match b {
                    b'\r' => self.st = St::DataLf,
                    b'\n' => self.next_chunk(),
                    _ => return Err(ChunkError("expected CRLF after chunk data")),
                },
                St::DataLf => {
                    lf(b, "expected LF after chunk data")?;
                    self.next_chunk();
                }
                St::TrailerStart => match b {
                    b'\r' => self.st = St::EndLf,
                    b'\n' => {
                        self.st = St::Done;
                        return Ok(i);
                    }
                    _ => {
                        self.st = St::Trailer;
                        self.trailer_byte()?;
                    }
                },
                St::Trailer => match b {
                    b'\r' => self.st = St::TrailerLf,
                    b'\n' => self.st = St::TrailerStart,
                    _ => self.trailer_byte()?,
                },
                St::TrailerLf => {
                    lf(b, "expected LF after trailer field")?;
                    self.st = St::TrailerStart;
                }
                St::EndLf => {
                    lf(b, "expected LF after last chunk")?;
                    self.st = St::Done;
                    return Ok(i);
                }
                St::Done => return Ok(i - 1),
                St::Data => unreachable!("handled above"),
            }
        }
        Ok(i)
    }

    pub(super) fn size_line_end(&mut self) {
        self.st = if self.size == 0 {
            St::TrailerStart
        } else {
            St::Data
        };
    }

    pub(super) fn next_chunk(&mut self) {
        self.st = St::Size;
        self.size = 0;
        self.digits = 0;
    }

    pub(super) fn trailer_byte(&mut self) -> Result<(), ChunkError> {
        self.trailers += 1;
        if self.trailers > MAX_TRAILERS {
            return Err(ChunkError("trailer section too long"));
        }
        Ok(())
    }
}

/// Follows one response body of any [`Framing`] for a client that consumes it: hands out the
/// payload and says where the body ends. The end of a [`Framing::Close`] body is the sender's
/// close, which the caller sees (`at_eof`); this type only counts and decodes.
#[derive(Debug, Clone)]
pub(crate) struct BodyDecoder {
    pub(super) framing: Framing,
    pub(super) left: u64,
    pub(super) chunked: ChunkedDecoder,
    pub(super) done: bool,
}

impl BodyDecoder {
    pub(crate) fn new(framing: Framing) -> Self {
        BodyDecoder {
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunked: ChunkedDecoder::new(),
            done: framing == Framing::None,
        }
    }

    /// The whole body has been seen (never true for [`Framing::Close`]).
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Consumes body bytes from `buf`, calling `payload` with each run of payload bytes (in place,
    /// no copy); stops right after the end of the body and returns how many bytes of `buf` it used
    /// (fewer than `buf.len()` only when the body ended inside `buf`).
    pub(crate) fn feed(
        &mut self,
        buf: &[u8],
        mut payload: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkError> {
        if self.done {
            return Ok(0);
        }
        match self.framing {
            Framing::None => Ok(0),
            Framing::Close => {
                if !buf.is_empty() {
                    payload(buf);
                }
                Ok(buf.len())
            }
            Framing::Length(_) => {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                if n > 0 {
                    payload(&buf[..n]);
                }
                self.left -= n as u64;
                self.done = self.left == 0;
                Ok(n)
            }
            Framing::Chunked => {
                let n = self.chunked.feed(buf, |a, b| payload(&buf[a..b]))?;
                self.done = self.chunked.is_done();
                Ok(n)
            }
        }
    }

    /// What is missing when the connection ends now: `None` when the body is complete (a
    /// [`Framing::Close`] body ends exactly here), otherwise why it is truncated.
    pub(crate) fn at_eof(&self) -> Option<&'static str> {
        match (self.done, self.framing) {
            (true, _) | (_, Framing::Close) => None,
            (_, Framing::Length(_)) => {
                Some("connection closed before the end of the content-length body")
            }
            _ => Some("connection closed before the last chunk"),
        }
    }
}
