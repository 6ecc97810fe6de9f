//! The loop on the traffic real clients send: `vllm bench serve`, AIPerf and the `openai` SDK
//! mix completions and chat, streamed and not, with side requests (`/tokenize`, `/detokenize`,
//! `GET /v1/models`, `/metrics`) and the odd 404 or 400. Recorded through the proxy in front of
//! the mock, the recording replays against a fresh mock with the same requests per endpoint,
//! the same lengths, the recorded schedule, recorded failures failing the same way, and
//! `compare RECORDING REPLAY` calling it faithful.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retrace::mock::MockConfig;
use retrace::record::{Bodies, RecordConfig};
use retrace::trace::Trace;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::support::{replay_cfg, spawn_recorder, stop_recorder};

pub(super) async fn mock() -> retrace::mock::MockHandle {
    mock_with(None).await
}

/// The mock, counting tokens with `tokenizer` when given (its chat template adds tokens around
/// a message).
async fn mock_with(tokenizer: Option<&Path>) -> retrace::mock::MockHandle {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = MockConfig {
        fixed_timing: Some((15.0, 2.0)),
        tokenizer: tokenizer.map(Path::to_path_buf),
        ..Default::default()
    };
    retrace::mock::start(l, cfg).await.unwrap()
}

/// `compare BASE CAND` in process (no rules, default options): the comparison and its fidelity
/// section (a recording against its replay has one).
pub(super) fn compare_runs(
    base: &retrace::report::load::Run,
    cand: &retrace::report::load::Run,
) -> (
    retrace::report::compare::Comparison,
    retrace::report::workload::Fidelity,
) {
    let cmp = retrace::report::compare::compare(base, cand, &[], &Default::default());
    let f = cmp.workload.as_ref().and_then(|w| w.fidelity.clone());
    (cmp, f.expect("a fidelity section"))
}

/// [`compare_runs`] of a recording and a replay result file.
pub(super) fn compare_files(
    recording: &Path,
    result: &Path,
) -> (
    retrace::report::compare::Comparison,
    retrace::report::workload::Fidelity,
) {
    let load = |p: &Path| retrace::report::load::load(p).unwrap();
    compare_runs(&load(recording), &load(result))
}

/// `retrace convert ARGS...` in process.
fn convert(args: &[&str]) -> anyhow::Result<()> {
    let mut argv = vec!["convert"];
    argv.extend_from_slice(args);
    let retrace::cli::Command::Convert(a) = super::support::cli(&argv).command else {
        unreachable!()
    };
    retrace::convert::run(&a.options()?).map(|_| ())
}

/// One exchange of the mix: method, path, body (empty for GET), expected status.
fn mix() -> Vec<(&'static str, &'static str, Value, StatusCode)> {
    let ok = StatusCode::OK;
    let m = "mock-llama";
    let ids = |n: u32, base: u32| (0..n).map(|k| 100 + base + k).collect::<Vec<_>>();
    let mut v = vec![
        ("GET", "/v1/models", Value::Null, ok),
        (
            "POST",
            "/tokenize",
            json!({"model": m, "prompt": "hello world"}),
            ok,
        ),
    ];
    for k in 0..6u32 {
        let shared = ids(32, 0);
        let mut prompt = shared.clone();
        prompt.extend(ids(8 + k, 1000 * (k + 1)));
        v.push((
            "POST",
            "/v1/completions",
            json!({"model": m, "prompt": prompt, "max_tokens": 4 + k, "ignore_eos": true,
                   "stream": true, "stream_options": {"include_usage": true}}),
            ok,
        ));
        let mut chat = json!({"model": m, "max_tokens": 3 + k, "ignore_eos": true,
            "messages": [{"role": "user", "content": format!("question {k}: how do caches work?")}]});
        if k % 2 == 0 {
            chat["stream"] = json!(true);
            chat["stream_options"] = json!({"include_usage": true});
        }
        v.push(("POST", "/v1/chat/completions", chat, ok));
        if k % 3 == 0 {
            v.push(("GET", "/metrics", Value::Null, ok));
            v.push((
                "POST",
                "/detokenize",
                json!({"model": m, "tokens": [1, 2, 3]}),
                // ids outside the mock's vocabulary
                StatusCode::BAD_REQUEST,
            ));
        }
    }
    v.push((
        "POST",
        "/v1/completions",
        json!({"model": m, "prompt": "a non-streamed text prompt", "max_tokens": 5, "ignore_eos": true}),
        ok,
    ));
    v.push((
        "POST",
        "/v1/completions",
        json!({"model": "no-such-model", "prompt": [1, 2, 3], "max_tokens": 3, "stream": true}),
        StatusCode::NOT_FOUND,
    ));
    v.push((
        "POST",
        "/v1/completions",
        json!({"model": m, "prompt": [1, 2, 3], "max_tokens": "three"}),
        StatusCode::BAD_REQUEST,
    ));
    v
}

/// Sends the mix through `base`, one exchange every 20 ms on an absolute schedule.
async fn drive(base: &str) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let t0 = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (k, (method, path, body, want)) in mix().into_iter().enumerate() {
        let (client, url) = (client.clone(), format!("{base}{path}"));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(t0 + Duration::from_millis(20 * k as u64)).await;
            let bytes = match body {
                Value::Null => Bytes::new(),
                b => Bytes::from(b.to_string()),
            };
            let req = Request::builder()
                .method(method)
                .uri(url)
                .header("content-type", "application/json")
                .header("authorization", "Bearer sk-never-recorded")
                .body(Full::new(bytes))
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
                .await
                .expect("response in time")
                .expect("response");
            let status = resp.status();
            let body = resp.into_body().collect().await.expect("whole body");
            assert_eq!(status, want, "{method} {path}: {:?}", body.to_bytes());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

pub(super) fn read_trace(dir: &Path) -> (PathBuf, Trace) {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.zst"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let (t, _) = retrace::trace::import::read_path(&files[0], &Default::default()).unwrap();
    (files[0].clone(), t)
}

/// `replay RECORDING --target http://ADDR --include-aux --detailed --result-json RESULT`, at most
/// 60 s.
pub(super) async fn replay_recording(
    recording: &Path,
    addr: &str,
    result: &Path,
) -> retrace::replay::Outcome {
    replay_with(recording, addr, result, &["--include-aux"]).await
}

/// `replay RECORDING --target http://ADDR EXTRA... --detailed --result-json RESULT`, at most 60 s.
async fn replay_with(
    recording: &Path,
    addr: &str,
    result: &Path,
    extra: &[&str],
) -> retrace::replay::Outcome {
    let target = format!("http://{addr}");
    let mut args = vec![recording.to_str().unwrap(), "--target", &target];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--detailed", "--result-json", result.to_str().unwrap()]);
    tokio::time::timeout(
        Duration::from_secs(60),
        retrace::replay::replay(replay_cfg(&args)),
    )
    .await
    .expect("replay ends")
    .unwrap()
}

pub(super) fn by_endpoint(t: &Trace) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in &t.requests {
        *m.entry(r.route()).or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_of_real_client_traffic_replays_faithfully() {
    let dir = tempfile::tempdir().unwrap();
    let up = mock().await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.bodies = Bodies::Request;
    cfg.block_size = 16;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    drive(&format!("http://{}", rec.addr)).await;
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;

    let (path, trace) = read_trace(&dir.path().join("rec"));
    let sent = mix();
    assert_eq!(trace.requests.len(), sent.len());
    assert!(trace
        .requests
        .windows(2)
        .all(|w| w[0].arrival_us <= w[1].arrival_us));
    let raw = std::fs::read(&path).unwrap();
    assert!(
        !raw.windows(9).any(|w| w == b"sk-never-"),
        "a credential reached the trace"
    );
    let work: Vec<_> = trace.requests.iter().filter(|r| r.is_workload()).collect();
    assert_eq!(
        work.len(),
        15,
        "6 completions, 6 chats, 1 text, 1 unknown model, 1 bad"
    );
    let errors: Vec<_> = trace
        .requests
        .iter()
        .filter_map(|r| r.recorded_failure())
        .collect();
    assert_eq!(
        errors.iter().filter(|e| **e == "http_404").count(),
        1,
        "{errors:?}"
    );
    assert_eq!(
        errors.iter().filter(|e| **e == "http_400").count(),
        3,
        "{errors:?}"
    );

    // The replay, against a fresh mock, side requests included.
    let target = mock().await;
    let result = dir.path().join("replay.json");
    let out = replay_recording(&path, &target.addr.to_string(), &result).await;
    target.shutdown().await;
    let r = &out.result;

    // The same requests per endpoint, every side request answered as recorded.
    let got: BTreeMap<String, u64> =
        serde_json::from_value(r["requests_by_endpoint"].clone()).unwrap();
    assert_eq!(got, by_endpoint(&trace));
    assert_eq!(r["auxiliary"]["sent"], 6);
    assert_eq!(r["auxiliary"]["errors"], json!({"http_400": 2}));
    // Lengths: input from the trace, output as the server produced it again.
    let lens = |k: &str| -> Vec<u64> { serde_json::from_value(r[k].clone()).unwrap() };
    let want_in: Vec<u64> = work.iter().map(|q| q.input_tokens).collect();
    let want_out: Vec<u64> = work.iter().map(|q| q.output_tokens).collect();
    assert_eq!(lens("input_lens"), want_in);
    assert_eq!(lens("output_lens"), want_out);
    // Recorded failures fail again the same way; nothing else fails.
    let o = &r["recorded_outcomes"];
    assert_eq!(o["recorded_failures"], 2, "{o}");
    assert_eq!(o["failed_again_same_way"], 2, "{o}");
    assert_eq!(
        (o["now_succeed"].clone(), o["newly_failed"].clone()),
        (json!(0), json!(0)),
        "{o}"
    );
    assert_eq!(r["failed"], 2);
    // The three non-streamed chats and the text completion are reported apart, E2EL only
    // (vLLM always streams).
    assert_eq!(r["count_non_streamed_e2el"], 4);
    // The schedule is the recording's (the machine's own send lateness is a benchmark's
    // business; here only that no send was grossly late).
    let times = |k: &str| -> Vec<f64> { serde_json::from_value(r[k].clone()).unwrap() };
    let (intended, started) = (times("intended_times"), times("start_times"));
    let a0 = work[0].arrival_us as f64 / 1e6;
    for (i, q) in work.iter().enumerate() {
        let want = q.arrival_us as f64 / 1e6 - a0;
        assert!(
            ((intended[i] - intended[0]) - want).abs() < 1e-3,
            "request {i}"
        );
        assert!(
            started[i] - intended[i] < 5.0,
            "request {i} sent {} s late",
            started[i] - intended[i]
        );
    }

    // compare RECORDING REPLAY: paired in arrival order, faithful.
    let (cmp, f) = compare_files(&path, &result);
    // Both sides' output lengths are those of the requests that succeeded.
    let w = cmp.workload.as_ref().unwrap();
    assert_eq!((w.osl_ks.d, w.isl_ks.d), (0.0, 0.0), "{w:?}");
    assert_eq!((f.paired, f.unpaired), (15, 0));
    // Input lengths as the server counted them again (every success reports usage), equal to
    // the recording's.
    assert_eq!(f.isl_server_counted, 13, "{f:?}");
    assert_eq!((f.isl_exact, f.osl_exact), (1.0, 1.0));
    super::support::assert_faithful_or_sent_late(&f);
    let text =
        retrace::report::render::render(&cmp, &[], retrace::report::render::RenderFormat::Text);
    let verdict = match f.sent_on_time {
        true => "Faithful replay",
        false => "sent late",
    };
    assert!(text.contains(verdict), "{text}");
}

/// A recording without bodies (the default: prompt text is stored only when asked) holds chat
/// requests that replay cannot rebuild with a tokenizer in token-id mode. The replay leaves them out, counted,
/// and `compare RECORDING REPLAY` must not call that replay faithful.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_left_workload_requests_out_is_not_called_faithful() {
    let dir = tempfile::tempdir().unwrap();
    let up = mock().await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.block_size = 16;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    drive(&format!("http://{}", rec.addr)).await;
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (path, trace) = read_trace(&dir.path().join("rec"));
    let chats = trace
        .requests
        .iter()
        .filter(|r| r.is_workload() && r.endpoint == retrace::trace::Endpoint::Chat)
        .count();
    assert!(chats > 0);

    // A local tokenizer without --prompt-mode text: chats without a body cannot be rebuilt.
    let target = mock().await;
    let result = dir.path().join("replay.json");
    let tok = super::replay::word_tokenizer(dir.path());
    let args = ["--include-aux", "--tokenizer", tok.to_str().unwrap()];
    let out = replay_with(&path, &target.addr.to_string(), &result, &args).await;
    target.shutdown().await;
    assert_eq!(
        out.result["left_out"]["chat_without_tokenizer"], chats,
        "{}",
        out.result["left_out"]
    );

    let (cmp, f) = compare_files(&path, &result);
    assert_eq!(f.left_out, chats, "{f:?}");
    assert!(!f.faithful, "{f:?}");
    let text =
        retrace::report::render::render(&cmp, &[], retrace::report::render::RenderFormat::Text);
    assert!(text.contains("Not a faithful replay"), "{text}");
    assert!(
        text.contains(&format!("{chats} workload requests left out")),
        "{text}"
    );
}

/// Text completions and chats recorded without bodies (input lengths are the server's counts,
/// chat template and special tokens included), replayed with the tokenizer: the replay takes
/// what the target adds off its synthesised text, so the server counts every recorded length
/// again, and `compare` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_rebuilt_without_bodies_are_counted_as_recorded_by_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let tok = super::replay::word_tokenizer(dir.path());
    let up = mock_with(Some(&tok)).await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.block_size = 4;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let text = " aa ab ac ad ae af ba bb bc";
    for k in 0..6 {
        let (path, body) = if k % 2 == 0 {
            (
                "/v1/chat/completions",
                json!({"model": "mock-llama", "messages": [{"role": "user", "content": text}],
                       "max_tokens": 3, "stream": k % 4 == 0}),
            )
        } else {
            (
                "/v1/completions",
                json!({"model": "mock-llama", "prompt": text, "max_tokens": 3, "stream": true}),
            )
        };
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", rec.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
            .await
            .expect("response in time")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    drop(client);
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (path, trace) = read_trace(&dir.path().join("rec"));
    assert_eq!(trace.requests.len(), 6);
    assert!(trace.requests.iter().all(|r| r.body.is_none()));

    let target = mock_with(Some(&tok)).await;
    let result = dir.path().join("replay.json");
    let text = [
        "--tokenizer",
        tok.to_str().unwrap(),
        "--prompt-mode",
        "text",
    ];
    replay_with(&path, &target.addr.to_string(), &result, &text).await;
    target.shutdown().await;

    let fit: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    let fit = fit["tokenizer_fit"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(fit.contains("fitted to the target"), "{fit}");
    let (_, f) = compare_files(&path, &result);
    assert_eq!((f.paired, f.isl_server_counted), (6, 6), "{f:?}");
    assert_eq!(f.isl_exact, 1.0, "{f:?}");
    super::support::assert_faithful_or_sent_late(&f);
}

/// Chats and text completions recorded without bodies through the proxy in front of the mock
/// (its built-in tokenizer), replayed with no `--tokenizer`: the chats' text comes from the
/// target's `/detokenize`, checked with its `/tokenize`, so nothing is left out and the server
/// counts every recorded input length again, chat template included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chats_recorded_without_bodies_replay_through_the_targets_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let up = mock().await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.block_size = 16;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let shared = "The quick brown fox jumps over the lazy dog, again and again; ".repeat(6);
    let mut chats = 0;
    for k in 0..8 {
        let text = format!("{shared} question {k}: what is {} plus {k}?", k * 7);
        let (path, body) = match k % 4 {
            3 => (
                "/v1/completions",
                json!({"model": "mock-llama", "prompt": text, "max_tokens": 3, "stream": true}),
            ),
            _ => {
                chats += 1;
                let mut messages = vec![json!({"role": "user", "content": text})];
                if k % 4 == 2 {
                    messages.insert(0, json!({"role": "system", "content": "be brief"}));
                }
                (
                    "/v1/chat/completions",
                    json!({"model": "mock-llama", "messages": messages,
                           "max_tokens": 3, "stream": k % 2 == 0}),
                )
            }
        };
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", rec.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
            .await
            .expect("response in time")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    drop(client);
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (path, trace) = read_trace(&dir.path().join("rec"));
    assert_eq!(trace.requests.len(), 8);
    assert!(trace.requests.iter().all(|r| r.body.is_none()));

    let target = mock().await;
    let result = dir.path().join("replay.json");
    let out = replay_with(&path, &target.addr.to_string(), &result, &[]).await;
    target.shutdown().await;
    let r = &out.result;
    assert_eq!(r["left_out"], json!({}), "{}", r["left_out"]);
    assert_eq!(r["left_out_workload"]["left_out"], 0);
    assert_eq!(r["completed"], 8, "{}", r["errors"]);
    assert_eq!(r["target_text"]["prompts"], chats, "{}", r["target_text"]);
    assert_eq!(r["target_text"]["exact"], chats, "{}", r["target_text"]);
    assert_eq!(r["inexact_prompts"], 0);
    assert!(out.valid);
    // usage.prompt_tokens of every request, as the server counted it: the recorded length.
    let recorded: Vec<u64> = trace.requests.iter().map(|q| q.input_tokens).collect();
    let server: Vec<u64> = serde_json::from_value(r["server_input_lens"].clone()).unwrap();
    assert_eq!(server, recorded);
    let (_, f) = compare_files(&path, &result);
    assert_eq!((f.paired, f.isl_server_counted), (8, 8), "{f:?}");
    assert_eq!(f.isl_exact, 1.0, "{f:?}");
    // A loaded machine may send late: the verdict then says so, the rest still holds.
    super::support::assert_faithful_or_sent_late(&f);
}

/// A target whose tokenizer cannot make the text (here: the mock with a tokenizer that knows
/// no common word) leaves the chats recorded without bodies out, as before, and says why; with
/// `--prompt-mode text` and no `--tokenizer` that is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_cannot_make_text_leaves_bodiless_chats_out() {
    let dir = tempfile::tempdir().unwrap();
    let tok = super::replay::word_tokenizer(dir.path());
    let up = mock_with(Some(&tok)).await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.block_size = 4;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    for k in 0..4 {
        let (path, body) = match k {
            0 => (
                "/v1/chat/completions",
                json!({"model": "mock-llama", "messages": [{"role": "user", "content": " aa ab"}], "max_tokens": 2}),
            ),
            _ => (
                "/v1/completions",
                json!({"model": "mock-llama", "prompt": " aa ab ac", "max_tokens": 2}),
            ),
        };
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", rec.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    drop(client);
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (path, _) = read_trace(&dir.path().join("rec"));

    let target = mock_with(Some(&tok)).await;
    let result = dir.path().join("replay.json");
    let out = replay_with(&path, &target.addr.to_string(), &result, &[]).await;
    let r = &out.result;
    assert_eq!(
        r["left_out"]["chat_without_tokenizer"], 1,
        "{}",
        r["left_out"]
    );
    assert_eq!(r["completed"], 3);
    assert!(r.get("target_text").is_none());
    assert_eq!(r["selection"]["text_prompts"], false);
    // 1 of 4 left out: beyond the 10% a valid run may leave out.
    assert!(!out.valid);
    assert!(
        out.report.contains("1 of 4 workload requests left out"),
        "{}",
        out.report
    );
    let text = ["--prompt-mode", "text"];
    let target_url = format!("http://{}", target.addr);
    let args = [
        path.to_str().unwrap(),
        "--target",
        &target_url,
        text[0],
        text[1],
    ];
    let e = retrace::replay::replay(replay_cfg(&args))
        .await
        .err()
        .unwrap();
    let e = format!("{e:#}");
    assert!(e.contains("--prompt-mode text without --tokenizer"), "{e}");
    target.shutdown().await;
}

/// Two proxy replicas in front of one server, the same prompts through both: `convert A B -o M`
/// merges them by wall clock into one trace in arrival order, hash ids shared across replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recordings_of_a_fleet_merge_into_one_workload() {
    let dir = tempfile::tempdir().unwrap();
    let up = mock().await;
    let mut recs = Vec::new();
    for name in ["a", "b"] {
        let mut cfg =
            RecordConfig::new(&format!("http://{}", up.addr), dir.path().join(name)).unwrap();
        cfg.block_size = 16;
        cfg.flush_every = Duration::from_millis(100);
        recs.push(spawn_recorder(cfg).await);
    }
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let prompt: Vec<u32> = (100..164).collect();
    for k in 0..6 {
        let body =
            json!({"model": "mock-llama", "prompt": prompt, "max_tokens": 2, "ignore_eos": true});
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://{}/v1/completions", recs[k % 2].addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    for r in recs {
        stop_recorder(r.stop, r.task).await;
    }
    up.shutdown().await;
    let (a, ta) = read_trace(&dir.path().join("a"));
    let (b, tb) = read_trace(&dir.path().join("b"));
    let merged = dir.path().join("fleet.trace.zst");
    let (a_s, b_s, m_s) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        merged.to_str().unwrap(),
    );
    convert(&[a_s, b_s, "-o", m_s]).unwrap();
    let (m, _) = retrace::trace::import::read_path(&merged, &Default::default()).unwrap();
    assert_eq!(m.requests.len(), 6);
    assert!(m
        .requests
        .windows(2)
        .all(|w| w[0].arrival_us <= w[1].arrival_us));
    assert!(m
        .requests
        .iter()
        .all(|r| r.hash_ids == ta.requests[0].hash_ids && r.hash_ids.len() == 4));
    assert_eq!(
        m.header.t0_unix_us,
        ta.header.t0_unix_us.min(tb.header.t0_unix_us)
    );
    // `inspect A B` reads the same merged workload as `inspect M`.
    let stats = |files: &[&str]| {
        let mut argv = vec!["inspect", "--json"];
        argv.extend_from_slice(files);
        let retrace::cli::Command::Inspect(a) = super::support::cli(&argv).command else {
            unreachable!()
        };
        let v: Value = serde_json::from_str(&retrace::inspect::run(&a.options()).unwrap()).unwrap();
        v["stats"].clone()
    };
    assert_eq!(stats(&[a_s, b_s]), stats(&[m_s]));
    assert_eq!(stats(&[a_s, b_s])["requests"], 6);
    // `replay A B` sends the merged workload, on the merged schedule.
    let up = mock().await;
    let target = format!("http://{}", up.addr);
    let replayed = |traces: &[&str], out: &str| {
        let result = dir.path().join(out);
        let mut args = traces.to_vec();
        args.extend_from_slice(&["--target", &target, "--detailed"]);
        args.extend_from_slice(&["--result-json", result.to_str().unwrap()]);
        let cfg = replay_cfg(&args);
        async move {
            tokio::time::timeout(Duration::from_secs(60), retrace::replay::replay(cfg))
                .await
                .expect("replay ends")
                .unwrap();
            let v: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
            v
        }
    };
    let (two, one) = (
        replayed(&[a_s, b_s], "two.json").await,
        replayed(&[m_s], "one.json").await,
    );
    up.shutdown().await;
    assert_eq!(two["completed"], 6);
    assert_eq!(two["intended_times"].as_array().map(Vec::len), Some(6));
    assert_eq!(two["intended_times"], one["intended_times"]);
    assert_eq!(two["input_lens"], one["input_lens"]);
    assert_eq!(two["trace"], format!("{a_s} {b_s}"));
    // A recording hashed with another key is refused, naming the file.
    let mut other = ta.clone();
    other.header.hash_scheme = retrace::trace::HashScheme::HmacSha256;
    other
        .header
        .meta
        .insert("hash_key_id".into(), "0123456789abcdef".into());
    let c = dir.path().join("other.trace.zst");
    retrace::trace::native::write_file(&c, &other, Default::default()).unwrap();
    let e = convert(&[a_s, c.to_str().unwrap(), "-o", m_s])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("other.trace.zst") && e.contains("cannot be merged"),
        "{e}"
    );
}

/// Credentials in `--upstream` or `--target` are refused, and the refusal never shows them.
#[test]
fn credentials_in_urls_are_refused_without_being_shown() {
    let e = RecordConfig::new("http://USER:PASS@127.0.0.1:18100/", "/tmp/unused")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--upstream") && e.contains("***@127.0.0.1") && !e.contains("PASS"),
        "{e}"
    );
    let e =
        super::support::replay_config(&["t.jsonl", "--target", "http://user:SECRET@127.0.0.1:9/"])
            .and_then(|c| {
                retrace::replay::http::target::Target::parse(
                    c.target.as_deref().unwrap_or(""),
                    Default::default(),
                )
                .map(|_| c)
                .map_err(anyhow::Error::msg)
            })
            .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("--target") && !e.contains("SECRET"), "{e}");
}

/// A key in the query string of a base URL would reach result files, reports and logs (and
/// break the API paths appended to it): refused, without showing it.
#[test]
fn a_query_string_in_target_or_upstream_is_refused_without_being_shown() {
    let e = RecordConfig::new("http://127.0.0.1:18100/?key=sk-SECRET", "/tmp/unused")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--upstream") && !e.contains("SECRET"), "{e}");
    let e = retrace::replay::http::target::Target::parse(
        "http://127.0.0.1:9/?api_key=sk-SECRET",
        Default::default(),
    )
    .unwrap_err();
    assert!(e.contains("--target") && !e.contains("SECRET"), "{e}");
}

/// Absurd values that would make a replay wait for ever are refused, naming the flag or row.
#[test]
fn schedules_beyond_a_sane_bound_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = super::support::mooncake(dir.path(), &[(0, 10, 2, &[1]), (1000, 10, 2, &[2])]);
    let t = t.to_str().unwrap();
    let e = super::support::replay_config(&[t, "--speed", "1e-300"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--speed"), "{e}");
    let cfg = super::support::replay_cfg(&[
        t,
        "--request-rate",
        "1e-300",
        "--target",
        "http://127.0.0.1:9",
    ]);
    let (trace, _) = retrace::trace::import::read_path(Path::new(t), &Default::default()).unwrap();
    let e = retrace::replay::plan(&cfg, trace, false)
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(e.contains("days") && e.contains("--request-rate"), "{e}");
    let s = dir.path().join("s.json");
    std::fs::write(&s, r#"{"id":"a","block_size":64,"requests":[{"t":0,"type":"s","in":130,"out":5,"hash_ids":[1,2],"think_time":1e300}]}"#).unwrap();
    let e = retrace::trace::import::read_path(&s, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("think_time") && e.contains("30 days"), "{e}");
}

/// A `--tokenizer` that is not the target's is named before the run: a template adds the same
/// tokens to every prompt, a different tokenizer counts longer text differently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenizer_that_does_not_match_the_target_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let tok = super::replay::word_tokenizer(dir.path());
    let ids: &[u64] = &[0, 1, 2];
    let trace = super::support::mooncake(dir.path(), &[(0, 40, 2, ids), (5, 40, 2, ids)]);
    let tok_args = [
        "--tokenizer",
        tok.to_str().unwrap(),
        "--prompt-mode",
        "text",
    ];
    // A target whose tokenizer reads every character as a token.
    let chars = dir.path().join("chars.json");
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), 0.into());
    for (k, c) in (b'a'..=b'z').enumerate() {
        vocab.insert((c as char).to_string(), (k + 1).into());
    }
    let char_level = json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\S"}, "behavior": "Isolated", "invert": false},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}});
    std::fs::write(&chars, char_level.to_string()).unwrap();
    let mut fits = Vec::new();
    for target in [mock_with(Some(&tok)).await, mock_with(Some(&chars)).await] {
        let result = dir.path().join("r.json");
        replay_with(&trace, &target.addr.to_string(), &result, &tok_args).await;
        target.shutdown().await;
        let v: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
        fits.push(v["tokenizer_fit"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        fits[0].contains("fitted to the target"),
        "the same tokenizer: {}",
        fits[0]
    );
    assert!(
        fits[1].contains("does not match the target") && fits[1].contains("tokenizer.json"),
        "a character-level target: {}",
        fits[1]
    );
}

/// `--loop` and `--overlay` beyond what a whole-trace plan holds are refused before any copy is
/// made, naming the flag, under a 1 GiB address-space limit (they once allocated 5.8 GB first).
#[test]
fn loop_and_overlay_beyond_the_whole_plan_budget_are_refused_before_copying() {
    use super::support::{under_memory_limit, OutputWithin, CHILD_LIMIT, MEMORY_LIMIT};
    let t = super::support::repo("traces/mooncake_conversation_1k.jsonl");
    for (flag, k, speed, why) in [
        ("--loop", "4000", "0.1", "days"),
        ("--loop", "100000", "1000", "in memory"),
        ("--overlay", "100000", "1", "in memory"),
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
        let trace = t.to_str().unwrap();
        cmd.args(["replay", trace, flag, k, "--dry-run", "--speed", speed]);
        let out = under_memory_limit(&mut cmd, MEMORY_LIMIT)
            .output_within(CHILD_LIMIT)
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {k}: {err}");
        assert!(err.contains(flag) && err.contains(why), "{flag} {k}: {err}");
    }
    // Within the budget the copies are planned.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args([
        "replay",
        t.to_str().unwrap(),
        "--loop",
        "3",
        "--dry-run",
        "--speed",
        "1",
    ]);
    let out = under_memory_limit(&mut cmd, MEMORY_LIMIT)
        .output_within(CHILD_LIMIT)
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
