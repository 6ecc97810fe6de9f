//! Diagnostic stage stamps: per-request instants on the machine-wide monotonic clock, written by
//! the mock (first bytes read → request parsed → first event due → sent).
//!
//! Off unless the environment variable `RETRACE_STAMPS=DIR` is set when the process starts; then
//! [`record`] queues one row per call and a background thread appends the rows, every 200 ms, to
//! `DIR/<role>-<pid>.tsv` (`role  port  t1  t2 ...`, nanoseconds of `CLOCK_MONOTONIC`). The hot
//! paths pay one relaxed load when it is off, and a mutex push (no wake-up, no I/O) when it is on.
//! This module measures nothing by itself and never changes what is measured for results.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Recorder {
    base: Instant,
    base_mono_ns: u64,
    rows: Mutex<Vec<(&'static str, u16, Vec<u64>)>>,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

/// 0 unknown, 1 off, 2 on.
static STATE: AtomicU8 = AtomicU8::new(0);
static REC: OnceLock<Option<Recorder>> = OnceLock::new();

fn clock_monotonic_ns() -> u64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec to a valid pointer.
        unsafe {
            libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        }
        (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
    }
    #[cfg(not(unix))]
    0
}

fn init() -> Option<&'static Recorder> {
    REC.get_or_init(|| {
        let dir = std::env::var_os("RETRACE_STAMPS")?;
        let role = std::env::args()
            .nth(1)
            .unwrap_or_else(|| "retrace".into())
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let path = std::path::Path::new(&dir).join(format!("{role}-{}.tsv", std::process::id()));
        let f = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "retrace: RETRACE_STAMPS: cannot open {}: {e}",
                    path.display()
                );
                return None;
            }
        };
        std::thread::Builder::new()
            .name("retrace-stamps".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_millis(200));
                flush();
            })
            .ok()?;
        Some(Recorder {
            base: Instant::now(),
            base_mono_ns: clock_monotonic_ns(),
            rows: Mutex::new(Vec::new()),
            file: Mutex::new(std::io::BufWriter::new(f)),
        })
    })
    .as_ref()
}

/// Writes the queued rows out now (also done every 200 ms; call before the process exits).
pub fn flush() {
    let Some(Some(r)) = REC.get() else {
        return;
    };
    let rows = std::mem::take(&mut *r.rows.lock().unwrap_or_else(|p| p.into_inner()));
    let mut f = r.file.lock().unwrap_or_else(|p| p.into_inner());
    for (tag, port, vals) in rows {
        let _ = write!(f, "{tag}\t{port}");
        for v in vals {
            let _ = write!(f, "\t{v}");
        }
        let _ = writeln!(f);
    }
    let _ = f.flush();
}

/// Whether stamps are being recorded (cheap after the first call).
#[inline]
pub fn enabled() -> bool {
    match STATE.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = init().is_some();
            STATE.store(if on { 2 } else { 1 }, Relaxed);
            on
        }
    }
}

/// `at` in nanoseconds of `CLOCK_MONOTONIC` (0 when stamps are off).
pub fn mono_ns(at: Instant) -> u64 {
    match REC.get() {
        Some(Some(r)) => {
            if at >= r.base {
                r.base_mono_ns + (at - r.base).as_nanos() as u64
            } else {
                r.base_mono_ns
                    .saturating_sub((r.base - at).as_nanos() as u64)
            }
        }
        _ => 0,
    }
}

/// Now, in nanoseconds of `CLOCK_MONOTONIC` (0 when stamps are off).
pub fn now_ns() -> u64 {
    if enabled() {
        mono_ns(Instant::now())
    } else {
        0
    }
}

/// Queues one row (`tag` names the stage list; `port` joins client and server rows).
pub fn record(tag: &'static str, port: u16, vals: Vec<u64>) {
    if let Some(Some(r)) = REC.get() {
        r.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((tag, port, vals));
    }
}

/// The local (`local = true`) or peer port of a socket, 0 when unknown.
pub fn port_of(fd: std::os::fd::RawFd, local: bool) -> u16 {
    #[cfg(unix)]
    // SAFETY: getsockname/getpeername write at most `len` bytes into a zeroed sockaddr_storage.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let p = &mut ss as *mut _ as *mut libc::sockaddr;
        let r = if local {
            libc::getsockname(fd, p, &mut len)
        } else {
            libc::getpeername(fd, p, &mut len)
        };
        if r != 0 {
            return 0;
        }
        match ss.ss_family as i32 {
            libc::AF_INET => u16::from_be((*(p as *const libc::sockaddr_in)).sin_port),
            libc::AF_INET6 => u16::from_be((*(p as *const libc::sockaddr_in6)).sin6_port),
            _ => 0,
        }
    }
    #[cfg(not(unix))]
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_conversion_matches_the_system_clock() {
        // Without RETRACE_STAMPS the recorder is off and conversions are 0; the clock itself
        // must agree with Instant's (both CLOCK_MONOTONIC on Linux).
        let a = clock_monotonic_ns();
        let b = clock_monotonic_ns();
        assert!(b >= a);
        if !enabled() {
            assert_eq!(now_ns(), 0);
        }
    }
}
