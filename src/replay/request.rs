//! Building the HTTP request bodies of a replay, all of them before the clock starts.
//!
//! A trace request recorded with its body is replayed verbatim, except that `max_tokens` and
//! `ignore_eos` are set from the recorded output length (unless `--keep-original-limits`), streaming
//! with `stream_options.include_usage` is switched on (measurement needs the stream and the usage
//! chunk), and `--model` replaces the model when given. Otherwise the prompt is synthesised from
//! the request's hash ids ([`crate::synth`]): token ids on `/v1/completions` by default, or text
//! (completions `prompt` or a single chat user message) with a tokenizer. Defaults:
//! `max_tokens = output_length` (at least 1), `ignore_eos: true`, `stream: true`,
//! `stream_options.include_usage: true`; `--extra-body` keys are merged last and win. This module
//! does no I/O and knows nothing of timing.

use crate::metrics::Api;
use crate::synth::{Synth, TextBuilder, TextFidelity};
use crate::trace::{Endpoint, Request};
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// How prompts are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptMode {
    TokenIds,
    Text,
}

/// Where synthesised prompts come from.
pub enum Prompts {
    Tokens(Synth),
    Text(Box<TextBuilder>),
}

/// Options shared by every body.
pub struct BodyOptions {
    pub api: Api,
    pub model: String,
    /// `--model` was given explicitly (replaces the model of verbatim bodies too).
    pub model_override: bool,
    pub extra_body: Map<String, Value>,
    pub keep_original_limits: bool,
}

/// One ready-to-send request.
#[derive(Debug, Clone)]
pub struct BuiltRequest {
    /// Path relative to the target's base (`/v1/completions`).
    pub path: String,
    pub body: Bytes,
    pub api: Api,
    /// Prompt tokens as the trace says (what vLLM's `input_lens` reports).
    pub input_tokens: u64,
    /// `false` when a text prompt does not re-encode to exactly the synthesised tokens.
    pub exact_prompt: bool,
}

fn api_path(api: Api) -> &'static str {
    match api {
        Api::Completions => "/v1/completions",
        Api::Chat => "/v1/chat/completions",
    }
}

fn set_limits(obj: &mut Map<String, Value>, output_tokens: u64) {
    obj.remove("max_completion_tokens");
    obj.insert("max_tokens".into(), json!(output_tokens.max(1)));
    obj.insert("ignore_eos".into(), json!(true));
}

fn set_stream(obj: &mut Map<String, Value>) {
    obj.insert("stream".into(), json!(true));
    let so = obj.entry("stream_options").or_insert_with(|| json!({}));
    if !so.is_object() {
        *so = json!({});
    }
    if let Some(o) = so.as_object_mut() {
        o.insert("include_usage".into(), json!(true));
    }
}

/// Builds the request for trace request `req` (its index in the trace is `key`).
pub fn build(
    req: &Request,
    key: u64,
    opts: &BodyOptions,
    prompts: &Prompts,
) -> Result<BuiltRequest, String> {
    if let Some(body) = &req.body {
        return verbatim(req, body, opts);
    }
    let mut obj = Map::new();
    obj.insert("model".into(), json!(opts.model));
    let mut exact = true;
    let prompt_value = match prompts {
        Prompts::Tokens(s) => {
            if opts.api == Api::Chat {
                return Err(
                    "chat needs text prompts: give --prompt-mode text and --tokenizer".into(),
                );
            }
            json!(s.prompt(&req.hash_ids, req.input_tokens, key))
        }
        Prompts::Text(tb) => {
            let (text, fid) = tb.prompt_text(&req.hash_ids, req.input_tokens, key);
            exact = fid == TextFidelity::Exact;
            json!(text)
        }
    };
    match opts.api {
        Api::Completions => {
            obj.insert("prompt".into(), prompt_value);
        }
        Api::Chat => {
            obj.insert(
                "messages".into(),
                json!([{"role": "user", "content": prompt_value}]),
            );
        }
    }
    set_limits(&mut obj, req.output_tokens);
    set_stream(&mut obj);
    for (k, v) in &opts.extra_body {
        obj.insert(k.clone(), v.clone());
    }
    let body = serde_json::to_vec(&Value::Object(obj)).map_err(|e| e.to_string())?;
    Ok(BuiltRequest {
        path: api_path(opts.api).into(),
        body: Bytes::from(body),
        api: opts.api,
        input_tokens: req.input_tokens,
        exact_prompt: exact,
    })
}

fn verbatim(req: &Request, body: &[u8], opts: &BodyOptions) -> Result<BuiltRequest, String> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| format!("recorded body is not JSON: {e}"))?;
    let obj = v
        .as_object_mut()
        .ok_or("recorded body is not a JSON object")?;
    if opts.model_override || !obj.contains_key("model") {
        obj.insert("model".into(), json!(opts.model));
    }
    if !opts.keep_original_limits {
        set_limits(obj, req.output_tokens);
    }
    set_stream(obj);
    for (k, val) in &opts.extra_body {
        obj.insert(k.clone(), val.clone());
    }
    let (api, path) = match &req.endpoint {
        Endpoint::Chat => (Api::Chat, api_path(Api::Chat).to_string()),
        Endpoint::Completions => (Api::Completions, api_path(Api::Completions).to_string()),
        Endpoint::Other(p) => (Api::Completions, p.clone()),
    };
    Ok(BuiltRequest {
        path,
        body: Bytes::from(serde_json::to_vec(&v).map_err(|e| e.to_string())?),
        api,
        input_tokens: req.input_tokens,
        exact_prompt: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Vocab;

    fn opts(api: Api) -> BodyOptions {
        BodyOptions {
            api,
            model: "m".into(),
            model_override: false,
            extra_body: Map::new(),
            keep_original_limits: false,
        }
    }

    fn tokens() -> Prompts {
        Prompts::Tokens(Synth::new(Vocab::from_size(1000).unwrap(), 4, 0))
    }

    fn req() -> Request {
        Request {
            input_tokens: 10,
            output_tokens: 7,
            hash_ids: vec![1, 2, 3],
            ..Default::default()
        }
    }

    #[test]
    fn token_id_completion_defaults() {
        let b = build(&req(), 0, &opts(Api::Completions), &tokens()).unwrap();
        assert_eq!(b.path, "/v1/completions");
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["prompt"].as_array().unwrap().len(), 10);
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn extra_body_wins_and_zero_output_asks_one_token() {
        let mut o = opts(Api::Completions);
        o.extra_body.insert("temperature".into(), json!(0.5));
        o.extra_body.insert("ignore_eos".into(), json!(false));
        let mut r = req();
        r.output_tokens = 0;
        let v: Value = serde_json::from_slice(&build(&r, 0, &o, &tokens()).unwrap().body).unwrap();
        assert_eq!(v["temperature"], 0.5);
        assert_eq!(v["ignore_eos"], false);
        assert_eq!(v["max_tokens"], 1);
    }

    #[test]
    fn chat_with_token_ids_is_a_clear_error() {
        let e = build(&req(), 0, &opts(Api::Chat), &tokens()).unwrap_err();
        assert!(e.contains("--prompt-mode text"), "{e}");
    }

    #[test]
    fn verbatim_body_gets_limits_and_streaming() {
        let mut r = req();
        r.endpoint = Endpoint::Chat;
        r.body = Some(br#"{"model":"orig","messages":[{"role":"user","content":"hi"}],"max_tokens":99,"stream":false}"#.to_vec());
        let b = build(&r, 0, &opts(Api::Completions), &tokens()).unwrap();
        assert_eq!(b.path, "/v1/chat/completions");
        assert_eq!(b.api, Api::Chat);
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["model"], "orig");
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream"], true);
        assert_eq!(v["messages"][0]["content"], "hi");
        let mut o = opts(Api::Completions);
        o.keep_original_limits = true;
        o.model_override = true;
        let v: Value = serde_json::from_slice(&build(&r, 0, &o, &tokens()).unwrap().body).unwrap();
        assert_eq!(v["max_tokens"], 99);
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn chat_text_prompt() {
        let tok = crate::synth::test_tokenizer::word_level();
        let tb = TextBuilder::new(tok, 4, 0).unwrap();
        let b = build(&req(), 0, &opts(Api::Chat), &Prompts::Text(Box::new(tb))).unwrap();
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["messages"][0]["role"], "user");
        assert_eq!(
            v["messages"][0]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            11
        );
        assert!(b.exact_prompt);
    }
}
