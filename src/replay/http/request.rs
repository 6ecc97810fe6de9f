//! Building the HTTP requests of a replay (on the body builder's thread, [`crate::replay::plan::body`]).
//!
//! Each request is re-issued the way it was made: its recorded method, endpoint and (when the
//! trace holds it) body.
//! - A recorded body of a generation request is sent as recorded, except: `model` is replaced
//!   when `--model` is given; `max_tokens` (or `max_output_tokens` on `/v1/responses`) and
//!   `ignore_eos` are set from the recorded output length of one choice
//!   ([`Request::choice_output_tokens`]: with `n > 1`, not the total) unless
//!   `--keep-original-limits`; a
//!   streamed request gets `stream_options.include_usage: true` (measurement needs the usage
//!   chunk); `--extra-body` keys are merged last. `stream` stays as recorded.
//! - A request that failed in the recording is sent byte for byte as recorded (its model too),
//!   so that it fails again the same way; a body that is not a JSON object is sent as recorded.
//! - A request the client cancelled in the recording asks for its recorded `max_tokens` (its
//!   recorded length is only what came before the cancel) and carries its cut
//!   ([`crate::trace::Response::cut`]): the client closes it where the recording's did.
//! - Auxiliary requests (`--include-aux`: `/tokenize`, `GET /v1/models`, ...) are sent verbatim
//!   with their recorded method, path and body.
//! - Without a body the prompt is synthesised from the request's hash ids ([`crate::replay::plan::prompts`]):
//!   token ids on `/v1/completions` (and `/v1/embeddings`), or text (completions `prompt` or one
//!   chat user message) with a tokenizer, or from the target's own `/tokenize` and `/detokenize`
//!   without one ([`Prompts::Target`]); `max_tokens = output_length` (at least 1),
//!   `ignore_eos: true`, `stream: true`, `stream_options.include_usage: true`.
//!
//! Which requests are left out, and why, is [`crate::trace::select`]'s. This module does no I/O
//! (a [`TargetText`] does, on the body builder's thread) and knows nothing of timing.

use crate::metrics::Api;
use crate::replay::plan::prompts::{Synth, TextBuilder, TextFidelity};
use crate::trace::{Endpoint, Request};
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// How prompts are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PromptMode {
    TokenIds,
    Text,
}

/// Where synthesised prompts come from.
pub(crate) enum Prompts {
    Tokens(Synth),
    Text(Box<TextBuilder>),
    /// No local tokenizer: token ids as [`Prompts::Tokens`], but text from the target's own
    /// `/tokenize` and `/detokenize` ([`crate::replay::plan::servertext`]) for chat, and for every API when
    /// `all_text` (`--prompt-mode text`); `text` is `None` until the target has been probed.
    Target {
        tokens: Synth,
        text: Option<Box<dyn TargetText>>,
        all_text: bool,
    },
}

/// Text prompts made by the target's tokenizer ([`crate::replay::plan::servertext`]).
pub(crate) trait TargetText: Send + Sync {
    /// A prompt from `hash_ids` that the target counts as exactly `input_tokens` on `api` (its
    /// template and special tokens included), and whether it does.
    fn text(&self, hash_ids: &[u64], input_tokens: u64, key: u64, api: Api) -> (String, bool);
}

impl Prompts {
    /// A synthesised prompt for `api` is text from the target.
    pub(crate) fn text_from_target(&self, api: Api) -> bool {
        matches!(self, Prompts::Target { all_text, .. } if *all_text || api == Api::Chat)
    }
}

/// Tokens the target adds to a text prompt, per API (measured by [`crate::replay::http::overhead`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Overheads {
    pub(crate) completions: u64,
    pub(crate) chat: u64,
}

impl Overheads {
    pub(crate) fn of(&self, api: Api) -> u64 {
        match api {
            Api::Completions => self.completions,
            Api::Chat => self.chat,
        }
    }
}

/// Options shared by every body.
pub(crate) struct BodyOptions {
    /// `--endpoint`: the API for synthesised generation prompts (`None`: the recorded one).
    pub(crate) api: Option<Api>,
    pub(crate) model: String,
    /// `--model` was given explicitly (replaces the model of verbatim bodies too).
    pub(crate) model_override: bool,
    pub(crate) extra_body: Map<String, Value>,
    pub(crate) keep_original_limits: bool,
    /// What the target adds to a text prompt ([`crate::replay::http::overhead`]): synthesised text is that
    /// much shorter.
    pub(crate) overheads: Overheads,
}

/// One ready-to-send request.
#[derive(Debug, Clone)]
pub(crate) struct BuiltRequest {
    pub(crate) method: http::Method,
    /// An auxiliary request (`--include-aux`): sent and timed, its body not read as a response.
    pub(crate) aux: bool,
    /// Path relative to the target's base (`/v1/completions`).
    pub(crate) path: String,
    pub(crate) body: Bytes,
    pub(crate) api: Api,
    /// Prompt tokens as the trace says (what vLLM's `input_lens` reports).
    pub(crate) input_tokens: u64,
    /// `false` when a text prompt does not re-encode to exactly the synthesised tokens.
    pub(crate) exact_prompt: bool,
    /// Where to cut it: the client cancelled it in the recording ([`Response::cut`]); `None`
    /// for every other request, which is read to its end.
    ///
    /// [`Response::cut`]: crate::trace::Response::cut
    pub(crate) cut: Option<crate::trace::Cut>,
}

fn api_path(api: Api) -> &'static str {
    match api {
        Api::Completions => "/v1/completions",
        Api::Chat => "/v1/chat/completions",
    }
}

/// The metric rules for a recorded endpoint (chat's: every message counts for E2EL).
fn api_of(e: &Endpoint) -> Api {
    match e {
        Endpoint::Chat | Endpoint::Responses => Api::Chat,
        _ => Api::Completions,
    }
}

fn set_limits(obj: &mut Map<String, Value>, endpoint: &Endpoint, output_tokens: u64) {
    let key = match endpoint {
        Endpoint::Responses => "max_output_tokens",
        Endpoint::Embeddings | Endpoint::Other(_) => return,
        _ => "max_tokens",
    };
    obj.remove("max_completion_tokens");
    obj.insert(key.into(), json!(output_tokens.max(1)));
    obj.insert("ignore_eos".into(), json!(true));
}

fn set_stream(obj: &mut Map<String, Value>) {
    obj.insert("stream".into(), json!(true));
    set_include_usage(obj);
}

fn set_include_usage(obj: &mut Map<String, Value>) {
    let so = obj.entry("stream_options").or_insert_with(|| json!({}));
    if !so.is_object() {
        *so = json!({});
    }
    if let Some(o) = so.as_object_mut() {
        o.insert("include_usage".into(), json!(true));
    }
}

/// What [`build`] will make of `req`, without the body: method, path, API, whether it is a side
/// request; the same error `build` would give. Cheap: checked for every request before the
/// clock, while bodies are built during the run ([`crate::replay::plan::body`]).
pub(crate) fn head(
    req: &Request,
    opts: &BodyOptions,
    prompts: &Prompts,
) -> Result<BuiltRequest, String> {
    let as_recorded = !req.is_workload() || req.recorded_failure().is_some();
    if as_recorded || req.body.is_some() {
        return Ok(recorded_bytes(req, Vec::new()));
    }
    let embeddings = req.endpoint == Endpoint::Embeddings;
    let api = synthesised_api(req, opts);
    if api == Api::Chat && matches!(prompts, Prompts::Tokens(_)) {
        return Err(CHAT_NEEDS_TEXT.into());
    }
    Ok(BuiltRequest {
        method: http::Method::POST,
        aux: false,
        path: match embeddings {
            true => req.endpoint.path().to_string(),
            false => api_path(api).to_string(),
        },
        body: Bytes::new(),
        api,
        input_tokens: req.input_tokens,
        exact_prompt: true,
        cut: None,
    })
}

const CHAT_NEEDS_TEXT: &str = "chat needs text prompts: give --prompt-mode text and --tokenizer";
const TARGET_NOT_PROBED: &str = "text prompts from the target: its /tokenize was not probed";

/// The API of a synthesised prompt: `--endpoint`, else the recorded one (embeddings stay).
fn synthesised_api(req: &Request, opts: &BodyOptions) -> Api {
    match opts.api {
        Some(a) if req.endpoint != Endpoint::Embeddings => a,
        _ => api_of(&req.endpoint),
    }
}

/// Builds the request for trace request `req`; `key` (its position in the plan) seeds what its
/// hash ids do not fix of a synthesised prompt.
pub(crate) fn build(
    req: &Request,
    key: u64,
    opts: &BodyOptions,
    prompts: &Prompts,
) -> Result<BuiltRequest, String> {
    let as_recorded = !req.is_workload() || req.recorded_failure().is_some();
    let mut built = match &req.body {
        Some(body) if as_recorded => recorded_bytes(req, body.clone()),
        None if !req.is_workload() => recorded_bytes(req, Vec::new()),
        Some(body) => verbatim(req, body, opts),
        None => synthesised(req, key, opts, prompts)?,
    };
    // A request the client cancelled is cut where it was: the server sees the same abort.
    if req.is_workload() {
        built.cut = req
            .response
            .as_deref()
            .and_then(crate::trace::Response::cut);
    }
    Ok(built)
}

/// The recorded method, path and body, unchanged.
fn recorded_bytes(req: &Request, body: Vec<u8>) -> BuiltRequest {
    let method = req
        .method
        .as_deref()
        .and_then(|m| http::Method::from_bytes(m.as_bytes()).ok())
        .unwrap_or(http::Method::POST);
    BuiltRequest {
        method,
        aux: !req.is_workload(),
        path: req.endpoint.path().to_string(),
        body: Bytes::from(body),
        api: api_of(&req.endpoint),
        input_tokens: req.input_tokens,
        exact_prompt: true,
        cut: None,
    }
}

fn synthesised(
    req: &Request,
    key: u64,
    opts: &BodyOptions,
    prompts: &Prompts,
) -> Result<BuiltRequest, String> {
    let mut obj = Map::new();
    let model = match (&req.model, req.recorded_failure()) {
        (Some(m), Some(_)) if !opts.model_override => m.clone(),
        _ => opts.model.clone(),
    };
    obj.insert("model".into(), json!(model));
    let embeddings = req.endpoint == Endpoint::Embeddings;
    let api = synthesised_api(req, opts);
    let mut exact = true;
    let prompt_value = match prompts {
        Prompts::Target { text, .. } if prompts.text_from_target(api) => {
            let src = text.as_deref().ok_or(TARGET_NOT_PROBED)?;
            let (text, ok) = src.text(&req.hash_ids, req.input_tokens, key, api);
            exact = ok;
            json!(text)
        }
        Prompts::Tokens(s) | Prompts::Target { tokens: s, .. } => {
            if api == Api::Chat {
                return Err(CHAT_NEEDS_TEXT.into());
            }
            json!(s.prompt(&req.hash_ids, req.input_tokens, key))
        }
        Prompts::Text(tb) => {
            let n = req
                .input_tokens
                .saturating_sub(opts.overheads.of(api))
                .max(1);
            let (text, fid) = tb.prompt_text(&req.hash_ids, n, key);
            exact = fid == TextFidelity::Exact;
            json!(text)
        }
    };
    let path = if embeddings {
        obj.insert("input".into(), prompt_value);
        req.endpoint.path().to_string()
    } else {
        match api {
            Api::Completions => obj.insert("prompt".into(), prompt_value),
            Api::Chat => obj.insert(
                "messages".into(),
                json!([{"role": "user", "content": prompt_value}]),
            ),
        };
        let asked = cancelled_cap(req).unwrap_or(req.output_tokens);
        set_limits(&mut obj, &Endpoint::Completions, asked);
        set_stream(&mut obj);
        api_path(api).to_string()
    };
    for (k, v) in &opts.extra_body {
        obj.insert(k.clone(), v.clone());
    }
    let body = serde_json::to_vec(&Value::Object(obj)).map_err(|e| e.to_string())?;
    Ok(BuiltRequest {
        method: http::Method::POST,
        aux: false,
        path,
        body: Bytes::from(body),
        api,
        input_tokens: req.input_tokens,
        exact_prompt: exact,
        cut: None,
    })
}

/// The client cancelled `req` in the recording.
fn is_cancelled(req: &Request) -> bool {
    req.response.as_deref().is_some_and(|r| r.cancelled)
}

/// What a cancelled request asks for: its recorded `max_tokens` (the replay cuts it where the
/// recording did, so it must not end before that). `None` for other requests, or without a cap.
fn cancelled_cap(req: &Request) -> Option<u64> {
    is_cancelled(req)
        .then_some(req.params.max_tokens)
        .flatten()
        .map(u64::from)
}

/// A recorded generation or pooling body, adjusted as the module docs say.
fn verbatim(req: &Request, body: &[u8], opts: &BodyOptions) -> BuiltRequest {
    let mut v = match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return recorded_bytes(req, body.to_vec()),
    };
    let Some(obj) = v.as_object_mut() else {
        return recorded_bytes(req, body.to_vec());
    };
    if opts.model_override || !obj.contains_key("model") {
        obj.insert("model".into(), json!(opts.model));
    }
    if is_cancelled(req) {
        // Cut where the client went away: the recorded length is what came before the cut, not
        // what was asked, so the request asks for its recorded cap (or keeps its own limits).
        if let Some(cap) = cancelled_cap(req) {
            set_limits(obj, &req.endpoint, cap);
        }
    } else if !opts.keep_original_limits {
        // Each of `n` choices asks for its own recorded length, not the total over them.
        set_limits(obj, &req.endpoint, req.choice_output_tokens());
    }
    let streamed = obj.get("stream").and_then(Value::as_bool) == Some(true);
    if streamed && matches!(req.endpoint, Endpoint::Completions | Endpoint::Chat) {
        set_include_usage(obj);
    }
    for (k, val) in &opts.extra_body {
        obj.insert(k.clone(), val.clone());
    }
    let mut built = recorded_bytes(req, Vec::new());
    // Serialising a parsed JSON value cannot fail (no non-string keys, no NaN).
    built.body = Bytes::from(serde_json::to_vec(&v).unwrap_or_else(|_| body.to_vec()));
    built
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::plan::prompts::Vocab;

    fn opts(api: Api) -> BodyOptions {
        BodyOptions {
            api: Some(api),
            model: "m".into(),
            model_override: false,
            extra_body: Map::new(),
            keep_original_limits: false,
            overheads: Default::default(),
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

    /// `head` (checked for every request before the clock) says what `build` makes.
    #[test]
    fn head_agrees_with_build() {
        let mut reqs = vec![req()];
        let mut emb = req();
        emb.endpoint = Endpoint::Embeddings;
        let mut aux = req();
        aux.endpoint = Endpoint::parse("/tokenize");
        let mut rec = req();
        rec.endpoint = Endpoint::Chat;
        rec.method = Some("POST".into());
        rec.body = Some(br#"{"model":"x","messages":[]}"#.to_vec());
        reqs.extend([emb, aux, rec]);
        for api in [Api::Completions, Api::Chat] {
            for r in &reqs {
                let (h, b) = (
                    head(r, &opts(api), &tokens()),
                    build(r, 0, &opts(api), &tokens()),
                );
                match (h, b) {
                    (Ok(h), Ok(b)) => {
                        let key =
                            |x: &BuiltRequest| (x.method.clone(), x.aux, x.path.clone(), x.api);
                        assert_eq!(key(&h), key(&b), "{r:?}");
                    }
                    (Err(h), Err(b)) => assert_eq!(h, b),
                    (h, b) => panic!("{r:?}: head {h:?} but build {b:?}"),
                }
            }
        }
    }

    #[test]
    fn chat_with_token_ids_is_a_clear_error() {
        let e = build(&req(), 0, &opts(Api::Chat), &tokens()).unwrap_err();
        assert!(e.contains("--prompt-mode text"), "{e}");
    }

    #[test]
    fn verbatim_body_keeps_its_endpoint_and_stream_flag() {
        let mut r = req();
        r.endpoint = Endpoint::Chat;
        r.body = Some(br#"{"model":"orig","messages":[{"role":"user","content":"hi"}],"max_tokens":99,"stream":false}"#.to_vec());
        let b = build(&r, 0, &opts(Api::Completions), &tokens()).unwrap();
        assert_eq!(
            (b.method.as_str(), b.path.as_str()),
            ("POST", "/v1/chat/completions")
        );
        assert_eq!(b.api, Api::Chat);
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["model"], "orig");
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["messages"][0]["content"], "hi");
        let mut o = opts(Api::Completions);
        o.keep_original_limits = true;
        o.model_override = true;
        let v: Value = serde_json::from_slice(&build(&r, 0, &o, &tokens()).unwrap().body).unwrap();
        assert_eq!(v["max_tokens"], 99);
        assert_eq!(v["model"], "m");
        r.body = Some(br#"{"model":"orig","prompt":"hi","stream":true}"#.to_vec());
        r.endpoint = Endpoint::Completions;
        let v: Value = serde_json::from_slice(&build(&r, 0, &o, &tokens()).unwrap().body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    fn failed(r: &mut Request, status: u16) {
        r.response = Some(Box::new(crate::trace::Response {
            status,
            error: Some(format!("http_{status}")),
            ..Default::default()
        }));
    }

    #[test]
    fn recorded_failures_and_side_requests_go_out_as_recorded() {
        let mut r = req();
        r.model = Some("nope".into());
        let body = br#"{"model":"nope","prompt":[1,2],"max_tokens":5}"#;
        r.body = Some(body.to_vec());
        failed(&mut r, 404);
        let mut o = opts(Api::Completions);
        o.model_override = true;
        let b = build(&r, 0, &o, &tokens()).unwrap();
        assert_eq!(&b.body[..], &body[..]);
        // Without a body: the recorded model, so an unknown model fails again.
        r.body = None;
        let v: Value = serde_json::from_slice(
            &build(&r, 0, &opts(Api::Completions), &tokens())
                .unwrap()
                .body,
        )
        .unwrap();
        assert_eq!(v["model"], "nope");
        // A body that is not JSON is sent as it was.
        let mut r = req();
        r.body = Some(b"not json".to_vec());
        assert_eq!(&build(&r, 0, &o, &tokens()).unwrap().body[..], b"not json");
        // GET /v1/models, no body recorded.
        let mut r = req();
        r.method = Some("GET".into());
        r.endpoint = Endpoint::from_path("/v1/models");
        let b = build(&r, 0, &o, &tokens()).unwrap();
        assert_eq!(
            (b.method.as_str(), b.path.as_str(), b.body.len()),
            ("GET", "/v1/models", 0)
        );
        // POST /tokenize with its body.
        let mut r = req();
        r.endpoint = Endpoint::from_path("/tokenize");
        r.body = Some(br#"{"prompt":"hi"}"#.to_vec());
        let b = build(&r, 0, &o, &tokens()).unwrap();
        assert_eq!(
            (b.path.as_str(), &b.body[..]),
            ("/tokenize", &br#"{"prompt":"hi"}"#[..])
        );
    }

    #[test]
    fn the_recorded_endpoint_is_kept_unless_endpoint_is_forced() {
        let mut r = req();
        r.endpoint = Endpoint::Embeddings;
        let mut o = opts(Api::Completions);
        o.api = None;
        let b = build(&r, 0, &o, &tokens()).unwrap();
        assert_eq!(b.path, "/v1/embeddings");
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["input"].as_array().unwrap().len(), 10);
        assert!(v.get("stream").is_none());
        r.endpoint = Endpoint::Chat;
        assert!(build(&r, 0, &o, &tokens())
            .unwrap_err()
            .contains("--tokenizer"));
        r.endpoint = Endpoint::Completions;
        assert_eq!(build(&r, 0, &o, &tokens()).unwrap().path, "/v1/completions");
    }

    #[test]
    fn chat_text_prompt() {
        let tok = crate::replay::plan::prompts::test_tokenizer::word_level();
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

    /// The target's chat template and special tokens are taken off the synthesised text, so the
    /// server counts the recorded length; the intended length stays the trace's.
    #[test]
    fn text_prompts_leave_room_for_what_the_target_adds() {
        let words = |b: &BuiltRequest, api: Api| {
            let v: Value = serde_json::from_slice(&b.body).unwrap();
            let t = match api {
                Api::Chat => v["messages"][0]["content"].clone(),
                Api::Completions => v["prompt"].clone(),
            };
            t.as_str()
                .unwrap()
                .split(' ')
                .filter(|w| !w.is_empty())
                .count()
        };
        for (api, added) in [(Api::Chat, 4), (Api::Completions, 1)] {
            let tb = TextBuilder::new(
                crate::replay::plan::prompts::test_tokenizer::word_level(),
                4,
                0,
            )
            .unwrap();
            let mut o = opts(api);
            o.overheads = Overheads {
                completions: 1,
                chat: 4,
            };
            let r = req();
            let b = build(&r, 0, &o, &Prompts::Text(Box::new(tb))).unwrap();
            assert_eq!(words(&b, api) as u64, r.input_tokens - added, "{api:?}");
            assert_eq!(b.input_tokens, r.input_tokens);
        }
    }
}
