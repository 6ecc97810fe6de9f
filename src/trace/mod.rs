//! The trace data model: what one request of LLM traffic looks like once recorded or imported.
//!
//! A [`Trace`] is a [`TraceHeader`] plus [`Request`]s sorted by arrival. Every other part of retrace
//! reads and writes this model: importers fill it from public formats, the recorder fills it from
//! live traffic, the replayer turns it into a schedule. Times are monotonic offsets in microseconds
//! from the trace's t0 (invariant 1 in ARCHITECTURE.md); wall-clock time appears once, in the header.
//!
//! This module and its children are pure and synchronous: no tokio, no hyper, no printing.

pub(crate) mod agentic;
pub(crate) mod azure;
pub(crate) mod custom;
pub mod detect;
pub mod filter;
pub(crate) mod fleet;
pub mod hash;
pub mod import;
pub mod mooncake;
pub mod native;
pub mod rows;
pub(crate) mod select;
pub mod shadow;
pub(crate) mod shape;
pub mod stats;
pub mod stream;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use hash::HashScheme;

/// Errors from reading or writing traces. Each names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}:{line}: {}", clip_quoted(.msg))]
    Row {
        path: String,
        line: u64,
        msg: String,
    },
    #[error("{path}: {}", clip_quoted(.msg))]
    File { path: String, msg: String },
    #[error("{path}: trace format version {found_major}.{found_minor} is newer than this retrace understands ({ours_major}.x); upgrade retrace")]
    NewerVersion {
        path: String,
        found_major: u16,
        found_minor: u16,
        ours_major: u16,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Characters of quoted input an error message shows.
pub(crate) const CLIP_CHARS: usize = 80;

/// Input quoted in an error message: its first [`CLIP_CHARS`] characters, then `… (N bytes)`.
pub(crate) fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(CLIP_CHARS) {
        None => s.into(),
        Some((cut, _)) => format!("{}… ({} bytes)", &s[..cut], s.len()).into(),
    }
}

/// `msg` with each part quoted in `"` (backslash escapes skipped, as serde quotes input) or
/// backticks (as our messages do) cut by [`clip`]; an unclosed quote runs to the end.
pub(crate) fn clip_quoted(msg: &str) -> String {
    let mut out = String::new();
    let mut rest = msg;
    while let Some(k) = rest.find(['"', '`']) {
        let q = rest.as_bytes()[k];
        let inner = &rest[k + 1..];
        let mut end = 0;
        while end < inner.len() && inner.as_bytes()[end] != q {
            end += if q == b'"' && inner.as_bytes()[end] == b'\\' {
                2
            } else {
                1
            };
        }
        let end = end.min(inner.len());
        out.push_str(&rest[..=k]);
        out.push_str(&clip(&inner[..end]));
        rest = &inner[end..];
        if let Some(r) = rest.strip_prefix(q as char) {
            out.push(q as char);
            rest = r;
        }
    }
    out.push_str(rest);
    out
}

/// File-level facts shared by all requests of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Tokens per hash id (512 for Mooncake, 64 for kv-cache-tester, the proxy's choice when recorded).
    pub block_size: u32,
    /// What the values in `hash_ids` are.
    pub hash_scheme: HashScheme,
    /// `true` when a trailing partial block gets a hash id (Mooncake: ceil); `false` when it is
    /// dropped (kv-cache-tester: floor).
    pub partial_tail_block: bool,
    /// Wall-clock time of t0 in microseconds since the Unix epoch, when known.
    pub t0_unix_us: Option<i64>,
    /// Who wrote the file (`retrace 0.1.0`).
    pub writer: String,
    /// How it was made (`convert mooncake:conversation_trace.jsonl`, `record --upstream ...`).
    pub source: String,
    /// Free-form facts (`dropped_records`, original format, filters applied).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
}

/// The `record_order` meta value of a recording: the recorder writes each record when its
/// exchange ends, so records are in completion order, not arrival order (readers sort them).
pub(crate) const COMPLETION_ORDER: &str = "completion order; sorted by arrival within each frame";

impl TraceHeader {
    /// Written in completion order (a recording): records out of arrival order are expected.
    pub(crate) fn in_completion_order(&self) -> bool {
        self.meta.get("record_order").map(String::as_str) == Some(COMPLETION_ORDER)
    }

    /// A header for ids imported from a trace that already carries dense prefix-chained ids.
    pub fn imported(block_size: u32, partial_tail_block: bool, source: impl Into<String>) -> Self {
        TraceHeader {
            block_size,
            hash_scheme: HashScheme::Dense,
            partial_tail_block,
            t0_unix_us: None,
            writer: format!("retrace {}", env!("CARGO_PKG_VERSION")),
            source: source.into(),
            meta: BTreeMap::new(),
        }
    }

    /// An error when a record of `input_tokens` tokens carries more hash ids than any reader
    /// accepts under this header ([`rows::id_limit`]).
    pub fn check_ids(&self, ids: usize, input_tokens: u64) -> Result<(), String> {
        let blocks = self.blocks_for(input_tokens);
        rows::check_ids(ids, blocks, input_tokens)
    }

    /// Number of hash ids a prompt of `input_tokens` tokens has under this header's block rule.
    pub fn blocks_for(&self, input_tokens: u64) -> u64 {
        blocks(input_tokens, self.block_size, self.partial_tail_block)
    }
}

/// Blocks of `block_size` tokens in a prompt of `input_tokens` tokens: a partial last block
/// counts when `partial_tail_block` (the header's block rule, also for importers' rows).
pub(crate) fn blocks(input_tokens: u64, block_size: u32, partial_tail_block: bool) -> u64 {
    let b = u64::from(block_size.max(1));
    match partial_tail_block {
        true => input_tokens.div_ceil(b),
        false => input_tokens / b,
    }
}

/// Which API a request used.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Endpoint {
    /// `/v1/completions`
    #[default]
    Completions,
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/responses`
    Responses,
    /// `/v1/embeddings`
    Embeddings,
    /// Any other path, kept as sent (without its query string).
    Other(String),
}

/// What an exchange is to the workload (trace format 1.1; derived from method and endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum EndpointKind {
    /// Completions, chat completions, responses: the workload replay re-issues.
    Generation,
    /// Embeddings, rerank, score, classify, pooling: a workload of its own.
    Pooling,
    /// Anything else (`/tokenize`, `/detokenize`, `GET /v1/models`, `/metrics`, `/health`, ...):
    /// kept in the trace, left out of the workload.
    Auxiliary,
}

impl EndpointKind {}

/// Last path segments of the pooling APIs (vLLM's and the common rerank/score routes).
const POOLING_SEGMENTS: &[&str] = &["rerank", "score", "classify", "pooling"];

impl Endpoint {
    pub(crate) fn from_path(path: &str) -> Endpoint {
        let p = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        if p.ends_with("/chat/completions") {
            Endpoint::Chat
        } else if p.ends_with("/completions") {
            Endpoint::Completions
        } else if p.ends_with("/responses") {
            Endpoint::Responses
        } else if p.ends_with("/embeddings") {
            Endpoint::Embeddings
        } else {
            Endpoint::Other(path.to_string())
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
            Endpoint::Responses => "responses",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Other(p) => p,
        }
    }
    pub fn parse(s: &str) -> Endpoint {
        match s {
            "completions" => Endpoint::Completions,
            "chat" => Endpoint::Chat,
            "responses" => Endpoint::Responses,
            "embeddings" => Endpoint::Embeddings,
            other => Endpoint::from_path(other),
        }
    }
    /// The path a replay sends this endpoint's requests to.
    pub fn path(&self) -> &str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Other(p) => p,
        }
    }
    pub(crate) fn kind(&self) -> EndpointKind {
        match self {
            Endpoint::Completions | Endpoint::Chat | Endpoint::Responses => {
                EndpointKind::Generation
            }
            Endpoint::Embeddings => EndpointKind::Pooling,
            Endpoint::Other(p) => {
                let last = p.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                if POOLING_SEGMENTS.contains(&last) {
                    EndpointKind::Pooling
                } else {
                    EndpointKind::Auxiliary
                }
            }
        }
    }
}

/// Sampling parameters that matter for replay. `None` means "not given in the request".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Params {
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "mt")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "mn")]
    pub min_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "te")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "ie")]
    pub ignore_eos: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "st")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "iu")]
    pub include_usage: Option<bool>,
}

impl Params {
    pub(crate) fn is_empty(&self) -> bool {
        *self == Params::default()
    }
}

/// Where a request sits in a multi-turn session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// Session identifier, unique within the trace.
    pub id: String,
    /// Turn number within the session, from 0.
    pub turn: u32,
    /// Idle time between the end of the previous turn and this request, in µs, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think_us: Option<u64>,
}

/// One streamed event (an SSE `data:` message) of a recorded response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Arrival offset from the request's arrival, µs.
    pub offset_us: u64,
    /// Tokens the event carried (0 for a role-only chunk or the usage chunk).
    pub tokens: u32,
}

/// `T` read from a JSON object only: serde's derived readers take a struct from an array too
/// (`[1,2,3]` as its fields in order), which no format we read means.
pub(crate) struct Obj<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(m))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData)).map(Obj)
    }
}

/// Token usage as the server reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// A response's own timing report, in milliseconds: vLLM's per-request `metrics` object
/// (`--enable-per-request-metrics`), or llama.cpp's `timings` mapped onto the same meanings
/// (`crate::wire::openai`; docs/replay.md says which field maps to which).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerMetrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_token_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_time_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) generation_time_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_itl_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tokens_per_second: Option<f64>,
    /// Prompt tokens the server took from its prefix cache (llama.cpp's `cache_n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cached_tokens: Option<u64>,
}

/// What the server did with a recorded request. Offsets are µs from the request's arrival.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Response {
    /// HTTP status; 0 when no response head arrived.
    pub status: u16,
    /// Error kind (`upstream_connect`, `upstream_reset`, `timeout_idle`, `http_500`, ...), if any.
    pub error: Option<String>,
    /// Time to response headers.
    pub headers_us: Option<u64>,
    /// Time to the first content-bearing event.
    pub ttft_us: Option<u64>,
    /// Every streamed event, in order.
    pub events: Vec<Event>,
    /// Time the response ended (last byte or failure).
    pub end_us: Option<u64>,
    pub usage: Option<Usage>,
    pub server_metrics: Option<ServerMetrics>,
    /// The client went away before the response ended.
    pub cancelled: bool,
    /// Response body text, only when recorded with `--bodies full`.
    pub body: Option<Vec<u8>>,
    /// Output tokens of each choice by its `index`, when a stream had more than one (`n > 1`;
    /// at most [`MAX_CHOICES`]); empty otherwise.
    pub choice_tokens: Vec<u32>,
    /// The body was longer than the recorder's capture cap (`--capture-max`): what it counted
    /// past it, unread (native key `x`, since 1.5). `None`: the body was read whole.
    pub past_cap: Option<PastCap>,
}

/// What a recorder counted of a response body past its capture cap, without reading it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PastCap {
    /// SSE events that ended past the cap: the last `events` of [`Response::events`], timed
    /// where they ended, one token each (their data unread), except the stream's last event,
    /// which is read (its tokens, usage and server metrics).
    pub events: u64,
    /// The count stopped at the recorder's bound: later events are in no figure of the record
    /// but the server's usage, when the last event had one.
    pub stopped: bool,
}

impl Response {
    /// The exchange completed: the client did not cancel it, no error, a status below 400.
    /// Only completed exchanges make a recording's latency: `inspect`'s recorded figures and
    /// `compare`'s recorded side are both drawn by this one rule.
    pub fn completed(&self) -> bool {
        !self.cancelled && self.error.is_none() && self.status < 400
    }

    /// A completed response that came whole (no events), with usage: a non-streamed body.
    pub(crate) fn is_whole_body(&self) -> bool {
        self.completed() && self.events.is_empty() && self.ttft_us.is_none() && self.usage.is_some()
    }

    /// The recorded latency of a streamed exchange that completed: (TTFT, E2E) in µs from
    /// arrival. A whole body is timed apart ([`Response::whole_body_e2e_us`]), E2E only, as a
    /// replay times one and vLLM has none.
    pub(crate) fn streamed_latency_us(&self) -> Option<(u64, u64)> {
        if !self.completed() || self.is_whole_body() {
            return None;
        }
        Some((self.ttft_us?, self.end_us?))
    }

    /// The E2E latency of a completed whole (non-streamed) body, µs from arrival.
    pub(crate) fn whole_body_e2e_us(&self) -> Option<u64> {
        self.is_whole_body().then_some(self.end_us).flatten()
    }

    /// How a replay cuts this exchange when the client cancelled it: after the recorded number
    /// of events when some came, else at its recorded end (µs from the send). `None` when the
    /// client did not cancel.
    pub(crate) fn cut(&self) -> Option<Cut> {
        if !self.cancelled {
            return None;
        }
        match u32::try_from(self.events.len()) {
            Ok(0) => Some(Cut::AtUs(self.end_us.unwrap_or(0))),
            Ok(n) => Some(Cut::AfterEvents(n)),
            Err(_) => Some(Cut::AfterEvents(u32::MAX)),
        }
    }
}

/// Where a replay cuts a request the client cancelled in the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// After this many SSE events (the recorded events).
    AfterEvents(u32),
    /// This long after the send, in µs, when no event came (the recorded end from arrival).
    AtUs(u64),
}

/// Most choices per response a trace holds counts of ([`Response::choice_tokens`]).
pub(crate) const MAX_CHOICES: usize = 256;

/// One request of a trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// Arrival offset from t0, µs.
    pub arrival_us: u64,
    pub session: Option<Session>,
    /// The HTTP method when it was not `POST` (recorded `GET /v1/models`, `GET /metrics`, ...).
    pub method: Option<String>,
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub params: Params,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens (for an imported trace: the length to generate).
    pub output_tokens: u64,
    /// Chained block hashes (or imported ids) of the prompt, one per block (see the header).
    pub hash_ids: Vec<u64>,
    pub response: Option<Box<Response>>,
    /// The full request body, only when the user asked for bodies at record time.
    pub body: Option<Vec<u8>>,
    /// Who counted `input_tokens` (native key `ic`, since 1.4).
    pub input_count: InputCount,
    /// The copies a shadowing recorder sent of this request, one per target at most (native
    /// key `sh`, since 1.6; at most [`shadow::MAX_SHADOWS`]).
    pub shadows: Vec<shadow::ShadowCopy>,
}

/// Who counted a record's input length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InputCount {
    /// Known exactly: token ids, the recorder's `--tokenizer` on a text prompt, the server's
    /// `usage`, an imported trace's number (and every record of a file older than 1.4).
    #[default]
    Exact,
    /// The server's own `POST /tokenize` of the recorded prompt (exact too).
    Server,
    /// The recorder's estimate (4 bytes a token, or a chat rendered without the server's
    /// template): what the server counted is not known.
    Estimated,
}

impl InputCount {
    /// The native key's value (`None` for [`InputCount::Exact`], which is not written).
    pub(crate) fn wire(self) -> Option<&'static str> {
        match self {
            InputCount::Exact => None,
            InputCount::Server => Some("server"),
            InputCount::Estimated => Some("estimate"),
        }
    }

    /// Reads the native key's value; an unknown value is read as exact (a newer minor's).
    pub(crate) fn from_wire(v: Option<&str>) -> Self {
        match v {
            Some("server") => InputCount::Server,
            Some("estimate") => InputCount::Estimated,
            _ => InputCount::Exact,
        }
    }
}

impl Request {
    /// What this exchange is to the workload: anything but a `POST` is auxiliary.
    pub(crate) fn kind(&self) -> EndpointKind {
        match self.method {
            Some(_) => EndpointKind::Auxiliary,
            None => self.endpoint.kind(),
        }
    }

    /// `METHOD path`, e.g. `GET /v1/models` (how counts by endpoint are keyed).
    pub fn route(&self) -> String {
        format!(
            "{} {}",
            self.method.as_deref().unwrap_or("POST"),
            self.endpoint.path()
        )
    }

    /// Part of the workload (generation or pooling), not an auxiliary call.
    pub fn is_workload(&self) -> bool {
        self.kind() != EndpointKind::Auxiliary
    }

    /// Output tokens of one choice, the length a replay asks of each: the longest recorded
    /// choice of a stream of `n > 1` ([`Response::choice_tokens`]), else the total over the
    /// `n` choices the request asked for, shared evenly (rounded up); never above the recorded
    /// `max_tokens`.
    pub fn choice_output_tokens(&self) -> u64 {
        let counted = self.response.as_deref().map(|r| r.choice_tokens.as_slice());
        let each = match counted.and_then(|c| c.iter().max()) {
            Some(&longest) => u64::from(longest),
            None => {
                let n = u64::from(self.params.n.unwrap_or(1).max(1));
                self.output_tokens.div_ceil(n)
            }
        };
        match self.params.max_tokens {
            Some(cap) => each.min(u64::from(cap)),
            None => each,
        }
    }

    /// The recorded response failed (an error kind, or a status of 400 or more).
    pub fn recorded_failure(&self) -> Option<&str> {
        let r = self.response.as_deref()?;
        match &r.error {
            Some(e) => Some(e),
            None if r.status >= 400 => Some("http_error"),
            None => None,
        }
    }
}

/// A whole trace in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub requests: Vec<Request>,
}

impl Trace {
    /// Duration from t0 to the last arrival, in µs.
    pub(crate) fn span_us(&self) -> u64 {
        let first = self.requests.first().map_or(0, |r| r.arrival_us);
        let last = self.requests.last().map_or(0, |r| r.arrival_us);
        last.saturating_sub(first)
    }

    /// Puts the requests in arrival order (stable: equal arrivals keep their file order) and
    /// says how many were out of order. Every reader yields this one canonical order.
    pub(crate) fn sort_by_arrival(&mut self) -> u64 {
        let late = self
            .requests
            .windows(2)
            .filter(|w| w[1].arrival_us < w[0].arrival_us)
            .count() as u64;
        if late > 0 {
            self.requests.sort_by_key(|r| r.arrival_us);
        }
        late
    }

    /// Keeps only the workload (generation and pooling requests); returns how many auxiliary
    /// requests it left out.
    pub(crate) fn drop_auxiliary(&mut self) -> u64 {
        let before = self.requests.len();
        self.requests.retain(Request::is_workload);
        (before - self.requests.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_choice_asks_for_its_own_length_never_above_the_recorded_cap() {
        let mut r = Request {
            output_tokens: 17,
            ..Default::default()
        };
        assert_eq!(r.choice_output_tokens(), 17);
        r.params.n = Some(2);
        assert_eq!(r.choice_output_tokens(), 9, "shared evenly, rounded up");
        r.response = Some(Box::new(Response {
            choice_tokens: vec![5, 12],
            ..Default::default()
        }));
        assert_eq!(r.choice_output_tokens(), 12, "the longest counted choice");
        r.params.max_tokens = Some(10);
        assert_eq!(r.choice_output_tokens(), 10, "never above max_tokens");
    }

    #[test]
    fn clip_quoted_cuts_long_quoted_input_and_keeps_the_rest() {
        let big = "x".repeat(10 << 20);
        let msg = clip_quoted(&format!(
            "field `{big}` is bad; invalid type: string \"a\\\"{big}\", expected u64 at line 1"
        ));
        assert!(msg.len() < 300, "{}", msg.len());
        assert!(
            msg.starts_with("field `xxx") && msg.ends_with("\", expected u64 at line 1"),
            "{msg}"
        );
        assert_eq!(
            msg.matches(&format!("… ({} bytes)", big.len())).count(),
            1,
            "{msg}"
        );
        assert!(
            msg.contains(&format!("… ({} bytes)", big.len() + 3)),
            "{msg}"
        );
        let short = "line 2: `12a` is not a number, \"ok\"";
        assert_eq!(clip_quoted(short), short);
        let odd = format!("unclosed `{} and é\\", "é".repeat(100));
        let tail = format!("… ({} bytes)", odd.len() - "unclosed `".len());
        assert!(clip_quoted(&odd).ends_with(&tail), "{}", clip_quoted(&odd));
    }

    fn at(method: Option<&str>, path: &str) -> EndpointKind {
        Request {
            method: method.map(str::to_string),
            endpoint: Endpoint::from_path(path),
            ..Default::default()
        }
        .kind()
    }

    #[test]
    fn exchanges_are_classified_by_method_and_path() {
        assert_eq!(at(None, "/v1/completions"), EndpointKind::Generation);
        assert_eq!(at(None, "/v1/chat/completions"), EndpointKind::Generation);
        assert_eq!(at(None, "/v1/responses"), EndpointKind::Generation);
        assert_eq!(at(None, "/v1/embeddings"), EndpointKind::Pooling);
        assert_eq!(at(None, "/v1/rerank"), EndpointKind::Pooling);
        assert_eq!(at(None, "/score"), EndpointKind::Pooling);
        assert_eq!(at(None, "/tokenize"), EndpointKind::Auxiliary);
        assert_eq!(at(None, "/detokenize"), EndpointKind::Auxiliary);
        assert_eq!(at(Some("GET"), "/v1/models"), EndpointKind::Auxiliary);
        assert_eq!(at(Some("GET"), "/metrics"), EndpointKind::Auxiliary);
        assert_eq!(at(Some("GET"), "/v1/completions"), EndpointKind::Auxiliary);
        for e in [
            "completions",
            "chat",
            "responses",
            "embeddings",
            "/tokenize",
        ] {
            assert_eq!(Endpoint::parse(e).as_str(), e);
        }
    }

    #[test]
    fn sorting_is_stable_and_counts_what_was_late() {
        let r = |t: u64, o: u64| Request {
            arrival_us: t,
            output_tokens: o,
            ..Default::default()
        };
        let mut t = Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: vec![r(5, 0), r(1, 1), r(5, 2), r(3, 3)],
        };
        assert_eq!(t.sort_by_arrival(), 2);
        let got: Vec<_> = t
            .requests
            .iter()
            .map(|r| (r.arrival_us, r.output_tokens))
            .collect();
        assert_eq!(got, [(1, 1), (3, 3), (5, 0), (5, 2)]);
        assert_eq!(t.sort_by_arrival(), 0);
    }
}
