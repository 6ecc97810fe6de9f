//! Against a real vLLM, only where `RETRACE_VLLM` names an install (the folder holding
//! `start.sh`, `stop.sh` and `venv-vllm/`, made by copying `../shared/realserver-vllm/` and running
//! its `install.sh`): a server on a free loopback port, a small Mooncake trace of 64-token blocks
//! replayed with `--scrape-metrics`, and the prefix-cache hits the server counted equal to the
//! theoretical count, to the token, with token-id prompts. Anywhere else (CI) it says why it skips
//! and passes. Every child process runs under a time limit.

use crate::support::{self, OutputWithin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The server's start-up (30–110 s on 2 busy cores, about 60 s cold), with margin.
const START_LIMIT: Duration = Duration::from_secs(330);
/// `stop.sh` waits up to 30 s for a clean shutdown, then kills.
const STOP_LIMIT: Duration = Duration::from_secs(60);
/// The CPU build takes KV blocks in multiples of 32 tokens (16 is refused).
const SERVER_BLOCK: u64 = 32;

/// 64 tokens per hash id. With server blocks of 32, vLLM's rule
/// hits = min(floor(P/32)*32, floor((L-1)/32)*32) gives: r1 shares 4 blocks (P = 256) → 256; r2
/// shares 2 (P = 128) → 128; r3 repeats r0, partial last block included (P = 300) → 288; r5
/// shares 1 (P = 64) → 64; r0 and r4 share nothing. 736 of 1,256 tokens.
const ROWS: [(u64, u64, u64, &[u64]); 6] = [
    (0, 300, 4, &[0, 1, 2, 3, 4]),
    (50, 260, 4, &[0, 1, 2, 3, 5]),
    (100, 200, 4, &[0, 1, 6, 7]),
    (150, 300, 4, &[0, 1, 2, 3, 4]),
    (200, 100, 4, &[8, 9]),
    (250, 96, 4, &[0, 10]),
];
const HITS: u64 = 736;
const QUERIES: u64 = 1256;

/// The install `RETRACE_VLLM` names, or why the test skips.
fn install() -> Result<PathBuf, String> {
    let dir = std::env::var_os("RETRACE_VLLM")
        .filter(|d| !d.is_empty())
        .ok_or("RETRACE_VLLM is not set (a vLLM install made from ../shared/realserver-vllm/)")?;
    let dir = PathBuf::from(dir);
    for f in ["start.sh", "stop.sh", "venv-vllm/bin/vllm"] {
        if !dir.join(f).exists() {
            return Err(format!("RETRACE_VLLM={} has no {f}", dir.display()));
        }
    }
    Ok(dir)
}

/// Runs `stop.sh PORT` when dropped, so a failed assert never leaves the server running.
struct Server {
    dir: PathBuf,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let out = Command::new(self.dir.join("stop.sh"))
            .arg(self.port.to_string())
            .output_within(STOP_LIMIT);
        if let Err(e) = out {
            eprintln!("stop.sh {}: {e}", self.port);
        }
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn start(dir: &Path) -> Server {
    let port = free_port();
    let server = Server {
        dir: dir.to_path_buf(),
        port,
    };
    let out = Command::new(dir.join("start.sh"))
        .arg(port.to_string())
        .args(["--block-size", &SERVER_BLOCK.to_string()])
        .env("START_TIMEOUT", "300")
        .output_within(START_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "start.sh {port} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    server
}

#[test]
fn real_vllm_counts_the_theoretical_prefix_hits_at_64_token_trace_blocks() {
    let dir = match install() {
        Ok(d) => d,
        Err(why) => {
            crate::support::say_skipped("the real vLLM test", &why);
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let trace = support::mooncake(tmp.path(), &ROWS);
    let result = tmp.path().join("r.json");
    let server = start(&dir);
    // One request at a time, back to back: the server sees them in send order, as theory counts.
    let out = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(["replay", trace.to_str().unwrap()])
        .args(["--target", &format!("http://127.0.0.1:{}", server.port)])
        .args(["--block-size", "64", "--server-block-size"])
        .arg(SERVER_BLOCK.to_string())
        .args([
            "--max-concurrency",
            "1",
            "--speed",
            "100",
            "--timeout-s",
            "60",
        ])
        .args([
            "--scrape-metrics",
            "--result-json",
            result.to_str().unwrap(),
        ])
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "replay failed: {console}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(
        (v["completed"].as_u64(), v["failed"].as_u64()),
        (Some(6), Some(0))
    );
    let sm = &v["server_metrics"];
    assert_eq!(sm["family"], "vLLM", "{sm}");
    let pc = &sm["prefix_cache"];
    assert_eq!(pc["theoretical_hits"], HITS, "{pc}");
    assert_eq!(pc["theoretical_queries"], QUERIES, "{pc}");
    assert_eq!(pc["hits"].as_f64(), Some(HITS as f64), "{pc}\n{console}");
    assert_eq!(pc["queries"].as_f64(), Some(QUERIES as f64), "{pc}");
    drop(server);
}

/// `replay --target VLLM --shadow MOCK --prompt-mode text`, no `--tokenizer`: the real vLLM's
/// `/detokenize` makes the text prompts and its `/tokenize` counts each as recorded, and the
/// mock shadow, whose tokenizer is another, is sent the very same bodies (seen by a proxy
/// recording bodies in front of each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_makes_the_text_every_side_of_a_shadowed_replay_is_sent() {
    let dir = match install() {
        Ok(d) => d,
        Err(why) => {
            crate::support::say_skipped("the real vLLM shadow test", &why);
            return;
        }
    };
    let server = tokio::task::spawn_blocking(move || start(&dir))
        .await
        .unwrap();
    let vllm: std::net::SocketAddr = format!("127.0.0.1:{}", server.port).parse().unwrap();
    let mock = crate::replay_shadow::mock_of(None).await;
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--prompt-mode", "text", "--timeout-s", "60"];
    let (a, b, r) =
        crate::replay_shadow::bodies_on_each_side(tmp.path(), vllm, mock.addr, &args).await;
    mock.shutdown().await;
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
    assert_eq!(a.len(), 8, "{a:?}");
    assert_eq!(a, b, "the shadow is sent vLLM's text");
    assert_eq!(r["target_text"]["prompts"], 8, "{}", r["target_text"]);
    assert_eq!(r["target_text"]["exact"], 8, "{}", r["target_text"]);
}
