//! Prompt tokenization and output-token text: the documented built-in scheme (GPT-2-like pieces,
//! letter runs cut into 4-letter chunks, `256 + xxh3(piece) % 31744`, BOS 1; output ids render
//! as words from [`WORDS`]) or an HF `tokenizer.json`; chat messages through a fixed template
//! (docs/mock.md, "Tokenization"). This module does not decide which tokens are generated.

use anyhow::Context;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// Vocabulary size of the built-in scheme.
pub(crate) const BUILTIN_VOCAB: u32 = 32000;

/// Words output tokens render as in the built-in scheme.
pub(crate) const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "model", "token",
    "cache", "batch", "server", "request", "stream", "prefix", "block", "trace", "replay", "mock",
    "engine", "data",
];

/// Most tokens one `/detokenize` request may hold (a longer list is refused before its ids are
/// collected; the body itself is bounded like every request body).
pub(crate) const MAX_DETOKENIZE: usize = 1 << 20;

/// The BOS id of the built-in scheme (the first token of every encoded prompt).
pub(crate) const BUILTIN_BOS: u32 = 1;

/// One text piece per built-in id (`256..BUILTIN_VOCAB`): the first, in a fixed order, of the pieces made of a space
/// and 1 to 4 lowercase letters (shortest first; then the same with capitals) that the scheme maps to that id. Each is one piece of [`builtin_pieces`] however
/// pieces are joined, so the text of a list of ids encodes back to BOS and those ids. Built once
/// (about 0.5 M hashes), at the first `/detokenize`.
fn builtin_pieces_by_id() -> &'static [Option<Box<str>>] {
    static TABLE: std::sync::OnceLock<Vec<Option<Box<str>>>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let n = (BUILTIN_VOCAB - 256) as usize;
        let mut table: Vec<Option<Box<str>>> = vec![None; n];
        let mut left = n;
        for alphabet in [b'a'..=b'z', b'A'..=b'Z'] {
            let letters: Vec<u8> = alphabet.collect();
            for len in 1..=4u32 {
                let total = letters.len().pow(len);
                for mut k in 0..total {
                    let mut piece = String::with_capacity(5);
                    piece.push(' ');
                    for _ in 0..len {
                        piece.push(letters[k % letters.len()] as char);
                        k /= letters.len();
                    }
                    let slot = &mut table[(builtin_id(&piece) - 256) as usize];
                    if slot.is_none() {
                        *slot = Some(piece.into_boxed_str());
                        left -= 1;
                        if left == 0 {
                            return table;
                        }
                    }
                }
            }
        }
        table
    })
}

/// A tokenizer: built-in or loaded from a `tokenizer.json`.
pub(crate) enum Tokenizer {
    Builtin,
    Hf(Box<tokenizers::Tokenizer>),
}

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Alpha,
    Digit,
    Space,
    Other,
}

fn class(c: char) -> Class {
    match c {
        _ if c.is_alphabetic() => Class::Alpha,
        _ if c.is_numeric() => Class::Digit,
        _ if c.is_whitespace() => Class::Space,
        _ => Class::Other,
    }
}

/// Cuts text into built-in pieces (see the module doc).
pub(crate) fn builtin_pieces(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let at = |k: usize| chars.get(k).map_or(text.len(), |c| c.0);
    let cls = |k: usize| class(chars[k].1);
    // A single space leads the non-space run that follows it.
    let lead = |k: usize| chars[k].1 == ' ' && k + 1 < n && cls(k + 1) != Class::Space;
    let (mut out, mut i) = (Vec::new(), 0);
    while i < n {
        let j = if lead(i) { i + 1 } else { i };
        let c = cls(j);
        // At most 3 digits; letter runs are cut into chunks of 4 letters.
        let limit = match c {
            Class::Digit => 3,
            Class::Alpha => 4,
            _ => usize::MAX,
        };
        let mut k = j + 1;
        while k < n && cls(k) == c && k - j < limit && !(c == Class::Space && lead(k)) {
            k += 1;
        }
        out.push(&text[at(i)..at(k)]);
        i = k;
    }
    out
}

fn builtin_id(piece: &str) -> u32 {
    256 + (xxhash_rust::xxh3::xxh3_64(piece.as_bytes()) % u64::from(BUILTIN_VOCAB - 256)) as u32
}

/// The text of one chat message's `content` (a string, or a list of `{"type":"text","text":..}`
/// parts; other parts are skipped).
pub(crate) fn message_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The fixed chat template (see the module doc). Errors name the message that is malformed.
pub(crate) fn chat_text(messages: &[Value]) -> Result<String, String> {
    let mut s = String::new();
    for (i, m) in messages.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| format!("messages[{i}] must be an object"))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("messages[{i}].role must be a string"))?;
        let content = obj.get("content").map(message_text).unwrap_or_default();
        let _ = write!(s, "<|{role}|>\n{content}\n");
    }
    s.push_str("<|assistant|>\n");
    Ok(s)
}

impl Tokenizer {
    /// Loads `tokenizer.json`; the error names the file.
    pub(crate) fn from_file(path: &Path) -> anyhow::Result<Self> {
        let t = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("--tokenizer {}: cannot load", path.display()))?;
        Ok(Tokenizer::Hf(Box::new(t)))
    }

    /// Tokenizes a text prompt.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::Builtin => {
                let mut v = vec![1];
                v.extend(builtin_pieces(text).into_iter().map(builtin_id));
                Ok(v)
            }
            Tokenizer::Hf(t) => t
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| format!("tokenizer failed: {e}")),
        }
    }

    /// The text of prompt tokens (`/detokenize`): built-in ids as [`builtin_pieces_by_id`] (BOS
    /// as nothing, since [`Tokenizer::encode`] adds it), so that encoding the text gives BOS and
    /// the ids again; an HF tokenizer's ids decoded with their special tokens, as vLLM does. An
    /// id outside the vocabulary is an error naming it.
    pub(crate) fn decode(&self, ids: &[u32]) -> Result<String, String> {
        match self {
            Tokenizer::Builtin => {
                let table = builtin_pieces_by_id();
                let mut out = String::with_capacity(ids.len() * 4);
                for &id in ids {
                    if id == BUILTIN_BOS {
                        continue;
                    }
                    let piece = id
                        .checked_sub(256)
                        .and_then(|k| table.get(k as usize))
                        .and_then(Option::as_deref)
                        .ok_or_else(|| {
                            format!("token id {id} is not in the vocabulary (the built-in scheme has BOS {BUILTIN_BOS} and ids 256..{BUILTIN_VOCAB})")
                        })?;
                    out.push_str(piece);
                }
                Ok(out)
            }
            Tokenizer::Hf(t) => {
                let size = t.get_vocab_size(true) as u32;
                if let Some(id) = ids.iter().find(|&&id| id >= size) {
                    return Err(format!(
                        "token id {id} is not in the vocabulary ({size} tokens)"
                    ));
                }
                t.decode(ids, false)
                    .map_err(|e| format!("tokenizer failed: {e}"))
            }
        }
    }

    /// Vocabulary size output ids are drawn from.
    pub(crate) fn vocab(&self) -> u32 {
        match self {
            Tokenizer::Builtin => BUILTIN_VOCAB,
            Tokenizer::Hf(t) => (t.get_vocab_size(false) as u32).max(1),
        }
    }

    /// Appends the text of output tokens to `out`.
    pub(crate) fn render(&self, ids: &[u32], out: &mut String) {
        match self {
            Tokenizer::Builtin => {
                for &id in ids {
                    out.push(' ');
                    out.push_str(WORDS[id as usize % WORDS.len()]);
                }
            }
            Tokenizer::Hf(t) => {
                if let Ok(s) = t.decode(ids, true) {
                    out.push_str(&s);
                }
            }
        }
    }

    /// A token's string form (for `/tokenize` with `return_token_strs`).
    pub(crate) fn token_str(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Builtin => None,
            Tokenizer::Hf(t) => t.id_to_token(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_exactly() {
        for text in [
            "Hello world, this is 12345 tokens!!  ok",
            "",
            " lead",
            "tail ",
            "ünïcödé wörds\n\nnew para",
            "a  b   c",
        ] {
            let p = builtin_pieces(text);
            assert_eq!(p.concat(), text, "{text:?} -> {p:?}");
            assert!(p.iter().all(|s| !s.is_empty()));
        }
    }

    #[test]
    fn pieces_follow_the_documented_rule() {
        assert_eq!(
            builtin_pieces("Hello world 12345!"),
            vec!["Hell", "o", " worl", "d", " 123", "45", "!"]
        );
    }

    #[test]
    fn builtin_is_deterministic_with_bos() {
        let t = Tokenizer::Builtin;
        let a = t.encode("the same text").unwrap();
        assert_eq!(a, t.encode("the same text").unwrap());
        assert_eq!(a[0], 1);
        assert_eq!(a.len(), 4);
        assert!(a.iter().all(|&x| x < BUILTIN_VOCAB));
    }

    /// Every built-in id has a piece, and any list of ids (BOS included) comes back from its
    /// text: `/detokenize` then `/tokenize` is the identity.
    #[test]
    fn builtin_ids_round_trip_through_their_text() {
        let table = builtin_pieces_by_id();
        assert!(table.iter().all(Option::is_some), "an id without a piece");
        let t = Tokenizer::Builtin;
        let ids: Vec<u32> = (0..3000u32).map(|k| 256 + (k * 7919) % 31744).collect();
        let text = t.decode(&ids).unwrap();
        let mut want = vec![BUILTIN_BOS];
        want.extend(&ids);
        assert_eq!(t.encode(&text).unwrap(), want);
        // BOS decodes to nothing; a chat message of the text counts the template beside it.
        let with_bos: Vec<u32> = [BUILTIN_BOS]
            .into_iter()
            .chain(ids[..5].iter().copied())
            .collect();
        assert_eq!(t.decode(&with_bos).unwrap(), t.decode(&ids[..5]).unwrap());
        for bad in [0, 2, 255, BUILTIN_VOCAB, u32::MAX] {
            let e = t.decode(&[300, bad]).unwrap_err();
            assert!(e.contains(&format!("token id {bad} ")), "{e}");
        }
    }

    #[test]
    fn chat_template_and_errors() {
        let m: Vec<Value> = serde_json::from_str(
            r#"[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]"#,
        )
        .unwrap();
        assert_eq!(
            chat_text(&m).unwrap(),
            "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
        );
        let bad: Vec<Value> = serde_json::from_str(r#"[{"content":"x"}]"#).unwrap();
        assert!(chat_text(&bad).unwrap_err().contains("messages[0].role"));
    }
}
