//! API keys: `retrace mock --api-key` refuses `/v1` requests without the key, and `replay`
//! sends `--api-key-env VAR`'s key, else `OPENAI_API_KEY`'s, and never prints or writes it.

use super::support::{self, OutputWithin};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// An environment variable and its value.
type Var<'a> = (&'a str, &'a str);

/// The mock's key in these tests.
const KEY: &str = "sk-retrace-test-5f2c9a";

/// A mock with `--api-key KEY` and fixed timing on a loopback port, and its runtime.
fn keyed_mock() -> (tokio::runtime::Runtime, retrace::mock::MockHandle) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = retrace::mock::MockConfig {
            fixed_timing: Some((2.0, 1.0)),
            api_key: retrace::mock::ApiKey::new(KEY),
            ..Default::default()
        };
        retrace::mock::start(l, cfg).await.unwrap()
    });
    (rt, mock)
}

/// One HTTP/1.1 exchange on a new connection (`Connection: close`), read to its end within a
/// time limit: the status and the body.
fn exchange(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = r#"{"model":"mock-llama","prompt":"hi","max_tokens":2}"#;
    let auth = auth.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: mock\r\nconnection: close\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[test]
fn mock_with_a_key_answers_401_under_v1_without_it_and_leaves_health_open() {
    let (rt, mock) = keyed_mock();
    let a = mock.addr;
    for (method, path) in [("GET", "/v1/models"), ("POST", "/v1/completions")] {
        for auth in [None, Some("Bearer wrong"), Some(KEY)] {
            let (status, body) = exchange(a, method, path, auth);
            assert_eq!(status, 401, "{method} {path} {auth:?}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["code"], 401, "{body}");
            assert_eq!(v["error"]["type"], "AuthenticationError", "{body}");
            assert!(v["error"]["message"].is_string(), "{body}");
        }
        let bearer = format!("Bearer {KEY}");
        let (status, body) = exchange(a, method, path, Some(&bearer));
        assert_eq!(status, 200, "{method} {path} with the key: {body}");
    }
    // vLLM guards /v1 only: the health probe and the metrics stay open.
    assert_eq!(exchange(a, "GET", "/health", None).0, 200);
    assert_eq!(exchange(a, "GET", "/metrics", None).0, 200);
    rt.block_on(mock.shutdown());
}

/// `retrace replay` of a five-request trace to `url` with `args`, the environment holding only
/// `env` of the key variables; writes into `dir`.
fn replay(dir: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let trace = support::mooncake(
        dir,
        &[
            (0, 40, 3, &[0]),
            (1, 40, 3, &[0]),
            (2, 40, 3, &[1]),
            (3, 40, 3, &[1]),
            (4, 40, 3, &[2]),
        ],
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.current_dir(dir)
        .args(["replay", trace.to_str().unwrap(), "--target", url])
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("RETRACE_TEST_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output_within(support::CHILD_LIMIT).unwrap();
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), console)
}

/// Every file under `dir` (one level), read as bytes.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            hits.push(p.display().to_string());
        }
    }
    hits
}

#[test]
fn replay_sends_the_flag_key_else_openai_api_key_and_writes_it_nowhere() {
    let (rt, mock) = keyed_mock();
    let url = format!("http://{}", mock.addr);
    let outputs = [
        "--result-json",
        "r.json",
        "--detailed",
        "--report-html",
        "r.html",
    ];
    let cases: [(&[&str], &[Var]); 2] = [
        // OPENAI_API_KEY without the flag.
        (&[], &[("OPENAI_API_KEY", KEY)]),
        // The flag beats OPENAI_API_KEY (which holds a wrong key here).
        (
            &["--api-key-env", "RETRACE_TEST_KEY"],
            &[("RETRACE_TEST_KEY", KEY), ("OPENAI_API_KEY", "wrong")],
        ),
    ];
    for (flag, env) in cases {
        let dir = tempfile::tempdir().unwrap();
        let args = [flag, &outputs[..]].concat();
        let (code, console) = replay(dir.path(), &url, &args, env);
        assert_eq!(code, Some(0), "{flag:?}: {console}");
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
        assert_eq!(
            (r["completed"].as_u64(), r["failed"].as_u64()),
            (Some(5), Some(0))
        );
        assert!(
            !console.contains(KEY),
            "{flag:?}: the console shows the key"
        );
        assert_eq!(
            files_holding(dir.path(), KEY),
            Vec::<String>::new(),
            "{flag:?}"
        );
        assert!(dir.path().join("r.html").exists());
    }
    rt.block_on(mock.shutdown());
}

#[test]
fn replay_refused_for_a_key_names_both_ways_to_give_one() {
    let (rt, mock) = keyed_mock();
    let url = format!("http://{}", mock.addr);
    let dir = tempfile::tempdir().unwrap();
    // No key, no --model: the target's model list is refused.
    let (code, console) = replay(dir.path(), &url, &[], &[]);
    assert_eq!(code, Some(2), "{console}");
    assert!(
        console.contains(
            "GET /v1/models answered HTTP 401: the target wants an API key: give --api-key-env VAR, or set OPENAI_API_KEY"
        ),
        "{console}"
    );
    assert!(!console.contains("--model"), "{console}");
    // A wrong key with --model: every request fails 401 (exit 5); the console says why and
    // does not show the key it sent.
    let env = [("OPENAI_API_KEY", "sk-wrong-7d1e")];
    let (code, console) = replay(dir.path(), &url, &["--model", "mock-llama"], &env);
    assert_eq!(code, Some(5), "{console}");
    assert!(console.contains("http_401"), "{console}");
    assert!(
        console.contains("give --api-key-env VAR, or set OPENAI_API_KEY"),
        "{console}"
    );
    assert!(!console.contains("sk-wrong-7d1e"), "{console}");
    rt.block_on(mock.shutdown());
}
