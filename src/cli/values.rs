//! The command line's values: parsers of durations, time windows and sizes, their defaults'
//! text, and `clap::ValueEnum` for the engines' enums (their names and per-value help as `--help`
//! lists them).

use crate::convert::OutFormat;
use crate::metrics::Api;
use crate::replay::http::request::PromptMode;
use crate::report::render::RenderFormat as CompareFormat;
use crate::trace::import::Format;
use anyhow::{bail, Context};
use clap::builder::PossibleValue;
use clap::ValueEnum;
use std::time::Duration;

/// Parses `START..END` with units `ms`, `s` (default), `m`, `h`; either side may be empty.
pub(crate) fn parse_window(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("window `{s}` must look like START..END, e.g. 60s..120s"))?;
    let a = if a.trim().is_empty() {
        0
    } else {
        parse_duration_us(a)?
    };
    let b = if b.trim().is_empty() {
        u64::MAX
    } else {
        parse_duration_us(b)?
    };
    if b <= a {
        return Err(format!("window `{s}`: END must be after START"));
    }
    Ok((a, b))
}

/// Parses `1.5s`, `250ms`, `2m` (or `2min`), `1h`, `30` (seconds) into µs.
pub(crate) fn parse_duration_us(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("min") {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600e6)
    } else {
        (s, 1e6)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 90s, 250ms, 2m)"))?;
    if !v.is_finite() || v < 0.0 || v * mul > 1e18 {
        return Err(format!("duration `{s}` is negative or too large"));
    }
    Ok((v * mul).round() as u64)
}

/// An optional flag's value parsed by `parse`; the error names `flag`.
pub(crate) fn parse_flag<T>(
    flag: &str,
    value: Option<&str>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> anyhow::Result<Option<T>> {
    value
        .map(parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// Parses `250ms`, `10s`, `5m`, `1h` or a plain number of seconds.
pub(crate) fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_micros(
        parse_duration_us(s).map_err(anyhow::Error::msg)?,
    ))
}

/// `d` as [`parse_duration`] reads it back, in the largest whole unit (`15m`, `30s`, `250ms`).
pub(crate) fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms % 3_600_000 == 0 && ms > 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 && ms > 0 => format!("{}m", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// Parses `64MiB`, `1GiB`, `512KiB`, `1000000` (bytes); `K/M/G` mean the binary units too.
pub(crate) fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let i = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..i]
        .parse()
        .with_context(|| format!("{s:?} is not a size (like 64MiB)"))?;
    let mul: u64 = match t[i..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        u => bail!("{s:?}: unknown unit {u:?} (use KiB, MiB or GiB)"),
    };
    n.checked_mul(mul)
        .with_context(|| format!("{s:?} is too large"))
}

/// `bytes` as [`parse_size`] reads it back, in the largest whole binary unit (`512MiB`).
pub(crate) fn size_text(bytes: u64) -> String {
    match [(30, "GiB"), (20, "MiB"), (10, "KiB")]
        .into_iter()
        .find(|&(shift, _)| bytes > 0 && bytes % (1 << shift) == 0)
    {
        Some((shift, unit)) => format!("{}{unit}", bytes >> shift),
        None => bytes.to_string(),
    }
}

/// A possible value with its help line.
fn value(name: &'static str, help: &'static str) -> PossibleValue {
    PossibleValue::new(name).help(help)
}

impl ValueEnum for Format {
    fn value_variants<'a>() -> &'a [Self] {
        use Format::*;
        &[Native, Mooncake, Azure, Burstgpt, Sessions, Custom]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            Format::Native => value("native", "retrace's own `*.trace.zst`"),
            Format::Mooncake => value(
                "mooncake",
                "Mooncake JSONL (timestamp, input_length, output_length, hash_ids)",
            ),
            Format::Azure => value("azure", "Azure LLM inference trace CSV (2023/2024)"),
            Format::Burstgpt => value("burstgpt", "BurstGPT CSV"),
            Format::Sessions => value("sessions", "kv-cache-tester / WEKA session JSON"),
            Format::Custom => value("custom", "vLLM custom dataset JSONL (`{\"prompt\": ...}`)"),
        })
    }
}

impl ValueEnum for OutFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &[OutFormat::Native, OutFormat::Mooncake]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            OutFormat::Native => value("native", "retrace's native `*.trace.zst`"),
            OutFormat::Mooncake => value(
                "mooncake",
                "Mooncake JSONL (ids compacted to 0..N-1; loads in vllm bench serve timed_trace, \
                 AIPerf, SGLang)",
            ),
        })
    }
}

impl ValueEnum for Api {
    fn value_variants<'a>() -> &'a [Self] {
        &[Api::Completions, Api::Chat]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            Api::Completions => value("completions", "`/v1/completions`"),
            Api::Chat => value(
                "chat",
                "`/v1/chat/completions` (text: from `--prompt-mode text --tokenizer ...`, else \
                 from the target's /tokenize and /detokenize)",
            ),
        })
    }
}

impl ValueEnum for PromptMode {
    fn value_variants<'a>() -> &'a [Self] {
        &[PromptMode::TokenIds, PromptMode::Text]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            PromptMode::TokenIds => value(
                "token-ids",
                "Token ids (`\"prompt\": [ints]`): exact lengths and prefixes, no \
                 re-tokenisation",
            ),
            PromptMode::Text => value(
                "text",
                "Text that re-encodes to the same tokens where the tokenizer allows \
                 (`--tokenizer`; without one, made and counted by the target's /tokenize and \
                 /detokenize)",
            ),
        })
    }
}

impl ValueEnum for CompareFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            CompareFormat::Text,
            CompareFormat::Markdown,
            CompareFormat::Json,
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(match self {
            CompareFormat::Text => "text",
            CompareFormat::Markdown => "markdown",
            CompareFormat::Json => "json",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_are_clear() {
        assert!(parse_window("5s").unwrap_err().contains("START..END"));
        assert!(parse_window("5s..1s").is_err());
        assert_eq!(parse_window("..250ms").unwrap(), (0, 250_000));
        assert_eq!(parse_duration_us("2m").unwrap(), 120_000_000);
        assert!(parse_duration_us("-1s").is_err());
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("1XB").is_err());
    }

    #[test]
    fn texts_read_back() {
        for s in ["10s", "15m", "1h", "250ms", "0s"] {
            assert_eq!(duration_text(parse_duration(s).unwrap()), s);
        }
        for s in ["512MiB", "16MiB", "1GiB", "4KiB", "1000"] {
            assert_eq!(size_text(parse_size(s).unwrap()), s);
        }
    }
}
