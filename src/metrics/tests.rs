use super::*;

const MS: u64 = 1_000_000;

/// A completions stream: send at 0, content at 50, 60, 70 ms, usage chunk at 75 ms.
#[test]
fn completions_rules_ignore_usage_chunk_for_e2el() {
    let mut c = StreamClock::new(Api::Completions, 0);
    c.on_message(50 * MS, true, 1, None);
    c.on_message(60 * MS, true, 1, None);
    c.on_message(70 * MS, true, 1, None);
    c.on_message(75 * MS, false, 0, Some(3));
    assert_eq!(c.ttft_ns(), Some(50 * MS));
    assert_eq!(c.itls_ns(), &[10 * MS, 10 * MS]);
    assert_eq!(c.e2el_ns(), Some(70 * MS));
    assert_eq!(c.output_tokens(), 3);
}

/// A chat stream: role chunk (empty content, non-empty choices) at 20 ms is the first token by
/// vLLM's rule; the usage chunk ends E2EL.
#[test]
fn chat_rules_role_chunk_is_ttft_usage_ends_e2el() {
    let mut c = StreamClock::new(Api::Chat, 5 * MS);
    c.on_message(20 * MS, true, 0, None);
    c.on_message(50 * MS, true, 1, None);
    c.on_message(60 * MS, true, 1, None);
    c.on_message(64 * MS, false, 0, Some(2));
    assert_eq!(c.ttft_ns(), Some(15 * MS));
    assert_eq!(c.itls_ns(), &[30 * MS, 10 * MS]);
    assert_eq!(c.e2el_ns(), Some(59 * MS));
    assert_eq!(c.output_tokens(), 2);
}

#[test]
fn no_content_means_no_ttft() {
    let mut c = StreamClock::new(Api::Completions, 0);
    c.on_message(10 * MS, false, 0, Some(0));
    assert_eq!(c.ttft_ns(), None);
    assert_eq!(c.e2el_ns(), None);
}

#[test]
fn without_usage_tokens_are_counted() {
    let mut c = StreamClock::new(Api::Completions, 0);
    c.on_message(1, true, 1, None);
    c.on_message(2, true, 2, None);
    assert_eq!(c.output_tokens(), 3);
    assert!(!c.has_usage());
}

#[test]
fn non_streamed_requests_are_counted_apart_with_their_e2el_only() {
    let streamed = sample(0, 50 * MS, &[10 * MS, 10 * MS], 3);
    let mut whole = sample(MS, 200 * MS, &[], 3);
    whole.non_streamed = true;
    let c = Collector::from_samples(&[streamed, whole]);
    let s = c.summary(1.0, &[50.0, 99.0]);
    assert_eq!((s.completed, s.non_streamed), (2, 1));
    assert_eq!((s.ttft.count, s.tpot.count, s.e2el.count), (1, 1, 1));
    assert!((s.ttft.mean - 50.0).abs() < 1e-9, "{}", s.ttft.mean);
    assert!((s.e2el.mean - 70.0).abs() < 1e-9, "{}", s.e2el.mean);
    assert!((s.non_streamed_e2el.mean - 200.0).abs() < 1e-9);
    assert_eq!(s.total_output_tokens, 6, "both count in the totals");
    let ttft_hist = &c.histograms().by_name["ttft_us"];
    assert_eq!(ttft_hist.len(), 1, "nor in the histograms");
}

fn sample(send: u64, ttft: u64, itl: &[u64], out: u64) -> Sample {
    let e2el = ttft + itl.iter().sum::<u64>();
    Sample {
        scalars: Scalars {
            input_tokens: 100,
            output_tokens: out,
            intended_ns: send,
            dispatched_ns: send,
            sent_ns: send,
            ttft_ns: Some(ttft),
            e2el_ns: Some(e2el),
            end_ns: send + e2el,
            ..Default::default()
        },
        itls_ns: itl.to_vec(),
        ..Default::default()
    }
}

/// Send drift is the actual send's lateness without the slot wait; the client queue is the
/// slot wait alone; a request that never went out keeps its dispatch drift.
#[test]
fn drift_and_client_queue_split_the_send_delay() {
    let s = Scalars {
        intended_ns: 1_000,
        dispatched_ns: 1_010,
        slot_wait_ns: 500,
        sent_ns: 1_540,
        ..Default::default()
    };
    assert_eq!(s.dispatch_drift_ns(), 10);
    assert_eq!(s.drift_ns(), 40, "10 dispatcher + 30 hand-over");
    assert_eq!(s.client_queue_ns(), 500);
    let early = Scalars {
        intended_ns: 1_000,
        dispatched_ns: 990,
        sent_ns: 995,
        ..Default::default()
    };
    assert_eq!(early.drift_ns(), -5);
    assert_eq!(early.client_queue_ns(), 0);
    let unsent = Scalars {
        intended_ns: 1_000,
        dispatched_ns: 1_020,
        ..Default::default()
    };
    assert_eq!(unsent.drift_ns(), 20);
}

#[test]
fn tpot_and_pooled_itl() {
    let a = sample(0, 50 * MS, &[10 * MS, 10 * MS, 10 * MS], 4);
    let b = sample(0, 30 * MS, &[20 * MS], 2);
    let c = sample(0, 40 * MS, &[], 1); // one token: no TPOT, no ITL
    let s = summarize(&[a, b, c], 1.0, &[50.0]);
    assert_eq!(s.completed, 3);
    assert_eq!(s.tpot.count, 2);
    assert!((s.tpot.mean - 15.0).abs() < 1e-9, "{}", s.tpot.mean);
    assert_eq!(s.itl.count, 4);
    assert!((s.itl.mean - 12.5).abs() < 1e-9);
    assert!((s.ttft.mean - 40.0).abs() < 1e-9);
    assert_eq!(s.total_output_tokens, 7);
    assert!((s.output_throughput - 7.0).abs() < 1e-12);
}

#[test]
fn failures_are_counted_by_kind_and_excluded_from_latency() {
    let ok = sample(0, 50 * MS, &[10 * MS], 2);
    let bad = Sample {
        scalars: Scalars {
            error: Some(Failure::Http(500)),
            ..Default::default()
        },
        ..Default::default()
    };
    let bad2 = Sample {
        scalars: Scalars {
            error: Some(Failure::Reset),
            ttft_ns: Some(MS),
            ..Default::default()
        },
        ..Default::default()
    };
    let s = summarize(&[ok, bad.clone(), bad, bad2], 2.0, &[99.0]);
    assert_eq!((s.completed, s.failed), (1, 3));
    assert_eq!(s.errors["http_500"], 2);
    assert_eq!(s.errors["reset"], 1);
    assert_eq!(s.ttft.count, 1);
    assert_eq!(s.total_input_tokens, 100);
    assert!((s.request_throughput - 0.5).abs() < 1e-12);
}

#[test]
fn intended_time_latency_includes_queue_and_drift() {
    let mut a = sample(10 * MS, 50 * MS, &[], 1);
    a.intended_ns = 0;
    a.dispatched_ns = MS;
    a.slot_wait_ns = 8 * MS;
    let s = summarize(&[a], 1.0, &[]);
    assert!((s.ttft.mean - 50.0).abs() < 1e-9);
    assert!((s.ttft_from_intended.mean - 60.0).abs() < 1e-9);
    // Sent at 10 ms after an 8 ms slot wait: 2 ms late, 1 ms of it the dispatcher's.
    assert!((s.drift.mean - 2.0).abs() < 1e-9);
    assert!((s.dispatch_drift.mean - 1.0).abs() < 1e-9);
    assert!((s.client_queue.mean - 8.0).abs() < 1e-9);
}

#[test]
fn server_breakdown() {
    let mut a = sample(0, 50 * MS, &[], 1);
    a.server = ServerTimes {
        queue_ms: Some(5.0),
        ttft_ms: Some(30.0),
        prompt_tokens: None,
        cached_tokens: None,
    };
    let b = sample(0, 40 * MS, &[], 1);
    let s = summarize(&[a, b], 1.0, &[]);
    assert_eq!(s.server_reported, 1);
    assert!((s.unattributed.mean - 15.0).abs() < 1e-9);
    assert_eq!(s.server_cache, None);
}

/// llama.cpp reports a server TTFT and cached tokens but no queue time: the queue wait
/// stays in the unattributed remainder, and the per-request hits add up.
#[test]
fn server_breakdown_without_queue_time() {
    let mut a = sample(0, 50 * MS, &[], 1);
    a.input_tokens = 100;
    a.server = ServerTimes {
        ttft_ms: Some(20.0),
        prompt_tokens: Some(48),
        cached_tokens: Some(47),
        ..Default::default()
    };
    let mut b = sample(0, 40 * MS, &[], 1);
    b.input_tokens = 48;
    b.server = ServerTimes {
        ttft_ms: Some(10.0),
        cached_tokens: Some(0),
        ..Default::default()
    };
    let s = summarize(&[a, b], 1.0, &[]);
    assert_eq!(s.server_reported, 2);
    assert_eq!(s.server_queue.count, 0);
    assert!((s.unattributed.mean - 30.0).abs() < 1e-9);
    let c = s.server_cache.unwrap();
    assert_eq!((c.requests, c.cached_tokens, c.prompt_tokens), (2, 47, 96));
    assert_eq!(c.hit_rate(), Some(47.0 / 96.0));
}

#[test]
fn numpy_percentiles_median_std() {
    let v = [1.0, 2.0, 3.0, 4.0];
    let st = Stats::from_seconds(&v, &[0.0, 25.0, 50.0, 99.0, 100.0]);
    // np.percentile([1,2,3,4], [0,25,50,99,100]) = 1, 1.75, 2.5, 3.97, 4
    let want = [1.0, 1.75, 2.5, 3.97, 4.0];
    for ((_, got), w) in st.percentiles.iter().zip(want) {
        assert!((got / 1000.0 - w).abs() < 1e-12, "{got} {w}");
    }
    assert_eq!(st.median, 2500.0);
    // np.std([1,2,3,4]) = 1.118033988749895
    assert!((st.std / 1000.0 - 1.118033988749895).abs() < 1e-15);
    let empty = Stats::from_seconds(&[], &[99.0]);
    assert_eq!((empty.mean, empty.percentiles[0].1), (0.0, 0.0));
}

#[test]
fn pairwise_sum_matches_numpy_on_long_arrays() {
    // Values from numpy 2.4: np.sum([0.1]*1000) and np.sum([0.1*i + 1e-3*(i%7) for i in
    // range(1000)]); a naive loop gives 99.9999999999986 and 49952.99699999996.
    assert_eq!(np_sum(&[0.1; 1000]), 100.00000000000001);
    let v: Vec<f64> = (0..1000)
        .map(|i| 0.1 * i as f64 + 1e-3 * (i % 7) as f64)
        .collect();
    assert_eq!(np_sum(&v), 49952.997);
}

/// vLLM's own result file: recomputing its statistics from its per-request arrays must give
/// its numbers exactly.
#[test]
fn matches_real_vllm_bench_serve_result() {
    let raw = include_str!("../../fixtures/vllm/bench_serve_result_timed_trace.json");
    let v: serde_json::Value = serde_json::from_str(raw).unwrap();
    let arr = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let ttfts = arr("ttfts");
    let lat = arr("latencies");
    let outs = arr("output_lens");
    let itls: Vec<f64> = v["itls"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect();
    let tpots: Vec<f64> = (0..ttfts.len())
        .filter(|&i| outs[i] > 1.0)
        .map(|i| (lat[i] - ttfts[i]) / (outs[i] - 1.0))
        .collect();
    for (name, vals) in [("ttft", &ttfts), ("tpot", &tpots), ("itl", &itls)] {
        let s = Stats::from_seconds(vals, &[99.0]);
        let key = |k: &str| v[format!("{k}_{name}_ms")].as_f64().unwrap();
        assert_eq!(s.mean, key("mean"), "mean {name}");
        assert_eq!(s.median, key("median"), "median {name}");
        assert_eq!(s.std, key("std"), "std {name}");
        assert_eq!(s.percentiles[0].1, key("p99"), "p99 {name}");
    }
}

#[test]
fn histograms_round_trip_and_merge() {
    let a = sample(0, 50 * MS, &[10 * MS; 9], 10);
    let h = Histograms::from_samples(std::slice::from_ref(&a));
    let enc = h.encode();
    let mut back = Histograms::decode(&enc["itl_us"]).unwrap();
    assert_eq!(back.len(), 9);
    assert_eq!(back.value_at_quantile(0.5), back.highest_equivalent(10_000));
    let other = Histograms::decode(&Histograms::from_samples(&[a]).encode()["itl_us"]).unwrap();
    back.add(&other).unwrap();
    assert_eq!(back.len(), 18);
    assert!(Histograms::decode("not base64!").is_err());
}

#[test]
fn goodput_counts_requests_meeting_every_slo() {
    let fast = sample(0, 40 * MS, &[10 * MS], 2); // ttft 40, tpot 10, e2el 50
    let slow_tpot = sample(0, 40 * MS, &[30 * MS], 2); // tpot 30
    let one_token = sample(0, 45 * MS, &[], 1); // tpot counts as 0
    let all = [fast, slow_tpot, one_token];
    let good_requests = |slo: Slo| {
        let mut c = Collector::new(ITL_BOUND, SCALAR_BOUND, slo);
        for (i, s) in all.iter().enumerate() {
            c.add(i, s);
        }
        let per_s = c.summary(2.0, &[]).request_goodput.unwrap();
        (per_s * 2.0) as u64
    };
    let slo = |t, p, e| Slo {
        ttft_ms: t,
        tpot_ms: p,
        e2el_ms: e,
    };
    assert_eq!(good_requests(slo(Some(50.0), None, None)), 3);
    assert_eq!(good_requests(slo(Some(50.0), Some(20.0), None)), 2);
    assert_eq!(good_requests(slo(None, Some(20.0), Some(46.0))), 1);
    assert_eq!(good_requests(slo(Some(10.0), None, None)), 0);
}

/// Past its ITL bound the collector lets the ITL values go: it then holds only the
/// per-request part, its ITL statistics come from the histogram (and it says so); requests
/// finishing in any order give the same statistics as samples in schedule order.
#[test]
fn itl_values_past_the_bound_are_let_go_and_itl_stats_come_from_the_histogram() {
    let n = 2_000u64;
    let samples: Vec<Sample> = (0..n)
        .map(|i| sample(i * MS, (40 + i % 7) * MS, &[(10 + i % 3) * MS; 50], 51))
        .collect();
    let exact = Collector::from_samples(&samples);
    assert!(!exact.itl_from_histogram());
    let mut bounded = Collector::new(10_000, SCALAR_BOUND, Slo::default());
    for (i, s) in samples.iter().enumerate().rev() {
        bounded.add(i, s);
    }
    assert!(bounded.itl_from_histogram());
    let per_request = std::mem::size_of::<Option<Scalars>>() + std::mem::size_of::<(usize, u32)>();
    // the per-request part (grown by doubling), the in-flight peak's milliseconds and the
    // peaks' seconds, nothing that grows with tokens
    let t = &bounded.totals;
    let clock = t.in_flight.bytes() + t.active_per_s.bytes();
    let fixed = (n as usize).next_power_of_two() * per_request + clock;
    assert!(exact.retained_bytes() >= fixed + 100_000 * 8);
    assert!(
        bounded.retained_bytes() <= fixed + 1024,
        "{}",
        bounded.retained_bytes()
    );
    let p = [50.0, 99.0];
    let (a, b) = (exact.summary(3.0, &p), bounded.summary(3.0, &p));
    assert_eq!(a, summarize(&samples, 3.0, &p));
    assert_eq!(b.itl.count, a.itl.count);
    let near = |x: f64, y: f64| (x - y).abs() <= 1e-3 * y;
    assert!(
        near(b.itl.mean, a.itl.mean),
        "{} {}",
        b.itl.mean,
        a.itl.mean
    );
    assert!(near(b.itl.percentiles[1].1, a.itl.percentiles[1].1));
    assert_eq!(
        (&b.ttft, &b.tpot, &b.e2el, &b.drift),
        (&a.ttft, &a.tpot, &a.e2el, &a.drift)
    );
    assert_eq!(b.max_concurrent_requests, a.max_concurrent_requests);
    assert_eq!(b.total_output_tokens, a.total_output_tokens);
    // tokens 1 ms apart at most 51 per request, requests 1 ms apart: the run-clock peak is
    // within one request's tokens of vLLM's
    assert!((b.max_output_tokens_per_s - a.max_output_tokens_per_s).abs() <= 51.0);
}

/// Request `i` of a synthetic run: sends every 0.2 ms (repeating every `period` requests),
/// early and late dispatches and sends, slot waits, failures of three kinds, server times
/// that leave a negative unattributed remainder, cached tokens.
fn synthetic(i: u64, period: u64) -> Sample {
    let r = |k: u64| (i.wrapping_add(k).wrapping_mul(2_654_435_761) >> 7) % 1_000_003;
    let intended = MS + (i % period) * 200_000;
    let dispatched = intended + r(1) % MS - 300_000;
    let slot_wait = if i % 4 == 0 { r(2) * 5 } else { 0 };
    let sent = dispatched + slot_wait + r(3) % 100_000;
    let error = match (i % 17, i % 29) {
        (3, _) => Some(Failure::Http(503)),
        (_, 5) => Some(Failure::Reset),
        _ => None,
    };
    let content = error.is_none() && i % 31 != 7;
    let ttft = 20 * MS + r(4) * 200;
    let itls: Vec<u64> = (0..1 + r(5) % 8).map(|k| 5 * MS + r(6 + k) * 10).collect();
    let e2el = ttft + itls.iter().sum::<u64>();
    let server = ServerTimes {
        queue_ms: (i % 3 == 0).then(|| (r(20) % 10) as f64 + 0.123),
        ttft_ms: (i % 3 != 1).then(|| ttft as f64 / 1e6 - 5.0 + (r(21) % 10) as f64),
        prompt_tokens: None,
        cached_tokens: (i % 5 == 0).then(|| r(22) % 100),
    };
    Sample {
        scalars: Scalars {
            input_tokens: 100 + r(7) % 1000,
            output_tokens: itls.len() as u64 + 1,
            intended_ns: intended,
            dispatched_ns: dispatched,
            slot_wait_ns: slot_wait,
            sent_ns: sent,
            ttft_ns: (error == Some(Failure::Reset) || content).then_some(ttft),
            e2el_ns: content.then_some(e2el),
            end_ns: sent + e2el,
            error,
            server,
            non_streamed: i % 11 == 3,
        },
        itls_ns: if content && i % 11 != 3 {
            itls
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

/// The same requests through a collector holding them all and one holding `bound`.
fn exact_and_bounded(samples: &[Sample], bound: usize, slo: Slo) -> (Collector, Collector) {
    let mut exact = Collector::new(ITL_BOUND, usize::MAX, slo);
    let mut bounded = Collector::new(ITL_BOUND, bound, slo);
    for (i, s) in samples.iter().enumerate() {
        exact.add(i, s);
        bounded.add(i, s);
    }
    (exact, bounded)
}

/// `b` from aggregates agrees with the exact `a`: count, min and max exactly, mean and std
/// to float rounding, median and percentiles to the histograms' 3 significant digits.
fn assert_agrees(name: &str, a: &Stats, b: &Stats) {
    assert_eq!((b.count, b.min, b.max), (a.count, a.min, a.max), "{name}");
    let close = |x: f64, y: f64, rel: f64| (x - y).abs() <= rel * y.abs().max(1e-3);
    assert!(
        close(b.mean, a.mean, 1e-9),
        "{name} mean {} {}",
        b.mean,
        a.mean
    );
    assert!(close(b.std, a.std, 1e-9), "{name} std {} {}", b.std, a.std);
    assert!(
        close(b.median, a.median, 1e-3),
        "{name} {} {}",
        b.median,
        a.median
    );
    for ((p, x), (_, y)) in b.percentiles.iter().zip(&a.percentiles) {
        assert!(close(*x, *y, 1e-3), "{name} p{p}: {x} {y}");
    }
}

/// Past the request bound every figure comes from the aggregates folded in `add`: counts,
/// totals, errors and goodput exactly, the statistics within the histograms' precision,
/// the peaks from buckets of the run clock.
#[test]
fn a_run_past_the_request_bound_agrees_with_the_exact_summary() {
    let samples: Vec<Sample> = (0..50_000).map(|i| synthetic(i, u64::MAX)).collect();
    let slo = Slo {
        ttft_ms: Some(150.0),
        tpot_ms: Some(12.0),
        e2el_ms: None,
    };
    let (exact, bounded) = exact_and_bounded(&samples, 1_000, slo);
    assert!(!exact.scalars_from_histogram() && bounded.scalars_from_histogram());
    let p = [1.0, 10.0, 50.0, 90.0, 99.0, 99.9];
    let (a, b) = (exact.summary(12.5, &p), bounded.summary(12.5, &p));
    assert!(!a.scalars_from_histogram && b.scalars_from_histogram && b.itl_from_histogram);
    let counts = |s: &Summary| {
        let totals = (
            s.total_input_tokens,
            s.total_output_tokens,
            s.server_reported,
        );
        let goodput = s.request_goodput.map(f64::to_bits);
        (
            s.completed,
            s.failed,
            totals,
            s.errors.clone(),
            s.server_cache,
            goodput,
        )
    };
    assert_eq!(counts(&b), counts(&a));
    assert_eq!(a.errors.len(), 3, "{:?}", a.errors);
    assert!(a.request_goodput.unwrap() > 0.0 && a.unattributed.min < 0.0);
    for (name, x, y) in [
        ("ttft", &a.ttft, &b.ttft),
        ("tpot", &a.tpot, &b.tpot),
        ("e2el", &a.e2el, &b.e2el),
        (
            "ttft_from_intended",
            &a.ttft_from_intended,
            &b.ttft_from_intended,
        ),
        (
            "e2el_from_intended",
            &a.e2el_from_intended,
            &b.e2el_from_intended,
        ),
        ("drift", &a.drift, &b.drift),
        ("dispatch_drift", &a.dispatch_drift, &b.dispatch_drift),
        ("client_queue", &a.client_queue, &b.client_queue),
        ("server_queue", &a.server_queue, &b.server_queue),
        ("server_ttft", &a.server_ttft, &b.server_ttft),
        ("unattributed", &a.unattributed, &b.unattributed),
    ] {
        assert_agrees(name, x, y);
    }
    let near = |x: f64, y: f64| (x - y).abs() <= 1e-3 * y;
    assert!(near(b.itl.mean, a.itl.mean) && near(b.itl.percentiles[4].1, a.itl.percentiles[4].1));
    // Whole seconds of the run clock against seconds from the first send (1 ms apart), and
    // the busiest millisecond against the busiest instant: at most 5 sends more.
    let within = |x: f64, y: f64, by: f64| (x - y).abs() <= by * y;
    assert!(within(
        b.max_output_tokens_per_s,
        a.max_output_tokens_per_s,
        0.01
    ));
    let (bc, ac) = (
        b.max_concurrent_requests as f64,
        a.max_concurrent_requests as f64,
    );
    assert!(within(bc, ac, 0.01), "{bc} {ac}");
    assert!((a.peak_in_flight..=a.peak_in_flight + 5).contains(&b.peak_in_flight));
    assert_eq!(bounded.drift(&p), b.drift);
}

/// Past the bound the collector holds nothing per request: what it keeps is the same for
/// 20,000 requests as for 50,000 over the same span of the run clock, and small.
#[test]
fn retained_bytes_past_the_request_bound_do_not_grow_with_requests() {
    let held = |n: u64| {
        let mut c = Collector::new(ITL_BOUND, 1_000, Slo::default());
        for i in 0..n {
            c.add(i as usize, &synthetic(i, 10_000));
        }
        assert!(c.held().is_none() && c.itl_from_histogram());
        c.retained_bytes()
    };
    let (some, more) = (held(20_000), held(50_000));
    assert_eq!(some, more);
    assert!(more < 64 << 10, "{more}");
    let under = Collector::from_samples(&[synthetic(0, 1)]);
    assert!(under.held().is_some_and(|h| h.len() == 1));
}

/// Negative values (early sends) past the bound keep their sign: percentiles below zero,
/// above it, and of a run early throughout.
#[test]
fn negative_drift_past_the_request_bound_comes_out_right() {
    let early = |us: i64| {
        let intended = 10 * MS;
        let sent = (intended as i64 + us * 1000) as u64;
        Sample {
            scalars: Scalars {
                intended_ns: intended,
                dispatched_ns: sent,
                sent_ns: sent,
                end_ns: sent + MS,
                ..Default::default()
            },
            ..Default::default()
        }
    };
    let p = [1.0, 25.0, 50.0, 75.0, 99.0];
    for (lo, hi) in [(-5_000, 5_000), (-9_000, -1_000)] {
        let samples: Vec<Sample> = (0..50_000).map(|i| early(lo + i % (hi - lo + 1))).collect();
        let (exact, bounded) = exact_and_bounded(&samples, 1_000, Slo::default());
        let (a, b) = (exact.drift(&p), bounded.drift(&p));
        assert_agrees("drift", &a, &b);
        assert_agrees(
            "dispatch",
            &exact.summary(1.0, &p).dispatch_drift,
            &bounded.summary(1.0, &p).dispatch_drift,
        );
        assert_eq!((b.min, b.max), (lo as f64 / 1000.0, hi as f64 / 1000.0));
        assert!(b.percentiles[0].1 < 0.0 && (b.percentiles[4].1 > 0.0) == (hi > 0));
    }
}

#[test]
fn max_concurrency_counts_overlaps() {
    let mut a = sample(0, 10, &[], 1);
    a.end_ns = 100;
    let mut b = sample(50, 10, &[], 1);
    b.end_ns = 150;
    let mut c = sample(100, 10, &[], 1);
    c.end_ns = 200;
    assert_eq!(max_concurrency([a.scalars, b.scalars, c.scalars].iter()), 2);
}

/// vLLM's buckets: whole seconds from the first send; a request counts in every second it
/// touches, each content message in its own second.
#[test]
fn per_second_peaks_follow_vllm_buckets() {
    let s = 1_000_000_000;
    // sent at 0 s: first token at 0.5 s, then 0.2 s gaps: 0.7, 0.9, 1.1; ends 1.1 s
    let a = sample(0, s / 2, &[s / 5, s / 5, s / 5], 4);
    // sent at 0.95 s, one token at 1.05 s, ends 1.05 s
    let b = sample(95 * s / 100, s / 10, &[], 1);
    let peaks = |s: &[Sample]| Collector::from_samples(s).per_second_peaks();
    assert_eq!(peaks(&[a, b]), (3.0, 2));
    assert_eq!(peaks(&[]), (0.0, 0));
}

/// The requests of real `vllm bench serve` runs (their `--save-detailed` arrays), summarised
/// by us, give the peaks and statistics vLLM wrote for them.
#[test]
fn summary_of_real_vllm_requests_matches_its_result() {
    for text in [
        include_str!("../../fixtures/vllm/bench_serve_result_timed_trace.json"),
        include_str!("../../fixtures/vllm/bench_serve_result_random.json"),
    ] {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let ns = |x: &serde_json::Value| (x.as_f64().unwrap() * 1e9).round() as u64;
        let col = |k: &str| v[k].as_array().unwrap().clone();
        let (starts, ttfts, lats, itls) = (
            col("start_times"),
            col("ttfts"),
            col("latencies"),
            col("itls"),
        );
        let samples: Vec<Sample> = (0..starts.len())
            .map(|i| {
                let sent = ns(&starts[i]);
                Sample {
                    scalars: Scalars {
                        input_tokens: v["input_lens"][i].as_u64().unwrap(),
                        output_tokens: v["output_lens"][i].as_u64().unwrap(),
                        intended_ns: sent,
                        dispatched_ns: sent,
                        sent_ns: sent,
                        ttft_ns: Some(ns(&ttfts[i])),
                        e2el_ns: Some(ns(&lats[i])),
                        end_ns: sent + ns(&lats[i]),
                        ..Default::default()
                    },
                    itls_ns: itls[i].as_array().unwrap().iter().map(ns).collect(),
                    ..Default::default()
                }
            })
            .collect();
        let sum = summarize(&samples, v["duration"].as_f64().unwrap(), &[99.0]);
        let peak_tokens = v["max_output_tokens_per_s"].as_f64().unwrap();
        assert_eq!(sum.max_output_tokens_per_s, peak_tokens);
        assert_eq!(sum.max_concurrent_requests, v["max_concurrent_requests"]);
        for (ours, key) in [
            (sum.ttft.mean, "mean_ttft_ms"),
            (sum.tpot.mean, "mean_tpot_ms"),
        ] {
            let theirs = v[key].as_f64().unwrap();
            assert!((ours - theirs).abs() < 1e-6, "{key}: {ours} vs {theirs}");
        }
    }
}

#[test]
fn percentile_labels() {
    assert_eq!(percentile_label(99.0), "99");
    assert_eq!(percentile_label(99.9), "99.9");
}
