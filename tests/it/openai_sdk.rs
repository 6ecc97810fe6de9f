//! The loop on traffic from a real client: the official `openai` Python SDK
//! (`tests/it/openai_sdk_traffic.py`, in the venv `tools/venv/openai.sh` makes) talks to the mock
//! through `retrace record --bodies request`; the recording replays against a fresh mock (side
//! requests included) with the same requests per endpoint, every request re-issued as it was
//! made, the same lengths, recorded failures failing the same way, and `compare RECORDING
//! REPLAY` calling it faithful.
//!
//! The venv's python is `RETRACE_OPENAI_PYTHON`, else `tools/venv/.openai/bin/python`. Without
//! either the test says why and skips, except under CI (`CI` set), where that is a failure.

use retrace::record::{Bodies, RecordConfig};
use retrace::trace::{Request, Trace};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::real_traffic::mock;
use super::real_traffic::{by_endpoint, read_trace};
use super::support::{repo, spawn_recorder, stop_recorder};

/// The venv's python, or why there is none.
fn python() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("RETRACE_OPENAI_PYTHON") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "RETRACE_OPENAI_PYTHON={} does not exist",
                p.display()
            ))
        };
    }
    let p = repo("tools/venv/.openai/bin/python");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "no openai venv ({} missing, RETRACE_OPENAI_PYTHON unset): run tools/venv/openai.sh",
            p.display()
        ))
    }
}

/// What the script saw, one entry per call: (name, HTTP status, usage.completion_tokens).
type Calls = Vec<(String, u64, Option<u64>)>;

/// Runs the SDK script against `base`, at most 60 s (the child is killed if it overruns).
async fn run_sdk(python: &Path, base: &str) -> Calls {
    let child = tokio::process::Command::new(python)
        .arg(repo("tests/it/openai_sdk_traffic.py"))
        .arg(base)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the venv's python");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the SDK script ends within 60 s")
        .expect("SDK script output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "SDK script failed:\n{stdout}\n{stderr}"
    );
    stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            let name = v["call"].as_str().unwrap().to_string();
            (
                name,
                v["status"].as_u64().unwrap(),
                v["completion_tokens"].as_u64(),
            )
        })
        .collect()
}

/// Records `python`'s SDK traffic through a recorder in front of a fresh mock, into `dir`.
async fn record_sdk(python: &Path, dir: &Path) -> (Calls, PathBuf, Trace) {
    let up = mock().await;
    let mut cfg = RecordConfig::new(&format!("http://{}", up.addr), dir.to_path_buf()).unwrap();
    cfg.bodies = Bodies::Request;
    cfg.block_size = 16;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    let calls = run_sdk(python, &format!("http://{}", rec.addr)).await;
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (path, trace) = read_trace(dir);
    (calls, path, trace)
}

/// A request as the server saw it: method, path, parsed body.
fn as_sent(r: &Request) -> (String, String, Value) {
    let body = r
        .body
        .as_deref()
        .filter(|b| !b.is_empty())
        .map_or(Value::Null, |b| serde_json::from_slice(b).unwrap());
    let method = r.method.clone().unwrap_or_else(|| "POST".into());
    (method, r.endpoint.path().to_string(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_of_the_openai_sdk_replays_faithfully() {
    let python = match python() {
        Ok(p) => p,
        Err(why) if std::env::var_os("CI").is_some() => panic!("CI must run this test: {why}"),
        Err(why) => {
            crate::support::say_skipped("the openai SDK test", &why);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (calls, path, trace) = record_sdk(&python, &dir.path().join("rec")).await;

    // The SDK got what it asked for: fixed output lengths, a 404 and a 400.
    let want: Calls = [
        ("models.list", 200, None),
        ("completions", 200, Some(6)),
        ("completions.stream", 200, Some(7)),
        ("chat.completions", 200, Some(5)),
        ("chat.completions.stream", 200, Some(8)),
        ("unknown_model", 404, None),
        ("bad_request", 400, None),
    ]
    .into_iter()
    .map(|(c, s, n)| (c.to_string(), s, n))
    .collect();
    assert_eq!(calls, want);

    // The recording: one record per call, the side request apart, failures by status.
    let raw = std::fs::read(&path).unwrap();
    assert!(
        !raw.windows(9).any(|w| w == b"sk-never-"),
        "a credential reached the trace"
    );
    let endpoints: BTreeMap<String, u64> = [
        ("GET /v1/models", 1),
        ("POST /v1/chat/completions", 2),
        ("POST /v1/completions", 4),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(by_endpoint(&trace), endpoints);
    let work: Vec<&Request> = trace.requests.iter().filter(|r| r.is_workload()).collect();
    assert_eq!(work.len(), 6);
    let recorded_out: Vec<u64> = work.iter().map(|r| r.output_tokens).collect();
    assert_eq!(recorded_out, [6, 7, 5, 8, 0, 0]);
    let failures: Vec<_> = work.iter().map(|r| r.recorded_failure()).collect();
    assert_eq!(
        failures,
        [None, None, None, None, Some("http_404"), Some("http_400")]
    );
    let streamed: Vec<_> = work.iter().map(|r| r.params.stream).collect();
    assert_eq!(
        streamed,
        [None, Some(true), None, Some(true), None, None],
        "the SDK omits stream unless asked"
    );

    // The replay, against a fresh mock behind a second recorder that sees what it sends.
    let target = mock().await;
    let mut cfg = RecordConfig::new(
        &format!("http://{}", target.addr),
        dir.path().join("replayed"),
    )
    .unwrap();
    cfg.bodies = Bodies::Request;
    cfg.block_size = 16;
    cfg.flush_every = Duration::from_millis(100);
    let seen = spawn_recorder(cfg).await;
    let result = dir.path().join("replay.json");
    let out = super::real_traffic::replay_recording(&path, &seen.addr.to_string(), &result).await;
    stop_recorder(seen.stop, seen.task).await;
    target.shutdown().await;
    let r = &out.result;

    // The same requests per endpoint; each re-issued as the SDK made it (the SDK already sets
    // max_tokens, ignore_eos and include_usage, so replay's adjustments change nothing).
    let got: BTreeMap<String, u64> =
        serde_json::from_value(r["requests_by_endpoint"].clone()).unwrap();
    assert_eq!(got, endpoints);
    assert_eq!(r["auxiliary"]["sent"], 1);
    assert_eq!(r["auxiliary"]["ok"], 1);
    assert_eq!(r["left_out"], json!({}));
    let (_, replayed) = read_trace(&dir.path().join("replayed"));
    let sent: Vec<_> = replayed.requests.iter().map(as_sent).collect();
    let recorded: Vec<_> = trace.requests.iter().map(as_sent).collect();
    // First, before the clock: replay's own model discovery. Then every recorded request, as it
    // was made (compared as a set: two sends a few ms apart on different connections may reach
    // the second recorder in either order on a loaded machine; the schedule itself is checked
    // through `intended_times` elsewhere).
    assert_eq!(sent[0], ("GET".into(), "/v1/models".into(), Value::Null));
    let key = |r: &(String, String, Value)| format!("{} {} {}", r.0, r.1, r.2);
    let mut again: Vec<_> = sent[1..].iter().map(key).collect();
    let mut want: Vec<_> = recorded.iter().map(key).collect();
    again.sort();
    want.sort();
    assert_eq!(again, want);

    // Lengths as recorded; recorded failures fail again the same way; nothing else fails.
    let lens = |k: &str| -> Vec<u64> { serde_json::from_value(r[k].clone()).unwrap() };
    let want_in: Vec<u64> = work.iter().map(|q| q.input_tokens).collect();
    assert_eq!(lens("input_lens"), want_in);
    assert_eq!(lens("output_lens"), recorded_out);
    let o = &r["recorded_outcomes"];
    assert_eq!(
        o["recorded_errors"],
        json!({"http_400": 1, "http_404": 1}),
        "{o}"
    );
    assert_eq!(o["failed_again_same_way"], 2, "{o}");
    assert_eq!(
        (o["now_succeed"].clone(), o["newly_failed"].clone()),
        (json!(0), json!(0)),
        "{o}"
    );
    assert_eq!(
        (r["completed"].clone(), r["failed"].clone()),
        (json!(4), json!(2))
    );

    // compare RECORDING REPLAY: faithful, and both sides count the same completions (a
    // non-streamed completion is completed on both sides, and kept out of TTFT on both: it is
    // reported apart, E2EL only).
    let base = retrace::report::load::load(&path).unwrap();
    let cand = retrace::report::load::load(&result).unwrap();
    assert_eq!(
        (base.scalar("completed"), base.scalar("failed")),
        (Some(4.0), Some(2.0))
    );
    let ttfts = |run: &retrace::report::load::Run| {
        run.samples_ms(retrace::report::load::Metric::Ttft)
            .map_or(0, |v| v.len())
    };
    assert_eq!((ttfts(&base), ttfts(&cand)), (2, 2));
    let whole = |run: &retrace::report::load::Run| {
        let q = run.requests.as_ref().unwrap();
        (0..q.len())
            .filter(|&i| q.ok(i) && q.non_streamed.get(i) == Some(&true))
            .count()
    };
    assert_eq!((whole(&base), whole(&cand)), (2, 2));
    assert_eq!(r["count_non_streamed_e2el"], 2);
    let (_, f) = super::real_traffic::compare_runs(&base, &cand);
    assert_eq!((f.paired, f.unpaired), (6, 0));
    assert_eq!((f.isl_exact, f.osl_exact), (1.0, 1.0));
    super::support::assert_faithful_or_sent_late(&f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_gets_through_a_shadowing_proxy_what_it_gets_directly() {
    let python = match python() {
        Ok(p) => p,
        Err(why) if std::env::var_os("CI").is_some() => panic!("CI must run this test: {why}"),
        Err(why) => {
            crate::support::say_skipped("the openai SDK shadow test", &why);
            return;
        }
    };
    let (up, shadow) = (mock().await, mock().await);
    let direct = run_sdk(&python, &format!("http://{}", up.addr)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().to_path_buf()).unwrap();
    cfg.flush_every = Duration::from_millis(100);
    let to = [format!("http://{}", shadow.addr)];
    let sc = retrace::record::shadow::ShadowConfig::new(&to, None, cfg.upstream_uri()).unwrap();
    cfg.shadow = Some(sc);
    let rec = spawn_recorder(cfg).await;
    let via = run_sdk(&python, &format!("http://{}", rec.addr)).await;
    stop_recorder(rec.stop, rec.task).await;
    assert_eq!(
        via, direct,
        "the SDK sees the same answers with a shadow behind the proxy"
    );
    let (_, trace) = read_trace(dir.path());
    for r in &trace.requests {
        // workload requests are mirrored (the failing ones too), the side request is not
        let want = usize::from(r.is_workload());
        assert_eq!(r.shadows.len(), want, "{}", r.route());
    }
    let copies: Vec<u16> = trace
        .requests
        .iter()
        .flat_map(|r| r.shadows.iter())
        .map(|c| c.response.as_ref().map_or(0, |x| x.status))
        .collect();
    assert_eq!(
        copies,
        [200, 200, 200, 200, 404, 400],
        "the shadow answered each copy alike"
    );
    up.shutdown().await;
    shadow.shutdown().await;
}
