//! The budget rule (ARCHITECTURE.md, invariant 4a), held on every command that reads a trace or a
//! result: each runs on hostile input under a 1 GiB address-space limit and a time limit. An
//! abort (a signal), a hang or an allocation past the limit fails the test; every command either
//! finishes or refuses with a message naming its input, never a panic.
//!
//! The inputs are the shapes that once passed a per-record bound but not a total one: native
//! frames whose hash-id runs declare millions of ids in a few bytes (fixed cases and
//! proptest-generated frames of many records), repetitions (`--loop`, `--overlay`), a fitted
//! synthetic workload of many requests, a one-line sidecar and an AIPerf export of one huge line;
//! records declare up to 7 shadow copies (a reader allows 5), read by `compare --shadow` too.

use crate::support::{self, OutputWithin, MEMORY_LIMIT};
use ciborium::Value as Cbor;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A native record as the hostile writer declares it: input tokens and hash-id runs
/// `[start0, len0, start1, len1, …]`.
#[derive(Clone, Debug)]
struct Rec {
    input: u64,
    runs: Vec<u64>,
    /// Shadow copies (`sh`) the record declares (a reader allows 5).
    copies: u64,
}

fn map(entries: Vec<(&str, Cbor)>) -> Cbor {
    Cbor::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Cbor::Text(k.into()), v))
            .collect(),
    )
}

fn int(v: u64) -> Cbor {
    Cbor::Integer(v.into())
}

fn cbor_bytes(v: &Cbor, out: &mut Vec<u8>) {
    ciborium::into_writer(v, out).unwrap();
}

/// Writes a native trace (block size 16) of `frames`, each a list of records, as a hostile writer
/// would: any count of ids per frame, each record within the per-record bound of its own input.
fn native(dir: &Path, name: &str, frames: &[Vec<Rec>]) -> PathBuf {
    let header = map(vec![
        ("magic", Cbor::Text("retrace-trace".into())),
        ("version", Cbor::Array(vec![int(1), int(4)])),
        ("block_size", int(16)),
        ("hash_scheme", Cbor::Text("dense".into())),
        ("partial_tail_block", Cbor::Bool(true)),
        ("t0_unix_us", Cbor::Null),
        ("writer", Cbor::Text("hostile".into())),
        ("source", Cbor::Text("test".into())),
        // a shadowed recording's header: `compare --shadow` reads every record too
        (
            "meta",
            map(vec![(
                "shadow.0",
                Cbor::Text("candidate http://127.0.0.1:9".into()),
            )]),
        ),
    ]);
    let mut file = Vec::new();
    let mut h = Vec::new();
    cbor_bytes(&header, &mut h);
    file.extend(zstd::bulk::compress(&h, 3).unwrap());
    let mut first = 0u64;
    for (k, recs) in frames.iter().enumerate() {
        let mut content = Vec::new();
        let fh = map(vec![
            ("frame", int(k as u64 + 1)),
            ("n", int(recs.len() as u64)),
            ("first", int(first)),
        ]);
        cbor_bytes(&fh, &mut content);
        for (j, r) in recs.iter().enumerate() {
            let copy = |k: u64| map(vec![("k", int(k % 5)), ("o", int(4))]);
            let m = map(vec![
                ("t", int(u64::from(j > 0) * 1000)),
                ("i", int(r.input)),
                ("o", int(4)),
                ("h", Cbor::Array(r.runs.iter().map(|&x| int(x)).collect())),
                ("sh", Cbor::Array((0..r.copies).map(copy).collect())),
            ]);
            cbor_bytes(&m, &mut content);
        }
        first += recs.len() as u64;
        let mut c = zstd::bulk::Compressor::new(19).unwrap();
        c.include_checksum(true).unwrap();
        c.include_contentsize(true).unwrap();
        file.extend(c.compress(&content).unwrap());
    }
    let p = dir.join(name);
    std::fs::write(&p, file).unwrap();
    p
}

/// The most ids one record may carry: 10^7 input tokens in 16-token blocks, twice over, + 16.
const RECORD_IDS: u64 = 1_250_016;

/// `n` records of `ids` hash ids each (one run; at most [`RECORD_IDS`], a record's own bound).
fn wide(n: usize, ids: u64) -> Vec<Rec> {
    (0..n as u64)
        .map(|k| Rec {
            input: 10_000_000,
            runs: vec![k * ids, ids],
            copies: k % 7,
        })
        .collect()
}

/// How one command ended on a hostile input.
#[derive(Debug)]
enum Ending {
    /// Finished (exit 0).
    Done,
    /// Refused with a message (a non-zero exit, not a signal).
    Refused(String),
}

/// Each command's time limit here: the hostile inputs carry up to 10^8 hash ids, which an
/// unoptimised build on a loaded machine reads in minutes (`inspect --cache-blocks` of 97.5
/// million ids: over 3 minutes).
const BUDGET_CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs `retrace ARGS` under the memory and time limits: a signal (an abort on a failed
/// allocation, a crash) or a panic fails the test; a refusal must say something.
fn run_bounded(args: &[&str]) -> Ending {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args(args).env("RUST_BACKTRACE", "0");
    support::under_memory_limit(&mut cmd, MEMORY_LIMIT);
    let o = cmd.output_within(BUDGET_CHILD_LIMIT).unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let Some(code) = o.status.code() else {
        panic!(
            "`retrace {}` was killed ({}): {err}",
            args.join(" "),
            o.status
        );
    };
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation"),
        "`retrace {}` (exit {code}): {err}",
        args.join(" ")
    );
    if code == 0 {
        return Ending::Done;
    }
    assert!(
        !err.trim().is_empty(),
        "`retrace {}` exit {code} with nothing said",
        args.join(" ")
    );
    Ending::Refused(err)
}

/// Every command that reads `trace`, each held to the budget; their endings in order.
fn every_trace_command(trace: &Path, out: &Path) -> Vec<(String, Ending)> {
    let t = trace.to_str().unwrap();
    let o = |name: &str| out.join(name).to_str().unwrap().to_string();
    let (jsonl, native, synth, page) = (o("c.jsonl"), o("c.trace.zst"), o("s.jsonl"), o("r.html"));
    let cases: Vec<Vec<&str>> = vec![
        vec!["inspect", t],
        vec!["inspect", "--json", "--cache-blocks", "4096", t],
        vec!["convert", t, "-o", &jsonl],
        vec!["convert", t, "-o", &native],
        vec!["replay", t, "--dry-run"],
        vec!["synth", t, "-o", &synth, "--speedup", "2"],
        // `synth --fit` reads these inputs as `synth` does (refused past 32 Mi ids); its
        // sampler's budgets are held by a_fitted_workload_of_many_requests_...
        vec!["report", t, "-o", &page],
        vec!["compare", "--shadow", t],
    ];
    cases
        .iter()
        .map(|a| (a.join(" "), run_bounded(a)))
        .collect()
}

/// A refusal that names the input file (or says nothing of it when the command finished).
fn assert_named(endings: &[(String, Ending)], file: &str) {
    for (cmd, e) in endings {
        if let Ending::Refused(err) = e {
            assert!(err.contains(file), "`{cmd}` did not name {file}: {err}");
        }
    }
}

#[test]
fn a_frame_of_2000_records_of_1250016_ids_is_dropped_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let t = native(dir.path(), "frame.trace.zst", &[wide(2000, RECORD_IDS)]);
    assert!(
        std::fs::metadata(&t).unwrap().len() < 64 << 10,
        "a small file"
    );
    let endings = every_trace_command(&t, dir.path());
    assert_named(&endings, "frame.trace.zst");
}

#[test]
fn sixteen_records_of_1250016_ids_in_one_frame_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let t = native(dir.path(), "sixteen.trace.zst", &[wide(16, RECORD_IDS)]);
    let endings = every_trace_command(&t, dir.path());
    assert_named(&endings, "sixteen.trace.zst");
}

#[test]
fn many_frames_each_at_the_frame_bound_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // 3 frames of 26 records of the most ids a record may carry: each frame just within the
    // 2^25-id frame bound, 97.5 million ids in all (780 MB as u64s, more kept as a set).
    let frames: Vec<Vec<Rec>> = (0..3u64)
        .map(|f| {
            wide(26, RECORD_IDS)
                .into_iter()
                .map(|mut r| {
                    r.runs[0] += f << 40;
                    r
                })
                .collect()
        })
        .collect();
    let t = native(dir.path(), "frames.trace.zst", &frames);
    let endings = every_trace_command(&t, dir.path());
    assert_named(&endings, "frames.trace.zst");
}

#[test]
fn repetitions_of_a_small_trace_are_refused_before_they_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let t = support::repo("fixtures/replay/mooncake_conversation_30.jsonl");
    let t = t.to_str().unwrap();
    let _ = dir;
    // Just within the whole plan's budget, the copies are planned within the memory limit.
    for flag in ["--loop", "--overlay"] {
        let e = run_bounded(&["replay", t, "--dry-run", flag, "12000"]);
        assert!(matches!(e, Ending::Done), "{flag} 12000: {e:?}");
    }
    for flag in ["--loop", "--overlay"] {
        for k in ["100000", "4294967295"] {
            match run_bounded(&["replay", t, "--dry-run", flag, k]) {
                Ending::Refused(err) => assert!(err.contains(flag), "{flag} {k}: {err}"),
                Ending::Done => panic!("{flag} {k} planned"),
            }
        }
    }
}

#[test]
fn a_fitted_workload_of_many_requests_is_written_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let t = support::repo("fixtures/replay/mooncake_conversation_30.jsonl");
    // 400,000 requests of about 44 blocks: 17.6 million ids, past one prefix tree's 4 Mi
    // accesses (the sampler starts anew) and past a Mooncake export's 8 Mi-id table
    let fit = |out: &Path| {
        run_bounded(&[
            "synth",
            t.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--fit",
            "--requests",
            "400000",
        ])
    };
    let native = dir.path().join("fit.trace.zst");
    let e = fit(&native);
    assert!(matches!(e, Ending::Done), "{e:?}");
    let s = retrace::trace::native::NativeStream::open(&native).unwrap();
    assert_eq!(s.count(), 400_000);
    let mooncake = dir.path().join("fit.jsonl");
    match fit(&mooncake) {
        Ending::Refused(err) => assert!(
            err.contains("distinct hash ids") && err.contains("write native"),
            "{err}"
        ),
        Ending::Done => panic!("17.6 million distinct ids in a Mooncake export"),
    }
    assert!(!mooncake.exists(), "nothing is left of a refused export");
}

/// A result naming a sidecar of one line of `bytes` bytes (no newline): compare, report and
/// merge refuse it or read it within the budget.
#[test]
fn a_sidecar_of_one_huge_line_is_read_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let side = dir.path().join("r.requests.jsonl");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&side).unwrap());
        f.write_all(b"{\"ttft_s\": [").unwrap();
        let chunk = "1,".repeat(1 << 19);
        for _ in 0..1200 {
            f.write_all(chunk.as_bytes()).unwrap();
        }
        f.write_all(b"1]}").unwrap();
    }
    let result = dir.path().join("r.json");
    std::fs::write(
        &result,
        serde_json::json!({
            "schema": "retrace.replay/1", "num_prompts": 1, "completed": 1, "failed": 0,
            "duration": 1.0, "requests_file": "r.requests.jsonl"
        })
        .to_string(),
    )
    .unwrap();
    // A `replay --shadow` run: a shadow's and a control's result beside it, naming the same
    // sidecar.
    for side in ["r.shadow-1.json", "r.control.json"] {
        std::fs::copy(&result, dir.path().join(side)).unwrap();
    }
    let r = result.to_str().unwrap();
    let page = dir.path().join("p.html");
    let merged = dir.path().join("m.json");
    for args in [
        vec!["compare", r, r],
        vec!["compare", "--shadow", r],
        vec!["report", r, "-o", page.to_str().unwrap()],
        vec!["merge", r, "-o", merged.to_str().unwrap()],
    ] {
        match run_bounded(&args) {
            Ending::Refused(err) => assert!(err.contains("r.requests.jsonl"), "{args:?}: {err}"),
            Ending::Done => panic!("{args:?} read a one-line sidecar of 1.2 GB"),
        }
    }
}

/// An AIPerf per-request export of one line of 600 MiB: refused or read within the budget.
#[test]
fn an_aiperf_export_of_one_huge_line_is_read_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("profile_export.jsonl");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&export).unwrap());
        f.write_all(br#"{"metadata": {"x_request_id": ""#).unwrap();
        let chunk = "a".repeat(1 << 20);
        for _ in 0..600 {
            f.write_all(chunk.as_bytes()).unwrap();
        }
        f.write_all(b"\"}}\n").unwrap();
    }
    let e = export.to_str().unwrap();
    let page = dir.path().join("p.html");
    for args in [
        vec!["compare", e, e],
        vec!["report", e, "-o", page.to_str().unwrap()],
    ] {
        if let Ending::Refused(err) = run_bounded(&args) {
            assert!(err.contains("profile_export.jsonl"), "{err}");
        }
    }
}

fn hostile_frames() -> impl Strategy<Value = Vec<Vec<Rec>>> {
    let rec = (1u64..=RECORD_IDS, 0u64..1 << 40, 1usize..4, 0u64..8).prop_map(
        |(ids, start, pieces, copies)| {
            let per = (ids / pieces as u64).max(1);
            let runs = (0..pieces as u64)
                .flat_map(|p| [start + p * (per + 7), per])
                .collect();
            Rec {
                input: 10_000_000,
                runs,
                copies,
            }
        },
    );
    proptest::collection::vec(proptest::collection::vec(rec, 1..24), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, failure_persistence: None, ..ProptestConfig::default() })]

    /// Native frames of many records with any count of ids, through every trace command.
    #[test]
    fn prop_hostile_native_frames_stay_within_the_budget(frames in hostile_frames()) {
        let dir = tempfile::tempdir().unwrap();
        let t = native(dir.path(), "p.trace.zst", &frames);
        let endings = every_trace_command(&t, dir.path());
        assert_named(&endings, "p.trace.zst");
    }
}
