//! `retrace merge` end to end: a small trace replayed against the fixed-timing test server once
//! whole and as three `--shard i/3` runs, the shards merged by the CLI, and the merged result
//! compared with the whole run (deterministic parts exactly, timings with loaded-machine
//! tolerances); plus the refusals (other schema, other experiment, unreadable file).

use crate::support::{self, ServerConfig};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The fixed-timing test server, with server metrics, the merge tests replay against.
async fn server() -> support::TestServer {
    support::start(ServerConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(4),
        server_metrics: true,
        ..Default::default()
    })
    .await
}

/// 18 requests, 15 ms apart, 6..=10 output tokens (2..=5 select the test server's faults),
/// distinct prefixes.
fn trace(dir: &Path) -> PathBuf {
    let mut s = String::new();
    for k in 0..18u64 {
        s.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}\n",
            k * 15,
            100 + 37 * k,
            6 + k % 5,
            k
        ));
    }
    let p = dir.join("trace.jsonl");
    std::fs::write(&p, s).unwrap();
    p
}

fn read(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn hist_len(v: &Value, name: &str) -> u64 {
    retrace::metrics::Histograms::decode(v["histograms"][name].as_str().unwrap())
        .unwrap()
        .len()
}

fn sorted(v: &Value, key: &str) -> Vec<u64> {
    let mut x: Vec<u64> = v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_u64().unwrap())
        .collect();
    x.sort_unstable();
    x
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} not a number"))
}

/// Runs `retrace replay` through the CLI (blocking: it owns its runtime).
fn replay(trace: &Path, target: &str, out: &Path, shard: Option<&str>) {
    let mut args = vec![
        "replay",
        trace.to_str().unwrap(),
        "--target",
        target,
        "--result-json",
        out.to_str().unwrap(),
        "--detailed",
    ];
    if let Some(s) = shard {
        args.extend(["--shard", s]);
    }
    let code = retrace::run(support::cli(&args)).unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
}

#[test]
fn three_shards_merged_match_one_process() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(server());
    let url = srv.url();
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let whole_p = dir.path().join("whole.json");
    replay(&t, &url, &whole_p, None);
    let mut shard_ps = Vec::new();
    for i in 0..3 {
        let p = dir.path().join(format!("shard-{i}.json"));
        replay(&t, &url, &p, Some(&format!("{i}/3")));
        shard_ps.push(p);
    }
    let all_p = dir.path().join("all.json");
    let mut args = vec!["merge"];
    args.extend(shard_ps.iter().map(|p| p.to_str().unwrap()));
    args.extend(["-o", all_p.to_str().unwrap()]);
    assert_eq!(
        retrace::run(support::cli(&args)).unwrap(),
        std::process::ExitCode::SUCCESS
    );
    let whole = read(&whole_p);
    let merged = read(&all_p);
    let shards: Vec<Value> = shard_ps.iter().map(|p| read(p)).collect();

    // every shard got something, and together exactly the whole trace
    for s in &shards {
        assert!(s["num_prompts"].as_u64().unwrap() > 0, "an empty shard");
    }
    assert_eq!(merged["schema"], "retrace.replay/1");
    assert_eq!(merged["merged_from_histograms"], false);
    support::assert_same_counts(&merged, &whole);
    assert_eq!(whole["completed"], 18);
    assert_eq!(
        sorted(&merged, "input_lens"),
        sorted(&whole, "input_lens"),
        "same requests"
    );
    assert_eq!(
        sorted(&merged, "output_lens"),
        sorted(&whole, "output_lens")
    );
    // index-aligned arrays stay aligned
    for k in [
        "ttfts",
        "itls",
        "latencies",
        "start_times",
        "errors",
        "drifts",
    ] {
        assert_eq!(merged[k].as_array().unwrap().len(), 18, "{k}");
    }
    let durations: Vec<f64> = shards.iter().map(|s| f(s, "duration")).collect();
    assert_eq!(
        f(&merged, "duration"),
        durations.iter().copied().fold(0.0, f64::max)
    );

    // lossless: merged histogram counts = sum of shards' = the whole run's (deterministic counts)
    for name in [
        "ttft_us",
        "tpot_us",
        "itl_us",
        "e2el_us",
        "drift_abs_ns",
        "client_queue_ns",
    ] {
        let sum: u64 = shards.iter().map(|s| hist_len(s, name)).sum();
        assert_eq!(hist_len(&merged, name), sum, "{name}");
        assert_eq!(hist_len(&merged, name), hist_len(&whole, name), "{name}");
    }

    // The server's own per-request timings do not depend on the machine's load: merged and whole
    // carry exactly the same distribution.
    for k in ["server_ttfts", "server_queue_times"] {
        let vals = |v: &Value| {
            let mut x: Vec<f64> = v[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_f64().expect("server metrics present"))
                .collect();
            x.sort_by(f64::total_cmp);
            x
        };
        assert_eq!(vals(&merged), vals(&whole), "{k}");
        assert_eq!(vals(&whole).len(), 18, "{k}");
    }

    // Client-side timings differ between runs (separate runs on a shared machine): the floors
    // catch missing data, the ceilings a hang. A late event followed by an on-time one makes a
    // client-side gap shorter than the server's 4 ms ITL, so gap statistics may sit below 4 ms;
    // under heavy load (a load average of 56 once did it) a stream's events can all arrive in
    // one read, so its gaps are all zero: the gap floors only say "present" (the metric
    // definitions themselves are held by the known-timings tests in replay.rs).
    for (k, lo, hi) in [
        ("mean_ttft_ms", 20.0, 2000.0),
        ("median_ttft_ms", 20.0, 2000.0),
        ("mean_itl_ms", 0.0, 500.0),
        ("median_itl_ms", 0.0, 500.0),
        ("mean_tpot_ms", 0.0, 500.0),
    ] {
        for (name, v) in [("merged", &merged), ("whole", &whole)] {
            let x = f(v, k);
            assert!((lo..hi).contains(&x), "{k}: {name} {x} outside {lo}..{hi}");
        }
    }

    // merged statistics are recomputed from the merged per-request data, as one process would
    let ttfts: Vec<f64> = merged["ttfts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mean = ttfts.iter().sum::<f64>() / ttfts.len() as f64 * 1000.0;
    assert!((mean - f(&merged, "mean_ttft_ms")).abs() < 1e-6);

    // a result given twice would double-count: refused, naming it (two runs with equal samples
    // still add up: report::merge's histogram test)
    let twice_p = dir.path().join("twice.json");
    let w = whole_p.to_str().unwrap();
    let e = retrace::run(support::cli(&[
        "merge",
        w,
        w,
        "-o",
        twice_p.to_str().unwrap(),
    ]))
    .unwrap_err();
    assert!(format!("{e:#}").contains("given twice"), "{e:#}");
    assert!(!twice_p.exists());
    // shard files name their shard; the same shard twice is refused
    let s0 = dir.path().join("shard-0.json");
    assert_eq!(read(&s0)["shard"], "0/3");
    let copy = dir.path().join("copy-0.json");
    let mut v = read(&s0);
    v["date"] = serde_json::json!("another run");
    std::fs::write(&copy, v.to_string()).unwrap();
    let (a, b) = (s0.to_str().unwrap(), copy.to_str().unwrap());
    let e = retrace::run(support::cli(&[
        "merge",
        a,
        b,
        "-o",
        twice_p.to_str().unwrap(),
    ]))
    .unwrap_err();
    assert!(format!("{e:#}").contains("already given"), "{e:#}");
    drop(srv);
}

#[test]
fn merge_refuses_foreign_or_mismatched_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.json");
    let o = out.to_str().unwrap();
    // a vllm bench serve result: not our schema
    let vllm = support::repo("fixtures/vllm/bench_serve_result_timed_trace.json");
    let e = retrace::run(support::cli(&["merge", vllm.to_str().unwrap(), "-o", o]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bench_serve_result_timed_trace.json") && e.contains("`schema`"),
        "{e}"
    );
    // a missing file
    let e = retrace::run(support::cli(&["merge", "/nonexistent/a.json", "-o", o]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/a.json"), "{e}");
    // two results of different traces
    let mk = |name: &str, trace: &str| {
        let v = serde_json::json!({
            "schema": "retrace.replay/1", "trace": trace, "seed": 0, "speed": 1.0,
            "endpoint_type": "completions", "model_id": "m", "prompt_mode": "token-ids",
            "completed": 0, "failed": 0, "duration": 0.0, "histograms": {}
        });
        let p = dir.path().join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };
    let a = mk("a.json", "x.jsonl");
    let b = mk("b.json", "y.jsonl");
    let e = retrace::run(support::cli(&[
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "-o",
        o,
    ]))
    .unwrap_err()
    .to_string();
    assert!(e.contains("b.json") && e.contains("`trace`"), "{e}");
    assert!(!out.exists(), "nothing written on refusal");
}

/// `path`'s result with its per-request arrays moved to a sidecar file, written as `dir/NAME`
/// (the same file name, another directory: the sidecar is found beside its result).
fn with_sidecar(path: &Path, dir: &Path) -> PathBuf {
    use retrace::result::sidecar;
    let out = dir.join(path.file_name().unwrap());
    let mut v = read(path);
    let name = sidecar::write_arrays(&sidecar::path_for(&out), &mut v).unwrap();
    assert!(v.get("ttfts").is_none());
    v[sidecar::KEY] = serde_json::json!(name);
    std::fs::write(&out, v.to_string()).unwrap();
    out
}

/// A result whose per-request arrays are in a sidecar file reads exactly like the same result
/// with them inline: `compare` (its requests, the paired TTFT), `report` (the page) and
/// `merge` (the merged result); a damaged sidecar is an error naming the file and the line.
#[test]
fn sidecar_results_read_like_inline_ones_in_compare_report_and_merge() {
    use retrace::report::load;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = rt.block_on(server());
    let url = srv.url();
    let dir = tempfile::tempdir().unwrap();
    let side = dir.path().join("side");
    std::fs::create_dir(&side).unwrap();
    let t = trace(dir.path());
    let whole_p = dir.path().join("whole.json");
    replay(&t, &url, &whole_p, None);
    let shard_ps: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("shard-{i}.json"));
            replay(&t, &url, &p, Some(&format!("{i}/2")));
            p
        })
        .collect();
    drop(srv);
    let whole_s = with_sidecar(&whole_p, &side);
    let (a, b) = (load::load(&whole_p).unwrap(), load::load(&whole_s).unwrap());
    assert_eq!(a.requests.as_ref().unwrap().len(), 18);
    assert_eq!(a.requests, b.requests);
    assert_eq!(a.scalars, b.scalars);
    let pair = retrace::report::compare::paired_ttft(&a, &b).unwrap();
    assert!((pair.geo_mean_ratio - 1.0).abs() < 1e-12);
    let page = |r: &load::Run| retrace::report::html::report_page(r, (25.0, 50.0));
    // the same page but for the path in its subtitle
    assert_eq!(
        page(&a),
        page(&b).replace("/side/whole.json", "/whole.json")
    );

    let merged = |inputs: &[PathBuf], out: &Path| {
        let mut args = vec!["merge"];
        args.extend(inputs.iter().map(|p| p.to_str().unwrap()));
        args.extend(["-o", out.to_str().unwrap()]);
        assert_eq!(
            retrace::run(support::cli(&args)).unwrap(),
            std::process::ExitCode::SUCCESS
        );
        let mut v = read(out);
        v.as_object_mut().unwrap().remove("merged_from");
        v
    };
    let side_ps: Vec<PathBuf> = shard_ps.iter().map(|p| with_sidecar(p, &side)).collect();
    let inline = merged(&shard_ps, &dir.path().join("m-inline.json"));
    let from_side = merged(&side_ps, &dir.path().join("m-side.json"));
    assert_eq!(inline["merged_from_histograms"], false);
    assert_eq!(inline, from_side);

    // damaged: a cut line, then a missing request
    let file = retrace::result::sidecar::path_for(&whole_s);
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&file, format!("{}\n{}", lines[0], &lines[1][..10])).unwrap();
    let e = load::load(&whole_s).unwrap_err().to_string();
    assert!(
        e.contains("whole.requests.jsonl") && e.contains("line 2"),
        "{e}"
    );
    std::fs::write(&file, lines[1..].join("\n")).unwrap();
    let e = load::load(&whole_s).unwrap_err().to_string();
    assert!(
        e.contains("whole.requests.jsonl") && e.contains("17 of the result's 18"),
        "{e}"
    );
    std::fs::remove_file(&file).unwrap();
    let e = load::load(&whole_s).unwrap_err().to_string();
    assert!(
        e.contains("whole.requests.jsonl") && e.contains("cannot read"),
        "{e}"
    );
}
