//! Streaming readers equal whole-file readers: every shipped trace, slices of them, traces out of
//! time order, and damaged native files.

use retrace::trace::import::{read_bytes, ImportOptions};
use retrace::trace::native::{self, TraceWriter, WriteOptions};
use retrace::trace::{stream, Request, TraceHeader};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The stream of `path` equals the whole-file read of its bytes: records, header and report.
fn assert_stream_equals_whole(path: &Path, opts: &ImportOptions) {
    let data = std::fs::read(path).unwrap();
    let name = path.display().to_string();
    let whole = read_bytes(&name, &data, opts);
    let streamed = stream::open(path, opts).and_then(|s| s.collect_trace());
    match (whole, streamed) {
        (Ok(w), Ok(s)) => {
            assert_eq!(w.0.header, s.0.header, "{name}: header");
            assert_eq!(w.1, s.1, "{name}: report");
            assert_eq!(w.0.requests.len(), s.0.requests.len(), "{name}: count");
            assert!(w.0.requests == s.0.requests, "{name}: records differ");
        }
        (Err(w), Err(s)) => assert_eq!(w.to_string(), s.to_string(), "{name}"),
        (w, s) => panic!(
            "{name}: whole {:?} but streamed {:?}",
            w.map(|t| t.1),
            s.map(|t| t.1)
        ),
    }
}

fn shipped() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [
        "traces",
        "fixtures/replay",
        "fixtures/aiperf",
        "fixtures/vllm",
    ] {
        for e in std::fs::read_dir(Path::new(ROOT).join(dir)).unwrap() {
            let p = e.unwrap().path();
            let data = std::fs::read(&p).unwrap();
            let name = p.display().to_string();
            if retrace::trace::detect::detect(&name, &data).is_ok() {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn streaming_readers_equal_whole_file_readers_on_every_shipped_trace() {
    let files = shipped();
    assert!(files.len() >= 8, "{files:?}");
    for p in &files {
        assert_stream_equals_whole(p, &ImportOptions::default());
    }
}

/// Slices of the shipped text traces: heads, rows shuffled out of time order, a malformed row
/// (an error, or skipped with `skip_bad`).
#[test]
fn streaming_readers_equal_whole_file_readers_on_slices() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for p in shipped() {
        let data = std::fs::read(&p).unwrap();
        if native::sniff(&data) || !std::str::from_utf8(&data).is_ok_and(|t| t.lines().count() > 5)
        {
            continue;
        }
        let text = String::from_utf8(data).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let ext = p.extension().unwrap().to_str().unwrap();
        let head = lines.len().min(40);
        let mut shuffled = lines[..head].to_vec();
        shuffled[1..].reverse();
        let mut bad = lines[..head].to_vec();
        bad.insert(head / 2, "not a row");
        for (k, variant) in [lines[..head].to_vec(), shuffled, bad].iter().enumerate() {
            let f = dir.path().join(format!("s{n}_{k}.{ext}"));
            std::fs::write(&f, variant.join("\n") + "\n").unwrap();
            for skip_bad in [false, true] {
                let opts = ImportOptions {
                    skip_bad,
                    ..Default::default()
                };
                assert_stream_equals_whole(&f, &opts);
            }
        }
        n += 1;
    }
    assert!(n >= 4, "{n} text traces sliced");
}

/// A recording's frames are written in completion order, so a later frame may hold earlier
/// arrivals: the stream merges frames by arrival (ties in file order), as the whole read sorts.
#[test]
fn native_stream_merges_overlapping_frames_in_arrival_order() {
    let header = TraceHeader::imported(16, true, "overlap");
    let opts = WriteOptions {
        level: 1,
        frame_bytes: 600,
        frame_age: None,
    };
    let mut w = TraceWriter::new(Vec::new(), &header, opts).unwrap();
    // Completion order: arrivals step back by up to 80 ms (also inside a frame; a reader keeps
    // no assumption about frame order); equal arrivals in several frames.
    for k in 0..3000u64 {
        let r = Request {
            arrival_us: (k * 1_000).saturating_sub((k % 41) * 2_000) / 3_000 * 3_000,
            input_tokens: k,
            hash_ids: vec![k],
            ..Default::default()
        };
        w.push(&r).unwrap();
    }
    let bytes = w.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("overlap.trace.zst");
    std::fs::write(&f, &bytes).unwrap();
    let (whole, rep) = native::read_bytes("x", &bytes).unwrap();
    assert!(rep.reordered > 100 && rep.frames_ok > 20, "{rep:?}");
    let s = native::NativeStream::open(&f).unwrap();
    assert_eq!(s.report(), &rep);
    let got: Vec<Request> = s.map(Result::unwrap).collect();
    assert!(got == whole.requests);
}

/// Damaged native files (cut anywhere, a frame corrupted) stream the same records and report.
#[test]
fn native_stream_equals_whole_read_on_damaged_files() {
    let data =
        std::fs::read(Path::new(ROOT).join("traces/mooncake_conversation.trace.zst")).unwrap();
    let (t, _) = native::read_bytes("x", &data).unwrap();
    let small = native::write_bytes(
        &retrace::trace::Trace {
            header: t.header.clone(),
            requests: t.requests[..2000].to_vec(),
        },
        WriteOptions {
            level: 1,
            frame_bytes: 4000,
            frame_age: None,
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.trace.zst");
    let mut variants: Vec<Vec<u8>> = (1..40)
        .map(|k| small[..small.len() * k / 40].to_vec())
        .collect();
    let mut flipped = small.clone();
    let mid = small.len() / 2;
    for b in &mut flipped[mid..mid + 50] {
        *b ^= 0x5a;
    }
    variants.push(flipped);
    for v in variants {
        std::fs::write(&f, &v).unwrap();
        assert_stream_equals_whole(&f, &ImportOptions::default());
    }
}

/// The records, send offsets and indexes of a plan, in plan order.
fn sends(source: retrace::replay::plan::source::Source) -> Vec<(usize, u64, Request)> {
    source
        .map(|p| p.map(|p| (p.index, p.at_ns, p.record)))
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A streamed plan sends what the same trace read whole and planned sends, record for record
/// and at the same offsets: every shipped trace, under each shaping that streams.
#[test]
fn streamed_plans_equal_whole_trace_plans_on_every_shipped_trace() {
    use retrace::replay::{self, plan::source};
    let flag_sets: [&[&str]; 8] = [
        &[],
        &["--window", "2s..40s"],
        &["--max-gap", "300ms", "--speed", "3"],
        &["--request-rate", "50", "--burstiness", "0.5", "--seed", "3"],
        &[
            "--ramp-up",
            "linear",
            "--ramp-up-start-rps",
            "1",
            "--ramp-up-end-rps",
            "30",
        ],
        &["--limit", "40", "--shard", "1/3"],
        &[
            "--include-aux",
            "--skip-recorded-failures",
            "--shard",
            "0/2",
        ],
        &["--window", "1s..", "--limit", "25", "--max-gap", "1s"],
    ];
    let mut compared = 0;
    for path in shipped() {
        let p = path.to_str().unwrap();
        for flags in flag_sets {
            for embedded in [false, true] {
                let mut args = vec![p, "--target", "http://127.0.0.1:9", "--model", "m"];
                args.extend_from_slice(flags);
                let cfg = super::support::replay_cfg(&args);
                let what = format!("{p} {flags:?} embedded {embedded}");
                let whole =
                    stream::open(&path, &ImportOptions::default()).and_then(|s| s.collect_trace());
                let Ok((whole, _)) = whole else {
                    assert!(replay::planning(&cfg, embedded).is_err(), "{what}");
                    continue;
                };
                let Ok((plan, _)) = replay::plan(&cfg, whole, embedded) else {
                    assert!(replay::planning(&cfg, embedded).is_err(), "{what}");
                    continue;
                };
                let want = sends(source::from_sends(plan));
                let planning =
                    replay::planning(&cfg, embedded).unwrap_or_else(|e| panic!("{what}: {e:#}"));
                assert_eq!(planning.survey.planned, want.len(), "{what}");
                let got = sends(planning.into_source());
                assert_eq!(got.len(), want.len(), "{what}: count");
                for (g, w) in got.iter().zip(&want) {
                    assert!(g == w, "{what}: send {} differs", w.0);
                }
                compared += want.len();
            }
        }
    }
    assert!(compared > 10_000, "{compared} sends compared");
}
