//! The readers of result files (`compare`, `report`, `merge`) and the commands that take several
//! inputs, on hostile inputs through the real binary, each child under the 1 GiB address-space
//! limit and a time limit: each such input is an error naming the file (and the key or line).

use crate::support::{self, OutputWithin, MEMORY_LIMIT};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `retrace ARGS` under the memory limit: its exit code and stderr.
fn run(args: &[&Path]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args(args).env("RETRACE_LOG", "warn");
    let out = support::under_memory_limit(&mut cmd, MEMORY_LIMIT)
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `compare R R`, `report R -o ..`, `merge R -o ..` of the result `r`, each one's exit code and
/// stderr.
fn each_reader(r: &Path, dir: &Path) -> Vec<(&'static str, Option<i32>, String)> {
    let (html, merged) = (dir.join("out.html"), dir.join("out.json"));
    let p = |s: &'static str| Path::new(s);
    [
        ("compare", vec![p("compare"), r, r]),
        ("report", vec![p("report"), r, p("-o"), &html]),
        ("merge", vec![p("merge"), r, p("-o"), &merged]),
    ]
    .into_iter()
    .map(|(name, args)| {
        let (code, err) = run(&args);
        (name, code, err)
    })
    .collect()
}

/// A retrace result of `n` requests (all completed) with `extra` keys, written as `dir/NAME`.
fn result(dir: &Path, name: &str, n: u64, extra: Value) -> PathBuf {
    let mut v = json!({
        "schema": "retrace.replay/1", "trace": "t.jsonl", "seed": 0, "speed": 1.0,
        "endpoint_type": "completions", "model_id": "m", "prompt_mode": "token-ids",
        "num_prompts": n, "completed": n, "failed": 0, "duration": 1.0, "histograms": {},
    });
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

/// `n` sidecar rows: request `i` with a TTFT of `i` ms.
fn rows(n: u64) -> String {
    (0..n)
        .map(|i| {
            let t = (i + 1) as f64 / 1e3;
            format!(
                "{{\"index\":{i},\"input_lens\":10,\"output_lens\":1,\"ttfts\":{t},\"latencies\":{t},\"itls\":[],\"errors\":\"\",\"start_times\":{t}}}\n"
            )
        })
        .collect()
}

/// A sidecar of one line longer than the row budget (a sparse file of 1.25 GiB of NUL bytes, one
/// line: read whole, it would not fit in the 1 GiB address space) is an error naming the file
/// and the line, from each reader, without ever holding the line.
#[test]
fn a_sidecar_line_past_the_row_budget_fails_cleanly_under_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let side = dir.path().join("r.requests.jsonl");
    let f = std::fs::File::create(&side).unwrap();
    f.set_len(5 << 28).unwrap();
    drop(f);
    let r = result(
        dir.path(),
        "r.json",
        1,
        json!({"requests_file": "r.requests.jsonl"}),
    );
    for (name, code, err) in each_reader(&r, dir.path()) {
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(
            err.contains("r.requests.jsonl: line 1: longer than 16 MiB"),
            "{name}: {err}"
        );
    }
}

/// `requests_file` names only a regular file beside the result: an absolute path, a path
/// upwards, a device, a FIFO (never opened, so nothing blocks), a symbolic link out of the
/// directory, an empty name are refused by each reader, naming the result file and the key; a
/// plain file beside it reads.
#[test]
fn a_requests_file_that_is_no_plain_file_beside_the_result_is_refused() {
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("runs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(top.path().join("x.jsonl"), rows(2)).unwrap();
    std::fs::write(dir.join("ok.jsonl"), rows(2)).unwrap();
    std::os::unix::fs::symlink(top.path().join("x.jsonl"), dir.join("out.jsonl")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path; it touches no memory of ours.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let ok = result(&dir, "ok.json", 2, json!({"requests_file": "ok.jsonl"}));
    for (name, code, err) in each_reader(&ok, &dir) {
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    for (file, why) in [
        ("/etc/passwd", "not a bare file name"),
        ("../x.jsonl", "not a bare file name"),
        ("/dev/zero", "not a bare file name"),
        ("", "not a bare file name"),
        ("..", "not a bare file name"),
        ("fifo", "is a FIFO"),
        ("out.jsonl", "is a symbolic link"),
    ] {
        let r = result(&dir, "r.json", 2, json!({"requests_file": file}));
        for (name, code, err) in each_reader(&r, &dir) {
            assert_eq!(code, Some(2), "{file:?} {name}: {err}");
            assert!(
                err.contains("r.json: key `requests_file`") && err.contains(why),
                "{file:?} {name}: {err}"
            );
        }
    }
}

/// A result whose arrays are inline and also named in a sidecar (of half its requests) is
/// refused: no reader keeps one half silently.
#[test]
fn a_result_with_arrays_both_inline_and_in_a_sidecar_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("half.jsonl"), rows(2)).unwrap();
    let t = [0.001, 0.002, 0.003, 0.004];
    let r = result(
        dir.path(),
        "r.json",
        2,
        json!({
            "requests_file": "half.jsonl", "ttfts": t, "latencies": t, "input_lens": [1, 1, 1, 1],
            "output_lens": [1, 1, 1, 1], "errors": ["", "", "", ""], "itls": [[], [], [], []],
        }),
    );
    for (name, code, err) in each_reader(&r, dir.path()) {
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(
            err.contains("r.json: key `requests_file`") && err.contains("inline"),
            "{name}: {err}"
        );
    }
}

/// A shard whose per-request arrays hold more requests than its counts, or whose values are
/// absurd, is refused by merge naming file and key, as compare refuses it: nothing is cut to a
/// count, nothing past the bounds is written.
#[test]
fn merge_refuses_shards_whose_arrays_or_values_disagree_or_are_absurd() {
    let dir = tempfile::tempdir().unwrap();
    let arrays = |t: &[f64]| {
        let n = t.len();
        json!({"ttfts": t, "latencies": t, "input_lens": vec![1; n], "output_lens": vec![1; n],
               "errors": vec![""; n], "itls": vec![Vec::<f64>::new(); n], "shard": "0/2"})
    };
    let good = result(dir.path(), "a.json", 2, arrays(&[0.01, 0.02]));
    let with = |name: &str, n: u64, mut v: Value, extra: Value| {
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v["shard"] = json!("1/2");
        result(dir.path(), name, n, v)
    };
    for (name, n, v, extra, key) in [
        (
            "b.json",
            2,
            arrays(&[0.01, 0.02, 0.03, 0.04]),
            json!({}),
            "`ttfts`",
        ),
        ("c.json", 2, arrays(&[0.01, 1e303]), json!({}), "`ttfts`"),
        (
            "d.json",
            2,
            arrays(&[0.01, 0.02]),
            json!({"max_output_tokens_per_s": 1e303}),
            "`max_output_tokens_per_s`",
        ),
        (
            "e.json",
            2,
            arrays(&[0.01, 0.02]),
            json!({"duration": 1e300}),
            "`duration`",
        ),
        (
            "f.json",
            2,
            arrays(&[0.01, 0.02]),
            json!({"completed": 1}),
            "`failed`",
        ),
    ] {
        let bad = with(name, n, v, extra);
        let o = dir.path().join("o.json");
        let (code, err) = run(&[Path::new("merge"), &good, &bad, Path::new("-o"), &o]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(name) && err.contains(key), "{name}: {err}");
        assert!(!o.exists(), "{name}: nothing written");
        let (code, err) = run(&[Path::new("compare"), &good, &bad]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(name) && err.contains(key), "{name}: {err}");
    }
}

/// A recording (a native trace with a wall-clock start) of 10 requests, `dir/a.trace.zst`.
fn recording(dir: &Path) -> PathBuf {
    use retrace::trace::{native, Request, TraceHeader};
    let mut header = TraceHeader::imported(16, true, "test");
    header.t0_unix_us = Some(1_000_000);
    let records = (0..10u64).map(|k| {
        Ok::<_, retrace::trace::TraceError>(Request {
            arrival_us: k * 1000,
            input_tokens: 16,
            output_tokens: 1,
            ..Default::default()
        })
    });
    let p = dir.join("a.trace.zst");
    native::write_file_from(&p, &header, Default::default(), records).unwrap();
    p
}

/// Several inputs name each file once, under any name (a symbolic link, `dir/./f`): a trace set
/// (inspect, convert, replay), a merge (also of AIPerf exports without request ids), compare's
/// `--noise` runs beside its baseline and candidate.
#[test]
fn the_same_file_given_twice_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = recording(d);
    let again = d.join(".").join("a.trace.zst");
    let link = d.join("link.trace.zst");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let o = d.join("o.out");
    let p = Path::new;
    for args in [
        vec![p("inspect"), &a, &again],
        vec![p("convert"), &a, &link, p("-o"), &o],
        vec![p("replay"), &a, &link, p("--dry-run")],
    ] {
        let (code, err) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("given twice") && err.contains("a.trace.zst"),
            "{args:?}: {err}"
        );
    }
    // AIPerf records without request ids: only the file's identity tells
    let recs: String =
        std::fs::read_to_string(support::repo("fixtures/aiperf/profile_export.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                v["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("x_request_id");
                format!("{v}\n")
            })
            .collect();
    let x = d.join("x.jsonl");
    std::fs::write(&x, recs).unwrap();
    let xl = d.join("xl.jsonl");
    std::os::unix::fs::symlink(&x, &xl).unwrap();
    let (code, err) = run(&[p("merge"), &x, &xl, p("-o"), &o]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("xl.jsonl: given twice"), "{err}");
    let b = result(d, "b.json", 0, json!({}));
    let c = result(d, "c.json", 0, json!({}));
    let bl = d.join("bl.json");
    std::os::unix::fs::symlink(&b, &bl).unwrap();
    for noise in [&bl, &c] {
        let (code, err) = run(&[p("compare"), &b, &c, p("--noise"), noise]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("--noise") && err.contains("given twice"),
            "{err}"
        );
    }
    let (code, err) = run(&[p("compare"), &b, &c, p("--noise"), &x, p("--noise"), &xl]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("xl.jsonl: given twice"), "{err}");
    // a run compared with itself counts nothing twice
    let (code, err) = run(&[p("compare"), &b, &bl]);
    assert_eq!(code, Some(0), "{err}");
}

/// An AIPerf per-request export holding each record twice is refused by compare and report as
/// merge refuses two exports sharing a request: the line and the earlier one named.
#[test]
fn an_aiperf_export_with_each_record_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let once =
        std::fs::read_to_string(support::repo("fixtures/aiperf/profile_export.jsonl")).unwrap();
    let twice = dir.path().join("twice.jsonl");
    std::fs::write(&twice, format!("{once}{once}")).unwrap();
    let n = once.lines().count();
    for (name, code, err) in each_reader(&twice, dir.path()) {
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(
            err.contains(&format!(
                "twice.jsonl: AIPerf per-request export, line {}",
                n + 1
            )) && err.contains("is also at line 1 of")
                && err.contains("each request counts once"),
            "{name}: {err}"
        );
    }
}

/// A JSON file nested past serde_json's recursion limit (100,000 levels) is named with that
/// reason by compare, report and merge alike, not read as an unknown trace.
#[test]
fn json_nested_past_the_recursion_limit_is_named_alike_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep.json");
    let depth = 100_000;
    let text = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    std::fs::write(&deep, text).unwrap();
    let errs: Vec<String> = each_reader(&deep, dir.path())
        .into_iter()
        .map(|(name, code, err)| {
            assert_eq!(code, Some(2), "{name}: {err}");
            assert!(
                err.contains("deep.json: JSON nested 128 levels deep")
                    && err.contains("recursion limit"),
                "{name}: {err}"
            );
            err
        })
        .collect();
    assert!(errs.iter().all(|e| *e == errs[0]), "{errs:?}");
}
