//! Property-based fuzzing of every trace reader: arbitrary bytes and mutated valid files must give
//! a value or a clear error, never a panic or a huge allocation; arbitrary requests round-trip
//! through the native format. CI runs a few hundred cases per property; a long run is
//! `PROPTEST_CASES=100000 cargo test --release --test it fuzz` (see README).

use proptest::prelude::*;
use retrace::trace::import::{read_bytes, Format, ImportOptions};
use retrace::trace::{
    native, Endpoint, Event, Params, Request, Response, Session, Trace, TraceHeader, Usage,
};

const FORMATS: [Format; 6] = [
    Format::Native,
    Format::Mooncake,
    Format::Azure,
    Format::Burstgpt,
    Format::Sessions,
    Format::Custom,
];

fn seeds() -> Vec<Vec<u8>> {
    let repo = |p: &str| std::fs::read(super::support::repo(p)).unwrap();
    let mut moon = repo("traces/mooncake_conversation_1k.jsonl");
    moon.truncate(4000);
    let mut sess = repo("traces/kv_cache_tester_trace_0012.json");
    sess.truncate(6000);
    vec![
        moon,
        repo("traces/azure_code_100.csv")[..1500].to_vec(),
        sess,
        b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n".to_vec(),
        b"{\"prompt\": \"hello world\", \"output_tokens\": 5}\n".to_vec(),
        native_sample(),
    ]
}

fn native_sample() -> Vec<u8> {
    let trace = Trace {
        header: TraceHeader::imported(16, true, "fuzz"),
        requests: (0..40).map(arb_like).collect(),
    };
    native::write_bytes(
        &trace,
        native::WriteOptions {
            level: 1,
            frame_bytes: 300,
            frame_age: None,
        },
    )
}

fn arb_like(k: u64) -> Request {
    Request {
        arrival_us: k * 997,
        input_tokens: k * 3,
        output_tokens: k,
        hash_ids: (0..k % 5).collect(),
        response: (k % 2 == 0).then(|| {
            Box::new(Response {
                status: 200,
                events: vec![Event {
                    offset_us: 5,
                    tokens: 1,
                }],
                ..Default::default()
            })
        }),
        ..Default::default()
    }
}

fn read_all_formats(data: &[u8]) {
    for f in FORMATS {
        let _ = read_bytes(
            "fuzz",
            data,
            &ImportOptions {
                format: Some(f),
                skip_bad: false,
            },
        );
        let _ = read_bytes(
            "fuzz",
            data,
            &ImportOptions {
                format: Some(f),
                skip_bad: true,
            },
        );
    }
    let _ = read_bytes("fuzz", data, &ImportOptions::default());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        read_all_formats(&data);
    }

    #[test]
    fn fuzz_mutated_valid_inputs_never_panic(
        which in 0usize..6,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut data = seeds().swap_remove(which);
        for (at, byte, op) in edits {
            if data.is_empty() { break; }
            let i = at.index(data.len());
            match op {
                0 => data[i] = byte,
                1 => data.insert(i, byte),
                _ => { data.remove(i); }
            }
        }
        let c = cut.index(data.len() + 1);
        data.truncate(c);
        read_all_formats(&data);
    }

    #[test]
    fn fuzz_native_round_trip(reqs in proptest::collection::vec(arb_request(), 0..30), frame in 64usize..4096) {
        let mut reqs = reqs;
        reqs.sort_by_key(|r| r.arrival_us);
        let trace = Trace { header: TraceHeader::imported(64, false, "p"), requests: reqs };
        let bytes = native::write_bytes(&trace, native::WriteOptions { level: 1, frame_bytes: frame, frame_age: None });
        let (back, rep) = native::read_bytes("p", &bytes).unwrap();
        prop_assert!(rep.is_clean());
        prop_assert_eq!(back, trace);
    }
}

fn arb_request() -> impl Strategy<Value = Request> {
    (
        (0u64..1u64 << 40, 0u64..1_000_000, 0u64..100_000),
        proptest::collection::vec(any::<u64>(), 0..20),
        prop_oneof![
            Just(Endpoint::Completions),
            Just(Endpoint::Chat),
            "/[a-z/]{0,12}".prop_map(Endpoint::Other)
        ],
        proptest::option::of("[a-zA-Z0-9-]{0,10}"),
        proptest::option::of(("[a-z]{1,5}", 0u32..50, proptest::option::of(0u64..1 << 40))),
        proptest::option::of((
            0u16..600,
            proptest::collection::vec((0u64..1 << 30, 0u32..8), 0..20),
            any::<bool>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
        )),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        (
            proptest::option::of(0u32..5000),
            proptest::option::of(any::<bool>()),
        ),
    )
        .prop_map(
            |((t, i, o), hash_ids, endpoint, model, sess, resp, body, (mt, st))| Request {
                arrival_us: t,
                input_tokens: i,
                output_tokens: o,
                hash_ids,
                method: None,
                endpoint: match endpoint {
                    // Names ("chat") and paths of named endpoints decode to those endpoints.
                    Endpoint::Other(p) if Endpoint::parse(&p) == Endpoint::Other(p.clone()) => {
                        Endpoint::Other(p)
                    }
                    Endpoint::Other(_) => Endpoint::Completions,
                    e => e,
                },
                model,
                params: Params {
                    max_tokens: mt,
                    stream: st,
                    ..Default::default()
                },
                session: sess.map(|(id, turn, think_us)| Session { id, turn, think_us }),
                response: resp.map(|(status, evs, cancelled, rbody)| {
                    let mut off = 0;
                    let events = evs
                        .into_iter()
                        .map(|(g, tokens)| {
                            off += g;
                            Event {
                                offset_us: off,
                                tokens,
                            }
                        })
                        .collect();
                    Box::new(Response {
                        status,
                        events,
                        cancelled,
                        body: rbody,
                        usage: Some(Usage {
                            prompt_tokens: i,
                            completion_tokens: o,
                        }),
                        ttft_us: Some(5),
                        ..Default::default()
                    })
                }),
                body,
            },
        )
}
