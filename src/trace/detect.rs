//! Detecting a trace file's format from its content (never from its name alone).

use super::import::Format;
use super::{native, TraceError};

/// Detects the format of `data` (the file's bytes); `path` names it in errors.
pub fn detect(path: &str, data: &[u8]) -> Result<Format, TraceError> {
    if native::sniff(data) {
        return Ok(Format::Native);
    }
    let head = &data[..data.len().min(4096)];
    let text = String::from_utf8_lossy(head);
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if first.trim_start().starts_with('{')
        && first.contains("\"hash_ids\"")
        && first.contains("\"input_length\"")
    {
        return Ok(Format::Mooncake);
    }
    Err(TraceError::File {
        path: path.to_string(),
        msg: "unknown trace format (give --from to force one)".into(),
    })
}
