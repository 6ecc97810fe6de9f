//! When the bytes a socket read returns reached this host: the kernel's receive timestamp
//! (`SO_TIMESTAMPNS`), as an [`Instant`], for the mock (a request's arrival) and the replayer (an
//! event's arrival).
//!
//! A process that is busy reads late; the stamp still says when the bytes arrived. The mock's
//! timings (fixed TTFT, the cost model's front-end latency) count from a request's arrival:
//! stamping it when the mock's own threads get around to reading or parsing the request would
//! charge the mock's CPU queue (a burst of 1,000 requests handled one after another on cores
//! shared with the client) to the simulated engine. The replayer's own client stamps each
//! response read the same way, so that its TTFT and ITL are the server's timing as it reached
//! the client host, not the client's scheduling. Each read is a `recvmsg` asking for the
//! kernel's timestamp of the newest segment it returns (on loopback, stamped inside the sender's
//! `send`). [`recv`] gives that instant, or the instant the read returned when the kernel gives
//! no timestamp (it stamps only segments received after timestamping was first enabled on the
//! machine), or when the timestamp is not plausible (in the future, or older than a minute, e.g.
//! after the wall clock was stepped: the kernel stamps with `CLOCK_REALTIME`). A read that
//! returns several segments carries the newest one's stamp. This module does not decide what a
//! read means (the connection does) and never blocks.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Elsewhere than Linux the reads are not stamped by the kernel: they fall back to the instant
/// they return.
#[cfg(not(target_os = "linux"))]
pub(crate) fn enable(_fd: RawFd) -> bool {
    false
}

/// Asks the kernel to timestamp what `fd` receives (`SO_TIMESTAMPNS`). Failure only means reads
/// fall back to the instant they return.
#[cfg(target_os = "linux")]
pub fn enable(fd: RawFd) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int from a valid pointer; `fd` is an open socket.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// A timestamp older than this (or in the future) is not believed.
const MAX_AGE: Duration = Duration::from_secs(60);

fn realtime_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
    }
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// The instant a kernel timestamp (`CLOCK_REALTIME` ns) names, seen from `now` (taken right
/// after the read) and the wall clock then; `now` itself when the stamp is not plausible.
pub(crate) fn to_instant(stamp_rt_ns: i128, now: Instant, now_rt_ns: i128) -> Instant {
    let age = now_rt_ns - stamp_rt_ns;
    if age < 0 || age > MAX_AGE.as_nanos() as i128 {
        return now;
    }
    now.checked_sub(Duration::from_nanos(age as u64))
        .unwrap_or(now)
}

/// One non-blocking read of `fd` into `buf`: the byte count and when those bytes reached the
/// socket (see the module doc). `WouldBlock` when nothing is there.
pub fn recv(fd: RawFd, buf: &mut [MaybeUninit<u8>]) -> io::Result<(usize, Instant)> {
    // Room for one cmsghdr + timespec (CMSG_SPACE(16) is 32 on 64-bit Linux), u64-aligned.
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (describing `buf`, writable, possibly uninitialised:
        // the kernel only writes it) and at `cbuf`, both alive for the call.
        let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let now = Instant::now();
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut stamp = None;
    #[cfg(target_os = "linux")]
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, within
    // `msg_controllen`; a timespec is read unaligned from a SCM_TIMESTAMPNS message's data.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                    stamp = Some(i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    // The wall clock is read before the monotonic one that anchors it: a preemption between the
    // two reads can only make the stamp come out later than it was, never earlier, so a request
    // is never taken to have arrived before its bytes did.
    let at = match stamp {
        Some(s) => {
            let rt = realtime_ns();
            to_instant(s, Instant::now(), rt).min(now)
        }
        None => now,
    };
    Ok((n, at))
}

/// [`recv`] through tokio's readiness: a short read (fewer bytes than `buf` holds, so the
/// socket is most likely drained) also clears the socket's readiness, as tokio's own `poll_read`
/// does, so that the next read waits for the next readiness event instead of making one more
/// `recvmsg` that finds nothing. `WouldBlock` when nothing was there.
pub(crate) fn try_recv(
    stream: &tokio::net::TcpStream,
    fd: RawFd,
    buf: &mut [MaybeUninit<u8>],
) -> io::Result<(usize, Instant)> {
    let len = buf.len();
    let mut short = None;
    let r = stream.try_io(tokio::io::Interest::READABLE, || {
        let (n, at) = recv(fd, buf)?;
        if n > 0 && n < len {
            // Reported as WouldBlock so that tokio clears the readiness it saw before the read.
            short = Some((n, at));
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok((n, at))
    });
    match short {
        Some(x) => Ok(x),
        None => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn implausible_stamps_fall_back_to_the_read() {
        let now = Instant::now();
        let rt = 1_700_000_000_000_000_000i128;
        assert_eq!(to_instant(rt + 5, now, rt), now, "future");
        assert_eq!(to_instant(rt - 120_000_000_000, now, rt), now, "too old");
        let ago = to_instant(rt - 3_000_000, now, rt);
        assert_eq!(now - ago, Duration::from_millis(3));
    }

    /// Bytes that sat in the socket before the read are stamped when they arrived, not when
    /// they were read (the kernel stamps them; generous bounds for a loaded machine).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_read_is_stamped_when_its_bytes_arrived() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // As the mock does: the listener turns the machine's receive timestamps on for as long
        // as it lives (the kernel switches them on a moment later, hence the attempts below).
        assert!(enable(l.as_raw_fd()));
        let mut last = Duration::ZERO;
        for attempt in 0..5 {
            let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            assert!(enable(s.as_raw_fd()));
            let mut buf = [MaybeUninit::<u8>::uninit(); 64];
            assert_eq!(
                recv(s.as_raw_fd(), &mut buf).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
            let before = Instant::now();
            c.write_all(b"hello").unwrap();
            std::thread::sleep(Duration::from_millis(60));
            let (n, at) = recv(s.as_raw_fd(), &mut buf).unwrap();
            let read = Instant::now();
            assert_eq!(n, 5);
            // SAFETY: recv initialised the first n bytes.
            let got: Vec<u8> = buf[..n]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            assert_eq!(got, b"hello");
            // Never before the write began (1 ms for reading two clocks), never after the read.
            assert!(at + Duration::from_millis(1) >= before, "{:?}", before - at);
            assert!(at <= read);
            last = read - at;
            if last >= Duration::from_millis(40) {
                // A closed peer reads as 0 bytes.
                drop(c);
                std::thread::sleep(Duration::from_millis(20));
                assert_eq!(recv(s.as_raw_fd(), &mut buf).unwrap().0, 0);
                return;
            }
            eprintln!("attempt {attempt}: no kernel stamp yet ({last:?} before the read)");
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("never stamped when the bytes arrived (last: {last:?} before the read)");
    }
}
