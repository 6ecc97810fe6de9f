//! The OpenAI-compatible request and stream-chunk shapes retrace reads (as vLLM serves them).
//!
//! [`parse_request`] pulls from a request body what recording and simulation need (model, prompt as
//! token ids or text, chat messages, the sampling parameters that matter for replay);
//! [`parse_chunk`] pulls from one streamed SSE payload (or a non-streamed body) what measurement
//! needs (whether `choices` is non-empty, tokens carried, `usage`, vLLM's per-request `metrics`);
//! [`parse_response_body`] the part of that a recording keeps of a non-streamed body.
//! Lenient by design: unknown fields are ignored; a wrong type for a field we use is an error
//! message naming the field. It does not tokenize, hash, or build requests.

use crate::trace::{Endpoint, Params, ServerMetrics, Usage};
use serde_json::Value;

/// A `/v1/completions` prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    TokenIds(Vec<u32>),
    /// A list of prompts (batched request).
    Batch(Vec<Prompt>),
}

/// What a request body says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestInfo {
    pub model: Option<String>,
    /// Completions prompt, when present.
    pub prompt: Option<Prompt>,
    /// Chat messages, as sent.
    pub messages: Option<Vec<Value>>,
    pub params: Params,
}

fn field_err(name: &str, want: &str) -> String {
    format!("field `{name}` must be {want}")
}

fn opt_u32(obj: &serde_json::Map<String, Value>, name: &str) -> Result<Option<u32>, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| field_err(name, "a non-negative integer")),
    }
}

fn opt_bool(obj: &serde_json::Map<String, Value>, name: &str) -> Result<Option<bool>, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| field_err(name, "a boolean")),
    }
}

fn parse_prompt(v: &Value) -> Result<Prompt, String> {
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) if items.is_empty() => Ok(Prompt::TokenIds(Vec::new())),
        Value::Array(items) if items[0].is_number() => items
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| field_err("prompt", "text, token ids, or a list of either"))
            })
            .collect::<Result<Vec<u32>, String>>()
            .map(Prompt::TokenIds),
        Value::Array(items) => items
            .iter()
            .map(|x| match x {
                Value::String(_) | Value::Array(_) => parse_prompt(x),
                _ => Err(field_err("prompt", "text, token ids, or a list of either")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Prompt::Batch),
        _ => Err(field_err("prompt", "text, token ids, or a list of either")),
    }
}

/// Parses a request body for `endpoint`.
pub fn parse_request(endpoint: &Endpoint, body: &[u8]) -> Result<RequestInfo, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    parse_request_value(endpoint, &v)
}

/// [`parse_request`] of a body already parsed as JSON.
pub fn parse_request_value(endpoint: &Endpoint, v: &Value) -> Result<RequestInfo, String> {
    let obj = v.as_object().ok_or("body is not a JSON object")?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(field_err("model", "a string")),
    };
    let mut info = RequestInfo {
        model,
        ..Default::default()
    };
    match endpoint {
        Endpoint::Chat => match obj.get("messages") {
            Some(Value::Array(m)) => info.messages = Some(m.clone()),
            Some(_) => return Err(field_err("messages", "a list")),
            None => return Err("field `messages` is missing".into()),
        },
        Endpoint::Completions => match obj.get("prompt") {
            Some(p) => info.prompt = Some(parse_prompt(p)?),
            None => return Err("field `prompt` is missing".into()),
        },
        // `input`: text or a list of messages (responses); text, token ids or a batch
        // (embeddings).
        Endpoint::Responses => match obj.get("input") {
            Some(Value::String(s)) => info.prompt = Some(Prompt::Text(s.clone())),
            Some(Value::Array(m)) => info.messages = Some(m.clone()),
            Some(_) => return Err(field_err("input", "text or a list of messages")),
            None => return Err("field `input` is missing".into()),
        },
        Endpoint::Embeddings => match obj.get("input") {
            Some(p) => info.prompt = Some(parse_prompt(p)?),
            None => return Err("field `input` is missing".into()),
        },
        Endpoint::Other(_) => {}
    }
    let p = &mut info.params;
    p.max_tokens = opt_u32(obj, "max_tokens")?
        .or(opt_u32(obj, "max_completion_tokens")?)
        .or(opt_u32(obj, "max_output_tokens")?);
    p.min_tokens = opt_u32(obj, "min_tokens")?;
    p.n = opt_u32(obj, "n")?;
    p.ignore_eos = opt_bool(obj, "ignore_eos")?;
    p.stream = opt_bool(obj, "stream")?;
    p.temperature = match obj.get("temperature") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .ok_or_else(|| field_err("temperature", "a number"))? as f32,
        ),
    };
    if let Some(so) = obj.get("stream_options") {
        match so {
            Value::Object(o) => p.include_usage = opt_bool(o, "include_usage")?,
            Value::Null => {}
            _ => return Err(field_err("stream_options", "an object")),
        }
    }
    Ok(info)
}

/// A `/v1/completions` body with token-id prompts, as [`parse_request`] reads it, plus the two
/// fields the mock checks besides.
#[derive(Debug, Clone, PartialEq)]
pub struct FastCompletion {
    pub info: RequestInfo,
    /// `stream_options` is present and not null.
    pub stream_options_set: bool,
    /// `return_token_ids` (absent or null: false).
    pub return_token_ids: bool,
}

/// The common `/v1/completions` request (a token-id prompt, fields of the expected types) read
/// in one pass without a JSON value tree or serde's per-element machinery (a 100-token prompt
/// as a `Value` costs about as much as the rest of the mock's request handling). `None` for
/// anything else (a text or batched prompt, a wrong type, an escaped string, a duplicate key,
/// malformed JSON): use [`parse_request`], which decides and words the error. Agrees with
/// [`parse_request`] where it answers (tested).
pub fn parse_completion_fast(body: &[u8]) -> Option<FastCompletion> {
    if !body.is_ascii() {
        std::str::from_utf8(body).ok()?;
    }
    let mut s = Scan { b: body, i: 0 };
    let mut info = RequestInfo::default();
    let (mut max_tokens, mut max_completion_tokens) = (None, None);
    let (mut stream_options_set, mut return_token_ids) = (false, false);
    let mut seen = 0u32;
    fn opt_u32(s: &mut Scan<'_>) -> Option<Option<u32>> {
        if s.peek()? == b'n' {
            return s.literal(b"null").map(|_| None);
        }
        let v = s.number()??;
        Some(Some(u32::try_from(v).ok()?))
    }
    fn opt_bool(s: &mut Scan<'_>) -> Option<Option<bool>> {
        match s.peek()? {
            b'n' => s.literal(b"null").map(|_| None),
            b't' => s.literal(b"true").map(|_| Some(true)),
            b'f' => s.literal(b"false").map(|_| Some(false)),
            _ => None,
        }
    }
    s.object(|s, key| {
        let bit = match key {
            b"model" => 1,
            b"prompt" => 2,
            b"max_tokens" => 4,
            b"max_completion_tokens" => 8,
            b"min_tokens" => 16,
            b"n" => 32,
            b"ignore_eos" => 64,
            b"stream" => 128,
            b"temperature" => 256,
            b"stream_options" => 512,
            b"return_token_ids" => 1024,
            _ => return s.skip(1),
        };
        once(&mut seen, bit)?;
        match key {
            b"model" => {
                info.model = if s.peek()? == b'n' {
                    s.literal(b"null")?;
                    None
                } else {
                    let v = s.string()?;
                    if v.escaped {
                        return None;
                    }
                    Some(std::str::from_utf8(v.raw).ok()?.to_string())
                };
            }
            b"prompt" => {
                let mut ids = Vec::new();
                s.array(|s| {
                    ids.push(u32::try_from(s.number()??).ok()?);
                    Some(())
                })?;
                info.prompt = Some(Prompt::TokenIds(ids));
            }
            b"max_tokens" => max_tokens = opt_u32(s)?,
            b"max_completion_tokens" => max_completion_tokens = opt_u32(s)?,
            b"min_tokens" => info.params.min_tokens = opt_u32(s)?,
            b"n" => info.params.n = opt_u32(s)?,
            b"ignore_eos" => info.params.ignore_eos = opt_bool(s)?,
            b"stream" => info.params.stream = opt_bool(s)?,
            b"return_token_ids" => return_token_ids = opt_bool(s)?.unwrap_or(false),
            b"temperature" => {
                info.params.temperature = if s.peek()? == b'n' {
                    s.literal(b"null")?;
                    None
                } else {
                    s.ws();
                    let start = s.i;
                    s.number()?;
                    let text = std::str::from_utf8(&s.b[start..s.i]).ok()?;
                    Some(text.parse::<f64>().ok()? as f32)
                };
            }
            _ => {
                // stream_options
                match s.peek()? {
                    b'n' => s.literal(b"null")?,
                    b'{' => {
                        stream_options_set = true;
                        let mut oseen = 0u32;
                        s.object(|s, k| {
                            if k == b"include_usage" {
                                once(&mut oseen, 1)?;
                                info.params.include_usage = opt_bool(s)?;
                                Some(())
                            } else {
                                s.skip(2)
                            }
                        })?;
                    }
                    _ => return None,
                }
            }
        }
        Some(())
    })?;
    s.ws();
    if s.i != body.len() || info.prompt.is_none() {
        return None;
    }
    info.params.max_tokens = max_tokens.or(max_completion_tokens);
    Some(FastCompletion {
        info,
        stream_options_set,
        return_token_ids,
    })
}

/// What one streamed chunk (or a whole non-streamed body) says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// `choices` is present and non-empty (vLLM's TTFT/ITL rule looks at exactly this).
    pub has_choices: bool,
    /// Tokens carried: the length of `token_ids` when the server sent them, else 1 per choice
    /// with non-empty text/content (0 for a role-only or usage-only chunk).
    pub tokens: u32,
    /// The first choice's `finish_reason`, if set.
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub metrics: Option<ServerMetrics>,
    /// The chunk is an error object (`{"error": ...}` or `{"object": "error"}`).
    pub error: Option<String>,
}

/// Parses one SSE `data:` payload (not `[DONE]`) or a non-streamed response body.
///
/// Ordinary chunks go through `scan_chunk`, a single pass over the bytes that builds no JSON
/// values (vLLM's `metrics` object included); anything it is not sure about (an error, a `\u`
/// escape, a duplicate key it reads, malformed JSON) goes through the general `serde_json` path,
/// which decides. The two
/// agree on every chunk the scan answers (tests: real vLLM 0.32 streams and property tests over
/// reshaped chunks).
pub fn parse_chunk(data: &[u8]) -> Result<ChunkInfo, String> {
    if let Some(info) = scan_chunk(data) {
        return Ok(info);
    }
    parse_chunk_general(data)
}

/// The powers of ten that are exact `f64`s.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Nesting deeper than this is left to the general parser (serde_json's own limit is 128).
const SCAN_MAX_DEPTH: u32 = 64;

/// A forward-only JSON reader over a byte slice that validates what it skips.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

/// A string as [`scan_chunk`] needs it.
struct Str<'a> {
    /// The raw bytes between the quotes (escapes not decoded).
    raw: &'a [u8],
    escaped: bool,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte that is not whitespace (compact JSON, the usual case, tested first).
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        if c > b' ' {
            return Some(c);
        }
        self.ws();
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string (at its opening quote). Escapes other than `\uXXXX` are accepted (not decoded);
    /// `\u` and raw control characters end the scan (the general parser decides).
    #[inline(always)]
    fn string(&mut self) -> Option<Str<'a>> {
        self.eat(b'"')?;
        let start = self.i;
        // The common case, a string without escapes, inline; the rest out of line.
        let end = crate::bytescan::find_json_special(self.b, start);
        if self.b.get(end) == Some(&b'"') {
            self.i = end + 1;
            return Some(Str {
                raw: &self.b[start..end],
                escaped: false,
            });
        }
        self.i = end;
        self.string_rest(start)
    }

    /// The rest of a string from the first escape or control character (at `self.i`).
    #[inline(never)]
    fn string_rest(&mut self, start: usize) -> Option<Str<'a>> {
        let mut escaped = false;
        loop {
            self.i = crate::bytescan::find_json_special(self.b, self.i);
            match *self.b.get(self.i)? {
                b'"' => {
                    let raw = &self.b[start..self.i];
                    self.i += 1;
                    return Some(Str { raw, escaped });
                }
                b'\\' => {
                    match self.b.get(self.i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        _ => return None,
                    }
                    escaped = true;
                    self.i += 2;
                }
                _ => return None, // a control character
            }
        }
    }

    /// A JSON number; `Some(Some(n))` when it is a non-negative integer that fits a u64.
    #[inline(always)]
    fn number(&mut self) -> Option<Option<u64>> {
        // Inline: a non-negative integer of at most 19 digits (no overflow), without leading
        // zero, fraction or exponent; anything else (or whitespace first) the full reader.
        let (b, start) = (self.b, self.i);
        let mut i = start;
        let mut acc = 0u64;
        while let Some(&c @ b'0'..=b'9') = b.get(i) {
            if i - start == 19 {
                return self.number_value(false).map(Result::ok);
            }
            acc = acc * 10 + u64::from(c - b'0');
            i += 1;
        }
        let plain = i > start
            && (i == start + 1 || b[start] != b'0')
            && !matches!(b.get(i), Some(b'.' | b'e' | b'E'));
        if plain {
            self.i = i;
            return Some(Some(acc));
        }
        self.number_value(false).map(Result::ok)
    }

    /// A JSON number as serde_json reads it into an `f64`: an integer that fits a u64 converted
    /// (`as f64`, as serde's f64 visitor does), anything else the correctly rounded value of its
    /// text (serde_json's `float_roundtrip` parse is correctly rounded, as `str::parse` is; tested
    /// bit for bit).
    fn float(&mut self) -> Option<f64> {
        self.number_value(true)
            .map(|r| r.map_or_else(|f| f, |v| v as f64))
    }

    /// A JSON number: `Ok(n)` for a non-negative integer that fits a u64, else `Err(value)`;
    /// `None` for what serde_json refuses (bad grammar, or a value that overflows an f64). With
    /// `value` false the caller only wants to know it is valid and `Err(0.0)` stands for any
    /// non-integer (its finiteness is then often settled from its digit counts alone).
    fn number_value(&mut self, value: bool) -> Option<Result<u64, f64>> {
        self.ws();
        let (b, start) = (self.b, self.i);
        let neg = b.get(self.i) == Some(&b'-');
        if neg {
            self.i += 1;
        }
        // Integer and fraction digits as one mantissa (exact for 19 digits or fewer).
        let mut m = 0u64;
        let mut digits = |s: &mut Scan<'_>| {
            let d = s.i;
            while let Some(&c @ b'0'..=b'9') = s.b.get(s.i) {
                m = m.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
                s.i += 1;
            }
            s.i - d
        };
        let int_start = self.i;
        let int_digits = digits(self);
        if int_digits == 0 || (b[int_start] == b'0' && int_digits > 1) {
            return None; // no digit, or a leading zero
        }
        let int_end = self.i;
        let mut frac_digits = 0;
        if b.get(self.i) == Some(&b'.') {
            self.i += 1;
            frac_digits = digits(self);
            if frac_digits == 0 {
                return None;
            }
        }
        // The exponent, saturated (its size only matters up to where the value is 0 or ∞).
        let (mut exp, mut has_exp) = (0i64, false);
        if let Some(b'e' | b'E') = b.get(self.i) {
            self.i += 1;
            has_exp = true;
            let eneg = b.get(self.i) == Some(&b'-');
            if let Some(b'+' | b'-') = b.get(self.i) {
                self.i += 1;
            }
            let e0 = self.i;
            while let Some(&c @ b'0'..=b'9') = b.get(self.i) {
                exp = (exp * 10 + i64::from(c - b'0')).min(1 << 30);
                self.i += 1;
            }
            if self.i == e0 {
                return None;
            }
            if eneg {
                exp = -exp;
            }
        }
        if !neg && frac_digits == 0 && !has_exp {
            if int_digits <= 19 {
                return Some(Ok(m));
            }
            let wide = b[int_start..int_end].iter().try_fold(0u64, |v, &c| {
                v.checked_mul(10)?.checked_add(u64::from(c - b'0'))
            });
            if let Some(v) = wide {
                return Some(Ok(v));
            }
        }
        // Not a u64: an f64. Clinger's fast path when the mantissa and the power of ten are
        // both exact f64s (one correctly rounded operation, so the correctly rounded value).
        let e10 = exp - frac_digits as i64;
        if int_digits + frac_digits <= 19 && m <= 1 << 53 && (-22..=22).contains(&e10) {
            let p = POW10[e10.unsigned_abs() as usize];
            let f = if e10 < 0 { m as f64 / p } else { m as f64 * p };
            return Some(Err(if neg { -f } else { f }));
        }
        // Below 10^(integer digits + exponent) in magnitude: finite when that is at most 300.
        if !value && int_digits as i64 + exp <= 300 {
            return Some(Err(0.0));
        }
        // serde_json refuses a number that overflows an f64 (1e400, 400 digits).
        let text = std::str::from_utf8(&b[start..self.i]).ok()?;
        let f = text.parse::<f64>().ok()?;
        f.is_finite().then_some(Err(f))
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        if self.b.get(self.i..self.i + word.len())? == word {
            self.i += word.len();
            Some(())
        } else {
            None
        }
    }

    /// Skips any value at nesting `depth`, validating it: the grammar as [`Scan::object`] and
    /// [`Scan::array`] read it (an escaped key ends the scan there too), iteratively, one bit per
    /// open container (object or array) instead of a call per nested value.
    fn skip(&mut self, depth: u32) -> Option<()> {
        if depth > SCAN_MAX_DEPTH {
            return None;
        }
        // Bit k of `objects`: the k-th innermost open container is an object.
        let (mut objects, mut open) = (0u64, 0u32);
        loop {
            // A value.
            match self.peek()? {
                b'"' => {
                    self.string()?;
                }
                c @ (b'{' | b'[') => {
                    self.i += 1;
                    let close = if c == b'{' { b'}' } else { b']' };
                    if self.peek()? == close {
                        self.i += 1;
                    } else {
                        // Its values are one level deeper.
                        open += 1;
                        if depth + open > SCAN_MAX_DEPTH {
                            return None;
                        }
                        objects = (objects << 1) | u64::from(c == b'{');
                        if c == b'{' {
                            self.key()?;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => {
                    self.number()?;
                }
                _ => return None,
            }
            // After a value: a comma (then the next value, or key and value) or closings.
            loop {
                if open == 0 {
                    return Some(());
                }
                let in_object = objects & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        if in_object {
                            self.key()?;
                        }
                        break;
                    }
                    b'}' if in_object => {}
                    b']' if !in_object => {}
                    _ => return None,
                }
                self.i += 1;
                objects >>= 1;
                open -= 1;
            }
        }
    }

    /// [`Scan::skip`] with the common scalars (a string, null, a short integer) read inline:
    /// the value of a key the caller does not read.
    #[inline(always)]
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'n' => self.literal(b"null"),
            b'0'..=b'9' => self.number().map(|_| ()),
            _ => self.skip(depth),
        }
    }

    /// An object key and its colon (a key with an escape ends the scan, as in [`Scan::object`]).
    #[inline(always)]
    fn key(&mut self) -> Option<()> {
        if self.string()?.escaped {
            return None;
        }
        self.eat(b':')
    }

    /// An object: `field(scan, key)` reads (or skips) the value of each key. A key with an
    /// escape ends the scan.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let k = self.string()?;
            if k.escaped {
                return None;
            }
            self.eat(b':')?;
            field(self, k.raw)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array: `item` reads each element; returns the number of elements.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<u32> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(0);
        }
        let mut n = 0u32;
        loop {
            item(self)?;
            n = n.checked_add(1)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(n);
                }
                _ => return None,
            }
        }
    }
}

/// Marks a key as seen; a second sighting ends the scan (serde_json keeps the last value).
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    Some(())
}

/// A text field: `Some(true)` for a non-empty string, `Some(false)` for any other value.
fn text_value(s: &mut Scan<'_>) -> Option<bool> {
    if s.peek()? == b'"' {
        return Some(!s.string()?.raw.is_empty());
    }
    s.skip(1)?;
    Some(false)
}

/// `delta` / `message`: presence and non-emptiness of `content` and `reasoning_content`
/// (`None` = absent); a value that is not an object has neither.
fn delta_value(s: &mut Scan<'_>) -> Option<(Option<bool>, Option<bool>)> {
    if s.peek()? != b'{' {
        s.skip(1)?;
        return Some((None, None));
    }
    let (mut content, mut reasoning, mut seen) = (None, None, 0u32);
    s.object(|s, k| match () {
        _ if k == b"content" => {
            once(&mut seen, 1)?;
            content = Some(text_value(s)?);
            Some(())
        }
        _ if k == b"reasoning_content" => {
            once(&mut seen, 2)?;
            reasoning = Some(text_value(s)?);
            Some(())
        }
        _ => s.skip_value(2),
    })?;
    Some((content, reasoning))
}

/// One element of `choices`: the tokens it carries and its `finish_reason` (an escaped one
/// ends the scan). Mirrors the general path: `token_ids` (an array) counts its length, else
/// the first present of `text`, `delta.content`, `delta.reasoning_content`, `message.content`
/// counts 1 when it is a non-empty string.
fn scan_choice(s: &mut Scan<'_>) -> Option<(u32, Option<String>)> {
    let (mut text, mut dc, mut dr, mut mc) = (None, None, None, None);
    let (mut ids, mut finish, mut seen) = (None, None, 0u32);
    s.object(|s, f| match () {
        _ if f == b"text" => {
            once(&mut seen, 1)?;
            text = Some(text_value(s)?);
            Some(())
        }
        _ if f == b"delta" => {
            once(&mut seen, 2)?;
            (dc, dr) = delta_value(s)?;
            Some(())
        }
        _ if f == b"message" => {
            once(&mut seen, 4)?;
            (mc, _) = delta_value(s)?;
            Some(())
        }
        _ if f == b"token_ids" => {
            once(&mut seen, 8)?;
            if s.peek()? == b'[' {
                ids = Some(s.array(|s| s.skip(3))?);
                Some(())
            } else {
                s.skip(2)
            }
        }
        _ if f == b"finish_reason" => {
            once(&mut seen, 16)?;
            if s.peek()? == b'"' {
                let v = s.string()?;
                if v.escaped {
                    return None;
                }
                finish = Some(std::str::from_utf8(v.raw).ok()?.to_string());
                Some(())
            } else {
                s.skip(2)
            }
        }
        _ => s.skip_value(2),
    })?;
    let tokens = match ids {
        Some(n) => n,
        None => u32::from(text.or(dc).or(dr).or(mc) == Some(true)),
    };
    Some((tokens, finish))
}

/// `object`: any value but the string `"error"` (an error chunk goes the general way, as does
/// an escaped name, which could spell it).
fn scan_object_name(s: &mut Scan<'_>) -> Option<()> {
    if s.peek()? == b'"' {
        let v = s.string()?;
        return (!v.escaped && v.raw != b"error").then_some(());
    }
    s.skip(1)
}

/// `usage` as the general path reads it: `None` (inner) for null; for an object, `prompt_tokens`
/// and `completion_tokens` when they are integers that fit a u64, else 0. Any other value ends
/// the scan (the general path reads it as zero usage; rare enough to leave to it).
fn scan_usage(s: &mut Scan<'_>) -> Option<Option<Usage>> {
    match s.peek()? {
        b'n' => s.literal(b"null").map(|_| None),
        b'{' => {
            let mut u = Usage::default();
            let mut useen = 0u32;
            s.object(|s, k| {
                // (`==` on slices compares words; a `match` on byte strings, byte by byte.)
                let slot = if k == b"prompt_tokens" {
                    once(&mut useen, 1)?;
                    &mut u.prompt_tokens
                } else if k == b"completion_tokens" {
                    once(&mut useen, 2)?;
                    &mut u.completion_tokens
                } else {
                    return s.skip_value(2);
                };
                *slot = match s.peek()? {
                    b'-' | b'0'..=b'9' => s.number()?.unwrap_or(0),
                    _ => {
                        s.skip(2)?;
                        0
                    }
                };
                Some(())
            })?;
            Some(Some(u))
        }
        _ => None,
    }
}

/// vLLM's `metrics` as the general path reads it (`serde_json::from_value::<ServerMetrics>`, and
/// `None` when that fails): a value that is not an object is no metrics; in an object, each known
/// field is a number (`Some`), null or absent (`None`); any other value of a known field fails the
/// whole object (no metrics). Unknown fields are skipped; a known field twice ends the scan.
fn scan_metrics(s: &mut Scan<'_>) -> Option<Option<ServerMetrics>> {
    if s.peek()? != b'{' {
        s.skip(1)?;
        return Some(None);
    }
    let mut m = ServerMetrics::default();
    let (mut typed, mut seen) = (true, 0u32);
    s.object(|s, k| {
        let slot = match () {
            _ if k == b"time_to_first_token_ms" => {
                once(&mut seen, 1)?;
                &mut m.time_to_first_token_ms
            }
            _ if k == b"queue_time_ms" => {
                once(&mut seen, 2)?;
                &mut m.queue_time_ms
            }
            _ if k == b"generation_time_ms" => {
                once(&mut seen, 4)?;
                &mut m.generation_time_ms
            }
            _ if k == b"mean_itl_ms" => {
                once(&mut seen, 8)?;
                &mut m.mean_itl_ms
            }
            _ if k == b"tokens_per_second" => {
                once(&mut seen, 16)?;
                &mut m.tokens_per_second
            }
            _ => return s.skip_value(2),
        };
        *slot = match s.peek()? {
            b'-' | b'0'..=b'9' => Some(s.float()?),
            b'n' => s.literal(b"null").map(|_| None)?,
            _ => {
                s.skip(2)?;
                typed = false;
                None
            }
        };
        Some(())
    })?;
    Some(typed.then_some(m))
}

/// The fast path of [`parse_chunk`]: `None` when the general parser must decide.
fn scan_chunk(data: &[u8]) -> Option<ChunkInfo> {
    scan_fields(data, true)
}

/// The one-pass scan of a chunk or body; `read_choices: false` only validates `choices` (what a
/// non-streamed body's record keeps does not come from it), leaving the choice fields default.
fn scan_fields(data: &[u8], read_choices: bool) -> Option<ChunkInfo> {
    // serde_json refuses invalid UTF-8 anywhere, so the scan does too (ASCII checked quickly).
    if !data.is_ascii() {
        std::str::from_utf8(data).ok()?;
    }
    let mut s = Scan { b: data, i: 0 };
    let mut info = ChunkInfo::default();
    let mut seen = 0u32;
    s.object(|s, key| match () {
        _ if key == b"error" => None,
        _ if key == b"object" => {
            once(&mut seen, 1)?;
            scan_object_name(s)
        }
        _ if key == b"usage" => {
            once(&mut seen, 2)?;
            info.usage = scan_usage(s)?;
            Some(())
        }
        _ if key == b"metrics" => {
            once(&mut seen, 8)?;
            info.metrics = scan_metrics(s)?;
            Some(())
        }
        _ if key == b"choices" => {
            once(&mut seen, 4)?;
            if !read_choices || s.peek()? != b'[' {
                return s.skip_value(1);
            }
            let mut first = true;
            let n = s.array(|s| {
                let (tokens, finish) = scan_choice(s)?;
                if first {
                    info.finish_reason = finish;
                    first = false;
                }
                info.tokens = info.tokens.checked_add(tokens)?;
                Some(())
            })?;
            info.has_choices = n > 0;
            Some(())
        }
        _ => s.skip_value(1),
    })?;
    s.ws();
    (s.i == data.len()).then_some(info)
}

/// What a non-streamed response body says that a recording keeps: [`ChunkInfo`] without what
/// only a streamed event needs (whether it has choices, tokens, finish reason).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyInfo {
    pub usage: Option<Usage>,
    pub metrics: Option<ServerMetrics>,
    /// The body is an error object (as [`ChunkInfo::error`]).
    pub error: Option<String>,
}

impl From<ChunkInfo> for BodyInfo {
    fn from(c: ChunkInfo) -> Self {
        BodyInfo {
            usage: c.usage,
            metrics: c.metrics,
            error: c.error,
        }
    }
}

/// [`parse_chunk`] of a whole non-streamed response body, keeping only [`BodyInfo`]: always
/// `parse_chunk(data).map(BodyInfo::from)` (tested), cheaper. The scan validates `choices` as
/// any JSON value without reading it (no finish-reason string, no token count) and falls back
/// to the general path whenever `scan_chunk` would.
pub fn parse_response_body(data: &[u8]) -> Result<BodyInfo, String> {
    if let Some(info) = scan_body(data) {
        return Ok(info);
    }
    parse_chunk_general(data).map(BodyInfo::from)
}

/// The fast path of [`parse_response_body`]: [`scan_chunk`] with `choices` only validated.
fn scan_body(data: &[u8]) -> Option<BodyInfo> {
    scan_fields(data, false).map(BodyInfo::from)
}

fn parse_chunk_general(data: &[u8]) -> Result<ChunkInfo, String> {
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("chunk is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("chunk is not a JSON object")?;
    let mut info = ChunkInfo::default();
    if let Some(e) = obj.get("error") {
        info.error = Some(
            e.get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string()),
        );
    } else if obj.get("object").and_then(Value::as_str) == Some("error") {
        info.error = Some(
            obj.get("message")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_string(),
        );
    }
    if let Some(Value::Array(choices)) = obj.get("choices") {
        info.has_choices = !choices.is_empty();
        for (k, c) in choices.iter().enumerate() {
            if k == 0 {
                info.finish_reason = c
                    .get("finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            if let Some(Value::Array(ids)) = c.get("token_ids") {
                info.tokens += ids.len() as u32;
                continue;
            }
            let text = c
                .get("text")
                .or_else(|| c.get("delta").and_then(|d| d.get("content")))
                .or_else(|| c.get("delta").and_then(|d| d.get("reasoning_content")))
                .or_else(|| c.get("message").and_then(|d| d.get("content")));
            if text.and_then(Value::as_str).is_some_and(|t| !t.is_empty()) {
                info.tokens += 1;
            }
        }
    }
    if let Some(u) = obj.get("usage").filter(|u| !u.is_null()) {
        let g = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        info.usage = Some(Usage {
            prompt_tokens: g("prompt_tokens"),
            completion_tokens: g("completion_tokens"),
        });
    }
    if let Some(m) = obj.get("metrics").filter(|m| m.is_object()) {
        info.metrics = serde_json::from_value(m.clone()).ok();
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseParser;

    fn events(raw: &[u8]) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.feed(raw, |e| out.push(e.unwrap().data));
        out
    }

    #[test]
    fn parses_requests() {
        let r = parse_request(
            &Endpoint::Completions,
            br#"{"model":"m","prompt":[1,2,3],"max_tokens":5,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"temperature":0}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, Some(Prompt::TokenIds(vec![1, 2, 3])));
        assert_eq!(r.params.max_tokens, Some(5));
        assert_eq!(r.params.include_usage, Some(true));
        assert_eq!(r.params.temperature, Some(0.0));
        let r = parse_request(&Endpoint::Completions, br#"{"prompt":["a",[1]]}"#).unwrap();
        assert_eq!(
            r.prompt,
            Some(Prompt::Batch(vec![
                Prompt::Text("a".into()),
                Prompt::TokenIds(vec![1])
            ]))
        );
        let e = parse_request(
            &Endpoint::Completions,
            br#"{"prompt":"x","max_tokens":"5"}"#,
        )
        .unwrap_err();
        assert!(e.contains("max_tokens"), "{e}");
        assert!(parse_request(&Endpoint::Chat, br#"{"prompt":"x"}"#).is_err());
        assert!(parse_request(&Endpoint::Chat, b"not json").is_err());
    }

    /// The typed request path agrees with the general one wherever it answers, and answers the
    /// bodies replay sends.
    #[test]
    fn fast_completion_parse_agrees_with_parse_request() {
        let bodies: &[&str] = &[
            r#"{"model":"m","prompt":[1,2,3],"max_tokens":5,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"temperature":0}"#,
            r#"{"prompt":[],"max_completion_tokens":7,"n":2,"min_tokens":1,"temperature":0.5}"#,
            r#"{"prompt":[4],"max_tokens":null,"max_completion_tokens":3,"stream_options":null,"return_token_ids":true,"extra":{"a":[1]}}"#,
            r#"{"prompt":[4],"stream_options":{},"return_token_ids":null,"messages":[{"role":"user"}]}"#,
            r#"{"prompt":"text"}"#,
            r#"{"prompt":[1,"a"]}"#,
            r#"{"prompt":[4294967296]}"#,
            r#"{"prompt":[1],"max_tokens":"5"}"#,
            r#"{"prompt":[1],"max_tokens":5.0}"#,
            r#"{"prompt":[1],"max_tokens":-1}"#,
            r#"{"prompt":[1],"stream_options":5}"#,
            r#"{"prompt":[1],"return_token_ids":1}"#,
            r#"{"prompt":[1],"prompt":[2]}"#,
            r#"{"model":null,"prompt":[[1],[2]]}"#,
            r#"{"max_tokens":5}"#,
            r#"[1]"#,
            r#"{"prompt":[1]"#,
            r#" { "prompt" : [ 1 , 2 ] , "temperature" : 1 , "stream_options" : { "x" : [ ] } } "#,
            r#"{"model":"m\"x","prompt":[1]}"#,
            r#"{"prompt":[01]}"#,
            r#"{"prompt":[1],"temperature":1e400}"#,
            r#"{"prompt":[1],"stream":"yes"}"#,
            r#"{"prompt":[1],"stream_options":{"include_usage":true,"include_usage":false}}"#,
        ];
        let mut answered = 0;
        for b in bodies {
            let general = parse_request(&Endpoint::Completions, b.as_bytes());
            if let Some(f) = parse_completion_fast(b.as_bytes()) {
                answered += 1;
                assert_eq!(Ok(f.info.clone()), general, "{b}");
                let v: Value = serde_json::from_str(b).unwrap();
                assert_eq!(
                    f.stream_options_set,
                    v.get("stream_options").is_some_and(|x| !x.is_null()),
                    "{b}"
                );
                assert_eq!(
                    f.return_token_ids,
                    v["return_token_ids"] == Value::Bool(true)
                );
            }
        }
        assert_eq!(answered, 5);
    }

    #[test]
    fn real_vllm_completion_stream() {
        let evs = events(include_bytes!(
            "../fixtures/vllm/completions_tokenids_stream.sse"
        ));
        let infos: Vec<ChunkInfo> = evs[..evs.len() - 1]
            .iter()
            .map(|d| parse_chunk(d.as_bytes()).unwrap())
            .collect();
        assert_eq!(infos.iter().filter(|c| c.has_choices).count(), 4);
        assert_eq!(infos[3].finish_reason.as_deref(), Some("length"));
        assert_eq!(
            infos[4].usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 4
            })
        );
        assert!(!infos[4].has_choices);
    }

    #[test]
    fn real_vllm_chat_stream_role_chunk_has_no_tokens() {
        let evs = events(include_bytes!("../fixtures/vllm/chat_stream.sse"));
        let first = parse_chunk(evs[0].as_bytes()).unwrap();
        assert!(first.has_choices);
        assert_eq!(first.tokens, 0);
        assert_eq!(parse_chunk(evs[1].as_bytes()).unwrap().tokens, 1);
    }

    #[test]
    fn token_ids_count_tokens() {
        let evs = events(include_bytes!(
            "../fixtures/vllm/return_token_ids_stream.sse"
        ));
        assert_eq!(parse_chunk(evs[0].as_bytes()).unwrap().tokens, 1);
    }

    /// Every data payload of the real vLLM 0.32 streams (fixtures/vllm, copies of
    /// /work/shared/vllm-samples), the usage+metrics chunk included.
    fn real_chunks() -> Vec<String> {
        let mut out = Vec::new();
        for raw in [
            &include_bytes!("../fixtures/vllm/completions_tokenids_stream.sse")[..],
            include_bytes!("../fixtures/vllm/chat_stream.sse"),
            include_bytes!("../fixtures/vllm/completions_text_stream.sse"),
            include_bytes!("../fixtures/vllm/return_token_ids_stream.sse"),
        ] {
            out.extend(events(raw).into_iter().filter(|d| d != "[DONE]"));
        }
        let txt = include_str!("../fixtures/vllm/per_request_metrics_example.txt");
        out.extend(
            txt.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(str::to_string),
        );
        out.extend(
            txt.lines()
                .filter(|l| l.starts_with('{'))
                .map(str::to_string),
        );
        out
    }

    /// The scan answers every ordinary real chunk, and exactly as the general path does.
    #[test]
    fn scan_agrees_with_general_path_on_real_vllm_chunks() {
        let chunks = real_chunks();
        assert!(chunks.len() > 20, "{}", chunks.len());
        let mut with_metrics = 0;
        for d in &chunks {
            let general = parse_chunk_general(d.as_bytes()).unwrap();
            // Every real chunk and body is answered by the scan, vLLM's `metrics` included.
            let fast = scan_chunk(d.as_bytes()).unwrap_or_else(|| panic!("not scanned: {d}"));
            assert_eq!(fast, general, "{d}");
            with_metrics += usize::from(general.metrics.is_some());
            assert_eq!(parse_chunk(d.as_bytes()).unwrap(), general);
            // The body reader too, as the projection of the general path.
            let body = scan_body(d.as_bytes()).unwrap_or_else(|| panic!("not scanned: {d}"));
            assert_eq!(body, BodyInfo::from(general.clone()), "{d}");
            assert_eq!(parse_response_body(d.as_bytes()), Ok(general.into()));
        }
        assert!(with_metrics >= 2, "{with_metrics}");
        assert!(scan_chunk(br#"{"choices":[{"text":"a"}]}"#).is_some());
        assert!(scan_chunk(br#"{"error":{"message":"x"}}"#).is_none());
        assert!(scan_chunk(br#"{"object":"error","message":"x"}"#).is_none());
        assert!(scan_body(br#"{"error":{"message":"x"}}"#).is_none());
        assert!(scan_body(br#"{"object":"error","message":"x"}"#).is_none());
        assert_eq!(
            scan_chunk(
                br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2},"metrics":{}}"#
            )
            .unwrap()
            .metrics,
            Some(ServerMetrics::default())
        );
    }

    /// vLLM's `metrics` object: where the scan answers, it says what `serde_json::from_value`
    /// says (wrong types, nulls, integers, duplicates, odd numbers).
    #[test]
    fn metrics_scan_edge_cases() {
        let cases: &[&str] = &[
            r#"{"metrics":{"queue_time_ms":1.5,"mean_itl_ms":2}}"#,
            r#"{"metrics":{"queue_time_ms":null,"tokens_per_second":-0}}"#,
            r#"{"metrics":{"queue_time_ms":"1.5"}}"#,
            r#"{"metrics":{"queue_time_ms":true,"mean_itl_ms":2}}"#,
            r#"{"metrics":{"queue_time_ms":[1],"x":{"y":[]}}}"#,
            r#"{"metrics":{"queue_time_ms":{}}}"#,
            r#"{"metrics":{"queue_time_ms":1,"queue_time_ms":2}}"#,
            r#"{"metrics":{"other":1,"other":{"a":"b"}}}"#,
            r#"{"metrics":null,"choices":[]}"#,
            r#"{"metrics":[1,2],"choices":[]}"#,
            r#"{"metrics":"x"}"#,
            r#"{"metrics":7}"#,
            r#"{"metrics":{},"metrics":{}}"#,
            r#"{"metrics":{"generation_time_ms":1e400}}"#,
            r#"{"metrics":{"generation_time_ms":1e-400}}"#,
            r#"{"metrics":{"generation_time_ms":-1e-400}}"#,
            r#"{"metrics":{"generation_time_ms":0e999999999}}"#,
            r#"{"metrics":{"generation_time_ms":18446744073709551616}}"#,
            r#"{"metrics":{"generation_time_ms":18446744073709551615}}"#,
            r#"{"metrics":{"generation_time_ms":-9223372036854775809}}"#,
            r#"{"metrics":{"generation_time_ms":9007199254740993}}"#,
            r#"{"metrics":{"generation_time_ms":2.2250738585072011e-308}}"#,
            r#"{"metrics":{"generation_time_ms":4.9e-324,"mean_itl_ms":1.7976931348623157e308}}"#,
            r#"{"metrics":{"generation_time_ms":0.1000000000000000055511151231257827021181583404541015625}}"#,
            r#"{"metrics":{"generation_time_ms":01}}"#,
            r#"{"metrics":{"generation_time_ms":1.}}"#,
            r#"{"metrics":{"generation_time_ms":-}}"#,
            r#"{"metrics":{"generation_time_ms":nul}}"#,
            r#"{"metrics":{"generation_time_ms":1,}}"#,
            r#"{"metrics":{"gen\u0065ration_time_ms":1}}"#,
            r#"{"metrics":{"time_to_first_token_ms":8.378015000062078,"generation_time_ms":10.772924999969291,"queue_time_ms":0.039352999920083676,"mean_itl_ms":3.5909749999897635,"tokens_per_second":208.8670321140084,"speculative_decoding":null}}"#,
        ];
        let mut answered = 0;
        for c in cases {
            let general = parse_chunk_general(c.as_bytes());
            if let Some(fast) = scan_chunk(c.as_bytes()) {
                answered += 1;
                assert_eq!(Ok(fast.clone()), general, "{c}");
                // bit for bit, -0.0 and 0.0 included
                let bits = |m: &Option<ServerMetrics>| {
                    m.as_ref().map(|m| {
                        [
                            m.time_to_first_token_ms,
                            m.queue_time_ms,
                            m.generation_time_ms,
                            m.mean_itl_ms,
                            m.tokens_per_second,
                        ]
                        .map(|x| x.map(f64::to_bits))
                    })
                };
                assert_eq!(
                    bits(&fast.metrics),
                    bits(&general.as_ref().unwrap().metrics)
                );
            }
            if let Some(body) = scan_body(c.as_bytes()) {
                assert_eq!(Ok(body), general.clone().map(BodyInfo::from), "{c}");
            }
            assert_eq!(parse_chunk(c.as_bytes()), general, "{c}");
            assert_eq!(
                parse_response_body(c.as_bytes()),
                general.map(BodyInfo::from),
                "{c}"
            );
        }
        assert!(answered >= 20, "{answered}");
    }

    /// `Scan::float` reads any JSON number to the f64 serde_json gives (bit for bit), and
    /// refuses what serde_json refuses.
    #[test]
    fn float_scan_agrees_with_serde_json() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 4000,
            ..Default::default()
        });
        let text = prop_oneof![
            // around the exact fast path's edges: up to 19 digits, exponents around ±22
            (
                any::<bool>(),
                "[0-9]{1,10}",
                proptest::option::of("[0-9]{0,12}"),
                -30i32..30
            )
                .prop_map(|(neg, int, frac, e)| {
                    let int = int.trim_start_matches('0');
                    let int = if int.is_empty() { "0" } else { int };
                    let frac = frac.filter(|f| !f.is_empty()).map(|f| format!(".{f}"));
                    let sign = if neg { "-" } else { "" };
                    format!("{sign}{int}{}e{e}", frac.unwrap_or_default())
                }),
            (1u64 << 53..(1u64 << 53) + 3, -23i32..23).prop_map(|(m, e)| format!("{m}e{e}")),
            any::<f64>().prop_map(|x| format!("{x}")),
            any::<f64>().prop_map(|x| format!("{x:e}")),
            any::<f64>().prop_map(|x| format!("{x:.3}")),
            any::<u64>().prop_map(|x| format!("{x}")),
            any::<i64>().prop_map(|x| format!("{x}")),
            (
                any::<bool>(),
                "[0-9]{1,40}",
                proptest::option::of("[0-9]{1,40}"),
                proptest::option::of((
                    prop_oneof![Just("e"), Just("E-"), Just("e+")],
                    -400i32..400
                )),
            )
                .prop_map(|(neg, int, frac, exp)| {
                    let mut t = String::new();
                    if neg {
                        t.push('-');
                    }
                    t.push_str(&int);
                    if let Some(f) = frac {
                        t.push('.');
                        t.push_str(&f);
                    }
                    if let Some((e, x)) = exp {
                        t.push_str(&format!("{e}{x}"));
                    }
                    t
                }),
        ];
        runner
            .run(&text, |t| {
                let serde: Result<f64, _> = serde_json::from_str::<Value>(&t)
                    .map_err(|_| ())
                    .and_then(|v| serde_json::from_value::<f64>(v).map_err(|_| ()));
                let mut s = Scan {
                    b: t.as_bytes(),
                    i: 0,
                };
                let fast = s.float().filter(|_| s.i == t.len());
                match serde {
                    Ok(x) => prop_assert_eq!(fast.map(f64::to_bits), Some(x.to_bits()), "{}", t),
                    Err(()) => prop_assert!(fast.is_none(), "{}", t),
                }
                // validity alone (what a skipped number needs), and the integer reading
                let mut s = Scan {
                    b: t.as_bytes(),
                    i: 0,
                };
                let valid = s.number().filter(|_| s.i == t.len());
                prop_assert_eq!(valid.is_some(), serde.is_ok(), "{}", t);
                if let Some(Some(n)) = valid {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    prop_assert_eq!(v.as_u64(), Some(n), "{}", t);
                }
                Ok(())
            })
            .unwrap();
    }

    /// Hand-picked edge cases: where the scan answers, it answers as serde_json does; where
    /// serde_json refuses the input, the scan does not answer.
    #[test]
    fn scan_edge_cases() {
        let cases: &[&[u8]] = &[
            br#"{"choices":[{"text":""}]}"#,
            br#"{"choices":[{"text":null,"delta":{"content":"x"}}]}"#,
            br#"{"choices":[{"delta":{"content":null,"reasoning_content":"r"}}]}"#,
            br#"{"choices":[{"delta":{"reasoning_content":"r"}}]}"#,
            br#"{"choices":[{"delta":"x","message":{"content":"m"}}]}"#,
            br#"{"choices":[{"token_ids":[1,2,3],"text":""}]}"#,
            br#"{"choices":[{"token_ids":null,"text":"a\n\"b\""}]}"#,
            br#"{"choices":[{"text":"a","finish_reason":"st\nop"}]}"#,
            br#"{"choices":[{"text":"\u00e9"}]}"#,
            "{\"choices\":[{\"text\":\"é\"}],\"x\":[1.5e3,-2,0.25,true,false,null,{\"a\":[]}]}"
                .as_bytes(),
            br#"{"choices":[{"text":"a"},{"text":"b","finish_reason":"length"}],"usage":null}"#,
            br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1.0}}"#,
            br#"{"choices":[],"usage":{"prompt_tokens":-7,"completion_tokens":"3"}}"#,
            br#"{"choices":[],"usage":{"completion_tokens":99999999999999999999}}"#,
            br#"{"choices":[],"usage":{}}"#,
            br#"{"choices":[],"usage":5}"#,
            br#"{"choices":null}"#,
            br#"{"choices":{"text":"a"}}"#,
            br#"{"choices":[1]}"#,
            br#"{"choices":[{"text":"a"}],"choices":[]}"#,
            br#"{"choices":[{"text":"a","text":""}]}"#,
            br#"{"object":"text_completion","object":"error"}"#,
            b" \r\n\t{ \"choices\" : [ { \"text\" : \"a\" } ] } \n",
            br#"{"x":1e400,"choices":[]}"#,
            br#"{"x":01,"choices":[]}"#,
            br#"{"x":1.,"choices":[]}"#,
            br#"{"x":-,"choices":[]}"#,
            br#"{"x":"\q","choices":[]}"#,
            b"{\"x\":\"a\x01\",\"choices\":[]}",
            b"{\"choices\":[{\"text\":\"\xff\"}]}",
            br#"{"choices":[{"text":"a"}]} x"#,
            br#"{"choices":[{"text":"a"}],}"#,
            br#"{"choices":[{"text":"a"},]}"#,
            br#"{"choices":[{"text":"a"}]"#,
            br#"[{"choices":[]}]"#,
            br#"{"ch\"oices":[]}"#,
            br#"{"choices":[{"text":tru}]}"#,
            b"",
        ];
        for c in cases {
            let general = parse_chunk_general(c);
            if let Some(fast) = scan_chunk(c) {
                assert_eq!(Ok(fast), general, "{}", String::from_utf8_lossy(c));
            }
            if let Some(body) = scan_body(c) {
                let want = general.clone().map(BodyInfo::from);
                assert_eq!(Ok(body), want, "{}", String::from_utf8_lossy(c));
            }
            assert_eq!(parse_chunk(c), general, "{}", String::from_utf8_lossy(c));
            assert_eq!(
                parse_response_body(c),
                general.map(BodyInfo::from),
                "{}",
                String::from_utf8_lossy(c)
            );
        }
        // the ordinary shapes are answered by the scan
        for c in &cases[..7] {
            assert!(scan_chunk(c).is_some(), "{}", String::from_utf8_lossy(c));
        }
    }

    /// Real chunks reshaped (keys reordered, whitespace, fields changed, bytes cut or inserted):
    /// whenever the scan answers, it equals the general path.
    #[test]
    fn scan_agrees_with_general_path_on_reshaped_chunks() {
        use proptest::prelude::*;
        let chunks = real_chunks();
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 2000,
            ..Default::default()
        });
        let values = prop_oneof![
            Just(Value::Null),
            Just(Value::String(String::new())),
            Just(Value::String("tok".into())),
            Just(Value::String("a\n\"b\\".into())),
            Just(Value::String("é\u{1}".into())),
            Just(serde_json::json!([1, 2, 3])),
            Just(serde_json::json!({"content": "x"})),
            Just(serde_json::json!({"content": "", "reasoning_content": "y"})),
            Just(serde_json::json!({"prompt_tokens": 5, "completion_tokens": 9})),
            Just(serde_json::json!(-1.5e-7)),
            Just(serde_json::json!(12)),
            Just(serde_json::json!(true)),
            Just(serde_json::json!(8.378015000062078)),
            Just(serde_json::json!(-0.0)),
            Just(serde_json::json!(u64::MAX)),
            Just(serde_json::json!({"queue_time_ms": 0.25, "mean_itl_ms": null, "x": [1]})),
            Just(serde_json::json!({"generation_time_ms": "3"})),
            Just(serde_json::json!({"message": "m"})),
        ];
        let keys = prop_oneof![
            Just("text"),
            Just("delta"),
            Just("message"),
            Just("token_ids"),
            Just("finish_reason"),
            Just("usage"),
            Just("object"),
            Just("choices"),
            Just("other"),
            Just("metrics"),
            Just("error"),
            Just("queue_time_ms"),
            Just("tokens_per_second"),
            Just("speculative_decoding"),
        ];
        // where an edit goes: the top level, the first choice, the `metrics` object
        let strat = (
            0..chunks.len(),
            proptest::collection::vec((keys, values, 0u8..3), 0..4),
            0u8..4,
            any::<u16>(),
            any::<u8>(),
        );
        runner
            .run(&strat, |(i, edits, layout, pos, byte)| {
                let mut v: Value = serde_json::from_str(&chunks[i]).unwrap();
                for (k, val, place) in edits {
                    let target = match place {
                        0 => Some(&mut v),
                        1 => v
                            .get_mut("choices")
                            .and_then(|c| c.get_mut(0))
                            .filter(|c| c.is_object()),
                        _ => v.get_mut("metrics").filter(|c| c.is_object()),
                    };
                    if let Some(Value::Object(m)) = target {
                        m.insert(k.to_string(), val);
                    }
                }
                let mut text = match layout {
                    0 => serde_json::to_string(&v).unwrap(),
                    1 => serde_json::to_string_pretty(&v).unwrap(),
                    _ => serde_json::to_string(&v).unwrap().replace(',', " ,\t"),
                }
                .into_bytes();
                if layout == 3 && !text.is_empty() {
                    // a cut or an inserted byte: mostly malformed
                    let p = pos as usize % text.len();
                    if byte % 2 == 0 {
                        text.truncate(p);
                    } else {
                        text.insert(p, byte);
                    }
                }
                let general = parse_chunk_general(&text);
                if let Some(fast) = scan_chunk(&text) {
                    prop_assert_eq!(
                        Ok(fast),
                        general.clone(),
                        "{}",
                        String::from_utf8_lossy(&text)
                    );
                }
                if let Some(body) = scan_body(&text) {
                    let want = general.map(BodyInfo::from);
                    prop_assert_eq!(Ok(body), want, "{}", String::from_utf8_lossy(&text));
                }
                Ok(())
            })
            .unwrap();
    }

    /// `Scan::skip` (the validating skip every unread value goes through) accepts exactly what
    /// serde_json accepts, on generated JSON values (deep nesting, every scalar kind, escapes,
    /// odd whitespace) and on the same text cut or with a byte inserted: whenever it accepts,
    /// serde_json does; whenever serde_json accepts a value without `\u` escapes or escaped keys
    /// and not nested past the scan's limit, it accepts too.
    #[test]
    fn skip_accepts_what_serde_json_accepts() {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|x| serde_json::json!(x)),
            any::<u64>().prop_map(|x| serde_json::json!(x)),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(|x| serde_json::json!(x)),
            r#"[a-z \\"\n\t\x01é/]{0,12}"#.prop_map(Value::String),
        ];
        let value = leaf.prop_recursive(70, 200, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((r#"[a-z"\\]{0,5}"#, inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        });
        fn depth(v: &Value) -> u32 {
            match v {
                Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
                Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
                _ => 0,
            }
        }
        fn escaped_key(v: &Value) -> bool {
            match v {
                Value::Array(a) => a.iter().any(escaped_key),
                Value::Object(o) => o
                    .iter()
                    .any(|(k, v)| k.contains(['"', '\\']) || escaped_key(v)),
                _ => false,
            }
        }
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 3000,
            ..Default::default()
        });
        let strat = (value, 0u8..4, any::<u16>(), any::<u8>());
        let accepted = std::cell::Cell::new(0u32);
        runner
            .run(&strat, |(v, layout, pos, byte)| {
                let mut text = match layout {
                    0 | 3 => serde_json::to_string(&v).unwrap(),
                    1 => serde_json::to_string_pretty(&v).unwrap(),
                    _ => serde_json::to_string(&v).unwrap().replace(',', " ,\r\n"),
                }
                .into_bytes();
                let mutated = layout == 3 && !text.is_empty();
                if mutated {
                    let p = pos as usize % text.len();
                    if byte % 2 == 0 {
                        text.truncate(p);
                    } else {
                        text.insert(p, byte);
                    }
                }
                let serde_ok = std::str::from_utf8(&text)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(t).ok())
                    .is_some();
                let scanned = {
                    let ascii_or_utf8 = std::str::from_utf8(&text).is_ok();
                    let mut s = Scan { b: &text, i: 0 };
                    ascii_or_utf8 && s.skip(1).is_some() && {
                        s.ws();
                        s.i == text.len()
                    }
                };
                if scanned {
                    prop_assert!(serde_ok, "{}", String::from_utf8_lossy(&text));
                    accepted.set(accepted.get() + 1);
                }
                if !mutated {
                    let t = String::from_utf8_lossy(&text);
                    if depth(&v) < SCAN_MAX_DEPTH && !escaped_key(&v) && !t.contains("\\u") {
                        prop_assert!(scanned, "{}", t);
                    }
                }
                Ok(())
            })
            .unwrap();
        assert!(accepted.get() > 500, "{}", accepted.get());
        // Nesting at and past the scan's limit (serde_json's is 128): accepted up to the
        // limit, left to serde_json beyond it, never accepted where serde_json refuses.
        for n in [1usize, 2, 62, 63, 64, 65, 127, 128, 129, 200] {
            for (open, close) in [("[", "]"), ("{\"a\":", "}"), ("[{\"k\":[", "]}]")] {
                let t = format!("{}1{}", open.repeat(n), close.repeat(n));
                let serde_ok = serde_json::from_str::<Value>(&t).is_ok();
                let mut s = Scan {
                    b: t.as_bytes(),
                    i: 0,
                };
                let scanned = s.skip(1).is_some() && s.i == t.len();
                assert!(!scanned || serde_ok, "{t}");
                let levels = n * open.matches(['[', '{']).count();
                assert_eq!(scanned, levels < SCAN_MAX_DEPTH as usize, "{levels}: {t}");
            }
        }
    }

    #[test]
    fn metrics_object_on_usage_chunk() {
        let txt = include_str!("../fixtures/vllm/per_request_metrics_example.txt");
        let line = txt
            .lines()
            .find(|l| l.starts_with("data: ") && l.contains("metrics"))
            .unwrap();
        let c = parse_chunk(&line.as_bytes()[6..]).unwrap();
        let m = c.metrics.unwrap();
        assert!((m.queue_time_ms.unwrap() - 0.02688).abs() < 1e-6);
        assert!(m.time_to_first_token_ms.unwrap() > 2.0);
    }
}
