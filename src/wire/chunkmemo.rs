//! Reads the chunks of one SSE stream by comparison with the previous one: consecutive chunks
//! of an OpenAI-compatible stream are the same JSON except for the text of one token
//! (`{"id":"cmpl-1",...,"choices":[{"index":0,"text":" tok","finish_reason":null}]}`), so a
//! chunk that is byte-for-byte the last parsed chunk with only that string's contents replaced
//! says the same as it, which two memory compares and a short scan establish (about 100
//! instructions instead of a parse). Anything else goes to [`crate::wire::openai::parse_chunk`].
//!
//! Why the shortcut gives exactly `parse_chunk`'s answer: the template is a chunk that parsed
//! (so valid JSON) with no `error` and no `metrics`; its varying part is the contents of the value
//! string of the first `"text":"`, `"content":"` or `"reasoning_content":"` found in the bytes
//! (not preceded by a backslash: then the pattern's quotes are string delimiters and the name is
//! a key, since a bare word between two strings would not be JSON), with no escape in it. A new
//! chunk matches when it has the template's bytes before and after that string and new contents
//! free of quotes, backslashes and control characters, valid UTF-8, and empty exactly when the
//! template's were. It is then valid JSON of the same shape, and `parse_chunk` reads such a
//! string's value only for whether it is empty (text and content count a token when non-empty;
//! no other field it reads can be named `text`, `content` or `reasoning_content`). Tested to agree
//! with `parse_chunk` on the real vLLM streams and on property-generated variations.
//! It does not split SSE, and it keeps one chunk's bytes per stream (a buffer reused). Used by
//! the recorder's writer (`record::extract`) and replay's per-event path (`replay::client`).

use crate::wire::bytescan::find_json_special;
use crate::wire::openai::{parse_chunk, ChunkInfo};

/// The value-string patterns tried, in order, when a template is made.
const PATTERNS: [&[u8]; 3] = [
    b"\"text\":\"",
    b"\"content\":\"",
    b"\"reasoning_content\":\"",
];

/// The last parsed chunk of a stream, kept as a template for the next ones.
#[derive(Debug, Default)]
pub(crate) struct ChunkMemo {
    /// The template's bytes (reused across templates and streams).
    data: Vec<u8>,
    /// Contents of the varying string: `data[start..end]`.
    start: usize,
    end: usize,
    info: ChunkInfo,
    valid: bool,
    /// How many chunks the template answered (for tests and benchmarks).
    pub(crate) hits: u64,
}

impl ChunkMemo {
    /// Forgets the template (a new stream starts).
    #[cfg(test)]
    pub(crate) fn reset(&mut self) {
        self.valid = false;
    }

    /// What [`parse_chunk`] says of `data`, from the template when `data` matches it.
    pub(crate) fn parse(&mut self, data: &[u8]) -> Result<ChunkInfo, String> {
        if self.valid && self.matches(data) {
            self.hits += 1;
            return Ok(self.info.clone());
        }
        let res = parse_chunk(data);
        self.valid = false;
        if let Ok(info) = &res {
            if info.error.is_none() && info.metrics.is_none() {
                self.learn(data, info);
            }
        }
        res
    }

    fn matches(&self, b: &[u8]) -> bool {
        let a = &self.data;
        let suffix = a.len() - self.end;
        if b.len() < self.start + suffix {
            return false;
        }
        let mid_end = b.len() - suffix;
        if b[..self.start] != a[..self.start] || b[mid_end..] != a[self.end..] {
            return false;
        }
        let mid = &b[self.start..mid_end];
        if mid.is_empty() != (self.start == self.end) {
            return false;
        }
        if find_json_special(mid, 0) != mid.len() {
            return false;
        }
        // The bytes around `mid` are ASCII quotes, so no character straddles its edges.
        mid.is_ascii() || std::str::from_utf8(mid).is_ok()
    }

    /// Makes `data` (which parsed as `info`) the template, when it has a plain value string of
    /// one of the [`PATTERNS`].
    fn learn(&mut self, data: &[u8], info: &ChunkInfo) {
        for pat in PATTERNS {
            let Some(at) = find(data, pat) else { continue };
            if at > 0 && data[at - 1] == b'\\' {
                return;
            }
            let start = at + pat.len();
            let end = find_json_special(data, start);
            if data.get(end) != Some(&b'"') {
                return;
            }
            self.data.clear();
            self.data.extend_from_slice(data);
            self.start = start;
            self.end = end;
            self.info = info.clone();
            self.valid = true;
            return;
        }
    }
}

/// First index of `pat` in `hay`.
fn find(hay: &[u8], pat: &[u8]) -> Option<usize> {
    let (&first, rest) = pat.split_first()?;
    let mut i = 0;
    while i + pat.len() <= hay.len() {
        let j = i + hay[i..].iter().position(|&c| c == first)?;
        if j + pat.len() > hay.len() {
            return None;
        }
        if &hay[j + 1..j + pat.len()] == rest {
            return Some(j);
        }
        i = j + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sse::SseParser;
    use proptest::prelude::*;

    fn stream_events(raw: &[u8]) -> Vec<Vec<u8>> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.feed_raw(raw, |e| {
            if let Ok(e) = e {
                if !e.is_done() {
                    out.push(e.data.to_vec());
                }
            }
        });
        out
    }

    fn real_streams() -> Vec<Vec<Vec<u8>>> {
        let mut v: Vec<Vec<Vec<u8>>> = [
            &include_bytes!("../../fixtures/vllm/completions_tokenids_stream.sse")[..],
            include_bytes!("../../fixtures/vllm/chat_stream.sse"),
            include_bytes!("../../fixtures/vllm/completions_text_stream.sse"),
            include_bytes!("../../fixtures/vllm/return_token_ids_stream.sse"),
        ]
        .iter()
        .map(|s| stream_events(s))
        .collect();
        let txt = include_str!("../../fixtures/vllm/per_request_metrics_example.txt");
        v.push(
            txt.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| d.as_bytes().to_vec())
                .collect(),
        );
        v
    }

    #[test]
    fn agrees_with_parse_chunk_on_real_vllm_streams() {
        let mut memo = ChunkMemo::default();
        let mut n = 0;
        for stream in real_streams() {
            memo.reset();
            for ev in &stream {
                assert_eq!(
                    memo.parse(ev),
                    parse_chunk(ev),
                    "{}",
                    String::from_utf8_lossy(ev)
                );
                n += 1;
            }
        }
        assert!(n >= 20, "{n} events");
        assert!(
            memo.hits > 5,
            "the template answers real streams: {}",
            memo.hits
        );
    }

    #[test]
    fn answers_a_bench_like_stream_and_notices_changes() {
        let ev = |t: &str, fin: &str| {
            format!(
                r#"{{"id":"cmpl-1","object":"text_completion","choices":[{{"index":0,"text":"{t}","finish_reason":{fin}}}]}}"#
            )
        };
        let mut memo = ChunkMemo::default();
        let cases = [
            ev(" tok0", "null"),
            ev(" tok1", "null"),
            ev("é", "null"),
            ev("", "null"),
            ev(" a", "null"),
            ev(r#"q\"uote"#, "null"),
            ev(" b", "null"),
            ev("x\"", "null"),
            ev(" c", r#""length""#),
            ev(" d", r#""length""#),
            r#"{"id":"cmpl-1","object":"error","choices":[{"index":0,"text":"x","finish_reason":null}]}"#
                .into(),
            r#"{"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":100}}"#
                .into(),
        ];
        for c in &cases {
            assert_eq!(memo.parse(c.as_bytes()), parse_chunk(c.as_bytes()), "{c}");
        }
        assert!(memo.hits >= 3, "{}", memo.hits);
        let mut bad = ev(" tok", "null").into_bytes();
        bad[40] = 0xff;
        assert!(memo.parse(&bad).is_err());
    }

    #[test]
    fn an_escaped_pattern_is_not_a_template() {
        let a = br#"{"id":"\"text\":\"x","choices":[{"text":"y"}]}"#;
        let mut memo = ChunkMemo::default();
        assert_eq!(memo.parse(a), parse_chunk(a));
        let b = br#"{"id":"\"text\":\"x","choices":[{"text":"y"}]}"#;
        assert_eq!(memo.parse(b), parse_chunk(b));
    }

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just(" tok".to_string()),
            Just("\\\"".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\n".to_string()),
            Just("ü".to_string()),
            Just("\"text\":\"".to_string()),
            Just("\",\"error\":{\"message\":\"x\"},\"t\":\"".to_string()),
            Just(
                "\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2},\"x\":[{\"a\":\""
                    .to_string()
            ),
            "[a-z ]{0,3}",
        ]
    }

    proptest! {
        /// Streams of chunks whose text is replaced by arbitrary pieces (quotes, escapes, JSON
        /// fragments that change the shape, non-ASCII): the memo says what parse_chunk says.
        #[test]
        fn agrees_with_parse_chunk_on_varied_streams(
            texts in proptest::collection::vec(proptest::collection::vec(piece(), 0..3), 1..12),
            key in prop_oneof![Just("text"), Just("content"), Just("reasoning_content")],
            fin in prop_oneof![Just("null"), Just("\"stop\"")],
        ) {
            let mut memo = ChunkMemo::default();
            for t in texts {
                let t = t.concat();
                let s = if key == "text" {
                    format!(r#"{{"id":"c","object":"text_completion","choices":[{{"index":0,"text":"{t}","finish_reason":{fin}}}]}}"#)
                } else {
                    format!(r#"{{"id":"c","choices":[{{"index":0,"delta":{{"{key}":"{t}"}},"finish_reason":{fin}}}]}}"#)
                };
                prop_assert_eq!(memo.parse(s.as_bytes()), parse_chunk(s.as_bytes()), "{}", s);
            }
        }
    }
}
