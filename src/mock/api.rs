//! The mock's HTTP API: vLLM-compatible routes, request validation, and the exact JSON/SSE shapes
//! vLLM 0.32 sends (field names, order, `null`s; see `fixtures/vllm/`).
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`,
//! `GET /metrics`, `POST /tokenize`, `GET /version`. Checks in vLLM's order: body JSON and field
//! types (400), model name (404), prompt length against `max_model_len` (400, also when
//! streaming); `max_tokens` beyond the context is cut silently as vLLM 0.32 does. Injected status
//! faults come after validation. A streamed HTTP/1.1 response takes the connection over and is
//! written by the engine thread itself ([`super::stream`], [`super::conn`]); for HTTP/1.0 (or
//! when hyper still holds unsent bytes) it is a [`SseBody`] that formats each engine event when
//! hyper polls it and records its lateness there. `Fmt` formats the SSE chunks for both. A
//! dropped stream cancels its request in the engine. This module does not schedule anything; it
//! only talks to the engine through its channel.

use super::conn::{ConnCtx, Hijack};
use super::engine::{Cmd, Emit, Finish, Out, SeqIn, Submit, Timing};
use super::faults::{self, FaultPlan};
use super::prom::Stats;
use super::stream::{Stream, StreamSink};
use super::tokenize::{self, Tokenizer};
use crate::openai::{parse_request_value, Prompt};
use crate::trace::Endpoint;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use serde_json::Value;
use std::fmt::Write;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `system_fingerprint` the mock reports.
pub const FINGERPRINT: &str = "vllm-0.32.0-retrace-mock";
const MAX_BODY: usize = 64 << 20;
const MAX_CHOICES: usize = 128;

/// What every request handler shares.
pub struct Shared {
    pub model: String,
    pub max_model_len: u32,
    pub per_request_metrics: bool,
    pub seed: u64,
    pub faults: faults::FaultConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub stats: Arc<Stats>,
    pub engine: mpsc::Sender<Cmd>,
    /// New requests go here (the engine thread is woken only when needed).
    pub inbox: Arc<super::engine::Inbox>,
    pub next_id: AtomicU64,
    pub started_unix: u64,
    /// A request arrives when its bytes reached the socket (the kernel's receive timestamp of
    /// the read that completed it); false: when its head had been parsed.
    pub kernel_arrival: bool,
}

/// Response bodies: a whole body, or an SSE stream fed by the engine.
pub enum MockBody {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            MockBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            MockBody::Sse(s) => s.poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, MockBody::Full(None))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            // Whole bodies get a content-length, as uvicorn sends them.
            MockBody::Full(b) => {
                http_body::SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
            MockBody::Sse(_) => http_body::SizeHint::default(),
        }
    }
}

/// Sets `SO_LINGER {on, 0}` so that closing the socket sends a TCP RST.
pub(super) fn arm_reset(fd: RawFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `fd` is the connection's socket, alive while its request is being served; the
    // option value is a valid `linger` of the stated size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

#[derive(Debug)]
struct ResetFault;
impl std::fmt::Display for ResetFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset (injected fault)")
    }
}
impl std::error::Error for ResetFault {}

/// Appends `s` as a JSON string literal, escaped exactly as serde_json (and Python's json with
/// `ensure_ascii=False`) does: `"` and `\` and control characters; nothing else. No allocation.
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

fn ids_json(out: &mut String, ids: &[u32]) {
    out.push('[');
    for (i, t) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{t}");
    }
    out.push(']');
}

fn metrics_json(out: &mut String, t: &Timing, spec: bool) {
    let _ = write!(
        out,
        "{{\"time_to_first_token_ms\":{:?},\"generation_time_ms\":{:?},\"queue_time_ms\":{:?},\"mean_itl_ms\":{:?},\"tokens_per_second\":{:?}",
        t.ttft_ms, t.generation_ms, t.queue_ms, t.mean_itl_ms, t.tokens_per_second
    );
    if spec {
        out.push_str(",\"speculative_decoding\":null");
    }
    out.push('}');
}

/// Per-stream formatting state (shared by the hyper-served [`SseBody`] and the direct writer).
pub(super) struct Fmt {
    chat: bool,
    head: String,
    include_usage: bool,
    metrics: bool,
    return_token_ids: bool,
    prompts: Vec<Arc<Vec<u32>>>,
    started: Vec<bool>,
    choices_left: usize,
    /// Scratch for one event's text (reused: no allocation per event).
    text: String,
}

impl Fmt {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        chat: bool,
        id: &str,
        created: u64,
        model: &str,
        include_usage: bool,
        metrics: bool,
        return_token_ids: bool,
        prompts: Vec<Arc<Vec<u32>>>,
    ) -> Self {
        let mut head = String::with_capacity(128);
        head.push_str("{\"id\":");
        json_str(&mut head, id);
        head.push_str(if chat {
            ",\"object\":\"chat.completion.chunk\""
        } else {
            ",\"object\":\"text_completion\""
        });
        let _ = write!(head, ",\"created\":{created},\"model\":");
        json_str(&mut head, model);
        head.push_str(",\"choices\":[");
        let n = prompts.len();
        Fmt {
            chat,
            head,
            include_usage,
            metrics,
            return_token_ids,
            prompts,
            started: vec![false; n],
            choices_left: n,
            text: String::new(),
        }
    }

    pub(super) fn tokens(
        &mut self,
        out: &mut String,
        tok: &Tokenizer,
        choice: u32,
        ids: &[u32],
        finish: Option<Finish>,
    ) {
        let c = choice as usize;
        let first = !self.started.get(c).copied().unwrap_or(true);
        if let Some(s) = self.started.get_mut(c) {
            *s = true;
        }
        if finish.is_some() {
            self.choices_left = self.choices_left.saturating_sub(1);
        }
        let last_chunk = finish.is_some() && self.choices_left == 0 && !self.include_usage;
        let mut text = std::mem::take(&mut self.text);
        text.clear();
        tok.render(ids, &mut text);
        if self.chat && first {
            out.push_str("data: ");
            out.push_str(&self.head);
            let _ = write!(
                out,
                "{{\"index\":{choice},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"prompt_token_ids\":"
            );
            match (self.return_token_ids, self.prompts.get(c)) {
                (true, Some(p)) => ids_json(out, p),
                _ => out.push_str("null"),
            }
            out.push_str(",\"prompt_text\":null}\n\n");
        }
        out.push_str("data: ");
        out.push_str(&self.head);
        let _ = write!(out, "{{\"index\":{choice},");
        if self.chat {
            out.push_str("\"delta\":{\"content\":");
            json_str(out, &text);
            out.push_str("},\"logprobs\":null,\"finish_reason\":");
            match finish {
                Some(f) => {
                    let _ = write!(out, "\"{}\",\"stop_reason\":null", f.as_str());
                }
                None => out.push_str("null"),
            }
        } else {
            out.push_str("\"text\":");
            json_str(out, &text);
            out.push_str(",\"logprobs\":null,\"finish_reason\":");
            match finish {
                Some(f) => {
                    let _ = write!(out, "\"{}\"", f.as_str());
                }
                None => out.push_str("null"),
            }
            out.push_str(",\"stop_reason\":null,\"prompt_token_ids\":");
            match (self.return_token_ids && first, self.prompts.get(c)) {
                (true, Some(p)) => ids_json(out, p),
                _ => out.push_str("null"),
            }
        }
        out.push_str(",\"token_ids\":");
        if self.return_token_ids {
            ids_json(out, ids);
        } else {
            out.push_str("null");
        }
        out.push_str("}]");
        if last_chunk {
            let _ = write!(out, ",\"system_fingerprint\":\"{FINGERPRINT}\"");
        }
        out.push_str("}\n\n");
        self.text = text;
    }

    /// Every choice has had its last token (only the usage chunk and `[DONE]` remain).
    pub(super) fn all_finished(&self) -> bool {
        self.choices_left == 0
    }

    pub(super) fn done(&self, out: &mut String, prompt: u64, completion: u64, t: &Timing) {
        if self.include_usage {
            out.push_str("data: ");
            out.push_str(&self.head);
            let _ = write!(
                out,
                "],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}}},\"system_fingerprint\":\"{FINGERPRINT}\"",
                prompt + completion
            );
            if self.metrics {
                out.push_str(",\"metrics\":");
                metrics_json(out, t, false);
            }
            out.push_str("}\n\n");
        }
        out.push_str("data: [DONE]\n\n");
    }
}

/// A streamed response fed by the engine.
pub struct SseBody {
    rx: UnboundedReceiver<Emit>,
    fmt: Fmt,
    tok: Arc<Tokenizer>,
    stats: Arc<Stats>,
    engine: mpsc::Sender<Cmd>,
    id: u64,
    fd: RawFd,
    finished: bool,
    reset_pending: bool,
    buf: String,
}

impl SseBody {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.reset_pending {
            self.reset_pending = false;
            self.finished = true;
            arm_reset(self.fd);
            return Poll::Ready(Some(Err(Box::new(ResetFault))));
        }
        if self.finished {
            return Poll::Ready(None);
        }
        self.buf.clear();
        let mut ended = false;
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(e)) => {
                    let late = Instant::now().saturating_duration_since(e.at());
                    self.stats.record_lateness(late.as_nanos() as i128);
                    match e {
                        Emit::Tokens {
                            choice,
                            ids,
                            finish,
                            ..
                        } => self
                            .fmt
                            .tokens(&mut self.buf, &self.tok, choice, &ids, finish),
                        Emit::Done {
                            prompt_tokens,
                            completion_tokens,
                            timing,
                            ..
                        } => {
                            self.fmt
                                .done(&mut self.buf, prompt_tokens, completion_tokens, &timing);
                            ended = true;
                            break;
                        }
                        Emit::Reset { .. } => {
                            // Send what came before the reset first, then fail the body.
                            self.reset_pending = true;
                            break;
                        }
                    }
                }
                // The engine stopped (shutdown) or dropped the request: end the stream.
                Poll::Ready(None) => {
                    ended = true;
                    break;
                }
                Poll::Pending => break,
            }
            if self.buf.len() > 64 << 10 {
                break;
            }
        }
        if ended {
            self.finished = true;
        }
        if self.buf.is_empty() && self.reset_pending {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if self.buf.is_empty() {
            return if self.finished {
                Poll::Ready(None)
            } else {
                Poll::Pending
            };
        }
        let bytes = Bytes::from(std::mem::take(&mut self.buf).into_bytes());
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.engine.send(Cmd::Cancel(self.id));
        }
    }
}

fn full(status: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Response<MockBody> {
    let mut r = Response::new(MockBody::Full(Some(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A vLLM error body: `{"error":{"message","type","param","code"}}`.
pub fn error_response(status: u16, message: &str, param: Option<&str>) -> Response<MockBody> {
    let mut s = String::from("{\"error\":{\"message\":");
    json_str(&mut s, message);
    let _ = write!(s, ",\"type\":\"{}\",\"param\":", faults::error_type(status));
    match param {
        Some(p) => json_str(&mut s, p),
        None => s.push_str("null"),
    }
    let _ = write!(s, ",\"code\":{status}}}}}");
    full(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        "application/json",
        s,
    )
}

fn detail(status: StatusCode, msg: &str) -> Response<MockBody> {
    full(
        status,
        "application/json",
        format!("{{\"detail\":\"{msg}\"}}"),
    )
}

/// Serves one HTTP request arriving on the connection described by `conn`.
pub async fn handle(
    req: Request<hyper::body::Incoming>,
    sh: Arc<Shared>,
    conn: Arc<ConnCtx>,
) -> Result<Response<MockBody>, BoxError> {
    // Arrival (what the mock's timings count from): by default when the read that completed the
    // request got its bytes from the kernel (`crate::rxstamp`), taken after the body is read
    // below; with `--arrival-stamp parsed`, now (the head has been parsed). Body parsing and
    // tokenization count toward TTFT either way.
    let parsed = Instant::now();
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let fault_header = req
        .headers()
        .get(faults::FAULT_HEADER)
        .map(|v| v.to_str().map(str::to_string));
    let get = method == Method::GET || method == Method::HEAD;
    let direct = StreamConn {
        // The direct writer speaks HTTP/1.1 chunked only; HTTP/1.0 keeps hyper's framing.
        http11: req.version() == http::Version::HTTP_11,
        close_after: req.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains("close"))
        }),
        conn,
    };
    match (path.as_str(), get) {
        ("/health", true) => return Ok(full(StatusCode::OK, "application/json", "")),
        ("/version", true) => {
            return Ok(full(
                StatusCode::OK,
                "application/json",
                "{\"version\":\"0.32.0\"}",
            ))
        }
        ("/metrics", true) => {
            return Ok(full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                sh.stats.render(),
            ))
        }
        ("/v1/models", true) => return Ok(models(&sh)),
        ("/v1/completions" | "/v1/chat/completions" | "/tokenize", false)
            if method == Method::POST => {}
        ("/health" | "/version" | "/metrics" | "/v1/models", false)
        | ("/v1/completions" | "/v1/chat/completions" | "/tokenize", _) => {
            return Ok(detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"))
        }
        _ => return Ok(detail(StatusCode::NOT_FOUND, "Not Found")),
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(error_response(
                400,
                &format!("cannot read request body (limit {MAX_BODY} bytes): {e}"),
                None,
            ))
        }
    };
    let forced = match fault_header {
        None => None,
        Some(Ok(v)) => match faults::parse_header(&v) {
            Ok(p) => Some(p),
            Err(e) => return Ok(error_response(400, &e, None)),
        },
        Some(Err(_)) => {
            return Ok(error_response(
                400,
                &format!("{}: not ASCII", faults::FAULT_HEADER),
                None,
            ))
        }
    };
    if path == "/tokenize" {
        return Ok(tokenize_route(&sh, &body));
    }
    let arrival = match direct.conn.last_rx() {
        Some(rx) if sh.kernel_arrival => rx.min(Instant::now()),
        _ => parsed,
    };
    let chat = path == "/v1/chat/completions";
    generate(sh, &body, chat, forced, &direct, arrival).await
}

fn models(sh: &Shared) -> Response<MockBody> {
    let mut s = String::from("{\"object\":\"list\",\"data\":[{\"id\":");
    json_str(&mut s, &sh.model);
    let _ = write!(
        s,
        ",\"object\":\"model\",\"created\":{},\"owned_by\":\"vllm\",\"root\":",
        sh.started_unix
    );
    json_str(&mut s, &sh.model);
    let _ = write!(
        s,
        ",\"parent\":null,\"max_model_len\":{},\"permission\":[]}}]}}",
        sh.max_model_len
    );
    full(StatusCode::OK, "application/json", s)
}

fn tokenize_route(sh: &Shared, body: &[u8]) -> Response<MockBody> {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error_response(400, &format!("body is not JSON: {e}"), None),
    };
    let tokens = if let Some(m) = v.get("messages") {
        let Some(m) = m.as_array() else {
            return error_response(400, "field `messages` must be a list", Some("messages"));
        };
        match tokenize::chat_text(m).and_then(|t| sh.tokenizer.encode(&t)) {
            Ok(t) => t,
            Err(e) => return error_response(400, &e, Some("messages")),
        }
    } else {
        match v.get("prompt") {
            Some(Value::String(s)) => match sh.tokenizer.encode(s) {
                Ok(t) => t,
                Err(e) => return error_response(400, &e, Some("prompt")),
            },
            _ => {
                return error_response(
                    400,
                    "field `prompt` (text) or `messages` is required",
                    Some("prompt"),
                )
            }
        }
    };
    let mut s = format!(
        "{{\"count\":{},\"max_model_len\":{},\"tokens\":",
        tokens.len(),
        sh.max_model_len
    );
    ids_json(&mut s, &tokens);
    if v.get("return_token_strs").and_then(Value::as_bool) == Some(true) {
        let strs: Vec<Value> = tokens
            .iter()
            .map(|&t| {
                sh.tokenizer
                    .token_str(t)
                    .map(Value::String)
                    .unwrap_or(Value::Null)
            })
            .collect();
        let _ = write!(s, ",\"token_strs\":{}}}", Value::Array(strs));
    } else {
        s.push_str(",\"token_strs\":null}");
    }
    full(StatusCode::OK, "application/json", s)
}

fn flatten(p: Prompt, out: &mut Vec<Prompt>) {
    match p {
        Prompt::Batch(v) => v.into_iter().for_each(|x| flatten(x, out)),
        x => out.push(x),
    }
}

fn random_hex(sh: &Shared, n: u64) -> String {
    format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), sh.seed ^ sh.started_unix)
    )
}

/// The general path of a request body: (what it says, `stream_options` set, `return_token_ids`
/// or its error, checked after the model and stream options as vLLM does), or the 400 response
/// vLLM gives.
#[allow(clippy::type_complexity)]
fn request_fields(
    body: &[u8],
    chat: bool,
) -> Result<(crate::openai::RequestInfo, bool, Result<bool, ()>), Box<Response<MockBody>>> {
    let raw: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Err(Box::new(error_response(
                400,
                &format!("JSON decode error: {e}"),
                None,
            )))
        }
    };
    let endpoint = if chat {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let info = match parse_request_value(&endpoint, &raw) {
        Ok(i) => i,
        Err(e) => return Err(Box::new(error_response(400, &e, None))),
    };
    let stream_options_set = raw.get("stream_options").is_some_and(|v| !v.is_null());
    let return_token_ids = match raw.get("return_token_ids") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(()),
    };
    Ok((info, stream_options_set, return_token_ids))
}

async fn generate(
    sh: Arc<Shared>,
    body: &[u8],
    chat: bool,
    forced: Option<FaultPlan>,
    direct: &StreamConn,
    arrival: Instant,
) -> Result<Response<MockBody>, BoxError> {
    let fd = direct.conn.fd;
    // The common token-id completion goes straight into its fields; anything else (and every
    // error) through the JSON value path.
    let fast = if chat {
        None
    } else {
        crate::openai::parse_completion_fast(body)
    };
    let (info, stream_options_set, return_token_ids) = match fast {
        Some(f) => (f.info, f.stream_options_set, Ok(f.return_token_ids)),
        None => match request_fields(body, chat) {
            Ok(x) => x,
            Err(r) => return Ok(*r),
        },
    };
    if let Some(m) = &info.model {
        if *m != sh.model {
            return Ok(error_response(
                404,
                &format!("The model `{m}` does not exist."),
                Some("model"),
            ));
        }
    }
    if stream_options_set && info.params.stream != Some(true) {
        return Ok(error_response(
            400,
            "Stream options can only be defined when `stream=True`.",
            Some("stream_options"),
        ));
    }
    let Ok(return_token_ids) = return_token_ids else {
        return Ok(error_response(
            400,
            "field `return_token_ids` must be a boolean",
            Some("return_token_ids"),
        ));
    };
    // Prompts, tokenized.
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    if chat {
        let msgs = info.messages.clone().unwrap_or_default();
        match tokenize::chat_text(&msgs).and_then(|t| sh.tokenizer.encode(&t)) {
            Ok(t) => prompts.push(t),
            Err(e) => return Ok(error_response(400, &e, Some("messages"))),
        }
    } else {
        let mut flat = Vec::new();
        if let Some(p) = info.prompt.clone() {
            flatten(p, &mut flat);
        }
        if flat.is_empty() {
            return Ok(error_response(
                400,
                "field `prompt` is empty",
                Some("prompt"),
            ));
        }
        for p in flat {
            match p {
                Prompt::TokenIds(ids) => prompts.push(ids),
                Prompt::Text(t) => match sh.tokenizer.encode(&t) {
                    Ok(ids) => prompts.push(ids),
                    Err(e) => return Ok(error_response(400, &e, Some("prompt"))),
                },
                Prompt::Batch(_) => {}
            }
        }
    }
    let n = info.params.n.unwrap_or(1).max(1) as usize;
    if prompts.len() * n > MAX_CHOICES {
        return Ok(error_response(
            400,
            &format!("the mock serves at most {MAX_CHOICES} choices per request (prompts x n)"),
            Some("n"),
        ));
    }
    let max_len = sh.max_model_len;
    let mut seqs = Vec::with_capacity(prompts.len() * n);
    for p in &prompts {
        let l = p.len() as u32;
        if l == 0 {
            return Ok(error_response(
                400,
                "The prompt cannot be empty.",
                Some("prompt"),
            ));
        }
        if l >= max_len {
            return Ok(error_response(
                400,
                &format!(
                    "This model's maximum context length is {max_len} tokens. However, your request has {l} input tokens. Please reduce the length of the input messages."
                ),
                Some("prompt"),
            ));
        }
        if info.params.max_tokens == Some(0) {
            return Ok(error_response(
                400,
                "max_tokens must be at least 1, got 0.",
                Some("max_tokens"),
            ));
        }
        let room = max_len - l;
        let max_tokens = info.params.max_tokens.unwrap_or(room).min(room);
        for _ in 0..n {
            seqs.push(SeqIn {
                prompt: p.clone(),
                max_tokens,
                min_tokens: info.params.min_tokens.unwrap_or(0).min(max_tokens),
                ignore_eos: info.params.ignore_eos.unwrap_or(false),
            });
        }
    }
    // Faults.
    let rn = sh.next_id.fetch_add(1, Relaxed);
    let plan = forced.unwrap_or_else(|| sh.faults.plan(sh.seed, rn));
    if !plan.is_empty() {
        sh.stats.faults_injected.fetch_add(plan.count(), Relaxed);
    }
    let slow = plan
        .slow_headers_ms
        .map(|ms| Duration::from_secs_f64(ms / 1e3));
    if let Some(status) = plan.status {
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        return Ok(error_response(
            status,
            &format!("simulated {status} (retrace mock fault injection)"),
            None,
        ));
    }
    let stream = info.params.stream.unwrap_or(false);
    let include_usage = info.params.include_usage.unwrap_or(false);
    let prompt_arcs: Vec<Arc<Vec<u32>>> = seqs.iter().map(|s| Arc::new(s.prompt.clone())).collect();
    let id = format!(
        "{}-{}",
        if chat { "chatcmpl" } else { "cmpl" },
        random_hex(&sh, rn)
    );
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let fmt = || {
        Fmt::new(
            chat,
            &id,
            created,
            &sh.model,
            include_usage,
            sh.per_request_metrics,
            return_token_ids,
            prompt_arcs.clone(),
        )
    };
    if stream && direct.http11 && direct.conn.can_take_over() {
        // The engine writes this stream's events to the socket itself (see `super::stream`).
        let st = Stream::new(
            fmt(),
            sh.tokenizer.clone(),
            sh.stats.clone(),
            sh.engine.clone(),
            rn,
            plan.reset_after.is_some(),
            direct.conn.stamp_port,
        );
        let submit = Submit {
            id: rn,
            arrival,
            seqs,
            faults: plan,
            tx: Out::Sink(Arc::new(StreamSink(st.clone()))),
        };
        if sh.inbox.submit(&sh.engine, submit).is_err() {
            return Ok(error_response(503, "the engine is shutting down", None));
        }
        // Until the connection takes the stream, a dropped handler (client gone) cancels it.
        let guard = AbandonGuard { s: st, armed: true };
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        let mut head = String::with_capacity(160);
        head.push_str("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\ndate: ");
        http_date(&mut head);
        head.push_str("\r\n\r\n");
        let st = guard.disarm();
        if crate::stamps::enabled() {
            // first bytes read, head parsed (`arrival`), request handed to the engine
            let c = &direct.conn;
            crate::stamps::record(
                "mock",
                c.stamp_port,
                vec![
                    c.first_read_ns.swap(0, Relaxed),
                    crate::stamps::mono_ns(arrival),
                    crate::stamps::now_ns(),
                ],
            );
        }
        direct.conn.take_over(Hijack {
            stream: Some(st),
            head: head.into_bytes(),
            close_after: direct.close_after,
        });
        // hyper's own response is discarded; `connection: close` makes it hand the socket back.
        let mut r = Response::new(MockBody::Full(None));
        r.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return Ok(r);
    }
    let (tx, rx) = unbounded_channel();
    let submit = Submit {
        id: rn,
        arrival,
        seqs,
        faults: plan,
        tx: Out::Chan(tx),
    };
    if sh.inbox.submit(&sh.engine, submit).is_err() {
        return Ok(error_response(503, "the engine is shutting down", None));
    }
    if stream {
        let body = SseBody {
            rx,
            fmt: fmt(),
            tok: sh.tokenizer.clone(),
            stats: sh.stats.clone(),
            engine: sh.engine.clone(),
            id: rn,
            fd,
            finished: false,
            reset_pending: false,
            buf: String::new(),
        };
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        let mut r = Response::new(MockBody::Sse(Box::new(body)));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        return Ok(r);
    }
    // Non-streaming: wait for the whole answer, then send it (after slow headers, if any).
    let mut guard = CancelGuard {
        engine: sh.engine.clone(),
        id: rn,
        armed: true,
    };
    let r = collect_body(
        &sh,
        rx,
        chat,
        &id,
        created,
        return_token_ids,
        &prompt_arcs,
        fd,
    )
    .await;
    guard.armed = false;
    let r = r?;
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
    Ok(r)
}

/// Appends the current time as an HTTP `date` value (`Sun, 30 Nov 2026 02:30:00 GMT`), formatted
/// once per second and reused (formatting it per request cost ~3.7k instructions).
fn http_date(out: &mut String) {
    static CACHE: std::sync::Mutex<(u64, String)> =
        std::sync::Mutex::new((u64::MAX, String::new()));
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if c.0 != secs {
        c.1.clear();
        let _ = write!(
            c.1,
            "{}",
            chrono::DateTime::<chrono::Utc>::from(now).format("%a, %d %b %Y %H:%M:%S GMT")
        );
        c.0 = secs;
    }
    out.push_str(&c.1);
}

/// How the connection can carry a streamed response.
pub struct StreamConn {
    http11: bool,
    close_after: bool,
    conn: Arc<ConnCtx>,
}

/// Abandons a directly written stream whose handler is dropped before the connection took it.
struct AbandonGuard {
    s: Arc<Stream>,
    armed: bool,
}

impl AbandonGuard {
    fn disarm(mut self) -> Arc<Stream> {
        self.armed = false;
        self.s.clone()
    }
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if self.armed {
            self.s.abandon();
        }
    }
}

struct CancelGuard {
    engine: mpsc::Sender<Cmd>,
    id: u64,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.engine.send(Cmd::Cancel(self.id));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn collect_body(
    sh: &Shared,
    mut rx: UnboundedReceiver<Emit>,
    chat: bool,
    id: &str,
    created: u64,
    return_token_ids: bool,
    prompts: &[Arc<Vec<u32>>],
    fd: RawFd,
) -> Result<Response<MockBody>, BoxError> {
    let n = prompts.len();
    let mut ids: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut fin: Vec<Option<Finish>> = vec![None; n];
    let (prompt_tokens, completion_tokens, timing) = loop {
        match rx.recv().await {
            Some(Emit::Tokens {
                choice,
                ids: t,
                finish,
                ..
            }) => {
                if let Some(v) = ids.get_mut(choice as usize) {
                    v.extend(t);
                    fin[choice as usize] = finish.or(fin[choice as usize]);
                }
            }
            Some(Emit::Done {
                prompt_tokens,
                completion_tokens,
                timing,
                ..
            }) => break (prompt_tokens, completion_tokens, timing),
            Some(Emit::Reset { .. }) => {
                arm_reset(fd);
                return Err(Box::new(ResetFault));
            }
            None => return Ok(error_response(503, "the engine is shutting down", None)),
        }
    };
    let mut s = String::with_capacity(256);
    s.push_str("{\"id\":");
    json_str(&mut s, id);
    let _ = write!(
        s,
        ",\"object\":\"{}\",\"created\":{created},\"model\":",
        if chat {
            "chat.completion"
        } else {
            "text_completion"
        }
    );
    json_str(&mut s, &sh.model);
    s.push_str(",\"choices\":[");
    for c in 0..n {
        if c > 0 {
            s.push(',');
        }
        let mut text = String::new();
        sh.tokenizer.render(&ids[c], &mut text);
        let f = fin[c].unwrap_or(Finish::Length).as_str();
        let tids = |s: &mut String| {
            if return_token_ids {
                ids_json(s, &ids[c]);
            } else {
                s.push_str("null");
            }
        };
        if chat {
            let _ = write!(
                s,
                "{{\"index\":{c},\"message\":{{\"role\":\"assistant\",\"content\":"
            );
            json_str(&mut s, &text);
            let _ = write!(
                s,
                ",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[],\"reasoning\":null}},\"logprobs\":null,\"finish_reason\":\"{f}\",\"stop_reason\":null,\"token_ids\":"
            );
            tids(&mut s);
            s.push('}');
        } else {
            let _ = write!(s, "{{\"index\":{c},\"text\":");
            json_str(&mut s, &text);
            let _ = write!(
                s,
                ",\"logprobs\":null,\"finish_reason\":\"{f}\",\"stop_reason\":null,\"token_ids\":"
            );
            tids(&mut s);
            s.push_str(",\"prompt_logprobs\":null,\"prompt_token_ids\":");
            if return_token_ids {
                ids_json(&mut s, &prompts[c]);
            } else {
                s.push_str("null");
            }
            s.push_str(",\"routed_experts\":null}");
        }
    }
    let _ = write!(
        s,
        "],\"service_tier\":null,\"system_fingerprint\":\"{FINGERPRINT}\",\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"total_tokens\":{},\"completion_tokens\":{completion_tokens},\"prompt_tokens_details\":null,\"completion_tokens_details\":null}}",
        prompt_tokens + completion_tokens
    );
    if chat {
        s.push_str(",\"prompt_logprobs\":null,\"prompt_token_ids\":null");
    }
    s.push_str(",\"kv_transfer_params\":null");
    if !chat {
        s.push_str(",\"ec_transfer_params\":null");
    }
    if sh.per_request_metrics {
        s.push_str(",\"metrics\":");
        metrics_json(&mut s, &timing, true);
    }
    s.push('}');
    Ok(full(StatusCode::OK, "application/json", s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseParser;

    fn fmt_stream(chat: bool, usage: bool, tids: bool) -> Vec<Value> {
        let mut f = Fmt::new(
            chat,
            "cmpl-1",
            5,
            "m",
            usage,
            true,
            tids,
            vec![Arc::new(vec![1, 2, 3])],
        );
        let t = Tokenizer::Builtin;
        let mut out = String::new();
        f.tokens(&mut out, &t, 0, &[4], None);
        f.tokens(&mut out, &t, 0, &[5, 6], Some(Finish::Length));
        f.done(&mut out, 3, 3, &Timing::default());
        let mut p = SseParser::default();
        let mut evs = Vec::new();
        p.feed(out.as_bytes(), |e| evs.push(e.unwrap().data));
        assert_eq!(evs.last().map(String::as_str), Some("[DONE]"));
        evs[..evs.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn completion_stream_shape() {
        let evs = fmt_stream(false, true, false);
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[1]["choices"][0]["finish_reason"], "length");
        assert_eq!(evs[2]["choices"], serde_json::json!([]));
        assert_eq!(evs[2]["usage"]["total_tokens"], 6);
        assert!(evs[2]["metrics"]["time_to_first_token_ms"].is_number());
        let evs = fmt_stream(false, false, true);
        assert_eq!(evs.len(), 2);
        assert_eq!(
            evs[0]["choices"][0]["prompt_token_ids"],
            serde_json::json!([1, 2, 3])
        );
        assert_eq!(evs[1]["choices"][0]["token_ids"], serde_json::json!([5, 6]));
        assert_eq!(evs[1]["system_fingerprint"], FINGERPRINT);
    }

    #[test]
    fn chat_stream_starts_with_role_chunk() {
        let evs = fmt_stream(true, true, false);
        assert_eq!(evs.len(), 4);
        assert_eq!(evs[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(evs[0]["choices"][0]["delta"]["content"], "");
        assert_eq!(evs[1]["object"], "chat.completion.chunk");
        assert_eq!(evs[2]["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn json_strings_are_escaped_as_serde_json_does() {
        let mut all = String::new();
        for c in (0u32..0x80).chain([0xe9, 0x2028, 0x1F600]) {
            all.push(char::from_u32(c).unwrap());
        }
        for s in [
            "",
            "plain",
            " can",
            "a\"b\\c\n\t\u{1}\u{7f}/é",
            all.as_str(),
        ] {
            let mut ours = String::from("x");
            json_str(&mut ours, s);
            assert_eq!(ours[1..], serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn http_date_is_the_current_second_in_imf_fixdate() {
        let unix = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64
        };
        let before = unix();
        let mut a = String::new();
        http_date(&mut a);
        let mut b = String::new();
        http_date(&mut b);
        let after = unix();
        for d in [&a, &b] {
            assert!(d.ends_with(" GMT") && d.len() == 29, "{d}");
            let t = chrono::DateTime::parse_from_rfc2822(&d.replace("GMT", "+0000"))
                .expect("an RFC 2822 date")
                .timestamp();
            assert!((before..=after).contains(&t), "{d}: {before}..{after}");
        }
    }

    #[test]
    fn error_body_shape() {
        let r = error_response(404, "The model `x` does not exist.", Some("model"));
        assert_eq!(r.status(), 404);
        let MockBody::Full(Some(b)) = r.into_body() else {
            panic!("full body expected")
        };
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["error"]["type"], "NotFoundError");
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["param"], "model");
    }
}
