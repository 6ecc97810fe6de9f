//! Benchmark of `retrace report` and `retrace compare` on large runs: builds synthetic
//! 100,000-request retrace results (`--detailed`, schema `retrace.replay/1`, written by the real
//! result builder), then times loading, HTML report generation and a comparison, and prints file
//! sizes. Not a test: run `tools/bench/bench_report.sh`, which also times the page in headless Chromium.
//!
//! Usage: `bench_report OUT_DIR [N]` writes `OUT_DIR/base.json`, `OUT_DIR/cand.json` (TTFT 5 %
//! slower), `OUT_DIR/report.html` and `OUT_DIR/compare.html`.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};
use retrace::metrics::{summarize, Histograms, Sample, Scalars, ServerTimes};
use retrace::report::{compare, html, load};
use retrace::result::{build, RunInfo, Traffic};
use std::path::PathBuf;
use std::time::Instant;

const MS: u64 = 1_000_000;

/// `n` requests arriving as Poisson at 200 req/s; lognormal TTFT around `ttft_ms`; 10-150 output
/// tokens with ~9 ms gaps; server metrics on every request.
fn samples(n: usize, ttft_ms: f64, seed: u64) -> Vec<Sample> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let gap = Exp::new(200.0).expect("rate");
    let ttft = LogNormal::new(ttft_ms.ln(), 0.4).expect("lognormal");
    let mut t = 0f64;
    (0..n)
        .map(|i| {
            t += gap.sample(&mut rng);
            let intended = (t * 1e9) as u64;
            let sent = intended + rng.random_range(0..200_000);
            let first = (ttft.sample(&mut rng) * MS as f64) as u64;
            let out = rng.random_range(10..150u64);
            let itls: Vec<u64> = (1..out)
                .map(|_| 7 * MS + rng.random_range(0..4 * MS))
                .collect();
            let e2el = first + itls.iter().sum::<u64>();
            let failed = i % 500 == 7;
            Sample {
                scalars: Scalars {
                    input_tokens: rng.random_range(100..4000),
                    output_tokens: if failed { 0 } else { out },
                    intended_ns: intended,
                    dispatched_ns: intended + 50_000,
                    slot_wait_ns: sent.saturating_sub(intended + 50_000),
                    sent_ns: sent.max(intended + 50_000),
                    ttft_ns: (!failed).then_some(first),
                    e2el_ns: (!failed).then_some(e2el),
                    end_ns: sent + if failed { MS } else { e2el },
                    error: failed.then_some(retrace::metrics::Failure::Http(500)),
                    server: ServerTimes {
                        queue_ms: (!failed).then(|| first as f64 / MS as f64 * 0.3),
                        ttft_ms: (!failed).then(|| first as f64 / MS as f64 * 0.55),
                        prompt_tokens: None,
                        cached_tokens: None,
                    },
                    non_streamed: false,
                },
                itls_ns: if failed { Vec::new() } else { itls },
                error_detail: None,
            }
        })
        .collect()
}

fn write_result(path: &PathBuf, s: &[Sample]) {
    let end = s.iter().map(|x| x.end_ns).max().unwrap_or(0);
    let start = s.iter().map(|x| x.dispatched_ns).min().unwrap_or(0);
    let sum = summarize(s, (end - start) as f64 / 1e9, &[50.0, 90.0, 99.0]);
    let info = RunInfo {
        date: "20260101-000000".into(),
        trace: "synthetic".into(),
        target: "http://127.0.0.1:8000".into(),
        model: "m".into(),
        endpoint: "completions".into(),
        tokenizer_id: None,
        label: None,
        traffic: Traffic::of(None),
        speed: 1.0,
        max_concurrency: None,
        seed: 0,
        block_size: 512,
        prompt_mode: "token-ids".into(),
        drift_limit_ms: None,
        shard: None,
        valid: true,
        invalid_reason: None,
        inexact_prompts: 0,
    };
    let v = build(&info, &sum, &Histograms::from_samples(s), s, true);
    std::fs::write(path, serde_json::to_vec(&v).expect("json")).expect("write result");
}

fn mb(p: &PathBuf) -> f64 {
    std::fs::metadata(p).map_or(0.0, |m| m.len() as f64 / 1e6)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/tmp/retrace-bench-report".into()),
    );
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    std::fs::create_dir_all(&dir).expect("out dir");
    let (base, cand) = (dir.join("base.json"), dir.join("cand.json"));
    let t = Instant::now();
    write_result(&base, &samples(n, 60.0, 1));
    write_result(&cand, &samples(n, 63.0, 2));
    println!(
        "generated 2 results of {n} requests in {:.1} s: {:.1} MB each",
        t.elapsed().as_secs_f64(),
        mb(&base)
    );

    let t = Instant::now();
    let b = load::load(&base).expect("load base");
    let load_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let page = html::report_page(&b, (25.0, 50.0));
    let page_s = t.elapsed().as_secs_f64();
    let report = dir.join("report.html");
    std::fs::write(&report, &page).expect("write report");
    println!(
        "report: load {load_s:.2} s, build page {page_s:.2} s, page {:.2} MB",
        mb(&report)
    );

    let c = load::load(&cand).expect("load cand");
    let t = Instant::now();
    let cmp = compare::compare(&b, &c, &[], &compare::Settings::default());
    let cmp_s = t.elapsed().as_secs_f64();
    let page = html::compare_page(&cmp, &[], &b, &c, &[]);
    let cpath = dir.join("compare.html");
    std::fs::write(&cpath, &page).expect("write compare page");
    let row = cmp.row("median_ttft_ms").expect("row");
    println!(
        "compare (400 resamples): {cmp_s:.2} s; median TTFT {:.2} -> {:.2} ms ({:+.1}%, {:?}); page {:.2} MB",
        row.baseline.unwrap_or(0.0),
        row.candidate.unwrap_or(0.0),
        row.rel_change.unwrap_or(0.0) * 100.0,
        row.verdict,
        mb(&cpath)
    );
}
