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
use super::format::{
    ids_json, ids_or_null, json_str, metrics_json, stop_reason, Fmt, Head, FINGERPRINT,
};
use super::responses::Events;
use super::sched;
use super::shape::{self, Api, Ask, Shaped};
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
    /// `MockConfig::eos_prob` (a shaped request's output is decided when it arrives).
    pub(crate) eos_prob: f64,
    /// `MockConfig::embedding_dim`.
    pub(crate) embedding_dim: u32,
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
    let api = match path.as_str() {
        "/v1/chat/completions" => Api::Chat,
        "/v1/responses" => Api::Responses,
        "/v1/embeddings" => return embeddings(sh, &body, &direct, arrival).await,
        _ => Api::Completions,
    };
    generate(sh, &body, api, forced, &direct, arrival).await
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

/// The routes that take a POST body.
const POST_ROUTES: [&str; 6] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
];

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
        (p, false) if post && POST_ROUTES.contains(&p) => return None,
        ("/health" | "/version" | "/metrics" | "/v1/models", false) => {
            detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        }
        (p, _) if POST_ROUTES.contains(&p) => {
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
    /// The outputs, decided now, of a request that asked for more than plain text.
    shaped: Option<Arc<Shaped>>,
    max_tokens: Option<u32>,
}

/// What a request body says: its fields, `return_token_ids`, what it asks of its output, and
/// `instructions` (responses).
struct Parsed {
    info: RequestInfo,
    return_token_ids: bool,
    ask: Option<Ask>,
    instructions: Option<String>,
}

/// What a request body says, checked in vLLM's order: the body and its fields (the common
/// token-id completion typed, anything else and every error through the JSON value path), the
/// model, `stream_options`, then `return_token_ids`.
fn request_info(sh: &Shared, body: &[u8], api: Api) -> Result<Parsed, Reject> {
    let fast = (api == Api::Completions)
        .then(|| crate::wire::openai::parse_completion_fast(body))
        .flatten();
    let (info, stream_options_set, return_token_ids, ask, instructions) = match fast {
        Some(f) => (
            f.info,
            f.stream_options_set,
            Some(f.return_token_ids),
            None,
            None,
        ),
        None => {
            let raw: Value = serde_json::from_slice(body)
                .map_err(|e| reject(400, format!("JSON decode error: {e}"), None))?;
            let endpoint = match api {
                Api::Chat => Endpoint::Chat,
                Api::Completions => Endpoint::Completions,
                Api::Responses => Endpoint::Responses,
            };
            let info = parse_request_value(&endpoint, &raw).map_err(|e| reject(400, e, None))?;
            let rti = match raw.get("return_token_ids") {
                None | Some(Value::Null) => Some(false),
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => None,
            };
            let so = raw.get("stream_options").is_some_and(|v| !v.is_null());
            let ask = shape::ask(&raw, api).map_err(|(m, f)| reject(400, m, Some(f)))?;
            let instructions = match raw.get("instructions") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => {
                    let msg = "field `instructions` must be a string";
                    return Err(reject(400, msg, Some("instructions")));
                }
            };
            (info, so, rti, ask, instructions)
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
    Ok(Parsed {
        info,
        return_token_ids: rti,
        ask,
        instructions,
    })
}

/// The request's prompts as token ids. A responses `input` is a chat: `instructions` as the
/// system message, then the input text as the user's message or the input's messages.
fn prompts(sh: &Shared, p: &Parsed, api: Api) -> Result<Vec<Vec<u32>>, Reject> {
    let info = &p.info;
    match api {
        Api::Chat => {
            let msgs = info.messages.as_deref().unwrap_or_default();
            return Ok(vec![chat_ids(sh, msgs)?]);
        }
        Api::Responses => {
            let mut msgs = Vec::new();
            if let Some(i) = &p.instructions {
                msgs.push(serde_json::json!({"role": "system", "content": i}));
            }
            if let Some(Prompt::Text(t)) = &info.prompt {
                msgs.push(serde_json::json!({"role": "user", "content": t}));
            }
            msgs.extend(info.messages.iter().flatten().cloned());
            let ids = tokenize::chat_text(&msgs).and_then(|t| sh.tokenizer.encode(&t));
            return Ok(vec![ids.map_err(|e| reject(400, e, Some("input")))?]);
        }
        Api::Completions => {}
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
            stop_after: None,
        };
        seqs.extend(std::iter::repeat_n(q, n));
    }
    Ok(seqs)
}

/// Decides the outputs of a request that asks for more than plain text (each choice's tokens
/// are those the engine will generate: `sched::token_id`), within [`shape::MAX_SHAPED_TOKENS`];
/// a stop string found in one ends that choice early.
fn shape_outputs(sh: &Shared, ask: Ask, seqs: &mut [SeqIn], rn: u64) -> Result<Shaped, Reject> {
    let vocab = sh.tokenizer.vocab();
    let lens: Vec<(u64, u32)> = (seqs.iter().enumerate())
        .map(|(c, q)| {
            let seed = sched::out_seed(sh.seed, &q.prompt, c as u32);
            (seed, sched::natural_len(q, seed, sh.eos_prob).0)
        })
        .collect();
    let total: u64 = lens.iter().map(|(_, l)| u64::from(*l)).sum();
    if total > shape::MAX_SHAPED_TOKENS {
        let msg = format!(
            "{total} output tokens: the mock serves at most {} per request with response_format, tools, stop or logprobs",
            shape::MAX_SHAPED_TOKENS
        );
        return Err(reject(400, msg, Some("max_tokens")));
    }
    let mut scripts = Vec::with_capacity(seqs.len());
    for (q, (seed, len)) in seqs.iter_mut().zip(lens) {
        let ids: Vec<u32> = (0..len).map(|i| sched::token_id(seed, i, vocab)).collect();
        let s = shape::script(&ask, &sh.tokenizer, &ids, seed);
        if s.stop.is_some() {
            q.stop_after = Some(s.len() as u32);
        }
        scripts.push(s);
    }
    let call_ids = (0..seqs.len() as u64)
        .map(|c| shape::tool_call_id(sh.seed ^ sh.started_unix ^ rn.wrapping_mul(131) ^ c))
        .collect();
    Ok(Shaped {
        ask,
        scripts,
        call_ids,
    })
}

fn parse_generate(sh: &Shared, body: &[u8], api: Api, rn: u64) -> Result<Gen, Reject> {
    let mut p = request_info(sh, body, api)?;
    if api == Api::Responses {
        p.info.params.n = None;
    }
    let prompts = prompts(sh, &p, api)?;
    let prompt_tokens = prompts.iter().map(|p| p.len() as u64).sum();
    let mut seqs = sequences(sh, &p.info, prompts)?;
    let shaped = match p.ask.take() {
        Some(ask) => Some(Arc::new(shape_outputs(sh, ask, &mut seqs, rn)?)),
        None => None,
    };
    Ok(Gen {
        seqs,
        prompt_tokens,
        stream: p.info.params.stream.unwrap_or(false),
        include_usage: p.info.params.include_usage.unwrap_or(false),
        return_token_ids: p.return_token_ids,
        shaped,
        max_tokens: p.info.params.max_tokens,
    })
}

/// Submits `seqs` to the engine and waits for their whole answer (`None` with a reply: the
/// engine is shutting down; `Err`: the reset fault).
async fn collect_whole(
    sh: &Shared,
    req: Submit,
    direct: &StreamConn,
) -> Result<Result<Whole, Reply>, BoxError> {
    let (tx, rx) = oneshot::channel();
    let n = req.seqs.len();
    let (ids, fin, usage) = (vec![Vec::new(); n], vec![None; n], TokenUsage::default());
    let rn = req.id;
    let collect = Collect {
        queued: AtomicU32::new(0),
        parts: Mutex::new((Whole { ids, fin, usage }, Some(tx))),
    };
    let req = Submit {
        sink: Arc::new(collect),
        ..req
    };
    if sh.inbox.submit(&sh.engine, req).is_err() {
        return Ok(Err(shutting_down()));
    }
    let mut guard = CancelGuard(Some((sh.engine.clone(), rn)));
    let whole = rx.await;
    guard.0 = None;
    match whole {
        Ok(None) => {
            arm_reset(direct.conn.fd);
            Err(Box::new(ResetFault))
        }
        Ok(Some(w)) => Ok(Ok(w)),
        Err(_) => Ok(Err(shutting_down())),
    }
}

/// A sink that is never called: replaced by the one the answer needs.
struct NoSink;

impl Sink for NoSink {
    fn emit(&self, _: Emit, _: bool) -> bool {
        false
    }
    fn queued(&self) -> &AtomicU32 {
        static ZERO: AtomicU32 = AtomicU32::new(0);
        &ZERO
    }
}

/// `POST /v1/embeddings`: each input is prefilled by the engine (one token, not returned), then
/// answered whole ([`super::embed`]).
async fn embeddings(
    sh: Arc<Shared>,
    body: &[u8],
    direct: &StreamConn,
    arrival: Instant,
) -> Result<Reply, BoxError> {
    let raw: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Ok(error_response(
                400,
                &format!("JSON decode error: {e}"),
                None,
            ))
        }
    };
    let ask = match super::embed::ask(&raw, sh.embedding_dim) {
        Ok(a) => a,
        Err((m, f)) => return Ok(error_response(400, &m, Some(f))),
    };
    let parsed = parse_request_value(&Endpoint::Embeddings, &raw)
        .map_err(|e| reject(400, e, None))
        .and_then(|info| {
            if let Some(m) = info.model.as_ref().filter(|m| **m != sh.model) {
                let msg = format!("The model `{m}` does not exist.");
                return Err(reject(404, msg, Some("model")));
            }
            let mut out = Vec::new();
            if let Some(p) = info.prompt {
                prompt_ids(&sh, p, &mut out)?;
            }
            if out.is_empty() {
                return Err(reject(400, "field `input` is empty", Some("input")));
            }
            let info = RequestInfo {
                params: crate::trace::Params {
                    max_tokens: Some(1),
                    ignore_eos: Some(true),
                    ..Default::default()
                },
                ..Default::default()
            };
            sequences(&sh, &info, out)
        });
    let seqs = match parsed {
        Ok(s) => s,
        Err(r) => return Ok(r.into()),
    };
    let inputs: Vec<Arc<Vec<u32>>> = seqs.iter().map(|s| Arc::new(s.prompt.clone())).collect();
    let rn = sh.next_id.fetch_add(1, Relaxed);
    let req = Submit {
        id: rn,
        arrival,
        prompt_tokens: inputs.iter().map(|p| p.len() as u64).sum(),
        seqs,
        faults: FaultPlan::default(),
        sink: Arc::new(NoSink),
    };
    let hex = xxhash_rust::xxh3::xxh3_64_with_seed(&rn.to_le_bytes(), sh.seed ^ sh.started_unix);
    if let Err(r) = collect_whole(&sh, req, direct).await? {
        return Ok(r);
    }
    let id = format!("embd-{hex:016x}");
    let (model, seed) = (&sh.model, sh.seed);
    let body = super::embed::body(&id, unix_now(), model, seed, ask, &inputs);
    Ok(full(StatusCode::OK, "application/json", body))
}

async fn generate(
    sh: Arc<Shared>,
    body: &[u8],
    api: Api,
    forced: Option<FaultPlan>,
    direct: &StreamConn,
    arrival: Instant,
) -> Result<Reply, BoxError> {
    let rn = sh.next_id.fetch_add(1, Relaxed);
    let g = match parse_generate(&sh, body, api, rn) {
        Ok(g) => g,
        Err(r) => return Ok(r.into()),
    };
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
    let chat = api != Api::Completions;
    let kind = if chat { "chatcmpl" } else { "cmpl" };
    let hex = xxhash_rust::xxh3::xxh3_64_with_seed(&rn.to_le_bytes(), sh.seed ^ sh.started_unix);
    let head = Head {
        chat,
        id: format!("{kind}-{hex:016x}"),
        created: unix_now(),
        model: &sh.model,
        return_token_ids: g.return_token_ids,
    };
    let events = (api == Api::Responses).then(|| {
        Events::new(
            &format!("{hex:016x}"),
            head.created,
            &sh.model,
            g.max_tokens,
        )
    });
    let may_reset = plan.reset_after.is_some();
    let req = Submit {
        id: rn,
        arrival,
        seqs: g.seqs,
        prompt_tokens: g.prompt_tokens,
        faults: plan,
        sink: Arc::new(NoSink),
    };
    if !g.stream {
        let w = match collect_whole(&sh, req, direct).await? {
            Ok(w) => w,
            Err(r) => return Ok(r),
        };
        let body = match &events {
            Some(ev) => ev.whole(&whole_text(&sh, &g.shaped, &w, 0), &w.usage),
            None => whole_body(&sh, &head, &prompts, &w, g.shaped.as_deref()),
        };
        slow_headers(slow).await;
        return Ok(full(StatusCode::OK, "application/json", body));
    }
    let mut fmt = Fmt::new(
        &head,
        g.include_usage,
        sh.per_request_metrics,
        prompts,
        g.shaped,
    );
    let mut prelude = String::new();
    if let Some(mut ev) = events {
        ev.prelude(&mut prelude);
        fmt.responses = Some(ev);
    }
    let (tok, stats, engine) = (sh.tokenizer.clone(), sh.stats.clone(), sh.engine.clone());
    let st = Stream::new(fmt, tok, stats, engine, rn, may_reset, direct.framing);
    let req = Submit {
        sink: Arc::new(StreamSink(st.clone())),
        ..req
    };
    if sh.inbox.submit(&sh.engine, req).is_err() {
        return Ok(shutting_down());
    }
    stream_response(st, slow, direct, prelude.as_bytes()).await
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
    prelude: &[u8],
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
    // Events due at once (a response's `response.created`) go out with the head.
    match direct.framing {
        _ if prelude.is_empty() => {}
        BodyFraming::Chunked => super::emit::chunk(&mut hijack.head, prelude),
        BodyFraming::UntilClose => hijack.head.extend_from_slice(prelude),
    }
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

/// Choice `c`'s whole text: its script's, else its tokens rendered.
fn whole_text(sh: &Shared, shaped: &Option<Arc<Shaped>>, w: &Whole, c: usize) -> String {
    match shaped.as_ref().and_then(|s| s.scripts.get(c)) {
        Some(s) => s.text.clone(),
        None => {
            let mut text = String::new();
            sh.tokenizer
                .render(w.ids.get(c).map_or(&[][..], |v| v), &mut text);
            text
        }
    }
}

/// The JSON body of a whole (non-streamed) chat or completion answer.
fn whole_body<'a>(
    sh: &Shared,
    head: &Head,
    prompts: &'a [Arc<Vec<u32>>],
    w: &'a Whole,
    shaped: Option<&Shaped>,
) -> String {
    let chat = head.chat;
    let tids = |ids: &'a [u32]| head.return_token_ids.then_some(ids);
    let mut s = String::with_capacity(256);
    head.open(&mut s, false);
    for (c, ((prompt, ids), fin)) in prompts.iter().zip(&w.ids).zip(&w.fin).enumerate() {
        if c > 0 {
            s.push(',');
        }
        let script = shaped.and_then(|x| x.scripts.get(c));
        let mut text = String::new();
        match script {
            Some(sc) => text.push_str(&sc.text),
            None => sh.tokenizer.render(ids, &mut text),
        }
        let f = fin.unwrap_or(Finish::Length).as_str();
        let f = shaped.map_or(f, |x| x.finish(f));
        let tool = shaped.and_then(|x| x.tool());
        if chat {
            let _ = write!(
                s,
                "{{\"index\":{c},\"message\":{{\"role\":\"assistant\",\"content\":"
            );
            match tool {
                Some(_) => s.push_str("null"),
                None => json_str(&mut s, &text),
            }
            s.push_str(",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[");
            if let (Some(name), Some(x)) = (tool, shaped) {
                s.push_str("{\"id\":");
                json_str(&mut s, x.call_ids.get(c).map_or("", |v| v.as_str()));
                s.push_str(",\"type\":\"function\",\"function\":{\"name\":");
                json_str(&mut s, name);
                s.push_str(",\"arguments\":");
                json_str(&mut s, &text);
                s.push_str("}}");
            }
            s.push_str("],\"reasoning\":null}");
        } else {
            let _ = write!(s, "{{\"index\":{c},\"text\":");
            json_str(&mut s, &text);
        }
        s.push_str(",\"logprobs\":");
        match (shaped.and_then(|x| x.ask.logprobs), script) {
            (Some(lp), Some(sc)) => shape::logprobs_json(&mut s, lp, sc, 0, sc.len()),
            _ => s.push_str("null"),
        }
        let _ = write!(s, ",\"finish_reason\":\"{f}\",\"stop_reason\":");
        stop_reason(&mut s, script);
        s.push_str(",\"token_ids\":");
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
