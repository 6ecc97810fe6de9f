//! A direct CBOR encoder for one native-trace request record: the bytes `ciborium` produces for
//! `native::RequestWire` (the serde path), written straight into the frame buffer.
//!
//! The recorder writes one record per proxied request, and the serde path (building the wire
//! struct with its cloned strings and run list, then ciborium's per-item writer calls) was about
//! a quarter of the writer thread's instructions per small request. This encoder walks the
//! [`Request`] once and emits the same items in the same order with the same shortest-form
//! headers: maps of definite length counting only the present keys, keys as one-letter text,
//! integers in their shortest form. Floats (temperature, the server's metrics) are rare and
//! go through ciborium itself (its shortest-float rule, f16/f32/f64), so they cannot differ.
//! Byte-for-byte equality with the serde path is tested in `native` on property-generated
//! records, the shipped traces and records built from the real vLLM samples.
//!
//! It does not decode (the reader stays on serde) and does not know frames or compression.

use super::{Endpoint, Params, Request, Response, ServerMetrics, Session};

const MAJOR_UINT: u8 = 0;
const MAJOR_NINT: u8 = 1 << 5;
const MAJOR_BYTES: u8 = 2 << 5;
const MAJOR_TEXT: u8 = 3 << 5;
const MAJOR_ARRAY: u8 = 4 << 5;
const MAJOR_MAP: u8 = 5 << 5;
const FALSE: u8 = 0xf4;
const TRUE: u8 = 0xf5;

/// A CBOR head: major type and argument in the shortest form.
#[inline]
fn head(out: &mut Vec<u8>, major: u8, v: u64) {
    if v <= 23 {
        out.push(major | v as u8);
    } else if v <= 0xff {
        out.extend_from_slice(&[major | 24, v as u8]);
    } else if v <= 0xffff {
        out.push(major | 25);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
        out.push(major | 26);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(major | 27);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[inline]
fn key(out: &mut Vec<u8>, k: &[u8]) {
    head(out, MAJOR_TEXT, k.len() as u64);
    out.extend_from_slice(k);
}

#[inline]
fn uint(out: &mut Vec<u8>, v: u64) {
    head(out, MAJOR_UINT, v);
}

fn int(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        head(out, MAJOR_NINT, v as u64 ^ !0);
    } else {
        head(out, MAJOR_UINT, v as u64);
    }
}

fn text(out: &mut Vec<u8>, s: &str) {
    head(out, MAJOR_TEXT, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    head(out, MAJOR_BYTES, b.len() as u64);
    out.extend_from_slice(b);
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.push(if b { TRUE } else { FALSE });
}

/// Floats through ciborium (its shortest-form rule), so they are what the serde path writes.
fn float(out: &mut Vec<u8>, v: f64) {
    ciborium::into_writer(&v, &mut *out).expect("CBOR encoding into memory");
}

/// Number of runs `native::encode_runs` makes of `ids`.
fn run_count(ids: &[u64]) -> usize {
    if ids.is_empty() {
        return 0;
    }
    1 + ids
        .windows(2)
        .filter(|w| w[0].checked_add(1) != Some(w[1]))
        .count()
}

/// The runs themselves, as `native::encode_runs` lists them: (start, len) pairs.
fn runs(out: &mut Vec<u8>, ids: &[u64]) {
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut len = 1usize;
        while i + len < ids.len() && start.checked_add(len as u64) == Some(ids[i + len]) {
            len += 1;
        }
        uint(out, start);
        uint(out, len as u64);
        i += len;
    }
}

fn params(out: &mut Vec<u8>, p: &Params) {
    let n = usize::from(p.max_tokens.is_some())
        + usize::from(p.min_tokens.is_some())
        + usize::from(p.temperature.is_some())
        + usize::from(p.ignore_eos.is_some())
        + usize::from(p.n.is_some())
        + usize::from(p.stream.is_some())
        + usize::from(p.include_usage.is_some());
    head(out, MAJOR_MAP, n as u64);
    if let Some(v) = p.max_tokens {
        key(out, b"mt");
        uint(out, v.into());
    }
    if let Some(v) = p.min_tokens {
        key(out, b"mn");
        uint(out, v.into());
    }
    if let Some(v) = p.temperature {
        key(out, b"te");
        float(out, v.into());
    }
    if let Some(v) = p.ignore_eos {
        key(out, b"ie");
        boolean(out, v);
    }
    if let Some(v) = p.n {
        key(out, b"n");
        uint(out, v.into());
    }
    if let Some(v) = p.stream {
        key(out, b"st");
        boolean(out, v);
    }
    if let Some(v) = p.include_usage {
        key(out, b"iu");
        boolean(out, v);
    }
}

fn session(out: &mut Vec<u8>, s: &Session) {
    head(out, MAJOR_MAP, 2 + u64::from(s.think_us.is_some()));
    key(out, b"id");
    text(out, &s.id);
    key(out, b"turn");
    uint(out, s.turn.into());
    if let Some(t) = s.think_us {
        key(out, b"think_us");
        uint(out, t);
    }
}

fn metrics(out: &mut Vec<u8>, m: &ServerMetrics) {
    let fields: [(&[u8], Option<f64>); 5] = [
        (b"time_to_first_token_ms", m.time_to_first_token_ms),
        (b"queue_time_ms", m.queue_time_ms),
        (b"generation_time_ms", m.generation_time_ms),
        (b"mean_itl_ms", m.mean_itl_ms),
        (b"tokens_per_second", m.tokens_per_second),
    ];
    let n = fields.iter().filter(|(_, v)| v.is_some()).count();
    head(out, MAJOR_MAP, n as u64);
    for (k, v) in fields {
        if let Some(v) = v {
            key(out, k);
            float(out, v);
        }
    }
}

fn response(out: &mut Vec<u8>, r: &Response) {
    let all_one = r.events.iter().all(|e| e.tokens == 1);
    let n = 1
        + usize::from(r.error.is_some())
        + usize::from(r.headers_us.is_some())
        + usize::from(r.ttft_us.is_some())
        + usize::from(!r.events.is_empty())
        + usize::from(!r.events.is_empty() && !all_one)
        + usize::from(r.end_us.is_some())
        + usize::from(r.usage.is_some())
        + usize::from(r.server_metrics.is_some())
        + usize::from(r.cancelled)
        + usize::from(r.body.is_some());
    head(out, MAJOR_MAP, n as u64);
    key(out, b"st");
    uint(out, r.status.into());
    if let Some(e) = &r.error {
        key(out, b"er");
        text(out, e);
    }
    if let Some(v) = r.headers_us {
        key(out, b"hd");
        uint(out, v);
    }
    if let Some(v) = r.ttft_us {
        key(out, b"tf");
        uint(out, v);
    }
    if !r.events.is_empty() {
        // Gaps between successive events, the first from arrival (never negative).
        key(out, b"eg");
        head(out, MAJOR_ARRAY, r.events.len() as u64);
        let mut prev = 0u64;
        for e in &r.events {
            uint(out, e.offset_us.saturating_sub(prev));
            prev = e.offset_us.max(prev);
        }
        if !all_one {
            key(out, b"et");
            head(out, MAJOR_ARRAY, r.events.len() as u64);
            for e in &r.events {
                uint(out, e.tokens.into());
            }
        }
    }
    if let Some(v) = r.end_us {
        key(out, b"en");
        uint(out, v);
    }
    if let Some(u) = r.usage {
        key(out, b"u");
        head(out, MAJOR_ARRAY, 2);
        uint(out, u.prompt_tokens);
        uint(out, u.completion_tokens);
    }
    if let Some(m) = &r.server_metrics {
        key(out, b"sm");
        metrics(out, m);
    }
    if r.cancelled {
        key(out, b"c");
        boolean(out, true);
    }
    if let Some(b) = &r.body {
        key(out, b"b");
        bytes(out, b);
    }
}

/// Appends `r` as one CBOR record map; `prev_arrival` is the previous record's arrival in the
/// same frame (0 for the first), as `native::RequestWire::from_request` takes it.
pub fn encode_request(r: &Request, prev_arrival: u64, out: &mut Vec<u8>) {
    let runs_n = run_count(&r.hash_ids);
    let params_set = !r.params.is_empty();
    let n = 1
        + usize::from(r.input_tokens != 0)
        + usize::from(r.output_tokens != 0)
        + usize::from(runs_n != 0)
        + usize::from(r.endpoint != Endpoint::Completions)
        + usize::from(r.method.is_some())
        + usize::from(r.model.is_some())
        + usize::from(params_set)
        + usize::from(r.session.is_some())
        + usize::from(r.body.is_some())
        + usize::from(r.response.is_some());
    head(out, MAJOR_MAP, n as u64);
    key(out, b"t");
    int(out, (r.arrival_us as i64).wrapping_sub(prev_arrival as i64));
    if r.input_tokens != 0 {
        key(out, b"i");
        uint(out, r.input_tokens);
    }
    if r.output_tokens != 0 {
        key(out, b"o");
        uint(out, r.output_tokens);
    }
    if runs_n != 0 {
        key(out, b"h");
        head(out, MAJOR_ARRAY, 2 * runs_n as u64);
        runs(out, &r.hash_ids);
    }
    if r.endpoint != Endpoint::Completions {
        key(out, b"e");
        text(out, r.endpoint.as_str());
    }
    if let Some(v) = &r.method {
        key(out, b"v");
        text(out, v);
    }
    if let Some(m) = &r.model {
        key(out, b"m");
        text(out, m);
    }
    if params_set {
        key(out, b"p");
        params(out, &r.params);
    }
    if let Some(s) = &r.session {
        key(out, b"s");
        session(out, s);
    }
    if let Some(b) = &r.body {
        key(out, b"b");
        bytes(out, b);
    }
    if let Some(resp) = &r.response {
        key(out, b"r");
        response(out, resp);
    }
}
