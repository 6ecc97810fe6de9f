//! The mock's HTTP API: vLLM-compatible routes and request validation, in vLLM's order (body and
//! field types 400, model 404, prompt length 400 also when streaming; `max_tokens` beyond the
//! context is cut silently); injected status faults come after validation. A streamed response
//! takes the connection over ([`super::conn`], [`super::emit`]); a whole body is collected on
//! the engine side ([`Collect`]) and sent in one piece. The JSON text is [`super::format`]'s.

use super::conn::{ConnCtx, Reply};
use super::emit::{arm_reset, BodyFraming, Hijack, Stream, StreamSink};
use super::engine::{Cmd, Emit, Finish, SeqIn, Sink, Submit, TokenUsage};
use super::exposition::EngineCounters;
use super::faults::{self, FaultPlan};
use super::format::{ids_json, ids_or_null, json_str, metrics_json, Fmt, Head, FINGERPRINT};
use super::tokenize::{self, Tokenizer};
use crate::trace::Endpoint;
use crate::wire::openai::{parse_request_value, Prompt, RequestInfo};
use crate::wire::BoxError;
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
pub(crate) struct Shared {
    pub(crate) model: String,
    pub(crate) max_model_len: u32,
    pub(crate) per_request_metrics: bool,
    pub(crate) seed: u64,
    pub(crate) faults: faults::FaultConfig,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) stats: Arc<EngineCounters>,
    pub(crate) engine: mpsc::Sender<Cmd>,
    /// New requests go here (the engine thread is woken only when needed).
    pub(crate) inbox: Arc<super::engine::Inbox>,
    pub(crate) next_id: AtomicU64,
    pub(crate) started_unix: u64,
}

/// The injected reset of a whole-body response: hyper drops the connection (`SO_LINGER 0` is set).
#[derive(Debug, thiserror::Error)]
#[error("connection reset (injected fault)")]
struct ResetFault;

/// A whole (non-streamed) answer: every choice's tokens and finish reason, and the usage.
#[derive(Default)]
struct Whole {
    ids: Vec<Vec<u32>>,
    fin: Vec<Option<Finish>>,
    usage: TokenUsage,
}

/// The engine's sink for a whole body: tokens are collected on the engine side and the handler
/// is woken once, when the answer is complete (`None`: the reset fault). Dropped unfinished
/// (engine shutdown), the handler sees its channel closed.
struct Collect {
    queued: AtomicU32,
    parts: Mutex<(Whole, Option<oneshot::Sender<Option<Whole>>>)>,
}

impl Sink for Collect {
    fn emit(&self, e: Emit, _flush: bool) -> bool {
        let mut p = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let (w, tx) = &mut *p;
        let whole = match e {
            Emit::Tokens {
                choice,
                ids,
                finish,
                ..
            } => {
                let c = choice as usize;
                if let (Some(v), Some(f)) = (w.ids.get_mut(c), w.fin.get_mut(c)) {
                    v.extend(ids);
                    *f = finish.or(*f);
                }
                // A closed receiver: the handler is gone.
                return tx.as_ref().is_some_and(|tx| !tx.is_closed());
            }
            Emit::Done { usage, .. } => Some(Whole {
                usage,
                ..std::mem::take(w)
            }),
            Emit::Reset { .. } => None,
        };
        tx.take().is_some_and(|tx| tx.send(whole).is_ok())
    }
    fn queued(&self) -> &AtomicU32 {
        &self.queued
    }
}

fn full(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    (r.headers_mut()).insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    r
}

/// A vLLM error body: `{"error":{"message","type","param","code"}}`.
pub(crate) fn error_response(status: u16, message: &str, param: Option<&str>) -> Reply {
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

fn shutting_down() -> Reply {
    error_response(503, "the engine is shutting down", None)
}

fn detail(status: StatusCode, msg: &str) -> Reply {
    full(
        status,
        "application/json",
        format!("{{\"detail\":\"{msg}\"}}"),
    )
}

/// Serves one HTTP request arriving on the connection described by `conn`.
pub(crate) async fn handle(
    req: Request<hyper::body::Incoming>,
    sh: Arc<Shared>,
    conn: Arc<ConnCtx>,
) -> Result<Reply, BoxError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let forced = req.headers().get(faults::FAULT_HEADER).map(|v| {
        let v = v
            .to_str()
            .map_err(|_| faults::BadFaultHeader("not ASCII".into()));
        v.and_then(faults::parse_header)
    });
    let get = method == Method::GET || method == Method::HEAD;
    let direct = StreamConn::new(&req, conn);
    if path == "/reset_prefix_cache" && method == Method::POST {
        return Ok(reset_prefix_cache(&sh).await);
    }
    if let Some(r) = simple_route(&sh, &path, get, method == Method::POST) {
        return Ok(r);
    }
    let body = http_body_util::Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match body.await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = format!("cannot read request body (limit {MAX_BODY} bytes): {e}");
            return Ok(error_response(400, &msg, None));
        }
    };
    direct.conn.request_read();
    let forced = match forced.transpose() {
        Ok(p) => p,
        Err(e) => return Ok(error_response(400, &e.to_string(), None)),
    };
    if path == "/tokenize" {
        return Ok(tokenize_route(&sh, &body).unwrap_or_else(Reply::from));
    }
    if path == "/detokenize" {
        return Ok(detokenize_route(&sh, &body).unwrap_or_else(Reply::from));
    }
    // Arrival (what the mock's timings count from): when the read that completed the request
    // got its bytes from the kernel (`crate::sys::rxstamp`). Body parsing and tokenization that
    // follow count toward TTFT.
    let now = Instant::now();
    let arrival = direct.conn.last_rx().map_or(now, |rx| rx.min(now));
    let chat = path == "/v1/chat/completions";
    generate(sh, &body, chat, forced, &direct, arrival).await
}

/// `POST /reset_prefix_cache`: 200 as vLLM answers, whether or not the cache could be emptied
/// (not while a running sequence holds blocks; vLLM then only logs it).
async fn reset_prefix_cache(sh: &Shared) -> Reply {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if sh.engine.send(Cmd::ResetPrefixCache(tx)).is_err() {
        return detail(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped");
    }
    match rx.await {
        Ok(true) => full(StatusCode::OK, "application/json", ""),
        Ok(false) => {
            tracing::warn!("reset_prefix_cache: blocks in use by running requests; nothing reset");
            full(StatusCode::OK, "application/json", "")
        }
        Err(_) => detail(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped"),
    }
}

/// The answer to every route but the POST ones that read a body (`None` for those).
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
        ("/v1/completions" | "/v1/chat/completions" | "/tokenize" | "/detokenize", false)
            if post =>
        {
            return None
        }
        ("/health" | "/version" | "/metrics" | "/v1/models", false)
        | ("/v1/completions" | "/v1/chat/completions" | "/tokenize" | "/detokenize", _) => {
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

fn tokenize_route(sh: &Shared, body: &[u8]) -> Result<Reply, Reject> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| reject(400, format!("body is not JSON: {e}"), None))?;
    let tokens = match (v.get("messages"), v.get("prompt")) {
        (Some(m), _) => {
            let msg = "field `messages` must be a list";
            let m = m
                .as_array()
                .ok_or_else(|| reject(400, msg, Some("messages")))?;
            let ids = tokenize::chat_text(m).and_then(|t| sh.tokenizer.encode(&t));
            ids.map_err(|e| reject(400, e, Some("messages")))?
        }
        (None, Some(Value::String(s))) => {
            (sh.tokenizer.encode(s)).map_err(|e| reject(400, e, Some("prompt")))?
        }
        _ => {
            let msg = "field `prompt` (text) or `messages` is required";
            return Err(reject(400, msg, Some("prompt")));
        }
    };
    let mut s = format!(
        "{{\"count\":{},\"max_model_len\":{},\"tokens\":",
        tokens.len(),
        sh.max_model_len
    );
    ids_json(&mut s, &tokens);
    let strs = (v.get("return_token_strs").and_then(Value::as_bool) == Some(true)).then(|| {
        let str = |&t: &u32| sh.tokenizer.token_str(t).map_or(Value::Null, Value::String);
        Value::Array(tokens.iter().map(str).collect())
    });
    let _ = write!(s, ",\"token_strs\":{}}}", strs.unwrap_or(Value::Null));
    Ok(full(StatusCode::OK, "application/json", s))
}

/// `POST /detokenize` as vLLM: `{"model", "tokens": [ids]}` → `{"prompt": text}`; at most
/// [`tokenize::MAX_DETOKENIZE`] tokens, each a vocabulary id (else 400 naming it).
fn detokenize_route(sh: &Shared, body: &[u8]) -> Result<Reply, Reject> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| reject(400, format!("body is not JSON: {e}"), None))?;
    let msg = "field `tokens` must be a list of token ids";
    let list = (v.get("tokens").and_then(Value::as_array))
        .ok_or_else(|| reject(400, msg, Some("tokens")))?;
    if list.len() > tokenize::MAX_DETOKENIZE {
        let msg = format!(
            "{} tokens: the mock detokenizes at most {} per request",
            list.len(),
            tokenize::MAX_DETOKENIZE
        );
        return Err(reject(400, msg, Some("tokens")));
    }
    let ids = list
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| reject(400, msg, Some("tokens")))?;
    let text = sh
        .tokenizer
        .decode(&ids)
        .map_err(|e| reject(400, e, Some("tokens")))?;
    let mut s = String::from("{\"prompt\":");
    json_str(&mut s, &text);
    s.push('}');
    Ok(full(StatusCode::OK, "application/json", s))
}

/// Seconds since the Unix epoch (`created` fields).
pub(crate) fn unix_now() -> u64 {
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A request the mock refuses, as vLLM words it (answered with [`error_response`]).
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

impl From<Reject> for Reply {
    fn from(r: Reject) -> Reply {
        error_response(r.status, &r.message, r.param)
    }
}

/// A completion request as validated: its sequences and how to answer.
struct Gen {
    seqs: Vec<SeqIn>,
    /// Prompt tokens counted once per prompt (`seqs` holds each prompt `n` times).
    prompt_tokens: u64,
    stream: bool,
    include_usage: bool,
    return_token_ids: bool,
}

/// What a request body says, with `return_token_ids`, checked in vLLM's order: the body and its
/// fields (the common token-id completion typed, anything else and every error through
/// the JSON value path), the model, `stream_options`, then `return_token_ids`.
fn request_info(sh: &Shared, body: &[u8], chat: bool) -> Result<(RequestInfo, bool), Reject> {
    let fast = (!chat)
        .then(|| crate::wire::openai::parse_completion_fast(body))
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
        let msgs = info.messages.as_deref().unwrap_or_default();
        return Ok(vec![chat_ids(sh, msgs)?]);
    }
    let mut out = Vec::new();
    if let Some(p) = info.prompt.clone() {
        prompt_ids(sh, p, &mut out)?;
    }
    if out.is_empty() {
        return Err(reject(400, "field `prompt` is empty", Some("prompt")));
    }
    Ok(out)
}

/// Appends the token ids of `p` (text tokenized, a batch flattened) to `out`.
fn prompt_ids(sh: &Shared, p: Prompt, out: &mut Vec<Vec<u32>>) -> Result<(), Reject> {
    match p {
        Prompt::Batch(v) => return v.into_iter().try_for_each(|x| prompt_ids(sh, x, out)),
        Prompt::TokenIds(ids) => out.push(ids),
        Prompt::Text(t) => out.push(text_ids(sh, &t)?),
    }
    Ok(())
}

fn text_ids(sh: &Shared, text: &str) -> Result<Vec<u32>, Reject> {
    (sh.tokenizer.encode(text)).map_err(|e| reject(400, e, Some("prompt")))
}

/// Chat messages through the fixed template, as token ids.
fn chat_ids(sh: &Shared, messages: &[Value]) -> Result<Vec<u32>, Reject> {
    let ids = tokenize::chat_text(messages).and_then(|t| sh.tokenizer.encode(&t));
    ids.map_err(|e| reject(400, e, Some("messages")))
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
    let prompt_tokens = prompts.iter().map(|p| p.len() as u64).sum();
    Ok(Gen {
        seqs: sequences(sh, &info, prompts)?,
        prompt_tokens,
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
        Err(r) => return Ok(r.into()),
    };
    let rn = sh.next_id.fetch_add(1, Relaxed);
    let plan = forced.unwrap_or_else(|| sh.faults.plan(sh.seed, rn));
    if plan != FaultPlan::default() {
        sh.stats.faults_injected.fetch_add(plan.count(), Relaxed);
    }
    let slow = plan
        .slow_headers_ms
        .map(|ms| Duration::from_secs_f64(ms / 1e3));
    if let Some(status) = plan.status {
        slow_headers(slow).await;
        let msg = format!("simulated {status} (retrace mock fault injection)");
        return Ok(error_response(status, &msg, None));
    }
    let prompts: Vec<Arc<Vec<u32>>> = g.seqs.iter().map(|s| Arc::new(s.prompt.clone())).collect();
    let kind = if chat { "chatcmpl" } else { "cmpl" };
    let hex = xxhash_rust::xxh3::xxh3_64_with_seed(&rn.to_le_bytes(), sh.seed ^ sh.started_unix);
    let head = Head {
        chat,
        id: format!("{kind}-{hex:016x}"),
        created: unix_now(),
        model: &sh.model,
        return_token_ids: g.return_token_ids,
    };
    let may_reset = plan.reset_after.is_some();
    let submit = |sink: Arc<dyn Sink>| {
        let (id, seqs, faults) = (rn, g.seqs, plan);
        let req = Submit {
            id,
            arrival,
            seqs,
            prompt_tokens: g.prompt_tokens,
            faults,
            sink,
        };
        sh.inbox.submit(&sh.engine, req).is_ok()
    };
    if !g.stream {
        let (tx, rx) = oneshot::channel();
        let n = prompts.len();
        let (ids, fin, usage) = (vec![Vec::new(); n], vec![None; n], TokenUsage::default());
        let collect = Collect {
            queued: AtomicU32::new(0),
            parts: Mutex::new((Whole { ids, fin, usage }, Some(tx))),
        };
        if !submit(Arc::new(collect)) {
            return Ok(shutting_down());
        }
        let mut guard = CancelGuard(Some((sh.engine.clone(), rn)));
        let whole = rx.await;
        guard.0 = None;
        let body = match whole {
            Ok(None) => {
                arm_reset(direct.conn.fd);
                return Err(Box::new(ResetFault));
            }
            Ok(Some(w)) => whole_body(&sh, &head, &prompts, &w),
            Err(_) => return Ok(shutting_down()),
        };
        slow_headers(slow).await;
        return Ok(full(StatusCode::OK, "application/json", body));
    }
    let fmt = Fmt::new(&head, g.include_usage, sh.per_request_metrics, prompts);
    let (tok, stats, engine) = (sh.tokenizer.clone(), sh.stats.clone(), sh.engine.clone());
    let st = Stream::new(fmt, tok, stats, engine, rn, may_reset, direct.framing);
    if !submit(Arc::new(StreamSink(st.clone()))) {
        return Ok(shutting_down());
    }
    stream_response(st, slow, direct).await
}

async fn slow_headers(slow: Option<Duration>) {
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
}

/// A streamed completion, its request submitted with a [`Stream`] as its sink: the connection is
/// taken over so that the events go to the socket directly ([`super::emit`]).
async fn stream_response(
    st: Arc<Stream>,
    slow: Option<Duration>,
    direct: &StreamConn,
) -> Result<Reply, BoxError> {
    // Until the connection takes the stream, a dropped handler (client gone) abandons it.
    let mut hijack = Hijack {
        stream: st,
        head: Vec::new(),
        close_after: direct.close_after || direct.framing == BodyFraming::UntilClose,
    };
    slow_headers(slow).await;
    // hyper sends what it still holds of earlier (pipelined) responses first.
    direct.conn.flushed().await;
    let head = match direct.framing {
        BodyFraming::Chunked => "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\ndate: ",
        BodyFraming::UntilClose => "HTTP/1.0 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ndate: ",
    };
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    hijack.head = format!("{head}{date}\r\n\r\n").into_bytes();
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
pub(crate) struct StreamConn {
    framing: BodyFraming,
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
                http::Version::HTTP_11 => BodyFraming::Chunked,
                _ => BodyFraming::UntilClose,
            },
            close_after: req.headers().get_all(header::CONNECTION).iter().any(close),
            conn,
        }
    }
}

/// Cancels the request in the engine when dropped armed (the handler went away).
struct CancelGuard(Option<(mpsc::Sender<Cmd>, u64)>);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some((engine, id)) = self.0.take() {
            let _ = engine.send(Cmd::Cancel(id));
        }
    }
}

/// The JSON body of a whole (non-streamed) answer.
fn whole_body<'a>(sh: &Shared, head: &Head, prompts: &'a [Arc<Vec<u32>>], w: &'a Whole) -> String {
    let chat = head.chat;
    let tids = |ids: &'a [u32]| head.return_token_ids.then_some(ids);
    let mut s = String::with_capacity(256);
    head.open(&mut s, false);
    for (c, ((prompt, ids), fin)) in prompts.iter().zip(&w.ids).zip(&w.fin).enumerate() {
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
    let (p, c) = (w.usage.prompt_tokens, w.usage.completion_tokens);
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
        metrics_json(&mut s, &w.usage, true);
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
