//! vLLM 0.32's exact JSON text for streamed chunks and body fragments (field names, order,
//! `null`s; see `fixtures/vllm/`), written into reused buffers without serde. No I/O, no routes.

use super::engine::{Finish, TokenUsage};
use super::shape::{logprobs_json, Shaped};
use super::tokenize::Tokenizer;
use std::fmt::Write;
use std::sync::Arc;

/// `system_fingerprint` the mock reports.
pub(crate) const FINGERPRINT: &str = "vllm-0.32.0-retrace-mock";

/// Appends `s` as a JSON string literal, escaped exactly as serde_json (and Python's json with
/// `ensure_ascii=False`) does: `"` and `\` and control characters; nothing else. No allocation.
pub(super) fn json_str(out: &mut String, s: &str) {
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

pub(super) fn ids_json(out: &mut String, ids: &[u32]) {
    out.push('[');
    for (i, t) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{t}");
    }
    out.push(']');
}

/// `ids` as a JSON list, or `null`.
pub(super) fn ids_or_null(out: &mut String, ids: Option<&[u32]>) {
    match ids {
        Some(ids) => ids_json(out, ids),
        None => out.push_str("null"),
    }
}

pub(super) fn metrics_json(out: &mut String, t: &TokenUsage, spec: bool) {
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

/// `stop_reason`: the stop string that ended the output, else `null`.
pub(super) fn stop_reason(out: &mut String, s: Option<&super::shape::Script>) {
    match s.and_then(|s| s.stop.as_deref()) {
        Some(st) => json_str(out, st),
        None => out.push_str("null"),
    }
}

/// What every chunk or body of one answer names.
pub(super) struct Head<'a> {
    pub(crate) chat: bool,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) return_token_ids: bool,
}

impl Head<'_> {
    /// Opens a streamed chunk (`chunk`) or a whole body, up to its `"choices":[`.
    pub(super) fn open(&self, out: &mut String, chunk: bool) {
        let object = match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        };
        out.push_str("{\"id\":");
        json_str(out, &self.id);
        let created = self.created;
        let _ = write!(
            out,
            ",\"object\":\"{object}\",\"created\":{created},\"model\":"
        );
        json_str(out, self.model);
        out.push_str(",\"choices\":[");
    }
}

/// One stream's formatting state.
pub(super) struct Fmt {
    chat: bool,
    head: String,
    include_usage: bool,
    metrics: bool,
    return_token_ids: bool,
    prompts: Vec<Arc<Vec<u32>>>,
    started: Vec<bool>,
    choices_left: usize,
    /// The outputs of a shaped request, and how many tokens of each choice went out.
    shaped: Option<Arc<Shaped>>,
    pos: Vec<usize>,
    /// `/v1/responses` events instead of chunks.
    pub(super) responses: Option<super::responses::Events>,
    /// Scratch for one event's text (reused: no allocation per event).
    text: String,
}

impl Fmt {
    pub(super) fn new(
        h: &Head,
        include_usage: bool,
        metrics: bool,
        prompts: Vec<Arc<Vec<u32>>>,
        shaped: Option<Arc<Shaped>>,
    ) -> Self {
        let chat = h.chat;
        let mut head = String::with_capacity(128);
        h.open(&mut head, true);
        let n = prompts.len();
        Fmt {
            chat,
            head,
            include_usage,
            metrics,
            return_token_ids: h.return_token_ids,
            prompts,
            started: vec![false; n],
            choices_left: n,
            shaped,
            pos: vec![0; n],
            responses: None,
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
        let first = (self.started.get_mut(c)).is_some_and(|s| !std::mem::replace(s, true));
        if finish.is_some() {
            self.choices_left = self.choices_left.saturating_sub(1);
        }
        let last_chunk = finish.is_some() && self.choices_left == 0 && !self.include_usage;
        self.text.clear();
        let from = self.pos.get(c).copied().unwrap_or(0);
        if let Some(p) = self.pos.get_mut(c) {
            *p += ids.len();
        }
        let script = self.shaped.as_ref().and_then(|sh| sh.scripts.get(c));
        match script {
            Some(s) => self.text.push_str(s.span(from, ids.len())),
            None => tok.render(ids, &mut self.text),
        }
        if let Some(r) = self.responses.as_mut() {
            r.delta(out, &self.text);
            return;
        }
        if self.chat && first {
            out.push_str("data: ");
            out.push_str(&self.head);
            let _ = write!(
                out,
                "{{\"index\":{choice},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"prompt_token_ids\":"
            );
            let p = self.prompts.get(c).filter(|_| self.return_token_ids);
            ids_or_null(out, p.map(|p| &p[..]));
            out.push_str(",\"prompt_text\":null}\n\n");
        }
        let shaped = self.shaped.as_deref();
        out.push_str("data: ");
        out.push_str(&self.head);
        let _ = write!(out, "{{\"index\":{choice},");
        match (self.chat, shaped.and_then(|s| s.tool())) {
            (true, Some(name)) => {
                out.push_str("\"delta\":{\"tool_calls\":[{");
                if first {
                    let id = shaped.and_then(|s| s.call_ids.get(c));
                    json_str(out, "id");
                    out.push(':');
                    json_str(out, id.map_or("", |s| s.as_str()));
                    out.push_str(",\"type\":\"function\",");
                }
                out.push_str("\"index\":0,\"function\":{");
                if first {
                    out.push_str("\"name\":");
                    json_str(out, name);
                    out.push(',');
                }
                out.push_str("\"arguments\":");
                json_str(out, &self.text);
                out.push_str("}}]}");
            }
            (true, None) => {
                out.push_str("\"delta\":{\"content\":");
                json_str(out, &self.text);
                out.push('}');
            }
            (false, _) => {
                out.push_str("\"text\":");
                json_str(out, &self.text);
            }
        }
        out.push_str(",\"logprobs\":");
        match (shaped.and_then(|s| s.ask.logprobs), script) {
            (Some(lp), Some(s)) => logprobs_json(out, lp, s, from, ids.len()),
            _ => out.push_str("null"),
        }
        out.push_str(",\"finish_reason\":");
        match finish {
            Some(f) => {
                let f = shaped.map_or(f.as_str(), |s| s.finish(f.as_str()));
                let _ = write!(out, "\"{f}\"");
            }
            None => out.push_str("null"),
        }
        // A chat chunk names `stop_reason` only on its last chunk, a completion chunk always.
        if !self.chat || finish.is_some() {
            out.push_str(",\"stop_reason\":");
            stop_reason(out, script.filter(|_| finish.is_some()));
        }
        if !self.chat {
            out.push_str(",\"prompt_token_ids\":");
            let p = self
                .prompts
                .get(c)
                .filter(|_| self.return_token_ids && first);
            ids_or_null(out, p.map(|p| &p[..]));
        }
        out.push_str(",\"token_ids\":");
        ids_or_null(out, self.return_token_ids.then_some(ids));
        out.push_str("}]");
        if last_chunk {
            let _ = write!(out, ",\"system_fingerprint\":\"{FINGERPRINT}\"");
        }
        out.push_str("}\n\n");
    }

    /// Every choice has had its last token (only the usage chunk and `[DONE]` remain).
    pub(super) fn all_finished(&self) -> bool {
        self.choices_left == 0
    }

    pub(super) fn done(&mut self, out: &mut String, u: &TokenUsage) {
        if let Some(r) = self.responses.as_mut() {
            r.done(out, u);
            return;
        }
        if self.include_usage {
            let (prompt, completion) = (u.prompt_tokens, u.completion_tokens);
            out.push_str("data: ");
            out.push_str(&self.head);
            let _ = write!(
                out,
                "],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}}},\"system_fingerprint\":\"{FINGERPRINT}\"",
                prompt + completion
            );
            if self.metrics {
                out.push_str(",\"metrics\":");
                metrics_json(out, u, false);
            }
            out.push_str("}\n\n");
        }
        out.push_str("data: [DONE]\n\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::SseParser;
    use serde_json::Value;

    fn fmt_stream(chat: bool, usage: bool, tids: bool) -> Vec<Value> {
        let h = Head {
            chat,
            id: "cmpl-1".into(),
            created: 5,
            model: "m",
            return_token_ids: tids,
        };
        let mut f = Fmt::new(&h, usage, true, vec![Arc::new(vec![1, 2, 3])], None);
        let t = Tokenizer::Builtin;
        let mut out = String::new();
        f.tokens(&mut out, &t, 0, &[4], None);
        f.tokens(&mut out, &t, 0, &[5, 6], Some(Finish::Length));
        let u = TokenUsage {
            prompt_tokens: 3,
            completion_tokens: 3,
            ..TokenUsage::default()
        };
        f.done(&mut out, &u);
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
}
