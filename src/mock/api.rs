//! The mock's HTTP API: vLLM-compatible routes and request validation; the JSON and SSE text
//! itself is [`super::format`]'s.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`,
//! `GET /metrics`, `POST /tokenize`, `GET /version`. Checks in vLLM's order: body JSON and field
//! types (400), model name (404), prompt length against `max_model_len` (400, also when
//! streaming); `max_tokens` beyond the context is cut silently as vLLM 0.32 does. Injected status
//! faults come after validation. A streamed response takes the connection over and the engine
//! side writes its events to the socket ([`super::stream`], [`super::conn`]); a whole body is
//! collected on the engine side ([`Collect`]) and sent in one piece. A dropped request cancels
//! it in the engine. This module does not schedule anything; it only talks to the engine
//! through its channel.

use super::conn::{BoxError, ConnCtx, Hijack, Reply};
use super::engine::{Cmd, Emit, Finish, SeqIn, Sink, Submit, Timing};
use super::faults::{self, FaultPlan};
use super::format::{ids_json, ids_or_null, json_str, metrics_json, Fmt, FINGERPRINT};
use super::prom::Stats;
use super::stream::{arm_reset, Framing, Stream, StreamSink};
use super::tokenize::{self, Tokenizer};
use crate::openai::{parse_request_value, Prompt, RequestInfo};
use crate::trace::Endpoint;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::fmt::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

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
}

/// The injected reset of a whole-body response: hyper drops the connection (`SO_LINGER 0` is set).
#[derive(Debug, thiserror::Error)]
#[error("connection reset (injected fault)")]
struct ResetFault;

/// A whole (non-streamed) answer as the engine finished it.
enum Whole {
    Done(Done),
    Reset,
}

/// Every choice's tokens and the request's usage and timings.
struct Done {
    ids: Vec<Vec<u32>>,
    fin: Vec<Option<Finish>>,
    prompt_tokens: u64,
    completion_tokens: u64,
    timing: Timing,
}

/// The engine's sink for a whole body: tokens are collected on the engine side and the handler
/// is woken once, when the answer is complete. Dropped unfinished (engine shutdown), the handler
/// sees its channel closed.
struct Collect {
    id: u64,
    queued: AtomicU32,
    parts: Mutex<Parts>,
}

struct Parts {
    ids: Vec<Vec<u32>>,
    fin: Vec<Option<Finish>>,
    tx: Option<oneshot::Sender<Whole>>,
}

impl Sink for Collect {
    fn emit(&self, e: Emit, _flush: bool) -> bool {
        let mut p = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let whole = match e {
            Emit::Tokens {
                choice,
                ids,
                finish,
                ..
            } => {
                let c = choice as usize;
                if let Some(v) = p.ids.get_mut(c) {
                    v.extend(ids);
                    p.fin[c] = finish.or(p.fin[c]);
                }
                // A closed receiver: the handler is gone.
                return p.tx.as_ref().is_some_and(|tx| !tx.is_closed());
            }
            Emit::Done {
                prompt_tokens,
                completion_tokens,
                timing,
                ..
            } => Whole::Done(Done {
                ids: std::mem::take(&mut p.ids),
                fin: std::mem::take(&mut p.fin),
                prompt_tokens,
                completion_tokens,
                timing,
            }),
            Emit::Reset { .. } => Whole::Reset,
        };
        p.tx.take().is_some_and(|tx| tx.send(whole).is_ok())
    }
    fn key(&self) -> u64 {
        self.id
    }
    fn queued(&self) -> &AtomicU32 {
        &self.queued
    }
}

fn full(status: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A vLLM error body: `{"error":{"message","type","param","code"}}`.
pub fn error_response(status: u16, message: &str, param: Option<&str>) -> Reply {
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

fn detail(status: StatusCode, msg: &str) -> Reply {
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
) -> Result<Reply, BoxError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let fault_header = req
        .headers()
        .get(faults::FAULT_HEADER)
        .map(|v| v.to_str().map(str::to_string));
    let get = method == Method::GET || method == Method::HEAD;
    let direct = StreamConn::new(&req, conn);
    if let Some(r) = simple_route(&sh, &path, get, method == Method::POST) {
        return Ok(r);
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
    direct.conn.request_read();
    let forced = match fault_header.map(|h| h.map_err(|_| faults::not_ascii())) {
        None => None,
        Some(h) => match h.and_then(|v| faults::parse_header(&v)) {
            Ok(p) => Some(p),
            Err(e) => return Ok(error_response(400, &e.to_string(), None)),
        },
    };
    if path == "/tokenize" {
        return Ok(tokenize_route(&sh, &body));
    }
    // Arrival (what the mock's timings count from): when the read that completed the request
    // got its bytes from the kernel (`crate::rxstamp`). Body parsing and tokenization that
    // follow count toward TTFT.
    let now = Instant::now();
    let arrival = direct.conn.last_rx().map_or(now, |rx| rx.min(now));
    let chat = path == "/v1/chat/completions";
    generate(sh, &body, chat, forced, &direct, arrival).await
}

/// The answer to every route but the three POST ones that read a body (`None` for those).
fn simple_route(sh: &Shared, path: &str, get: bool, post: bool) -> Option<Reply> {
    let json = "application/json";
    Some(match (path, get) {
        ("/health", true) => full(StatusCode::OK, json, ""),
        ("/version", true) => full(StatusCode::OK, json, "{\"version\":\"0.32.0\"}"),
        ("/metrics", true) => {
            let ctype = "text/plain; version=0.0.4; charset=utf-8";
            full(StatusCode::OK, ctype, sh.stats.render())
        }
        ("/v1/models", true) => models(sh),
        ("/v1/completions" | "/v1/chat/completions" | "/tokenize", false) if post => return None,
        ("/health" | "/version" | "/metrics" | "/v1/models", false)
        | ("/v1/completions" | "/v1/chat/completions" | "/tokenize", _) => {
            detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        }
        _ => detail(StatusCode::NOT_FOUND, "Not Found"),
    })
}

fn models(sh: &Shared) -> Reply {
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

fn tokenize_route(sh: &Shared, body: &[u8]) -> Reply {
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

/// Seconds since the Unix epoch (`created` fields).
pub fn unix_now() -> u64 {
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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

/// A request the mock refuses, as vLLM words it (turned into [`error_response`]).
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
struct Reject {
    status: u16,
    message: String,
    param: Option<&'static str>,
}

fn reject(status: u16, message: impl Into<String>, param: Option<&'static str>) -> Reject {
    Reject {
        status,
        message: message.into(),
        param,
    }
}

impl Reject {
    fn reply(&self) -> Reply {
        error_response(self.status, &self.message, self.param)
    }
}

/// A completion request as validated: its sequences and how to answer.
struct Gen {
    seqs: Vec<SeqIn>,
    stream: bool,
    include_usage: bool,
    return_token_ids: bool,
}

/// What a request body says, with `return_token_ids`, checked in vLLM's order: the body and its
/// fields (the common token-id completion typed, anything else and every error through
/// the JSON value path), the model, `stream_options`, then `return_token_ids`.
fn request_info(sh: &Shared, body: &[u8], chat: bool) -> Result<(RequestInfo, bool), Reject> {
    let fast = (!chat)
        .then(|| crate::openai::parse_completion_fast(body))
        .flatten();
    let (info, stream_options_set, return_token_ids) = match fast {
        Some(f) => (f.info, f.stream_options_set, Some(f.return_token_ids)),
        None => {
            let raw: Value = serde_json::from_slice(body)
                .map_err(|e| reject(400, format!("JSON decode error: {e}"), None))?;
            let endpoint = if chat {
                Endpoint::Chat
            } else {
                Endpoint::Completions
            };
            let info = parse_request_value(&endpoint, &raw).map_err(|e| reject(400, e, None))?;
            let rti = match raw.get("return_token_ids") {
                None | Some(Value::Null) => Some(false),
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => None,
            };
            let so = raw.get("stream_options").is_some_and(|v| !v.is_null());
            (info, so, rti)
        }
    };
    if let Some(m) = info.model.as_ref().filter(|m| **m != sh.model) {
        let msg = format!("The model `{m}` does not exist.");
        return Err(reject(404, msg, Some("model")));
    }
    if stream_options_set && info.params.stream != Some(true) {
        let msg = "Stream options can only be defined when `stream=True`.";
        return Err(reject(400, msg, Some("stream_options")));
    }
    let rti = return_token_ids.ok_or_else(|| {
        let msg = "field `return_token_ids` must be a boolean";
        reject(400, msg, Some("return_token_ids"))
    })?;
    Ok((info, rti))
}

/// The request's prompts as token ids.
fn prompts(sh: &Shared, info: &RequestInfo, chat: bool) -> Result<Vec<Vec<u32>>, Reject> {
    if chat {
        let msgs = info.messages.clone().unwrap_or_default();
        let ids = tokenize::chat_text(&msgs).and_then(|t| sh.tokenizer.encode(&t));
        return Ok(vec![ids.map_err(|e| reject(400, e, Some("messages")))?]);
    }
    let mut flat = Vec::new();
    if let Some(p) = info.prompt.clone() {
        flatten(p, &mut flat);
    }
    if flat.is_empty() {
        return Err(reject(400, "field `prompt` is empty", Some("prompt")));
    }
    let mut out = Vec::with_capacity(flat.len());
    for p in flat {
        match p {
            Prompt::TokenIds(ids) => out.push(ids),
            Prompt::Text(t) => out.push(
                sh.tokenizer
                    .encode(&t)
                    .map_err(|e| reject(400, e, Some("prompt")))?,
            ),
            Prompt::Batch(_) => {}
        }
    }
    Ok(out)
}

/// One sequence per prompt and choice (`n`), with lengths checked against the context.
fn sequences(
    sh: &Shared,
    info: &RequestInfo,
    prompts: Vec<Vec<u32>>,
) -> Result<Vec<SeqIn>, Reject> {
    let n = info.params.n.unwrap_or(1).max(1) as usize;
    if prompts.len() * n > MAX_CHOICES {
        let msg =
            format!("the mock serves at most {MAX_CHOICES} choices per request (prompts x n)");
        return Err(reject(400, msg, Some("n")));
    }
    let max_len = sh.max_model_len;
    let mut seqs = Vec::with_capacity(prompts.len() * n);
    for p in prompts {
        let l = p.len() as u32;
        if l == 0 {
            return Err(reject(400, "The prompt cannot be empty.", Some("prompt")));
        }
        if l >= max_len {
            let msg = format!(
                "This model's maximum context length is {max_len} tokens. However, your request has {l} input tokens. Please reduce the length of the input messages."
            );
            return Err(reject(400, msg, Some("prompt")));
        }
        if info.params.max_tokens == Some(0) {
            let msg = "max_tokens must be at least 1, got 0.";
            return Err(reject(400, msg, Some("max_tokens")));
        }
        let room = max_len - l;
        let max_tokens = info.params.max_tokens.unwrap_or(room).min(room);
        let q = SeqIn {
            prompt: p,
            max_tokens,
            min_tokens: info.params.min_tokens.unwrap_or(0).min(max_tokens),
            ignore_eos: info.params.ignore_eos.unwrap_or(false),
        };
        seqs.extend(std::iter::repeat_n(q, n));
    }
    Ok(seqs)
}

fn parse_generate(sh: &Shared, body: &[u8], chat: bool) -> Result<Gen, Reject> {
    let (info, return_token_ids) = request_info(sh, body, chat)?;
    let prompts = prompts(sh, &info, chat)?;
    Ok(Gen {
        seqs: sequences(sh, &info, prompts)?,
        stream: info.params.stream.unwrap_or(false),
        include_usage: info.params.include_usage.unwrap_or(false),
        return_token_ids,
    })
}

async fn generate(
    sh: Arc<Shared>,
    body: &[u8],
    chat: bool,
    forced: Option<FaultPlan>,
    direct: &StreamConn,
    arrival: Instant,
) -> Result<Reply, BoxError> {
    let g = match parse_generate(&sh, body, chat) {
        Ok(g) => g,
        Err(r) => return Ok(r.reply()),
    };
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
        let msg = format!("simulated {status} (retrace mock fault injection)");
        return Ok(error_response(status, &msg, None));
    }
    let prompts: Vec<Arc<Vec<u32>>> = g.seqs.iter().map(|s| Arc::new(s.prompt.clone())).collect();
    let kind = if chat { "chatcmpl" } else { "cmpl" };
    let head = Head {
        rn,
        chat,
        id: format!("{kind}-{}", random_hex(&sh, rn)),
        created: unix_now(),
        return_token_ids: g.return_token_ids,
    };
    let may_reset = plan.reset_after.is_some();
    let submit = |sink: Arc<dyn Sink>| Submit {
        id: rn,
        arrival,
        seqs: g.seqs,
        faults: plan,
        sink,
    };
    if !g.stream {
        return whole_response(&sh, &head, prompts, submit, slow, direct).await;
    }
    let fmt = Fmt::new(
        chat,
        &head.id,
        head.created,
        &sh.model,
        g.include_usage,
        sh.per_request_metrics,
        g.return_token_ids,
        prompts,
    );
    let st = Stream::new(
        fmt,
        sh.tokenizer.clone(),
        sh.stats.clone(),
        sh.engine.clone(),
        rn,
        may_reset,
        direct.framing,
    );
    let req = submit(Arc::new(StreamSink(st.clone())));
    stream_response(&sh, st, req, slow, direct).await
}

/// What every chunk or body of one answer names.
struct Head {
    /// The request's number (the engine's id of it).
    rn: u64,
    chat: bool,
    id: String,
    created: u64,
    return_token_ids: bool,
}

/// A whole (non-streamed) answer: collected on the engine side, sent in one piece (after slow
/// headers, if any).
async fn whole_response(
    sh: &Shared,
    head: &Head,
    prompts: Vec<Arc<Vec<u32>>>,
    submit: impl FnOnce(Arc<dyn Sink>) -> Submit,
    slow: Option<Duration>,
    direct: &StreamConn,
) -> Result<Reply, BoxError> {
    let n = prompts.len();
    let (tx, rx) = oneshot::channel();
    let req = submit(Arc::new(Collect {
        id: head.rn,
        queued: AtomicU32::new(0),
        parts: Mutex::new(Parts {
            ids: vec![Vec::new(); n],
            fin: vec![None; n],
            tx: Some(tx),
        }),
    }));
    if sh.inbox.submit(&sh.engine, req).is_err() {
        return Ok(error_response(503, "the engine is shutting down", None));
    }
    let mut guard = CancelGuard {
        engine: sh.engine.clone(),
        id: head.rn,
        armed: true,
    };
    let whole = rx.await;
    guard.armed = false;
    let body = match whole {
        Ok(Whole::Done(d)) => whole_body(sh, head, &prompts, &d),
        Ok(Whole::Reset) => {
            arm_reset(direct.conn.fd);
            return Err(Box::new(ResetFault));
        }
        Err(_) => return Ok(error_response(503, "the engine is shutting down", None)),
    };
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
    Ok(full(StatusCode::OK, "application/json", body))
}

/// A streamed completion: the engine gets a [`Stream`] as the request's sink, then the
/// connection is taken over so that the events go to the socket directly ([`super::stream`]).
async fn stream_response(
    sh: &Shared,
    st: Arc<Stream>,
    req: Submit,
    slow: Option<Duration>,
    direct: &StreamConn,
) -> Result<Reply, BoxError> {
    if sh.inbox.submit(&sh.engine, req).is_err() {
        return Ok(error_response(503, "the engine is shutting down", None));
    }
    // Until the connection takes the stream, a dropped handler (client gone) abandons it.
    let mut hijack = Hijack {
        stream: Some(st),
        head: Vec::new(),
        close_after: direct.close_after || direct.framing == Framing::UntilClose,
    };
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
    // hyper sends what it still holds of earlier (pipelined) responses first.
    direct.conn.flushed().await;
    let mut head = String::with_capacity(160);
    head.push_str(match direct.framing {
        Framing::Chunked => "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\ndate: ",
        Framing::UntilClose => "HTTP/1.0 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ndate: ",
    });
    head.push_str(&httpdate::fmt_http_date(std::time::SystemTime::now()));
    head.push_str("\r\n\r\n");
    hijack.head = head.into_bytes();
    direct.conn.take_over(hijack);
    // hyper's own response is discarded; `connection: close` makes it hand the socket back.
    let mut r = Response::new(Full::new(Bytes::new()));
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    Ok(r)
}

/// How the connection can carry a streamed response.
pub struct StreamConn {
    framing: Framing,
    close_after: bool,
    conn: Arc<ConnCtx>,
}

impl StreamConn {
    fn new<B>(req: &Request<B>, conn: Arc<ConnCtx>) -> StreamConn {
        let close = |v: &header::HeaderValue| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains("close"))
        };
        StreamConn {
            // As hyper frames a body of unknown length: chunked for HTTP/1.1, else until close.
            framing: match req.version() {
                http::Version::HTTP_11 => Framing::Chunked,
                _ => Framing::UntilClose,
            },
            close_after: req.headers().get_all(header::CONNECTION).iter().any(close),
            conn,
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

/// The JSON body of a whole (non-streamed) answer.
fn whole_body<'a>(sh: &Shared, head: &Head, prompts: &'a [Arc<Vec<u32>>], d: &'a Done) -> String {
    let chat = head.chat;
    let tids = |ids: &'a [u32]| head.return_token_ids.then_some(ids);
    let mut s = String::with_capacity(256);
    s.push_str("{\"id\":");
    json_str(&mut s, &head.id);
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let created = head.created;
    let _ = write!(
        s,
        ",\"object\":\"{object}\",\"created\":{created},\"model\":"
    );
    json_str(&mut s, &sh.model);
    s.push_str(",\"choices\":[");
    for (c, ((prompt, ids), fin)) in prompts.iter().zip(&d.ids).zip(&d.fin).enumerate() {
        if c > 0 {
            s.push(',');
        }
        let mut text = String::new();
        sh.tokenizer.render(ids, &mut text);
        let f = fin.unwrap_or(Finish::Length).as_str();
        if chat {
            let _ = write!(
                s,
                "{{\"index\":{c},\"message\":{{\"role\":\"assistant\",\"content\":"
            );
            json_str(&mut s, &text);
            s.push_str(",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[],\"reasoning\":null}");
        } else {
            let _ = write!(s, "{{\"index\":{c},\"text\":");
            json_str(&mut s, &text);
        }
        let _ = write!(
            s,
            ",\"logprobs\":null,\"finish_reason\":\"{f}\",\"stop_reason\":null,\"token_ids\":"
        );
        ids_or_null(&mut s, tids(ids));
        if !chat {
            s.push_str(",\"prompt_logprobs\":null,\"prompt_token_ids\":");
            ids_or_null(&mut s, tids(prompt));
            s.push_str(",\"routed_experts\":null");
        }
        s.push('}');
    }
    let (p, c) = (d.prompt_tokens, d.completion_tokens);
    let _ = write!(
        s,
        "],\"service_tier\":null,\"system_fingerprint\":\"{FINGERPRINT}\",\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c},\"prompt_tokens_details\":null,\"completion_tokens_details\":null}}",
        p + c
    );
    s.push_str(match chat {
        true => ",\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"kv_transfer_params\":null",
        false => ",\"kv_transfer_params\":null,\"ec_transfer_params\":null",
    });
    if sh.per_request_metrics {
        s.push_str(",\"metrics\":");
        metrics_json(&mut s, &d.timing, true);
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn error_body_shape() {
        let r = error_response(404, "The model `x` does not exist.", Some("model"));
        assert_eq!(r.status(), 404);
        let b = r.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["error"]["type"], "NotFoundError");
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["param"], "model");
    }
}
