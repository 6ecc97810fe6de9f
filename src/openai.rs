//! The OpenAI-compatible request and stream-chunk shapes retrace reads (as vLLM serves them).
//!
//! [`parse_request`] pulls from a request body what recording and simulation need (model, prompt as
//! token ids or text, chat messages, the sampling parameters that matter for replay);
//! [`parse_chunk`] pulls from one streamed SSE payload (or a non-streamed body) what measurement
//! needs (whether `choices` is non-empty, tokens carried, `usage`, vLLM's per-request `metrics`).
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
        Endpoint::Other(_) => {}
    }
    let p = &mut info.params;
    p.max_tokens = opt_u32(obj, "max_tokens")?.or(opt_u32(obj, "max_completion_tokens")?);
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

/// The common chunk shape, borrowed: the fast path of [`parse_chunk`] (no allocation for ordinary
/// content chunks). Anything unusual (an error, `metrics`, `token_ids`, a type we do not expect)
/// falls back to the general path.
#[derive(serde::Deserialize)]
struct FastChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<FastChoice<'a>>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    metrics: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
    #[serde(default, borrow)]
    object: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct FastChoice<'a> {
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<FastDelta<'a>>,
    #[serde(default, borrow)]
    message: Option<FastDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    token_ids: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct FastDelta<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
}

fn parse_chunk_fast(data: &[u8]) -> Option<ChunkInfo> {
    let c: FastChunk = serde_json::from_slice(data).ok()?;
    if c.metrics.is_some() || c.error.is_some() || c.object.as_deref() == Some("error") {
        return None;
    }
    let mut info = ChunkInfo {
        usage: c.usage,
        ..Default::default()
    };
    if let Some(choices) = c.choices {
        info.has_choices = !choices.is_empty();
        for (k, ch) in choices.into_iter().enumerate() {
            if ch.token_ids.is_some() {
                return None;
            }
            if k == 0 {
                info.finish_reason = ch.finish_reason.map(|f| f.into_owned());
            }
            let text = ch
                .text
                .or_else(|| ch.delta.as_ref().and_then(|d| d.content.clone()))
                .or_else(|| ch.delta.as_ref().and_then(|d| d.reasoning_content.clone()))
                .or_else(|| ch.message.as_ref().and_then(|d| d.content.clone()));
            if text.is_some_and(|t| !t.is_empty()) {
                info.tokens += 1;
            }
        }
    }
    Some(info)
}

/// Parses one SSE `data:` payload (not `[DONE]`) or a non-streamed response body.
pub fn parse_chunk(data: &[u8]) -> Result<ChunkInfo, String> {
    if let Some(info) = parse_chunk_fast(data) {
        return Ok(info);
    }
    parse_chunk_general(data)
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

    /// The fast path and the general path agree on every real vLLM chunk.
    #[test]
    fn fast_path_agrees_with_general_path() {
        for raw in [
            &include_bytes!("../fixtures/vllm/completions_tokenids_stream.sse")[..],
            include_bytes!("../fixtures/vllm/chat_stream.sse"),
            include_bytes!("../fixtures/vllm/completions_text_stream.sse"),
            include_bytes!("../fixtures/vllm/return_token_ids_stream.sse"),
        ] {
            for d in events(raw).iter().filter(|d| d.as_str() != "[DONE]") {
                let general = parse_chunk_general(d.as_bytes()).unwrap();
                if let Some(fast) = parse_chunk_fast(d.as_bytes()) {
                    assert_eq!(fast, general, "{d}");
                }
                assert_eq!(parse_chunk(d.as_bytes()).unwrap(), general);
            }
        }
        assert!(parse_chunk_fast(br#"{"choices":[{"text":"a"}]}"#).is_some());
        assert!(parse_chunk_fast(br#"{"error":{"message":"x"}}"#).is_none());
        assert!(parse_chunk_fast(
            br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2},"metrics":{}}"#
        )
        .is_none());
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
