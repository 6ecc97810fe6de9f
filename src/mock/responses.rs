//! `/v1/responses` as vLLM 0.32 serves it: the `ResponsesResponse` body, and a stream of named
//! SSE events (`event: TYPE\ndata: JSON\n\n`, numbered by `sequence_number`, no `[DONE]`):
//! `response.created` and `response.in_progress` when the request is taken, then
//! `response.output_item.added` and `response.content_part.added` with the first text,
//! `response.output_text.delta` per event, and `output_text.done`, `content_part.done`,
//! `output_item.done`, `response.completed` (with `usage` in input/output tokens) at the end.
//! One output message, one text part. No I/O, no routes.

use super::engine::TokenUsage;
use super::format::json_str;
use std::fmt::Write;

/// One response's identity and stream state.
pub(crate) struct Events {
    id: String,
    msg_id: String,
    created: u64,
    model: String,
    max_output_tokens: Option<u32>,
    seq: u64,
    started: bool,
    /// The text so far (the `done` events repeat it whole).
    text: String,
}

impl Events {
    pub(crate) fn new(
        hex: &str,
        created: u64,
        model: &str,
        max_output_tokens: Option<u32>,
    ) -> Self {
        Events {
            id: format!("resp_{hex}"),
            msg_id: format!("msg_{hex}"),
            created,
            model: model.to_string(),
            max_output_tokens,
            seq: 0,
            started: false,
            text: String::new(),
        }
    }

    /// Opens one event of `kind`: `event:` line, `data: {` and its `type` and number.
    fn open(&mut self, out: &mut String, kind: &str) {
        let _ = write!(
            out,
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":{},",
            self.seq
        );
        self.seq += 1;
    }

    /// The `response` object: `status`, its output message (`None`: no output yet) and usage.
    fn response(&self, out: &mut String, status: &str, text: Option<&str>, u: Option<&TokenUsage>) {
        out.push_str("{\"id\":");
        json_str(out, &self.id);
        let details = match status {
            INCOMPLETE => "{\"reason\":\"max_output_tokens\"}",
            _ => "null",
        };
        let _ = write!(
            out,
            ",\"created_at\":{},\"incomplete_details\":{details},\"instructions\":null,\"metadata\":null,\"model\":",
            self.created
        );
        json_str(out, &self.model);
        out.push_str(",\"object\":\"response\",\"output\":[");
        if let Some(t) = text {
            self.message(out, "completed", Some(t));
        }
        out.push_str("],\"parallel_tool_calls\":true,\"temperature\":1.0,\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,\"background\":false,\"max_output_tokens\":");
        match self.max_output_tokens {
            Some(m) => {
                let _ = write!(out, "{m}");
            }
            None => out.push_str("null"),
        }
        let _ = write!(
            out,
            ",\"max_tool_calls\":null,\"previous_response_id\":null,\"prompt\":null,\"reasoning\":null,\"service_tier\":\"auto\",\"status\":\"{status}\",\"text\":null,\"top_logprobs\":null,\"truncation\":\"disabled\",\"usage\":"
        );
        match u {
            Some(u) => {
                let (i, o) = (u.prompt_tokens, u.completion_tokens);
                let _ = write!(
                    out,
                    "{{\"input_tokens\":{i},\"input_tokens_details\":{{\"cached_tokens\":0}},\"output_tokens\":{o},\"output_tokens_details\":{{\"reasoning_tokens\":0}},\"total_tokens\":{}}}",
                    i + o
                );
            }
            None => out.push_str("null"),
        }
        out.push_str(",\"user\":null}");
    }

    /// The output message item (`None`: no content part yet).
    fn message(&self, out: &mut String, status: &str, text: Option<&str>) {
        out.push_str("{\"id\":");
        json_str(out, &self.msg_id);
        out.push_str(",\"content\":[");
        if let Some(t) = text {
            part(out, t, "null");
        }
        let _ = write!(
            out,
            "],\"role\":\"assistant\",\"status\":\"{status}\",\"type\":\"message\"}}"
        );
    }

    /// `item_id`, `output_index` and `content_index` of the one text part.
    fn at_part(&self, out: &mut String) {
        out.push_str("\"item_id\":");
        json_str(out, &self.msg_id);
        out.push_str(",\"output_index\":0,\"content_index\":0");
    }

    /// `response.created` and `response.in_progress`: sent as soon as the request is taken.
    pub(crate) fn prelude(&mut self, out: &mut String) {
        for kind in ["response.created", "response.in_progress"] {
            self.open(out, kind);
            out.push_str("\"response\":");
            self.response(out, "in_progress", None, None);
            out.push_str("}\n\n");
        }
    }

    /// The events of one piece of output text (the first opens the message and its part).
    pub(crate) fn delta(&mut self, out: &mut String, text: &str) {
        if !std::mem::replace(&mut self.started, true) {
            self.open(out, "response.output_item.added");
            out.push_str("\"output_index\":0,\"item\":");
            self.message(out, "in_progress", None);
            out.push_str("}\n\n");
            self.open(out, "response.content_part.added");
            self.at_part(out);
            out.push_str(",\"part\":");
            part(out, "", "[]");
            out.push_str("}\n\n");
        }
        self.text.push_str(text);
        self.open(out, "response.output_text.delta");
        self.at_part(out);
        out.push_str(",\"delta\":");
        json_str(out, text);
        out.push_str(",\"logprobs\":[]}\n\n");
    }

    /// The closing events, `response.completed` with the usage last.
    pub(crate) fn done(&mut self, out: &mut String, u: &TokenUsage) {
        let text = std::mem::take(&mut self.text);
        self.open(out, "response.output_text.done");
        self.at_part(out);
        out.push_str(",\"text\":");
        json_str(out, &text);
        out.push_str(",\"logprobs\":[]}\n\n");
        self.open(out, "response.content_part.done");
        self.at_part(out);
        out.push_str(",\"part\":");
        part(out, &text, "null");
        out.push_str("}\n\n");
        self.open(out, "response.output_item.done");
        out.push_str("\"output_index\":0,\"item\":");
        self.message(out, "completed", Some(&text));
        out.push_str("}\n\n");
        self.open(out, "response.completed");
        out.push_str("\"response\":");
        self.response(out, self.end_status(u), Some(&text), Some(u));
        out.push_str("}\n\n");
    }

    /// The non-streamed body.
    pub(crate) fn whole(&self, text: &str, u: &TokenUsage) -> String {
        let mut s = String::with_capacity(text.len() + 768);
        self.response(&mut s, self.end_status(u), Some(text), Some(u));
        s
    }

    /// The response's status at its end: `incomplete` when `max_output_tokens` ended it, as
    /// vLLM 0.32 says it (with `incomplete_details.reason`; its last event is still
    /// `response.completed`), else `completed`.
    fn end_status(&self, u: &TokenUsage) -> &'static str {
        match self.max_output_tokens {
            Some(m) if u.completion_tokens >= u64::from(m) => INCOMPLETE,
            _ => "completed",
        }
    }
}

/// A response's status when `max_output_tokens` ended it.
const INCOMPLETE: &str = "incomplete";

/// An `output_text` content part (`logprobs`: its JSON text).
fn part(out: &mut String, text: &str, logprobs: &str) {
    out.push_str("{\"annotations\":[],\"text\":");
    json_str(out, text);
    let _ = write!(out, ",\"type\":\"output_text\",\"logprobs\":{logprobs}}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::SseParser;
    use serde_json::Value;

    #[test]
    fn stream_events_are_numbered_named_and_carry_usage_last() {
        let mut e = Events::new("ab", 7, "m", Some(3));
        let mut out = String::new();
        e.prelude(&mut out);
        e.delta(&mut out, " the");
        e.delta(&mut out, " of\"");
        let u = TokenUsage {
            prompt_tokens: 5,
            completion_tokens: 2,
            ..TokenUsage::default()
        };
        e.done(&mut out, &u);
        let mut p = SseParser::default();
        let mut evs = Vec::new();
        p.feed(out.as_bytes(), |ev| evs.push(ev.unwrap()));
        let kinds: Vec<String> = evs
            .iter()
            .map(|e| e.event.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let vs: Vec<Value> = evs
            .iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect();
        for (k, v) in vs.iter().enumerate() {
            assert_eq!(v["sequence_number"], k as u64);
            assert_eq!(v["type"], kinds[k]);
        }
        assert_eq!(vs[6]["text"], " the of\"");
        let done = &vs[9]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["usage"]["input_tokens"], 5);
        assert_eq!(done["usage"]["total_tokens"], 7);
        assert_eq!(done["output"][0]["content"][0]["text"], " the of\"");
        let whole: Value = serde_json::from_str(&e.whole(" x", &u)).unwrap();
        assert_eq!(whole["object"], "response");
        assert_eq!(whole["output"][0]["content"][0]["type"], "output_text");
        assert_eq!(whole["incomplete_details"], Value::Null);
    }

    /// Output ended by `max_output_tokens` is `incomplete`, as real vLLM 0.32 says it (captured
    /// in `fixtures/vllm/responses_max_output_tokens.json`); the message itself is completed.
    #[test]
    fn output_cut_by_max_output_tokens_is_incomplete_as_vllm_says() {
        let real: Value = serde_json::from_str(include_str!(
            "../../fixtures/vllm/responses_max_output_tokens.json"
        ))
        .unwrap();
        let e = Events::new("ab", 7, "m", Some(4));
        let u = TokenUsage {
            prompt_tokens: 5,
            completion_tokens: 4,
            ..TokenUsage::default()
        };
        let whole: Value = serde_json::from_str(&e.whole(" a b c d", &u)).unwrap();
        for v in [&real, &whole] {
            assert_eq!(v["status"], "incomplete");
            assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
            assert_eq!(v["output"][0]["status"], "completed");
        }
        let mut out = String::new();
        let mut s = Events::new("ab", 7, "m", Some(4));
        s.prelude(&mut out);
        s.delta(&mut out, " a");
        s.done(&mut out, &u);
        let last = out.trim_end().rsplit("\n").next().unwrap();
        let last: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(last["type"], "response.completed");
        assert_eq!(last["response"]["status"], "incomplete");
    }
}
