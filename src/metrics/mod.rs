//! Client-side serving metrics exactly as `vllm bench serve` defines them, from per-request samples.
//!
//! [`StreamClock`] applies vLLM's per-stream timing rules message by message (domain.md §3):
//! TTFT is the first SSE message with a non-empty `choices` array minus the send time; each later
//! such message adds one ITL gap; E2EL ends at the last content message on `/v1/completions` and at
//! the last message of any kind (the usage chunk included) on chat, where every message also moves
//! the "previous message" mark that ITL gaps are measured from. [`Sample`] is one finished request;
//! [`summarize`] turns samples into vLLM's statistics: mean, median, population std and linearly
//! interpolated percentiles, computed from the exact samples with numpy's own arithmetic (pairwise
//! summation, its percentile interpolation), in seconds then scaled to ms as vLLM does, so the
//! numbers match `vllm bench serve` on the same timings bit for bit. TPOT per request is
//! (E2EL − TTFT)/(output_tokens − 1) when output_tokens > 1; ITL is pooled over requests;
//! throughputs divide by the run duration; input/output tokens count successful requests only.
//! [`Collector`] folds samples in as they finish; past [`SCALAR_BOUND`] requests its statistics
//! come from running aggregates instead (docs/replay.md#memory).
//!
//! [`Histograms`] holds the same distributions as HdrHistograms (µs, 3 significant digits; drift and
//! client queue in ns) and serialises them in the V2 format, base64, so result files from shards
//! merge and compare exactly. This module is pure: no clock, no I/O, no async.

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

mod clock;
pub(crate) use clock::*;
mod sample;
pub use sample::*;
mod numpy;
pub(crate) use numpy::*;
mod summary;
pub use summary::*;
mod collector;
pub use collector::*;
mod histograms;
pub use histograms::*;

#[cfg(test)]
mod tests;
