//! Detecting a trace file's format from its content (never from its name alone).
//!
//! Rules, in order: a zstd frame holding our header magic is native; CSV headers name Azure
//! (`TIMESTAMP,ContextTokens,GeneratedTokens`) or BurstGPT (`Request tokens`); a JSON object with
//! `requests` and no `hash_ids` at top level is a session trace; JSON lines with `input_length` and
//! `timestamp` are Mooncake; JSON lines with `prompt` are vLLM custom.

use super::{native, TraceError};

/// Options for reading a trace file (`import::read_path`, `stream::open`).
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Force a format instead of detecting it.
    pub format: Option<Format>,
    /// Skip (and count) malformed rows instead of failing.
    pub skip_bad: bool,
    /// The command has `--skip-bad`: a malformed row's error names it.
    pub offer_skip_bad: bool,
    /// Tokens per hash id to read the trace with (replay's `--block-size`, inspect's and
    /// convert's `--trace-block-size`), over the file's own (a native or session header) or its
    /// format's default (Mooncake's 512). Every reader bounds a record's hash ids with it, so it
    /// is known before any row is read.
    pub block_size: Option<u32>,
}

impl ImportOptions {
    /// What the line-oriented importers take of these options.
    pub(crate) fn read_options(&self) -> super::rows::ReadOptions {
        super::rows::ReadOptions {
            skip_bad: self.skip_bad,
            offer_skip_bad: self.offer_skip_bad,
            block_size: self.block_size,
        }
    }
}

/// Trace file formats retrace reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// retrace's own `*.trace.zst`.
    Native,
    /// Mooncake JSONL (timestamp, input_length, output_length, hash_ids).
    Mooncake,
    /// Azure LLM inference trace CSV (2023/2024).
    Azure,
    /// BurstGPT CSV.
    Burstgpt,
    /// kv-cache-tester / WEKA session JSON.
    Sessions,
    /// vLLM custom dataset JSONL (`{"prompt": ...}`).
    Custom,
}

/// Detects the format of `data` (the file's bytes); `path` names it in errors.
pub fn detect(path: &str, data: &[u8]) -> Result<Format, TraceError> {
    if native::sniff(data) {
        return Ok(Format::Native);
    }
    if data.iter().all(u8::is_ascii_whitespace) {
        return Err(TraceError::File {
            path: path.to_string(),
            msg: "the file is empty: no trace in it".into(),
        });
    }
    let head = &data[..data.len().min(64 * 1024)];
    let text = String::from_utf8_lossy(head);
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let lower = first.to_ascii_lowercase();
    if lower.starts_with("timestamp,contexttokens,generatedtokens") {
        return Ok(Format::Azure);
    }
    if lower.contains("request tokens") && lower.contains("timestamp") {
        return Ok(Format::Burstgpt);
    }
    let t = text.trim_start();
    if t.starts_with('{') || t.starts_with('[') {
        let compact: String = first.chars().filter(|c| !c.is_whitespace()).collect();
        if compact.contains("\"requests\":")
            || (t.starts_with('[') && text.contains("\"requests\""))
        {
            return Ok(Format::Sessions);
        }
        if compact.contains("\"input_length\":") && compact.contains("\"timestamp\":") {
            return Ok(Format::Mooncake);
        }
        if compact.contains("\"prompt\":") {
            return Ok(Format::Custom);
        }
        if t.starts_with('{') && !first.ends_with('}') && text.contains("\"requests\"") {
            return Ok(Format::Sessions);
        }
    }
    Err(TraceError::File {
        path: path.to_string(),
        msg: "unknown trace format (give --from to force one: native, mooncake, azure, burstgpt, sessions, custom)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_called_empty() {
        for data in [&b""[..], b"\n  \n"] {
            let e = detect("e.jsonl", data).unwrap_err().to_string();
            assert!(e.contains("e.jsonl") && e.contains("empty"), "{e}");
        }
    }

    #[test]
    fn detects_each_format() {
        let cases: &[(&str, Format)] = &[
            ("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n", Format::Mooncake),
            ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1", Format::Azure),
            ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n", Format::Burstgpt),
            ("{\"id\":\"x\",\"block_size\":64,\"requests\":[]}", Format::Sessions),
            ("{\n  \"id\": \"x\",\n  \"requests\": []\n}", Format::Sessions),
            ("{\"prompt\": \"hello\"}\n", Format::Custom),
        ];
        for (data, f) in cases {
            assert_eq!(detect("x", data.as_bytes()).unwrap(), *f, "{data}");
        }
        assert!(detect("x", b"hello").is_err());
    }
}
