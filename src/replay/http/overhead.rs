//! What the target adds to a text prompt: its special tokens (a BOS) on `/v1/completions`, its
//! chat template around one user message on `/v1/chat/completions`. A synthesised text prompt
//! is made that much shorter, so that the server counts the recorded length (a recording's
//! input length is the server's own count). Measured once, before the clock, with the target's
//! tokenizer endpoints: a sample text as a prompt and as a chat message, against its length in
//! the replay's tokenizer. vLLM (and the mock): `POST /tokenize` with `prompt` or `messages`,
//! answering `count`. llama.cpp: `POST /tokenize` with `content` answering `tokens`, and
//! `POST /apply-template` for the chat. A target with neither adds nothing, and the replay says
//! so.

use crate::replay::http::client::Client;
use crate::replay::http::request::Overheads;
use crate::replay::plan::prompts::{TextBuilder, TextFidelity};
use crate::replay::plan::servertext::count_of;
use serde_json::json;

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
pub(crate) async fn measure(client: &Client, model: &str, tb: &TextBuilder) -> (Overheads, String) {
    let (text, fid) = tb.prompt_text(&[], SAMPLE_TOKENS, u64::MAX);
    if fid != TextFidelity::Exact {
        return (
            Overheads::default(),
            "text prompts not fitted to the target's special tokens and chat template (the sample does not re-encode exactly)".into(),
        );
    }
    let prompt = prompt_count(client, model, &text).await;
    if let Ok(short) = prompt {
        if let Some(line) = mismatch(client, model, tb, short).await {
            return (Overheads::default(), line);
        }
    }
    let chat = chat_count(client, model, &text).await;
    match (prompt.map(overhead), chat.map(overhead)) {
        (Ok(Some(completions)), Ok(Some(chat))) => (
            Overheads { completions, chat },
            format!("text prompts fitted to the target: it adds {completions} tokens to a completion prompt and {chat} to a chat message (measured with its /tokenize)"),
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

/// Whether the replay's tokenizer is the target's: a template adds the same tokens to any
/// prompt, so `SAMPLE_TOKENS` more tokens of the replay's tokenizer must count as that many more
/// on the target. A line naming the mismatch when they do not (`short`: the target's count of
/// the sample).
async fn mismatch(client: &Client, model: &str, tb: &TextBuilder, short: u64) -> Option<String> {
    let (text, fid) = tb.prompt_text(&[], 2 * SAMPLE_TOKENS, u64::MAX);
    if fid != TextFidelity::Exact {
        return None;
    }
    let long = prompt_count(client, model, &text).await.ok()?;
    let more = long.checked_sub(short);
    (more != Some(SAMPLE_TOKENS)).then(|| mismatch_line(short, long))
}

fn mismatch_line(short: u64, long: u64) -> String {
    format!(
        "the --tokenizer does not match the target's: {SAMPLE_TOKENS} and {} tokens of it count as {short} and {long} on the target, so text prompts will not have the recorded lengths (give the target model's tokenizer.json, or leave --tokenizer out to build prompts through the target)",
        2 * SAMPLE_TOKENS
    )
}

/// `POST /tokenize` of `text` as a prompt, special tokens included (vLLM reads `prompt`,
/// llama.cpp `content` and `add_special`).
async fn prompt_count(client: &Client, model: &str, text: &str) -> Result<u64, String> {
    let body = json!({"model": model, "prompt": text, "content": text, "add_special": true});
    let answer = client.post_json("/tokenize", &body).await?;
    count_of(&answer)
}

/// The length of one user message `text` as a chat prompt: vLLM's `/tokenize` with `messages`;
/// else llama.cpp's `/apply-template`, then its `/tokenize` of the templated prompt.
async fn chat_count(client: &Client, model: &str, text: &str) -> Result<u64, String> {
    let messages = json!([{"role": "user", "content": text}]);
    let vllm = client
        .post_json("/tokenize", &json!({"model": model, "messages": messages}))
        .await;
    if let Some(n) = vllm.as_ref().ok().and_then(|a| a["count"].as_u64()) {
        return Ok(n);
    }
    let templated = client
        .post_json("/apply-template", &json!({"messages": messages}))
        .await
        .map_err(|e| format!("chat: {e}"))?;
    let prompt = templated["prompt"]
        .as_str()
        .ok_or("POST /apply-template: no `prompt` in the answer")?;
    let body = json!({"content": prompt, "add_special": true, "parse_special": true});
    let answer = client.post_json("/tokenize", &body).await?;
    count_of(&answer)
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
        let (c, chat) = (crate::metrics::Api::Completions, crate::metrics::Api::Chat);
        assert_eq!((o.of(c), o.of(chat)), (1, 16));
    }
}
