//! Scale-out (docs/scale-out.md): `--shard I/N` partitions every shipped trace exactly (each
//! planned send once, at the whole run's offset, sessions whole); four shards started together
//! with `--start-at`, each running the container command of `tools/k8s/replay-shards.yaml` as a
//! local process against the mock and merged by `tools/k8s/merge-shards.yaml`'s command, equal
//! one process; and both manifests pass a Kubernetes schema validator.
//!
//! The validator is `kubernetes-validate` (PyPI) from the venv `tools/venv/k8s.sh` makes:
//! `RETRACE_K8S_VALIDATE`, else `tools/venv/.k8s/bin/kubernetes-validate`. Without either the
//! manifest test says why and skips, except under CI (`CI` set), where that is a failure.

use crate::support::{self, OutputWithin};
use retrace::mock::{self, MockConfig};
use retrace::replay;
use retrace::trace::import::{read_path, ImportOptions};
use retrace::trace::Trace;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const SHIPPED: &[&str] = &[
    "traces/azure_code_100.csv",
    "traces/azure_conv_100.csv",
    "traces/kv_cache_tester_trace_0012.json",
    "traces/mooncake_conversation.trace.zst",
    "traces/mooncake_conversation_1k.jsonl",
    "traces/mooncake_synthetic.trace.zst",
    "fixtures/replay/mooncake_conversation_30.jsonl",
];

/// One planned send: offset from t0 (ns), session id, the request as a whole.
type Send = (u64, Option<String>, String);

/// What `retrace replay PATH EXTRA...` would send, sorted.
fn sends(path: &Path, trace: &Trace, extra: &[&str]) -> Vec<Send> {
    let mut args = vec![path.to_str().unwrap(), "--target", "http://127.0.0.1:9"];
    args.extend_from_slice(extra);
    let cfg = support::replay_cfg(&args);
    let (plan, _) = replay::plan(&cfg, trace.clone(), false).unwrap();
    let mut v: Vec<Send> = plan
        .iter()
        .map(|p| {
            let r = &p.record;
            let session = r.session.as_ref().map(|s| s.id.clone());
            (p.at_ns, session, format!("{r:?}"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn shards_partition_every_shipped_trace_exactly() {
    let shaped: [&[&str]; 3] = [
        &[],
        &["--loop", "2", "--request-rate", "20"],
        &["--limit", "37"],
    ];
    for rel in SHIPPED {
        let path = support::repo(rel);
        let (trace, _) = read_path(&path, &ImportOptions::default()).unwrap();
        for extra in shaped {
            let whole = sends(&path, &trace, extra);
            assert!(!whole.is_empty(), "{rel}");
            for n in [2u32, 3, 4, 7] {
                let mut union = Vec::new();
                let mut owner: HashMap<String, u32> = HashMap::new();
                for i in 0..n {
                    let shard = format!("{i}/{n}");
                    let mut args = extra.to_vec();
                    args.extend(["--shard", &shard]);
                    let part = sends(&path, &trace, &args);
                    for (_, session, _) in &part {
                        if let Some(id) = session {
                            let first = *owner.entry(id.clone()).or_insert(i);
                            assert_eq!(first, i, "{rel} {extra:?}: session {id} split");
                        }
                    }
                    union.extend(part);
                }
                union.sort();
                // every request once, at the offset one process would send it
                assert!(
                    union == whole,
                    "{rel} {extra:?} --shard i/{n}: not a partition"
                );
            }
        }
    }
}

/// The `args` of the manifest's container: its one folded (`>-`) block scalar, lines joined by
/// spaces as YAML folds them.
fn container_command(yaml: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "args:").skip(1);
    let head = lines.next().expect("args: then a folded scalar");
    assert_eq!(head.trim(), "- >-", "args must be one folded block: {head}");
    let indent = head.len() - head.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.len() - l.trim_start().len() > indent)
        .map(str::trim)
        .collect();
    body.join(" ")
}

/// The value of a `- name: NAME` / `value: "X"` pair of the manifest's `env`.
fn env_value(yaml: &str, name: &str) -> String {
    let mut lines = yaml.lines();
    lines
        .find(|l| l.trim() == format!("- name: {name}"))
        .unwrap_or_else(|| panic!("env {name} missing"));
    let v = lines.next().unwrap().trim();
    let v = v.strip_prefix("value: \"").expect("value: \"...\"");
    v[..v.find('"').unwrap()].to_string()
}

/// The number after `key:` at the start of a line.
fn spec_number(yaml: &str, key: &str) -> u32 {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("{key} missing"))
        .parse()
        .unwrap()
}

fn read(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn sorted_f64(v: &Value, key: &str) -> Vec<f64> {
    let mut x: Vec<f64> = v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} missing"))
        .iter()
        .map(|e| e.as_f64().unwrap_or_else(|| panic!("{key}: {e}")))
        .collect();
    x.sort_by(f64::total_cmp);
    x
}

fn hist_len(v: &Value, name: &str) -> u64 {
    retrace::metrics::Histograms::decode(v["histograms"][name].as_str().unwrap())
        .unwrap()
        .len()
}

/// `sh -c COMMAND` with `retrace` first on PATH and `env` set; panics unless it exits 0.
fn sh(command: &str, env: &[(&str, String)]) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_retrace"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = Command::new("/bin/sh")
        .args(["-c", command])
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert!(
        o.status.success(),
        "{command} ({env:?}) failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Mock timings: exact whatever the load.
const TTFT_MS: f64 = 20.0;
const ITL_MS: f64 = 2.0;
const SPEED: &str = "8";

#[test]
fn four_shards_started_together_match_one_process() {
    let replay_yaml =
        std::fs::read_to_string(support::repo("tools/k8s/replay-shards.yaml")).unwrap();
    let merge_yaml = std::fs::read_to_string(support::repo("tools/k8s/merge-shards.yaml")).unwrap();
    let n = spec_number(&replay_yaml, "completions:");
    assert_eq!(n, 4);
    assert_eq!(
        spec_number(&replay_yaml, "parallelism:"),
        n,
        "all shards at once"
    );
    assert_eq!(env_value(&replay_yaml, "SHARDS"), n.to_string());

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = MockConfig {
            fixed_timing: Some((TTFT_MS, ITL_MS)),
            enable_per_request_metrics: true,
            ..MockConfig::default()
        };
        mock::start(l, cfg).await.unwrap()
    });
    let target = format!("http://{}", mock.addr);
    // the shared storage: one trace that every shard reads, one directory they all write
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let trace = shared.join("trace.csv");
    std::fs::copy(support::repo("traces/azure_conv_100.csv"), &trace).unwrap();
    let out = shared.join("out");
    let trace_s = trace.to_str().unwrap().to_string();
    let out_s = out.to_str().unwrap().to_string();

    // one process, the same flags without --shard and --start-at
    let whole_p = dir.path().join("whole.json");
    let whole_cmd = format!(
        "exec retrace replay \"$TRACE\" --target \"$TARGET\" --seed 0 --speed {SPEED} --result-json {} --detailed",
        whole_p.display()
    );
    sh(
        &whole_cmd,
        &[("TRACE", trace_s.clone()), ("TARGET", target.clone())],
    );

    // four shards, each the manifest's container command, all waiting for one instant
    let command = container_command(&replay_yaml);
    let start_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 8;
    let shards: Vec<_> = (0..n)
        .map(|i| {
            let env: Vec<(&str, String)> = vec![
                ("JOB_COMPLETION_INDEX", i.to_string()),
                ("SHARDS", n.to_string()),
                ("TARGET", target.clone()),
                ("TRACE", trace_s.clone()),
                ("OUT", out_s.clone()),
                ("START_AT", start_at.to_string()),
                ("REPLAY_ARGS", format!("--speed {SPEED}")),
            ];
            let command = command.clone();
            std::thread::spawn(move || sh(&command, &env))
        })
        .collect();
    for s in shards {
        s.join().expect("a shard failed");
    }
    sh(&container_command(&merge_yaml), &[("OUT", out_s.clone())]);

    let whole = read(&whole_p);
    let merged = read(&out.join("all.json"));
    let parts: Vec<Value> = (0..n)
        .map(|i| read(&out.join(format!("shard-{i}.json"))))
        .collect();
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p["shard"], format!("{i}/{n}"));
        assert_eq!(p["start_at"], parts[0]["start_at"], "one agreed instant");
        assert!(p["num_prompts"].as_u64().unwrap() > 0, "shard {i} is empty");
    }
    // the same requests, counts and token totals, exactly
    assert_eq!(whole["completed"], 100);
    assert_eq!(whole["failed"], 0);
    support::assert_same_counts(&merged, &whole);
    for k in [
        "input_lens",
        "output_lens",
        "intended_times",
        "server_ttfts",
    ] {
        assert_eq!(sorted_f64(&merged, k), sorted_f64(&whole, k), "{k}");
    }
    for name in ["ttft_us", "tpot_us", "itl_us", "e2el_us"] {
        assert_eq!(hist_len(&merged, name), hist_len(&whole, name), "{name}");
    }
    // Latencies: each request's no shorter than the mock's exact timing, and both runs' typical
    // TTFT near it (a loaded machine only adds; the ceiling says "did not hang"). The comparison
    // within the noise band is tools/bench/bench_shards.sh's (docs/benchmarks.md).
    for (name, v) in [("merged", &merged), ("whole", &whole)] {
        let outs = v["output_lens"].as_array().unwrap();
        for (k, e2el) in v["latencies"].as_array().unwrap().iter().enumerate() {
            let floor = (TTFT_MS + ITL_MS * (outs[k].as_f64().unwrap() - 1.0)) / 1000.0;
            assert!(
                e2el.as_f64().unwrap() >= floor * 0.999,
                "{name} request {k}"
            );
        }
        let median = v["median_ttft_ms"].as_f64().unwrap();
        assert!(
            (TTFT_MS..TTFT_MS + 2000.0).contains(&median),
            "{name} median TTFT {median} ms"
        );
    }
    rt.block_on(mock.shutdown());
}

/// The validator's path, or why there is none.
fn validator() -> Result<PathBuf, String> {
    let (p, from) = match std::env::var_os("RETRACE_K8S_VALIDATE") {
        Some(p) => (PathBuf::from(p), "RETRACE_K8S_VALIDATE"),
        None => (
            support::repo("tools/venv/.k8s/bin/kubernetes-validate"),
            "the default venv (RETRACE_K8S_VALIDATE unset)",
        ),
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} from {from} does not exist: run tools/venv/k8s.sh",
            p.display()
        ))
    }
}

/// `kubernetes-validate --strict` on `yaml` (the placeholder filled as at apply time).
fn validate(bin: &Path, dir: &Path, name: &str, yaml: &str) -> std::process::Output {
    let p = dir.join(name);
    std::fs::write(&p, yaml.replace("@START_AT@", "1796000000")).unwrap();
    Command::new(bin)
        .arg("--strict")
        .arg(&p)
        .output_within(support::CHILD_LIMIT)
        .unwrap()
}

#[test]
fn k8s_manifests_pass_the_kubernetes_schema() {
    let bin = match validator() {
        Ok(p) => p,
        Err(why) if std::env::var_os("CI").is_some() => panic!("CI must run this test: {why}"),
        Err(why) => {
            crate::support::say_skipped("the Kubernetes manifest test", &why);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for e in std::fs::read_dir(support::repo("tools/k8s")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            let o = validate(
                &bin,
                dir.path(),
                &name,
                &std::fs::read_to_string(&p).unwrap(),
            );
            let said = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            assert!(
                o.status.success() && said.contains("passed"),
                "{name}: {said}"
            );
            seen += 1;
        }
    }
    assert_eq!(
        seen, 3,
        "replay-shards.yaml, merge-shards.yaml and shadow-sidecar.yaml"
    );
    // the validator does check: a misspelt key and a wrong type are refused
    let good = std::fs::read_to_string(support::repo("tools/k8s/replay-shards.yaml")).unwrap();
    for (what, bad) in [
        ("misspelt", good.replace("parallelism: 4", "parallelizm: 4")),
        (
            "wrong type",
            good.replace("completions: 4", "completions: four"),
        ),
    ] {
        let o = validate(&bin, dir.path(), "bad.yaml", &bad);
        assert!(!o.status.success(), "{what} key passed");
    }
}
