//! The OpenAI-compatible request and stream-chunk shapes retrace reads (as vLLM serves them).
//!
//! [`parse_request`] pulls from a request body what recording and simulation need (model, prompt as
//! token ids or text, chat messages, the sampling parameters that matter for replay);
//! [`parse_chunk`] pulls from one streamed SSE payload (or a non-streamed body) what measurement
//! needs (whether `choices` is non-empty, tokens carried, `usage`, vLLM's per-request `metrics` or
//! llama.cpp's `timings`, both read as one [`ServerMetrics`]);
//! [`parse_response_body`] the part of that a recording keeps of a non-streamed body.
//! Lenient by design: unknown fields are ignored; a wrong type for a field we use is an error
//! message naming the field. It does not tokenize, hash, or build requests.

use crate::trace::{Endpoint, Obj, Params, ServerMetrics, Usage};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

/// A `/v1/completions` prompt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Prompt {
    Text(String),
    TokenIds(Vec<u32>),
    /// A list of prompts (batched request).
    Batch(Vec<Prompt>),
}

/// What a request body says.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RequestInfo {
    pub(crate) model: Option<String>,
    /// Completions prompt, when present.
    pub(crate) prompt: Option<Prompt>,
    /// Chat messages, as sent.
    pub(crate) messages: Option<Vec<Value>>,
    pub(crate) params: Params,
}

fn field_err(name: &str, want: &str) -> String {
    format!("field `{name}` must be {want}")
}

/// Field `name` read by `get` (absent or null: `None`), or an error saying it must be `want`.
fn opt<T>(
    obj: &serde_json::Map<String, Value>,
    name: &str,
    want: &str,
    get: impl Fn(&Value) -> Option<T>,
) -> Result<Option<T>, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => get(v).map(Some).ok_or_else(|| field_err(name, want)),
    }
}

fn opt_u32(obj: &serde_json::Map<String, Value>, name: &str) -> Result<Option<u32>, String> {
    opt(obj, name, "a non-negative integer", |v| {
        u32::try_from(v.as_u64()?).ok()
    })
}

fn opt_bool(obj: &serde_json::Map<String, Value>, name: &str) -> Result<Option<bool>, String> {
    opt(obj, name, "a boolean", Value::as_bool)
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
pub(crate) fn parse_request(endpoint: &Endpoint, body: &[u8]) -> Result<RequestInfo, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    parse_request_value(endpoint, &v)
}

/// [`parse_request`] of a body already parsed as JSON.
pub(crate) fn parse_request_value(endpoint: &Endpoint, v: &Value) -> Result<RequestInfo, String> {
    let obj = v.as_object().ok_or("body is not a JSON object")?;
    let mut info = RequestInfo {
        model: opt(obj, "model", "a string", |v| v.as_str().map(str::to_string))?,
        ..Default::default()
    };
    let input = match endpoint {
        Endpoint::Chat => Some("messages"),
        Endpoint::Completions => Some("prompt"),
        Endpoint::Responses | Endpoint::Embeddings => Some("input"),
        Endpoint::Other(_) => None,
    };
    if let Some(name) = input {
        let v = obj
            .get(name)
            .ok_or_else(|| format!("field `{name}` is missing"))?;
        // `input`: text or a list of messages (responses); text, token ids or a batch
        // (embeddings).
        match (endpoint, v) {
            (Endpoint::Chat | Endpoint::Responses, Value::Array(m)) => {
                info.messages = Some(m.clone())
            }
            (Endpoint::Chat, _) => return Err(field_err(name, "a list")),
            (Endpoint::Responses, Value::String(t)) => info.prompt = Some(Prompt::Text(t.clone())),
            (Endpoint::Responses, _) => return Err(field_err(name, "text or a list of messages")),
            _ => info.prompt = Some(parse_prompt(v)?),
        }
    }
    let p = &mut info.params;
    p.max_tokens = opt_u32(obj, "max_tokens")?
        .or(opt_u32(obj, "max_completion_tokens")?)
        .or(opt_u32(obj, "max_output_tokens")?);
    p.min_tokens = opt_u32(obj, "min_tokens")?;
    p.n = opt_u32(obj, "n")?;
    p.ignore_eos = opt_bool(obj, "ignore_eos")?;
    p.stream = opt_bool(obj, "stream")?;
    p.temperature = opt(obj, "temperature", "a number", |v| Some(v.as_f64()? as f32))?;
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
pub(crate) struct FastCompletion {
    pub(crate) info: RequestInfo,
    /// `stream_options` is present and not null.
    pub(crate) stream_options_set: bool,
    /// `return_token_ids` (absent or null: false).
    pub(crate) return_token_ids: bool,
}

/// The fields of a token-id completion body, typed: serde reads a token array straight into a
/// `Vec<u32>` (a `Value` tree costs an allocation per token). Any other shape, type, a duplicate
/// key or malformed JSON is a serde error.
#[derive(Deserialize)]
struct TypedCompletion {
    model: Option<String>,
    prompt: Vec<u32>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    max_output_tokens: Option<u32>,
    min_tokens: Option<u32>,
    n: Option<u32>,
    ignore_eos: Option<bool>,
    stream: Option<bool>,
    temperature: Option<f64>,
    stream_options: Option<Obj<TypedStreamOptions>>,
    return_token_ids: Option<bool>,
    /// Fields that shape the mock's output: a body with any of them takes the general path.
    stop: Option<serde::de::IgnoredAny>,
    logprobs: Option<serde::de::IgnoredAny>,
    response_format: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct TypedStreamOptions {
    include_usage: Option<bool>,
}

/// The common `/v1/completions` request (a token-id prompt, fields of the expected types) read
/// into typed fields. `None` for anything else (a text or batched prompt, a wrong type, a
/// duplicate key, malformed JSON): use [`parse_request`], which decides and words the error.
/// Agrees with [`parse_request`] where it answers (tested).
pub(crate) fn parse_completion_fast(body: &[u8]) -> Option<FastCompletion> {
    // serde skips unread strings without checking their UTF-8; the general path refuses them.
    if !body.is_ascii() {
        std::str::from_utf8(body).ok()?;
    }
    let Obj(t): Obj<TypedCompletion> = serde_json::from_slice(body).ok()?;
    if t.stop.is_some() || t.logprobs.is_some() || t.response_format.is_some() {
        return None;
    }
    let info = RequestInfo {
        model: t.model,
        prompt: Some(Prompt::TokenIds(t.prompt)),
        params: Params {
            max_tokens: t
                .max_tokens
                .or(t.max_completion_tokens)
                .or(t.max_output_tokens),
            min_tokens: t.min_tokens,
            n: t.n,
            ignore_eos: t.ignore_eos,
            stream: t.stream,
            temperature: t.temperature.map(|x| x as f32),
            include_usage: t.stream_options.as_ref().and_then(|o| o.0.include_usage),
        },
        ..Default::default()
    };
    Some(FastCompletion {
        info,
        stream_options_set: t.stream_options.is_some(),
        return_token_ids: t.return_token_ids.unwrap_or(false),
    })
}

/// What one streamed chunk (or a whole non-streamed body) says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// `choices` is present and non-empty (vLLM's TTFT/ITL rule looks at exactly this), or the
    /// message carries text otherwise (a responses text delta), or is a whole pooling or
    /// responses answer.
    pub(crate) has_choices: bool,
    /// Tokens carried: the length of `token_ids` when the server sent them, else 1 per choice
    /// with non-empty text/content or a tool-call delta (0 for a role-only or usage-only chunk).
    pub(crate) tokens: u32,
    /// The first choice's `finish_reason`, if set.
    pub(crate) finish_reason: Option<String>,
    /// The `index` of the chunk's choice when it has exactly one (vLLM streams each choice of
    /// `n > 1` in chunks of its own), so that tokens can be counted by choice.
    pub(crate) choice: Option<u32>,
    pub(crate) usage: Option<Usage>,
    /// vLLM's `metrics`, else llama.cpp's `timings` ([`Timings`]).
    pub(crate) metrics: Option<ServerMetrics>,
    /// The chunk is an error object (`{"error": ...}` or `{"object": "error"}`).
    pub(crate) error: Option<String>,
}

/// llama.cpp's per-response `timings` object (on the last streamed chunk, or in the body), the
/// fields we read. `prompt_ms` runs from the slot's start on the prompt (after any wait in the
/// server's queue) to the first token, as vLLM's `time_to_first_token_ms` does.
#[derive(Deserialize)]
struct Timings {
    cache_n: Option<u64>,
    prompt_ms: Option<f64>,
    predicted_ms: Option<f64>,
    predicted_per_token_ms: Option<f64>,
    predicted_per_second: Option<f64>,
}

impl From<Timings> for ServerMetrics {
    fn from(t: Timings) -> Self {
        ServerMetrics {
            time_to_first_token_ms: t.prompt_ms,
            queue_time_ms: None,
            generation_time_ms: t.predicted_ms,
            mean_itl_ms: t.predicted_per_token_ms,
            tokens_per_second: t.predicted_per_second,
            cached_tokens: t.cache_n,
        }
    }
}

/// Parses one SSE `data:` payload (not `[DONE]`) or a non-streamed response body.
///
/// An ordinary chunk or body is read into typed fields ([`TypedChunk`]); an error object, or
/// anything serde refuses there (a wrong type, a duplicate key, malformed JSON), goes through
/// the general path over a `Value`, which decides. Both give the same answer wherever the typed
/// one answers (tested on the real vLLM streams and on generated chunks). Within a stream,
/// [`crate::wire::chunkmemo::ChunkMemo`] answers most chunks before they get here.
pub fn parse_chunk(data: &[u8]) -> Result<ChunkInfo, String> {
    match typed_chunk(data) {
        Some(info) => Ok(info),
        None => parse_chunk_general(data),
    }
}

/// A chunk's fields as [`parse_chunk_general`] reads them. A text field is `Option<Option<_>>`
/// (absent, null, a string) because the general path takes the first one *present*.
#[derive(Deserialize)]
struct TypedChunk<'a> {
    error: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    object: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Option<Vec<Obj<TypedChoice<'a>>>>,
    usage: Option<Obj<TypedUsage>>,
    metrics: Option<Obj<ServerMetrics>>,
    timings: Option<Obj<Timings>>,
    /// `/v1/responses` stream events: the event's `type`, its text `delta`, and the `response`
    /// (whose `usage` the `response.completed` event carries).
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Cow<'a, str>>,
    response: Option<Obj<TypedResponse>>,
    /// A pooling answer's results (`/v1/embeddings`: `"object": "list"`).
    data: Option<Vec<serde::de::IgnoredAny>>,
    /// A whole `/v1/responses` answer's items (`"object": "response"`).
    output: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Deserialize)]
struct TypedResponse {
    usage: Option<Obj<TypedUsage>>,
}

#[derive(Deserialize)]
struct TypedChoice<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
    token_ids: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(borrow, default, deserialize_with = "present")]
    text: Option<Option<Cow<'a, str>>>,
    #[serde(borrow)]
    delta: Option<Obj<TypedText<'a>>>,
    #[serde(borrow)]
    message: Option<Obj<TypedText<'a>>>,
}

#[derive(Deserialize)]
struct TypedText<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    content: Option<Option<Cow<'a, str>>>,
    #[serde(borrow, default, deserialize_with = "present")]
    reasoning_content: Option<Option<Cow<'a, str>>>,
    /// A streamed tool call's pieces (a delta with no text).
    tool_calls: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Deserialize)]
struct TypedUsage {
    #[serde(default, alias = "input_tokens")]
    prompt_tokens: u64,
    #[serde(default, alias = "output_tokens")]
    completion_tokens: u64,
}

/// A `/v1/responses` stream event that carries generated text (it counts as vLLM counts a chunk
/// with choices).
fn is_text_delta(kind: &str) -> bool {
    kind.ends_with("output_text.delta") || kind.ends_with("reasoning_text.delta")
}

/// A `/v1/responses` stream event that reports a failure.
fn is_error_event(kind: &str) -> bool {
    kind == "error" || kind == "response.failed"
}

/// A field that is there, null or not: `Some(None)` for null (an absent one stays `None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Largest usage count believed (the readers' bound on a token count, 10^7): a server's
/// larger (or negative, or fractional) count makes the chunk malformed.
pub(crate) const MAX_USAGE: u64 = crate::trace::rows::MAX_TOKENS;

/// How [`parse_chunk`]'s error for a usage count out of bounds begins.
pub(crate) const USAGE_ERROR: &str = "usage.";

/// The typed reading of [`parse_chunk`]; `None` where the general path must decide.
fn typed_chunk(data: &[u8]) -> Option<ChunkInfo> {
    // serde skips unread strings without checking their UTF-8; the general path refuses them.
    if !data.is_ascii() {
        std::str::from_utf8(data).ok()?;
    }
    let Obj(c): Obj<TypedChunk<'_>> = serde_json::from_slice(data).ok()?;
    let kind = c.kind.as_deref().unwrap_or("");
    if c.error.is_some() || c.object.as_deref() == Some("error") || is_error_event(kind) {
        return None;
    }
    let usage = c.usage.or_else(|| c.response.and_then(|r| r.0.usage));
    // Counts over the bound are the general path's to refuse.
    if usage
        .as_ref()
        .is_some_and(|Obj(u)| u.prompt_tokens > MAX_USAGE || u.completion_tokens > MAX_USAGE)
    {
        return None;
    }
    let mut info = ChunkInfo {
        usage: usage.map(|Obj(u)| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
        }),
        metrics: match (c.metrics, c.timings) {
            (Some(Obj(m)), _) => Some(m),
            (None, t) => t.map(|Obj(t)| t.into()),
        },
        ..Default::default()
    };
    let choices = c.choices.unwrap_or_default();
    info.has_choices = !choices.is_empty();
    info.finish_reason = choices
        .first()
        .and_then(|c| c.0.finish_reason.as_deref().map(str::to_string));
    if let [one] = choices.as_slice() {
        info.choice = one.0.index.and_then(|k| u32::try_from(k).ok());
    }
    for c in &choices {
        info.tokens = info.tokens.checked_add(c.0.tokens())?;
    }
    if is_text_delta(kind) {
        info.has_choices = true;
        info.tokens += u32::from(c.delta.is_some_and(|d| !d.is_empty()));
    }
    let items = match c.object.as_deref() {
        Some("list") => c.data,
        Some("response") => c.output,
        _ => None,
    };
    if items.is_some_and(|d| !d.is_empty()) {
        info.has_choices = true;
    }
    Some(info)
}

impl TypedChoice<'_> {
    /// `token_ids`' length, else 1 if the first present of `text`, `delta.content`,
    /// `delta.reasoning_content`, `message.content` is a non-empty string, or `delta.tool_calls` is a
    /// non-empty list.
    fn tokens(&self) -> u32 {
        if let Some(ids) = &self.token_ids {
            return ids.len() as u32;
        }
        let delta = self.delta.as_ref().map(|d| &d.0);
        let text = self
            .text
            .as_ref()
            .or_else(|| delta.and_then(|d| d.content.as_ref()))
            .or_else(|| delta.and_then(|d| d.reasoning_content.as_ref()))
            .or_else(|| self.message.as_ref().and_then(|m| m.0.content.as_ref()));
        let call = delta
            .and_then(|d| d.tool_calls.as_ref())
            .is_some_and(|c| !c.is_empty());
        u32::from(text.is_some_and(|t| t.as_deref().is_some_and(|t| !t.is_empty())) || call)
    }
}

/// The general reading of [`parse_chunk`], over a `Value`: error objects and every shape.
fn parse_chunk_general(data: &[u8]) -> Result<ChunkInfo, String> {
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("chunk is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("chunk is not a JSON object")?;
    let mut info = ChunkInfo::default();
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    if let Some(e) = obj.get("error").filter(|e| !e.is_null()) {
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
    } else if is_error_event(kind) {
        let e = &v["response"]["error"]["message"];
        info.error = Some(
            v["message"]
                .as_str()
                .or(e.as_str())
                .unwrap_or(kind)
                .to_string(),
        );
    }
    if let Some(Value::Array(choices)) = obj.get("choices") {
        info.has_choices = !choices.is_empty();
        if let [one] = choices.as_slice() {
            let index = one.get("index").and_then(Value::as_u64);
            info.choice = index.and_then(|k| u32::try_from(k).ok());
        }
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
            let call = (c.get("delta").and_then(|d| d.get("tool_calls")))
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if text.and_then(Value::as_str).is_some_and(|t| !t.is_empty()) || call {
                info.tokens += 1;
            }
        }
    }
    if is_text_delta(kind) {
        info.has_choices = true;
        info.tokens += u32::from(
            obj.get("delta")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.is_empty()),
        );
    }
    // A pooling answer (embeddings) or a whole responses answer is its one content message.
    let items = match obj.get("object").and_then(Value::as_str) {
        Some("list") => obj.get("data"),
        Some("response") => obj.get("output"),
        _ => None,
    };
    if items
        .and_then(Value::as_array)
        .is_some_and(|d| !d.is_empty())
    {
        info.has_choices = true;
    }
    let usage = obj.get("usage").filter(|u| !u.is_null()).or_else(|| {
        obj.get("response")
            .and_then(|r| r.get("usage"))
            .filter(|u| !u.is_null())
    });
    if let Some(u) = usage {
        // Chat and completions name them prompt/completion tokens, responses input/output.
        let g = |k: &str, alias: &str| -> Result<u64, String> {
            match u.get(k).or_else(|| u.get(alias)) {
                None | Some(Value::Null) => Ok(0),
                Some(v) => v.as_u64().filter(|n| *n <= MAX_USAGE).ok_or_else(|| {
                    let v = crate::trace::clip(&v.to_string()).into_owned();
                    format!("{USAGE_ERROR}{k} is {v}, not a token count (0 to {MAX_USAGE})")
                }),
            }
        };
        info.usage = Some(Usage {
            prompt_tokens: g("prompt_tokens", "input_tokens")?,
            completion_tokens: g("completion_tokens", "output_tokens")?,
        });
    }
    if let Some(m) = obj.get("metrics").filter(|m| m.is_object()) {
        info.metrics = serde_json::from_value(m.clone()).ok();
    } else if let Some(t) = obj.get("timings").filter(|t| t.is_object()) {
        info.metrics = serde_json::from_value::<Timings>(t.clone())
            .ok()
            .map(Into::into);
    }
    Ok(info)
}

/// What a non-streamed response body says that a recording keeps: [`ChunkInfo`] without what
/// only a streamed event needs (whether it has choices, tokens, finish reason).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyInfo {
    pub(crate) usage: Option<Usage>,
    pub(crate) metrics: Option<ServerMetrics>,
    /// The body is an error object (as [`ChunkInfo::error`]).
    pub(crate) error: Option<String>,
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

/// [`parse_chunk`] of a whole non-streamed response body, keeping only [`BodyInfo`].
pub fn parse_response_body(data: &[u8]) -> Result<BodyInfo, String> {
    parse_chunk(data).map(BodyInfo::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::SseParser;

    fn events(raw: &[u8]) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.feed(raw, |e| out.push(e.unwrap().data));
        out
    }

    #[test]
    fn usage_counts_are_bounded() {
        let chunk = |n: &str| {
            format!(r#"{{"choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":{n}}}}}"#)
        };
        let ok = parse_chunk(chunk("10000000").as_bytes()).unwrap();
        assert_eq!(ok.usage.unwrap().completion_tokens, 10_000_000);
        for bad in [
            "10000001",
            "18446744073709551615",
            "1e30",
            "-7",
            "1.5",
            "\"3\"",
        ] {
            let e = parse_chunk(chunk(bad).as_bytes()).unwrap_err();
            assert!(
                e.starts_with(USAGE_ERROR) && e.contains("completion_tokens"),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            parse_chunk(br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":null}}"#)
                .unwrap()
                .usage
                .unwrap()
                .completion_tokens,
            0
        );
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
        assert_eq!(answered, 6);
    }

    /// Property: bodies built from the fields a completion carries, with values of right and
    /// wrong types, duplicates and unknown keys: wherever the typed path answers, it says what
    /// the general path says.
    #[test]
    fn fast_completion_agrees_on_generated_bodies() {
        use proptest::prelude::*;
        // Mostly values of the key's type, sometimes one of any type.
        let typed = |k: &'static str| -> Vec<&'static str> {
            match k {
                "model" => vec!["null", "\"m\"", "\"\\u00e9\""],
                "prompt" => vec!["[]", "[1,2]", "[7]"],
                "ignore_eos" | "stream" | "return_token_ids" => vec!["null", "true", "false"],
                "temperature" => vec!["null", "0", "0.5"],
                "stream_options" => vec!["null", "{}", "{\"include_usage\":true}"],
                "extra" => vec!["{\"x\":[1]}", "\"s\""],
                _ => vec!["null", "0", "7", "12"],
            }
        };
        let any = vec![
            "null",
            "true",
            "-1",
            "4294967296",
            "0.5",
            "\"m\"",
            "[\"a\"]",
            "[[1]]",
            "{}",
            "[true]",
        ];
        let field = prop::sample::select(vec![
            "model",
            "prompt",
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "min_tokens",
            "n",
            "ignore_eos",
            "stream",
            "temperature",
            "stream_options",
            "return_token_ids",
            "extra",
        ])
        .prop_flat_map(move |k| {
            let v = prop_oneof![
                9 => prop::sample::select(typed(k)),
                1 => prop::sample::select(any.clone()),
            ];
            (Just(k), v)
        });
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 2000,
            ..Default::default()
        });
        runner
            .run(&proptest::collection::vec(field, 0..8), |fields| {
                let body = format!(
                    "{{{}}}",
                    fields
                        .iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                if let Some(f) = parse_completion_fast(body.as_bytes()) {
                    let general = parse_request(&Endpoint::Completions, body.as_bytes());
                    prop_assert_eq!(Ok(f.info), general, "{}", body);
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn real_vllm_completion_stream() {
        let evs = events(include_bytes!(
            "../../fixtures/vllm/completions_tokenids_stream.sse"
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
        let evs = events(include_bytes!("../../fixtures/vllm/chat_stream.sse"));
        let first = parse_chunk(evs[0].as_bytes()).unwrap();
        assert!(first.has_choices);
        assert_eq!(first.tokens, 0);
        assert_eq!(parse_chunk(evs[1].as_bytes()).unwrap().tokens, 1);
    }

    #[test]
    fn token_ids_count_tokens() {
        let evs = events(include_bytes!(
            "../../fixtures/vllm/return_token_ids_stream.sse"
        ));
        assert_eq!(parse_chunk(evs[0].as_bytes()).unwrap().tokens, 1);
    }

    /// Every data payload of the real vLLM 0.32 streams (fixtures/vllm, copies of
    /// ../shared/vllm-samples), the usage+metrics chunk and the non-streamed bodies included,
    /// and of the real llama.cpp streams (fixtures/llamacpp).
    fn real_chunks() -> Vec<String> {
        let mut out = Vec::new();
        for raw in [
            &include_bytes!("../../fixtures/vllm/completions_tokenids_stream.sse")[..],
            include_bytes!("../../fixtures/vllm/chat_stream.sse"),
            include_bytes!("../../fixtures/vllm/completions_text_stream.sse"),
            include_bytes!("../../fixtures/vllm/return_token_ids_stream.sse"),
            include_bytes!("../../fixtures/llamacpp/completions_stream.sse"),
            include_bytes!("../../fixtures/llamacpp/completions_stream_cached.sse"),
            include_bytes!("../../fixtures/llamacpp/chat_stream.sse"),
        ] {
            out.extend(events(raw).into_iter().filter(|d| d != "[DONE]"));
        }
        let txt = include_str!("../../fixtures/vllm/per_request_metrics_example.txt");
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

    /// The typed path answers every real chunk, and as the general path does.
    #[test]
    fn typed_chunk_agrees_with_general_path_on_real_chunks() {
        let chunks = real_chunks();
        assert!(chunks.len() > 10);
        for d in &chunks {
            let typed = typed_chunk(d.as_bytes()).unwrap_or_else(|| panic!("not typed: {d}"));
            assert_eq!(Ok(typed), parse_chunk_general(d.as_bytes()), "{d}");
        }
        for e in [
            &br#"{"error":{"message":"x"}}"#[..],
            br#"{"object":"error","message":"x"}"#,
        ] {
            assert!(typed_chunk(e).is_none());
            assert_eq!(parse_chunk(e).unwrap().error.as_deref(), Some("x"));
        }
    }

    /// Property: chunks built from the fields the reader looks at, with values of right and
    /// wrong types, nulls and duplicates: wherever the typed path answers, it says what the
    /// general path says.
    #[test]
    fn typed_chunk_agrees_on_generated_chunks() {
        use proptest::prelude::*;
        let text = || {
            prop::sample::select(vec![
                "null",
                "\"\"",
                "\"a\"",
                "\"\\u00e9\"",
                "1",
                "[]",
                "{}",
            ])
        };
        let inner = |keys: Vec<&'static str>| {
            proptest::collection::vec((prop::sample::select(keys), text()), 0..3).prop_map(|kv| {
                let f: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", f.join(","))
            })
        };
        let delta = prop_oneof![
            Just("null".to_string()),
            Just("[\"a\"]".to_string()),
            inner(vec!["content", "reasoning_content", "role"]),
        ];
        let choice_field = prop_oneof![
            (Just("text"), text().prop_map(str::to_string)),
            (Just("finish_reason"), text().prop_map(str::to_string)),
            (
                Just("token_ids"),
                prop::sample::select(vec!["null", "[]", "[1,2]", "3"]).prop_map(str::to_string)
            ),
            (Just("delta"), delta.clone()),
            (Just("message"), delta),
        ];
        let choice = proptest::collection::vec(choice_field, 0..4).prop_map(|kv| {
            let f: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", f.join(","))
        });
        let top = prop_oneof![
            (
                Just("choices"),
                proptest::collection::vec(
                    prop_oneof![9 => choice, 1 => Just("[1]".to_string())],
                    0..3
                )
                .prop_map(|c| format!("[{}]", c.join(",")))
            ),
            (
                Just("usage"),
                prop::sample::select(vec![
                    "null",
                    "{}",
                    "{\"prompt_tokens\":3,\"completion_tokens\":4}",
                    "{\"prompt_tokens\":-1}",
                    "5",
                    "[5]",
                    "[]",
                ])
                .prop_map(str::to_string)
            ),
            (
                Just("metrics"),
                prop::sample::select(vec![
                    "null",
                    "{}",
                    "{\"queue_time_ms\":0.5}",
                    "{\"queue_time_ms\":\"x\"}",
                    "[]",
                ])
                .prop_map(str::to_string)
            ),
            (
                Just("timings"),
                prop::sample::select(vec![
                    "null",
                    "{}",
                    "{\"cache_n\":3,\"prompt_ms\":1.5}",
                    "{\"cache_n\":-1}",
                    "[]",
                ])
                .prop_map(str::to_string)
            ),
            (
                Just("object"),
                prop::sample::select(vec!["\"text_completion\"", "\"error\"", "1"])
                    .prop_map(str::to_string)
            ),
            (
                Just("error"),
                prop::sample::select(vec!["null", "{\"message\":\"x\"}"]).prop_map(str::to_string)
            ),
            (
                Just("type"),
                prop::sample::select(vec![
                    "\"response.output_text.delta\"",
                    "\"response.completed\"",
                    "\"error\"",
                    "3",
                ])
                .prop_map(str::to_string)
            ),
            (
                Just("delta"),
                prop::sample::select(vec!["\"\"", "\"a\"", "null", "{}"]).prop_map(str::to_string)
            ),
            (
                Just("response"),
                prop::sample::select(vec![
                    "null",
                    "{}",
                    "{\"usage\":{\"input_tokens\":4,\"output_tokens\":2}}",
                    "{\"usage\":null}",
                    "\"r\"",
                ])
                .prop_map(str::to_string)
            ),
        ];
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 3000,
            ..Default::default()
        });
        let answered = std::cell::Cell::new(0usize);
        runner
            .run(&proptest::collection::vec(top, 0..4), |kv| {
                let f: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                let chunk = format!("{{{}}}", f.join(","));
                if let Some(t) = typed_chunk(chunk.as_bytes()) {
                    answered.set(answered.get() + 1);
                    prop_assert_eq!(Ok(t), parse_chunk_general(chunk.as_bytes()), "{}", chunk);
                }
                Ok(())
            })
            .unwrap();
        let answered = answered.get();
        assert!(answered > 300, "the typed path answered {answered} chunks");
    }

    /// A `/v1/responses` stream in the Responses API's event shapes (as vLLM and OpenAI send
    /// them): text deltas count as content (TTFT, ITL, one token each), the other events do not,
    /// and `response.completed` carries the usage as input/output tokens; a non-streamed
    /// response body's usage reads the same way.
    #[test]
    fn responses_stream_events_count_deltas_and_read_usage() {
        let events = [
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}"#,
            r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"message","content":[]}}"#,
            r#"{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hel"}"#,
            r#"{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"lo"}"#,
            r#"{"type":"response.output_text.done","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello"}"#,
            r#"{"type":"response.completed","sequence_number":5,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":7,"output_tokens":2,"total_tokens":9}}}"#,
        ];
        let infos: Vec<ChunkInfo> = events
            .iter()
            .map(|e| {
                let typed = typed_chunk(e.as_bytes()).unwrap_or_else(|| panic!("not typed: {e}"));
                assert_eq!(Ok(typed.clone()), parse_chunk_general(e.as_bytes()), "{e}");
                typed
            })
            .collect();
        let content: Vec<bool> = infos.iter().map(|c| c.has_choices).collect();
        assert_eq!(content, [false, false, true, true, false, false]);
        assert_eq!(infos.iter().map(|c| c.tokens).sum::<u32>(), 2);
        let usage = Usage {
            prompt_tokens: 7,
            completion_tokens: 2,
        };
        assert_eq!(infos[5].usage, Some(usage));
        assert_eq!(infos[0].usage, None);
        let body = br#"{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"Hello"}]}],"usage":{"input_tokens":7,"output_tokens":2}}"#;
        assert_eq!(parse_response_body(body).unwrap().usage, Some(usage));
        // A whole responses answer, or an embeddings answer, is one content message.
        let emb = br#"{"id":"embd-1","object":"list","data":[{"index":0,"object":"embedding","embedding":[0.5]}],"usage":{"prompt_tokens":3,"total_tokens":3}}"#;
        for whole in [&body[..], &emb[..]] {
            let typed = typed_chunk(whole).unwrap();
            assert!(typed.has_choices);
            assert_eq!(Ok(typed), parse_chunk_general(whole));
        }
        let call = br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]},"finish_reason":null}]}"#;
        let typed = typed_chunk(call).unwrap();
        assert_eq!((typed.has_choices, typed.tokens), (true, 1));
        assert_eq!(Ok(typed), parse_chunk_general(call));
        let empty = br#"{"object":"list","data":[]}"#;
        assert!(!parse_chunk(empty).unwrap().has_choices);
        let failed = br#"{"type":"response.failed","response":{"error":{"message":"boom"}}}"#;
        assert_eq!(parse_chunk(failed).unwrap().error.as_deref(), Some("boom"));
    }

    #[test]
    fn metrics_object_on_usage_chunk() {
        let txt = include_str!("../../fixtures/vllm/per_request_metrics_example.txt");
        let line = txt
            .lines()
            .find(|l| l.starts_with("data: ") && l.contains("metrics"))
            .unwrap();
        let c = parse_chunk(&line.as_bytes()[6..]).unwrap();
        let m = c.metrics.unwrap();
        assert!((m.queue_time_ms.unwrap() - 0.02688).abs() < 1e-6);
        assert!(m.time_to_first_token_ms.unwrap() > 2.0);
    }

    /// llama.cpp's `timings` (real llama-server streams) are read as server metrics: `prompt_ms`
    /// as the server TTFT, `cache_n` as the prefix-cache hit; there is no queue time.
    #[test]
    fn llamacpp_timings_are_server_metrics() {
        let last = |raw: &[u8]| {
            let evs = events(raw);
            let d = evs.iter().find(|d| d.contains("\"timings\"")).unwrap();
            parse_chunk(d.as_bytes()).unwrap()
        };
        let cold = last(include_bytes!(
            "../../fixtures/llamacpp/completions_stream.sse"
        ));
        let m = cold.metrics.unwrap();
        assert_eq!(m.cached_tokens, Some(0));
        assert_eq!(m.time_to_first_token_ms, Some(2.652));
        assert_eq!(m.queue_time_ms, None);
        assert_eq!(m.generation_time_ms, Some(1.207));
        assert_eq!(cold.usage.unwrap().prompt_tokens, 48);
        assert!(cold.has_choices, "the finish chunk carries the timings");
        let warm = last(include_bytes!(
            "../../fixtures/llamacpp/completions_stream_cached.sse"
        ));
        assert_eq!(warm.metrics.unwrap().cached_tokens, Some(47));
        // chat, streamed without include_usage: timings still arrive, usage does not
        let chat = last(include_bytes!("../../fixtures/llamacpp/chat_stream.sse"));
        assert_eq!(chat.usage, None);
        assert_eq!(chat.metrics.unwrap().time_to_first_token_ms, Some(1.078));
        // vLLM's metrics win when a body has both
        let both = br#"{"choices":[],"metrics":{"queue_time_ms":1.0},"timings":{"cache_n":5}}"#;
        let m = parse_chunk(both).unwrap().metrics.unwrap();
        assert_eq!((m.queue_time_ms, m.cached_tokens), (Some(1.0), None));
        assert_eq!(Ok(parse_chunk(both).unwrap()), parse_chunk_general(both));
    }
}
