//! Commands stopped by SIGINT or SIGTERM. `replay` halts: it sends no more requests, cuts those
//! still in flight after a short grace, writes its result of the requests measured (invalid,
//! saying it was interrupted), prints its report and exits 130 or 143; a second signal ends it at
//! once. `convert` and `synth` remove their partial output and exit. No command leaves a
//! `.partial` file behind.
//!
//! The replays run against a mock in this process, whose counters say when a request was
//! answered or is in flight: the signal goes at a known point of the run, never after a sleep.

use retrace::mock::{MockConfig, MockHandle};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

use super::support::{mooncake, under_memory_limit, Running, CHILD_LIMIT, MEMORY_LIMIT};

/// The mock, answering after `ttft_ms`, then a token every 5 ms.
fn mock(rt: &tokio::runtime::Runtime, ttft_ms: f64) -> MockHandle {
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = MockConfig {
            fixed_timing: Some((ttft_ms, 5.0)),
            ..Default::default()
        };
        retrace::mock::start(l, cfg).await.unwrap()
    })
}

/// The sum of the mock's `/metrics` samples of `family` whose labels contain `label`.
fn metric(m: &MockHandle, family: &str, label: &str) -> f64 {
    let text = m.metrics_text();
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests the mock answered whole.
fn answered(m: &MockHandle) -> f64 {
    metric(m, "vllm:request_success_total", "\"stop\"")
        + metric(m, "vllm:request_success_total", "\"length\"")
}

/// A trace of `n` requests one second apart (a minute of them is a long run).
fn trace(dir: &Path, n: u64) -> std::path::PathBuf {
    let rows: Vec<(u64, u64, u64, Vec<u64>)> = (0..n).map(|i| (i * 1000, 64, 4, vec![i])).collect();
    let rows: Vec<(u64, u64, u64, &[u64])> = rows
        .iter()
        .map(|(t, i, o, h)| (*t, *i, *o, h.as_slice()))
        .collect();
    mooncake(dir, &rows)
}

/// `retrace replay TRACE --target URL --detailed --result-json RESULT`, under the memory limit.
fn replay(trace: &Path, target: &str, result: &Path) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.arg("replay")
        .arg(trace)
        .args(["--target", target, "--detailed", "--result-json"])
        .arg(result);
    Running::spawn(under_memory_limit(&mut cmd, MEMORY_LIMIT)).unwrap()
}

/// Files in `dir` whose name ends in `.partial`.
fn partials(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial"))
        .collect()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A replay halted by `sig` once a request was answered: exit 128 + the signal, the report on
/// stdout, and a result that parses: invalid, saying it was interrupted, holding the requests
/// measured (per-request arrays included), and no partial file.
fn halted_replay_writes_what_it_measured(sig: libc::c_int, name: &str, code: i32) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = mock(&rt, 20.0);
    let dir = tempfile::tempdir().unwrap();
    let trace = trace(dir.path(), 60);
    let result = dir.path().join("run.json");
    let mut child = replay(&trace, &format!("http://{}", m.addr), &result);
    child.wait_for("an answered request", CHILD_LIMIT, |_| answered(&m) >= 1.0);
    child.signal(sig);
    let out = child.wait_within(CHILD_LIMIT).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(
        stderr.contains(&format!("retrace: {name}: sending no more requests")),
        "{stderr}"
    );
    assert!(stdout.contains("Serving Benchmark Result"), "{stdout}");
    assert!(
        stdout.contains(&format!("RUN INVALID: interrupted by {name}")),
        "{stdout}"
    );
    let r = read_json(&result);
    assert_eq!(r["valid"], false);
    let why = r["invalid_reason"].as_str().unwrap();
    assert!(
        why.starts_with(&format!("interrupted by {name}: ")),
        "{why}"
    );
    assert!(why.contains("of 60 planned requests measured"), "{why}");
    let n = r["num_prompts"].as_u64().unwrap();
    assert!((1..60).contains(&n), "{n} requests in the result");
    assert!(r["completed"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(
        r["completed"].as_u64().unwrap() + r["failed"].as_u64().unwrap(),
        n
    );
    assert_eq!(r["ttfts"].as_array().unwrap().len() as u64, n);
    assert!(r["ttfts"][0].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(partials(dir.path()), Vec::<String>::new());
    let loaded = retrace::report::load::load(&result);
    assert!(loaded.is_ok(), "{:?}", loaded.err());
}

#[test]
fn replay_interrupted_by_sigint_writes_an_invalid_result_of_the_requests_measured() {
    halted_replay_writes_what_it_measured(libc::SIGINT, "SIGINT", 130);
}

#[test]
fn replay_interrupted_by_sigterm_writes_an_invalid_result_of_the_requests_measured() {
    halted_replay_writes_what_it_measured(libc::SIGTERM, "SIGTERM", 143);
}

/// A replay whose one request never answers: the first signal comes while it is in flight.
fn replay_in_flight() -> (
    tokio::runtime::Runtime,
    MockHandle,
    tempfile::TempDir,
    Running,
) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = mock(&rt, 3_000_000.0);
    let dir = tempfile::tempdir().unwrap();
    let trace = trace(dir.path(), 1);
    let result = dir.path().join("run.json");
    let mut child = replay(&trace, &format!("http://{}", m.addr), &result);
    let running = |_: &str| metric(&m, "vllm:num_requests_running", "") >= 1.0;
    child.wait_for("a request in flight", CHILD_LIMIT, running);
    (rt, m, dir, child)
}

/// A request still in flight after the halt's grace is cut: it is in the result, failed with
/// the error kind `interrupted`, and the run ends without waiting for its answer.
#[test]
fn a_request_in_flight_at_the_signal_is_cut_and_counted_interrupted() {
    let (_rt, _m, dir, child) = replay_in_flight();
    child.signal(libc::SIGINT);
    let out = child.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let r = read_json(&dir.path().join("run.json"));
    assert_eq!(
        (r["num_prompts"].as_u64(), r["completed"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(r["errors_by_kind"]["interrupted"], 1, "{r}");
    let err = r["errors"][0].as_str().unwrap();
    assert_eq!(err, "interrupted: cut in flight: the run was interrupted");
    let why = r["invalid_reason"].as_str().unwrap();
    assert!(why.contains("1 of them cut in flight or not sent"), "{why}");
    // Its cut is the halt's, not the target's failure: the run is not "all failed" (exit 5).
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RUN FAILED"));
    assert_eq!(partials(dir.path()), Vec::<String>::new());
}

/// A second signal during the halt's grace ends the replay at once: no result, no partial file.
#[test]
fn a_second_signal_ends_a_halted_replay_at_once_without_a_result() {
    let (_rt, _m, dir, mut child) = replay_in_flight();
    child.signal(libc::SIGTERM);
    // The first signal was taken (two at once could be read as one).
    let halt = "retrace: SIGTERM: sending no more requests";
    child.wait_for("the halt", CHILD_LIMIT, |err| err.contains(halt));
    child.signal(libc::SIGINT);
    let out = child.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("retrace: SIGINT: exiting at once; no result written"),
        "{stderr}"
    );
    assert!(!dir.path().join("run.json").exists());
    assert_eq!(partials(dir.path()), Vec::<String>::new());
}

/// A Mooncake input of `n` rows (about 70 bytes each as output).
fn big_input(dir: &Path, n: u64) -> std::path::PathBuf {
    use std::io::Write;
    let p = dir.join("in.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    for i in 0..n {
        writeln!(
            f,
            "{{\"timestamp\": {i}, \"input_length\": 1024, \"output_length\": 8, \"hash_ids\": [{i}, {}]}}",
            i + n
        )
        .unwrap();
    }
    f.flush().unwrap();
    p
}

/// `retrace ARGS` writing `out.jsonl` in `dir`, stopped by `sig` mid-way through its output:
/// the partial output file is a FIFO this test reads, so the command is known to be writing
/// (and blocked on it) when the signal comes. It exits 128 + the signal, saying so, and leaves
/// neither the partial file nor the output.
fn stopped_writer_leaves_nothing(args: &[&str], dir: &Path, sig: libc::c_int, code: i32) {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let out = dir.join("out.jsonl");
    let fifo = dir.join("out.jsonl.partial");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.args(args).arg("-o").arg(&out);
    let mut child = Running::spawn(under_memory_limit(&mut cmd, MEMORY_LIMIT)).unwrap();
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 14];
    let mut read_some = || {
        match reader.read(&mut buf) {
            Ok(n) => got += n,
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
        got >= 1 << 14
    };
    // A condition, not a time: the command has written this much of its output.
    child.wait_for("its output", CHILD_LIMIT, |_| read_some());
    child.signal(sig);
    let done = child.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(code), "{stderr}");
    assert!(
        stderr.contains("stopped;") && stderr.contains("not written"),
        "{stderr}"
    );
    assert!(!fifo.exists(), "the partial output is left");
    assert!(!out.exists(), "an output is left");
    drop(reader);
}

#[test]
fn convert_stopped_by_a_signal_removes_its_partial_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = big_input(dir.path(), 50_000);
    let args = ["convert", input.to_str().unwrap()];
    stopped_writer_leaves_nothing(&args, dir.path(), libc::SIGTERM, 143);
}

#[test]
fn synth_stopped_by_a_signal_removes_its_partial_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = big_input(dir.path(), 50_000);
    let args = ["synth", input.to_str().unwrap()];
    stopped_writer_leaves_nothing(&args, dir.path(), libc::SIGINT, 130);
}

/// A shadowed replay halted while each side's one request is in flight: every side's request
/// is cut after the grace (not only the first side's), each side's result says so, and the run
/// exits 130 without waiting for an answer.
#[test]
fn a_shadowed_replay_halted_in_flight_cuts_every_side() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, b) = (mock(&rt, 3_000_000.0), mock(&rt, 3_000_000.0));
    let dir = tempfile::tempdir().unwrap();
    let trace = trace(dir.path(), 1);
    let result = dir.path().join("run.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.arg("replay")
        .arg(&trace)
        .args(["--target", &format!("http://{}", a.addr)])
        .args(["--shadow", &format!("http://{}", b.addr)])
        .args(["--model", "mock-llama", "--result-json"])
        .arg(&result);
    let mut child = Running::spawn(under_memory_limit(&mut cmd, MEMORY_LIMIT)).unwrap();
    let running = |m: &MockHandle| metric(m, "vllm:num_requests_running", "") >= 1.0;
    child.wait_for("both requests in flight", CHILD_LIMIT, |_| {
        running(&a) && running(&b)
    });
    child.signal(libc::SIGINT);
    let out = child.wait_within(CHILD_LIMIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    for side in ["run.json", "run.shadow-1.json"] {
        let r = read_json(&dir.path().join(side));
        assert_eq!(r["errors_by_kind"]["interrupted"], 1, "{side}: {r}");
        assert_eq!(r["completed"], 0, "{side}: {r}");
    }
    assert_eq!(partials(dir.path()), Vec::<String>::new());
}
