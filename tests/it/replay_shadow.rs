//! `retrace replay --target A --shadow B`: every planned request goes to both servers with the
//! same prompt, the target's credentials never reach the shadow, each side writes its own result
//! and `compare` (its paired TTFT) and `compare --shadow` (every metric) pair the two request by
//! request; flags that cannot hold are refused, naming
//! the flag, and a shadow that cannot be reached ends the run before anything is sent.

use crate::support::{self, OutputWithin, ServerConfig};
use retrace::replay;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `n` requests 25 ms apart, each its own prompt.
fn trace(dir: &Path, n: u64) -> std::path::PathBuf {
    let rows: Vec<(u64, u64, u64, Vec<u64>)> = (0..n)
        .map(|i| (i * 25, 200 + i % 3, 6, vec![2 * i, 2 * i + 1]))
        .collect();
    let rows: Vec<(u64, u64, u64, &[u64])> = rows
        .iter()
        .map(|(t, i, o, h)| (*t, *i, *o, &h[..]))
        .collect();
    support::mooncake(dir, &rows)
}

fn server(ttft_ms: u64) -> ServerConfig {
    ServerConfig {
        ttft: Duration::from_millis(ttft_ms),
        itl: Duration::from_millis(4),
        ..Default::default()
    }
}

/// 24 requests replayed against `target` and shadowed to `shadow` (plus `extra` flags), the
/// target's result at `dir/base.json`.
async fn shadowed(dir: &Path, target: &str, shadow: &str, extra: &[&str]) -> replay::Outcome {
    let t = trace(dir, 24);
    let base = dir.join("base.json");
    let mut args = vec![
        t.to_str().unwrap(),
        "--target",
        target,
        "--shadow",
        shadow,
        "--model",
        "test-model",
        "--header",
        "Authorization=Bearer sk-target-only",
        "--result-json",
        base.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let cfg = support::replay_cfg(&args);
    tokio::time::timeout(Duration::from_secs(120), replay::replay(cfg))
        .await
        .expect("the replay ends")
        .expect("a shadowed replay")
}

/// `retrace compare --shadow BASE --format json`'s first judged shadow and its rows.
fn compare_shadow(base: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let res = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(["compare", "--shadow", base.to_str().unwrap()])
        .args(["--format", "json"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&res.stdout).expect("compare --shadow's JSON");
    let shadows = v["shadows"].as_array().expect("judged shadows");
    assert_eq!(
        shadows.len(),
        1,
        "one candidate (a control is no candidate): {v}"
    );
    let judged = shadows[0].clone();
    let rows = judged["comparison"]["rows"].as_array().unwrap().clone();
    (judged, rows)
}

/// The row of `key`.
fn row(rows: &[serde_json::Value], key: &str) -> serde_json::Value {
    rows.iter().find(|r| r["key"] == key).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_goes_to_both_targets_and_compare_pairs_them() {
    let (a, b) = (
        support::start(server(20)).await,
        support::start(server(60)).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.json");
    let (ua, ub) = (a.url(), b.url());
    let out = shadowed(dir.path(), &ua, &ub, &[]).await;
    assert_eq!(out.summary.completed, 24);
    assert_eq!(out.shadows.len(), 1);
    let side = &out.shadows[0];
    assert_eq!(
        (side.name.as_str(), side.url.as_str()),
        ("shadow 1", ub.as_str())
    );
    let shadow = &side.outcome;
    assert_eq!((shadow.summary.completed, shadow.summary.failed), (24, 0));
    // The same prompts reached each server.
    let sorted = |p: &std::sync::Mutex<Vec<serde_json::Value>>| {
        let mut v: Vec<String> = p.lock().unwrap().iter().map(|x| x.to_string()).collect();
        v.sort();
        v
    };
    let (pa, pb) = (sorted(&a.prompts), sorted(&b.prompts));
    assert_eq!(pa.len(), 24);
    assert_eq!(pa, pb, "both sides are sent the same prompts");
    // The target's key went to the target alone.
    let keys_a = a.authorizations.lock().unwrap().clone();
    let keys_b = b.authorizations.lock().unwrap().clone();
    assert!(
        keys_a.iter().all(|k| k == "Bearer sk-target-only"),
        "{keys_a:?}"
    );
    assert!(
        keys_b.len() >= 24 && keys_b.iter().all(|k| k.is_empty()),
        "{keys_b:?}"
    );
    // Each side wrote its result, with per-request rows that compare pairs.
    let other = dir.path().join("base.shadow-1.json");
    let res = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(["compare", base.to_str().unwrap(), other.to_str().unwrap()])
        .args(["--format", "json"])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let stdout = String::from_utf8_lossy(&res.stdout);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("compare's JSON");
    let paired = &v["paired"];
    assert_eq!(paired["n"], 24, "{paired}");
    // 60 ms against 20 ms of server TTFT: each shadow request is slower than its pair, and a
    // loaded machine can only add to both sides.
    let ratio = paired["geo_mean_ratio"].as_f64().unwrap();
    assert!(ratio > 1.5, "{paired}");
    assert_eq!(paired["significant"], true, "{paired}");
    // compare --shadow of the target's result pairs every metric: the median of the
    // per-request TTFT deltas is the configured 40 ms.
    let (judged, rows) = compare_shadow(&base);
    assert_eq!(judged["target"]["pairs"], 24, "{judged}");
    let median = row(&rows, "median_ttft_ms");
    let d = median["abs_change"].as_f64().unwrap();
    assert!((d - 40.0).abs() < 5.0, "{median}");
    assert_eq!(median["verdict"], "worse", "{median}");
    let itl = row(&rows, "median_itl_ms")["abs_change"].as_f64().unwrap();
    assert!(itl.abs() < 2.0, "the same 4 ms ITL on both sides: {itl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_side_is_the_noise_band_compare_judges_the_shadow_by() {
    let (a, b, c) = (
        support::start(server(20)).await,
        support::start(server(60)).await,
        support::start(server(20)).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.json");
    let (ua, ub, uc) = (a.url(), b.url(), c.url());
    let out = shadowed(dir.path(), &ua, &ub, &["--shadow-control", &uc]).await;
    let names: Vec<(&str, &str)> = (out.shadows.iter())
        .map(|s| (s.name.as_str(), s.url.as_str()))
        .collect();
    assert_eq!(names, [("shadow 1", ub.as_str()), ("control", uc.as_str())]);
    let control = &out.shadows[1].outcome.summary;
    assert_eq!((control.completed, control.failed), (24, 0));
    let keys_c = c.authorizations.lock().unwrap().clone();
    assert!(
        keys_c.len() >= 24 && keys_c.iter().all(|k| k.is_empty()),
        "{keys_c:?}"
    );
    assert!(dir.path().join("base.control.json").exists());
    let (judged, rows) = compare_shadow(&base);
    assert_eq!(judged["control"]["role"], "control", "{judged}");
    assert_eq!(judged["control"]["pairs"], 24, "{judged}");
    let median = row(&rows, "median_ttft_ms");
    let d = median["abs_change"].as_f64().unwrap();
    assert!((d - 40.0).abs() < 5.0, "{median}");
    assert_eq!(median["verdict"], "worse", "{median}");
    // the control, the target's twin, moved by far less than the shadow
    let noise = median["noise"].as_f64().unwrap();
    assert!(noise < 5.0, "the control differs by {noise} ms");
    report_shows_each_side_beside_the_target(&base, dir.path());
}

/// `retrace report` of the target's result `base`: the shadow's and the control's results
/// beside it, each beside the target (both sides' CDFs, the paired change with its median, the
/// side's timeline), rendered without a script error. A shadow's result of other requests
/// leaves the shadows out, said, and the report of the target stands.
fn report_shows_each_side_beside_the_target(base: &Path, dir: &Path) {
    let page = dir.join("report.html");
    let report = |page: &Path| crate::shadow::report_data(base, page);
    let (data, _) = report(&page);
    let sides = data["shadows"].as_array().unwrap();
    assert_eq!(sides.len(), 2, "the shadow and the control");
    let (cand, control) = (&sides[0], &sides[1]);
    let name = cand["name"].as_str().unwrap();
    assert!(name.starts_with("shadow 1 (candidate "), "{name}");
    assert!(name.ends_with("base.shadow-1.json)"), "{name}");
    assert!(control["name"].as_str().unwrap().starts_with("control ("));
    assert_eq!(
        (cand["pairs"].clone(), cand["primary"].clone()),
        (24.into(), "target".into())
    );
    let median = |side: &serde_json::Value, key: &str| {
        let d = side["deltas"].as_array().unwrap();
        let d = d.iter().find(|d| d["key"] == key).unwrap();
        assert_eq!(d["n"], 24);
        d["median"].as_f64().unwrap()
    };
    // 60 ms against 20 ms of server TTFT; the control is the target's twin
    let d = median(cand, "ttft");
    assert!(
        (d - 40.0).abs() < 5.0,
        "TTFT change {d} ms, configured +40 ms"
    );
    assert!(median(control, "ttft").abs() < 5.0, "{control}");
    assert_eq!(cand["timeline"]["total"], 24);
    crate::shadow::two_shadow_sections_render(&page, "report-replay-shadow.png");
    // The shadow's result made of other requests: the target's report alone, and why.
    let shadow = dir.join("base.shadow-1.json");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&shadow).unwrap()).unwrap();
    let rows = v["input_lens"].as_array_mut().unwrap();
    rows[0] = (rows[0].as_u64().unwrap() + 1).into();
    std::fs::write(&shadow, v.to_string()).unwrap();
    let (data, stderr) = report(&dir.join("report-2.html"));
    assert_eq!(data["shadows"], serde_json::json!([]));
    assert!(stderr.contains("the shadows are left out"), "{stderr}");
    assert!(stderr.contains("not the same requests"), "{stderr}");
    assert!(data["cdfs"].as_array().is_some_and(|c| !c.is_empty()));
}

#[test]
fn shadow_flags_that_cannot_hold_are_refused_naming_the_flag() {
    let t = "traces/mooncake_conversation_1k.jsonl";
    let err = |extra: &[&str]| {
        let mut args = vec![t];
        args.extend_from_slice(extra);
        match support::replay_config(&args) {
            Ok(_) => panic!("{extra:?} was accepted"),
            Err(e) => format!("{e:#}"),
        }
    };
    let target = ["--target", "http://127.0.0.1:9"];
    let e = err(&["--shadow", "http://127.0.0.1:10"]);
    assert!(e.contains("--shadow needs --target"), "{e}");
    let e = err(&[&target[..], &["--shadow", "http://127.0.0.1:9/v1/"]].concat());
    assert!(
        e.contains("--shadow http://127.0.0.1:9") && e.contains("another server"),
        "{e}"
    );
    let e = err(&[&target[..], &["--shadow-control", "http://127.0.0.1:10"]].concat());
    assert!(e.contains("--shadow-control needs --shadow URL"), "{e}");
    let e = err(&[
        &target[..],
        &["--shadow", "http://127.0.0.1:10"],
        &["--shadow-control", "http://127.0.0.1:10"],
    ]
    .concat());
    assert!(
        e.contains("--shadow-control http://127.0.0.1:10") && e.contains("another server"),
        "{e}"
    );
    let e = err(&[&target[..], &["--shadow-model", "m"]].concat());
    assert!(e.contains("--shadow-model needs --shadow URL"), "{e}");
    let e = err(&[&target[..], &["--shadow", "http://u:SECRET@127.0.0.1:10"]].concat());
    assert!(e.contains("--shadow") && !e.contains("SECRET"), "{e}");
    let e = err(&[
        &target[..],
        &["--shadow", "http://127.0.0.1:10", "--sessions"],
    ]
    .concat());
    assert!(e.contains("--shadow with --sessions"), "{e}");
    let five: Vec<String> = (10..15).map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut args = target.to_vec();
    for u in &five {
        args.extend(["--shadow", u.as_str()]);
    }
    let e = err(&args);
    assert!(e.contains("at most 4"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_cannot_be_reached_ends_the_run_before_anything_is_sent() {
    let a = support::start(server(5)).await;
    let (_held, port) = support::refusing_port();
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), 4);
    let (ua, ub) = (a.url(), format!("http://127.0.0.1:{port}"));
    let cfg = support::replay_cfg(&[
        t.to_str().unwrap(),
        "--target",
        &ua,
        "--shadow",
        &ub,
        "--model",
        "test-model",
    ]);
    let e = tokio::time::timeout(Duration::from_secs(120), replay::replay(cfg))
        .await
        .expect("the replay ends")
        .err()
        .expect("an unreachable shadow is an error");
    let e = format!("{e:#}");
    assert!(e.contains(&format!("--shadow {ub}")), "{e}");
    assert!(
        a.prompts.lock().unwrap().is_empty(),
        "nothing sent to the target"
    );
}

/// The most sides a replay takes (the target, 4 shadows and a control), each a replay of its
/// own, run as a user runs it: within the 1 GiB address space of the other bounded tests, each
/// side's result written whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_sides_replay_within_the_memory_limit() {
    let mut servers = Vec::new();
    for _ in 0..6 {
        servers.push(support::start(server(5)).await);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path(), 24);
    let base = dir.path().join("base.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args(["replay", t.to_str().unwrap(), "--target", &urls[0]]);
    for u in &urls[1..5] {
        cmd.args(["--shadow", u]);
    }
    cmd.args(["--shadow-control", &urls[5], "--model", "test-model"]);
    cmd.args(["--result-json", base.to_str().unwrap()]);
    support::under_memory_limit(&mut cmd, support::MEMORY_LIMIT);
    let out = tokio::task::spawn_blocking(move || cmd.output_within(support::CHILD_LIMIT))
        .await
        .unwrap()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    let names = [
        "base.shadow-1.json",
        "base.shadow-4.json",
        "base.control.json",
    ];
    for name in ["base.json"].iter().chain(&names) {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(name)).unwrap()).unwrap();
        assert_eq!(v["completed"], 24, "{name}");
    }
    for s in &servers {
        assert_eq!(
            s.prompts.lock().unwrap().len(),
            24,
            "every side sent every request"
        );
    }
}

/// The mock with fixed timing, counting tokens with `tokenizer` (else its built-in scheme).
pub(crate) async fn mock_of(tokenizer: Option<std::path::PathBuf>) -> retrace::mock::MockHandle {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = retrace::mock::MockConfig {
        fixed_timing: Some((15.0, 2.0)),
        tokenizer,
        ..Default::default()
    };
    retrace::mock::start(l, cfg).await.unwrap()
}

/// The bodies of the workload (sorted, `model` taken out: the one field a shadow may be sent
/// otherwise) a proxy recording bodies saw in front of the target `up_a` and in front of the
/// shadow `up_b`, replaying 8 requests without bodies with `args`; and the target's result.
pub(crate) async fn bodies_on_each_side(
    dir: &Path,
    up_a: std::net::SocketAddr,
    up_b: std::net::SocketAddr,
    args: &[&str],
) -> (Vec<String>, Vec<String>, serde_json::Value) {
    use crate::real_traffic::read_trace;
    use retrace::record::{Bodies, RecordConfig};
    let recorder = |up: std::net::SocketAddr, name: &str| {
        let mut cfg = RecordConfig::new(&format!("http://{up}"), dir.join(name)).unwrap();
        cfg.bodies = Bodies::Request;
        cfg.flush_every = Duration::from_millis(100);
        support::spawn_recorder(cfg)
    };
    let (ra, rb) = (recorder(up_a, "a").await, recorder(up_b, "b").await);
    let rows: Vec<(u64, u64, u64, Vec<u64>)> = (0..8)
        .map(|i| (i * 20, 40 + 3 * i, 3, vec![0, 1 + i]))
        .collect();
    let rows: Vec<(u64, u64, u64, &[u64])> = rows
        .iter()
        .map(|(t, i, o, h)| (*t, *i, *o, &h[..]))
        .collect();
    let t = support::mooncake(dir, &rows);
    let base = dir.join("base.json");
    let (ua, ub) = (format!("http://{}", ra.addr), format!("http://{}", rb.addr));
    let mut all = vec![t.to_str().unwrap(), "--target", &ua, "--shadow", &ub];
    all.extend_from_slice(&[
        "--block-size",
        "16",
        "--result-json",
        base.to_str().unwrap(),
    ]);
    all.extend_from_slice(args);
    let cfg = support::replay_cfg(&all);
    let out = tokio::time::timeout(Duration::from_secs(120), replay::replay(cfg))
        .await
        .expect("the replay ends")
        .expect("a shadowed replay");
    assert_eq!(out.summary.completed, 8, "{:?}", out.summary);
    assert_eq!(out.shadows[0].outcome.summary.completed, 8);
    support::stop_recorder(ra.stop, ra.task).await;
    support::stop_recorder(rb.stop, rb.task).await;
    let bodies = |name: &str| {
        let (_, trace) = read_trace(&dir.join(name));
        let mut v: Vec<String> = (trace.requests.iter())
            .filter_map(|r| r.body.as_deref())
            .filter_map(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
            // The workload's; the tokenizer's calls are recorded too.
            .filter(|b| b.get("max_tokens").is_some())
            .map(|mut b| {
                b.as_object_mut().unwrap().remove("model");
                b.to_string()
            })
            .collect();
        v.sort();
        v
    };
    let r = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    (bodies("a"), bodies("b"), r)
}

/// A word-level tokenizer of 74 common words in `dir` (it makes text of the probe's sample,
/// and `--tokenizer` text).
fn common_words(dir: &Path) -> std::path::PathBuf {
    let words = "the of and to in is it that for on was with he as at by be this are or his \
                 from but not have an they you were her she had all one we can has more if \
                 will my so no do up out its who our him what when them then than some time \
                 only new may into also two any like very man day way use each make many over";
    crate::replay::tokenizer_of_words(dir, words.split(' ').map(String::from))
}

/// With text prompts made by a server's tokenizer (`--prompt-mode text` and no `--tokenizer`:
/// the target's `/detokenize`), the shadow is sent the target's text, not its own tokenizer's:
/// the two mocks' tokenizers differ (the built-in scheme, and a word-level one of common words
/// that makes text too), and a proxy recording bodies in front of each sees the same bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_is_sent_the_text_of_the_targets_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let tok = common_words(dir.path());
    let (ma, mb) = (mock_of(None).await, mock_of(Some(tok)).await);
    let args = ["--prompt-mode", "text"];
    let (a, b, r) = bodies_on_each_side(dir.path(), ma.addr, mb.addr, &args).await;
    ma.shutdown().await;
    mb.shutdown().await;
    assert_eq!(a.len(), 8, "{a:?}");
    assert_eq!(a, b, "the shadow is sent the target's text");
    // The target's tokenizer counted each as recorded.
    assert_eq!(r["target_text"]["exact"], 8, "{}", r["target_text"]);
}

/// With `--tokenizer`, the chat text is fitted to the target's chat template (measured with its
/// `/tokenize`), and the shadow is sent that same text, however its own template differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_is_sent_text_fitted_to_the_targets_template() {
    let dir = tempfile::tempdir().unwrap();
    let tok = common_words(dir.path());
    let t = tok.to_str().unwrap().to_string();
    let args = [
        "--tokenizer",
        &t,
        "--prompt-mode",
        "text",
        "--endpoint",
        "chat",
    ];
    let (ma, mb) = (mock_of(Some(tok.clone())).await, mock_of(None).await);
    let (a, b, r) = bodies_on_each_side(dir.path(), ma.addr, mb.addr, &args).await;
    ma.shutdown().await;
    mb.shutdown().await;
    let fit = r["tokenizer_fit"].as_str().unwrap_or_default();
    assert!(fit.contains("fitted to the target"), "{fit}");
    assert_eq!(a.len(), 8, "{a:?}");
    assert_eq!(a, b, "the shadow is sent the text fitted to the target");
}
