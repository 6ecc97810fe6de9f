//! The command line's value types: `clap::ValueEnum` for the engines' enums (their names and
//! per-value help as `--help` lists them).

use crate::convert::OutFormat;
use crate::metrics::Api;
use crate::replay::http::request::PromptMode;
use crate::report::render::Format as CompareFormat;
use crate::trace::import::Format;
use clap::builder::PossibleValue;
use clap::ValueEnum;

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
