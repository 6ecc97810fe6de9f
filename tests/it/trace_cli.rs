//! `inspect` and `convert` end to end on the shipped sample traces.

use super::support::{cli, repo, OutputWithin};
use retrace::cli::Command;
use sha2::{Digest, Sha256};

fn inspect(args: &[&str]) -> anyhow::Result<String> {
    match cli(args).command {
        Command::Inspect(a) => retrace::inspect::run(&a.options()),
        _ => unreachable!(),
    }
}

fn convert(args: &[&str]) -> anyhow::Result<String> {
    match cli(args).command {
        Command::Convert(a) => retrace::convert::run(&a.options()?),
        _ => unreachable!(),
    }
}

/// The acceptance figures of the Mooncake conversation trace (issue 2), on the shipped native copy.
#[test]
fn inspect_mooncake_conversation_matches_published_figures() {
    let p = repo("traces/mooncake_conversation.trace.zst");
    let out = inspect(&["inspect", p.to_str().unwrap(), "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["stats"];
    assert_eq!(s["requests"], 12031);
    assert_eq!(s["reuse"]["distinct_blocks"], 182_790);
    assert_eq!(s["reuse"]["block_references"], 288_500);
    let reuse = s["reuse"]["block_reuse"].as_f64().unwrap();
    let hit = s["reuse"]["mean_prefix_hit_rate"].as_f64().unwrap();
    assert!((reuse - 0.366).abs() < 0.0005, "{reuse}");
    assert!((hit - 0.384).abs() < 0.0005, "{hit}");
    assert!((s["duration_s"].as_f64().unwrap() - 3537.0).abs() < 1.0);
    assert_eq!(s["peak_rate_rps"], 28);
    let text = inspect(&["inspect", p.to_str().unwrap()]).unwrap();
    assert!(text.contains("36.6 %") && text.contains("38.4 %"), "{text}");
}

/// `--json` schema (docs/inspect-json.md): every documented key is present with its type.
#[test]
fn inspect_json_schema() {
    let p = repo("traces/kv_cache_tester_trace_0012.json");
    let out = inspect(&[
        "inspect",
        p.to_str().unwrap(),
        "--json",
        "--cache-blocks",
        "100",
    ])
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in ["file", "source", "hash_scheme", "import", "stats"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    for k in ["rows", "skipped", "reordered", "damage"] {
        assert!(v["import"].get(k).is_some(), "missing import.{k}");
    }
    let s = &v["stats"];
    for k in [
        "requests",
        "duration_s",
        "mean_rate_rps",
        "peak_rate_rps",
        "isl",
        "osl",
        "reuse",
        "sessions",
        "turns",
        "endpoints",
        "models",
        "auxiliary",
    ] {
        assert!(s.get(k).is_some(), "missing stats.{k}");
    }
    for k in ["count", "mean", "p50", "p90", "p99", "max"] {
        assert!(s["isl"][k].is_number(), "stats.isl.{k}");
    }
    for k in [
        "block_size",
        "block_references",
        "distinct_blocks",
        "block_reuse",
        "mean_prefix_hit_rate",
        "lru_blocks",
        "lru_hit_rate",
    ] {
        assert!(s["reuse"][k].is_number(), "stats.reuse.{k}");
    }
    assert_eq!(s["sessions"], 1);
    assert_eq!(s["requests"], 14);
    assert_eq!(s["reuse"]["block_size"], 64);
}

fn sha256(path: &std::path::Path) -> String {
    let d = Sha256::digest(std::fs::read(path).unwrap());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Native → Mooncake reproduces the published file byte for byte (sha256 from
/// ../shared/traces/README.md), so Mooncake → native → Mooncake is lossless.
#[test]
fn native_to_mooncake_reproduces_published_trace_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "traces/mooncake_conversation.trace.zst",
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        ),
        (
            "traces/mooncake_synthetic.trace.zst",
            "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
        ),
    ];
    for (src, want) in cases {
        let out = dir.path().join("out.jsonl");
        convert(&[
            "convert",
            repo(src).to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(sha256(&out), want, "{src}");
    }
}

#[test]
fn mooncake_round_trip_and_size_target() {
    let dir = tempfile::tempdir().unwrap();
    let src = repo("traces/mooncake_conversation_1k.jsonl");
    let native = dir.path().join("a.trace.zst");
    let back = dir.path().join("b.jsonl");
    convert(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        native.to_str().unwrap(),
    ])
    .unwrap();
    convert(&[
        "convert",
        native.to_str().unwrap(),
        "-o",
        back.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&back).unwrap());
    // The shipped full conversation trace is within the 142 KB budget.
    let full = std::fs::metadata(repo("traces/mooncake_conversation.trace.zst")).unwrap();
    assert!(full.len() <= 142_000, "{}", full.len());
}

#[test]
fn convert_filters_and_azure_and_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.jsonl");
    convert(&[
        "convert",
        repo("traces/mooncake_conversation_1k.jsonl")
            .to_str()
            .unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--window",
        "30s..60s",
        "--sample",
        "2",
        "--speed",
        "2",
    ])
    .unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty());
    assert!(rows
        .iter()
        .all(|r| r["timestamp"].as_u64().unwrap() < 15_000));
    // ids are re-compacted from 0
    assert_eq!(rows[0]["hash_ids"][0], 0);

    for (src, n) in [
        ("traces/azure_code_100.csv", 100),
        ("traces/azure_conv_100.csv", 100),
        ("traces/kv_cache_tester_trace_0012.json", 14),
    ] {
        let o = dir.path().join("x.trace.zst");
        convert(&[
            "convert",
            repo(src).to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
        ])
        .unwrap();
        let (t, rep) = retrace::trace::native::read_file(&o).unwrap();
        assert!(rep.is_clean());
        assert_eq!(t.requests.len(), n, "{src}");
    }
}

#[test]
fn bad_input_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.jsonl");
    std::fs::write(
        &p,
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n{\"timestamp\": 1, \"input_length\": -4, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let e = format!(
        "{:#}",
        inspect(&["inspect", p.to_str().unwrap()]).unwrap_err()
    );
    assert!(e.contains("bad.jsonl:2:"), "{e}");
    let ok = inspect(&["inspect", p.to_str().unwrap(), "--skip-bad", "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok).unwrap();
    assert_eq!(v["import"]["skipped"], 1);
    assert_eq!(v["stats"]["requests"], 1);
    let e = format!(
        "{:#}",
        convert(&[
            "convert",
            p.to_str().unwrap(),
            "-o",
            "/nonexistent/dir/x.jsonl",
            "--skip-bad"
        ])
        .unwrap_err()
    );
    assert!(e.contains("/nonexistent/dir/x.jsonl"), "{e}");
    let e = format!(
        "{:#}",
        convert(&[
            "convert",
            p.to_str().unwrap(),
            "-o",
            "x.jsonl",
            "--window",
            "9s"
        ])
        .unwrap_err()
    );
    assert!(e.contains("--window"), "{e}");
}

/// A Mooncake row with more hash ids than its input length allows is refused at import, naming
/// the file and line, and `convert` leaves no output (it used to write a native file whose frame
/// every reader then refused as damaged, losing the good rows with it).
#[test]
fn a_row_with_more_hash_ids_than_its_input_allows_is_refused_and_convert_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.jsonl");
    let ids: Vec<String> = (0..20).map(|k| k.to_string()).collect();
    let rows = format!(
        "{{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [0, 1]}}\n\
         {{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 4, \"hash_ids\": [{}]}}\n",
        ids.join(", ")
    );
    std::fs::write(&src, rows).unwrap();
    let out = dir.path().join("m.trace.zst");
    let e = format!(
        "{:#}",
        convert(&[
            "convert",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap()
        ])
        .unwrap_err()
    );
    assert!(
        e.contains("m.jsonl:2") && e.contains("20 hash ids for input length 1 (at most 18)"),
        "{e}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|f| f.unwrap().file_name())
        .collect();
    assert_eq!(left, ["m.jsonl"], "convert left output behind");
}

/// A Mooncake trace of 64-token blocks reads in inspect, convert and replay when the block size
/// is given: every reader bounds a row's hash ids by the block size it reads with. Without it
/// (Mooncake's 512), a 1,729-token prompt of 28 ids is refused, naming the line.
#[test]
fn a_mooncake_trace_of_64_token_blocks_reads_at_its_block_size_in_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.jsonl");
    let ids: Vec<String> = (0..28).map(|k| k.to_string()).collect();
    let row = |t: u64| {
        format!(
            "{{\"timestamp\": {t}, \"input_length\": 1729, \"output_length\": 4, \"hash_ids\": [{}]}}\n",
            ids.join(", ")
        )
    };
    std::fs::write(&src, row(0) + &row(5)).unwrap();
    let (s, o) = (src.to_str().unwrap(), dir.path().join("m.trace.zst"));
    let o = o.to_str().unwrap();
    for args in [
        vec!["inspect", s],
        vec!["convert", s, "-o", o],
        vec!["replay", s, "--dry-run"],
    ] {
        let (code, err) = run_bin(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("m.jsonl:1") && err.contains("28 hash ids for input length 1729"),
            "{args:?}: {err}"
        );
    }
    let out = inspect(&["inspect", s, "--trace-block-size", "64", "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stats"]["reuse"]["block_size"], 64);
    assert_eq!(v["stats"]["reuse"]["block_references"], 56);
    convert(&["convert", s, "-o", o, "--trace-block-size", "64"]).unwrap();
    let (t, _) = retrace::trace::import::read_path(o.as_ref(), &Default::default()).unwrap();
    assert_eq!(t.header.block_size, 64);
    assert_eq!(t.requests[1].hash_ids.len(), 28);
    for trace in [s, o] {
        let (code, err) = run_bin(&["replay", trace, "--dry-run", "--block-size", "64"]);
        assert_eq!(code, Some(0), "{trace}: {err}");
    }
}

/// A 10 MB field is quoted in the error by its first 80 characters and its size, in every importer.
#[test]
fn a_10_mb_field_is_not_echoed_whole_in_error_messages() {
    let dir = tempfile::tempdir().unwrap();
    let big = "7".repeat(10 << 20) + "x";
    let cases = [
        ("azure", format!("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,{big},5\n")),
        ("burstgpt", format!("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n{big},ChatGPT,4,1,5,Conversation log\n")),
        ("mooncake", format!("{{\"timestamp\": 0, \"input_length\": \"{big}\", \"output_length\": 1}}\n")),
        ("custom", format!("{{\"prompt\": \"hi\", \"output_tokens\": \"{big}\"}}\n")),
    ];
    for (from, data) in cases {
        let p = dir.path().join(format!("big.{from}"));
        std::fs::write(&p, data).unwrap();
        let e = format!(
            "{:#}",
            inspect(&["inspect", p.to_str().unwrap(), "--from", from]).unwrap_err()
        );
        assert!(e.len() < 400, "{from}: {} bytes: {}", e.len(), &e[..400]);
        assert!(
            e.contains(&format!("{}… (", "7".repeat(80))) && e.contains(" bytes)"),
            "{from}: {e}"
        );
        assert!(
            e.contains(&format!("big.{from}:2")) || e.contains(&format!("big.{from}:1")),
            "{e}"
        );
    }
}

/// Bytes flipped in the record frames of a new native trace: `inspect` reports damage (the frame
/// checksum) or, where zstd ignores the bit, the stats of the file as written.
#[test]
fn flipped_bytes_in_a_native_trace_are_reported_as_damage_by_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let native = dir.path().join("a.trace.zst");
    let src = repo("traces/mooncake_conversation_1k.jsonl");
    convert(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        native.to_str().unwrap(),
    ])
    .unwrap();
    let bytes = std::fs::read(&native).unwrap();
    let stats = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&inspect(&["inspect", p.to_str().unwrap(), "--json"]).unwrap())
            .unwrap()
    };
    let clean = stats(&native);
    assert!(clean["import"]["damage"].is_null());
    let flipped = dir.path().join("f.trace.zst");
    let (mut damaged, flips) = (0, 40);
    for k in 0..flips {
        let at = 200 + k * (bytes.len() - 200) / flips;
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        std::fs::write(&flipped, &b).unwrap();
        let v = stats(&flipped);
        if v["import"]["damage"].is_string() {
            damaged += 1;
        } else {
            assert_eq!(
                v["stats"], clean["stats"],
                "byte {at}: changed records, no damage reported"
            );
        }
    }
    assert!(
        damaged >= flips - 2,
        "{damaged} of {flips} flips reported as damage"
    );
}

fn run_bin(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(args)
        .env("RETRACE_LOG", "warn")
        .output_within(super::support::CHILD_LIMIT)
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A missing file: one line naming it, the OS message once (it was printed twice), every command.
#[test]
fn missing_file_error_names_the_file_and_prints_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let nope = dir.path().join("nope.jsonl");
    let (n, o) = (nope.to_str().unwrap(), dir.path().join("o.json"));
    let o = o.to_str().unwrap();
    for args in [
        vec!["inspect", n],
        vec!["convert", n, "-o", o],
        vec!["compare", n, n],
        vec!["merge", n, "-o", o],
        vec!["report", n, "-o", o],
        vec!["replay", n, "--dry-run"],
    ] {
        let (code, err) = run_bin(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(n), "{args:?}: {err}");
        assert_eq!(
            err.matches("No such file or directory").count(),
            1,
            "{args:?}: {err}"
        );
    }
}

/// Logs going to a file or pipe carry no ANSI colour codes.
#[test]
fn logs_written_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.trace.zst");
    let src = repo("traces/mooncake_conversation_1k.jsonl");
    convert(&["convert", src.to_str().unwrap(), "-o", p.to_str().unwrap()]).unwrap();
    let mut b = std::fs::read(&p).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0xff;
    std::fs::write(&p, b).unwrap();
    let (code, err) = run_bin(&["inspect", p.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("WARN") && err.contains("corrupt"),
        "a damage warning: {err}"
    );
    assert!(!err.contains('\x1b'), "colour codes in a log file: {err:?}");
}

/// A merge that fails half-way through its inputs (here: dense hash ids, found at the record that
/// carries them) leaves no output file, Mooncake or native, and no partial one.
#[test]
fn a_merge_that_fails_half_way_leaves_no_output() {
    use retrace::trace::{native, Request, TraceHeader};
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for (i, t0) in [1_000_000i64, 1_000_500].into_iter().enumerate() {
        let mut header = TraceHeader::imported(16, true, "test");
        header.t0_unix_us = Some(t0);
        let records = (0..100u64).map(|k| {
            Ok::<_, retrace::trace::TraceError>(Request {
                arrival_us: k * 1000,
                input_tokens: 16,
                output_tokens: 1,
                hash_ids: if i == 1 && k == 50 { vec![7] } else { vec![] },
                ..Default::default()
            })
        });
        let p = dir.path().join(format!("{i}.trace.zst"));
        native::write_file_from(&p, &header, Default::default(), records).unwrap();
        inputs.push(p.to_str().unwrap().to_string());
    }
    for out in ["out.jsonl", "out.trace.zst"] {
        let o = dir.path().join(out);
        let err =
            convert(&["convert", &inputs[0], &inputs[1], "-o", o.to_str().unwrap()]).unwrap_err();
        assert!(format!("{err:#}").contains("dense"), "{err:#}");
        assert!(!o.exists(), "{out} was left behind");
        assert!(!dir.path().join(format!("{out}.partial")).exists());
    }
}

/// `retrace ARGS` under the 1 GiB address-space limit, within the hang limit: (exit code,
/// stdout, stderr).
fn run_limited(args: &[&str]) -> (Option<i32>, String, String) {
    use super::support::{under_memory_limit, CHILD_LIMIT, MEMORY_LIMIT};
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args(args).env("RETRACE_LOG", "warn");
    let o = under_memory_limit(&mut cmd, MEMORY_LIMIT)
        .output_within(CHILD_LIMIT)
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

/// Six frames each at the frame bound (195 M ids in a 4 KB file), their arrivals interleaved so
/// that the merge by arrival has all six open at once: `convert` and `replay --dry-run` read
/// them under 1 GiB, for a reader holds one record's ids expanded (it held every open frame's,
/// 1.5 GB here).
#[test]
fn overlapping_frames_at_the_id_bound_are_read_one_record_of_ids_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("runs.trace.zst");
    super::support::overlapping_frames_at_the_id_bound(&input, 6);
    let (inp, out) = (input.to_str().unwrap(), dir.path().join("out.trace.zst"));
    let (code, _, err) = run_limited(&["convert", inp, "-o", out.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("156 rows read, 156 written"), "{err}");
    let (code, stdout, err) = run_limited(&["replay", inp, "--dry-run"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        stdout.contains("Planned requests:") && stdout.contains("156"),
        "{stdout}"
    );
}

/// Past the exact id set's budget `inspect` estimates in bounded memory and says so, also with
/// `--block-size` (a piece's id is computed, never tabled: the table of 10 M pieces took more than
/// 1 GiB); an LRU past its budget is refused naming the flag before anything is allocated.
#[test]
fn inspect_past_its_id_budgets_estimates_in_bounded_memory_or_refuses_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("runs.trace.zst");
    // 8 records of 1,250,016 distinct ids: 10 M ids, past the 8 Mi held exactly
    super::support::records_of_many_ids(&input, 8);
    let inp = input.to_str().unwrap();
    let (code, stdout, err) = run_limited(&["inspect", inp, "--cache-blocks", "100000"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        stdout.contains("10000128 distinct of 10000128 references"),
        "{stdout}"
    );
    assert!(
        stdout.contains("estimated") && stdout.contains("distinct_blocks"),
        "{stdout}"
    );
    let (code, stdout, err) = run_limited(&["inspect", inp, "--block-size", "24"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(stdout.contains("(24 tokens per block)"), "{stdout}");
    let (code, _, err) = run_limited(&["inspect", inp, "--cache-blocks", "1000000000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--cache-blocks 1000000000: at most 4194304 blocks"),
        "{err}"
    );
}

/// A Mooncake export numbers ids in memory: past 8 Mi distinct ids it is refused with a message
/// that says so and names native output, and leaves no file (it held every id, 10 M here).
#[test]
fn a_mooncake_export_past_its_id_budget_is_refused_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("runs.trace.zst");
    super::support::records_of_many_ids(&input, 8);
    let out = dir.path().join("out.jsonl");
    let (code, _, err) = run_limited(&[
        "convert",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("more than 8388608 distinct hash ids") && err.contains(".trace.zst"),
        "{err}"
    );
    assert!(err.contains("out.jsonl"), "names the output: {err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the input"
    );
}

/// `convert --skip-bad` of 8 lines of which 2 are malformed: 8 read, 2 of them skipped, 6
/// written (the counts add up); without the flag the first bad line stops it, naming the line
/// and `--skip-bad`, as it does `inspect`.
#[test]
fn convert_skip_bad_counts_add_up_and_a_bad_line_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.jsonl");
    let mut rows = String::new();
    for k in 0..8 {
        match k {
            2 | 5 => rows.push_str("{\"timestamp\": 1, \"input_length\": \"ten\"}\n"),
            _ => rows.push_str(&format!(
                "{{\"timestamp\": {k}, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [{k}]}}\n"
            )),
        }
    }
    std::fs::write(&p, rows).unwrap();
    let out = dir.path().join("out.jsonl");
    let (inp, o) = (p.to_str().unwrap(), out.to_str().unwrap());
    let said = convert(&["convert", inp, "-o", o, "--skip-bad"]).unwrap();
    assert!(
        said.contains("8 rows read (2 malformed, skipped), 6 written"),
        "{said}"
    );
    for args in [&["convert", inp, "-o", o][..], &["inspect", inp][..]] {
        let e = match args[0] {
            "convert" => convert(args),
            _ => inspect(args),
        };
        let e = format!("{:#}", e.unwrap_err());
        assert!(e.contains("m.jsonl:3:"), "{e}");
        assert!(
            e.contains("--skip-bad skips and counts malformed rows"),
            "{e}"
        );
    }
}
