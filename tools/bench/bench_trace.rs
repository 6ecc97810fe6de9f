//! Benchmark of the native trace format: write and read speed (records/s on one core), size against
//! `zstd -19` of the JSONL, bytes per recorded streamed event, and `inspect` time.
//! Not a test: run `tools/bench/bench_trace.sh` (release build); it prints medians of several runs.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use retrace::trace::{mooncake, native, stats, Event, Request, Response, Trace, TraceHeader};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn recorded(n: usize, events: usize, with_events: bool) -> Trace {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let itl: Normal<f64> = Normal::new(8_000.0, 600.0).unwrap();
    let mut reqs = Vec::with_capacity(n);
    let mut t = 0u64;
    for k in 0..n {
        t += rng.random_range(0..20_000);
        let ttft = 40_000 + rng.random_range(0..30_000);
        let mut off = ttft;
        let mut evs = Vec::new();
        if with_events {
            for _ in 0..events {
                evs.push(Event {
                    offset_us: off,
                    tokens: 1,
                });
                off += itl.sample(&mut rng).max(100.0) as u64;
            }
        } else {
            off += 8_000 * events as u64;
        }
        reqs.push(Request {
            arrival_us: t,
            input_tokens: 1000 + k as u64 % 500,
            output_tokens: events as u64,
            hash_ids: (0..4).map(|_| rng.random()).collect(),
            model: Some("llama".into()),
            response: Some(Box::new(Response {
                status: 200,
                headers_us: Some(900),
                ttft_us: Some(ttft),
                events: evs,
                end_us: Some(off),
                ..Default::default()
            })),
            ..Default::default()
        });
    }
    let mut h = TraceHeader::imported(16, true, "bench");
    h.hash_scheme = retrace::trace::HashScheme::Xxh3;
    Trace {
        header: h,
        requests: reqs,
    }
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../shared/traces/mooncake_conversation_trace.jsonl".into());
    let runs = 5;
    let jsonl = std::fs::read(&path).expect("read the Mooncake JSONL");
    let (trace, _) = mooncake::read(&path, jsonl.as_slice(), &Default::default()).unwrap();
    let n = trace.requests.len() as f64;

    // Make a big trace (>= 500k records) by repeating the conversation trace.
    let mut big = trace.clone();
    while big.requests.len() < 500_000 {
        big.requests.extend(trace.requests.iter().cloned());
    }
    let bn = big.requests.len() as f64;
    let opts3 = native::WriteOptions {
        level: 3,
        ..Default::default()
    };
    let (mut w, mut r) = (Vec::new(), Vec::new());
    let mut bytes = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        bytes = native::write_bytes(&big, opts3.clone());
        w.push(bn / t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        let (back, _) = native::read_bytes("big", &bytes).unwrap();
        r.push(bn / t0.elapsed().as_secs_f64());
        assert_eq!(back.requests.len(), big.requests.len());
    }
    println!(
        "native write (zstd 3): {:.0} records/s   read: {:.0} records/s   ({} records, {} bytes; median of {runs})",
        median(w), median(r), big.requests.len(), bytes.len()
    );

    let z19 = zstd::bulk::compress(&jsonl, 19).unwrap().len();
    for level in [3, 19] {
        let b = native::write_bytes(
            &trace,
            native::WriteOptions {
                level,
                ..Default::default()
            },
        );
        println!(
            "size: native zstd-{level} {} bytes = {:.1} % of zstd -19 JSONL ({z19} bytes)",
            b.len(),
            100.0 * b.len() as f64 / z19 as f64
        );
    }

    let mut ins = Vec::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        let (t, _) = mooncake::read(&path, jsonl.as_slice(), &Default::default()).unwrap();
        let s = stats::compute(
            &t,
            &stats::StatsOptions {
                cache_blocks: Some(10_000),
                ..Default::default()
            },
        );
        assert_eq!(s.requests as f64, n);
        ins.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "inspect (parse JSONL + stats + LRU 10k): {:.0} ms (median of {runs})",
        median(ins) * 1e3
    );

    let (reqs, evs) = (2_000, 200);
    for level in [3, 19] {
        let o = native::WriteOptions {
            level,
            ..Default::default()
        };
        let with = native::write_bytes(&recorded(reqs, evs, true), o.clone()).len();
        let without = native::write_bytes(&recorded(reqs, evs, false), o).len();
        println!(
            "recorded events (ITL ~ N(8 ms, 0.6 ms), µs resolution), zstd-{level}: {:.2} bytes per event",
            (with - without) as f64 / (reqs * evs) as f64
        );
    }
}
