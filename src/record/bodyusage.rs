//! The `usage` of a non-streamed response body, read in one validating pass that looks only at
//! the top-level keys a record needs, or "not sure" (the caller then asks
//! [`crate::openai::parse_chunk`], which decides).
//!
//! For a non-streamed response the recorder needs what `parse_chunk` reports as usage, server
//! metrics and error; for the ordinary body (no `metrics`, no `error`, `object` not `"error"`) that
//! is the `usage` object alone, and `parse_chunk` spent ~3 k instructions per small response
//! following every choice (text, finish reason, token ids). This pass validates the whole body as
//! strictly as serde_json does where it answers (UTF-8, string contents, escapes, numbers,
//! literals, nothing after the value) but only reads `usage`; it answers `None` ("not sure")
//! for anything rarer: a top-level `error` or `metrics` key, `object` equal to `"error"` or
//! escaped, a key with an escape, a repeated `usage` key or usage field, a non-object non-null
//! `usage`, `\u` escapes, numbers with an exponent or an integer part past u64, nesting
//! deeper than 64, malformed JSON. Where it answers it agrees with `parse_chunk` (tests: the real
//! vLLM bodies and property-generated bodies, mutated and cut). Pure; no allocation.

use crate::bytescan::find_json_special;
use crate::trace::Usage;

/// Bytes that end a plain run inside a JSON string: quote, backslash, control characters.
static SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Deeper nesting is left to the general parser.
const MAX_DEPTH: u32 = 64;

struct P<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> P<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next non-blank byte (not consumed).
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string at its opening quote: its raw contents and whether it has an escape. `\u`
    /// escapes and control characters are "not sure".
    fn string(&mut self) -> Option<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let start = self.i;
        let mut escaped = false;
        loop {
            // Most strings of a response are short (keys, ids, finish reasons): a byte loop
            // over a table beats the word-at-a-time search there; long runs switch to it.
            let mut i = self.i;
            let end = self.b.len().min(i + 16);
            while i < end && !SPECIAL[self.b[i] as usize] {
                i += 1;
            }
            self.i = if i == end && end < self.b.len() {
                find_json_special(self.b, i)
            } else {
                i
            };
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some((&self.b[start..self.i - 1], escaped));
                }
                b'\\' => match self.b.get(self.i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                        escaped = true;
                        self.i += 2;
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// A number: `Some(Some(n))` for a non-negative integer (fits a u64), `Some(None)` for any
    /// other number serde_json reads as finite.
    fn number(&mut self) -> Option<Option<u64>> {
        self.ws();
        let neg = self.b.get(self.i) == Some(&b'-');
        if neg {
            self.i += 1;
        }
        let start = self.i;
        let mut v = 0u64;
        while let Some(&c @ b'0'..=b'9') = self.b.get(self.i) {
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        let mut integer = !neg;
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            let f = self.i;
            while let Some(b'0'..=b'9') = self.b.get(self.i) {
                self.i += 1;
            }
            if self.i == f {
                return None;
            }
            integer = false;
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            return None;
        }
        Some(integer.then_some(v))
    }

    fn literal(&mut self, w: &[u8]) -> Option<()> {
        self.ws();
        if self.b.get(self.i..self.i + w.len())? == w {
            self.i += w.len();
            Some(())
        } else {
            None
        }
    }

    /// Skips any value, validating it.
    fn skip(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => self.object(|p, _| p.skip(depth + 1)),
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.skip(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number().map(|_| ()),
            _ => None,
        }
    }

    /// An object; `field` reads or skips each value. A key with an escape is "not sure".
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let (k, escaped) = self.string()?;
            if escaped {
                return None;
            }
            self.eat(b':')?;
            field(self, k)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// The body's usage as [`crate::openai::parse_chunk`] reports it (`Some(None)`: no usage, or a
/// `null` one), when the body is ordinary; `None` when not sure.
pub fn usage(body: &[u8]) -> Option<Option<Usage>> {
    if !body.is_ascii() {
        std::str::from_utf8(body).ok()?;
    }
    let mut p = P { b: body, i: 0 };
    let mut usage = None;
    let mut seen_usage = false;
    p.object(|p, key| match key {
        b"error" | b"metrics" => None,
        b"object" => {
            if p.peek()? == b'"' {
                let (v, escaped) = p.string()?;
                return (!escaped && v != b"error").then_some(());
            }
            p.skip(1)
        }
        b"usage" => {
            if std::mem::replace(&mut seen_usage, true) {
                return None;
            }
            match p.peek()? {
                b'n' => p.literal(b"null"),
                b'{' => {
                    let mut u = Usage::default();
                    let (mut seen_p, mut seen_c) = (false, false);
                    p.object(|p, k| {
                        let (slot, seen) = match k {
                            b"prompt_tokens" => (&mut u.prompt_tokens, &mut seen_p),
                            b"completion_tokens" => (&mut u.completion_tokens, &mut seen_c),
                            _ => return p.skip(2),
                        };
                        if std::mem::replace(seen, true) {
                            return None;
                        }
                        // serde_json's `as_u64`: a non-negative integer, anything else is 0.
                        *slot = match p.peek()? {
                            b'-' | b'0'..=b'9' => p.number()?.unwrap_or(0),
                            _ => {
                                p.skip(2)?;
                                0
                            }
                        };
                        Some(())
                    })?;
                    usage = Some(u);
                    Some(())
                }
                _ => None,
            }
        }
        _ => p.skip(1),
    })?;
    p.ws();
    (p.i == body.len()).then_some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::parse_chunk;
    use proptest::prelude::*;

    /// What the recorder takes from `parse_chunk` for a non-streamed body.
    fn general(b: &[u8]) -> (Option<Usage>, bool) {
        match parse_chunk(b) {
            Ok(c) => (c.usage, c.metrics.is_some() || c.error.is_some()),
            Err(_) => (None, false),
        }
    }

    /// Where the pass answers, `parse_chunk` gives the same usage and no metrics or error.
    fn agrees(b: &[u8]) -> bool {
        match usage(b) {
            Some(u) => {
                let (g, other) = general(b);
                assert_eq!(u, g, "{}", String::from_utf8_lossy(b));
                assert!(!other, "{}", String::from_utf8_lossy(b));
                true
            }
            None => false,
        }
    }

    const SMALL: &str = r#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#;

    fn real_bodies() -> Vec<String> {
        let txt = include_str!("../../fixtures/vllm/per_request_metrics_example.txt");
        let mut v: Vec<String> = txt
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(str::to_string)
            .collect();
        for f in [
            include_str!("../../fixtures/vllm/completions_tokenids_stream.sse"),
            include_str!("../../fixtures/vllm/completions_text_stream.sse"),
            include_str!("../../fixtures/vllm/chat_stream.sse"),
            include_str!("../../fixtures/vllm/return_token_ids_stream.sse"),
        ] {
            v.extend(
                f.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|d| d.starts_with('{'))
                    .map(str::to_string),
            );
        }
        v.push(SMALL.to_string());
        v
    }

    #[test]
    fn answers_ordinary_bodies_and_agrees() {
        assert_eq!(
            usage(SMALL.as_bytes()),
            Some(Some(Usage {
                prompt_tokens: 4,
                completion_tokens: 1
            }))
        );
        let bodies = real_bodies();
        let answered = bodies.iter().filter(|b| agrees(b.as_bytes())).count();
        assert!(
            answered * 2 > bodies.len(),
            "{answered} of {}",
            bodies.len()
        );
        // The vLLM body with per-request metrics is left to the general parser.
        let with_metrics = bodies.iter().find(|b| b.contains("\"metrics\"")).unwrap();
        assert_eq!(usage(with_metrics.as_bytes()), None);
    }

    #[test]
    fn unsure_cases_are_left_to_the_general_parser() {
        for b in [
            r#"{"error":{"message":"x"}}"#,
            r#"{"object":"error","message":"m"}"#,
            r#"{"object":"err\u006fr"}"#,
            r#"{"usage":{"prompt_tokens":1},"usage":null}"#,
            r#"{"usage":{"prompt_tokens":1,"prompt_tokens":2}}"#,
            r#"{"usage":5}"#,
            r#"{"us\nage":1}"#,
            r#"{"a":1e3}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":1} x"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":tru}"#,
            "{\"a\":\"\x01\"}",
            r#"[1]"#,
            r#""#,
        ] {
            assert_eq!(usage(b.as_bytes()), None, "{b}");
        }
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(70), "]".repeat(70));
        assert_eq!(usage(deep.as_bytes()), None);
        // Answered: odd but valid usage values read as serde_json's `as_u64` does.
        for b in [
            r#"{"usage":{"prompt_tokens":-3,"completion_tokens":2.5,"total_tokens":"x"}}"#,
            r#"{"usage":{"prompt_tokens":"7","completion_tokens":null}}"#,
            r#"{"usage":null,"choices":[]}"#,
            r#" { } "#,
            r#"{"object":"text_completion","usage":{"prompt_tokens":18446744073709551615}}"#,
            r#"{"a":{"b":[true,false,null,-0.5,"\"\\\/\b\f\n\r\t"]},"usage":{}}"#,
        ] {
            assert!(agrees(b.as_bytes()), "{b}");
        }
    }

    fn arb_body() -> impl Strategy<Value = Vec<u8>> {
        let base = prop_oneof![
            Just(SMALL.to_string()),
            proptest::sample::select(real_bodies()),
        ];
        let usage_val = prop_oneof![
            Just("null".to_string()),
            Just("{}".to_string()),
            (any::<u64>(), any::<u32>())
                .prop_map(|(p, c)| format!(r#"{{"prompt_tokens":{p},"completion_tokens":{c}}}"#)),
            "[-0-9.eE\"a-z{}:,\\[\\] ]{0,24}"
                .prop_map(|v| format!(r#"{{"prompt_tokens":{v},"completion_tokens":1}}"#)),
        ];
        (
            base,
            usage_val,
            any::<u8>(),
            0usize..400,
            0usize..400,
            any::<u8>(),
            any::<bool>(),
        )
            .prop_map(|(base, u, byte, at, cut, kind, replace_usage)| {
                let mut s = base;
                if replace_usage {
                    if let Some(k) = s.find(r#""usage":"#) {
                        s.truncate(k);
                        s.push_str(&format!(r#""usage":{u}}}"#));
                    } else if let Some(stripped) = s.strip_suffix('}') {
                        s = format!(r#"{stripped},"usage":{u}}}"#);
                    }
                }
                let mut b = s.into_bytes();
                match kind % 4 {
                    0 => {
                        let at = at % (b.len() + 1);
                        if at < b.len() {
                            b[at] = byte;
                        }
                    }
                    1 => b.truncate(cut % (b.len() + 1)),
                    2 => {
                        let at = at % (b.len() + 1);
                        b.insert(at, byte);
                    }
                    _ => {}
                }
                b
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// On real and reshaped bodies (bytes replaced, inserted, cut; usage values of every
        /// kind), the pass agrees with `parse_chunk` wherever it answers.
        #[test]
        fn agrees_with_parse_chunk(b in arb_body()) {
            agrees(&b);
        }
    }
}
