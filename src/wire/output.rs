//! The generated text of an OpenAI response, streamed or whole (completions, chat completions,
//! responses), and whether a request asks for a deterministic output: what a shadow's output
//! agreement compares. Pure.

use super::sse::{RawEvent, SseError, SseParser};
use serde_json::Value;

/// Most choices whose text is kept apart (more are left out of the text).
const MAX_CHOICES: usize = 256;

/// Whether a request body asks for a deterministic output: `temperature` 0, or a `seed`.
pub(crate) fn deterministic(request: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(request) else {
        return false;
    };
    let greedy = v.get("temperature").and_then(Value::as_f64) == Some(0.0);
    greedy || v.get("seed").is_some_and(|s| !s.is_null())
}

/// The text a response generated, choices in index order; `None` when the body holds no
/// generation (an embedding, an error, a body that is not JSON).
pub(crate) fn text(sse: bool, body: &[u8]) -> Option<Vec<u8>> {
    let mut t = Texts::default();
    if sse {
        let mut p = SseParser::new(4 << 20);
        let mut on = |ev: Result<RawEvent<'_>, SseError>| {
            let Ok(ev) = ev else { return };
            if ev.is_done() {
                return;
            }
            if let Ok(v) = serde_json::from_slice::<Value>(ev.data) {
                t.chunk(&v);
            }
        };
        p.feed_raw(body, &mut on);
        p.finish_raw(&mut on);
    } else {
        let v: Value = serde_json::from_slice(body).ok()?;
        t.whole(&v);
    }
    t.seen.then(|| t.by_choice.concat())
}

#[derive(Default)]
struct Texts {
    by_choice: Vec<Vec<u8>>,
    /// A generation shape was seen (its text may be empty).
    seen: bool,
}

impl Texts {
    fn add(&mut self, index: u64, s: &str) {
        let Some(k) = usize::try_from(index).ok().filter(|&k| k < MAX_CHOICES) else {
            return;
        };
        if self.by_choice.len() <= k {
            self.by_choice.resize(k + 1, Vec::new());
        }
        self.by_choice[k].extend_from_slice(s.as_bytes());
    }

    /// A choice's text, message or delta content, and tool-call arguments.
    fn choice(&mut self, c: &Value, part: &str) {
        self.seen = true;
        let k = c.get("index").and_then(Value::as_u64).unwrap_or(0);
        if let Some(s) = c.get("text").and_then(Value::as_str) {
            self.add(k, s);
        }
        let Some(m) = c.get(part) else { return };
        if let Some(s) = m.get("content").and_then(Value::as_str) {
            self.add(k, s);
        }
        for tc in m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(s) = tc.pointer("/function/arguments").and_then(Value::as_str) {
                self.add(k, s);
            }
        }
    }

    fn chunk(&mut self, v: &Value) {
        for c in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.choice(c, "delta");
        }
        if v.get("type").and_then(Value::as_str) == Some("response.output_text.delta") {
            self.seen = true;
            if let Some(s) = v.get("delta").and_then(Value::as_str) {
                self.add(0, s);
            }
        }
    }

    fn whole(&mut self, v: &Value) {
        for c in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.choice(c, "message");
        }
        if v.get("object").and_then(Value::as_str) == Some("response") {
            self.seen = true;
            for o in v
                .get("output")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for c in o
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(s) = c.get("text").and_then(Value::as_str) {
                        self.add(0, s);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_and_whole_texts_are_read_by_choice() {
        let sse = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n\
            data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"B\"}}]}\n\n\
            data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n\
            data: [DONE]\n\n";
        assert_eq!(text(true, sse).as_deref(), Some(&b"HelloB"[..]));
        let whole = br#"{"choices":[{"index":0,"text":"abc"}]}"#;
        assert_eq!(text(false, whole).as_deref(), Some(&b"abc"[..]));
        let msg = br#"{"choices":[{"index":0,"message":{"content":"hi"}}]}"#;
        assert_eq!(text(false, msg).as_deref(), Some(&b"hi"[..]));
        let resp =
            br#"{"object":"response","output":[{"content":[{"type":"output_text","text":"r"}]}]}"#;
        assert_eq!(text(false, resp).as_deref(), Some(&b"r"[..]));
        let delta = b"data: {\"type\":\"response.output_text.delta\",\"delta\":\"d\"}\n\n";
        assert_eq!(text(true, delta).as_deref(), Some(&b"d"[..]));
    }

    #[test]
    fn bodies_without_a_generation_have_no_text() {
        assert_eq!(text(false, br#"{"data":[{"embedding":[0.1]}]}"#), None);
        assert_eq!(text(false, b"not json"), None);
        assert_eq!(text(true, b"data: {\"error\":{}}\n\n"), None);
    }

    #[test]
    fn greedy_or_seeded_requests_are_deterministic() {
        assert!(deterministic(br#"{"temperature":0}"#));
        assert!(deterministic(br#"{"temperature":0.0,"prompt":"x"}"#));
        assert!(deterministic(br#"{"seed":7}"#));
        assert!(!deterministic(br#"{"temperature":0.7}"#));
        assert!(!deterministic(br#"{"seed":null}"#));
        assert!(!deterministic(b"{}"));
        assert!(!deterministic(b"garbage"));
    }
}
