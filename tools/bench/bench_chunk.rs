//! Instructions per parse of one OpenAI-compatible response body or SSE chunk, for callgrind:
//! `openai::parse_chunk` (what replay and the recorder's stream path use per event) and, where
//! the build has it, the recorder's reader of a non-streamed body
//! (`openai::parse_response_body`; before it existed the recorder used `parse_chunk` there). Each sample is parsed `--n`
//! times inside a function named `measure_<what>` that `tools/bench/bench_chunk_cpu.sh` tells callgrind
//! to count alone (`--toggle-collect`), so start-up and sample building are not counted.
//! Not a timing benchmark and not a test: it prints the result of the last parse so the work
//! cannot be optimised away, nothing else.
//!
//! Usage: `bench_chunk <sample> <chunk|body> [--n 10000]`, samples: `small` (the body of
//! `bench_record`'s `/small` upstream), `vllm_body` (real vLLM 0.32 non-streamed body with
//! `metrics`), `vllm_body_plain` (the same without `metrics`), `vllm_event` (a real streamed
//! content chunk), `vllm_usage` (the real streamed usage chunk with `metrics`).

use std::hint::black_box;

const METRICS: &str = include_str!("../../fixtures/vllm/per_request_metrics_example.txt");

fn sample(name: &str) -> Vec<u8> {
    let body = METRICS.lines().find(|l| l.starts_with('{')).expect("body");
    let data: Vec<&str> = METRICS
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    match name {
        "small" => br#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#.to_vec(),
        "vllm_body" => body.as_bytes().to_vec(),
        "vllm_body_plain" => {
            let at = body.find(",\"metrics\":").expect("metrics");
            format!("{}}}", &body[..at]).into_bytes()
        }
        "vllm_event" => data[0].as_bytes().to_vec(),
        "vllm_usage" => data
            .iter()
            .find(|d| d.contains("metrics"))
            .expect("usage chunk")
            .as_bytes()
            .to_vec(),
        other => {
            eprintln!("unknown sample {other}");
            std::process::exit(2);
        }
    }
}

#[inline(never)]
fn measure_chunk(data: &[u8], n: u64) -> String {
    let mut last = None;
    for _ in 0..n {
        last = Some(retrace::wire::openai::parse_chunk(black_box(data)));
    }
    format!("{last:?}")
}

#[inline(never)]
fn measure_body(data: &[u8], n: u64) -> String {
    let mut last = None;
    for _ in 0..n {
        last = Some(retrace::wire::openai::parse_response_body(black_box(data)));
    }
    format!("{last:?}")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = args
        .iter()
        .position(|a| a == "--n")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000u64);
    let (Some(name), Some(what)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: bench_chunk <small|vllm_body|vllm_body_plain|vllm_event|vllm_usage> <chunk|body> [--n N]");
        std::process::exit(2);
    };
    let data = sample(name);
    let out = match what.as_str() {
        "chunk" => measure_chunk(&data, n),
        "body" => measure_body(&data, n),
        _ => {
            eprintln!("what: chunk or body");
            std::process::exit(2);
        }
    };
    println!("{out}");
}
