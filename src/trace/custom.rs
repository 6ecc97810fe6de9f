//! vLLM `custom` dataset JSONL: one `{"prompt": "..."}` object per line (`vllm bench serve
//! --dataset-name custom`), optionally with `output_tokens` (or `output_len`).
//!
//! These rows have text and no timing, so every request arrives at t0 (replay them with a rate
//! override or a concurrency limit), and the prompt is kept as the request body
//! (`{"prompt": ...}`) so replay sends it verbatim. Without a tokenizer the token count and blocks
//! are an approximation, documented here and in the header's `meta`: 4 UTF-8 bytes per token,
//! blocks of `4 * block_size` bytes hashed with chained xxh3 (so shared text prefixes still share
//! ids). Output length defaults to 256 tokens, vLLM's `--custom-output-len` default.

use super::hash::BlockHasher;
use super::rows::{ImportReport, ReadOptions, MAX_TOKENS};
use super::{Params, Request, Trace, TraceError, TraceHeader};
use serde::Deserialize;

/// Bytes per token in the approximation.
pub(crate) const BYTES_PER_TOKEN: usize = 4;
/// vLLM's default output length for the custom dataset.
pub(crate) const DEFAULT_OUTPUT_LEN: u64 = 256;
const BLOCK: u32 = 16;

#[derive(Deserialize)]
struct Row {
    prompt: String,
    #[serde(default, alias = "output_len")]
    output_tokens: Option<u64>,
}

/// Reads vLLM custom JSONL.
pub(crate) fn read(
    path: &str,
    data: &[u8],
    opts: &ReadOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    let text = std::str::from_utf8(data).map_err(|_| TraceError::File {
        path: path.to_string(),
        msg: "not UTF-8 text".into(),
    })?;
    let hasher = BlockHasher::xxh3();
    let mut rep = ImportReport::default();
    let mut reqs = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let lineno = k as u64 + 1;
        let row = Some(line)
            .filter(|l| l.trim_start().starts_with('{'))
            .ok_or_else(|| "a row must be a JSON object".to_string())
            .and_then(|l| serde_json::from_str::<Row>(l).map_err(|e| e.to_string()))
            .and_then(|r| match r.output_tokens {
                Some(o) if o > MAX_TOKENS => Err(format!("output_tokens {o} is absurd")),
                _ => Ok(r),
            });
        let row = match row {
            Ok(r) => r,
            Err(m) if opts.skip_bad => {
                rep.bad_row(lineno, m);
                continue;
            }
            Err(m) => return Err(super::rows::row_error(path, lineno, m, opts)),
        };
        let bytes = row.prompt.as_bytes();
        let chunk = BYTES_PER_TOKEN * BLOCK as usize;
        let mut prev = 0u64;
        let mut hash_ids = Vec::with_capacity(bytes.len().div_ceil(chunk));
        for block in bytes.chunks(chunk) {
            // Hash the bytes as u32 words (zero-padded) so the block hasher can be reused.
            let words: Vec<u32> = block
                .chunks(4)
                .map(|w| {
                    let mut b = [0u8; 4];
                    b[..w.len()].copy_from_slice(w);
                    u32::from_le_bytes(b)
                })
                .collect();
            prev = hasher.block(prev, &words);
            hash_ids.push(prev);
        }
        let out = row.output_tokens.unwrap_or(DEFAULT_OUTPUT_LEN);
        let body = serde_json::json!({ "prompt": row.prompt }).to_string();
        reqs.push(Request {
            input_tokens: bytes.len().div_ceil(BYTES_PER_TOKEN) as u64,
            output_tokens: out,
            hash_ids,
            params: Params {
                max_tokens: Some(out as u32),
                ..Default::default()
            },
            body: Some(body.into_bytes()),
            ..Default::default()
        });
    }
    rep.rows = reqs.len() as u64;
    let mut header = TraceHeader::imported(BLOCK, true, format!("vllm-custom:{path}"));
    header.hash_scheme = super::HashScheme::Xxh3;
    header.meta.insert(
        "approximation".into(),
        format!("no tokenizer: {BYTES_PER_TOKEN} bytes per token; blocks of {BLOCK} tokens"),
    );
    Ok((
        Trace {
            header,
            requests: reqs,
        },
        rep,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_text_prefix_shares_ids() {
        let p = "x".repeat(200);
        let data =
            format!("{{\"prompt\": \"{p}a\"}}\n{{\"prompt\": \"{p}b\", \"output_tokens\": 7}}\n");
        let (t, _) = read("c.jsonl", data.as_bytes(), &ReadOptions::default()).unwrap();
        let (a, b) = (&t.requests[0], &t.requests[1]);
        assert_eq!(a.input_tokens, 51);
        assert_eq!(a.output_tokens, DEFAULT_OUTPUT_LEN);
        assert_eq!(b.output_tokens, 7);
        assert_eq!(a.hash_ids.len(), 4);
        assert_eq!(a.hash_ids[..3], b.hash_ids[..3]);
        assert_ne!(a.hash_ids[3], b.hash_ids[3]);
        assert!(String::from_utf8_lossy(a.body.as_ref().unwrap()).contains("prompt"));
    }

    #[test]
    fn bad_line_is_named() {
        let e = read(
            "c.jsonl",
            b"{\"prompt\": \"a\"}\n{\"nope\": 1}\n",
            &ReadOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("c.jsonl:2:"), "{e}");
    }
}
