//! Prompt → token ids for block hashing: exact for token-id prompts and for text with
//! `--tokenizer`, else 4 bytes a pseudo-token; chat messages rendered canonically one by one, so a
//! conversation that extends an earlier one shares its block hashes (docs/record.md, "What a
//! record holds"). Whether the ids are exact is returned, so the caller can prefer `usage`.

use crate::wire::openai::{Prompt, RequestInfo};
use serde_json::Value;

/// How text becomes tokens.
#[derive(Debug)]
pub enum TextTokenizer {
    /// 4 bytes per pseudo-token.
    Approx,
    /// A Hugging Face `tokenizer.json`.
    Hf(Box<tokenizers::Tokenizer>),
}

/// The tokens of a prompt and whether they are what the server sees.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromptTokens {
    pub(crate) ids: Vec<u32>,
    pub(crate) exact: bool,
}

impl TextTokenizer {
    /// Loads `tokenizer.json`; the error names the file.
    pub(crate) fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let t = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("--tokenizer {}: {e}", path.display()))?;
        Ok(TextTokenizer::Hf(Box::new(t)))
    }

    /// A short description for the trace header.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            TextTokenizer::Approx => "approx-4-bytes-per-token",
            TextTokenizer::Hf(_) => "hf-tokenizer",
        }
    }

    fn text(&self, s: &str, add_special: bool, out: &mut Vec<u32>) -> bool {
        match self {
            TextTokenizer::Approx => {
                approx(s.as_bytes(), out);
                false
            }
            TextTokenizer::Hf(t) => match t.encode(s, add_special) {
                Ok(enc) => {
                    out.extend_from_slice(enc.get_ids());
                    true
                }
                Err(_) => {
                    approx(s.as_bytes(), out);
                    false
                }
            },
        }
    }

    /// Tokens of the request's prompt (first prompt of a batch), or `None` when it has none.
    pub(crate) fn prompt_tokens(&self, info: &RequestInfo) -> Option<PromptTokens> {
        if let Some(p) = &info.prompt {
            let mut p = p;
            while let Prompt::Batch(items) = p {
                p = items.first()?;
            }
            return Some(match p {
                Prompt::TokenIds(ids) => PromptTokens {
                    ids: ids.clone(),
                    exact: true,
                },
                Prompt::Text(s) => {
                    let mut ids = Vec::new();
                    let exact = self.text(s, true, &mut ids);
                    PromptTokens { ids, exact }
                }
                Prompt::Batch(_) => unreachable!("batches unwrapped above"),
            });
        }
        let msgs = info.messages.as_ref()?;
        let mut ids = Vec::new();
        for m in msgs {
            self.text(&render_message(m), false, &mut ids);
        }
        Some(PromptTokens { ids, exact: false })
    }
}

/// Total tokens of every prompt of a batch (for `input_tokens`), when all are token ids or text.
pub(crate) fn batch_len(tok: &TextTokenizer, p: &Prompt) -> u64 {
    match p {
        Prompt::TokenIds(ids) => ids.len() as u64,
        Prompt::Text(s) => {
            let mut v = Vec::new();
            tok.text(s, true, &mut v);
            v.len() as u64
        }
        Prompt::Batch(items) => items.iter().map(|x| batch_len(tok, x)).sum(),
    }
}

/// Canonical rendering of one chat message (see the module doc).
pub(crate) fn render_message(m: &Value) -> String {
    let Some(obj) = m.as_object() else {
        return format!("<|?|>\n{m}\n");
    };
    let role = obj.get("role").and_then(Value::as_str).unwrap_or("?");
    let mut s = format!("<|{role}|>\n");
    match obj.get("content") {
        Some(Value::String(c)) => s.push_str(c),
        Some(Value::Null) | None => {}
        // serde_json's map is ordered by key, so this is sorted-key JSON.
        Some(other) => s.push_str(&other.to_string()),
    }
    let rest: serde_json::Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| *k != "role" && *k != "content")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !rest.is_empty() {
        s.push_str(&Value::Object(rest).to_string());
    }
    s.push('\n');
    s
}

fn approx(bytes: &[u8], out: &mut Vec<u32>) {
    for c in bytes.chunks(4) {
        let mut b = [0u8; 4];
        b[..c.len()].copy_from_slice(c);
        out.push(u32::from_le_bytes(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Endpoint;
    use crate::wire::openai::parse_request;

    #[test]
    fn token_ids_are_exact() {
        let info = parse_request(&Endpoint::Completions, br#"{"prompt":[5,6,7]}"#).unwrap();
        let t = TextTokenizer::Approx.prompt_tokens(&info).unwrap();
        assert_eq!(
            t,
            PromptTokens {
                ids: vec![5, 6, 7],
                exact: true
            }
        );
    }

    #[test]
    fn approx_is_four_bytes_per_token() {
        let info = parse_request(&Endpoint::Completions, br#"{"prompt":"abcdefghi"}"#).unwrap();
        let t = TextTokenizer::Approx.prompt_tokens(&info).unwrap();
        assert_eq!(t.ids.len(), 3);
        assert!(!t.exact);
    }

    #[test]
    fn chat_prefix_gives_token_prefix_and_key_order_does_not_matter() {
        let a = parse_request(
            &Endpoint::Chat,
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let b = parse_request(
            &Endpoint::Chat,
            br#"{"messages":[{"content":"be brief","role":"system"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello","name":"x"}]}"#,
        )
        .unwrap();
        let ta = TextTokenizer::Approx.prompt_tokens(&a).unwrap().ids;
        let tb = TextTokenizer::Approx.prompt_tokens(&b).unwrap().ids;
        assert!(tb.len() > ta.len());
        assert_eq!(&tb[..ta.len()], &ta[..]);
    }

    #[test]
    fn structured_content_is_canonical() {
        let a: Value =
            serde_json::from_str(r#"{"role":"user","content":[{"type":"text","text":"x"}]}"#)
                .unwrap();
        let b: Value =
            serde_json::from_str(r#"{"content":[{"text":"x","type":"text"}],"role":"user"}"#)
                .unwrap();
        assert_eq!(render_message(&a), render_message(&b));
    }
}
