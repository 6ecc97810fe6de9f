//! What the target adds to a text prompt: its special tokens (a BOS) on `/v1/completions`, its
//! chat template around one user message on `/v1/chat/completions`. A synthesised text prompt
//! is made that much shorter, so that the server counts the recorded length (a recording's
//! input length is the server's own count). Measured once, before the clock, with the target's
//! `POST /tokenize` (vLLM's, and the mock's): a sample text as a prompt and as a chat message,
//! against its length in the replay's tokenizer. A target without that endpoint adds nothing,
//! and the replay says so.

use super::client::Client;
use crate::metrics::Api;
use crate::synth::{TextBuilder, TextFidelity};
use serde_json::json;

/// Tokens the target adds to a text prompt, per API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overheads {
    pub completions: u64,
    pub chat: u64,
}

impl Overheads {
    pub fn of(&self, api: Api) -> u64 {
        match api {
            Api::Completions => self.completions,
            Api::Chat => self.chat,
        }
    }
}

/// Length of the sample text, in the replay's tokenizer.
const SAMPLE_TOKENS: u64 = 32;
/// A larger difference is not believed to be a template (the tokenizers differ).
const MAX_OVERHEAD: u64 = 4096;

/// One API's overhead from the target's count of the sample: `None` when the count cannot be
/// the sample plus a template (fewer tokens than the sample, or absurdly many).
fn overhead(count: u64) -> Option<u64> {
    count
        .checked_sub(SAMPLE_TOKENS)
        .filter(|o| *o <= MAX_OVERHEAD)
}

/// Measures the target's overheads; the second value is a line for the console.
pub async fn measure(client: &Client, model: &str, tb: &TextBuilder) -> (Overheads, String) {
    let (text, fid) = tb.prompt_text(&[], SAMPLE_TOKENS, u64::MAX);
    if fid != TextFidelity::Exact {
        return (
            Overheads::default(),
            "text prompts not fitted to the target's special tokens and chat template (the sample does not re-encode exactly)".into(),
        );
    }
    let prompt = client
        .tokenize_count(&json!({"model": model, "prompt": text}))
        .await;
    let chat = client
        .tokenize_count(&json!({"model": model, "messages": [{"role": "user", "content": text}]}))
        .await;
    match (prompt.map(overhead), chat.map(overhead)) {
        (Ok(Some(completions)), Ok(Some(chat))) => (
            Overheads { completions, chat },
            format!("text prompts fitted to the target (POST /tokenize): it adds {completions} tokens to a completion prompt, {chat} to a chat message"),
        ),
        (Err(e), _) | (_, Err(e)) => (
            Overheads::default(),
            format!("text prompts not fitted to the target's special tokens and chat template ({e}): its input lengths may exceed the recorded ones"),
        ),
        _ => (
            Overheads::default(),
            "text prompts not fitted: the target's /tokenize counts do not fit the --tokenizer (a different tokenizer?)".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overhead_is_the_count_beyond_the_sample() {
        assert_eq!(overhead(SAMPLE_TOKENS), Some(0));
        assert_eq!(overhead(SAMPLE_TOKENS + 1), Some(1));
        assert_eq!(overhead(SAMPLE_TOKENS + 16), Some(16));
        assert_eq!(overhead(SAMPLE_TOKENS - 1), None);
        assert_eq!(overhead(SAMPLE_TOKENS + MAX_OVERHEAD + 1), None);
        let o = Overheads {
            completions: 1,
            chat: 16,
        };
        assert_eq!((o.of(Api::Completions), o.of(Api::Chat)), (1, 16));
    }
}
