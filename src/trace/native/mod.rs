//! The native trace file format (`*.trace.zst`): writer and crash-tolerant reader.
//!
//! # Layout
//! A native trace is a plain zstd stream made of independent zstd frames (`zstd -t` passes and
//! `zstd -dc` yields the concatenated CBOR sequence, RFC 8742). Frame 0 holds one CBOR map, the
//! file header; every later frame holds a frame header map followed by exactly `n` request maps.
//! Every frame declares its content size and, since version 1.2, carries zstd's content checksum
//! (XXH64), so a changed byte is found as damage; files without checksums still read.
//!
//! * File header: `{"magic": "retrace-trace", "version": [major, minor], "block_size": u32,
//!   "hash_scheme": "dense"|"xxh3"|"hmac-sha256", "partial_tail_block": bool,
//!   "t0_unix_us": i64|null, "writer": text, "source": text, "meta": {text: text}}`.
//! * Frame header: `{"frame": seq (from 1), "n": records in this frame, "first": index of its first
//!   record in the file, "dropped": records the writer dropped so far (omitted when 0)}`.
//! * Request map (short keys; absent keys take the default shown):
//!   - `t`: arrival, µs, as a signed delta from the previous record *of the same frame* (the first
//!     record of a frame: from t0), so frames decode independently;
//!   - `i`, `o`: input and output tokens (0);
//!   - `h`: hash ids as a flat list of runs `[start0, len0, start1, len1, ...]`, a run being ids
//!     `start, start+1, ..., start+len-1` (Mooncake's 288,500 ids form 33,391 runs) (`[]`);
//!   - `e`: endpoint, `"chat"` or a path (`"completions"`); `m`: model (none);
//!   - `p`: params `{mt: max_tokens, mn: min_tokens, te: temperature, ie: ignore_eos, n, st: stream,
//!     iu: include_usage}`, each optional;
//!   - `s`: session `{id, turn, think_us?}`; `b`: request body, a byte string (only when recorded
//!     with bodies);
//!   - `ic` (since 1.4): who counted `i` when it is not known exactly from the request or the
//!     response's usage: `"server"` (the upstream's own `POST /tokenize` of the prompt) or
//!     `"estimate"` (the recorder's estimate) (absent: exact);
//!   - `r`: response `{st: status, er: error kind, hd: µs to headers, tf: µs to first token,
//!     eg: [gaps between successive events in µs, the first from arrival], et: [tokens per event]
//!     (omitted when every event carried one token), en: µs to end, u: [prompt, completion] usage,
//!     sm: the server's per-request timings (`trace::ServerMetrics`; `cached_tokens` since 1.3),
//!     c: cancelled (false), b: response body bytes, ch: [output tokens of each choice by index]
//!     (only for a stream of `n > 1`; since 1.4), x: the body ran past the recorder's capture
//!     cap (since 1.5; absent: read whole) {n: SSE events that ended past it, the last n of eg,
//!     counted but unread, one token each but the stream's last (0), s: the count stopped at the
//!     recorder's bound, later events in no figure but u (false)}}`;
//!   - `sh` (since 1.6): the copies a shadowing recorder sent, at most 5, each `{k: the
//!     target's index (header meta `shadow.K`), d: µs from the arrival to the copy's send,
//!     q (since 1.7): µs from the arrival to the request being whole (the copy offered),
//!     sk: why it has no measurement, r: its response as `r` above (offsets from its send),
//!     o: its output tokens, ag: [primary output xxh3, shadow output xxh3, agreeing prefix,
//!     primary length, shadow length] in bytes of text, for a deterministic request}`.
//!
//! Unknown keys are ignored, so a newer *minor* version stays readable.
//!
//! # Versioning
//! `version` is `[major, minor]`. A change that old readers can skip (a new optional key) bumps
//! minor; any other change bumps major. Readers reject a file whose major is newer than theirs with
//! [`TraceError::NewerVersion`]; older majors are read by this reader's compatibility code (none yet).
//!
//! # Durability
//! The writer closes a frame when its buffered records pass `frame_bytes` (default 4 MiB) or when
//! the caller asks ([`TraceWriter::flush_frame`], which the recorder does every second), so a crash
//! loses at most the open frame. The reader returns every record of every complete frame before a
//! cut, reports cut and corrupt frames (a checksum mismatch among them) with their byte offsets in
//! [`ReadReport`], resynchronises on
//! the next zstd frame magic after a corrupt frame, and never panics or allocates more than a frame's
//! declared size (capped at [`MAX_FRAME_CONTENT`]).

use super::{
    Endpoint, Event, HashScheme, Params, PastCap, Request, Response, ServerMetrics, Session, Trace,
    TraceError, TraceHeader, Usage,
};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{Read, Write};
use std::path::Path;

pub(crate) const MAGIC: &str = "retrace-trace";
pub(crate) const VERSION_MAJOR: u16 = 1;
pub(crate) const VERSION_MINOR: u16 = 7;
/// Largest decompressed frame the reader accepts.
pub(crate) const MAX_FRAME_CONTENT: u64 = 256 << 20;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Writes a whole trace to bytes.
/// The whole trace as native bytes, for tests and benchmarks: panics on a record the writer
/// refuses ([`TraceWriter::push`]).
pub fn write_bytes(trace: &Trace, opts: WriteOptions) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &trace.header, opts).expect("writing to memory");
    for r in &trace.requests {
        w.push(r).expect("writing to memory");
    }
    w.finish().expect("writing to memory")
}

/// Writes a whole trace to a file (via a `.partial` file renamed when complete).
pub fn write_file(path: &Path, trace: &Trace, opts: WriteOptions) -> Result<(), TraceError> {
    write_file_from(path, &trace.header, opts, trace.requests.iter().map(Ok)).map(drop)
}

/// Writes `records` to a file as they come (via a `.partial` file renamed when complete and
/// removed on an error, [`crate::sys::partial`], the records' own included); returns how many were
/// written.
pub fn write_file_from<R: std::borrow::Borrow<Request>, E: From<TraceError>>(
    path: &Path,
    header: &TraceHeader,
    opts: WriteOptions,
    records: impl Iterator<Item = Result<R, E>>,
) -> Result<u64, E> {
    let io = |e: std::io::Error| io_err(&path.display().to_string(), e);
    let (partial, f) = crate::sys::partial::Partial::create(path).map_err(io)?;
    let mut w = TraceWriter::new(std::io::BufWriter::new(f), header, opts).map_err(io)?;
    for r in records {
        w.push(r?.borrow()).map_err(io)?;
    }
    let n = w.records();
    let bw = w.finish().map_err(io)?;
    let f = bw.into_inner().map_err(|e| io(e.into_error()))?;
    partial.commit(f).map_err(io)?;
    Ok(n)
}

#[allow(dead_code)]
fn _scheme_is_serializable(_: HashScheme) {}

mod records;
pub(crate) use records::*;
mod write;
pub use write::*;
mod read;
pub use read::*;

#[cfg(test)]
mod tests;
