//! What a request asks of its output beyond a number of tokens, and the text that answers it:
//! JSON mode (`response_format`), a tool call (`tools`), stop strings (`stop`) and `logprobs`.
//! Such a request's output is decided whole when it arrives (the engine's tokens are a function
//! of the seed, `super::sched::token_id`): one [`Script`] per choice gives each output token its
//! piece of text, and a stop string found in it ends the choice early
//! (`SeqIn::stop_after`). A plain request has no script (its tokens render as they come).
//! Shapes follow vLLM 0.32 (docs/mock.md, "Output shapes"). No I/O, no routes.

use super::format::json_str;
use super::tokenize::{Tokenizer, WORDS};
use serde_json::Value;
use std::fmt::Write;

/// Most top log-probabilities a token may ask for (vLLM's default `--max-logprobs`).
pub(crate) const MAX_TOP_LOGPROBS: u32 = 20;
/// Most output tokens (all choices together) of one shaped request: its scripts are built
/// before the request is served.
pub(crate) const MAX_SHAPED_TOKENS: u64 = 1 << 21;
/// Most stop strings, and the longest one, a request may give.
const MAX_STOPS: usize = 64;
const MAX_STOP_LEN: usize = 1024;
/// Most object keys a JSON output takes from a schema (more are left out), and the longest.
const MAX_KEYS: usize = 16;
const MAX_KEY_LEN: usize = 128;

/// The text form of the output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Form {
    Text,
    /// One JSON object with these keys (string values).
    Json(Vec<String>),
    /// A call of function `name`; its arguments are a JSON object with these keys.
    Tool {
        name: String,
        keys: Vec<String>,
    },
}

/// Which `logprobs` shape the request asked for, and how many alternatives per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Logprobs {
    /// Chat: `logprobs: true`, `top_logprobs: k`.
    Chat(u32),
    /// Completions: `logprobs: k`.
    Completion(u32),
}

/// What a request asks of its output (`None` from [`ask`]: nothing beyond plain text).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ask {
    pub(crate) form: Form,
    pub(crate) stop: Vec<String>,
    pub(crate) logprobs: Option<Logprobs>,
}

/// A refusal naming the field.
pub(crate) type Bad = (String, &'static str);

fn bad(msg: impl Into<String>, field: &'static str) -> Bad {
    (msg.into(), field)
}

/// Which API's fields are read: chat, completions or responses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Api {
    Completions,
    Chat,
    Responses,
}

/// Reads `response_format` (chat, completions), `text.format` (responses), `tools` and
/// `tool_choice` (chat), `stop` (chat, completions), `logprobs`/`top_logprobs`.
pub(crate) fn ask(raw: &Value, api: Api) -> Result<Option<Ask>, Bad> {
    let format = match api {
        Api::Responses => raw.get("text").and_then(|t| t.get("format")),
        _ => raw.get("response_format"),
    };
    let mut form = json_form(format, api)?;
    if api == Api::Chat {
        if let Some(t) = tool_form(raw)? {
            form = t;
        }
    }
    let stop = match api {
        Api::Responses => Vec::new(),
        _ => stops(raw.get("stop"))?,
    };
    let logprobs = logprobs(raw, api)?;
    if form == Form::Text && stop.is_empty() && logprobs.is_none() {
        return Ok(None);
    }
    Ok(Some(Ask {
        form,
        stop,
        logprobs,
    }))
}

fn json_form(format: Option<&Value>, api: Api) -> Result<Form, Bad> {
    let field = match api {
        Api::Responses => "text",
        _ => "response_format",
    };
    let Some(f) = format.filter(|f| !f.is_null()) else {
        return Ok(Form::Text);
    };
    let kind = f.get("type").and_then(Value::as_str);
    let msg = "must be an object whose `type` is text, json_object or json_schema";
    match kind {
        Some("text") => Ok(Form::Text),
        Some("json_object") => Ok(Form::Json(vec!["text".into()])),
        Some("json_schema") => {
            // Chat/completions nest the schema under `json_schema`; responses do not.
            let schema = match api {
                Api::Responses => f.get("schema"),
                _ => f.get("json_schema").and_then(|j| j.get("schema")),
            };
            Ok(Form::Json(keys(schema, "text")))
        }
        _ => Err(bad(format!("field `{field}` {msg}"), field)),
    }
}

/// The property names of an object schema (at most [`MAX_KEYS`], each at most
/// [`MAX_KEY_LEN`] bytes), else `fallback`.
fn keys(schema: Option<&Value>, fallback: &str) -> Vec<String> {
    let props = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let mut k: Vec<String> = props
        .into_iter()
        .flat_map(|p| p.keys())
        .filter(|k| k.len() <= MAX_KEY_LEN)
        .take(MAX_KEYS)
        .cloned()
        .collect();
    if k.is_empty() {
        k.push(fallback.into());
    }
    k
}

/// `tools` given and `tool_choice` not "none": a call of the named function, else the first.
fn tool_form(raw: &Value) -> Result<Option<Form>, Bad> {
    let tools = match raw.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(t)) if t.is_empty() => return Ok(None),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(bad("field `tools` must be a list", "tools")),
    };
    fn name_of(t: &Value) -> Option<&str> {
        t.get("function").and_then(|f| f.get("name")?.as_str())
    }
    if let Some(i) = tools.iter().position(|t| name_of(t).is_none()) {
        let msg = format!(
            "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
        );
        return Err(bad(msg, "tools"));
    }
    let named = match raw.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" || s == "required" => None,
        Some(v @ Value::Object(_)) => match name_of(v) {
            Some(n) => Some(n),
            None => return Err(bad("field `tool_choice` names no function", "tool_choice")),
        },
        Some(_) => {
            let msg = "field `tool_choice` must be none, auto, required or a named function";
            return Err(bad(msg, "tool_choice"));
        }
    };
    let tool = match named {
        Some(n) => tools
            .iter()
            .find(|t| name_of(t) == Some(n))
            .ok_or_else(|| {
                bad(
                    format!("tool_choice names `{n}`, which is not in `tools`"),
                    "tool_choice",
                )
            })?,
        None => &tools[0],
    };
    let f = &tool["function"];
    Ok(Some(Form::Tool {
        name: name_of(tool).unwrap_or_default().to_string(),
        keys: keys(f.get("parameters"), "input"),
    }))
}

fn stops(v: Option<&Value>) -> Result<Vec<String>, Bad> {
    let msg = format!(
        "field `stop` must be a string or a list of at most {MAX_STOPS} strings of at most {MAX_STOP_LEN} bytes"
    );
    let list: Vec<&Value> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(s @ Value::String(_)) => vec![s],
        Some(Value::Array(a)) if a.len() <= MAX_STOPS => a.iter().collect(),
        Some(_) => return Err(bad(msg, "stop")),
    };
    let mut out = Vec::with_capacity(list.len());
    for s in list {
        match s.as_str() {
            Some(s) if s.len() <= MAX_STOP_LEN => {
                if !s.is_empty() {
                    out.push(s.to_string());
                }
            }
            _ => return Err(bad(msg, "stop")),
        }
    }
    Ok(out)
}

fn logprobs(raw: &Value, api: Api) -> Result<Option<Logprobs>, Bad> {
    let top = |name: &'static str, v: Option<&Value>| -> Result<u32, Bad> {
        match v {
            None | Some(Value::Null) => Ok(0),
            Some(v) => v
                .as_u64()
                .filter(|k| *k <= u64::from(MAX_TOP_LOGPROBS))
                .map(|k| k as u32)
                .ok_or_else(|| {
                    let msg =
                        format!("field `{name}` must be an integer from 0 to {MAX_TOP_LOGPROBS}");
                    bad(msg, name)
                }),
        }
    };
    match api {
        Api::Responses => Ok(None),
        Api::Completions => match raw.get("logprobs") {
            None | Some(Value::Null) => Ok(None),
            v => top("logprobs", v).map(|k| Some(Logprobs::Completion(k))),
        },
        Api::Chat => {
            let on = match raw.get("logprobs") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(bad("field `logprobs` must be a boolean", "logprobs")),
            };
            let k = top("top_logprobs", raw.get("top_logprobs"))?;
            Ok(on.then_some(Logprobs::Chat(k)))
        }
    }
}

/// One choice's output: each token's piece of `text`, and the stop string that ended it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    pub(crate) text: String,
    /// `ends[i]`: byte end of token `i`'s piece in `text` (pieces cut by a stop string are
    /// shorter or empty).
    ends: Vec<u32>,
    ids: Vec<u32>,
    /// Seeds the token log-probabilities.
    seed: u64,
    pub(crate) stop: Option<String>,
}

impl Script {
    /// Tokens in the output (after a stop string's cut).
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    fn start(&self, i: usize) -> usize {
        i.checked_sub(1).map_or(0, |p| self.ends[p] as usize)
    }

    /// The text of tokens `from..from + n` (clamped to the output).
    pub(crate) fn span(&self, from: usize, n: usize) -> &str {
        let to = (from + n).min(self.len());
        if from >= to {
            return "";
        }
        &self.text[self.start(from)..self.ends[to - 1] as usize]
    }

    fn piece(&self, i: usize) -> &str {
        self.span(i, 1)
    }
}

/// The output of `ids` (one choice's tokens, in order) in the form `ask` wants; a stop string
/// (text form only: JSON and tool arguments are closed JSON by construction) cuts it after the
/// token that completes it.
pub(crate) fn script(ask: &Ask, tok: &Tokenizer, ids: &[u32], seed: u64) -> Script {
    let mut s = Script {
        seed,
        ..Script::default()
    };
    let n = ids.len();
    let mut one = String::new();
    for (i, &id) in ids.iter().enumerate() {
        one.clear();
        tok.render(&[id], &mut one);
        match &ask.form {
            Form::Text => s.text.push_str(&one),
            Form::Json(keys) | Form::Tool { keys, .. } => json_piece(&mut s.text, keys, i, n, &one),
        }
        s.ends.push(s.text.len() as u32);
    }
    s.ids = ids.to_vec();
    if ask.form == Form::Text {
        cut_at_stop(&mut s, &ask.stop);
    }
    s
}

/// Token `i` of `n` of a JSON object with string values: the first opens it and its first
/// key, the last closes it, every 8th starts the next key while keys remain, the rest are
/// words (escaped). Whole, the pieces are valid JSON for every `n` (one token: `{}`).
fn json_piece(out: &mut String, keys: &[String], i: usize, n: usize, word: &str) {
    let key = |out: &mut String, k: &str| {
        json_str(out, k);
        out.push_str(": \"");
    };
    if n == 1 {
        out.push_str("{}");
    } else if i == 0 {
        out.push('{');
        key(out, &keys[0]);
    } else if i == n - 1 {
        out.push_str("\"}");
    } else if i % 8 == 0 && i / 8 < keys.len() && i + 2 < n {
        out.push_str("\", ");
        key(out, &keys[i / 8]);
    } else {
        let mut q = String::with_capacity(word.len() + 2);
        json_str(&mut q, word);
        out.push_str(&q[1..q.len() - 1]);
    }
}

/// Ends the output at the first stop string: its text stops where the string starts, its
/// tokens after the one that completes it (vLLM counts that token).
fn cut_at_stop(s: &mut Script, stops: &[String]) {
    let hit = stops
        .iter()
        .filter_map(|st| s.text.find(st.as_str()).map(|b| (b, st)))
        .min_by_key(|(b, st)| (*b, std::cmp::Reverse(st.len())));
    let Some((b, st)) = hit else { return };
    let end = b + st.len();
    let keep = s
        .ends
        .iter()
        .position(|&e| e as usize >= end)
        .map_or(s.len(), |k| k + 1);
    s.ends.truncate(keep);
    s.ids.truncate(keep);
    for e in &mut s.ends {
        *e = (*e).min(b as u32);
    }
    s.text.truncate(b);
    s.stop = Some(st.clone());
}

/// Token `i`'s log-probability and those of its alternatives (most likely first: the sampled
/// token is the top one), deterministic in the script's seed.
fn token_logprob(s: &Script, i: usize) -> f64 {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(&(i as u64).to_le_bytes(), s.seed ^ 0x1095);
    -((h % 4000) as f64 + 1.0) / 1000.0
}

/// The `k - 1` alternatives to token `i` (distinct words other than its own text).
fn alternatives(s: &Script, i: usize, k: u32) -> Vec<(String, f64)> {
    let own = s.piece(i);
    let lp = token_logprob(s, i);
    let id = s.ids.get(i).copied().unwrap_or(0) as usize;
    (1..WORDS.len())
        .map(|j| format!(" {}", WORDS[(id + j * 13) % WORDS.len()]))
        .filter(|w| w != own)
        .take(k.saturating_sub(1) as usize)
        .enumerate()
        .map(|(j, w)| (w, lp - 0.5 * (j as f64 + 1.0)))
        .collect()
}

fn bytes_json(out: &mut String, s: &str) {
    out.push('[');
    for (i, b) in s.bytes().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{b}");
    }
    out.push(']');
}

fn chat_entry(out: &mut String, token: &str, lp: f64) {
    out.push_str("{\"token\":");
    json_str(out, token);
    let _ = write!(out, ",\"logprob\":{lp:?},\"bytes\":");
    bytes_json(out, token);
}

/// The `logprobs` object of tokens `from..from + n` of `s` (`chars_before`: characters of the
/// output before them, completions' `text_offset`).
pub(crate) fn logprobs_json(out: &mut String, lp: Logprobs, s: &Script, from: usize, n: usize) {
    let to = (from + n).min(s.len());
    match lp {
        Logprobs::Chat(k) => {
            out.push_str("{\"content\":[");
            for i in from..to {
                if i > from {
                    out.push(',');
                }
                chat_entry(out, s.piece(i), token_logprob(s, i));
                out.push_str(",\"top_logprobs\":[");
                if k > 0 {
                    chat_entry(out, s.piece(i), token_logprob(s, i));
                    out.push('}');
                    for (w, l) in alternatives(s, i, k) {
                        out.push(',');
                        chat_entry(out, &w, l);
                        out.push('}');
                    }
                }
                out.push_str("]}");
            }
            out.push_str("]}");
        }
        Logprobs::Completion(k) => {
            let mut offset = s.text[..s.start(from.min(s.len()))].chars().count();
            out.push_str("{\"text_offset\":[");
            for i in from..to {
                let sep = if i > from { "," } else { "" };
                let _ = write!(out, "{sep}{offset}");
                offset += s.piece(i).chars().count();
            }
            out.push_str("],\"token_logprobs\":[");
            for i in from..to {
                let sep = if i > from { "," } else { "" };
                let _ = write!(out, "{sep}{:?}", token_logprob(s, i));
            }
            out.push_str("],\"tokens\":[");
            for i in from..to {
                if i > from {
                    out.push(',');
                }
                json_str(out, s.piece(i));
            }
            out.push_str("],\"top_logprobs\":[");
            for i in from..to {
                if i > from {
                    out.push(',');
                }
                out.push('{');
                json_str(out, s.piece(i));
                let _ = write!(out, ":{:?}", token_logprob(s, i));
                for (w, l) in alternatives(s, i, k) {
                    out.push(',');
                    json_str(out, &w);
                    let _ = write!(out, ":{l:?}");
                }
                out.push('}');
            }
            out.push_str("]}");
        }
    }
}

/// A shaped request's outputs: what it asked, each choice's script and tool-call id.
#[derive(Debug)]
pub(crate) struct Shaped {
    pub(crate) ask: Ask,
    pub(crate) scripts: Vec<Script>,
    pub(crate) call_ids: Vec<String>,
}

impl Shaped {
    /// The called function's name, when the output is a tool call.
    pub(crate) fn tool(&self) -> Option<&str> {
        match &self.ask.form {
            Form::Tool { name, .. } => Some(name),
            _ => None,
        }
    }

    /// `finish_reason` of a choice that ended with `f` (a tool call ends as `tool_calls`).
    pub(crate) fn finish(&self, f: &'static str) -> &'static str {
        match self.tool() {
            Some(_) => "tool_calls",
            None => f,
        }
    }
}

/// A tool call's id as vLLM words it (`chatcmpl-tool-` and 32 hex digits), from `seed`.
pub(crate) fn tool_call_id(seed: u64) -> String {
    let a = xxhash_rust::xxh3::xxh3_64_with_seed(b"tool", seed);
    let b = xxhash_rust::xxh3::xxh3_64_with_seed(b"call", seed);
    format!("chatcmpl-tool-{a:016x}{b:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(n: u32) -> Vec<u32> {
        (0..n).map(|i| 300 + i * 7).collect()
    }

    fn json_ask(keys: &[&str]) -> Ask {
        Ask {
            form: Form::Json(keys.iter().map(|k| k.to_string()).collect()),
            stop: vec![],
            logprobs: None,
        }
    }

    #[test]
    fn json_output_parses_at_every_length() {
        for keys in [&["text"][..], &["a", "b\"q", "c"]] {
            for n in 1..60 {
                let s = script(&json_ask(keys), &Tokenizer::Builtin, &ids(n), 1);
                assert_eq!(s.len(), n as usize);
                let v: Value = serde_json::from_str(&s.text)
                    .unwrap_or_else(|e| panic!("{n} tokens: {e}: {}", s.text));
                assert!(v.is_object(), "{v}");
                // Pieces join to the text.
                let joined: String = (0..s.len()).map(|i| s.piece(i)).collect();
                assert_eq!(joined, s.text);
            }
        }
        let s = script(
            &json_ask(&["a", "b", "c"]),
            &Tokenizer::Builtin,
            &ids(40),
            1,
        );
        let v: Value = serde_json::from_str(&s.text).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
    }

    #[test]
    fn stop_string_cuts_text_before_it_and_tokens_after_it() {
        let tok = Tokenizer::Builtin;
        let plain = Ask {
            form: Form::Text,
            stop: vec![],
            logprobs: None,
        };
        let full = script(&plain, &tok, &ids(30), 1);
        // The 5th token's word as the stop string: the text ends where it first appears.
        let word = full.piece(4).to_string();
        let first = full.text.find(&word).unwrap();
        let ask = Ask {
            stop: vec!["zzz".into(), word.clone()],
            ..plain
        };
        let s = script(&ask, &tok, &ids(30), 1);
        assert_eq!(s.text, full.text[..first]);
        assert_eq!(s.stop.as_deref(), Some(word.as_str()));
        let k = (0..30)
            .find(|&i| full.ends[i] as usize >= first + word.len())
            .unwrap();
        assert_eq!(
            s.len(),
            k + 1,
            "the token completing the stop string counts"
        );
    }

    #[test]
    fn asks_read_vllm_fields_and_name_bad_ones() {
        let chat = |v: Value| ask(&v, Api::Chat);
        assert_eq!(chat(json!({"messages": []})).unwrap(), None);
        let t = chat(
            json!({"tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"city": {}, "unit": {}}}}}]}),
        );
        assert_eq!(
            t.unwrap().unwrap().form,
            Form::Tool {
                name: "f".into(),
                keys: vec!["city".into(), "unit".into()]
            }
        );
        let none = json!({"tools": [{"function": {"name": "f"}}], "tool_choice": "none"});
        assert_eq!(chat(none).unwrap(), None);
        let bad_named = json!({"tools": [{"function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}});
        assert_eq!(chat(bad_named).unwrap_err().1, "tool_choice");
        assert_eq!(chat(json!({"tools": [{}]})).unwrap_err().1, "tools");
        let lp = chat(json!({"logprobs": true, "top_logprobs": 3}))
            .unwrap()
            .unwrap();
        assert_eq!(lp.logprobs, Some(Logprobs::Chat(3)));
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 21}))
                .unwrap_err()
                .1,
            "top_logprobs"
        );
        let c = ask(&json!({"logprobs": 2, "stop": ["a", ""]}), Api::Completions)
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.logprobs, c.stop),
            (Some(Logprobs::Completion(2)), vec!["a".to_string()])
        );
        let rf = json!({"response_format": {"type": "xml"}});
        assert_eq!(chat(rf).unwrap_err().1, "response_format");
        let r = json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"properties": {"k": {}}}}}});
        assert_eq!(
            ask(&r, Api::Responses).unwrap().unwrap().form,
            Form::Json(vec!["k".into()])
        );
    }

    #[test]
    fn logprobs_have_vllm_shapes() {
        let ask = Ask {
            form: Form::Text,
            stop: vec![],
            logprobs: None,
        };
        let s = script(&ask, &Tokenizer::Builtin, &ids(4), 9);
        let mut out = String::new();
        logprobs_json(&mut out, Logprobs::Chat(3), &s, 1, 2);
        let v: Value = serde_json::from_str(&out).unwrap();
        let c = v["content"].as_array().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["token"], s.piece(1));
        assert_eq!(c[0]["top_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(c[0]["top_logprobs"][0]["logprob"], c[0]["logprob"]);
        let mut out = String::new();
        logprobs_json(&mut out, Logprobs::Completion(2), &s, 1, 3);
        let v: Value = serde_json::from_str(&out).unwrap();
        let offsets: Vec<u64> = serde_json::from_value(v["text_offset"].clone()).unwrap();
        let t0 = s.piece(0).chars().count() as u64;
        let t1 = s.piece(1).chars().count() as u64;
        assert_eq!(
            offsets,
            vec![t0, t0 + t1, t0 + t1 + s.piece(2).chars().count() as u64]
        );
        assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
        assert_eq!(v["top_logprobs"][0].as_object().unwrap().len(), 2);
    }
}
