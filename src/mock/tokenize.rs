//! Prompt tokenization and output-token text for the simulated engine.
//!
//! Two schemes. **Built-in** (the default) is deterministic and documented so that users can
//! predict counts: the text is cut into pieces like GPT-2's pre-tokenizer (an optional leading
//! space followed by a run of letters, a run of 1 to 3 digits, a run of other non-space symbols,
//! or a run of whitespace); a letter run longer than 4 characters is further cut into chunks of
//! 4 characters (the first chunk keeps the leading space). Each piece is one token whose id is
//! `256 + xxh3(piece bytes) % (32000 - 256)`; a BOS token (id 1) starts every prompt. English
//! prose comes out near 4 characters per token, like real BPE vocabularies. Output token `id`
//! renders as a space plus a word from a fixed list ([`WORDS`], index `id % len`).
//! **HF** (`--tokenizer tokenizer.json`) uses the `tokenizers` crate: exact ids for that vocabulary,
//! special tokens added as the file says; output ids decode with it.
//! Chat messages become text with a fixed template (`<|role|>\ncontent\n` per message, then
//! `<|assistant|>\n`) before tokenization; Jinja chat templates are deliberately not run.
//! This module does not decide which tokens the engine generates (see `engine`).

use anyhow::Context;
use serde_json::Value;
use std::path::Path;

/// Vocabulary size of the built-in scheme.
pub const BUILTIN_VOCAB: u32 = 32000;

/// Words output tokens render as in the built-in scheme.
pub const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "model", "token",
    "cache", "batch", "server", "request", "stream", "prefix", "block", "trace", "replay", "mock",
    "engine", "data",
];

/// A tokenizer: built-in or loaded from a `tokenizer.json`.
pub enum Tokenizer {
    Builtin,
    Hf(Box<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Builtin => f.write_str("Tokenizer::Builtin"),
            Tokenizer::Hf(_) => f.write_str("Tokenizer::Hf"),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Alpha,
    Digit,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphabetic() {
        Class::Alpha
    } else if c.is_numeric() {
        Class::Digit
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Cuts text into built-in pieces (see the module doc).
pub fn builtin_pieces(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let start = chars[i].0;
        let mut j = i;
        // A single space glues to a following non-space run.
        if chars[j].1 == ' ' && j + 1 < chars.len() && class(chars[j + 1].1) != Class::Space {
            j += 1;
        }
        let cls = class(chars[j].1);
        let mut k = j + 1;
        let limit = match cls {
            Class::Digit => 3,
            _ => usize::MAX,
        };
        while k < chars.len() && class(chars[k].1) == cls && k - j < limit {
            // whitespace runs stop before a space that would lead the next piece
            if cls == Class::Space
                && chars[k].1 == ' '
                && k + 1 < chars.len()
                && class(chars[k + 1].1) != Class::Space
            {
                break;
            }
            k += 1;
        }
        if cls == Class::Alpha {
            // Cut letter runs into chunks of 4 letters; the first keeps the leading space.
            let mut s = i;
            let mut letters_start = j;
            while letters_start < k {
                let e = (letters_start + 4).min(k);
                let end = if e < chars.len() {
                    chars[e].0
                } else {
                    text.len()
                };
                out.push(&text[chars[s].0..end]);
                s = e;
                letters_start = e;
            }
        } else {
            let end = if k < chars.len() {
                chars[k].0
            } else {
                text.len()
            };
            out.push(&text[start..end]);
        }
        i = k;
    }
    out
}

fn builtin_id(piece: &str) -> u32 {
    256 + (xxhash_rust::xxh3::xxh3_64(piece.as_bytes()) % u64::from(BUILTIN_VOCAB - 256)) as u32
}

/// The text of one chat message's `content` (a string, or a list of `{"type":"text","text":..}`
/// parts; other parts are skipped).
pub fn message_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The fixed chat template (see the module doc). Errors name the message that is malformed.
pub fn chat_text(messages: &[Value]) -> Result<String, String> {
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
        s.push_str("<|");
        s.push_str(role);
        s.push_str("|>\n");
        s.push_str(&content);
        s.push('\n');
    }
    s.push_str("<|assistant|>\n");
    Ok(s)
}

impl Tokenizer {
    /// Loads `tokenizer.json`; the error names the file.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let t = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("--tokenizer {}: cannot load", path.display()))?;
        Ok(Tokenizer::Hf(Box::new(t)))
    }

    /// Tokenizes a text prompt.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
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

    /// Vocabulary size output ids are drawn from.
    pub fn vocab(&self) -> u32 {
        match self {
            Tokenizer::Builtin => BUILTIN_VOCAB,
            Tokenizer::Hf(t) => (t.get_vocab_size(false) as u32).max(1),
        }
    }

    /// Appends the text of output tokens to `out`.
    pub fn render(&self, ids: &[u32], out: &mut String) {
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
    pub fn token_str(&self, id: u32) -> Option<String> {
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
