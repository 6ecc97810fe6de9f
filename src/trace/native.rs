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
//!     recorder's bound, later events in no figure but u (false)}}`.
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
pub(crate) const VERSION_MINOR: u16 = 5;
/// Largest decompressed frame the reader accepts.
pub(crate) const MAX_FRAME_CONTENT: u64 = 256 << 20;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

#[derive(Serialize, Deserialize)]
struct HeaderWire {
    magic: String,
    version: (u16, u16),
    #[serde(flatten)]
    header: TraceHeader,
}

#[derive(Serialize, Deserialize)]
struct FrameWire {
    frame: u64,
    n: u64,
    first: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    dropped: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

#[derive(Serialize, Deserialize, Default)]
struct RequestWire {
    #[serde(default)]
    t: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    i: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    o: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    h: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    e: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    v: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<String>,
    #[serde(default, skip_serializing_if = "Params::is_empty")]
    p: Params,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s: Option<Session>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_bytes")]
    b: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<ResponseWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ic: Option<String>,
}

#[derive(Serialize, Deserialize, Default)]
struct ResponseWire {
    #[serde(default)]
    st: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    er: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tf: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    eg: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    et: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    en: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    u: Option<(u64, u64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sm: Option<ServerMetrics>,
    #[serde(default, skip_serializing_if = "is_false")]
    c: bool,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_bytes")]
    b: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ch: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    x: Option<PastCapWire>,
}

#[derive(Serialize, Deserialize, Default)]
struct PastCapWire {
    #[serde(default, skip_serializing_if = "is_zero")]
    n: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    s: bool,
}

mod opt_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    pub(crate) fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_bytes(b),
            None => s.serialize_none(),
        }
    }
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<serde_bytes::ByteBuf>::deserialize(d)?.map(|b| b.into_vec()))
    }
}

/// Encodes ids as flat runs of consecutive values.
pub(crate) fn encode_runs(ids: &[u64], out: &mut Vec<u64>) {
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut len = 1u64;
        while i + (len as usize) < ids.len()
            && start.checked_add(len) == Some(ids[i + len as usize])
        {
            len += 1;
        }
        out.push(start);
        out.push(len);
        i += len as usize;
    }
}

/// Decodes flat runs; `limit` caps the total ids (corrupt input must not allocate unboundedly).
#[cfg(test)]
pub(crate) fn decode_runs(runs: &[u64], limit: u64) -> Result<Vec<u64>, String> {
    let total = check_runs(runs, limit)?;
    Ok(expand_runs(runs, total))
}

/// The number of ids flat runs declare, checked as [`decode_runs`] checks them, nothing
/// allocated: an even length, no overflow, at most `limit` ids.
fn check_runs(runs: &[u64], limit: u64) -> Result<u64, String> {
    if runs.len() % 2 != 0 {
        return Err("hash id runs have odd length".into());
    }
    let total = runs
        .chunks(2)
        .try_fold(0u64, |acc, r| acc.checked_add(r[1]))
        .ok_or("hash id run lengths overflow")?;
    if total > limit {
        return Err(format!("{total} hash ids exceed the limit of {limit}"));
    }
    if runs
        .chunks(2)
        .any(|r| r[1] > 0 && r[0].checked_add(r[1] - 1).is_none())
    {
        return Err("hash id run overflows u64".into());
    }
    Ok(total)
}

/// The ids of runs that passed [`check_runs`] (`total` of them).
fn expand_runs(runs: &[u64], total: u64) -> Vec<u64> {
    let mut out = Vec::with_capacity(total as usize);
    for r in runs.chunks_exact(2) {
        out.extend((0..r[1]).map(|k| r[0].wrapping_add(k)));
    }
    out
}

/// A decoded record whose hash ids are still the runs it was stored as (checked, as small as
/// its frame): they are expanded only when the record is handed out, so a reader holds the
/// expanded ids of one record at a time, never a frame's.
struct Unexpanded {
    req: Request,
    runs: Vec<u64>,
    ids: u64,
}

impl Unexpanded {
    fn expand(self) -> Request {
        Request {
            hash_ids: expand_runs(&self.runs, self.ids),
            ..self.req
        }
    }
}

impl RequestWire {
    /// The wire form of a record; `prev_arrival` is the previous record's arrival.
    fn from_request(r: &Request, prev_arrival: u64) -> RequestWire {
        let mut h = Vec::new();
        encode_runs(&r.hash_ids, &mut h);
        RequestWire {
            t: r.arrival_us as i64 - prev_arrival as i64,
            i: r.input_tokens,
            o: r.output_tokens,
            h,
            e: match &r.endpoint {
                Endpoint::Completions => None,
                e => Some(e.as_str().to_string()),
            },
            v: r.method.clone(),
            m: r.model.clone(),
            p: r.params.clone(),
            s: r.session.clone(),
            b: r.body.clone(),
            r: r.response.as_deref().map(ResponseWire::from_response),
            ic: r.input_count.wire().map(str::to_string),
        }
    }

    /// The record, checked whole; its ids left as runs.
    fn into_unexpanded(
        self,
        prev_arrival: u64,
        header: &TraceHeader,
    ) -> Result<Unexpanded, String> {
        let arrival = prev_arrival as i64 + self.t;
        if arrival < 0 {
            return Err(format!("negative arrival time {arrival} µs"));
        }
        let max = super::rows::MAX_TOKENS;
        if self.i > max || self.o > max {
            return Err(format!(
                "input {} / output {} tokens: over the limit of {max}",
                self.i, self.o
            ));
        }
        let id_limit = super::rows::id_limit(header.blocks_for(self.i));
        let ids = check_runs(&self.h, id_limit)
            .map_err(|e| format!("{e} (input length {} allows {id_limit})", self.i))?;
        let req = Request {
            arrival_us: arrival as u64,
            session: self.s,
            method: self.v,
            endpoint: self
                .e
                .as_deref()
                .map_or(Endpoint::Completions, Endpoint::parse),
            model: self.m,
            params: self.p,
            input_tokens: self.i,
            output_tokens: self.o,
            hash_ids: Vec::new(),
            response: self
                .r
                .map(|r| r.into_response().map(Box::new))
                .transpose()?,
            body: self.b,
            input_count: super::InputCount::from_wire(self.ic.as_deref()),
        };
        Ok(Unexpanded {
            req,
            runs: self.h,
            ids,
        })
    }
}

impl ResponseWire {
    fn from_response(r: &Response) -> ResponseWire {
        let mut prev = 0u64;
        let eg = r
            .events
            .iter()
            .map(|e| {
                let g = e.offset_us.saturating_sub(prev);
                prev = e.offset_us.max(prev);
                g
            })
            .collect();
        let et = if r.events.iter().all(|e| e.tokens == 1) {
            Vec::new()
        } else {
            r.events.iter().map(|e| e.tokens).collect()
        };
        ResponseWire {
            st: r.status,
            er: r.error.clone(),
            hd: r.headers_us,
            tf: r.ttft_us,
            eg,
            et,
            en: r.end_us,
            u: r.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
            sm: r.server_metrics.clone(),
            c: r.cancelled,
            b: r.body.clone(),
            ch: r.choice_tokens.clone(),
            x: r.past_cap.map(|p| PastCapWire {
                n: p.events,
                s: p.stopped,
            }),
        }
    }

    fn into_response(self) -> Result<Response, String> {
        if self.ch.len() > super::MAX_CHOICES {
            let max = super::MAX_CHOICES;
            return Err(format!("{} choices counted (at most {max})", self.ch.len()));
        }
        if let Some(x) = self.x.as_ref().filter(|x| x.n > self.eg.len() as u64) {
            return Err(format!(
                "{} events past the capture cap, of {} events",
                x.n,
                self.eg.len()
            ));
        }
        if !self.et.is_empty() && self.et.len() != self.eg.len() {
            return Err(format!(
                "{} event gaps but {} event token counts",
                self.eg.len(),
                self.et.len()
            ));
        }
        let mut off = 0u64;
        let events = self
            .eg
            .iter()
            .enumerate()
            .map(|(k, g)| {
                off = off.saturating_add(*g);
                Event {
                    offset_us: off,
                    tokens: self.et.get(k).copied().unwrap_or(1),
                }
            })
            .collect();
        Ok(Response {
            status: self.st,
            error: self.er,
            headers_us: self.hd,
            ttft_us: self.tf,
            events,
            end_us: self.en,
            usage: self.u.map(|(p, c)| Usage {
                prompt_tokens: p,
                completion_tokens: c,
            }),
            server_metrics: self.sm,
            cancelled: self.c,
            body: self.b,
            choice_tokens: self.ch,
            past_cap: self.x.map(|x| PastCap {
                events: x.n,
                stopped: x.s,
            }),
        })
    }
}

/// One zstd frame of `content` into `out` (replaced), through a reused context: the same bytes
/// as a fresh compressor at the context's level with a content checksum (content size in the
/// frame header).
fn compress_into(
    zc: &mut zstd::bulk::Compressor<'static>,
    content: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(content.len()));
    zc.compress_to_buffer(content, out)?;
    Ok(())
}

fn cbor<T: Serialize>(v: &T, out: &mut Vec<u8>) {
    // Writing CBOR into a Vec cannot fail for these plain data types.
    ciborium::into_writer(v, &mut *out).expect("CBOR encoding into memory");
}

/// Appends one record as the trace writer encodes it, `prev_arrival` being the previous
/// record's arrival in the same file.
pub(crate) fn encode_record(r: &Request, prev_arrival: u64, out: &mut Vec<u8>) {
    cbor(&RequestWire::from_request(r, prev_arrival), out);
}

/// Options for [`TraceWriter`].
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// zstd level (3 while recording; 19 for `convert`).
    pub level: i32,
    /// Close the open frame once its uncompressed size passes this.
    pub frame_bytes: usize,
    /// Close the open frame at the first push after it has been open this long (`None`: never).
    /// A writer that may sit idle should also call [`TraceWriter::flush_frame`] on a timer.
    pub frame_age: Option<std::time::Duration>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            level: 3,
            frame_bytes: 4 << 20,
            frame_age: Some(std::time::Duration::from_secs(1)),
        }
    }
}

/// Bytes kept free at the front of the frame buffer for the frame header (at most 59 bytes:
/// a map of four keys with 64-bit values), so a frame is compressed from one slice, uncopied.
const FRAME_HEAD_ROOM: usize = 64;

/// Writes a native trace: header frame, then record frames.
pub struct TraceWriter<W: Write> {
    out: W,
    opts: WriteOptions,
    /// The open frame: `FRAME_HEAD_ROOM` bytes of room, then its records' CBOR.
    buf: Vec<u8>,
    /// One zstd context for every frame of the file (a fresh one per frame costs its setup),
    /// and the reused output buffer.
    zc: zstd::bulk::Compressor<'static>,
    zbuf: Vec<u8>,
    in_frame: u64,
    /// Hash ids of the open frame's records (at most [`MAX_FRAME_IDS`]).
    frame_ids: u64,
    frame_opened: Option<std::time::Instant>,
    prev_arrival: u64,
    frames: u64,
    records: u64,
    dropped: u64,
    bytes_written: u64,
    /// The file's header: its block rule bounds each record's hash ids.
    header: TraceHeader,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header frame.
    pub fn new(out: W, header: &TraceHeader, opts: WriteOptions) -> std::io::Result<Self> {
        if header.block_size == 0 {
            // Every reader refuses such a header.
            let msg = "block_size 0: a block holds at least one token";
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        let mut zc = zstd::bulk::Compressor::new(opts.level)?;
        zc.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
        let mut buf = Vec::with_capacity(1 << 16);
        buf.resize(FRAME_HEAD_ROOM, 0);
        let mut w = TraceWriter {
            out,
            opts,
            buf,
            zc,
            zbuf: Vec::new(),
            in_frame: 0,
            frame_ids: 0,
            frame_opened: None,
            prev_arrival: 0,
            frames: 0,
            records: 0,
            dropped: 0,
            bytes_written: 0,
            header: header.clone(),
        };
        let mut hb = Vec::new();
        cbor(
            &HeaderWire {
                magic: MAGIC.into(),
                version: (VERSION_MAJOR, VERSION_MINOR),
                header: header.clone(),
            },
            &mut hb,
        );
        w.write_frame(&hb)?;
        Ok(w)
    }

    fn write_frame(&mut self, content: &[u8]) -> std::io::Result<()> {
        compress_into(&mut self.zc, content, &mut self.zbuf)?;
        self.out.write_all(&self.zbuf)?;
        self.bytes_written += self.zbuf.len() as u64;
        Ok(())
    }

    /// Appends a record; closes the frame when it is large enough. A record with more hash ids
    /// than its input length allows under the header ([`TraceHeader::check_ids`]) is refused
    /// (`InvalidInput`, nothing written): the reader would refuse it, and its frame with it.
    pub fn push(&mut self, r: &Request) -> std::io::Result<()> {
        // Every reader refuses an arrival past i64::MAX µs (its delta would turn negative).
        if i64::try_from(r.arrival_us).is_err() {
            let k = self.records + self.in_frame;
            let msg = format!(
                "record {k}: arrival {} µs is beyond any trace",
                r.arrival_us
            );
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        if let Some(resp) = r.response.as_deref() {
            let n = resp.past_cap.map_or(0, |p| p.events);
            if n > resp.events.len() as u64 {
                let k = self.records + self.in_frame;
                let msg = format!(
                    "record {k}: {n} events past the capture cap, of {} events",
                    resp.events.len()
                );
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
            }
        }
        if let Err(e) = self.header.check_ids(r.hash_ids.len(), r.input_tokens) {
            let k = self.records + self.in_frame;
            let msg = format!("record {k}: {e}");
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        // A frame holds at most MAX_FRAME_IDS ids, as every reader requires.
        let ids = r.hash_ids.len() as u64;
        if self.in_frame > 0 && self.frame_ids + ids > MAX_FRAME_IDS {
            self.flush_frame()?;
        }
        encode_record(r, self.prev_arrival, &mut self.buf);
        self.prev_arrival = r.arrival_us;
        self.in_frame += 1;
        self.frame_ids += ids;
        let opened = *self
            .frame_opened
            .get_or_insert_with(std::time::Instant::now);
        let too_old = self
            .opts
            .frame_age
            .is_some_and(|age| opened.elapsed() >= age);
        if self.buf.len() - FRAME_HEAD_ROOM >= self.opts.frame_bytes || too_old {
            self.flush_frame()?;
        }
        Ok(())
    }

    /// Records that `n` more records were dropped upstream of the writer (kept in frame headers).
    pub(crate) fn note_dropped(&mut self, n: u64) {
        self.dropped += n;
    }

    /// Closes the open frame (if it holds records) and flushes the output.
    pub(crate) fn flush_frame(&mut self) -> std::io::Result<()> {
        if self.in_frame == 0 {
            return self.out.flush();
        }
        self.frames += 1;
        let mut head = Vec::with_capacity(FRAME_HEAD_ROOM);
        cbor(
            &FrameWire {
                frame: self.frames,
                n: self.in_frame,
                first: self.records,
                dropped: self.dropped,
            },
            &mut head,
        );
        // The frame header goes into the room before the records: one slice, no copy of them.
        let at = FRAME_HEAD_ROOM - head.len().min(FRAME_HEAD_ROOM);
        let res = if head.len() <= FRAME_HEAD_ROOM {
            self.buf[at..FRAME_HEAD_ROOM].copy_from_slice(&head);
            compress_into(&mut self.zc, &self.buf[at..], &mut self.zbuf)
        } else {
            head.extend_from_slice(&self.buf[FRAME_HEAD_ROOM..]);
            compress_into(&mut self.zc, &head, &mut self.zbuf)
        };
        res?;
        self.out.write_all(&self.zbuf)?;
        self.bytes_written += self.zbuf.len() as u64;
        self.records += self.in_frame;
        self.in_frame = 0;
        self.frame_ids = 0;
        self.frame_opened = None;
        self.prev_arrival = 0;
        self.buf.truncate(FRAME_HEAD_ROOM);
        self.out.flush()
    }

    /// Records written so far (including the open frame).
    pub(crate) fn records(&self) -> u64 {
        self.records + self.in_frame
    }

    /// Compressed bytes written so far (closed frames only).
    pub(crate) fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Closes the last frame and returns the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.flush_frame()?;
        Ok(self.out)
    }

    pub(crate) fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}

/// What the reader found besides records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadReport {
    /// Complete frames decoded (header frame included).
    pub frames_ok: u64,
    pub records: u64,
    /// Byte offset where a truncated (incomplete) last frame starts, if the file was cut.
    pub truncated_at: Option<u64>,
    /// Bytes after the last complete frame that could not be used.
    pub(crate) bytes_lost: u64,
    /// Corrupt frames: (byte offset, what was wrong).
    pub corrupt: Vec<(u64, String)>,
    /// Records dropped by the writer, as its last frame header said.
    pub dropped_by_writer: u64,
    /// Records that came after a later arrival in the file (frames are written in completion
    /// order); the reader returns them in arrival order.
    pub reordered: u64,
}

impl ReadReport {
    /// True when the whole file was read without loss.
    pub fn is_clean(&self) -> bool {
        self.truncated_at.is_none() && self.corrupt.is_empty()
    }

    /// One line for humans, e.g. "recovered 1200 records from 3 complete frames; file cut at byte 4521".
    pub fn summary(&self) -> String {
        let mut s = format!(
            "recovered {} records from {} complete frames",
            self.records, self.frames_ok
        );
        if let Some(off) = self.truncated_at {
            s.push_str(&format!(
                "; file cut at byte {off} ({} bytes of an incomplete frame lost)",
                self.bytes_lost
            ));
        }
        for (off, msg) in &self.corrupt {
            s.push_str(&format!("; corrupt frame at byte {off}: {msg}"));
        }
        s
    }
}

/// Does `data` start like a native trace (a zstd frame whose content starts with our header)?
pub fn sniff(data: &[u8]) -> bool {
    if !data.starts_with(&ZSTD_MAGIC) {
        return false;
    }
    let Ok(first) = first_frame(data) else {
        return false;
    };
    first
        .windows(MAGIC.len())
        .take(64)
        .any(|w| w == MAGIC.as_bytes())
}

fn first_frame(data: &[u8]) -> Result<Vec<u8>, String> {
    let len = zstd::zstd_safe::find_frame_compressed_size(data).map_err(|_| "no zstd frame")?;
    decompress_frame(&data[..len])
}

fn decompress_frame(frame: &[u8]) -> Result<Vec<u8>, String> {
    let cap = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n <= MAX_FRAME_CONTENT => n as usize,
        Ok(Some(n)) => return Err(format!("frame declares {n} bytes, over the limit")),
        _ => return Err("frame has no content size".into()),
    };
    zstd::bulk::decompress(frame, cap).map_err(|e| format!("zstd: {e}"))
}

/// Reads a whole native trace from bytes. `path` only names the source in errors.
///
/// Errors only when no header can be read or the version is newer; damage after the header is
/// reported in the [`ReadReport`] and the good records are returned.
pub fn read_bytes(path: &str, data: &[u8]) -> Result<(Trace, ReadReport), TraceError> {
    read_bytes_as(path, data, None)
}

/// [`read_bytes`], read with `block_size` tokens per hash id instead of the header's when given
/// (records are bounded by it).
pub(crate) fn read_bytes_as(
    path: &str,
    data: &[u8],
    block_size: Option<u32>,
) -> Result<(Trace, ReadReport), TraceError> {
    let mut scan = FrameScanner::new(data);
    let header = read_header(path, &mut scan, block_size)?;
    let mut report = ReadReport {
        frames_ok: 1,
        ..Default::default()
    };
    let (mut requests, mut frame_records) = (Vec::new(), Vec::new());
    while let Some(item) = scan.next_item().map_err(|e| io_err(path, e))? {
        if let Scanned::Frame(pos, frame) = item {
            match decode_frame(&frame, &header, &mut frame_records) {
                Ok(dropped) => report.good_frame(dropped),
                Err(msg) => report.corrupt.push((pos, msg)),
            }
            requests.extend(frame_records.drain(..).map(Unexpanded::expand));
        } else {
            report.note(item);
        }
    }
    report.records = requests.len() as u64;
    let mut trace = Trace { header, requests };
    report.reordered = trace.sort_by_arrival();
    Ok((trace, report))
}

fn io_err(path: &str, source: std::io::Error) -> TraceError {
    TraceError::Io {
        path: path.to_string(),
        source,
    }
}

/// The header frame, checked: magic, version, fields; its block size replaced by `block_size`
/// when given.
fn read_header<R: Read>(
    path: &str,
    scan: &mut FrameScanner<R>,
    block_size: Option<u32>,
) -> Result<TraceHeader, TraceError> {
    let err = |msg: String| TraceError::File {
        path: path.to_string(),
        msg,
    };
    let first = scan.next_item().map_err(|e| io_err(path, e))?;
    let Some(Scanned::Frame(0, frame)) = first else {
        return Err(err(
            "not a native trace (no complete zstd header frame)".into()
        ));
    };
    let hcontent = decompress_frame(&frame).map_err(|m| err(format!("header: {m}")))?;
    let hv: ciborium::Value = ciborium::from_reader(hcontent.as_slice())
        .map_err(|e| err(format!("header is not CBOR: {e}")))?;
    check_magic_version(path, &hv)?;
    let hw: HeaderWire = hv
        .deserialized()
        .map_err(|e| err(format!("bad header: {e}")))?;
    let mut header = hw.header;
    if header.block_size == 0 {
        return Err(err(
            "bad header: block_size is 0 (a block holds at least one token)".into(),
        ));
    }
    if let Some(b) = block_size {
        header.block_size = b;
    }
    Ok(header)
}

impl ReadReport {
    fn good_frame(&mut self, dropped: u64) {
        self.frames_ok += 1;
        self.dropped_by_writer = self.dropped_by_writer.max(dropped);
    }

    /// Notes an unreadable stretch or a cut.
    fn note(&mut self, item: Scanned) {
        match item {
            Scanned::Frame(..) => {}
            Scanned::Unreadable(pos) => self.corrupt.push((pos, "unreadable zstd frame".into())),
            Scanned::Cut(pos, lost) => {
                self.truncated_at = Some(pos);
                self.bytes_lost = lost;
            }
        }
    }
}

/// What [`FrameScanner`] found next.
enum Scanned {
    /// A complete zstd frame at this byte offset.
    Frame(u64, Vec<u8>),
    /// Bytes at this offset that are no zstd frame, followed later by a frame magic.
    Unreadable(u64),
    /// The file ends inside a frame starting here; so many bytes were lost.
    Cut(u64, u64),
}

/// Largest compressed frame the scanner buffers while looking for its end.
const MAX_FRAME_COMPRESSED: usize =
    (MAX_FRAME_CONTENT as usize) + (MAX_FRAME_CONTENT as usize >> 7) + (1 << 20);

/// Splits a byte stream into zstd frames, holding one frame (plus a read chunk) at a time. After
/// an unreadable frame it resynchronises on the next frame magic; a stream that ends inside a
/// frame is a cut.
struct FrameScanner<R> {
    src: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`, and the stream offset of `buf[0]`.
    pos: usize,
    base: u64,
    eof: bool,
    done: bool,
}

impl<R: Read> FrameScanner<R> {
    fn new(src: R) -> Self {
        FrameScanner {
            src,
            buf: Vec::new(),
            pos: 0,
            base: 0,
            eof: false,
            done: false,
        }
    }

    /// Reads until at least `more` bytes beyond the unconsumed ones are buffered, or the end.
    fn fill(&mut self, more: usize) -> std::io::Result<()> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
        }
        let want = self.buf.len() + more.max(64 << 10);
        while !self.eof && self.buf.len() < want {
            let at = self.buf.len();
            self.buf.resize(want, 0);
            let n = loop {
                match self.src.read(&mut self.buf[at..]) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            let n = n.inspect_err(|_| self.buf.truncate(at))?;
            self.buf.truncate(at + n);
            self.eof = n == 0;
        }
        Ok(())
    }

    fn next_item(&mut self) -> std::io::Result<Option<Scanned>> {
        if self.done {
            return Ok(None);
        }
        loop {
            let rest = &self.buf[self.pos..];
            let at = self.base + self.pos as u64;
            if rest.is_empty() {
                if self.eof {
                    self.done = true;
                    return Ok(None);
                }
                self.fill(0)?;
                continue;
            }
            match zstd::zstd_safe::find_frame_compressed_size(rest) {
                Ok(len) if len > 0 && len <= rest.len() => {
                    let frame = rest[..len].to_vec();
                    self.pos += len;
                    return Ok(Some(Scanned::Frame(at, frame)));
                }
                _ if !self.eof && rest.len() < MAX_FRAME_COMPRESSED => {
                    let more = rest.len();
                    self.fill(more)?;
                }
                _ => return self.resync(at),
            }
        }
    }

    /// After an unreadable frame at `at`: skips to the next frame magic (an unreadable frame),
    /// or to the end (a cut).
    fn resync(&mut self, at: u64) -> std::io::Result<Option<Scanned>> {
        let mut from = self.pos + 1;
        loop {
            if let Some(k) = find_magic(&self.buf[from.min(self.buf.len())..]) {
                self.pos = from + k;
                return Ok(Some(Scanned::Unreadable(at)));
            }
            if self.eof {
                self.done = true;
                let end = self.base + self.buf.len() as u64;
                return Ok(Some(Scanned::Cut(at, end - at)));
            }
            // Keep the last three bytes: a magic may straddle the next read.
            self.pos = from.max(self.buf.len().saturating_sub(3));
            self.fill(0)?;
            from = 0;
        }
    }
}

/// Where one good record frame lies in a file, and the earliest arrival in it.
struct FrameEntry {
    offset: u64,
    len: usize,
    min_arrival: u64,
}

/// A native trace file read frame by frame in arrival order, in two passes: the first decodes
/// every frame once (the [`ReadReport`], each good frame's place and earliest arrival); the
/// second merges the frames by arrival, decoding a frame only when its earliest record is due,
/// so memory holds the frames whose arrival ranges overlap (a recording's frames overlap by the
/// longest request's duration), never the whole file. Hash ids stay runs until a record is
/// handed out: however many ids a file's runs declare, the expanded ids in memory are one
/// record's (at most [`super::rows::id_limit`]). The records and report equal [`read_bytes`]
/// of the same file.
pub struct NativeStream {
    path: String,
    file: std::fs::File,
    header: TraceHeader,
    report: ReadReport,
    /// Good frames by (earliest arrival, file order), the next to decode first.
    frames: std::collections::VecDeque<(usize, FrameEntry)>,
    due: BinaryHeap<Reverse<Pending>>,
}

/// A decoded record waiting for its turn: ordered by arrival, then file position.
struct Pending {
    key: (u64, usize, usize),
    rec: Unexpanded,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

impl NativeStream {
    /// Opens `path` and runs the first pass.
    pub fn open(path: &Path) -> Result<NativeStream, TraceError> {
        Self::open_as(path, None)
    }

    /// [`Self::open`], read with `block_size` tokens per hash id instead of the header's when
    /// given (records are bounded by it).
    pub(crate) fn open_as(
        path: &Path,
        block_size: Option<u32>,
    ) -> Result<NativeStream, TraceError> {
        let name = path.display().to_string();
        let open = || std::fs::File::open(path).map_err(|e| io_err(&path.display().to_string(), e));
        let mut scan = FrameScanner::new(open()?);
        let header = read_header(&name, &mut scan, block_size)?;
        let mut report = ReadReport {
            frames_ok: 1,
            ..Default::default()
        };
        let mut frames = Vec::new();
        let mut scratch = Vec::new();
        let mut last = 0u64;
        while let Some(item) = scan.next_item().map_err(|e| io_err(&name, e))? {
            let Scanned::Frame(offset, frame) = item else {
                report.note(item);
                continue;
            };
            scratch.clear();
            match decode_frame(&frame, &header, &mut scratch) {
                Ok(dropped) => report.good_frame(dropped),
                Err(msg) => {
                    report.corrupt.push((offset, msg));
                    continue;
                }
            }
            for r in scratch.iter().map(|u| &u.req) {
                report.reordered += u64::from(report.records > 0 && r.arrival_us < last);
                last = r.arrival_us;
                report.records += 1;
            }
            if let Some(min_arrival) = scratch.iter().map(|u| u.req.arrival_us).min() {
                frames.push(FrameEntry {
                    offset,
                    len: frame.len(),
                    min_arrival,
                });
            }
        }
        let mut frames: Vec<(usize, FrameEntry)> = frames.into_iter().enumerate().collect();
        frames.sort_by_key(|(k, f)| (f.min_arrival, *k));
        Ok(NativeStream {
            path: name,
            file: open()?,
            header,
            report,
            frames: frames.into(),
            due: BinaryHeap::new(),
        })
    }

    pub(crate) fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// What the first pass found (complete before the first record).
    pub fn report(&self) -> &ReadReport {
        &self.report
    }

    /// The earliest arrival in the file (from the first pass; nothing decoded).
    pub(crate) fn earliest(&self) -> Option<u64> {
        self.frames.front().map(|(_, f)| f.min_arrival)
    }

    /// Decodes the next frame by earliest arrival into the heap.
    fn load_next(&mut self) -> Result<(), TraceError> {
        use std::io::{Seek, SeekFrom};
        let Some((k, f)) = self.frames.pop_front() else {
            return Ok(());
        };
        let mut frame = vec![0; f.len];
        self.file
            .seek(SeekFrom::Start(f.offset))
            .and_then(|_| self.file.read_exact(&mut frame))
            .map_err(|e| io_err(&self.path, e))?;
        let mut reqs = Vec::new();
        decode_frame(&frame, &self.header, &mut reqs).map_err(|msg| TraceError::File {
            path: self.path.clone(),
            msg: format!("frame at byte {} changed while reading: {msg}", f.offset),
        })?;
        for (j, rec) in reqs.into_iter().enumerate() {
            let key = (rec.req.arrival_us, k, j);
            self.due.push(Reverse(Pending { key, rec }));
        }
        Ok(())
    }
}

impl Iterator for NativeStream {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // The heap's least record is next unless an undecoded frame may hold an earlier one.
            let head = self.due.peek().map(|Reverse(p)| p.key);
            let frame = self.frames.front().map(|(k, f)| (f.min_arrival, *k, 0));
            match (head, frame) {
                (Some(h), Some(f)) if h < f => break,
                (Some(_), None) => break,
                (None, None) => return None,
                _ => {
                    if let Err(e) = self.load_next() {
                        self.frames.clear();
                        return Some(Err(e));
                    }
                }
            }
        }
        self.due.pop().map(|Reverse(p)| Ok(p.rec.expand()))
    }
}

fn find_magic(data: &[u8]) -> Option<usize> {
    data.windows(4).position(|w| w == ZSTD_MAGIC)
}

fn check_magic_version(path: &str, v: &ciborium::Value) -> Result<(), TraceError> {
    let err = |msg: &str| TraceError::File {
        path: path.to_string(),
        msg: msg.to_string(),
    };
    let map = v.as_map().ok_or_else(|| err("header is not a map"))?;
    let get = |k: &str| {
        map.iter()
            .find(|(kk, _)| kk.as_text() == Some(k))
            .map(|(_, v)| v)
    };
    if get("magic").and_then(|m| m.as_text()) != Some(MAGIC) {
        return Err(err("not a retrace trace (header magic missing)"));
    }
    let ver = get("version")
        .and_then(|v| v.as_array())
        .ok_or_else(|| err("header has no version"))?;
    let num = |i: usize| -> u16 {
        ver.get(i)
            .and_then(|x| x.as_integer())
            .and_then(|x| u16::try_from(x).ok())
            .unwrap_or(u16::MAX)
    };
    let (major, minor) = (num(0), num(1));
    if major > VERSION_MAJOR {
        return Err(TraceError::NewerVersion {
            path: path.to_string(),
            found_major: major,
            found_minor: minor,
            ours_major: VERSION_MAJOR,
        });
    }
    Ok(())
}

/// Most hash ids one frame's records may carry together (32 Mi ids, 256 MiB decoded): a few
/// bytes of runs can declare millions of ids per record, each record within its own bound
/// ([`super::rows::id_limit`], at most about 2 × 10^7), so a frame is bounded as a whole too.
/// The writer starts a new frame rather than pass it; a reader drops a frame over it as damaged.
pub const MAX_FRAME_IDS: u64 = 1 << 25;

/// The hash ids a record's runs declare (saturating).
fn run_total(runs: &[u64]) -> u64 {
    runs.chunks(2)
        .map(|r| r.get(1).copied().unwrap_or(0))
        .fold(0u64, u64::saturating_add)
}

/// Decodes one record frame, appending to `out` only if the whole frame is good (its records'
/// ids left as runs).
fn decode_frame(
    frame: &[u8],
    header: &TraceHeader,
    out: &mut Vec<Unexpanded>,
) -> Result<u64, String> {
    let content = decompress_frame(frame)?;
    let mut rd = content.as_slice();
    let fw: FrameWire =
        ciborium::from_reader(&mut rd).map_err(|e| format!("bad frame header: {e}"))?;
    // Each record takes at least one byte: a count beyond the content is corrupt.
    if fw.n > content.len() as u64 {
        return Err(format!(
            "frame claims {} records in {} bytes",
            fw.n,
            content.len()
        ));
    }
    let start = out.len();
    out.reserve(fw.n as usize);
    let mut prev = 0u64;
    let res = (|| {
        // The records as read (their ids still runs, as small as the frame), then their ids
        // counted together, before any is expanded.
        let mut wires = Vec::with_capacity(fw.n as usize);
        let mut ids = 0u64;
        for k in 0..fw.n {
            let w: RequestWire =
                ciborium::from_reader(&mut rd).map_err(|e| format!("record {k}: {e}"))?;
            ids = ids.saturating_add(run_total(&w.h));
            if ids > MAX_FRAME_IDS {
                return Err(format!(
                    "record {k}: the frame's records declare more than {MAX_FRAME_IDS} hash ids"
                ));
            }
            wires.push(w);
        }
        if !rd.is_empty() {
            return Err(format!(
                "{} trailing bytes after {} records",
                rd.len(),
                fw.n
            ));
        }
        for (k, w) in wires.into_iter().enumerate() {
            let r = w
                .into_unexpanded(prev, header)
                .map_err(|e| format!("record {k}: {e}"))?;
            prev = r.req.arrival_us;
            out.push(r);
        }
        Ok(())
    })();
    if let Err(e) = res {
        // All or nothing per frame.
        out.truncate(start);
        return Err(e);
    }
    Ok(fw.dropped)
}

/// Reads a native trace file whole, through [`NativeStream`].
pub fn read_file(path: &Path) -> Result<(Trace, ReadReport), TraceError> {
    let s = NativeStream::open(path)?;
    let (header, report) = (s.header.clone(), s.report.clone());
    let requests = s.collect::<Result<Vec<_>, _>>()?;
    Ok((Trace { header, requests }, report))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Trace {
        let mut reqs = Vec::new();
        for k in 0..n {
            let mut r = Request {
                arrival_us: (k as u64) * 1_000 + (k as u64 % 7),
                input_tokens: 100 + k as u64,
                output_tokens: 10,
                hash_ids: vec![0, 1, 2, k as u64 + 10],
                ..Default::default()
            };
            if k % 3 == 0 {
                r.endpoint = Endpoint::Chat;
                r.model = Some("m".into());
                r.params.max_tokens = Some(10);
                r.session = Some(Session {
                    id: format!("s{}", k % 5),
                    turn: (k / 5) as u32,
                    think_us: Some(5),
                });
                r.response = Some(Box::new(Response {
                    status: 200,
                    ttft_us: Some(50_000),
                    events: vec![
                        Event {
                            offset_us: 50_000,
                            tokens: 0,
                        },
                        Event {
                            offset_us: 60_000,
                            tokens: 2,
                        },
                    ],
                    end_us: Some(61_000),
                    usage: Some(Usage {
                        prompt_tokens: 100,
                        completion_tokens: 2,
                    }),
                    server_metrics: Some(ServerMetrics {
                        queue_time_ms: Some(0.5),
                        ..Default::default()
                    }),
                    body: Some(b"data: x\n\n".to_vec()),
                    ..Default::default()
                }));
                r.body = Some(b"{\"prompt\":[1,2]}".to_vec());
            }
            reqs.push(r);
        }
        Trace {
            header: TraceHeader::imported(16, true, "test"),
            requests: reqs,
        }
    }

    #[test]
    fn round_trip_across_frames() {
        let t = sample(500);
        let bytes = write_bytes(
            &t,
            WriteOptions {
                level: 3,
                frame_bytes: 2000,
                frame_age: None,
            },
        );
        let (back, rep) = read_bytes("mem", &bytes).unwrap();
        assert!(rep.is_clean(), "{rep:?}");
        assert!(
            rep.frames_ok > 3,
            "small frame_bytes must make several frames"
        );
        assert_eq!(back, t);
    }

    /// A past-the-cap note round-trips; one counting more events than the record has is
    /// refused, and a reader that knows no `x` reads the rest of the record as it was.
    #[test]
    fn past_cap_notes_round_trip_and_are_checked() {
        let resp = Response {
            status: 200,
            events: vec![Event {
                offset_us: 3,
                tokens: 1,
            }],
            past_cap: Some(PastCap {
                events: 1,
                stopped: true,
            }),
            ..Default::default()
        };
        let wire = ResponseWire::from_response(&resp);
        assert_eq!(wire.x.as_ref().map(|x| (x.n, x.s)), Some((1, true)));
        let mut buf = Vec::new();
        cbor(&wire, &mut buf);
        let back: ResponseWire = ciborium::from_reader(buf.as_slice()).unwrap();
        assert_eq!(back.into_response().unwrap(), resp);
        #[derive(Deserialize)]
        struct Older {
            eg: Vec<u64>,
            st: u16,
        }
        let old: Older = ciborium::from_reader(buf.as_slice()).unwrap();
        assert_eq!((old.eg, old.st), (vec![3], 200));
        let over = ResponseWire {
            eg: vec![3],
            x: Some(PastCapWire { n: 2, s: false }),
            ..Default::default()
        };
        let e = over.into_response().unwrap_err();
        assert!(
            e.contains("2 events past the capture cap, of 1 events"),
            "{e}"
        );
        // The writer refuses what the readers refuse.
        let header = TraceHeader::imported(16, true, "t");
        let mut w = TraceWriter::new(Vec::new(), &header, WriteOptions::default()).unwrap();
        let mut bad = resp.clone();
        bad.past_cap = Some(PastCap {
            events: 2,
            stopped: false,
        });
        let r = Request {
            response: Some(Box::new(bad)),
            ..Default::default()
        };
        let e = w.push(&r).unwrap_err().to_string();
        assert!(
            e.contains("2 events past the capture cap, of 1 events"),
            "{e}"
        );
    }

    #[test]
    fn runs_round_trip() {
        let ids = vec![5, 6, 7, 1, 9, 10, u64::MAX, 0];
        let mut r = Vec::new();
        encode_runs(&ids, &mut r);
        assert_eq!(r, vec![5, 3, 1, 1, 9, 2, u64::MAX, 1, 0, 1]);
        assert_eq!(decode_runs(&r, 100).unwrap(), ids);
        assert!(decode_runs(&[0, u64::MAX], 1000).is_err());
        assert!(decode_runs(&[0, 5, 1], 1000).is_err());
    }

    #[test]
    fn every_cut_point_recovers_complete_frames_without_panic() {
        let t = sample(300);
        let bytes = write_bytes(
            &t,
            WriteOptions {
                level: 1,
                frame_bytes: 1500,
                frame_age: None,
            },
        );
        // Record where each frame ends, and how many records are complete by then.
        let (_, full) = read_bytes("mem", &bytes).unwrap();
        assert!(full.frames_ok >= 5);
        let mut ends = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            pos += zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..]).unwrap();
            ends.push(pos);
        }
        // records complete at the end of each frame
        let mut complete_at = Vec::new();
        for &e in &ends {
            let (tr, rep) = read_bytes("mem", &bytes[..e]).unwrap();
            assert!(rep.is_clean());
            complete_at.push((e, tr.requests.len()));
        }
        for cut in 0..bytes.len() {
            let res = read_bytes("mem", &bytes[..cut]);
            if cut < ends[0] {
                assert!(res.is_err(), "cut {cut} inside the header must be an error");
                continue;
            }
            let (tr, rep) = res.unwrap();
            let expect = complete_at
                .iter()
                .rev()
                .find(|(e, _)| *e <= cut)
                .map(|(_, n)| *n)
                .unwrap();
            assert_eq!(tr.requests.len(), expect, "cut at {cut}");
            assert_eq!(tr.requests[..], t.requests[..expect]);
            let at_boundary = ends.contains(&cut);
            assert_eq!(rep.truncated_at.is_some(), !at_boundary, "cut at {cut}");
        }
    }

    #[test]
    fn corrupt_middle_frame_is_reported_and_later_frames_read() {
        let t = sample(300);
        let mut bytes = write_bytes(
            &t,
            WriteOptions {
                level: 1,
                frame_bytes: 1500,
                frame_age: None,
            },
        );
        let mut ends = vec![0];
        let mut pos = 0;
        while pos < bytes.len() {
            pos += zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..]).unwrap();
            ends.push(pos);
        }
        // Damage the middle of frame 3 (index 2 counts the header frame as 0).
        let (a, b) = (ends[2], ends[3]);
        for x in &mut bytes[a + 8..b - 4] {
            *x ^= 0x5a;
        }
        let (tr, rep) = read_bytes("mem", &bytes).unwrap();
        assert_eq!(rep.corrupt.len(), 1, "{rep:?}");
        assert_eq!(rep.corrupt[0].0, a as u64);
        assert!(tr.requests.len() < t.requests.len());
        // The last record is still there: frames after the damage were read.
        assert_eq!(tr.requests.last(), t.requests.last());
        assert!(rep.summary().contains("corrupt frame at byte"));
    }

    #[test]
    fn old_frames_close_on_push() {
        let t = sample(3);
        let mut w = TraceWriter::new(
            Vec::new(),
            &t.header,
            WriteOptions {
                frame_age: Some(std::time::Duration::ZERO),
                ..Default::default()
            },
        )
        .unwrap();
        for r in &t.requests {
            w.push(r).unwrap();
        }
        // Every push closed its frame: all three records are readable before finish().
        let (back, rep) = read_bytes("mem", w.get_mut()).unwrap();
        assert_eq!(back.requests.len(), 3);
        assert_eq!(rep.frames_ok, 4);
    }

    /// Frames written through the writer's one reused zstd context are the bytes a fresh
    /// checksumming compressor gives for each frame's content alone.
    #[test]
    fn reused_zstd_context_gives_fresh_context_bytes() {
        let t = sample(400);
        for level in [1, 3, 19] {
            let bytes = write_bytes(
                &t,
                WriteOptions {
                    level,
                    frame_bytes: 3000,
                    frame_age: None,
                },
            );
            let mut pos = 0;
            let mut frames = 0;
            while pos < bytes.len() {
                let len = zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..]).unwrap();
                let frame = &bytes[pos..pos + len];
                let content = decompress_frame(frame).unwrap();
                let mut fresh = zstd::bulk::Compressor::new(level).unwrap();
                fresh
                    .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                    .unwrap();
                assert_eq!(fresh.compress(&content).unwrap(), frame);
                pos += len;
                frames += 1;
            }
            assert!(frames > 5, "{frames} frames");
        }
    }

    #[test]
    fn newer_major_version_is_rejected_clearly() {
        let mut hb = Vec::new();
        let hw = HeaderWire {
            magic: MAGIC.into(),
            version: (VERSION_MAJOR + 1, 0),
            header: TraceHeader::imported(16, true, "future"),
        };
        cbor(&hw, &mut hb);
        let bytes = zstd::bulk::compress(&hb, 3).unwrap();
        let e = read_bytes("f.trace.zst", &bytes).unwrap_err().to_string();
        assert!(e.contains("f.trace.zst") && e.contains("newer"), "{e}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for data in [
            &b""[..],
            b"hello",
            &ZSTD_MAGIC[..],
            b"\x28\xb5\x2f\xfd\x00\x00",
        ] {
            assert!(read_bytes("x", data).is_err());
        }
    }

    #[test]
    fn output_is_a_plain_zstd_stream_of_cbor() {
        let t = sample(10);
        let bytes = write_bytes(&t, WriteOptions::default());
        let plain = zstd::stream::decode_all(bytes.as_slice()).unwrap();
        let mut rd = plain.as_slice();
        let first: ciborium::Value = ciborium::from_reader(&mut rd).unwrap();
        assert!(format!("{first:?}").contains(MAGIC));
        let mut items = 1;
        while !rd.is_empty() {
            let _: ciborium::Value = ciborium::from_reader(&mut rd).unwrap();
            items += 1;
        }
        assert_eq!(items, 1 + 1 + 10, "header, frame header, 10 records");
    }

    /// Every single-bit flip anywhere in a written file is found: the read fails (the header
    /// frame), reports damage, or gives the very records written (a bit zstd ignores, such as the
    /// frame descriptor's unused bit). Without frame checksums flips changed records unnoticed.
    /// Records each inside their own bound but not together: a few bytes of runs declaring
    /// 1,250,016 ids each, 2,000 of them in one frame (20 GB expanded). The frame is dropped as
    /// damaged before any id is expanded; the good frames around it read whole.
    #[test]
    fn a_frame_whose_records_declare_too_many_ids_together_is_damage() {
        let header = TraceHeader::imported(16, true, "t");
        let per = super::super::rows::id_limit(header.blocks_for(10_000_000));
        let rec = |t| RequestWire {
            t,
            i: 10_000_000,
            o: 1,
            h: vec![0, per],
            ..RequestWire::from_request(&Request::default(), 0)
        };
        let mut content = Vec::new();
        cbor(
            &FrameWire {
                frame: 1,
                n: 2000,
                first: 0,
                dropped: 0,
            },
            &mut content,
        );
        for k in 0..2000 {
            cbor(&rec(i64::from(k > 0)), &mut content);
        }
        let mut decoded = Vec::new();
        let e = decode_frame(
            &zstd::bulk::compress(&content, 3).unwrap(),
            &header,
            &mut decoded,
        )
        .unwrap_err();
        assert!(e.contains("more than 33554432 hash ids"), "{e}");
        assert!(decoded.is_empty());
        // The writer keeps frames within the bound: one record of that many ids a frame.
        let big = Request {
            input_tokens: 10_000_000,
            hash_ids: (0..per).collect(),
            ..Default::default()
        };
        // No frame age: the frame closes for its ids alone, however slowly this machine pushes.
        let opts = WriteOptions {
            frame_age: None,
            ..WriteOptions::default()
        };
        let mut w = TraceWriter::new(Vec::new(), &header, opts).unwrap();
        let fit = (MAX_FRAME_IDS / per) as usize;
        for _ in 0..fit {
            w.push(&big).unwrap();
        }
        assert_eq!(
            (w.frames, w.frame_ids),
            (0, fit as u64 * per),
            "all fit in the open frame"
        );
        w.push(&big).unwrap();
        assert_eq!(
            (w.frames, w.frame_ids),
            (1, per),
            "one more starts a new frame"
        );
    }

    #[test]
    fn the_writer_refuses_an_arrival_every_reader_would_refuse() {
        let h = TraceHeader::imported(16, true, "t");
        let mut w = TraceWriter::new(Vec::new(), &h, WriteOptions::default()).unwrap();
        let late = Request {
            arrival_us: u64::MAX,
            ..Default::default()
        };
        let e = w.push(&late).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        w.push(&Request::default()).unwrap();
        let (back, rep) = read_bytes("t", &w.finish().unwrap()).unwrap();
        assert!(
            rep.is_clean() && back.requests.len() == 1,
            "{}",
            rep.summary()
        );
    }

    #[test]
    fn a_header_with_block_size_0_is_refused_by_the_writer_and_the_reader() {
        let mut h = TraceHeader::imported(16, true, "t");
        h.block_size = 0;
        let e = TraceWriter::new(Vec::new(), &h, WriteOptions::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        // A file written with a good header, its block size then patched to 0 in the header
        // frame, is refused naming the field.
        let hw = HeaderWire {
            magic: MAGIC.into(),
            version: (VERSION_MAJOR, VERSION_MINOR),
            header: h,
        };
        let mut cbor = Vec::new();
        ciborium::into_writer(&hw, &mut cbor).unwrap();
        let frame = zstd::bulk::compress(&cbor, 1).unwrap();
        let e = read_bytes("z.trace.zst", &frame).unwrap_err().to_string();
        assert!(
            e.contains("z.trace.zst") && e.contains("block_size is 0"),
            "{e}"
        );
    }

    #[test]
    fn a_record_with_more_hash_ids_than_its_input_allows_is_refused_and_the_rest_reads_whole() {
        let t = sample(6);
        let mut w = TraceWriter::new(Vec::new(), &t.header, WriteOptions::default()).unwrap();
        w.push(&t.requests[0]).unwrap();
        let limit = super::super::rows::id_limit(t.header.blocks_for(1));
        let over = Request {
            input_tokens: 1,
            hash_ids: (0..limit + 1).collect(),
            ..t.requests[1].clone()
        };
        let e = w.push(&over).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().starts_with("record 1: "), "{e}");
        for r in &t.requests[1..] {
            w.push(r).unwrap();
        }
        let (back, rep) = read_bytes("t", &w.finish().unwrap()).unwrap();
        assert!(rep.is_clean(), "{}", rep.summary());
        assert_eq!(back.requests, t.requests);
    }

    #[test]
    fn byte_flips_in_a_native_trace_are_detected_as_damage() {
        let t = sample(60);
        let opts = WriteOptions {
            level: 3,
            frame_bytes: 1500,
            frame_age: None,
        };
        let bytes = write_bytes(&t, opts);
        let hlen = zstd::zstd_safe::find_frame_compressed_size(&bytes).unwrap();
        let mut unnoticed = Vec::new();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            match read_bytes("flip", &b) {
                Ok((back, rep)) if rep.is_clean() && back != t => unnoticed.push(i),
                Ok(_) => {}
                Err(_) => assert!(i < hlen, "byte {i}: only a damaged header fails the read"),
            }
        }
        assert!(bytes.len() > 1000 && hlen < 200, "{} bytes", bytes.len());
        assert!(unnoticed.is_empty(), "flips not detected at {unnoticed:?}");
    }

    /// A file written without checksums (format 1.1) still reads cleanly.
    #[test]
    fn old_files_without_checksums_still_read() {
        let t = sample(30);
        let mut bytes = Vec::new();
        let mut hb = Vec::new();
        let hw = HeaderWire {
            magic: MAGIC.into(),
            version: (1, 1),
            header: t.header.clone(),
        };
        cbor(&hw, &mut hb);
        bytes.extend(zstd::bulk::compress(&hb, 3).unwrap());
        let mut fb = Vec::new();
        let fw = FrameWire {
            frame: 1,
            n: t.requests.len() as u64,
            first: 0,
            dropped: 0,
        };
        cbor(&fw, &mut fb);
        let mut prev = 0;
        for r in &t.requests {
            encode_record(r, prev, &mut fb);
            prev = r.arrival_us;
        }
        bytes.extend(zstd::bulk::compress(&fb, 3).unwrap());
        let (back, rep) = read_bytes("old", &bytes).unwrap();
        assert!(rep.is_clean(), "{}", rep.summary());
        assert_eq!(back, t);
    }
}
