//! Which trace requests a replay sends, and why the others are left out (pure; `compare`
//! applies the same selection to pair a recording with its replay).
//!
//! A recording holds more than the workload: side requests such as `/tokenize`, `GET /v1/models`
//! or `/metrics` scrapes. They stay in the trace but are left out of a replay unless
//! `--include-aux`. A request that cannot be re-issued faithfully is left out and counted with
//! its reason, never sent as an empty completion.

use super::{Endpoint, Request, Trace};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the user chose (`--include-aux`, `--skip-recorded-failures`) and what the run can build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Selection {
    pub(crate) include_aux: bool,
    pub(crate) skip_recorded_failures: bool,
    /// Text prompts can be built (`--tokenizer` with `--prompt-mode text`, or the target's
    /// `/tokenize` and `/detokenize` without a tokenizer).
    pub(crate) text_prompts: bool,
}

/// Why a request was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// A side request (`/tokenize`, `GET /v1/models`, ...), without `--include-aux`.
    Auxiliary,
    /// A side request `POST` whose body was not recorded (`record --bodies none`).
    AuxiliaryWithoutBody,
    /// Failed in the recording, and `--skip-recorded-failures` was given.
    RecordedFailure,
    /// A chat request without a recorded body needs text: `--prompt-mode text --tokenizer`, or a
    /// target that serves `/tokenize` and `/detokenize`.
    ChatWithoutTokenizer,
    /// `/v1/responses` without a recorded body (its prompts are not synthesised).
    ResponsesWithoutBody,
    /// Rerank, score, classify or pooling without a recorded body (their inputs are not
    /// synthesised; embeddings are).
    PoolingWithoutBody,
    /// No recorded body and no prompt tokens: nothing to send but an empty prompt.
    EmptyPrompt,
}

impl Skip {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Skip::Auxiliary => "auxiliary",
            Skip::AuxiliaryWithoutBody => "auxiliary_without_body",
            Skip::RecordedFailure => "recorded_failure",
            Skip::ChatWithoutTokenizer => "chat_without_tokenizer",
            Skip::ResponsesWithoutBody => "responses_without_body",
            Skip::PoolingWithoutBody => "pooling_without_body",
            Skip::EmptyPrompt => "empty_prompt",
        }
    }

    /// A workload request the replay could not rebuild (not a side request, not one the user
    /// chose to leave out).
    pub(crate) fn unrebuildable(self) -> bool {
        matches!(
            self,
            Skip::ChatWithoutTokenizer
                | Skip::ResponsesWithoutBody
                | Skip::PoolingWithoutBody
                | Skip::EmptyPrompt
        )
    }

    /// A side request (`--include-aux` or not): not part of the workload.
    pub(crate) fn auxiliary(self) -> bool {
        matches!(self, Skip::Auxiliary | Skip::AuxiliaryWithoutBody)
    }

    fn hint(self) -> &'static str {
        match self {
            Skip::Auxiliary => "--include-aux re-issues them",
            Skip::AuxiliaryWithoutBody => "record with --bodies request to re-issue them",
            Skip::RecordedFailure => "--skip-recorded-failures",
            Skip::ChatWithoutTokenizer => {
                "give --prompt-mode text --tokenizer FILE, or a target serving /tokenize and /detokenize"
            }
            Skip::ResponsesWithoutBody | Skip::PoolingWithoutBody => "record with --bodies request",
            Skip::EmptyPrompt => "no recorded body and input length 0",
        }
    }
}

/// Requests left out, by reason.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Skipped(pub BTreeMap<Skip, u64>);

impl Skipped {
    /// Reason name → count (the result file's `left_out`).
    pub(crate) fn by_name(&self) -> BTreeMap<&'static str, u64> {
        self.0.iter().map(|(k, n)| (k.as_str(), *n)).collect()
    }

    pub(crate) fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Requests left out for a reason `which` accepts.
    pub(crate) fn count(&self, which: impl Fn(Skip) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| which(**k))
            .map(|(_, n)| n)
            .sum()
    }

    /// One line for the console, or `None` when nothing was left out.
    pub(crate) fn summary(&self, of: usize) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, n)| format!("{n} {} ({})", k.as_str(), k.hint()))
            .collect();
        Some(format!(
            "left out {} of {of} requests: {}",
            self.total(),
            parts.join(", ")
        ))
    }
}

fn reason(r: &Request, s: &Selection) -> Option<Skip> {
    let failed = r.recorded_failure().is_some();
    if !r.is_workload() {
        return match (s.include_aux, &r.body, &r.method) {
            (false, _, _) => Some(Skip::Auxiliary),
            (true, None, None) => Some(Skip::AuxiliaryWithoutBody),
            _ => None,
        };
    }
    if failed && s.skip_recorded_failures {
        return Some(Skip::RecordedFailure);
    }
    if r.body.is_some() {
        return None;
    }
    match r.endpoint {
        Endpoint::Chat if !s.text_prompts => Some(Skip::ChatWithoutTokenizer),
        Endpoint::Responses => Some(Skip::ResponsesWithoutBody),
        Endpoint::Other(_) => Some(Skip::PoolingWithoutBody),
        _ if r.input_tokens == 0 && !failed => Some(Skip::EmptyPrompt),
        _ => None,
    }
}

/// Keeps the requests a replay sends (order kept) and counts the rest by reason.
pub(crate) fn select(trace: &mut Trace, s: &Selection) -> Skipped {
    let mut skipped = Skipped::default();
    trace.requests.retain(|r| skipped.keep(r, s));
    skipped
}

impl Skipped {
    /// [`select`] one request at a time: whether `r` is sent (else counted by its reason).
    pub(crate) fn keep(&mut self, r: &Request, s: &Selection) -> bool {
        match reason(r, s) {
            Some(k) => {
                *self.0.entry(k).or_default() += 1;
                false
            }
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Response, TraceHeader};

    fn r(method: Option<&str>, path: &str, body: bool, input: u64, status: u16) -> Request {
        Request {
            method: method.map(str::to_string),
            endpoint: Endpoint::from_path(path),
            body: body.then(|| b"{}".to_vec()),
            input_tokens: input,
            response: Some(Box::new(Response {
                status,
                error: (status >= 400).then(|| format!("http_{status}")),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn mix() -> Trace {
        Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: vec![
                r(None, "/v1/completions", false, 10, 200),
                r(None, "/v1/chat/completions", false, 10, 200),
                r(None, "/v1/chat/completions", true, 10, 200),
                r(Some("GET"), "/v1/models", false, 0, 200),
                r(None, "/tokenize", false, 0, 200),
                r(None, "/tokenize", true, 0, 200),
                r(None, "/v1/completions", false, 10, 404),
                r(None, "/v1/completions", false, 0, 200),
                r(None, "/v1/responses", false, 5, 200),
                r(None, "/v1/rerank", false, 5, 200),
            ],
        }
    }

    #[test]
    fn side_requests_are_left_out_unless_asked_for() {
        let mut t = mix();
        let sk = select(&mut t, &Selection::default());
        let want = [
            (Skip::Auxiliary, 3),
            (Skip::ChatWithoutTokenizer, 1),
            (Skip::ResponsesWithoutBody, 1),
            (Skip::PoolingWithoutBody, 1),
            (Skip::EmptyPrompt, 1),
        ];
        assert_eq!(sk.0, want.into_iter().collect());
        assert_eq!(t.requests.len(), 3);
        assert!(sk
            .summary(10)
            .unwrap()
            .starts_with("left out 7 of 10 requests: 3 auxiliary"));

        let mut t = mix();
        let s = Selection {
            include_aux: true,
            skip_recorded_failures: true,
            text_prompts: true,
        };
        let sk = select(&mut t, &s);
        let want = [
            (Skip::AuxiliaryWithoutBody, 1),
            (Skip::RecordedFailure, 1),
            (Skip::ResponsesWithoutBody, 1),
            (Skip::PoolingWithoutBody, 1),
            (Skip::EmptyPrompt, 1),
        ];
        assert_eq!(sk.0, want.into_iter().collect());
        let kept: Vec<_> = t
            .requests
            .iter()
            .map(|r| r.endpoint.path().to_string())
            .collect();
        assert_eq!(
            kept,
            [
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/chat/completions",
                "/v1/models",
                "/tokenize"
            ]
        );
        assert_eq!(Skipped::default().summary(3), None);
    }
}
