//! Commands stopped by SIGINT or SIGTERM: `convert` and `synth` remove their partial output and
//! exit 130 or 143. No command leaves a `.partial` file behind.

use std::path::Path;
use std::process::Command;

use super::support::{under_memory_limit, Running, CHILD_LIMIT, MEMORY_LIMIT};

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
